//! Renaming the vertices of a dataset: every file rewritten under a permutation of the ids.
//! GSplit's offline step uses it to give each part of a graph partition a contiguous id range
//! (`fanout dataset partition --method metis`), so that "which worker owns vertex v" is a
//! comparison against the part boundaries.
//!
//! Vertex `v` of the source becomes `new_of_old[v]`: its stored row moves to position
//! `new_of_old[v]` with every neighbour renamed (rows sorted by id, as every fanout writer
//! stores them), its feature row and label move with it, and split entries are renamed in
//! place (their order kept). `old_to_new.bin` (one u32 per source vertex) records the map so
//! predictions can be mapped back. `weight.bin` is not carried (rewrite it with `fanout
//! dataset weights`).

use crate::build::{build_topology, ArcSink, ArcSource, BuildOptions};
use crate::dataset::{files, Dataset, FeatData};
use crate::error::{Error, Result};
use crate::meta::Meta;
use crate::progress::Progress;
use crate::writer::DatasetWriter;
use rayon::prelude::*;

/// The file holding the map: entry `v` is the new id of source vertex `v` (u32).
pub const OLD_TO_NEW: &str = "old_to_new.bin";

/// Checks that `new_of_old` is a permutation of `0..n`; the error names the first repeat.
pub fn check_permutation(new_of_old: &[u32], n: u64) -> Result<()> {
    if new_of_old.len() as u64 != n {
        return Err(Error::Invalid(format!(
            "relabel: {} new ids for {n} vertices",
            new_of_old.len()
        )));
    }
    let mut seen = vec![u32::MAX; new_of_old.len()];
    for (v, &w) in new_of_old.iter().enumerate() {
        let slot = seen.get_mut(w as usize).ok_or_else(|| {
            Error::Invalid(format!(
                "relabel: vertex {v} is renamed {w}; expected an id < {n}"
            ))
        })?;
        if *slot != u32::MAX {
            return Err(Error::Invalid(format!(
                "relabel: vertices {} and {v} are both renamed {w}",
                *slot
            )));
        }
        *slot = v as u32;
    }
    Ok(())
}

/// The source's stored arcs, renamed, in the source's orientation.
struct RenamedArcs<'a> {
    ds: &'a Dataset,
    new_of_old: &'a [u32],
}

impl ArcSource for RenamedArcs<'_> {
    fn scan(&mut self, progress: &dyn Progress, sink: &mut ArcSink<'_>) -> Result<()> {
        let t = &self.ds.topology;
        let csc = t.layout == crate::meta::Layout::Csc;
        let mut batch = Vec::with_capacity(1 << 16);
        for v in 0..t.num_nodes() {
            let nv = self.new_of_old[v as usize] as u64;
            for u in t.row(v).iter() {
                let nu = self.new_of_old[u as usize] as u64;
                // CSC row v lists the sources of arcs into v; CSR row v the targets out of v.
                batch.push(if csc { (nu, nv) } else { (nv, nu) });
            }
            if batch.len() >= 1 << 16 {
                sink(&batch)?;
                progress.advance(batch.len() as u64);
                batch.clear();
            }
        }
        sink(&batch)?;
        progress.advance(batch.len() as u64);
        Ok(())
    }
    fn size_hint(&self) -> (u64, &'static str) {
        (self.ds.topology.num_arcs(), "arcs")
    }
}

/// Writes `ds` renamed by `new_of_old` (a permutation, checked) into `writer`: topology,
/// features, labels, splits and [`OLD_TO_NEW`]. Returns the meta.txt to pass to
/// [`DatasetWriter::finish`] once the caller has added its own files.
pub fn relabel_into(
    ds: &Dataset,
    new_of_old: &[u32],
    writer: &mut DatasetWriter,
    progress: &dyn Progress,
) -> Result<Meta> {
    let n = ds.num_nodes();
    check_permutation(new_of_old, n)?;
    let opts = BuildOptions {
        layout: ds.topology.layout,
        num_nodes: Some(n),
        ..BuildOptions::default()
    };
    let stats = build_topology(&mut RenamedArcs { ds, new_of_old }, &opts, writer, progress)?;
    debug_assert_eq!(stats.num_arcs, ds.topology.num_arcs());
    writer.cancel().check()?;
    let mut old_of_new = vec![0u32; new_of_old.len()];
    for (v, &w) in new_of_old.iter().enumerate() {
        old_of_new[w as usize] = v as u32;
    }
    if let Some(f) = &ds.features {
        let d = f.dim;
        progress.phase("features", n, "rows");
        match &f.data {
            FeatData::F32(a) => permute_rows(writer, files::FEAT, &a[..], d, &old_of_new)?,
            FeatData::F16(a) => permute_rows(writer, files::FEAT, &a[..], d, &old_of_new)?,
        }
        progress.advance(n);
        progress.finish_phase();
    }
    if let Some(l) = &ds.labels {
        permute_rows(writer, files::LABEL, &l[..], 1, &old_of_new)?;
    }
    for (file, split) in [
        (files::TRAIN, &ds.train),
        (files::VALID, &ds.valid),
        (files::TEST, &ds.test),
    ] {
        if !split.is_empty() {
            let renamed: Vec<u32> = split.iter().map(|&v| new_of_old[v as usize]).collect();
            writer.write_array(file, &renamed)?;
        }
    }
    writer.write_array(OLD_TO_NEW, new_of_old)?;
    writer.cancel().check()?;
    Ok(Meta {
        checksums: Default::default(),
        ..ds.meta.clone()
    })
}

