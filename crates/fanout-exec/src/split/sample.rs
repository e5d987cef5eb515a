//! Sampling one mini-batch across the workers of a split run.

use crate::error::{ExecError, Result};
use fanout_comm::Comm;
use fanout_compute::ModelKind;
use fanout_sample::{BatchKey, RangeOwners, Sampler};

/// One worker's share of a step's mini-batch.
///
/// Local ids: this worker's vertices are numbered in the order it reached them (`owned`), so
/// the vertices reached within `h` hops are the prefix `owned[..reach[h]]` (`reach[0]`: its
/// seeds, in the step's order). The block of hop `h` has those as destinations and, as sources,
/// `owned[..reach[h + 1]]` followed by the rows other workers send ([`SplitHop`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SplitBatch {
    /// The key the step was sampled under.
    pub key: BatchKey,
    /// Seeds of the whole step, all workers together.
    pub step_seeds: usize,
    /// The vertices of this worker the step reaches, in the order reached.
    pub owned: Vec<u32>,
    /// `reach[h]`: how many of `owned` are reached within `h` hops (`hops.len() + 1` values).
    pub reach: Vec<usize>,
    /// The blocks, hop 0 (the seeds' own neighbours, the model's last layer) first.
    pub hops: Vec<SplitHop>,
    /// Labels of this worker's seeds (`owned[..reach[0]]`), -1 where unlabelled.
    pub labels: Vec<i64>,
}

/// One hop of a [`SplitBatch`]: its block over local ids and what it exchanges.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitHop {
    /// `reach[h] + 1` offsets into `indices`.
    pub indptr: Vec<u32>,
    /// Local source of every edge: `< reach[h + 1]` for this worker's vertices, above for the
    /// rows other workers send (grouped by sender in rank order).
    pub indices: Vec<u32>,
    /// Per-edge weights (weighted sampling).
    pub weights: Option<Vec<f32>>,
    /// [`Shuffle::Rows`]: the global ids of the remote sources, in the order of their rows;
    /// empty with [`Shuffle::PartialSums`].
    pub remote: Vec<u32>,
    /// How many rows each rank sends this worker at this hop (0 for this worker).
    pub remote_counts: Vec<usize>,
    /// For every rank, the positions in `owned` of the vertices whose rows it reads from this
    /// worker at this hop (empty for this worker): one per row with [`Shuffle::Rows`], the
    /// members of each partial sum with [`Shuffle::PartialSums`] (see `serve_groups`).
    pub serve: Vec<Vec<u32>>,
    /// [`Shuffle::PartialSums`]: for every rank, `groups + 1` offsets into `serve[rank]`; group
    /// `j` is the sources of one of that rank's destinations that this worker owns, one member
    /// per edge (repeats kept). `None` with [`Shuffle::Rows`].
    pub serve_groups: Option<Vec<Vec<u32>>>,
}

/// What crosses workers at each layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shuffle {
    /// One row per remote source vertex and hop (GSplit's form for GAT, whose attention needs
    /// every source).
    Rows,
    /// One row per (destination, owner of some of its sources) pair: the owner's sum of those
    /// sources, weighted by the layer's coefficients (GSplit's pre-aggregation for GraphSAGE,
    /// GCN and GIN). The destination's block gives that row one parallel edge per source it
    /// replaces, so mean and sum aggregators see the one-worker degree.
    PartialSums,
}

impl Shuffle {
    /// Whether a model's layers may be fed partial sums: those whose aggregation is a
    /// coefficient-weighted sum of the source rows themselves (GraphSAGE mean, GCN, GIN sum).
    /// GAT weighs each source by attention and PinSAGE transforms each source row before
    /// summing, so a sum of inputs cannot stand in for their messages.
    pub fn partial_sums_fit(kind: ModelKind) -> bool {
        matches!(kind, ModelKind::Sage | ModelKind::Gcn | ModelKind::Gin)
    }

    /// What a model exchanges: [`Shuffle::PartialSums`] where
    /// [`partial_sums_fit`](Shuffle::partial_sums_fit), else [`Shuffle::Rows`].
    pub fn for_model(kind: ModelKind) -> Shuffle {
        if Shuffle::partial_sums_fit(kind) {
            Shuffle::PartialSums
        } else {
            Shuffle::Rows
        }
    }
}

