//! The `npy` importer: a directory of `.npy` arrays (GUIDE section 2), payloads memory-mapped.

use crate::edgelist::IdLimit;
use crate::npy::{shape_str, NpyArray};
use crate::vertex::{
    bad_feature, check_num_nodes, finish_split, max_vertices, num_classes, refuse_random,
    too_large_id, write_splits, FeatElem, VertexData,
};
use crate::{ImportOptions, Imported};
use fanout_graph::{
    build_topology, f16, files, ArcSink, ArcSource, DatasetWriter, Error, FeatDtype, Progress,
    Result,
};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

const EDGES: &str = "edge_index.npy";
const FEAT: &str = "node_feat.npy";
const LABEL: &str = "node_label.npy";
const SPLITS: [&str; 3] = ["train_idx.npy", "valid_idx.npy", "test_idx.npy"];
const LAYOUT: &str = "the npy format expects a directory holding edge_index.npy (int64 or int32 [2, E]) and optional node_feat.npy (float32 [N, F]), node_label.npy (int64 [N]), train_idx.npy, valid_idx.npy, test_idx.npy";
/// Arcs converted per batch.
const ARC_BATCH: usize = 1 << 20;
/// Feature rows per parallel task.
const ROWS_PER_TASK: usize = 1024;
/// Largest class id accepted (labels index per-class arrays downstream).
pub(crate) const MAX_CLASS: i64 = i32::MAX as i64;

/// Opens `dir/name` if it exists.
fn open_optional(dir: &Path, name: &str) -> Result<Option<NpyArray>> {
    let p = dir.join(name);
    if p.try_exists().unwrap_or(false) {
        NpyArray::open(&p).map(Some)
    } else {
        Ok(None)
    }
}

fn shape_error(a: &NpyArray, expected: &str) -> Error {
    Error::format(
        a.path(),
        format!("expected {expected}, found {}", a.describe()),
    )
}

/// Checks `edge_index.npy`: integers, shape [2, E] with E > 0.
fn check_edges(a: &NpyArray) -> Result<()> {
    if a.dtype.is_float() {
        return Err(shape_error(
            a,
            "an int64 or int32 array [2, E] of (src, dst) ids",
        ));
    }
    match a.shape[..] {
        [2, 0] => Err(Error::format(
            a.path(),
            "has no edges (shape (2, 0)); a graph needs at least one arc",
        )),
        [2, _] => Ok(()),
        [e, 2] => Err(Error::format(
            a.path(),
            format!(
                "expected shape (2, E) (a row of sources, a row of destinations), found (E, 2) = {}; save the transpose (edge_index.T)",
                shape_str(&[e, 2])
            ),
        )),
        _ => Err(shape_error(a, "an int64 or int32 array of shape (2, E)")),
    }
}

/// `edge_index.npy` as a two-pass arc source; ids are checked against `limit` (or, with no
/// known vertex count, against what memory can build).
struct NpyArcs<'a> {
    a: &'a NpyArray,
    limit: Option<IdLimit>,
}

impl ArcSource for NpyArcs<'_> {
    fn scan(&mut self, progress: &dyn Progress, sink: &mut ArcSink<'_>) -> Result<()> {
        let e = self.a.shape[1] as usize;
        let bound = self.limit.as_ref().map_or(max_vertices(), |l| l.n);
        let ok = |x: i64| x >= 0 && (x as u64) < bound;
        let mut s = vec![0i64; ARC_BATCH.min(e)];
        let mut d = vec![0i64; ARC_BATCH.min(e)];
        let mut pairs = Vec::new();
        for b0 in (0..e).step_by(ARC_BATCH) {
            let len = ARC_BATCH.min(e - b0);
            let (s, d) = (&mut s[..len], &mut d[..len]);
            if self.a.fortran_order {
                // Column-major [2, E]: (src, dst) pairs side by side.
                pairs.resize(2 * len, 0);
                self.a.read_i64(2 * b0, &mut pairs);
                for k in 0..len {
                    (s[k], d[k]) = (pairs[2 * k], pairs[2 * k + 1]);
                }
            } else {
                self.a.read_i64(b0, s);
                self.a.read_i64(e + b0, d);
            }
            if let Some(k) = (0..len)
                .into_par_iter()
                .position_first(|k| !ok(s[k]) || !ok(d[k]))
            {
                let (row, x) = if ok(s[k]) { (1, d[k]) } else { (0, s[k]) };
                return Err(self.bad_id(b0 + k, row, x));
            }
            let arcs: Vec<(u64, u64)> = s
                .par_iter()
                .zip(d.par_iter())
                .map(|(&s, &d)| (s as u64, d as u64))
                .collect();
            sink(&arcs)?;
            progress.advance(len as u64);
        }
        Ok(())
    }

    fn size_hint(&self) -> (u64, &'static str) {
        (self.a.shape[1], "arcs")
    }
}

