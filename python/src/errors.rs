//! Rust errors as Python exceptions, with the Rust message unchanged.
//!
//! Every exception fanout raises derives from `fanout.FanoutError`; the more specific ones also
//! derive from the built-in exception a Python programmer would catch:
//!
//! | class | bases | raised for |
//! |---|---|---|
//! | `FanoutError` | `Exception` | anything else (a worker failed, a compute error, ...) |
//! | `DatasetError` | `FanoutError` | a dataset file that is damaged or does not match `meta.txt` |
//! | `InvalidArgumentError` | `FanoutError`, `ValueError` | a bad argument or setting |
//! | `NotFoundError` | `FanoutError`, `FileNotFoundError` | a path (dataset, checkpoint, source) that does not exist |
//! | `FanoutIOError` | `FanoutError`, `OSError` | any other operating-system error |
//! | `DeviceError` | `FanoutError`, `RuntimeError` | a device that cannot be opened (no CUDA in this build, no driver, no such GPU) or fails during the run (out of memory) |
//!
//! The classes are made at import time with `type(name, bases, {})` because an exception class
//! with two bases cannot be declared with `create_exception!`.

use fanout_compute::ComputeError;
use fanout_exec::ExecError;
use fanout_graph::Error as GraphError;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use std::path::Path;

/// The exception classes, in the order of [`Kind`].
static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// Which `fanout` exception class an error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `FanoutError`.
    Base = 0,
    /// `DatasetError`.
    Dataset = 1,
    /// `InvalidArgumentError` (also a `ValueError`).
    Invalid = 2,
    /// `NotFoundError` (also a `FileNotFoundError`).
    NotFound = 3,
    /// `FanoutIOError` (also an `OSError`).
    Io = 4,
    /// `DeviceError` (also a `RuntimeError`).
    Device = 5,
}

const DOCS: [(&str, &str); 6] = [
    ("FanoutError", "Base class of every error fanout raises."),
    (
        "DatasetError",
        "A dataset file is damaged or does not match meta.txt (the message names the file).",
    ),
    (
        "InvalidArgumentError",
        "A bad argument or setting (also a ValueError).",
    ),
    (
        "NotFoundError",
        "A path that does not exist (also a FileNotFoundError).",
    ),
    (
        "FanoutIOError",
        "An operating-system error while reading or writing (also an OSError).",
    ),
    (
        "DeviceError",
        "The device asked for cannot be opened (no CUDA in this build, no driver, no such GPU) \
         or failed during the run (out of memory) (also a RuntimeError).",
    ),
];

/// Creates the exception classes and adds them to module `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let builtins = py.import("builtins")?;
    let type_fn = builtins.getattr("type")?;
    let mut made: Vec<Py<PyType>> = Vec::new();
    for (i, (name, doc)) in DOCS.iter().enumerate() {
        let extra: Bound<'_, PyType> = match i {
            0 => py.get_type::<PyException>(),
            1 => made[0].bind(py).clone(),
            2 => py.get_type::<PyValueError>(),
            3 => py.get_type::<PyFileNotFoundError>(),
            4 => py.get_type::<PyOSError>(),
            _ => py.get_type::<PyRuntimeError>(),
        };
        let bases = if i <= 1 {
            PyTuple::new(py, [extra])?
        } else {
            PyTuple::new(py, [made[0].bind(py).clone(), extra])?
        };
        let ns = PyDict::new(py);
        ns.set_item("__doc__", *doc)?;
        ns.set_item("__module__", "fanout")?;
        let cls = type_fn.call1((*name, bases, ns))?.cast_into::<PyType>()?;
        m.add(*name, &cls)?;
        made.push(cls.unbind());
    }
    let _ = CLASSES.set(py, made);
    Ok(())
}

/// A Python exception of class `kind` carrying `msg`.
pub fn raise(kind: Kind, msg: impl Into<String>) -> PyErr {
    let msg: String = msg.into();
    Python::attach(|py| match CLASSES.get(py) {
        Some(c) => PyErr::from_type(c[kind as usize].bind(py).clone(), (msg,)),
        None => PyException::new_err(msg),
    })
}

