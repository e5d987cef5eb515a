//! `fanout.Dataset`: an opened dataset directory whose arrays are read-only numpy views of the
//! memory-mapped files, and the dataset functions (import, verify).

use crate::convert::{from_py, readonly_view, to_py};
use crate::errors::{check_process, graph, missing_paths, raise, Kind};
use fanout_graph::{
    BuildOptions, Dataset, DatasetInfo, FeatData, FeatDtype, Ids, Layout, NoProgress, Offsets,
};
use fanout_import::{import, Format, ImportOptions, RandomFeatures};
use numpy::ndarray::{Ix1, Ix2};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;

/// An opened fanout dataset (see `fanout.Dataset` in `_fanout.pyi`). Immutable: the arrays it
/// hands out are views of its memory maps, kept alive by this object.
#[pyclass(name = "Dataset", module = "fanout", frozen)]
pub struct PyDataset {
    /// The opened dataset, shared with loaders built over it.
    pub ds: Arc<Dataset>,
}

#[pymethods]
impl PyDataset {
    /// Opens (memory-maps) the dataset directory `path`; O(1) in the dataset's size apart
    /// from checking the offsets (O(vertices)). The GIL is released meanwhile.
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        check_process()?;
        let ds = py
            .detach(|| Dataset::open(&path))
            .map_err(|e| missing_paths(graph(e), &[&path]))?;
        Ok(PyDataset { ds: Arc::new(ds) })
    }

    /// The directory the dataset was opened from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.ds.dir.clone()
    }

    /// Number of vertices.
    #[getter]
    fn num_nodes(&self) -> u64 {
        self.ds.num_nodes()
    }

    /// Number of stored arcs (edges).
    #[getter]
    fn num_edges(&self) -> u64 {
        self.ds.num_arcs()
    }

    /// Feature width (0 without features).
    #[getter]
    fn feat_dim(&self) -> usize {
        self.ds.features.as_ref().map_or(0, |f| f.dim)
    }

    /// Number of classes (NUM_CLASS).
    #[getter]
    fn num_classes(&self) -> u64 {
        self.ds.meta.num_class
    }

    /// `"float32"` or `"float16"`: the stored feature type.
    #[getter]
    fn feat_dtype(&self) -> &'static str {
        match self.ds.meta.feat_dtype {
            FeatDtype::F32 => "float32",
            FeatDtype::F16 => "float16",
        }
    }

    /// `"csc"` (rows list in-neighbours) or `"csr"` (rows list out-neighbours).
    #[getter]
    fn layout(&self) -> &'static str {
        match self.ds.meta.layout {
            Layout::Csc => "csc",
            Layout::Csr => "csr",
        }
    }

    /// The features, `[num_nodes, feat_dim]`, as a read-only view of `feat.bin`'s memory map
    /// (float32 or float16, no copy); `None` when the dataset has none.
    #[getter]
    fn features<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let ds = slf.get().ds.clone();
        let Some(f) = ds.features.as_ref() else {
            return Ok(None);
        };
        let shape = Ix2(f.num_rows(), f.dim);
        let owner = slf.clone().into_any();
        // SAFETY: the rows live in `ds`'s memory map, which `slf` (the owner) keeps alive and
        // never changes.
        let arr = unsafe {
            match &f.data {
                FeatData::F32(a) => readonly_view(owner, &a[..], shape)?.into_any(),
                FeatData::F16(a) => readonly_view(owner, &a[..], shape)?.into_any(),
            }
        };
        Ok(Some(arr))
    }

    /// Labels, `[num_nodes]` int64 (-1 = unlabelled), a read-only view of `label.bin`;
    /// `None` when the dataset has none.
    #[getter]
    fn labels<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyArray1<i64>>>> {
        let ds = slf.get().ds.clone();
        let Some(l) = ds.labels.as_ref() else {
            return Ok(None);
        };
        // SAFETY: as in `features`.
        unsafe { readonly_view(slf.clone().into_any(), &l[..], Ix1(l.len())) }.map(Some)
    }

    /// The training vertices (uint32, read-only view of `train_set.bin`).
    #[getter]
    fn train_idx<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        split(slf, "train")
    }

    /// The validation vertices (uint32, read-only view of `valid_set.bin`).
    #[getter]
    fn valid_idx<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        split(slf, "valid")
    }

    /// The test vertices (uint32, read-only view of `test_set.bin`).
    #[getter]
    fn test_idx<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        split(slf, "test")
    }

    /// The offsets of the compressed topology (`num_nodes + 1`, uint32 or uint64), read-only.
    #[getter]
    fn indptr<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let ds = slf.get().ds.clone();
        let owner = slf.clone().into_any();
        // SAFETY: as in `features`.
        unsafe {
            Ok(match &ds.topology.indptr {
                Offsets::U32(a) => readonly_view(owner, &a[..], Ix1(a.len()))?.into_any(),
                Offsets::U64(a) => readonly_view(owner, &a[..], Ix1(a.len()))?.into_any(),
            })
        }
    }

    /// The neighbour ids of the compressed topology (`num_edges`, uint32 or uint64),
    /// read-only: row `v` is `indices[indptr[v]:indptr[v+1]]` (in-neighbours for CSC).
    #[getter]
    fn indices<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let ds = slf.get().ds.clone();
        let owner = slf.clone().into_any();
        // SAFETY: as in `features`.
        unsafe {
            Ok(match &ds.topology.indices {
                Ids::U32(a) => readonly_view(owner, &a[..], Ix1(a.len()))?.into_any(),
                Ids::U64(a) => readonly_view(owner, &a[..], Ix1(a.len()))?.into_any(),
            })
        }
    }

    /// In-degree of every vertex (a new uint64 array).
    fn in_degrees<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u64>>> {
        check_process()?;
        let ds = self.ds.clone();
        Ok(py.detach(|| ds.topology.in_degrees()).into_pyarray(py))
    }

    /// Sizes, degree statistics, split sizes and bytes on disk, as `fanout dataset info
    /// --json` prints them.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        check_process()?;
        let ds = self.ds.clone();
        let info = py.detach(|| DatasetInfo::of(&ds));
        to_py(py, &info)
    }

    fn __len__(&self) -> usize {
        self.ds.num_nodes() as usize
    }

    fn __repr__(&self) -> String {
        format!(
            "fanout.Dataset({:?}: {} nodes, {} edges, {} features, {} classes, {}/{}/{} train/valid/test)",
            self.ds.dir.display().to_string(),
            self.ds.num_nodes(),
            self.ds.num_arcs(),
            self.feat_dim(),
            self.ds.meta.num_class,
            self.ds.train.len(),
            self.ds.valid.len(),
            self.ds.test.len()
        )
    }
}

