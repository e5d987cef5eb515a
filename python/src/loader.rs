//! The neighbour loader behind `fanout.NeighborLoader`: fanout's sample -> extract pipeline
//! ([`fanout_exec::Pipeline`]) on Rust threads, each prepared batch handed to Python as numpy
//! arrays that take over the Rust vectors (no copy).
//!
//! The batches of an epoch are those of `fanout sample-bench` / `fanout train` for the same
//! dataset, sampler, fanouts, batch size, shuffle and seed: the same [`fanout_sample::Loader`]
//! cuts and shuffles the seeds and the same sampler draws every block, keyed by
//! (seed, epoch, step).

use crate::convert::{from_py, to_py};
use crate::dataset::PyDataset;
use crate::errors::{check_process, exec, graph, in_owner_process, raise, Kind};
use fanout_cache::{
    build_extractor, CacheConfig, CacheSize, CacheSizeSpec, Extractor, PlainExtractor, Policy,
    PreSampling,
};
use fanout_exec::{
    BufferPool, CacheSpec, EpochStream, Pipeline, PipelineConfig, Prepared, TrainConfig,
};
use fanout_sample::{parse_fanouts, LoaderConfig, SamplerKind, SamplerSpec};
use numpy::ndarray::ArrayView2;
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::{Arc, Mutex};

/// A configured loader: the pipeline over one seed set (see `fanout.NeighborLoader`).
#[pyclass(name = "_Loader", module = "fanout._fanout", frozen)]
pub struct PyLoader {
    pipe: Arc<Pipeline>,
    /// The cache in front of the feature store, as built (JSON), or `None`.
    cache: Option<serde_json::Value>,
    num_layers: usize,
}

