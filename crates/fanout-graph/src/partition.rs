//! Training-set partitions for data-parallel workers (PaGraph), stored beside the dataset.
//!
//! [`partition_training_set`] splits the training vertices into `K` parts and gives each part
//! the vertex set `PV_i` it needs: its training vertices and their whole `L`-hop
//! in-neighbourhood (vertices may be replicated in several parts), so a worker that samples at
//! most `L` hops from its training vertices never leaves its part. Two methods:
//!
//! - **PaGraph** (computation-aware, the paper's Eq. 1 with the `+1` terms of its authors'
//!   code): the training vertices are streamed in a seed-shuffled order and each goes to the
//!   part maximising `(1 + |TV_i ∩ IN_L(v)|) * (|TV|/K - |TV_i|) / (|PV_i| + 1)`, where
//!   `IN_L(v)` is `v`'s `L`-hop in-neighbourhood, `TV_i` the training vertices already in part
//!   `i` and `PV_i` its vertex set; ties go to the part with fewer training vertices, then the
//!   lower index. The first factor keeps a vertex near the training vertices it shares
//!   neighbours with (less replication), the second balances the training load, the third
//!   penalises parts that are already large.
//! - **Random**: the shuffled training vertices are dealt round-robin (perfect balance, no
//!   locality); the baseline.
//!
//! A partition lives in `DATASET/partitions/NAME/` (GUIDE section 6): `meta.txt` (`METHOD`,
//! `PARTS`, `HOPS`, `SEED`, the dataset's `NUM_NODE`, `NUM_EDGE` and `NUM_TRAIN_SET`, and
//! `NUM_TRAIN_<i>` / `NUM_VERTEX_<i>` per part) and little-endian `u32` arrays `train_<i>.bin`
//! (TV_i, sorted) and `vertices_<i>.bin` (PV_i, sorted, containing TV_i). It is written to a
//! temporary directory and renamed into place, so a partition is either whole or absent.

use crate::cancel::Cancel;
use crate::dataset::{Dataset, Row};
use crate::error::{Error, Result};
use crate::meta::Layout;
use crate::progress::Progress;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The folder under a dataset that holds its partitions.
pub const PARTITIONS_DIR: &str = "partitions";

/// Stream tag of the partitioner's shuffle.
const SHUFFLE_TAG: u64 = 0x5041_4752; // "PAGR"

/// How the training vertices are split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionMethod {
    /// PaGraph's computation-aware streaming partition (Eq. 1).
    PaGraph,
    /// Round-robin over a shuffled order.
    Random,
}

impl PartitionMethod {
    /// `pagraph` or `random`.
    pub fn name(self) -> &'static str {
        match self {
            PartitionMethod::PaGraph => "pagraph",
            PartitionMethod::Random => "random",
        }
    }
}

impl std::str::FromStr for PartitionMethod {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "pagraph" => Ok(PartitionMethod::PaGraph),
            "random" => Ok(PartitionMethod::Random),
            _ => Err(format!(
                "unknown partition method {s:?}; expected pagraph or random"
            )),
        }
    }
}

/// A training-set partition: `train[i]` (TV_i) and `vertices[i]` (PV_i) for every part.
/// Guarantees (from [`partition_training_set`], checked by [`Partition::open`]): every
/// training vertex of the dataset is in exactly one `train[i]`; each list is sorted without
/// duplicates; `train[i] ⊆ vertices[i]`; `vertices[i]` holds the `hops`-hop in-neighbourhood
/// of every vertex of `train[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    /// How it was made.
    pub method: PartitionMethod,
    /// Number of parts K.
    pub parts: usize,
    /// L: the in-neighbourhood depth each part holds.
    pub hops: usize,
    /// Seed of the streaming order.
    pub seed: u64,
    /// Training vertices of each part (TV_i), sorted.
    pub train: Vec<Vec<u32>>,
    /// Vertices of each part (PV_i), sorted.
    pub vertices: Vec<Vec<u32>>,
}

