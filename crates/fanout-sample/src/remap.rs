//! Global-to-local id remapping, in parallel, with output identical to a sequential reference.
//!
//! Two tables share one algorithm: [`FusedMap`], a concurrent open-addressing hash table after
//! FastGL's Fused-Map (Alg. 2) with the errata of NOTES.md fixed, and [`DenseMap`], one slot per
//! graph vertex for small graphs or dense batches. [`Remapper`] picks one ([`RemapKind::Auto`]).
//!
//! Every slot has a value word: a local id (< 2^31) once assigned, otherwise `FIRST | p` with `p`
//! the smallest edge position at which the key occurred in the current hop. One hop
//! ([`Remapper::extend`]), each step parallel over chunks of the edge list:
//! 1. claim: every edge finds its key's slot, inserting the key if absent (hash table: the one
//!    thread whose CAS turns the slot from EMPTY into the key inserts it, erratum 1: the paper
//!    re-reads the slot and can insert a key twice; probing wraps around the table, erratum 2).
//!    The edge then lowers the value word to its own position unless the word already holds a
//!    local id or an earlier position, and if it did, records itself as a candidate. The key's
//!    first occurrence is always a candidate (nothing can hold an earlier position);
//! 2. repair: lowering is a plain load and store, not an atomic minimum (x86 has none: its
//!    compare-exchange loop is a full barrier that stops later loads from overlapping), so a
//!    racing store can leave a later position in a word. Each candidate that sees a position
//!    later than its own lowers the word again with `fetch_min`. Afterwards every word holds
//!    its key's first position, whatever the thread timing;
//! 3. ids (erratum 3: the paper hands out ids with a shared `fetch_add` as keys are inserted, so
//!    they depend on thread timing): the candidates whose position is their key's first are the
//!    new keys in order of first occurrence; a prefix sum over chunks gives each chunk its first
//!    id, and each chunk numbers its new keys in edge order, exactly as a sequential scan would;
//! 4. lookup: every edge's key is replaced by its slot's local id.
//!
//! Seeds go in first through the same path (erratum 4: the paper maps them with the rest), so
//! they get ids `0..B` in the given order.

use crate::graph::prefetch;
use crate::resident::HugeBuf;
use fanout_graph::{Error, Result};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Key sentinel of an empty hash slot; also the value of a slot with no position yet.
const EMPTY: u32 = u32::MAX;
/// Tag bit of a value word that holds a first position rather than a local id.
const FIRST: u32 = 1 << 31;
/// Edges per parallel task.
const GRAIN: usize = 4096;
/// How many keys ahead a pass prefetches slots.
const AHEAD: usize = 16;

/// `n` words set to EMPTY, in huge-page memory where available (the tables are accessed at
/// random; see [`crate::resident`]).
fn atomics(n: usize) -> HugeBuf<AtomicU32> {
    let buf: HugeBuf<AtomicU32> = HugeBuf::zeroed(n);
    buf.par_chunks(1 << 16)
        .for_each(|c| c.iter().for_each(|w| w.store(EMPTY, Relaxed)));
    buf
}

/// Which table a [`Remapper`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemapKind {
    /// Dense when the graph is small (at most 2^24 vertices, 64 MiB of slots) or a batch is
    /// expected to touch at least an eighth of it; otherwise hash.
    #[default]
    Auto,
    /// [`DenseMap`]: one 4-byte slot per graph vertex.
    Dense,
    /// [`FusedMap`]: open addressing, sized to the batch.
    Hash,
}

impl RemapKind {
    /// The table `Auto` resolves to for a graph of `num_nodes` vertices when a batch is expected
    /// to hold about `expected_vertices` distinct vertices.
    pub fn resolve(self, num_nodes: u64, expected_vertices: u64) -> RemapKind {
        match self {
            RemapKind::Auto if num_nodes <= 1 << 24 || expected_vertices * 8 >= num_nodes => {
                RemapKind::Dense
            }
            RemapKind::Auto => RemapKind::Hash,
            k => k,
        }
    }
}