impl SplitHop {
    /// Rows other workers send this worker at this hop.
    pub fn remote_rows(&self) -> usize {
        self.remote_counts.iter().sum()
    }

    /// Edges whose source this worker owns, and edges whose source lives elsewhere.
    pub fn local_and_remote_edges(&self, own_rows: usize) -> (u64, u64) {
        let local = self
            .indices
            .iter()
            .filter(|&&s| (s as usize) < own_rows)
            .count() as u64;
        (local, self.indices.len() as u64 - local)
    }

    /// Rows GSplit's pre-aggregation would send this worker at this hop instead of
    /// `remote.len()`: one partial sum per (destination, other worker owning at least one of
    /// its sources) pair. Fewer than `remote.len()` when remote edges of one destination meet
    /// at one owner more often than remote sources feed several destinations.
    pub fn preaggregated_rows(&self, own_rows: usize) -> u64 {
        if self.serve_groups.is_some() {
            return self.remote_rows() as u64;
        }
        let mut first = Vec::with_capacity(self.remote_counts.len() + 1);
        first.push(own_rows);
        for &c in &self.remote_counts {
            first.push(first[first.len() - 1] + c);
        }
        let owner = |s: usize| first.partition_point(|&f| f <= s) - 1;
        let mut rows = 0u64;
        let mut seen: Vec<usize> = Vec::new();
        for d in self.indptr.windows(2) {
            seen.clear();
            for &s in &self.indices[d[0] as usize..d[1] as usize] {
                let s = s as usize;
                if s >= own_rows {
                    let o = owner(s);
                    if !seen.contains(&o) {
                        seen.push(o);
                    }
                }
            }
            rows += seen.len() as u64;
        }
        rows
    }
}

/// Reusable memory for [`sample_with`]: a table of one slot per vertex of the graph (4 bytes
/// each, like the one-worker sampler's dense remapping table), cleared after every batch by
/// visiting only the slots the batch touched.
#[derive(Debug, Default)]
pub struct SampleWorkspace {
    slot: Vec<u32>,
    touched: Vec<u32>,
}

const ABSENT: u32 = u32::MAX;

/// [`sample_with`] with a fresh workspace (allocates a table of the graph's size).
pub fn sample(
    sampler: &dyn Sampler,
    owners: &RangeOwners,
    seeds: &[u32],
    key: BatchKey,
    shuffle: Shuffle,
    comm: &dyn Comm,
) -> Result<SplitBatch> {
    let mut ws = SampleWorkspace::default();
    sample_with(&mut ws, sampler, owners, seeds, key, shuffle, comm)
}

/// Samples this worker's share of the mini-batch of `seeds` (the whole step's, the same list on
/// every worker of `comm`) under `key`, exchanging requests with the other workers once per
/// hop (the remote sources, or with [`Shuffle::PartialSums`] the groups of them each partial
/// sum adds up). Every worker must call it with the same arguments. The union of the workers'
/// blocks is the one-worker batch of `seeds` under `key`: the same edges, each computed by the
/// owner of its destination. Errors: `owners` not having one part per worker, a vertex beyond its
/// ranges, a sampler that cannot sample one hop at a time, repeated seeds, and communication
/// failures. Some of these fail on one worker only: a caller that gets `Err` must call
/// [`Comm::fail`], or the other workers wait in their next exchange.
pub fn sample_with(
    ws: &mut SampleWorkspace,
    sampler: &dyn Sampler,
    owners: &RangeOwners,
    seeds: &[u32],
    key: BatchKey,
    shuffle: Shuffle,
    comm: &dyn Comm,
) -> Result<SplitBatch> {
    let n = sampler.dataset().num_nodes() as usize;
    if ws.slot.len() != n {
        ws.slot = vec![ABSENT; n];
    }
    ws.touched.clear();
    let result = sample_in(ws, sampler, owners, seeds, key, shuffle, comm);
    // Back to all-absent for the next batch, whatever happened.
    for &v in &ws.touched {
        ws.slot[v as usize] = ABSENT;
    }
    result
}

