//! Building the compressed topology from a stream of arcs, in two passes over the source so that
//! inputs larger than memory never have to be held: pass 1 counts row lengths, pass 2 places each
//! arc into a file-backed `indices` array. Rows are then sorted (and optionally deduplicated) in
//! parallel and compacted. Memory use is 24 bytes per vertex plus the page cache.

use crate::array::ArrayMut;
use crate::dataset::{files, VertexId};
use crate::error::{Error, Result};
use crate::meta::Layout;
use crate::progress::Progress;
use crate::writer::DatasetWriter;
use rayon::prelude::*;

/// How arcs become the stored topology.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// CSC (rows list in-neighbours; the default) or CSR.
    pub layout: Layout,
    /// Add the reverse of every arc (self-loops are not doubled).
    pub symmetrize: bool,
    /// Drop arcs whose two ends are the same vertex.
    pub drop_self_loops: bool,
    /// Keep one copy of repeated arcs.
    pub dedup: bool,
    /// The number of vertices; `None` means "largest id seen + 1". When given, larger ids are an
    /// error.
    pub num_nodes: Option<u64>,
}

/// What the build did, for the summary a person reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BuildStats {
    pub num_nodes: u64,
    /// Arcs read from the source.
    pub input_arcs: u64,
    pub self_loops_dropped: u64,
    /// Reverse arcs added by symmetrisation (before deduplication).
    pub reverse_arcs_added: u64,
    pub duplicates_dropped: u64,
    /// Arcs stored.
    pub num_arcs: u64,
}

/// Receives one batch of arcs `(src, dst)`; an error stops the scan.
pub type ArcSink<'a> = dyn FnMut(&[(u64, u64)]) -> Result<()> + 'a;

/// A re-readable stream of arcs `(src, dst)`.
pub trait ArcSource {
    /// Sends every arc to `sink` in batches, reporting progress. Called once per pass; every call
    /// must yield the same arcs. Sources that know the vertex count should reject out-of-range
    /// ids themselves, naming the file and line.
    fn scan(&mut self, progress: &dyn Progress, sink: &mut ArcSink<'_>) -> Result<()>;

    /// Total units of one scan for progress bars (`(0, _)` if unknown) and their name.
    fn size_hint(&self) -> (u64, &'static str) {
        (0, "arcs")
    }
}

/// An in-memory arc list as a source (tests, small generated graphs).
pub struct SliceArcs<'a>(pub &'a [(u64, u64)]);

impl ArcSource for SliceArcs<'_> {
    fn scan(&mut self, progress: &dyn Progress, sink: &mut ArcSink<'_>) -> Result<()> {
        for chunk in self.0.chunks(1 << 20) {
            sink(chunk)?;
            progress.advance(chunk.len() as u64);
        }
        Ok(())
    }
    fn size_hint(&self) -> (u64, &'static str) {
        (self.0.len() as u64, "arcs")
    }
}

/// Builds `indptr`/`indices` (32- or 64-bit as needed) into `writer` from `src`.
pub fn build_topology(
    src: &mut dyn ArcSource,
    opts: &BuildOptions,
    writer: &mut DatasetWriter,
    progress: &dyn Progress,
) -> Result<BuildStats> {
    let (hint, unit) = src.size_hint();
    let cancel = writer.cancel().clone();
    let mut stats = BuildStats::default();
    let csc = opts.layout == Layout::Csc;

    // Pass 1: row lengths.
    progress.phase("pass 1/2: count degrees", hint, unit);
    let mut counts: Vec<u64> = vec![0; opts.num_nodes.unwrap_or(0) as usize];
    let mut max_id: Option<u64> = None;
    src.scan(progress, &mut |batch| {
        cancel.check()?;
        for &(s, d) in batch {
            stats.input_arcs += 1;
            let m = s.max(d);
            if let Some(n) = opts.num_nodes {
                if m >= n {
                    return Err(Error::Invalid(format!(
                        "arc {} ({s} -> {d}): vertex id {m} is out of range; expected < number of vertices {n}",
                        stats.input_arcs
                    )));
                }
            } else if m as usize >= counts.len() {
                counts.resize((m as usize + 1).max(counts.len() + counts.len() / 2), 0);
            }
            max_id = Some(max_id.map_or(m, |x| x.max(m)));
            // A dropped self-loop still names its vertex: the vertex count must not depend
            // on whether loops are kept.
            if s == d && opts.drop_self_loops {
                stats.self_loops_dropped += 1;
                continue;
            }
            let (row, col) = if csc { (d, s) } else { (s, d) };
            counts[row as usize] += 1;
            if opts.symmetrize && s != d {
                counts[col as usize] += 1;
                stats.reverse_arcs_added += 1;
            }
        }
        Ok(())
    })?;
    progress.finish_phase();
    let n = opts
        .num_nodes
        .unwrap_or_else(|| max_id.map_or(0, |m| m + 1));
    counts.truncate(n as usize);
    stats.num_nodes = n;
    if n >= 1 << 32 {
        place::<u64>(src, opts, writer, progress, counts, &mut stats)?;
    } else {
        place::<u32>(src, opts, writer, progress, counts, &mut stats)?;
    }
    Ok(stats)
}