#[pymethods]
impl PyLoader {
    /// Builds the sampler (`sampler`: a `SamplerSpec` as a dict, e.g. `{"kind": "khop"}`),
    /// the feature extractor (`cache`: `None` or a dict with `policy`, `ratio`,
    /// `match_reorder`, `reorder_window`, as in a run config's `[cache]`) and the pipeline
    /// over `seeds` (uint32 vertex ids). `fanouts` are in hop order from the seeds (-1: all
    /// neighbours).
    #[new]
    #[pyo3(signature = (dataset, seeds, fanouts, batch_size, shuffle, sampler, cache, prefetch, seed, num_threads))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dataset: &Bound<'_, PyDataset>,
        seeds: PyReadonlyArray1<'_, u32>,
        fanouts: Vec<i64>,
        batch_size: usize,
        shuffle: bool,
        sampler: &Bound<'_, PyAny>,
        cache: Option<&Bound<'_, PyAny>>,
        prefetch: usize,
        seed: u64,
        num_threads: Option<usize>,
    ) -> PyResult<Self> {
        check_process()?;
        let invalid = |m: String| raise(Kind::Invalid, m);
        // The command line's parser, so the messages are `--fanouts`'s.
        let text: Vec<String> = fanouts.iter().map(i64::to_string).collect();
        let fanouts =
            parse_fanouts(&text.join(",")).map_err(|e| invalid(format!("fanouts: {e}")))?;
        if batch_size == 0 {
            return Err(invalid("batch_size must be at least 1".into()));
        }
        let max = TrainConfig::MAX_QUEUED_BATCHES;
        if prefetch == 0 || prefetch > max {
            return Err(invalid(format!(
                "prefetch {prefetch}: expected 1 to {max} batches (each one queued holds its \
                 sampled blocks and features in memory)"
            )));
        }
        let spec: SamplerSpec = from_py(sampler, "sampler")?;
        let cache: Option<CacheSpec> = match cache {
            Some(c) => Some(from_py(c, "cache")?),
            None => None,
        };
        if let Some(w) = cache
            .as_ref()
            .map(|c| c.reorder_window)
            .filter(|&w| w > max)
        {
            return Err(invalid(format!(
                "cache: reorder_window {w}: at most {max} batches"
            )));
        }
        // Copied, and numpy's read-only borrow of the caller's array released here rather
        // than held while the pipeline is built without the GIL.
        let seeds: Vec<u32> = {
            let borrowed = seeds;
            borrowed.as_slice()?.to_vec()
        };
        if seeds.is_empty() {
            return Err(invalid("seeds: the seed set is empty".into()));
        }
        let pool = match num_threads {
            None => None,
            Some(0) => return Err(invalid("num_threads must be at least 1".into())),
            Some(t) => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .thread_name(|i| format!("fanout-py-{i}"))
                    .build()
                    .map_err(|e| raise(Kind::Base, format!("cannot start {t} threads: {e}")))?,
            )),
        };
        let ds = dataset.get().ds.clone();
        let num_layers = fanouts.len();
        py.detach(move || {
            let build = || spec.build(&ds, fanouts, SamplerKind::Khop);
            let sampler = match &pool {
                Some(p) => p.install(build),
                None => build(),
            }
            .map_err(graph)?;
            let pcfg = PipelineConfig {
                batch_size,
                shuffle,
                seed,
                prefetch,
                sample_workers: 1,
                reorder_window: match &cache {
                    Some(c) if c.match_reorder => c.reorder_window,
                    _ => 0,
                },
                pool: pool.clone(),
                ..PipelineConfig::default()
            };
            let (extractor, summary) = match &cache {
                None => (
                    Box::new(PlainExtractor::new(ds.clone()).map_err(graph)?) as Box<dyn Extractor>,
                    None,
                ),
                Some(c) => {
                    let pre = PreSampling {
                        sampler: sampler.clone(),
                        seeds: &seeds,
                        loader: LoaderConfig {
                            batch_size,
                            shuffle: true,
                            seed,
                            pool: pool.clone(),
                            ..LoaderConfig::default()
                        },
                    };
                    let (ex, summary) = build_cache(&ds, c, seed, &pre)?;
                    (ex, Some(summary))
                }
            };
            let pipe = Pipeline::new(sampler, extractor, seeds, &pcfg).map_err(exec)?;
            Ok(PyLoader {
                pipe: Arc::new(pipe),
                cache: summary,
                num_layers,
            })
        })
    }

    /// Batches per epoch.
    fn __len__(&self) -> usize {
        self.pipe.num_batches()
    }

    /// Number of blocks per batch (the number of fanouts).
    #[getter]
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// The feature cache as built (policy, rows, ratio, bytes, match_previous), or `None`.
    #[getter]
    fn cache<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.cache.as_ref().map(|c| to_py(py, c)).transpose()
    }

    /// `(sample_s, extract_s)`: busy seconds of the two stages since the last call.
    fn take_times(&self) -> (f64, f64) {
        self.pipe.take_times()
    }

    /// Starts sampling and gathering epoch `epoch` in the background and returns its batches.
    fn epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<PyEpoch> {
        check_process()?;
        let pipe = self.pipe.clone();
        let stream = py.detach(move || pipe.epoch(epoch));
        Ok(PyEpoch {
            stream: Mutex::new(Some(stream)),
            buffers: self.pipe.buffers().clone(),
        })
    }
}