fn split<'py>(slf: &Bound<'py, PyDataset>, name: &str) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let ds = slf.get().ds.clone();
    let a = match name {
        "train" => &ds.train,
        "valid" => &ds.valid,
        _ => &ds.test,
    };
    // SAFETY: as in `features`.
    unsafe { readonly_view(slf.clone().into_any(), &a[..], Ix1(a.len())) }
}

/// Checks every entry of the dataset at `path` (checksums, offsets, ids, labels, splits,
/// features); returns the report as a dict, raises `DatasetError` naming the file and the
/// first bad entry otherwise.
#[pyfunction]
pub fn verify<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    check_process()?;
    let report = py
        .detach(|| fanout_graph::verify(&path, &NoProgress))
        .map_err(|e| missing_paths(graph(e), &[&path]))?;
    to_py(py, &report)
}

/// The import options a Python caller can give, as keyword arguments of the `import_*`
/// functions (the names of `fanout dataset import`'s flags).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportArgs {
    layout: Option<String>,
    symmetrize: bool,
    drop_self_loops: bool,
    dedup: bool,
    num_nodes: Option<u64>,
    f16: bool,
    overwrite: bool,
    random_features: Option<usize>,
    classes: u64,
    train_frac: f64,
    valid_frac: f64,
    test_frac: f64,
    signal: f32,
    seed: u64,
    split_scheme: Option<String>,
}

/// Imports `src` (`format`: `npy`, `ogb` or `edgelist`) into a new dataset directory `dst`
/// with the options of `fanout dataset import` (a dict; see `fanout.import_npy`). Returns the
/// import summary as a dict. Nothing is left at `dst` when it fails.
#[pyfunction]
pub fn import_dataset<'py>(
    py: Python<'py>,
    format: &str,
    src: PathBuf,
    dst: PathBuf,
    options: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    check_process()?;
    let format: Format = format
        .parse()
        .map_err(|e: String| raise(Kind::Invalid, format!("format: {e}")))?;
    let a: ImportArgs = from_py(options, "import options")?;
    let layout = match a.layout.as_deref() {
        None | Some("csc") => Layout::Csc,
        Some("csr") => Layout::Csr,
        Some(o) => {
            return Err(raise(
                Kind::Invalid,
                format!("layout: expected \"csc\" or \"csr\", found {o:?}"),
            ))
        }
    };
    let opts = ImportOptions {
        build: BuildOptions {
            layout,
            symmetrize: a.symmetrize,
            drop_self_loops: a.drop_self_loops,
            dedup: a.dedup,
            num_nodes: a.num_nodes,
        },
        feat_dtype: if a.f16 {
            FeatDtype::F16
        } else {
            FeatDtype::F32
        },
        random: a.random_features.map(|dim| RandomFeatures {
            dim,
            classes: a.classes,
            train_frac: a.train_frac,
            valid_frac: a.valid_frac,
            test_frac: a.test_frac,
            seed: a.seed,
            signal: a.signal,
        }),
        overwrite: a.overwrite,
        split_scheme: a.split_scheme,
    };
    let summary = py
        .detach(|| import(format, &src, &dst, &opts, &NoProgress))
        .map_err(|e| missing_paths(graph(e), &[&src]))?;
    to_py(py, &summary)
}