/// The body of [`sample_with`]: `ws.slot[v]` holds, for a vertex of this worker, its position
/// in `owned`; with [`Shuffle::Rows`], for another worker's vertex requested at the current
/// hop, its row index in that worker's list (reset between hops). Every slot set is listed in
/// `ws.touched`.
fn sample_in(
    ws: &mut SampleWorkspace,
    sampler: &dyn Sampler,
    owners: &RangeOwners,
    seeds: &[u32],
    key: BatchKey,
    shuffle: Shuffle,
    comm: &dyn Comm,
) -> Result<SplitBatch> {
    let (rank, size) = (comm.rank(), comm.size());
    if owners.parts() != size {
        return Err(ExecError::Invalid(format!(
            "the partition has {} parts but the run has {size} workers",
            owners.parts()
        )));
    }
    let n = ws.slot.len();
    let owner = |v: u32| {
        owners
            .owner(v as u64)
            .filter(|_| (v as usize) < n)
            .ok_or_else(|| {
                ExecError::Invalid(format!(
                    "vertex {v} lies beyond the partition's id ranges; is the partition of \
                     this dataset?"
                ))
            })
    };
    let SampleWorkspace { slot, touched } = ws;
    let mut owned = Vec::new();
    for &s in seeds {
        if owner(s)? == rank {
            if slot[s as usize] != ABSENT {
                return Err(ExecError::Invalid(
                    "the step's seeds repeat a vertex".into(),
                ));
            }
            slot[s as usize] = owned.len() as u32;
            touched.push(s);
            owned.push(s);
        }
    }
    let mut reach = vec![owned.len()];
    let mut hops = Vec::with_capacity(sampler.num_layers());
    for h in 0..sampler.num_layers() {
        let e = sampler.sample_hop(&owned[..reach[h]], key, h)?;
        // Sources: this worker's new vertices join `owned`; the others become rows their
        // owners send: one per source (`Rows`), or one per destination and owner (`PartialSums`,
        // the payload then holds each group as its size followed by its members).
        let mut payload: Vec<Vec<u32>> = vec![Vec::new(); size];
        let mut rows_of = vec![0u32; size];
        let mut edge_row = vec![ABSENT; e.ids.len()];
        let mut owner_of = Vec::with_capacity(e.ids.len());
        let mut open: Vec<(usize, usize, u32)> = Vec::new();
        for d in 0..e.indptr.len() - 1 {
            open.clear();
            for i in e.indptr[d] as usize..e.indptr[d + 1] as usize {
                let u = e.ids[i];
                let o = owner(u)?;
                owner_of.push(o as u32);
                if o == rank {
                    if slot[u as usize] == ABSENT {
                        slot[u as usize] = owned.len() as u32;
                        touched.push(u);
                        owned.push(u);
                    }
                    continue;
                }
                edge_row[i] = match shuffle {
                    Shuffle::Rows => {
                        let at = &mut slot[u as usize];
                        if *at == ABSENT {
                            *at = rows_of[o];
                            rows_of[o] += 1;
                            payload[o].push(u);
                            touched.push(u);
                        }
                        *at
                    }
                    Shuffle::PartialSums => {
                        let g = match open.iter().find(|x| x.0 == o) {
                            Some(&(_, size_at, g)) => {
                                payload[o][size_at] += 1;
                                g
                            }
                            None => {
                                let g = rows_of[o];
                                rows_of[o] += 1;
                                open.push((o, payload[o].len(), g));
                                payload[o].push(1);
                                g
                            }
                        };
                        payload[o].push(u);
                        g
                    }
                };
            }
        }
        let asked = comm.all_to_all_v(&payload.iter().map(|r| encode(r)).collect::<Vec<_>>())?;
        let mut serve = Vec::with_capacity(size);
        let mut groups = Vec::with_capacity(size);
        for (p, bytes) in asked.iter().enumerate() {
            let words = decode(bytes, p)?;
            if p == rank && !words.is_empty() {
                return Err(ExecError::Invalid(format!(
                    "worker {rank} sent itself {} requests",
                    words.len()
                )));
            }
            let (members, offsets) = match shuffle {
                Shuffle::Rows => (words, None),
                Shuffle::PartialSums => {
                    let (m, o) = split_groups(&words, p)?;
                    (m, Some(o))
                }
            };
            let mut at = Vec::with_capacity(members.len());
            for u in members {
                if owner(u)? != rank {
                    return Err(ExecError::Invalid(format!(
                        "worker {p} asked worker {rank} for vertex {u}, which it does not own"
                    )));
                }
                if slot[u as usize] == ABSENT {
                    slot[u as usize] = owned.len() as u32;
                    touched.push(u);
                    owned.push(u);
                }
                at.push(slot[u as usize]);
            }
            serve.push(at);
            groups.push(offsets.unwrap_or_default());
        }
        reach.push(owned.len());
        // Local source ids are 32-bit, as in the one-worker batch.
        let rows = owned.len() as u64 + rows_of.iter().map(|&r| r as u64).sum::<u64>();
        if rows > u32::MAX as u64 {
            return Err(ExecError::Invalid(format!(
                "a hop of this split batch has {rows} source rows, more than 32-bit local ids \
                 can number; use smaller batches"
            )));
        }
        let own_rows = owned.len() as u32;
        let mut first = vec![0u32; size];
        for p in 1..size {
            first[p] = first[p - 1] + rows_of[p - 1];
        }
        let indices = e
            .ids
            .iter()
            .zip(&owner_of)
            .zip(&edge_row)
            .map(|((&u, &o), &r)| {
                if o as usize == rank {
                    slot[u as usize]
                } else {
                    own_rows + first[o as usize] + r
                }
            })
            .collect();
        let remote = match shuffle {
            Shuffle::Rows => {
                // Row indices are per hop: the next hop asks afresh.
                for &u in payload.iter().flatten() {
                    slot[u as usize] = ABSENT;
                }
                payload.concat()
            }
            Shuffle::PartialSums => Vec::new(),
        };
        hops.push(SplitHop {
            indptr: e.indptr,
            indices,
            weights: e.weights,
            remote_counts: rows_of.iter().map(|&r| r as usize).collect(),
            remote,
            serve,
            serve_groups: (shuffle == Shuffle::PartialSums).then_some(groups),
        });
    }
    let ds = sampler.dataset();
    let labels = match &ds.labels {
        Some(l) => owned[..reach[0]].iter().map(|&v| l[v as usize]).collect(),
        None => vec![-1; reach[0]],
    };
    Ok(SplitBatch {
        key,
        step_seeds: seeds.len(),
        owned,
        reach,
        hops,
        labels,
    })
}