/// Figures of a partition, for `dataset info` and `dataset partition`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PartitionStats {
    /// Method name.
    pub method: &'static str,
    /// K.
    pub parts: usize,
    /// L.
    pub hops: usize,
    /// |TV_i| per part.
    pub train: Vec<usize>,
    /// |PV_i| per part.
    pub vertices: Vec<usize>,
    /// Arcs with both ends in PV_i, per part (the part's induced subgraph).
    pub edges: Vec<u64>,
    /// Training balance: max |TV_i| / mean |TV_i| (1 = perfect).
    pub train_balance: f64,
    /// Replicated vertices: (sum |PV_i| - |union of PV_i|) / |union of PV_i|, in percent.
    pub replicated_pct: f64,
    /// Mean |PV_i| / |V|, in percent.
    pub mean_part_pct: f64,
}

/// Splits `ds`'s training set into `parts` parts with `method` (see the module doc), each part
/// holding the `hops`-hop in-neighbourhood of its training vertices. Deterministic per `seed`.
/// Errors: zero parts, a CSR dataset (in-neighbours are not stored), no training vertex, or a
/// training id out of range.
pub fn partition_training_set(
    ds: &Dataset,
    method: PartitionMethod,
    parts: usize,
    hops: usize,
    seed: u64,
    progress: &dyn Progress,
    cancel: &Cancel,
) -> Result<Partition> {
    if parts == 0 {
        return Err(Error::Invalid("a partition needs at least one part".into()));
    }
    if ds.topology.layout != Layout::Csc {
        return Err(Error::Invalid(format!(
            "{}: partitioning follows in-neighbours, which a LAYOUT csr dataset does not store; \
             import it again without --layout csr",
            ds.dir.display()
        )));
    }
    let n = ds.num_nodes() as usize;
    let mut order = ds.train.to_vec();
    if order.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: the dataset has no training vertices to partition",
            ds.dir.display()
        )));
    }
    if let Some(&v) = order.iter().find(|&&v| v as usize >= n) {
        return Err(Error::format(
            ds.dir.join("train_set.bin"),
            format!("training id {v} is out of range (NUM_NODE {n})"),
        ));
    }
    fanout_rand::Rng::keyed(&[seed, SHUFFLE_TAG]).shuffle(&mut order);
    let mut p = partition_in_order(ds, method, parts, hops, &order, progress, cancel)?;
    p.seed = seed;
    Ok(p)
}

/// [`partition_training_set`] over the training vertices streamed in `order`.
fn partition_in_order(
    ds: &Dataset,
    method: PartitionMethod,
    parts: usize,
    hops: usize,
    order: &[u32],
    progress: &dyn Progress,
    cancel: &Cancel,
) -> Result<Partition> {
    let n = ds.num_nodes() as usize;
    let total = order.len();
    let avg = total as f64 / parts as f64;
    let mut member = vec![Bitset::new(n); parts];
    let mut pv_len = vec![0usize; parts];
    let mut train: Vec<Vec<u32>> = vec![Vec::new(); parts];
    // owner[v] = part + 1 of an assigned training vertex, 0 otherwise.
    let mut owner = vec![0u32; n];
    let mut bfs = Bfs::new(n);
    let mut shared = vec![0usize; parts];
    progress.phase("partitioning training vertices", total as u64, "vertices");
    for (k, &v) in order.iter().enumerate() {
        let hood = bfs.in_neighbourhood(ds, v, hops)?;
        let best = match method {
            PartitionMethod::Random => k % parts,
            PartitionMethod::PaGraph => {
                shared.iter_mut().for_each(|c| *c = 0);
                for &u in hood {
                    if let Some(p) = (owner[u as usize] as usize).checked_sub(1) {
                        shared[p] += 1;
                    }
                }
                let score = |i: usize| {
                    (1.0 + shared[i] as f64) * (avg - train[i].len() as f64)
                        / (pv_len[i] as f64 + 1.0)
                };
                let mut best = 0;
                for i in 1..parts {
                    let (s, b) = (score(i), score(best));
                    if s > b || (s == b && train[i].len() < train[best].len()) {
                        best = i;
                    }
                }
                best
            }
        };
        train[best].push(v);
        owner[v as usize] = best as u32 + 1;
        for &u in hood {
            if member[best].insert(u as usize) {
                pv_len[best] += 1;
            }
        }
        if k % 64 == 63 {
            // A deep neighbourhood can take milliseconds a vertex: checked often.
            cancel.check()?;
            if k % 1024 == 1023 {
                progress.advance(1024);
            }
        }
    }
    progress.finish_phase();
    for t in &mut train {
        t.sort_unstable();
    }
    let vertices = member.iter().map(Bitset::ones).collect();
    Ok(Partition {
        method,
        parts,
        hops,
        seed: 0,
        train,
        vertices,
    })
}