/// Writes `src`'s rows of `d` values to `file`, row `old_of_new[w]` at position `w`.
fn permute_rows<T: crate::array::Pod + Default + Copy + Send + Sync>(
    writer: &mut DatasetWriter,
    file: &str,
    src: &[T],
    d: usize,
    old_of_new: &[u32],
) -> Result<()> {
    let mut out = writer.array_mut::<T>(file, src.len() as u64)?;
    out.par_chunks_mut(d.max(1))
        .zip(old_of_new.par_iter())
        .for_each(|(row, &v)| {
            let v = v as usize;
            row.copy_from_slice(&src[v * d..(v + 1) * d]);
        });
    let path = writer.file_path(file);
    out.finish(&path).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::SliceArcs;
    use crate::progress::NoProgress;

    /// A 5-vertex dataset with features, labels and splits.
    fn small(dir: &std::path::Path) -> Dataset {
        let out = dir.join("src");
        let mut w = DatasetWriter::create(&out, false).unwrap();
        let arcs = [(0, 1), (2, 1), (3, 1), (1, 0), (4, 3), (3, 4), (2, 2)];
        let opts = BuildOptions {
            num_nodes: Some(5),
            ..BuildOptions::default()
        };
        let st = build_topology(&mut SliceArcs(&arcs), &opts, &mut w, &NoProgress).unwrap();
        let feat: Vec<f32> = (0..10).map(|x| x as f32).collect();
        w.write_array(files::FEAT, &feat).unwrap();
        w.write_array::<i64>(files::LABEL, &[0, 1, -1, 2, 1])
            .unwrap();
        w.write_array::<u32>(files::TRAIN, &[4, 0]).unwrap();
        w.write_array::<u32>(files::TEST, &[2]).unwrap();
        let meta = Meta {
            num_node: 5,
            num_edge: st.num_arcs,
            feat_dim: 2,
            num_class: 3,
            num_train_set: 2,
            num_valid_set: 0,
            num_test_set: 1,
            ..Meta::default()
        };
        w.finish(meta, &NoProgress).unwrap()
    }

    #[test]
    fn every_file_follows_its_vertex_and_the_map_is_written() {
        let t = tempfile::tempdir().unwrap();
        let ds = small(t.path());
        let new_of_old = [3u32, 0, 4, 1, 2];
        let out = t.path().join("out");
        let mut w = DatasetWriter::create(&out, false).unwrap();
        let meta = relabel_into(&ds, &new_of_old, &mut w, &NoProgress).unwrap();
        let r = w.finish(meta, &NoProgress).unwrap();
        assert_eq!(r.meta.num_edge, ds.meta.num_edge);
        let old_of_new = [1u64, 3, 4, 0, 2];
        for nv in 0..5u64 {
            let v = old_of_new[nv as usize];
            // The same in-neighbours, renamed, sorted.
            let mut want: Vec<u64> = ds
                .topology
                .row(v)
                .iter()
                .map(|u| new_of_old[u as usize] as u64)
                .collect();
            want.sort();
            assert_eq!(
                r.topology.row(nv).iter().collect::<Vec<_>>(),
                want,
                "row {nv}"
            );
            let (mut a, mut b) = (vec![0.0; 2], vec![0.0; 2]);
            ds.features.as_ref().unwrap().copy_row(v as usize, &mut a);
            r.features.as_ref().unwrap().copy_row(nv as usize, &mut b);
            assert_eq!(a, b);
            assert_eq!(
                r.labels.as_ref().unwrap()[nv as usize],
                ds.labels.as_ref().unwrap()[v as usize]
            );
        }
        assert_eq!(&r.train[..], &[2, 3]);
        assert_eq!(&r.test[..], &[4]);
        assert!(r.valid.is_empty());
        let map = std::fs::read(out.join(OLD_TO_NEW)).unwrap();
        let map: Vec<u32> = map
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(map, new_of_old);
    }

    #[test]
    fn a_map_that_is_not_a_permutation_is_refused_before_writing() {
        let t = tempfile::tempdir().unwrap();
        let ds = small(t.path());
        for (map, want) in [
            (vec![0u32, 1, 2, 3], "4 new ids for 5 vertices"),
            (
                vec![0, 1, 2, 3, 5],
                "vertex 4 is renamed 5; expected an id < 5",
            ),
            (vec![0, 1, 2, 1, 4], "vertices 1 and 3 are both renamed 1"),
        ] {
            let out = t.path().join("bad");
            let mut w = DatasetWriter::create(&out, false).unwrap();
            let e = relabel_into(&ds, &map, &mut w, &NoProgress)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
            // Refused before writing: the writer's staging folder is still empty ...
            let staged = std::fs::read_dir(w.dir()).unwrap().count();
            assert_eq!(staged, 0, "{want}: files written before the check");
            drop(w);
            // ... and dropping the writer leaves neither the output nor its staging folder.
            let left: Vec<_> = std::fs::read_dir(t.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("bad"))
                .collect();
            assert!(left.is_empty(), "{left:?}");
        }
    }
}