/// Pass 2 and the row clean-up, for one id width.
fn place<I: VertexId>(
    src: &mut dyn ArcSource,
    opts: &BuildOptions,
    writer: &mut DatasetWriter,
    progress: &dyn Progress,
    counts: Vec<u64>,
    stats: &mut BuildStats,
) -> Result<()> {
    let n = counts.len();
    let mut indptr = Vec::with_capacity(n + 1);
    indptr.push(0u64);
    let mut acc = 0u64;
    for c in &counts {
        acc += c;
        indptr.push(acc);
    }
    drop(counts);
    let total = acc;
    let ids_file = if std::mem::size_of::<I>() == 8 {
        files::INDICES64
    } else {
        files::INDICES
    };
    let mut idx: ArrayMut<I> = writer.array_mut(ids_file, total)?;
    let cancel = writer.cancel().clone();
    let mut cursor: Vec<u64> = indptr[..n].to_vec();
    let csc = opts.layout == Layout::Csc;
    let changed = || {
        Error::Invalid(
            "the input changed between the two passes over it (more arcs on the second read); \
             do not modify the source while importing"
                .into(),
        )
    };

    let (hint, unit) = src.size_hint();
    progress.phase("pass 2/2: place arcs", hint, unit);
    src.scan(progress, &mut |batch| {
        cancel.check()?;
        for &(s, d) in batch {
            if s == d && opts.drop_self_loops {
                continue;
            }
            if s.max(d) >= n as u64 {
                return Err(changed());
            }
            let (row, col) = if csc { (d, s) } else { (s, d) };
            let c = &mut cursor[row as usize];
            if *c >= indptr[row as usize + 1] {
                return Err(changed());
            }
            idx[*c as usize] = I::from_u64(col);
            *c += 1;
            if opts.symmetrize && s != d {
                let c = &mut cursor[col as usize];
                if *c >= indptr[col as usize + 1] {
                    return Err(changed());
                }
                idx[*c as usize] = I::from_u64(row);
                *c += 1;
            }
        }
        Ok(())
    })?;
    progress.finish_phase();
    if cursor.iter().zip(&indptr[1..]).any(|(c, end)| c != end) {
        return Err(Error::Invalid(
            "the input changed between the two passes over it (fewer arcs on the second read)"
                .into(),
        ));
    }
    drop(cursor);

    // Sort each row (canonical order, better locality) and drop repeats if asked.
    progress.phase("sort rows", n as u64, "rows");
    let new_lens = sort_rows(&mut idx, &indptr, opts.dedup, progress);
    progress.finish_phase();

    // Compact rows left to close the gaps that deduplication opened.
    let mut write = 0u64;
    let mut new_indptr = Vec::with_capacity(n + 1);
    new_indptr.push(0u64);
    for v in 0..n {
        let (start, len) = (indptr[v], new_lens[v]);
        if start != write {
            idx.copy_within(start as usize..(start + len) as usize, write as usize);
        }
        write += len;
        new_indptr.push(write);
    }
    stats.duplicates_dropped = total - write;
    stats.num_arcs = write;
    let ids_path = writer.dir().join(ids_file);
    idx.finish(&ids_path)?;
    if write != total {
        writer.truncate::<I>(ids_file, write)?;
    }
    if write >= 1 << 32 {
        writer.write_array(files::INDPTR64, &new_indptr)?;
    } else {
        let narrow: Vec<u32> = new_indptr.iter().map(|&x| x as u32).collect();
        writer.write_array(files::INDPTR, &narrow)?;
    }
    Ok(())
}

/// Sorts every row in place (deduplicating if `dedup`) and returns the new row lengths.
fn sort_rows<I: VertexId>(
    idx: &mut [I],
    indptr: &[u64],
    dedup: bool,
    progress: &dyn Progress,
) -> Vec<u64> {
    const BLOCK: usize = 1 << 14;
    let n = indptr.len() - 1;
    // Split the indices into per-block slices (few: n / BLOCK) so blocks sort in parallel.
    let mut blocks: Vec<(usize, &mut [I])> = Vec::with_capacity(n / BLOCK + 1);
    let mut rest = idx;
    let mut v0 = 0;
    while v0 < n {
        let v1 = (v0 + BLOCK).min(n);
        let len = (indptr[v1] - indptr[v0]) as usize;
        let (head, tail) = rest.split_at_mut(len);
        blocks.push((v0, head));
        rest = tail;
        v0 = v1;
    }
    let lens: Vec<Vec<u64>> = blocks
        .into_par_iter()
        .map(|(v0, slice)| {
            let v1 = (v0 + BLOCK).min(n);
            let base = indptr[v0];
            let mut out = Vec::with_capacity(v1 - v0);
            for v in v0..v1 {
                let row = &mut slice[(indptr[v] - base) as usize..(indptr[v + 1] - base) as usize];
                row.sort_unstable();
                let len = if dedup { dedup_sorted(row) } else { row.len() };
                out.push(len as u64);
            }
            progress.advance((v1 - v0) as u64);
            out
        })
        .collect();
    lens.into_iter().flatten().collect()
}