impl NpyArcs<'_> {
    fn bad_id(&self, col: usize, row: usize, x: i64) -> Error {
        let end = if row == 0 { "source" } else { "destination" };
        let detail = match &self.limit {
            _ if x < 0 => "is negative; vertex ids are 0, 1, ...".to_string(),
            Some(l) => format!("is out of range; expected < {} ({})", l.n, l.origin),
            None => too_large_id(x as u64),
        };
        Error::format(
            self.a.path(),
            format!("entry [{row}, {col}] ({end} of edge {col}) = {x} {detail}"),
        )
    }
}

/// Imports the `.npy` directory `src`.
pub(crate) fn import(
    src: &Path,
    writer: &mut DatasetWriter,
    opts: &ImportOptions,
    progress: &dyn Progress,
) -> Result<Imported> {
    if !src.is_dir() {
        return Err(Error::format(src, format!("is not a directory; {LAYOUT}")));
    }
    let edge_path = src.join(EDGES);
    if !edge_path.try_exists().unwrap_or(false) {
        return Err(Error::format(&edge_path, format!("missing; {LAYOUT}")));
    }
    // Open and check every header first, so that a bad file fails before any real work.
    let edges = NpyArray::open(&edge_path)?;
    check_edges(&edges)?;
    let feat = open_optional(src, FEAT)?;
    if let Some(f) = &feat {
        if f.shape.len() != 2 {
            return Err(shape_error(f, "a float32 array of shape (N, F)"));
        }
    }
    let label = open_optional(src, LABEL)?;
    if let Some(l) = &label {
        if !matches!(l.shape[..], [_] | [_, 1]) {
            return Err(shape_error(l, "an int64 array of shape (N,) or (N, 1)"));
        }
    }
    let mut splits: [Option<NpyArray>; 3] = [None, None, None];
    for (slot, name) in splits.iter_mut().zip(SPLITS) {
        *slot = open_optional(src, name)?;
        if let Some(a) = slot {
            if a.dtype.is_float() || a.shape.len() != 1 {
                return Err(shape_error(a, "a 1-D int64 or int32 array of vertex ids"));
            }
        }
    }
    if opts.random.is_some() {
        let present = [(&feat, "node features"), (&label, "labels")]
            .into_iter()
            .chain(splits.iter().map(|s| (s, "a split")))
            .find_map(|(a, what)| a.as_ref().map(|a| (a.path().to_path_buf(), what)));
        if let Some((p, what)) = present {
            return Err(refuse_random(&p, what));
        }
    }

    // The vertex count: rows of node_feat, else entries of node_label, else from the edges.
    let n_feat = feat
        .as_ref()
        .map(|f| (f.shape[0], format!("the rows of {FEAT}")));
    let n_label = label
        .as_ref()
        .map(|l| (l.shape[0], format!("the length of {LABEL}")));
    if let (Some((nf, _)), Some((nl, _)), Some(l)) = (&n_feat, &n_label, &label) {
        if nf != nl {
            return Err(Error::format(
                l.path(),
                format!("has {nl} labels but {FEAT} has {nf} rows; both need one per vertex"),
            ));
        }
    }
    let known = n_feat.or(n_label);
    if let (Some(n), Some((m, origin))) = (opts.build.num_nodes, &known) {
        if n != *m {
            return Err(Error::Invalid(format!(
                "--num-nodes {n} disagrees with {origin} ({m}) in {}",
                src.display()
            )));
        }
    }
    let limit = known
        .or(opts.build.num_nodes.map(|n| (n, "--num-nodes".to_string())))
        .map(|(n, origin)| IdLimit { n, origin });
    if let Some(l) = &limit {
        check_num_nodes(l.n, &l.origin)?;
    }
    let mut build = opts.build.clone();
    build.num_nodes = limit.as_ref().map(|l| l.n);
    let input_bytes = [Some(&edges), feat.as_ref(), label.as_ref()]
        .into_iter()
        .chain(splits.iter().map(Option::as_ref))
        .flatten()
        .filter_map(|a| std::fs::metadata(a.path()).ok())
        .map(|m| m.len())
        .sum();

    let stats = build_topology(&mut NpyArcs { a: &edges, limit }, &build, writer, progress)?;
    let n = stats.num_nodes;

    let mut vertex = VertexData::default();
    if let Some(f) = &feat {
        vertex.feat_dim = match opts.feat_dtype {
            FeatDtype::F32 => write_features::<f32>(writer, f, FeatDtype::F32, progress)?,
            FeatDtype::F16 => write_features::<f16>(writer, f, FeatDtype::F16, progress)?,
        };
    }
    if let Some(l) = &label {
        let labels = read_labels(l)?;
        vertex.num_classes = num_classes(&labels);
        writer.write_array(files::LABEL, &labels)?;
    }
    let mut ids: [Vec<u32>; 3] = Default::default();
    for (out, a) in ids.iter_mut().zip(&splits) {
        if let Some(a) = a {
            *out = read_split(a, n)?;
        }
    }
    vertex.splits = write_splits(writer, ids)?;
    Ok(Imported {
        stats,
        vertex,
        input_bytes,
    })
}

