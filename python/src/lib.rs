//! `fanout._fanout`: the native module of the `fanout` Python package.
//!
//! A thin shell over fanout's crates: [`dataset`] opens datasets (arrays as read-only numpy
//! views of the memory maps) and imports them, [`loader`] runs the sample -> extract pipeline
//! on Rust threads and hands each batch over as numpy arrays that own the Rust buffers,
//! [`run`] calls the run API (train, evaluate) and reads checkpoints, [`report`] draws a
//! run's metrics as `fanout report` does, and [`errors`] turns every Rust error into a Python
//! exception carrying the same message. Long calls release the GIL. The Python-facing API,
//! its documentation and type stubs live in `python/fanout/`.

mod convert;
mod dataset;
mod errors;
mod loader;
mod report;
mod run;

use pyo3::prelude::*;

/// Large allocations (feature batches) use transparent huge pages: fewer page faults per batch
/// (see `fanout_compute::HugePageAlloc`).
#[global_allocator]
static ALLOC: fanout_compute::HugePageAlloc = fanout_compute::HugePageAlloc;

/// The native module; see `fanout/_fanout.pyi` for its contents.
#[pymodule]
fn _fanout(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<dataset::PyDataset>()?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<loader::PyEpoch>()?;
    m.add_class::<loader::FeatureBuffer>()?;
    m.add_function(wrap_pyfunction!(dataset::verify, m)?)?;
    m.add_function(wrap_pyfunction!(dataset::import_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(run::train, m)?)?;
    m.add_function(wrap_pyfunction!(run::evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(run::read_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(report::report, m)?)?;
    m.add("EVAL_EPOCH", fanout_exec::EVAL_EPOCH)?;
    m.add("CUDA_BUILT", fanout_exec::device::CUDA_BUILT)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
