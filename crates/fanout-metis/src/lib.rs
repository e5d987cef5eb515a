//! GSplit's offline step: partition a dataset's graph with METIS and write it relabelled so
//! that each part is a contiguous range of vertex ids (`fanout dataset partition --method metis
//! --parts G DIR OUT`).
//!
//! METIS partitions the symmetrised graph (every stored arc in both directions, self-loops and
//! repeats dropped) into `G` parts of balanced vertex counts with few cut edges. Vertices are
//! then renumbered part by part, keeping their order inside a part, and the dataset is written
//! through [`fanout_graph::relabel`] with `part_offsets.bin` (`G + 1` u64 boundaries: part `p`
//! holds ids `offsets[p]..offsets[p + 1]`) and `old_to_new.bin` beside it.

use fanout_graph::relabel::relabel_into;
use fanout_graph::{Cancel, Dataset, DatasetWriter, Error, Progress, Result};
use rayon::prelude::*;
use std::path::Path;

/// The file of part boundaries in a partitioned dataset (`G + 1` little-endian u64).
pub const PART_OFFSETS: &str = fanout_graph::files::PART_OFFSETS;

/// What a partition looks like, for the summary a person reads.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PartitionSummary {
    /// Number of parts.
    pub parts: usize,
    /// Vertices per part.
    pub vertices: Vec<u64>,
    /// Training vertices per part.
    pub train: Vec<u64>,
    /// Stored arcs whose two ends lie in different parts, over all stored arcs.
    pub cut_fraction: f64,
    /// Largest part over the mean part (1.0 is perfect balance).
    pub imbalance: f64,
}

/// The part of every vertex: METIS k-way on the symmetrised graph, seeded by `seed` (the same
/// seed gives the same parts; METIS takes a C `int`, so seeds are reduced modulo 2^31 - 1 and
/// `s` and `s + 2^31 - 1` give the same parts). One part puts every vertex in part 0.
pub fn metis_parts(ds: &Dataset, parts: usize, seed: u64) -> Result<Vec<u32>> {
    let n = ds.num_nodes() as usize;
    if parts == 0 {
        return Err(Error::Invalid("--parts must be at least 1".into()));
    }
    if parts > n.max(1) {
        return Err(Error::Invalid(format!(
            "--parts {parts} is more than the {n} vertices"
        )));
    }
    if parts == 1 {
        return Ok(vec![0; n]);
    }
    let (xadj, adjncy) = symmetric_adjacency(ds)?;
    let mut part = vec![0 as metis::Idx; n];
    let idx = |x: usize, what: &str| {
        metis::Idx::try_from(x).map_err(|_| {
            Error::Invalid(format!(
                "{what} {x} is more than METIS's 32-bit ids hold (2^31 - 1)"
            ))
        })
    };
    let k = idx(parts, "--parts")?;
    let seed = idx((seed % (i32::MAX as u64)) as usize, "seed")?;
    let graph = metis::Graph::new(1, k, &xadj, &adjncy)
        .map_err(|e| Error::Invalid(format!("METIS refused the graph: {e}")))?
        .set_option(metis::option::Seed(seed));
    graph
        .part_kway(&mut part)
        .map_err(|e| Error::Invalid(format!("METIS failed: {e}")))?;
    Ok(part.into_iter().map(|p| p as u32).collect())
}