/// A fixed-size set of vertex ids.
#[derive(Clone)]
struct Bitset(Vec<u64>);

impl Bitset {
    fn new(n: usize) -> Self {
        Bitset(vec![0; n.div_ceil(64)])
    }
    /// Adds `i`; true if it was not there.
    fn insert(&mut self, i: usize) -> bool {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        let new = self.0[w] & b == 0;
        self.0[w] |= b;
        new
    }
    fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1u64 << (i % 64)) != 0
    }
    /// The members, ascending.
    fn ones(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (w, &word) in self.0.iter().enumerate() {
            let mut x = word;
            while x != 0 {
                out.push((w * 64 + x.trailing_zeros() as usize) as u32);
                x &= x - 1;
            }
        }
        out
    }
}

/// Breadth-first search over in-arcs with an epoch-stamped visited array (no clearing).
struct Bfs {
    stamp: Vec<u32>,
    epoch: u32,
    found: Vec<u32>,
}

impl Bfs {
    fn new(n: usize) -> Self {
        Bfs {
            stamp: vec![0; n],
            epoch: 0,
            found: Vec::new(),
        }
    }

    /// `v` and every vertex from which a path of at most `hops` arcs leads to `v`.
    fn in_neighbourhood(&mut self, ds: &Dataset, v: u32, hops: usize) -> Result<&[u32]> {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.stamp.fill(0);
            self.epoch = 1;
        }
        let n = self.stamp.len();
        self.found.clear();
        self.found.push(v);
        self.stamp[v as usize] = self.epoch;
        let mut frontier = 0..1;
        for _ in 0..hops {
            let end = self.found.len();
            for i in frontier.clone() {
                let u = self.found[i] as u64;
                let mut visit = |w: u64| -> Result<()> {
                    let w = w as usize;
                    if w >= n {
                        return Err(Error::format(
                            ds.dir.join("indices.bin"),
                            format!(
                                "neighbour id {w} of vertex {u} is out of range (NUM_NODE {n})"
                            ),
                        ));
                    }
                    if self.stamp[w] != self.epoch {
                        self.stamp[w] = self.epoch;
                        self.found.push(w as u32);
                    }
                    Ok(())
                };
                match ds.topology.row(u) {
                    Row::U32(r) => r.iter().try_for_each(|&w| visit(w as u64))?,
                    Row::U64(r) => r.iter().try_for_each(|&w| visit(w))?,
                }
            }
            frontier = end..self.found.len();
            if frontier.is_empty() {
                break;
            }
        }
        Ok(&self.found)
    }
}

impl Partition {
    /// The default name of a partition: `{method}-{parts}` (e.g. `pagraph-4`).
    pub fn default_name(method: PartitionMethod, parts: usize) -> String {
        format!("{}-{parts}", method.name())
    }

    /// Its figures over `ds` (the dataset it was made from).
    pub fn stats(&self, ds: &Dataset) -> PartitionStats {
        let n = ds.num_nodes() as usize;
        let train: Vec<usize> = self.train.iter().map(Vec::len).collect();
        let vertices: Vec<usize> = self.vertices.iter().map(Vec::len).collect();
        let mut union = Bitset::new(n);
        let mut distinct = 0usize;
        for pv in &self.vertices {
            for &v in pv {
                if (v as usize) < n && union.insert(v as usize) {
                    distinct += 1;
                }
            }
        }
        let edges = self
            .vertices
            .iter()
            .map(|pv| {
                let mut m = Bitset::new(n);
                pv.iter().filter(|&&v| (v as usize) < n).for_each(|&v| {
                    m.insert(v as usize);
                });
                pv.iter()
                    .filter(|&&v| (v as usize) < n)
                    .map(|&v| match ds.topology.row(v as u64) {
                        Row::U32(r) => r
                            .iter()
                            .filter(|&&w| (w as usize) < n && m.contains(w as usize))
                            .count() as u64,
                        Row::U64(r) => r
                            .iter()
                            .filter(|&&w| (w as usize) < n && m.contains(w as usize))
                            .count() as u64,
                    })
                    .sum()
            })
            .collect();
        let mean_train = train.iter().sum::<usize>() as f64 / self.parts.max(1) as f64;
        let sum_pv: usize = vertices.iter().sum();
        PartitionStats {
            method: self.method.name(),
            parts: self.parts,
            hops: self.hops,
            train_balance: train.iter().copied().max().unwrap_or(0) as f64 / mean_train.max(1e-9),
            replicated_pct: 100.0 * (sum_pv as f64 - distinct as f64) / (distinct.max(1) as f64),
            mean_part_pct: 100.0 * sum_pv as f64 / (self.parts.max(1) * n.max(1)) as f64,
            train,
            vertices,
            edges,
        }
    }