/// Converts `node_feat.npy` (float32, float16 or float64; integer types are converted too) into
/// `feat.bin`; returns the feature dimension (0 writes nothing).
fn write_features<T: FeatElem>(
    writer: &mut DatasetWriter,
    a: &NpyArray,
    dtype: FeatDtype,
    progress: &dyn Progress,
) -> Result<u64> {
    let (n, f) = (a.shape[0] as usize, a.shape[1] as usize);
    if f == 0 {
        return Ok(0);
    }
    let path: PathBuf = writer.dir().join(files::FEAT);
    let mut out = writer.array_mut::<T>(files::FEAT, (n * f) as u64)?;
    progress.phase("node features", n as u64, "rows");
    let bad = out
        .par_chunks_mut(ROWS_PER_TASK * f)
        .enumerate()
        .find_map_first(|(task, chunk)| {
            let mut buf = vec![0f32; f];
            let rows = chunk.len() / f;
            for (k, row) in chunk.chunks_mut(f).enumerate() {
                let r = task * ROWS_PER_TASK + k;
                if a.fortran_order {
                    for (j, x) in buf.iter_mut().enumerate() {
                        a.read_f32(a.index2(r, j), std::slice::from_mut(x));
                    }
                } else {
                    a.read_f32(r * f, &mut buf);
                }
                for (j, (o, &x)) in row.iter_mut().zip(&buf).enumerate() {
                    match T::store(x) {
                        Some(y) => *o = y,
                        None => return Some((r, j, x)),
                    }
                }
            }
            progress.advance(rows as u64);
            None
        });
    progress.finish_phase();
    if let Some((r, j, x)) = bad {
        return Err(Error::format(
            a.path(),
            format!("row {r}, column {j}: {}", bad_feature(x, dtype)),
        ));
    }
    out.finish(&path)?;
    Ok(f as u64)
}

/// Reads and checks `node_label.npy` (integers, or integral floats with NaN for "none").
fn read_labels(a: &NpyArray) -> Result<Vec<i64>> {
    let n = a.len();
    let mut labels = vec![0i64; n];
    if a.dtype.is_float() {
        let mut v = vec![0f64; n];
        a.read_f64(0, &mut v);
        for (i, (&x, l)) in v.iter().zip(labels.iter_mut()).enumerate() {
            *l = if x.is_nan() {
                -1
            } else if x.fract() == 0.0 && x >= -1.0 && x <= MAX_CLASS as f64 {
                x as i64
            } else {
                return Err(Error::format(
                    a.path(),
                    format!("entry {i} = {x}; expected an integral class id in 0..={MAX_CLASS}, or -1 or NaN for none"),
                ));
            };
        }
    } else {
        a.read_i64(0, &mut labels);
        if let Some(i) = labels.iter().position(|&l| !(-1..=MAX_CLASS).contains(&l)) {
            return Err(Error::format(
                a.path(),
                format!(
                    "entry {i} = {}; expected -1 (unlabelled) or a class id in 0..={MAX_CLASS}",
                    labels[i]
                ),
            ));
        }
    }
    Ok(labels)
}