/// The cache of `c` in front of the dataset's features (what `fanout train --cache-policy`
/// builds), and its summary as JSON.
fn build_cache(
    ds: &Arc<fanout_graph::Dataset>,
    c: &CacheSpec,
    seed: u64,
    pre: &PreSampling,
) -> PyResult<(Box<dyn Extractor>, serde_json::Value)> {
    let invalid = |m: String| raise(Kind::Invalid, m);
    let policy = match c.policy.trim() {
        "none" | "" => None,
        p => Some(
            p.parse::<Policy>()
                .map_err(|e| invalid(format!("cache policy: {e}")))?,
        ),
    };
    let size =
        match CacheSizeSpec::parse(&c.ratio).map_err(|e| invalid(format!("cache ratio: {e}")))? {
            CacheSizeSpec::Fixed(s) => s,
            CacheSizeSpec::Auto => {
                return Err(invalid(
                    "cache ratio \"auto\" sizes the cache from a trial training step; the loader \
                 trains nothing: give a ratio, bytes or rows"
                        .into(),
                ))
            }
        };
    if c.reorder_window > 1 && !c.match_reorder {
        return Err(invalid(format!(
            "cache reorder_window {}: reordering only helps Match; set match_reorder",
            c.reorder_window
        )));
    }
    if let Some(m) = &c.device_memory {
        return Err(invalid(format!(
            "cache device_memory {m:?}: it bounds ratio = \"auto\", which the loader cannot \
             use (it trains nothing); give a ratio, bytes or rows"
        )));
    }
    let cfg = CacheConfig {
        policy,
        size: if policy.is_some() {
            size
        } else {
            CacheSize::Rows(0)
        },
        match_previous: c.match_reorder,
        seed,
        ranking: None,
    };
    let (ex, summary) = build_extractor(ds.clone(), &cfg, Some(pre)).map_err(graph)?;
    let json = serde_json::to_value(&summary).map_err(|e| raise(Kind::Base, e.to_string()))?;
    Ok((Box::new(ex), json))
}

/// The batches of one epoch (an iterator of dicts, wrapped by `fanout.MiniBatch`).
#[pyclass(name = "_Epoch", module = "fanout._fanout", frozen)]
pub struct PyEpoch {
    stream: Mutex<Option<EpochStream>>,
    /// Where a batch's feature buffer goes back when Python drops its last view of it.
    buffers: Arc<BufferPool>,
}

#[pymethods]
impl PyEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next prepared batch as a dict of numpy arrays, waiting (without the GIL) until the
    /// pipeline has it; `None` (StopIteration) at the end of the epoch.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        check_process()?;
        let next = py.detach(|| {
            let mut guard = self.stream.lock().unwrap_or_else(|e| e.into_inner());
            let item = guard.as_mut().and_then(Iterator::next);
            if item.is_none() {
                // Finished: join the stage threads now rather than at garbage collection.
                guard.take();
            }
            item
        });
        match next {
            None => Ok(None),
            Some(Err(e)) => {
                self.close(py);
                Err(exec(e))
            }
            Some(Ok(p)) => batch_to_py(py, p, &self.buffers).map(Some),
        }
    }

    /// Stops the epoch: the sampling and gathering threads finish the batches they are on and
    /// end. Later calls to `__next__` end the iteration.
    fn close(&self, py: Python<'_>) {
        // The lock is taken without the GIL: `__next__` holds it while it waits for a batch,
        // and other Python threads must not wait for that batch too.
        let stream = py.detach(|| self.stream.lock().unwrap_or_else(|e| e.into_inner()).take());
        release(py, stream);
    }

    /// Batches this epoch yields in total (0 once it is closed or finished).
    fn __len__(&self, py: Python<'_>) -> usize {
        py.detach(|| {
            self.stream
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map_or(0, EpochStream::len)
        })
    }
}

impl Drop for PyEpoch {
    fn drop(&mut self) {
        let stream = self
            .stream
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if stream.is_some() {
            Python::attach(|py| release(py, stream));
        }
    }
}

/// Ends an epoch's stream: joins its stage threads without the GIL (that can take a batch's
/// time), or, in a process forked from the one that started them, leaks it (the threads do
/// not exist here and joining them would wait for ever).
fn release(py: Python<'_>, stream: Option<EpochStream>) {
    if in_owner_process() {
        py.detach(move || drop(stream));
    } else {
        std::mem::forget(stream);
    }
}

/// The memory of a batch's feature array: the numpy array borrows this object's vector (it is
/// the array's `base`), and when the last view of it is gone (the array, `torch.from_numpy`
/// tensors sharing it) the vector goes back to the pipeline's [`BufferPool`], so the next
/// batch is gathered into pages already mapped instead of fresh ones.
#[pyclass(name = "_FeatureBuffer", module = "fanout._fanout", frozen)]
pub struct FeatureBuffer {
    buf: Vec<f32>,
    pool: Arc<BufferPool>,
}