/// Errors of the dataset store and the samplers.
pub fn graph(e: GraphError) -> PyErr {
    let kind = match &e {
        GraphError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Kind::NotFound
        }
        GraphError::Io { .. } => Kind::Io,
        GraphError::Format { .. } => Kind::Dataset,
        // A sampler that panicked (caught by the loader, e.g. on neighbour ids out of range
        // in a damaged indices.bin, which only `verify` scans): not the caller's argument.
        GraphError::Invalid(m) if m.contains(" panicked") => Kind::Base,
        GraphError::Invalid(_) => Kind::Invalid,
        // Cancellation: `fanout.train` raises the signal's own exception (KeyboardInterrupt)
        // or the callback's instead; this message is what remains otherwise.
        GraphError::Interrupted => Kind::Base,
    };
    raise(kind, e.to_string())
}

/// Errors of the model code (checkpoints, shapes, labels).
pub fn compute(e: ComputeError) -> PyErr {
    let kind = match &e {
        ComputeError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Kind::NotFound
        }
        ComputeError::Io { .. } => Kind::Io,
        // A file that is not a checkpoint of this model: the same class whichever call read it.
        ComputeError::Config(_) | ComputeError::Format(_) => Kind::Invalid,
        _ => Kind::Base,
    };
    raise(kind, e.to_string())
}

/// Errors of the run API.
pub fn exec(e: ExecError) -> PyErr {
    match e {
        ExecError::Graph(g) => graph(g),
        ExecError::Compute(c) => compute(c),
        ExecError::Invalid(m) => raise(Kind::Invalid, m),
        ExecError::Comm(c) => raise(Kind::Base, c.to_string()),
        e @ ExecError::Device { .. } => raise(Kind::Device, e.to_string()),
        e @ (ExecError::Interrupted { .. } | ExecError::NonFinite { .. }) => {
            raise(Kind::Base, e.to_string())
        }
    }
}

/// Re-labels an error as `NotFoundError` when it is about one of the paths the call was given
/// and that path does not exist (the Rust message, which names the path, is kept). Rust
/// reports some missing inputs as invalid requests ("not a dataset directory"); to a Python
/// caller they are missing files. An error about something else (a bad setting found before
/// the path was read) keeps its class.
pub fn missing_paths(err: PyErr, paths: &[&Path]) -> PyErr {
    let msg = Python::attach(|py| err.value(py).to_string());
    let about_missing =
        |p: &&Path| !p.as_os_str().is_empty() && !p.exists() && msg.contains(&*p.to_string_lossy());
    if paths.iter().any(about_missing) {
        return raise(Kind::NotFound, msg);
    }
    err
}

/// The process that first called into fanout (0: none yet).
static OWNER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Called before every native call that may run on fanout's threads (rayon's pool, the
/// loader's workers). fanout starts those threads on first use; a process forked after that
/// (a `torch.utils.data.DataLoader` worker, `multiprocessing` with the fork method) inherits
/// the pool's state but none of its threads, and any parallel work there would wait for
/// ever. Such a call raises `FanoutError` instead. A process that forks before using fanout,
/// or starts its children with "spawn", is unaffected.
pub fn check_process() -> PyResult<()> {
    use std::sync::atomic::Ordering::SeqCst;
    let me = std::process::id();
    match OWNER.compare_exchange(0, me, SeqCst, SeqCst) {
        Ok(_) => Ok(()),
        Err(p) if p == me => Ok(()),
        Err(p) => Err(raise(
            Kind::Base,
            format!(
                "fanout's threads were started in process {p}, and this process ({me}) was \
                 forked from it after that: it has none of them, so fanout cannot run here (it \
                 would wait for ever). Use fanout in process {p} (a torch DataLoader needs \
                 num_workers=0: the loader prefetches on its own threads), or start worker \
                 processes with the \"spawn\" method. Arrays already taken from a Dataset stay \
                 readable."
            ),
        )),
    }
}

/// Whether this is the process whose threads fanout's objects use (or fanout has not started
/// any yet). Objects dropped in a forked child must not join threads that only exist in the
/// parent: they are leaked instead.
pub fn in_owner_process() -> bool {
    let owner = OWNER.load(std::sync::atomic::Ordering::SeqCst);
    owner == 0 || owner == std::process::id()
}