/// The symmetrised graph in METIS's CSR form (`xadj`, `adjncy`), rows sorted, without
/// self-loops or repeats.
fn symmetric_adjacency(ds: &Dataset) -> Result<(Vec<metis::Idx>, Vec<metis::Idx>)> {
    let t = &ds.topology;
    let n = t.num_nodes() as usize;
    if 2 * t.num_arcs() > i32::MAX as u64 || n > i32::MAX as usize {
        return Err(Error::Invalid(format!(
            "{} vertices and {} arcs: METIS's 32-bit ids hold at most 2^31 - 1 vertices and \
             adjacency entries (2 x arcs)",
            n,
            t.num_arcs()
        )));
    }
    // Both directions of every arc, then each row sorted and deduplicated.
    let mut deg = vec![0usize; n + 1];
    for v in 0..n {
        for u in t.row(v as u64).iter() {
            if u as usize != v {
                deg[v] += 1;
                deg[u as usize] += 1;
            }
        }
    }
    let mut start = Vec::with_capacity(n + 1);
    let mut acc = 0usize;
    for d in &deg[..n] {
        start.push(acc);
        acc += d;
    }
    start.push(acc);
    let mut fill = start.clone();
    let mut adj = vec![0 as metis::Idx; acc];
    for v in 0..n {
        for u in t.row(v as u64).iter() {
            let u = u as usize;
            if u != v {
                adj[fill[v]] = u as metis::Idx;
                fill[v] += 1;
                adj[fill[u]] = v as metis::Idx;
                fill[u] += 1;
            }
        }
    }
    // Sort and deduplicate each row in place, then compact.
    let mut rows: Vec<&mut [metis::Idx]> = Vec::with_capacity(n);
    let mut rest = &mut adj[..];
    for v in 0..n {
        let (row, tail) = rest.split_at_mut(start[v + 1] - start[v]);
        rows.push(row);
        rest = tail;
    }
    let kept: Vec<usize> = rows
        .par_iter_mut()
        .map(|r| {
            r.sort_unstable();
            let mut k = 0;
            for i in 0..r.len() {
                if i == 0 || r[i] != r[i - 1] {
                    r[k] = r[i];
                    k += 1;
                }
            }
            k
        })
        .collect();
    let mut xadj = Vec::with_capacity(n + 1);
    let mut adjncy = Vec::with_capacity(kept.iter().sum());
    xadj.push(0);
    for v in 0..n {
        adjncy.extend_from_slice(&adj[start[v]..start[v] + kept[v]]);
        xadj.push(adjncy.len() as metis::Idx);
    }
    Ok((xadj, adjncy))
}

/// New ids that make every part a contiguous range, parts in order and vertices in their old
/// order inside a part, and the `parts + 1` boundaries.
pub fn contiguous_ids(part: &[u32], parts: usize) -> (Vec<u32>, Vec<u64>) {
    let mut offsets = vec![0u64; parts + 1];
    for &p in part {
        offsets[p as usize + 1] += 1;
    }
    for p in 0..parts {
        offsets[p + 1] += offsets[p];
    }
    let mut next = offsets.clone();
    let new_of_old = part
        .iter()
        .map(|&p| {
            let id = next[p as usize];
            next[p as usize] += 1;
            id as u32
        })
        .collect();
    (new_of_old, offsets)
}

/// Partitions `ds` into `parts` with METIS and writes the relabelled dataset to `out`
/// (atomically: a temporary folder renamed at the end; `overwrite` as every writer).
pub fn partition_dataset(
    ds: &Dataset,
    parts: usize,
    seed: u64,
    out: &Path,
    overwrite: bool,
    progress: &dyn Progress,
    cancel: &Cancel,
) -> Result<PartitionSummary> {
    let mut writer = DatasetWriter::create(out, overwrite)?.with_cancel(cancel.clone());
    progress.phase("METIS", 0, "");
    let part = metis_parts(ds, parts, seed)?;
    progress.finish_phase();
    cancel.check()?;
    let (new_of_old, offsets) = contiguous_ids(&part, parts);
    let meta = relabel_into(ds, &new_of_old, &mut writer, progress)?;
    writer.write_array(PART_OFFSETS, &offsets)?;
    writer.finish(meta, progress)?;
    Ok(summary(ds, &part, &offsets))
}

/// Sizes, training vertices per part, cut fraction and imbalance of `part`.
pub fn summary(ds: &Dataset, part: &[u32], offsets: &[u64]) -> PartitionSummary {
    let parts = offsets.len() - 1;
    let vertices: Vec<u64> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
    let mut train = vec![0u64; parts];
    for &v in ds.train.iter() {
        train[part[v as usize] as usize] += 1;
    }
    let t = &ds.topology;
    let cut: u64 = (0..t.num_nodes())
        .into_par_iter()
        .map(|v| {
            let pv = part[v as usize];
            t.row(v).iter().filter(|&u| part[u as usize] != pv).count() as u64
        })
        .sum();
    let mean = ds.num_nodes() as f64 / parts as f64;
    PartitionSummary {
        parts,
        imbalance: vertices.iter().copied().max().unwrap_or(0) as f64 / mean.max(1.0),
        vertices,
        train,
        cut_fraction: cut as f64 / t.num_arcs().max(1) as f64,
    }
}

#[cfg(test)]
mod tests;