/// Reads and checks a split file against `n` vertices.
fn read_split(a: &NpyArray, n: u64) -> Result<Vec<u32>> {
    let mut v = vec![0i64; a.len()];
    a.read_i64(0, &mut v);
    if let Some(i) = v.iter().position(|&x| x < 0) {
        return Err(Error::format(
            a.path(),
            format!("entry {i}: vertex id {} is negative", v[i]),
        ));
    }
    let ids: Vec<u64> = v.into_iter().map(|x| x as u64).collect();
    finish_split(a.path(), &ids, n, &|i| format!("entry {i}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npy::{write_npy, write_npy_fortran};
    use crate::testutil::{import_err, import_ok, rows};
    use crate::{Format, RandomFeatures};
    use fanout_graph::{verify, BuildOptions, FeatData, NoProgress};

    const CORA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/datasets/cora");
    const CNR2000: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/datasets/cnr2000"
    );

    /// A 4-vertex graph with 3-dim features, labels and splits.
    fn small(dir: &Path) {
        write_npy(
            &dir.join(EDGES),
            &[2, 5],
            &[0i64, 2, 0, 3, 1, 1, 1, 1, 2, 0],
        )
        .unwrap();
        let feat: Vec<f32> = (0..12).map(|x| x as f32 * 0.5).collect();
        write_npy(&dir.join(FEAT), &[4, 3], &feat).unwrap();
        write_npy(&dir.join(LABEL), &[4], &[1i64, -1, 0, 2]).unwrap();
        write_npy(&dir.join(SPLITS[0]), &[2], &[0i64, 3]).unwrap();
        write_npy(&dir.join(SPLITS[1]), &[1], &[2i32]).unwrap();
        write_npy(&dir.join(SPLITS[2]), &[1], &[1i64]).unwrap();
    }

    fn opts() -> ImportOptions {
        ImportOptions::default()
    }

    #[test]
    fn small_directory_imports_exactly() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir(&src).unwrap();
        small(&src);
        let (ds, s) = import_ok(Format::Npy, &src, &d.path().join("out"), &opts());
        // Arcs 0->1, 2->1, 0->1, 3->2, 1->0 in CSC: rows list in-neighbours.
        assert_eq!(rows(&ds), vec![vec![1], vec![0, 0, 2], vec![3], vec![]]);
        assert_eq!(
            (s.num_nodes, s.num_arcs, s.feat_dim, s.num_classes),
            (4, 5, 3, 3)
        );
        assert_eq!((s.train, s.valid, s.test), (2, 1, 1));
        assert_eq!(&ds.labels.as_ref().unwrap()[..], &[1, -1, 0, 2]);
        assert_eq!(
            (&ds.train[..], &ds.valid[..], &ds.test[..]),
            (&[0u32, 3][..], &[2u32][..], &[1u32][..])
        );
        let mut row = [0f32; 3];
        ds.features.as_ref().unwrap().copy_row(2, &mut row);
        assert_eq!(row, [3.0, 3.5, 4.0]);
    }

    #[test]
    fn fortran_order_int32_and_other_dtypes_give_the_same_dataset() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        small(&a);
        small(&b);
        // Column-major int32 edges, float64 Fortran features, [N, 1] int32 labels.
        write_npy_fortran(&b.join(EDGES), &[2, 5], &[0i32, 1, 2, 1, 0, 1, 3, 2, 1, 0]).unwrap();
        let f: Vec<f64> = (0..3)
            .flat_map(|c| (0..4).map(move |r| (r * 3 + c) as f64 * 0.5))
            .collect();
        write_npy_fortran(&b.join(FEAT), &[4, 3], &f).unwrap();
        write_npy(&b.join(LABEL), &[4, 1], &[1i32, -1, 0, 2]).unwrap();
        let (da, _) = import_ok(Format::Npy, &a, &d.path().join("oa"), &opts());
        let (db, _) = import_ok(Format::Npy, &b, &d.path().join("ob"), &opts());
        assert_eq!(da.meta.checksums, db.meta.checksums);
        // float16 features and NaN-for-none float labels.
        let h: Vec<f16> = (0..12).map(|x| f16::from_f32(x as f32 * 0.5)).collect();
        write_npy(&b.join(FEAT), &[4, 3], &h).unwrap();
        write_npy(&b.join(LABEL), &[4], &[1.0f32, f32::NAN, 0.0, 2.0]).unwrap();
        let (dc, _) = import_ok(Format::Npy, &b, &d.path().join("oc"), &opts());
        assert_eq!(da.meta.checksums, dc.meta.checksums);
    }

    #[test]
    fn f16_features_are_stored_as_f16() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir(&src).unwrap();
        small(&src);
        let o = ImportOptions {
            feat_dtype: FeatDtype::F16,
            ..opts()
        };
        let (ds, _) = import_ok(Format::Npy, &src, &d.path().join("out"), &o);
        assert_eq!(ds.meta.feat_dtype, FeatDtype::F16);
        let f = ds.features.as_ref().unwrap();
        assert!(matches!(f.data, FeatData::F16(_)));
        assert_eq!(
            std::fs::metadata(d.path().join("out/feat.bin"))
                .unwrap()
                .len(),
            4 * 3 * 2
        );
        let mut row = [0f32; 3];
        f.copy_row(3, &mut row);
        assert_eq!(row, [4.5, 5.0, 5.5]);
        // A value beyond the f16 range is refused, naming the entry.
        let mut feat: Vec<f32> = vec![0.0; 12];
        feat[7] = 1e6;
        write_npy(&src.join(FEAT), &[4, 3], &feat).unwrap();
        let e = import_err(Format::Npy, &src, &d.path().join("o2"), &o);
        assert!(
            e.contains("node_feat.npy: row 2, column 1: value 1000000 does not fit in f16"),
            "{e}"
        );
        feat[7] = f32::NAN;
        write_npy(&src.join(FEAT), &[4, 3], &feat).unwrap();
        let e = import_err(Format::Npy, &src, &d.path().join("o2"), &opts());
        assert!(
            e.contains("row 2, column 1: value NaN; features must be finite"),
            "{e}"
        );
    }

    #[test]
    fn topology_only_and_num_nodes() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir(&src).unwrap();
        write_npy(&src.join(EDGES), &[2, 2], &[0i64, 4, 1, 1]).unwrap();
        let (ds, s) = import_ok(Format::Npy, &src, &d.path().join("o1"), &opts());
        assert_eq!(
            (s.num_nodes, s.feat_dim, s.num_classes, s.train),
            (5, 0, 0, 0)
        );
        assert!(ds.features.is_none() && ds.labels.is_none());
        let o = ImportOptions {
            build: BuildOptions {
                num_nodes: Some(7),
                symmetrize: true,
                ..Default::default()
            },
            ..opts()
        };
        let (ds, _) = import_ok(Format::Npy, &src, &d.path().join("o2"), &o);
        assert_eq!(
            rows(&ds),
            vec![vec![1], vec![0, 4], vec![], vec![], vec![1], vec![], vec![]]
        );
        let o = ImportOptions {
            build: BuildOptions {
                num_nodes: Some(3),
                ..Default::default()
            },
            ..opts()
        };
        let e = import_err(Format::Npy, &src, &d.path().join("o3"), &o);
        assert!(
            e.contains("edge_index.npy: entry [0, 1] (source of edge 1) = 4 is out of range; expected < 3 (--num-nodes)"),
            "{e}"
        );
    }

    #[test]
    fn bad_inputs_name_the_file_and_entry() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        let out = d.path().join("out");
        std::fs::create_dir(&src).unwrap();
        let e = import_err(Format::Npy, &src, &out, &opts());
        assert!(
            e.contains("edge_index.npy: missing; the npy format expects"),
            "{e}"
        );
        let e = import_err(Format::Npy, &src.join("x"), &out, &opts());
        assert!(e.contains("no such file or directory"), "{e}");

        type Case = (&'static str, Box<dyn Fn(&Path)>, &'static str);
        let cases: Vec<Case> = vec![
            (EDGES, Box::new(|p| write_npy(p, &[2, 2], &[0.5f32, 1.0, 2.0, 0.0]).unwrap()), "expected an int64 or int32 array [2, E]"),
            (EDGES, Box::new(|p| write_npy(p, &[3, 3], &[0i64; 9]).unwrap()), "expected an int64 or int32 array of shape (2, E), found int64 (3, 3)"),
            (EDGES, Box::new(|p| write_npy(p, &[5, 2], &[0i64; 10]).unwrap()), "save the transpose"),
            (EDGES, Box::new(|p| write_npy(p, &[2, 0], &[0i64; 0]).unwrap()), "has no edges"),
            (EDGES, Box::new(|p| write_npy(p, &[2, 3], &[0i64, 1, 2, 1, -2, 0]).unwrap()), "entry [1, 1] (destination of edge 1) = -2 is negative"),
            (EDGES, Box::new(|p| write_npy(p, &[2, 3], &[0i64, 1, 9, 1, 2, 0]).unwrap()), "entry [0, 2] (source of edge 2) = 9 is out of range; expected < 4 (the rows of node_feat.npy)"),
            (EDGES, Box::new(|p| write_npy(p, &[2, 1], &[0i64, 1_000_000_000_000_000]).unwrap()), "out of range"),
            (EDGES, Box::new(|p| {
                write_npy(p, &[2, 3], &[0i64; 6]).unwrap();
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() - 3]).unwrap();
            }), "edge_index.npy: file has"),
            (FEAT, Box::new(|p| write_npy(p, &[12], &[0f32; 12]).unwrap()), "node_feat.npy: expected a float32 array of shape (N, F)"),
            (FEAT, Box::new(|p| write_npy(p, &[5, 3], &[0f32; 15]).unwrap()), "node_label.npy: has 4 labels but node_feat.npy has 5 rows"),
            (LABEL, Box::new(|p| write_npy(p, &[4, 2], &[0i64; 8]).unwrap()), "node_label.npy: expected an int64 array of shape (N,) or (N, 1)"),
            (LABEL, Box::new(|p| write_npy(p, &[4], &[0i64, 1, -3, 0]).unwrap()), "node_label.npy: entry 2 = -3; expected -1 (unlabelled)"),
            (LABEL, Box::new(|p| write_npy(p, &[4], &[0f32, 1.5, 0.0, 0.0]).unwrap()), "node_label.npy: entry 1 = 1.5; expected an integral class id"),
            (SPLITS[0], Box::new(|p| write_npy(p, &[2], &[0i64, 4]).unwrap()), "train_idx.npy: entry 1: vertex id 4 is out of range; expected < 4"),
            (SPLITS[1], Box::new(|p| write_npy(p, &[3], &[1i64, 2, 1]).unwrap()), "valid_idx.npy: entry 2: vertex 1 appears twice (also at entry 0)"),
            (SPLITS[2], Box::new(|p| write_npy(p, &[1], &[-1i32]).unwrap()), "test_idx.npy: entry 0: vertex id -1 is negative"),
            (SPLITS[2], Box::new(|p| write_npy(p, &[2, 1], &[1i64, 2]).unwrap()), "test_idx.npy: expected a 1-D int64 or int32 array"),
            (SPLITS[2], Box::new(|p| std::fs::write(p, b"not numpy at all").unwrap()), "test_idx.npy: not a .npy file"),
        ];
        for (file, damage, want) in cases {
            small(&src);
            damage(&src.join(file));
            let e = import_err(Format::Npy, &src, &out, &opts());
            assert!(e.contains(want), "{file}: {e}\nexpected: {want}");
        }
    }

    #[test]
    fn random_features_are_sized_deterministic_and_refused_over_real_data() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let edges: Vec<i64> = (0..200)
            .map(|i| i % 100)
            .chain((0..200).map(|i| (i * 7 + 1) % 100))
            .collect();
        write_npy(&src.join(EDGES), &[2, 200], &edges).unwrap();
        let r = RandomFeatures {
            dim: 8,
            classes: 5,
            train_frac: 0.5,
            valid_frac: 0.2,
            test_frac: 0.1,
            seed: 3,
            signal: 1.0,
        };
        let o = |seed| ImportOptions {
            random: Some(RandomFeatures { seed, ..r.clone() }),
            ..opts()
        };
        let (a, s) = import_ok(Format::Npy, &src, &d.path().join("a"), &o(3));
        assert!(s.random_features);
        assert_eq!((s.num_nodes, s.feat_dim, s.num_classes), (100, 8, 5));
        assert_eq!((s.train, s.valid, s.test), (50, 20, 10));
        assert_eq!(a.features.as_ref().unwrap().num_rows(), 100);
        assert!(a
            .labels
            .as_ref()
            .unwrap()
            .iter()
            .all(|&l| (0..5).contains(&l)));
        let (b, _) = import_ok(Format::Npy, &src, &d.path().join("b"), &o(3));
        let (c, _) = import_ok(Format::Npy, &src, &d.path().join("c"), &o(4));
        assert_eq!(a.meta.checksums, b.meta.checksums);
        assert_ne!(a.meta.checksums["feat.bin"], c.meta.checksums["feat.bin"]);
        assert_ne!(
            a.meta.checksums["train_set.bin"],
            c.meta.checksums["train_set.bin"]
        );
        // f16 generated features.
        let o16 = ImportOptions {
            feat_dtype: FeatDtype::F16,
            ..o(3)
        };
        let (h, _) = import_ok(Format::Npy, &src, &d.path().join("h"), &o16);
        assert_eq!(h.meta.feat_dtype, FeatDtype::F16);
        // Bad parameters fail before any work; real vertex data is never overwritten.
        let bad = ImportOptions {
            random: Some(RandomFeatures {
                classes: 0,
                ..r.clone()
            }),
            ..opts()
        };
        assert!(import_err(Format::Npy, &src, &d.path().join("x"), &bad)
            .contains("0 classes; expected 1 to"));
        let bad = ImportOptions {
            random: Some(RandomFeatures {
                train_frac: 0.9,
                valid_frac: 0.2,
                ..r.clone()
            }),
            ..opts()
        };
        assert!(
            import_err(Format::Npy, &src, &d.path().join("x"), &bad).contains("sum to at most 1")
        );
        write_npy(&src.join(LABEL), &[100], &[0i64; 100]).unwrap();
        let e = import_err(Format::Npy, &src, &d.path().join("x"), &o(3));
        assert!(
            e.contains("random features were requested, but the source already has labels")
                && e.contains("node_label.npy"),
            "{e}"
        );
    }

    #[test]
    fn cora_imports_and_verifies() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("cora");
        let (ds, s) = import_ok(Format::Npy, Path::new(CORA), &out, &opts());
        assert_eq!(
            (s.num_nodes, s.num_arcs, s.feat_dim, s.num_classes),
            (2708, 10556, 1433, 7)
        );
        assert_eq!((s.train, s.valid, s.test), (140, 500, 1000));
        assert_eq!(ds.meta.num_edge, 10556);
        assert!(s.input_bytes > 15_000_000);
        // Cora's arcs are symmetric: in- and out-degrees agree.
        assert_eq!(ds.topology.in_degrees(), ds.topology.out_degrees());
        verify(&out, &NoProgress).unwrap();
        // Importing again over it needs `overwrite`, and then replaces it.
        let e = import_err(Format::Npy, Path::new(CORA), &out, &opts());
        assert!(e.contains("already exists"), "{e}");
        let o = ImportOptions {
            overwrite: true,
            feat_dtype: FeatDtype::F16,
            ..opts()
        };
        let (ds, _) = import_ok(Format::Npy, Path::new(CORA), &out, &o);
        assert_eq!(ds.meta.feat_dtype, FeatDtype::F16);
    }

    /// cnr2000 (325557 vertices, 3216152 arcs, topology only) with generated vertex data.
    #[test]
    fn cnr2000_with_random_features_imports_and_verifies() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("cnr2000");
        let o = ImportOptions {
            random: Some(RandomFeatures {
                dim: 32,
                classes: 16,
                train_frac: 0.01,
                valid_frac: 0.01,
                test_frac: 0.02,
                seed: 1,
                signal: 1.0,
            }),
            ..opts()
        };
        let t = std::time::Instant::now();
        let (ds, s) = import_ok(Format::Npy, Path::new(CNR2000), &out, &o);
        eprintln!(
            "cnr2000: import {:.2} s (import + verify {:.2} s)",
            s.seconds,
            t.elapsed().as_secs_f64()
        );
        assert_eq!(
            (s.num_nodes, s.num_arcs, s.build.input_arcs),
            (325_557, 3_216_152, 3_216_152)
        );
        assert_eq!((s.feat_dim, s.num_classes, s.train), (32, 16, 3256));
        assert_eq!(ds.features.as_ref().unwrap().num_rows(), 325_557);
    }
}