/// Splits a partial-sum payload (groups as their size then their members) into the members and
/// `groups + 1` offsets; a size of 0 or one running past the end is an error naming `from`.
fn split_groups(words: &[u32], from: usize) -> Result<(Vec<u32>, Vec<u32>)> {
    let (mut members, mut offsets) = (Vec::with_capacity(words.len()), vec![0u32]);
    let mut i = 0;
    while i < words.len() {
        let k = words[i] as usize;
        if k == 0 || k > words.len() - i - 1 {
            return Err(ExecError::Invalid(format!(
                "worker {from} sent a partial-sum group of {k} members with {} values left",
                words.len() - i - 1
            )));
        }
        members.extend_from_slice(&words[i + 1..i + 1 + k]);
        offsets.push(members.len() as u32);
        i += 1 + k;
    }
    Ok((members, offsets))
}

fn encode(ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn decode(bytes: &[u8], from: usize) -> Result<Vec<u32>> {
    if !bytes.len().is_multiple_of(4) {
        return Err(ExecError::Invalid(format!(
            "worker {from} sent {} bytes of vertex ids; expected a multiple of 4",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preaggregation_counts_one_row_per_destination_and_owner() {
        // Worker 0 of 3 with 2 rows of its own; remote ids 2 and 3 belong to worker 1, 4 to
        // worker 2. Destination 0 reads 0, 2, 3 (worker 1 twice: one partial sum); destination
        // 1 reads 2, 4, 4 (workers 1 and 2: two).
        let hop = SplitHop {
            indptr: vec![0, 3, 6],
            indices: vec![0, 2, 3, 2, 4, 4],
            weights: None,
            remote: vec![10, 11, 20],
            remote_counts: vec![0, 2, 1],
            serve: vec![vec![], vec![], vec![]],
            serve_groups: None,
        };
        assert_eq!(hop.local_and_remote_edges(2), (1, 5));
        assert_eq!(hop.preaggregated_rows(2), 3);
        // Without worker 1's second source, destination 0 still needs its one partial sum.
        let fewer = SplitHop {
            indptr: vec![0, 2, 4],
            indices: vec![0, 2, 1, 3],
            remote: vec![10, 20],
            remote_counts: vec![0, 1, 1],
            ..hop
        };
        assert_eq!(fewer.preaggregated_rows(2), 2);
        assert_eq!(fewer.local_and_remote_edges(2), (2, 2));
    }
}