/// Moves the distinct values of a sorted slice to its front and returns how many there are.
fn dedup_sorted<T: PartialEq + Copy>(row: &mut [T]) -> usize {
    if row.is_empty() {
        return 0;
    }
    let mut w = 1;
    for r in 1..row.len() {
        if row[r] != row[w - 1] {
            row[w] = row[r];
            w += 1;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Meta;
    use crate::progress::NoProgress;

    fn build(arcs: &[(u64, u64)], opts: BuildOptions) -> (crate::Dataset, BuildStats) {
        let mut w = DatasetWriter::temporary().unwrap();
        let stats = build_topology(&mut SliceArcs(arcs), &opts, &mut w, &NoProgress).unwrap();
        let meta = Meta {
            num_node: stats.num_nodes,
            num_edge: stats.num_arcs,
            layout: opts.layout,
            ..Meta::default()
        };
        (w.finish(meta, &NoProgress).unwrap(), stats)
    }

    fn rows(ds: &crate::Dataset) -> Vec<Vec<u64>> {
        (0..ds.num_nodes())
            .map(|v| ds.topology.row(v).iter().collect())
            .collect()
    }

    const ARCS: &[(u64, u64)] = &[(0, 1), (2, 1), (0, 1), (3, 3), (1, 2), (0, 2)];

    #[test]
    fn csc_rows_list_in_neighbours_sorted() {
        let (ds, st) = build(ARCS, BuildOptions::default());
        assert_eq!(rows(&ds), vec![vec![], vec![0, 0, 2], vec![0, 1], vec![3]]);
        assert_eq!(st.num_arcs, 6);
        assert_eq!(ds.topology.in_degrees(), vec![0, 3, 2, 1]);
        assert_eq!(ds.topology.out_degrees(), vec![3, 1, 1, 1]);
        assert_eq!(ds.topology.max_row_length(), 3);
    }

    #[test]
    fn csr_symmetrise_dedup_and_drop_loops() {
        let opts = BuildOptions {
            layout: Layout::Csr,
            symmetrize: true,
            drop_self_loops: true,
            dedup: true,
            num_nodes: Some(5),
        };
        let (ds, st) = build(ARCS, opts);
        assert_eq!(
            rows(&ds),
            vec![vec![1, 2], vec![0, 2], vec![0, 1], vec![], vec![]]
        );
        assert_eq!(st.self_loops_dropped, 1);
        assert_eq!(st.reverse_arcs_added, 5);
        assert_eq!(st.duplicates_dropped, 4);
        assert_eq!(st.num_arcs, 6);
        assert_eq!(ds.topology.in_degrees(), ds.topology.out_degrees());
        assert_eq!(ds.topology.max_row_length(), 2);
    }

    #[test]
    fn out_of_range_id_is_an_error() {
        let mut w = DatasetWriter::temporary().unwrap();
        let opts = BuildOptions {
            num_nodes: Some(3),
            ..Default::default()
        };
        let e = build_topology(&mut SliceArcs(ARCS), &opts, &mut w, &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("arc 4 (3 -> 3): vertex id 3 is out of range"),
            "{e}"
        );
    }

    #[test]
    fn random_graph_matches_naive_adjacency() {
        let mut r = fanout_rand::Rng::new(11);
        let arcs: Vec<(u64, u64)> = (0..50_000)
            .map(|_| (r.below(3000), r.below(3000)))
            .collect();
        let opts = BuildOptions {
            dedup: true,
            symmetrize: true,
            ..Default::default()
        };
        let (ds, _) = build(&arcs, opts);
        let mut naive = vec![std::collections::BTreeSet::new(); ds.num_nodes() as usize];
        for &(s, d) in &arcs {
            naive[d as usize].insert(s);
            naive[s as usize].insert(d);
        }
        let naive: Vec<Vec<u64>> = naive.into_iter().map(|s| s.into_iter().collect()).collect();
        assert_eq!(rows(&ds), naive);
    }

    #[test]
    fn dropped_self_loops_still_count_their_vertex() {
        let opts = BuildOptions {
            drop_self_loops: true,
            ..Default::default()
        };
        let (ds, st) = build(&[(0, 1), (3, 3)], opts);
        assert_eq!(rows(&ds), vec![vec![], vec![0], vec![], vec![]]);
        assert_eq!((st.num_nodes, st.self_loops_dropped), (4, 1));
    }

    #[test]
    fn empty_source_gives_empty_graph() {
        let (ds, st) = build(&[], BuildOptions::default());
        assert_eq!((ds.num_nodes(), st.num_arcs), (0, 0));
    }
}