    /// Writes the partition as `ds_dir/partitions/NAME/`, through a temporary directory renamed
    /// into place. An existing partition of that name is an error unless `overwrite`, and is
    /// replaced only once the new one is complete. Returns the partition's directory.
    pub fn write(&self, ds: &Dataset, name: &str, overwrite: bool) -> Result<PathBuf> {
        check_name(name)?;
        let root = ds.dir.join(PARTITIONS_DIR);
        std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, "create", e))?;
        let dest = root.join(name);
        if dest.exists() && !overwrite {
            return Err(Error::Invalid(format!(
                "{} exists; add --overwrite to replace it",
                dest.display()
            )));
        }
        let tmp = root.join(format!(".{name}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let result = (|| {
            std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, "create", e))?;
            let mut meta = String::new();
            let mut kv = |k: &str, v: String| {
                let _ = writeln!(meta, "{k}\t{v}");
            };
            kv("METHOD", self.method.name().into());
            kv("PARTS", self.parts.to_string());
            kv("HOPS", self.hops.to_string());
            kv("SEED", self.seed.to_string());
            kv("NUM_NODE", ds.num_nodes().to_string());
            kv("NUM_EDGE", ds.num_arcs().to_string());
            kv("NUM_TRAIN_SET", ds.train.len().to_string());
            for i in 0..self.parts {
                kv(&format!("NUM_TRAIN_{i}"), self.train[i].len().to_string());
                kv(
                    &format!("NUM_VERTEX_{i}"),
                    self.vertices[i].len().to_string(),
                );
            }
            for i in 0..self.parts {
                write_u32s(&tmp.join(format!("train_{i}.bin")), &self.train[i])?;
                write_u32s(&tmp.join(format!("vertices_{i}.bin")), &self.vertices[i])?;
            }
            let mp = tmp.join("meta.txt");
            std::fs::write(&mp, meta).map_err(|e| Error::io(&mp, "write", e))
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if dest.exists() {
            let old = root.join(format!(".{name}.old-{}", std::process::id()));
            std::fs::rename(&dest, &old).map_err(|e| Error::io(&dest, "rename", e))?;
            std::fs::rename(&tmp, &dest).map_err(|e| Error::io(&tmp, "rename", e))?;
            let _ = std::fs::remove_dir_all(&old);
        } else {
            std::fs::rename(&tmp, &dest).map_err(|e| Error::io(&tmp, "rename", e))?;
        }
        Ok(dest)
    }

    /// Reads and checks the partition `name` of `ds` (see the guarantees of [`Partition`]).
    /// Errors name the file and the field or entry that is wrong.
    pub fn open(ds: &Dataset, name: &str) -> Result<Partition> {
        let head = PartitionMeta::read(ds, name)?;
        let mut train = Vec::with_capacity(head.parts);
        let mut vertices = Vec::with_capacity(head.parts);
        for i in 0..head.parts {
            let (t, v) = head.read_part(ds, i)?;
            train.push(t);
            vertices.push(v);
        }
        // Every training vertex of the dataset in exactly one part.
        let n = ds.num_nodes() as usize;
        let mut seen = vec![false; n];
        for (i, t) in train.iter().enumerate() {
            for &v in t {
                if std::mem::replace(&mut seen[v as usize], true) {
                    return Err(Error::format(
                        head.dir.join(format!("train_{i}.bin")),
                        format!("training vertex {v} is in two parts"),
                    ));
                }
            }
        }
        if let Some(v) = ds
            .train
            .iter()
            .find(|&&v| (v as usize) < n && !seen[v as usize])
        {
            return Err(Error::format(
                head.dir.join("meta.txt"),
                format!("training vertex {v} of the dataset is in no part"),
            ));
        }
        Ok(Partition {
            method: head.method,
            parts: head.parts,
            hops: head.hops,
            seed: head.seed,
            train,
            vertices,
        })
    }

    /// Reads only part `part` of partition `name` (a worker needs no other), with the checks
    /// that concern it; `(parts, hops, TV_part, PV_part)`.
    pub fn open_part(
        ds: &Dataset,
        name: &str,
        part: usize,
    ) -> Result<(usize, usize, Vec<u32>, Vec<u32>)> {
        let head = PartitionMeta::read(ds, name)?;
        if part >= head.parts {
            return Err(Error::Invalid(format!(
                "{}: part {part} asked of a partition of {} parts",
                head.dir.display(),
                head.parts
            )));
        }
        let (t, v) = head.read_part(ds, part)?;
        Ok((head.parts, head.hops, t, v))
    }
}