/// The operations the remapping algorithm needs from a table.
trait Table: Sync {
    /// Starts fetching the slot of `key`.
    fn prefetch_key(&self, key: u32);
    /// The slot of `key`, inserting the key if absent.
    fn slot(&self, key: u32) -> u32;
    /// The value word of a slot.
    fn word(&self, slot: u32) -> &AtomicU32;
}

/// Lowers a value word to `FIRST | pos` (atomic minimum) unless it holds a local id; returns
/// the previous word.
#[inline]
fn lower_atomic(w: &AtomicU32, pos: u32) -> u32 {
    let want = FIRST | pos;
    let cur = w.load(Relaxed);
    if cur <= want {
        return cur;
    }
    w.fetch_min(want, Relaxed)
}

/// FastGL's Fused-Map: a concurrent open-addressing (linear probing) table from global id to a
/// value word, with power-of-two capacity. Guarantees: [`FusedMap::claim`] is lock-free and
/// reports "new" to exactly one caller per distinct key; probing wraps, so it terminates as long
/// as the table has a free slot (the [`Remapper`] keeps the load at most 2/3).
pub struct FusedMap {
    keys: HugeBuf<AtomicU32>,
    vals: HugeBuf<AtomicU32>,
    shift: u32,
}

impl FusedMap {
    /// An empty table with room for at least `capacity` keys at load 2/3.
    pub fn with_capacity(capacity: usize) -> Self {
        let slots = (capacity.max(16) * 3 / 2).next_power_of_two();
        FusedMap {
            keys: atomics(slots),
            vals: atomics(slots),
            shift: 64 - slots.trailing_zeros(),
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.keys.len()
    }

    #[inline]
    fn home(&self, key: u32) -> usize {
        ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The slot of `key`, inserting it if absent; `true` for exactly the one caller whose CAS
    /// inserted it.
    #[inline]
    fn insert(&self, key: u32) -> (u32, bool) {
        let mask = self.keys.len() - 1;
        let mut i = self.home(key);
        loop {
            match self.keys[i].load(Relaxed) {
                k if k == key => return (i as u32, false),
                EMPTY => match self.keys[i].compare_exchange(EMPTY, key, Relaxed, Relaxed) {
                    Ok(_) => return (i as u32, true),
                    Err(other) if other == key => return (i as u32, false),
                    Err(_) => {}
                },
                _ => {}
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts `key` (if absent) and lowers its value word to `FIRST | pos` (atomic minimum)
    /// unless it holds a local id. Returns the slot and whether this call inserted the key.
    pub fn claim(&self, key: u32, pos: u32) -> (u32, bool) {
        let (slot, new) = self.insert(key);
        lower_atomic(&self.vals[slot as usize], pos);
        (slot, new)
    }

    /// The slot holding `key`, if present.
    pub fn find(&self, key: u32) -> Option<u32> {
        let mask = self.keys.len() - 1;
        let mut i = self.home(key);
        for _ in 0..self.keys.len() {
            match self.keys[i].load(Relaxed) {
                k if k == key => return Some(i as u32),
                EMPTY => return None,
                _ => i = (i + 1) & mask,
            }
        }
        None
    }

    /// Local id stored for `key`, if the key is present and has one.
    pub fn get(&self, key: u32) -> Option<u32> {
        self.find(key)
            .map(|s| self.vals[s as usize].load(Relaxed))
            .filter(|&v| v & FIRST == 0)
    }
}

impl Table for FusedMap {
    #[inline]
    fn prefetch_key(&self, key: u32) {
        prefetch(&self.keys[self.home(key)]);
    }
    #[inline]
    fn slot(&self, key: u32) -> u32 {
        self.insert(key).0
    }
    #[inline]
    fn word(&self, slot: u32) -> &AtomicU32 {
        &self.vals[slot as usize]
    }
}

/// One value slot per graph vertex (the slot of key `v` is `v`). Guarantees as for
/// [`FusedMap::claim`]; memory is 4 bytes per graph vertex, reset cost is per batch, not per graph.
pub struct DenseMap {
    vals: HugeBuf<AtomicU32>,
}

impl DenseMap {
    /// A map for ids `0..num_nodes`.
    pub fn new(num_nodes: usize) -> Self {
        DenseMap {
            vals: atomics(num_nodes),
        }
    }

    /// As [`FusedMap::claim`] ("new" for the one caller that found the word empty); panics if
    /// `key >= num_nodes`.
    pub fn claim(&self, key: u32, pos: u32) -> (u32, bool) {
        (key, lower_atomic(&self.vals[key as usize], pos) == EMPTY)
    }

    /// Local id stored for `key`, if it has one.
    pub fn get(&self, key: u32) -> Option<u32> {
        self.vals
            .get(key as usize)
            .map(|v| v.load(Relaxed))
            .filter(|&v| v & FIRST == 0)
    }
}

impl Table for DenseMap {
    #[inline]
    fn prefetch_key(&self, key: u32) {
        if let Some(w) = self.vals.get(key as usize) {
            prefetch(w);
        }
    }
    #[inline]
    fn slot(&self, key: u32) -> u32 {
        key
    }
    #[inline]
    fn word(&self, slot: u32) -> &AtomicU32 {
        &self.vals[slot as usize]
    }
}

enum Tables {
    Dense(DenseMap),
    Hash(FusedMap),
}

/// Maps the global ids of one mini-batch to dense local ids, hop by hop, in parallel. Reusable:
/// [`Remapper::start`] begins a batch and cleans up after the previous one in time proportional
/// to that batch, not to the graph.
///
/// Guarantee: for the same seeds and the same sequence of `extend` inputs, the local ids and
/// [`Remapper::nodes`] equal [`remap_reference`]'s, whatever the table kind and thread count.
pub struct Remapper {
    table: Tables,
    num_nodes: u64,
    /// Global id of every local id.
    nodes: Vec<u32>,
    /// Table slot of every local id (for reset and rehash).
    slot_of: Vec<u32>,
    /// Scratch: slot of every edge of the current hop.
    edge_slot: Vec<u32>,
}

impl Remapper {
    /// A remapper for a graph of `num_nodes` vertices (< 2^32 - 1). `expected_vertices` (distinct
    /// vertices per batch, a hint) sizes the hash table and guides [`RemapKind::Auto`].
    pub fn new(num_nodes: u64, kind: RemapKind, expected_vertices: usize) -> Self {
        assert!(num_nodes < EMPTY as u64, "remapper: too many vertices");
        let table = match kind.resolve(num_nodes, expected_vertices as u64) {
            RemapKind::Dense => Tables::Dense(DenseMap::new(num_nodes as usize)),
            _ => Tables::Hash(FusedMap::with_capacity(
                expected_vertices.min(num_nodes as usize),
            )),
        };
        Remapper {
            table,
            num_nodes,
            nodes: Vec::new(),
            slot_of: Vec::new(),
            edge_slot: Vec::new(),
        }
    }

    /// The table in use (`Dense` or `Hash`).
    pub fn kind(&self) -> RemapKind {
        match self.table {
            Tables::Dense(_) => RemapKind::Dense,
            Tables::Hash(_) => RemapKind::Hash,
        }
    }

    /// Global ids of the local ids assigned so far (seeds first, then each hop's new vertices).
    pub fn nodes(&self) -> &[u32] {
        &self.nodes
    }

    /// Number of local ids assigned so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True before any seed is inserted.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Clears the previous batch and gives `seeds` local ids `0..B` in order. Errors if a seed
    /// repeats. Seeds must be below the vertex count (checked by the samplers).
    pub fn start(&mut self, seeds: &[u32]) -> Result<()> {
        self.clear();
        let mut ids = seeds.to_vec();
        self.extend(&mut ids);
        if self.nodes.len() != seeds.len() {
            let mut s = seeds.to_vec();
            s.sort_unstable();
            let dup = s.windows(2).find(|w| w[0] == w[1]).map_or(0, |w| w[0]);
            self.clear();
            return Err(Error::Invalid(format!(
                "seed vertex {dup} appears more than once in one mini-batch (the seed set lists it twice; \
                 `fanout dataset verify` checks a dataset's split files)"
            )));
        }
        Ok(())
    }

    /// Rewrites `ids` (global ids, in edge order) to local ids in place. Ids not seen before get
    /// the next local ids in order of first occurrence in `ids`. Returns how many were new.
    pub fn extend(&mut self, ids: &mut [u32]) -> usize {
        let base = self.nodes.len();
        assert!(
            ids.len() < FIRST as usize && base + ids.len() < FIRST as usize,
            "remapper: more than 2^31 edges or vertices in one mini-batch"
        );
        self.reserve((base + ids.len()).min(self.num_nodes as usize));
        self.edge_slot.resize(ids.len(), 0);
        let out = Scratch {
            nodes: &mut self.nodes,
            slot_of: &mut self.slot_of,
            edge_slot: &mut self.edge_slot,
        };
        match &self.table {
            Tables::Dense(t) => extend_in(t, out, ids),
            Tables::Hash(t) => extend_in(t, out, ids),
        }
    }

    /// Returns the node list of the current batch and resets the table for the next one.
    pub fn take_nodes(&mut self) -> Vec<u32> {
        // The next batch is likely as large: give it room up front instead of regrowing.
        let room = Vec::with_capacity(self.nodes.len());
        let nodes = std::mem::replace(&mut self.nodes, room);
        self.clear();
        nodes
    }

    /// Empties every slot the current batch used.
    fn clear(&mut self) {
        match &self.table {
            Tables::Dense(m) => self
                .slot_of
                .par_iter()
                .for_each(|&s| m.vals[s as usize].store(EMPTY, Relaxed)),
            Tables::Hash(m) => self.slot_of.par_iter().for_each(|&s| {
                m.keys[s as usize].store(EMPTY, Relaxed);
                m.vals[s as usize].store(EMPTY, Relaxed);
            }),
        }
        self.nodes.clear();
        self.slot_of.clear();
    }

    /// Makes sure a hash table can hold `keys` distinct keys at load at most 2/3, rehashing the
    /// current batch's keys into a larger table if not.
    fn reserve(&mut self, keys: usize) {
        let Tables::Hash(m) = &self.table else { return };
        if keys * 3 <= m.slots() * 2 {
            return;
        }
        let bigger = FusedMap::with_capacity(keys * 2);
        let nodes = &self.nodes;
        self.slot_of.par_iter_mut().enumerate().for_each(|(l, s)| {
            let (slot, _) = bigger.insert(nodes[l]);
            bigger.vals[slot as usize].store(l as u32, Relaxed);
            *s = slot;
        });
        self.table = Tables::Hash(bigger);
    }
}

/// The remapper's buffers, borrowed apart from its table.
struct Scratch<'a> {
    nodes: &'a mut Vec<u32>,
    slot_of: &'a mut Vec<u32>,
    edge_slot: &'a mut Vec<u32>,
}

/// One hop of remapping (module docs, steps 1-4) on table `t`.
fn extend_in<T: Table>(t: &T, out: Scratch<'_>, ids: &mut [u32]) -> usize {
    let base = out.nodes.len();
    // 1. Claim: each chunk lists its candidates (offsets within the chunk, in edge order).
    let candidates: Vec<Vec<u32>> = out
        .edge_slot
        .par_chunks_mut(GRAIN)
        .zip(ids.par_chunks(GRAIN))
        .enumerate()
        .map(|(c, (slots, keys))| {
            let mut cand = Vec::new();
            for (j, (s, &k)) in slots.iter_mut().zip(keys).enumerate() {
                if let Some(&next) = keys.get(j + AHEAD) {
                    t.prefetch_key(next);
                }
                let slot = t.slot(k);
                let w = t.word(slot);
                let want = FIRST | (c * GRAIN + j) as u32;
                if w.load(Relaxed) > want {
                    w.store(want, Relaxed);
                    cand.push(j as u32);
                }
                *s = slot;
            }
            cand
        })
        .collect();

    // 2. Repair lost races.
    let edge_slot: &[u32] = out.edge_slot;
    candidates.par_iter().enumerate().for_each(|(c, cand)| {
        for &j in cand {
            let e = c * GRAIN + j as usize;
            let w = t.word(edge_slot[e]);
            if w.load(Relaxed) > FIRST | e as u32 {
                w.fetch_min(FIRST | e as u32, Relaxed);
            }
        }
    });

    // 3. New keys in order of first occurrence, numbered chunk by chunk.
    let firsts: Vec<Vec<u32>> = candidates
        .into_par_iter()
        .enumerate()
        .map(|(c, mut cand)| {
            cand.retain(|&j| {
                let e = c * GRAIN + j as usize;
                t.word(edge_slot[e]).load(Relaxed) == FIRST | e as u32
            });
            cand
        })
        .collect();
    let m: usize = firsts.iter().map(Vec::len).sum();
    out.nodes.resize(base + m, 0);
    out.slot_of.resize(base + m, 0);
    let mut parts = Vec::with_capacity(firsts.len());
    let (mut rn, mut rs) = (&mut out.nodes[base..], &mut out.slot_of[base..]);
    let mut next = base;
    for f in &firsts {
        let (hn, tn) = rn.split_at_mut(f.len());
        let (hs, ts) = rs.split_at_mut(f.len());
        parts.push((next, hn, hs));
        (rn, rs, next) = (tn, ts, next + f.len());
    }
    let keys: &[u32] = ids;
    firsts
        .par_iter()
        .zip(parts)
        .enumerate()
        .for_each(|(c, (f, (first_id, nodes, slot_of)))| {
            for (w, &j) in f.iter().enumerate() {
                let e = c * GRAIN + j as usize;
                let s = edge_slot[e];
                t.word(s).store((first_id + w) as u32, Relaxed);
                nodes[w] = keys[e];
                slot_of[w] = s;
            }
        });

    // 4. Lookup.
    ids.par_chunks_mut(GRAIN)
        .zip(edge_slot.par_chunks(GRAIN))
        .for_each(|(ids, slots)| {
            for (j, (x, &s)) in ids.iter_mut().zip(slots).enumerate() {
                if let Some(&next) = slots.get(j + AHEAD) {
                    prefetch(t.word(next));
                }
                *x = t.word(s).load(Relaxed);
            }
        });
    m
}

/// The sequential reference: gives `seeds` ids `0..B`, then maps each hop's ids in turn (in
/// place), new ids in order of first occurrence. Returns the global id of every local id.
pub fn remap_reference(seeds: &[u32], hops: &mut [Vec<u32>]) -> Vec<u32> {
    let mut map: HashMap<u32, u32> = HashMap::new();
    let mut nodes = Vec::new();
    let mut local = |g: u32, nodes: &mut Vec<u32>| {
        *map.entry(g).or_insert_with(|| {
            nodes.push(g);
            nodes.len() as u32 - 1
        })
    };
    for &s in seeds {
        local(s, &mut nodes);
    }
    for hop in hops.iter_mut() {
        for g in hop.iter_mut() {
            *g = local(*g, &mut nodes);
        }
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_rand::Rng;

    fn pool(t: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap()
    }

    /// Random batch: distinct seeds and hops of skewed random ids (many repeats).
    fn batch(n: u32, seed: u64) -> (Vec<u32>, Vec<Vec<u32>>) {
        let mut r = Rng::new(seed);
        let mut perm: Vec<u32> = (0..n).collect();
        r.shuffle(&mut perm);
        let seeds = perm[..50].to_vec();
        let hops = [300usize, 3000, 20000]
            .iter()
            .map(|&len| {
                (0..len)
                    .map(|_| {
                        let x = r.below(n as u64) as u32;
                        if r.bernoulli(0.5) {
                            x % 97
                        } else {
                            x
                        }
                    })
                    .collect()
            })
            .collect();
        (seeds, hops)
    }

    #[test]
    fn matches_reference_for_every_kind_and_thread_count() {
        for (n, seed) in [(200u32, 1u64), (100_000, 2), (5_000_000, 3)] {
            let (seeds, hops) = batch(n, seed);
            let mut ref_hops = hops.clone();
            let ref_nodes = remap_reference(&seeds, &mut ref_hops);
            for kind in [RemapKind::Dense, RemapKind::Hash] {
                for threads in [1, 3, 8] {
                    pool(threads).install(|| {
                        // Tiny expected size forces the hash table to grow (rehash) mid-batch.
                        let mut m = Remapper::new(n as u64, kind, 10);
                        for round in 0..2 {
                            m.start(&seeds).unwrap();
                            let mut got = hops.clone();
                            for h in got.iter_mut() {
                                m.extend(h);
                            }
                            let ctx = format!("n {n} {kind:?} threads {threads} round {round}");
                            assert_eq!(got, ref_hops, "{ctx}");
                            assert_eq!(m.take_nodes(), ref_nodes, "{ctx}");
                        }
                    });
                }
            }
        }
    }

    #[test]
    fn seeds_first_and_duplicates_rejected() {
        for kind in [RemapKind::Dense, RemapKind::Hash] {
            let mut m = Remapper::new(100, kind, 4);
            m.start(&[7, 3, 9]).unwrap();
            assert_eq!(m.nodes(), &[7, 3, 9]);
            let mut ids = vec![9, 50, 3, 50, 60];
            assert_eq!(m.extend(&mut ids), 2);
            assert_eq!(ids, vec![2, 3, 1, 3, 4]);
            let e = m.start(&[1, 2, 1]).unwrap_err().to_string();
            assert!(e.contains("seed vertex 1 appears more than once"), "{e}");
            // Usable again after the error.
            m.start(&[5]).unwrap();
            assert_eq!(m.nodes(), &[5]);
        }
    }

    #[test]
    fn fused_map_claims_once_and_wraps() {
        let m = FusedMap::with_capacity(4);
        let last = m.slots() - 1;
        // Three keys whose home is the last slot: the second and third must wrap to 0 and 1.
        let wrap: Vec<u32> = (0..).filter(|&k| m.home(k) == last).take(3).collect();
        let mut keys: Vec<u32> = (1000..1006).collect();
        keys.extend(&wrap);
        let news: usize = keys
            .par_iter()
            .chain(keys.par_iter())
            .map(|&k| m.claim(k, k).1 as usize)
            .sum();
        assert_eq!(news, keys.len(), "exactly one claimer per key");
        let mut wrapped: Vec<u32> = wrap.iter().map(|&k| m.find(k).unwrap()).collect();
        wrapped.sort_unstable();
        assert_eq!(wrapped[2], last as u32);
        assert!(wrapped[0] < 8 && wrapped[1] < 8, "{wrapped:?}");
        for &k in &keys {
            assert_eq!(m.get(k), None, "no local id assigned yet");
        }
        assert_eq!(m.find(99), None);
        assert_eq!(RemapKind::Auto.resolve(1000, 1), RemapKind::Dense);
        assert_eq!(RemapKind::Auto.resolve(1 << 30, 1000), RemapKind::Hash);
        assert_eq!(RemapKind::Auto.resolve(1 << 30, 1 << 28), RemapKind::Dense);
    }
}