impl Drop for FeatureBuffer {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

/// `features` (`rows x dim`, row-major) as a writeable numpy array over the vector's own
/// memory (no copy), owned by a [`FeatureBuffer`] that recycles it.
fn features_to_py<'py>(
    py: Python<'py>,
    features: Vec<f32>,
    rows: usize,
    dim: usize,
    pool: &Arc<BufferPool>,
) -> PyResult<Bound<'py, PyAny>> {
    if features.len() != rows * dim {
        return Err(raise(
            Kind::Base,
            format!(
                "features: {} values for {rows} rows x {dim}",
                features.len()
            ),
        ));
    }
    let owner = Bound::new(
        py,
        FeatureBuffer {
            buf: features,
            pool: pool.clone(),
        },
    )?;
    let view = ArrayView2::from_shape((rows, dim), &owner.get().buf[..])
        .map_err(|e| raise(Kind::Base, format!("features of {rows} rows x {dim}: {e}")))?;
    // SAFETY: the array's memory is `owner.buf`, which is never touched again while `owner`
    // lives (the class is frozen: no method moves or resizes the vector), and `owner` becomes
    // the array's base, so it lives as long as the array and every view of it.
    let arr = unsafe { PyArray2::borrow_from_array(&view, owner.clone().into_any()) };
    Ok(arr.into_any())
}

/// A prepared batch as a dict of numpy arrays. Every array is the Rust vector's own memory
/// (`IntoPyArray`, or for the features a recycling [`FeatureBuffer`]; no element is copied);
/// `_addresses` records each buffer's address before the handover so tests can check that
/// the arrays' data pointers are those buffers.
fn batch_to_py<'py>(
    py: Python<'py>,
    p: Prepared,
    pool: &Arc<BufferPool>,
) -> PyResult<Bound<'py, PyDict>> {
    let Prepared {
        batch,
        features,
        dim,
        extract,
        ..
    } = p;
    let d = PyDict::new(py);
    let addr = PyDict::new(py);
    let rows = batch.input_nodes.len();
    d.set_item("epoch", batch.key.epoch)?;
    d.set_item("step", batch.key.step)?;
    d.set_item("num_seeds", batch.num_seeds)?;
    addr.set_item("features", features.as_ptr() as usize)?;
    d.set_item("features", features_to_py(py, features, rows, dim, pool)?)?;
    addr.set_item("input_nodes", batch.input_nodes.as_ptr() as usize)?;
    d.set_item("input_nodes", batch.input_nodes.into_pyarray(py))?;
    match batch.labels {
        Some(l) => {
            addr.set_item("labels", l.as_ptr() as usize)?;
            d.set_item("labels", l.into_pyarray(py))?;
        }
        None => d.set_item("labels", py.None())?,
    }
    let blocks = PyList::empty(py);
    for (i, b) in batch.blocks.into_iter().enumerate() {
        let bd = PyDict::new(py);
        bd.set_item("num_src", b.num_src)?;
        bd.set_item("num_dst", b.num_dst)?;
        addr.set_item(format!("blocks.{i}.indptr"), b.indptr.as_ptr() as usize)?;
        addr.set_item(format!("blocks.{i}.indices"), b.indices.as_ptr() as usize)?;
        bd.set_item("indptr", b.indptr.into_pyarray(py))?;
        bd.set_item("indices", b.indices.into_pyarray(py))?;
        match b.weights {
            Some(w) => bd.set_item("weights", w.into_pyarray(py))?,
            None => bd.set_item("weights", py.None())?,
        }
        blocks.append(bd)?;
    }
    d.set_item("blocks", blocks)?;
    d.set_item("extract", to_py(py, &extract)?)?;
    d.set_item("_addresses", addr)?;
    Ok(d)
}