/// The names of the partitions stored beside `ds` (sorted; none when there are none).
pub fn list_partitions(ds: &Dataset) -> Result<Vec<String>> {
    let root = ds.dir.join(PARTITIONS_DIR);
    let Ok(rd) = std::fs::read_dir(&root) else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::io(&root, "read", e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && e.path().join("meta.txt").is_file() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// PaGraph's cache order for one part: the vertices of `vertices` (PV_i) by their degree in
/// the sampling direction inside the part's induced subgraph (how many arcs from a vertex end
/// at a vertex of the part, i.e. how often it can be drawn as a neighbour there), largest
/// first, ties to the larger id (GNNLab's artifact).
pub fn part_degree_ranking(ds: &Dataset, vertices: &[u32]) -> Vec<u32> {
    let n = ds.num_nodes() as usize;
    let mut member = Bitset::new(n);
    for &v in vertices.iter().filter(|&&v| (v as usize) < n) {
        member.insert(v as usize);
    }
    let mut degree: BTreeMap<u32, u64> = vertices.iter().map(|&v| (v, 0)).collect();
    for &v in vertices.iter().filter(|&&v| (v as usize) < n) {
        let mut count = |w: u64| {
            if (w as usize) < n && member.contains(w as usize) {
                if let Some(d) = degree.get_mut(&(w as u32)) {
                    *d += 1;
                }
            }
        };
        match ds.topology.row(v as u64) {
            Row::U32(r) => r.iter().for_each(|&w| count(w as u64)),
            Row::U64(r) => r.iter().for_each(|&w| count(w)),
        }
    }
    let mut ranked: Vec<(u64, u32)> = degree.into_iter().map(|(v, d)| (d, v)).collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    ranked.into_iter().map(|(_, v)| v).collect()
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "partition name {name:?}: use letters, digits, '-', '_' and '.' (not first)"
        )))
    }
}

fn write_u32s(path: &Path, v: &[u32]) -> Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| Error::io(path, "write", e))
}

/// A partition's meta.txt, checked against its dataset.
struct PartitionMeta {
    dir: PathBuf,
    method: PartitionMethod,
    parts: usize,
    hops: usize,
    seed: u64,
    counts: Vec<(usize, usize)>,
}

impl PartitionMeta {
    fn read(ds: &Dataset, name: &str) -> Result<PartitionMeta> {
        check_name(name)?;
        let dir = ds.dir.join(PARTITIONS_DIR).join(name);
        let mp = dir.join("meta.txt");
        if !mp.is_file() {
            let known = list_partitions(ds).unwrap_or_default();
            return Err(Error::Invalid(format!(
                "{}: no partition {name:?} (found: {}); write one with `fanout dataset partition`",
                ds.dir.display(),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        let text = std::fs::read_to_string(&mp).map_err(|e| Error::io(&mp, "read", e))?;
        let mut kv = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (k, v) = line.split_once('\t').ok_or_else(|| {
                Error::format(&mp, format!("line {}: expected KEY<tab>VALUE", i + 1))
            })?;
            kv.insert(k.trim().to_string(), v.trim().to_string());
        }
        let get = |k: &str| -> Result<&str> {
            kv.get(k)
                .map(String::as_str)
                .ok_or_else(|| Error::format(&mp, format!("{k} is missing")))
        };
        let num = |k: &str| -> Result<u64> {
            let v = get(k)?;
            v.parse::<u64>()
                .map_err(|_| Error::format(&mp, format!("{k} = {v:?}: expected a whole number")))
        };
        let method: PartitionMethod = get("METHOD")?
            .parse()
            .map_err(|e: String| Error::format(&mp, format!("METHOD: {e}")))?;
        let parts = num("PARTS")? as usize;
        if parts == 0 || parts > 1 << 16 {
            return Err(Error::format(
                &mp,
                format!("PARTS = {parts}: expected 1 to 65536"),
            ));
        }
        let (nn, ne, nt) = (num("NUM_NODE")?, num("NUM_EDGE")?, num("NUM_TRAIN_SET")?);
        if nn != ds.num_nodes() || ne != ds.num_arcs() || nt != ds.train.len() as u64 {
            return Err(Error::format(
                &mp,
                format!(
                    "made for a dataset of {nn} vertices, {ne} arcs and {nt} training vertices, \
                     but {} has {}, {} and {}; partition it again",
                    ds.dir.display(),
                    ds.num_nodes(),
                    ds.num_arcs(),
                    ds.train.len()
                ),
            ));
        }
        let mut counts = Vec::with_capacity(parts);
        for i in 0..parts {
            counts.push((
                num(&format!("NUM_TRAIN_{i}"))? as usize,
                num(&format!("NUM_VERTEX_{i}"))? as usize,
            ));
        }
        Ok(PartitionMeta {
            dir,
            method,
            parts,
            hops: num("HOPS")? as usize,
            seed: num("SEED")?,
            counts,
        })
    }

    /// Part `i`'s `(TV_i, PV_i)`, each checked: length, range, sorted, TV_i ⊆ PV_i.
    fn read_part(&self, ds: &Dataset, i: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let n = ds.num_nodes();
        let read = |file: String, count: usize, field: String| -> Result<Vec<u32>> {
            let p = self.dir.join(&file);
            let bytes = std::fs::read(&p).map_err(|e| Error::io(&p, "read", e))?;
            if bytes.len() as u64 != 4 * count as u64 {
                return Err(Error::format(
                    &p,
                    format!(
                        "{} bytes, expected {} = 4 x {field} ({count})",
                        bytes.len(),
                        4 * count as u64
                    ),
                ));
            }
            let v: Vec<u32> = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            for (k, w) in v.windows(2).enumerate() {
                if w[0] >= w[1] {
                    return Err(Error::format(
                        &p,
                        format!(
                            "entry {}: {} after {}, expected ascending ids",
                            k + 1,
                            w[1],
                            w[0]
                        ),
                    ));
                }
            }
            if let Some((k, &x)) = v.iter().enumerate().find(|(_, &x)| x as u64 >= n) {
                return Err(Error::format(
                    &p,
                    format!("entry {k}: vertex {x} out of range (NUM_NODE {n})"),
                ));
            }
            Ok(v)
        };
        let (nt, nv) = self.counts[i];
        let t = read(format!("train_{i}.bin"), nt, format!("NUM_TRAIN_{i}"))?;
        let v = read(format!("vertices_{i}.bin"), nv, format!("NUM_VERTEX_{i}"))?;
        if let Some(&x) = t.iter().find(|x| v.binary_search(x).is_err()) {
            return Err(Error::format(
                self.dir.join(format!("vertices_{i}.bin")),
                format!("training vertex {x} of part {i} is not among the part's vertices"),
            ));
        }
        Ok((t, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`partition_training_set`] without progress or cancellation.
    fn part(
        ds: &Dataset,
        m: PartitionMethod,
        parts: usize,
        hops: usize,
        seed: u64,
    ) -> Result<Partition> {
        partition_training_set(ds, m, parts, hops, seed, &NoProgress, &Cancel::new())
    }
    use crate::{build_topology, files, BuildOptions, DatasetWriter, Meta, NoProgress, SliceArcs};

    /// A dataset of `n` vertices with `arcs` (src, dst) and training set `train`, in `dir/ds`.
    fn dataset(dir: &Path, n: u64, arcs: &[(u64, u64)], train: &[u32]) -> Dataset {
        let out = dir.join("ds");
        let mut w = DatasetWriter::create(&out, true).unwrap();
        let opts = BuildOptions {
            num_nodes: Some(n),
            ..Default::default()
        };
        let st = build_topology(&mut SliceArcs(arcs), &opts, &mut w, &NoProgress).unwrap();
        w.write_array::<u32>(files::TRAIN, train).unwrap();
        let meta = Meta {
            num_node: n,
            num_edge: st.num_arcs,
            num_train_set: train.len() as u64,
            ..Meta::default()
        };
        w.finish(meta, &NoProgress).unwrap()
    }

    /// Training vertices 0, 1 share in-neighbour 2 and 0 -> 1; 4, 5 share 6 and 4 -> 5.
    fn two_communities(dir: &Path) -> Dataset {
        let arcs = [(2, 0), (2, 1), (0, 1), (6, 4), (6, 5), (4, 5), (3, 7)];
        dataset(dir, 8, &arcs, &[0, 1, 4, 5])
    }

    #[test]
    fn eq1_keeps_shared_neighbourhoods_together_where_random_splits_them() {
        let t = tempfile::tempdir().unwrap();
        let ds = two_communities(t.path());
        // Streamed 0, 4, 5, 1 (|TV|/K = 2): 0 ties and goes to part 0; 4 scores 2 in the empty
        // part 1 against 1/3; 5 shares 4 with part 1: (1+1)(2-1)/(2+1) = 2/3 against
        // (1+0)(2-1)/(2+1) = 1/3; 1 shares 0 with part 0: 2/3 against (2-2) = 0.
        let order = [0, 4, 5, 1];
        let stream = |method, parts, hops| {
            partition_in_order(
                &ds,
                method,
                parts,
                hops,
                &order,
                &NoProgress,
                &Cancel::new(),
            )
            .unwrap()
        };
        let p = stream(PartitionMethod::PaGraph, 2, 1);
        assert_eq!(p.train, vec![vec![0, 1], vec![4, 5]]);
        assert_eq!(p.vertices, vec![vec![0, 1, 2], vec![4, 5, 6]]);
        let s = p.stats(&ds);
        assert_eq!(s.replicated_pct, 0.0);
        assert_eq!(s.edges, vec![3, 3]);
        assert_eq!(s.train_balance, 1.0);
        // Round robin over the same order mixes the communities and replicates 2 and 6.
        let r = stream(PartitionMethod::Random, 2, 1);
        assert_eq!(r.train, vec![vec![0, 5], vec![1, 4]]);
        assert!(r.stats(&ds).replicated_pct > 0.0);
        // Two hops: 1's neighbourhood is {1, 2, 0} (2 has no in-arcs).
        let deep = stream(PartitionMethod::PaGraph, 1, 2);
        assert_eq!(deep.vertices, vec![vec![0, 1, 2, 4, 5, 6]]);
    }

    fn random_dataset(dir: &Path) -> Dataset {
        let mut r = fanout_rand::Rng::new(3);
        let n = 600u64;
        let arcs: Vec<(u64, u64)> = (0..4000).map(|_| (r.below(n), r.below(n))).collect();
        let train: Vec<u32> = (0..n as u32).filter(|v| v % 5 == 0).collect();
        dataset(dir, n, &arcs, &train)
    }

    #[test]
    fn parts_cover_the_training_set_once_and_hold_its_l_hop_in_neighbourhood() {
        let t = tempfile::tempdir().unwrap();
        let ds = random_dataset(t.path());
        for method in [PartitionMethod::PaGraph, PartitionMethod::Random] {
            for (parts, hops) in [(2, 1), (3, 2), (4, 2)] {
                let p = part(&ds, method, parts, hops, 9).unwrap();
                let mut all: Vec<u32> = p.train.concat();
                all.sort_unstable();
                assert_eq!(all, ds.train.to_vec(), "{method:?} {parts}");
                let mut bfs = Bfs::new(ds.num_nodes() as usize);
                for i in 0..parts {
                    for &v in &p.train[i] {
                        for &u in bfs.in_neighbourhood(&ds, v, hops).unwrap() {
                            assert!(p.vertices[i].binary_search(&u).is_ok(), "{u} near {v}");
                        }
                    }
                }
                let s = p.stats(&ds);
                assert!(
                    s.train_balance < 1.1,
                    "{method:?} {parts}: {}",
                    s.train_balance
                );
                // Deterministic per seed, and the seed matters.
                let again = part(&ds, method, parts, hops, 9);
                assert_eq!(again.unwrap(), p);
            }
        }
        let a = part(&ds, PartitionMethod::Random, 3, 1, 1);
        let b = part(&ds, PartitionMethod::Random, 3, 1, 2);
        assert_ne!(a.unwrap().train, b.unwrap().train);
        assert!(part(&ds, PartitionMethod::Random, 0, 1, 1).is_err());
    }

    #[test]
    fn written_partitions_reopen_and_damage_is_named() {
        let t = tempfile::tempdir().unwrap();
        let ds = random_dataset(t.path());
        let p = part(&ds, PartitionMethod::PaGraph, 3, 2, 0).unwrap();
        let dir = p.write(&ds, "pg", false).unwrap();
        assert_eq!(Partition::open(&ds, "pg").unwrap(), p);
        assert_eq!(list_partitions(&ds).unwrap(), vec!["pg".to_string()]);
        let (parts, hops, t1, v1) = Partition::open_part(&ds, "pg", 1).unwrap();
        assert_eq!((parts, hops, &t1, &v1), (3, 2, &p.train[1], &p.vertices[1]));
        // No overwrite without asking; with it, replaced whole.
        assert!(p.write(&ds, "pg", false).is_err());
        p.write(&ds, "pg", true).unwrap();
        assert!(p.write(&ds, "../x", true).is_err());
        let err = |name: &str| Partition::open(&ds, name).unwrap_err().to_string();
        assert!(
            err("none").contains("no partition \"none\""),
            "{}",
            err("none")
        );
        // A truncated part: its file is named, and the other parts still open alone.
        let f = dir.join("train_1.bin");
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() - 4]).unwrap();
        let e = err("pg");
        assert!(
            e.contains("train_1.bin") && e.contains("NUM_TRAIN_1"),
            "{e}"
        );
        assert!(Partition::open_part(&ds, "pg", 0).is_ok());
        assert!(Partition::open_part(&ds, "pg", 1).is_err());
        std::fs::write(&f, &bytes).unwrap();
        // An id out of range.
        let v = dir.join("vertices_2.bin");
        let good = std::fs::read(&v).unwrap();
        let mut bad = good.clone();
        let last = bad.len() - 4;
        bad[last..].copy_from_slice(&9999u32.to_le_bytes());
        std::fs::write(&v, &bad).unwrap();
        let e = err("pg");
        assert!(e.contains("vertices_2.bin") && e.contains("9999"), "{e}");
        std::fs::write(&v, &good).unwrap();
        // Made for another dataset.
        let m = dir.join("meta.txt");
        let text = std::fs::read_to_string(&m).unwrap();
        std::fs::write(&m, text.replace("NUM_NODE\t600", "NUM_NODE\t601")).unwrap();
        let e = err("pg");
        assert!(e.contains("meta.txt") && e.contains("601"), "{e}");
        std::fs::write(&m, &text).unwrap();
        assert!(Partition::open(&ds, "pg").is_ok());
    }

    #[test]
    fn part_degree_ranks_by_arcs_inside_the_part() {
        let t = tempfile::tempdir().unwrap();
        let ds = two_communities(t.path());
        // Inside {0, 1, 2}: 2 -> 0, 2 -> 1, 0 -> 1: 2 is drawn twice, 0 once, 1 never.
        assert_eq!(part_degree_ranking(&ds, &[0, 1, 2]), vec![2, 0, 1]);
        // Inside {1, 2}: 2 once; ties to the larger id.
        assert_eq!(part_degree_ranking(&ds, &[1, 2, 7]), vec![2, 7, 1]);
    }
}
