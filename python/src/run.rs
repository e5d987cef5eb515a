//! `fanout.train`, `fanout.evaluate` and checkpoint reading: thin shells over the run API
//! (`fanout_exec::train`, `fanout_exec::evaluate_checkpoint`) and `fanout_compute::io`.

use crate::convert::{from_py, json_to_py, to_py};
use crate::errors::{check_process, compute, exec, missing_paths, raise, Kind};
use fanout_compute::{io, CpuBackend};
use fanout_exec::{
    BatchOutcome, Compute, DeviceSpec, EpochMetrics, EvalRequest, EvalSplit, FitObserver, RunEnv,
    TrainConfig,
};
use fanout_graph::{Cancel, Residency};
use numpy::ndarray::Array2;
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::{Path, PathBuf};

/// Forwards a run's progress to Python: each finished epoch's metrics (a dict) to `on_epoch`,
/// set-up lines to `on_note`. Called from the training thread, which takes the GIL only for
/// the call. The first exception a callback raises is kept, stops the run at its next step
/// (through `cancel`) and is raised when the run ends.
struct PyObserver {
    on_epoch: Option<Py<PyAny>>,
    on_note: Option<Py<PyAny>>,
    error: Option<PyErr>,
    cancel: Cancel,
    /// The finished epochs, for the metrics of a run that stops early.
    done: Vec<EpochMetrics>,
}

impl PyObserver {
    fn call(&mut self, f: &Option<Py<PyAny>>, arg: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>) {
        let Some(f) = f else { return };
        if self.error.is_some() {
            return;
        }
        let r = Python::attach(|py| -> PyResult<()> {
            f.call1(py, (arg(py)?,))?;
            Ok(())
        });
        if let Err(e) = r {
            self.error = Some(e);
            self.cancel.cancel();
        }
    }
}

impl FitObserver for PyObserver {
    fn batch_done(&mut self, _outcome: &BatchOutcome) {}

    fn epoch_end(&mut self, m: &EpochMetrics) {
        self.done.push(m.clone());
        let f = self
            .on_epoch
            .as_ref()
            .map(|f| Python::attach(|py| f.clone_ref(py)));
        self.call(&f, |py| to_py(py, m).map(Bound::unbind));
    }

    fn note(&mut self, line: &str) {
        let f = self
            .on_note
            .as_ref()
            .map(|f| Python::attach(|py| f.clone_ref(py)));
        let line = line.to_string();
        self.call(&f, |py| Ok(line.into_pyobject(py)?.into_any().unbind()));
    }
}

/// The command that installs this package with CUDA support, quoted in errors.
const PIP_CUDA: &str = "MATURIN_PEP517_ARGS=\"--features cuda\" pip install ./python";

/// The device `device=` names (`InvalidArgumentError` if it names none), refused at once with
/// `DeviceError` when it is a GPU and this package has no CUDA support.
fn device_spec(device: &str) -> PyResult<DeviceSpec> {
    let spec: DeviceSpec = device
        .parse()
        .map_err(|e| raise(Kind::Invalid, format!("device: {e}")))?;
    if !spec.is_cpu() && !fanout_exec::device::CUDA_BUILT {
        // The library's own message names the cargo command, which builds the command line.
        return Err(raise(
            Kind::Device,
            format!(
                "device {spec}: this fanout package was built without CUDA support; reinstall \
                 it with `{PIP_CUDA}` (building needs no CUDA toolkit; running needs the NVIDIA \
                 driver)"
            ),
        ));
    }
    Ok(spec)
}

/// Why [`train`]'s or [`evaluate`]'s run did not finish: the device did not open, or the
/// run failed.
enum RunFailure {
    /// The device named could not be opened (why, after the device's name).
    Device(String),
    /// The run API's error.
    Exec(fanout_exec::ExecError),
}

impl From<fanout_exec::ExecError> for RunFailure {
    fn from(e: fanout_exec::ExecError) -> Self {
        RunFailure::Exec(e)
    }
}

impl RunFailure {
    /// The Python exception: `DeviceError` naming `spec` for a device that did not open,
    /// else the run API's error (as `NotFoundError` when one of `paths` does not exist).
    fn into_py(self, spec: DeviceSpec, paths: &[&Path]) -> PyErr {
        match self {
            RunFailure::Device(why) => raise(Kind::Device, format!("device {spec}: {why}")),
            RunFailure::Exec(e) => missing_paths(exec(e), paths),
        }
    }
}

/// Trains the run described by `config` (a dict of `TrainConfig` settings) or `config_path`
/// (TOML, JSON, or an earlier run's metrics JSON) on `device` (`cpu`, `cuda`, `cuda:N`; what
/// `fanout train --device` takes), with the GIL released. Writes the metrics JSON to
/// `metrics_out` and the best-validation model to `save_model` when given; returns the
/// metrics report (`fanout train --metrics-out`'s JSON, the device's summary under
/// `"device"`) as a dict. A device that cannot be opened raises `DeviceError`; a GPU asked
/// for is never replaced by the CPU.
#[pyfunction]
#[pyo3(signature = (config=None, config_path=None, save_model=None, metrics_out=None, on_epoch=None, on_note=None, device="cpu"))]
#[allow(clippy::too_many_arguments)]
pub fn train<'py>(
    py: Python<'py>,
    config: Option<&Bound<'py, PyAny>>,
    config_path: Option<PathBuf>,
    save_model: Option<PathBuf>,
    metrics_out: Option<PathBuf>,
    on_epoch: Option<Py<PyAny>>,
    on_note: Option<Py<PyAny>>,
    device: &str,
) -> PyResult<Bound<'py, PyAny>> {
    check_process()?;
    let spec = device_spec(device)?;
    let cfg: TrainConfig = match (config, &config_path) {
        (Some(c), None) => from_py(c, "config")?,
        (None, Some(p)) => {
            TrainConfig::from_file(p).map_err(|e| missing_paths(exec(e), &[p.as_path()]))?
        }
        _ => {
            return Err(raise(
                Kind::Invalid,
                "give exactly one of config (a dict) and config_path",
            ))
        }
    };
    // Outputs that could not be written, or would write over the config or each other, are
    // refused before the run rather than after it.
    let outputs: Vec<(&str, &Path)> = [
        ("save_model", save_model.as_deref()),
        ("metrics_out", metrics_out.as_deref()),
    ]
    .into_iter()
    .filter_map(|(k, p)| Some((k, p?)))
    .collect();
    let inputs: Vec<(&str, &Path)> = config_path
        .as_deref()
        .map(|p| ("config", p))
        .into_iter()
        .collect();
    fanout_exec::check_outputs(&outputs, &inputs).map_err(exec)?;
    let dataset = cfg.dataset.clone().unwrap_or_default();
    let cancel = Cancel::new();
    let mut obs = PyObserver {
        on_epoch,
        on_note,
        error: None,
        cancel: cancel.clone(),
        done: Vec::new(),
    };
    let env = RunEnv {
        cancel: Some(&cancel),
        ..RunEnv::default()
    };
    let (result, signal) = interruptible(py, &cancel, || {
        // Opened here, without the GIL: starting a GPU's backend compiles its kernels.
        let (compute, info) = Compute::open(spec).map_err(RunFailure::Device)?;
        let out = compute.train(&cfg, &env, &mut obs)?;
        // A checkpoint that cannot be written does not take the finished run's metrics with
        // it: they are written first, below, and its error raised after.
        let saved = save_model
            .as_ref()
            .map(|p| out.save_model(p))
            .transpose()
            .map(|_| ());
        Ok::<_, RunFailure>((out.report_on(&info), saved))
    });
    // A run that stopped early leaves the figures of the epochs it finished in `metrics_out`
    // (as `fanout train` does); a failure to write them does not hide why it stopped.
    if let (Err(e), Some(p), false) = (&result, &metrics_out, obs.done.is_empty()) {
        let why = match e {
            RunFailure::Exec(e) => e.to_string(),
            RunFailure::Device(d) => d.clone(),
        };
        let _ = write_json(p, &fanout_exec::stopped_run_report(&cfg, &obs.done, &why));
    }
    // A signal's exception (KeyboardInterrupt) first, then a callback's, then the run's own.
    if let Some(e) = signal.or_else(|| obs.error.take()) {
        return Err(e);
    }
    let (report, saved) = result.map_err(|e| e.into_py(spec, &[dataset.as_path()]))?;
    if let Some(p) = &metrics_out {
        write_json(p, &report)?;
    }
    saved.map_err(|e| RunFailure::Exec(e).into_py(spec, &[dataset.as_path()]))?;
    json_to_py(py, &report)
}

/// Runs `work` on a thread of its own without the GIL while this (Python's main) thread keeps
/// checking for signals: Python only runs its SIGINT handler on the main thread, between
/// bytecodes, so a run holding that thread in Rust could not be stopped by Ctrl-C. A signal
/// whose handler raises (KeyboardInterrupt) cancels `cancel` (the run stops before its next
/// step) and is returned beside `work`'s result once `work` has ended.
fn interruptible<T: Send>(
    py: Python<'_>,
    cancel: &Cancel,
    work: impl FnOnce() -> T + Send,
) -> (T, Option<PyErr>) {
    std::thread::scope(|s| {
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        // Behind a mutex only to be `Sync`: the closure below borrows it across `detach`.
        let done_rx = std::sync::Mutex::new(done_rx);
        let handle = s.spawn(move || {
            let out = work();
            drop(done_tx);
            out
        });
        let mut raised = None;
        loop {
            let finished = py.detach(|| {
                !matches!(
                    done_rx
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .recv_timeout(std::time::Duration::from_millis(50)),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                )
            });
            if finished {
                break;
            }
            if raised.is_none() {
                if let Err(e) = py.check_signals() {
                    cancel.cancel();
                    raised = Some(e);
                }
            }
        }
        let out = py.detach(|| handle.join());
        match out {
            Ok(v) => (v, raised),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Writes `v` as pretty JSON to `path` (through a temporary file renamed into place).
fn write_json(path: &Path, v: &serde_json::Value) -> PyResult<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| raise(Kind::Base, e.to_string()))?;
    let io_err = |e: std::io::Error| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound {
            Kind::NotFound
        } else {
            Kind::Io
        };
        raise(kind, format!("cannot write {}: {e}", path.display()))
    };
    fanout_compute::io::write_atomically(path, text.as_bytes()).map_err(io_err)
}

/// The accuracy of checkpoint `checkpoint` on `split` (`test`, `valid` or `train`) of
/// `dataset` (`None`: the embedded graph), sampled with the fanouts, batch size, seed and
/// sampler stored in the checkpoint, as `fanout eval` does, with the model on `device` (as
/// [`train`]'s).
#[pyfunction]
#[pyo3(signature = (checkpoint, dataset=None, split="test", feature_residency="auto", device="cpu"))]
pub fn evaluate(
    py: Python<'_>,
    checkpoint: PathBuf,
    dataset: Option<PathBuf>,
    split: &str,
    feature_residency: &str,
    device: &str,
) -> PyResult<f64> {
    check_process()?;
    let spec = device_spec(device)?;
    let split = match split {
        "test" => EvalSplit::Test,
        "valid" => EvalSplit::Valid,
        "train" => EvalSplit::Train,
        s => {
            return Err(raise(
                Kind::Invalid,
                format!("split: expected \"test\", \"valid\" or \"train\", found {s:?}"),
            ))
        }
    };
    let residency: Residency =
        serde_json::from_value(serde_json::Value::String(feature_residency.into()))
            .map_err(|e| raise(Kind::Invalid, format!("feature_residency: {e}")))?;
    let req = EvalRequest {
        checkpoint: checkpoint.clone(),
        dataset: dataset.clone(),
        split,
        feature_residency: residency,
    };
    let ds = dataset.unwrap_or_default();
    py.detach(|| {
        let (compute, _) = Compute::open(spec).map_err(RunFailure::Device)?;
        Ok(compute.evaluate(&req, &fanout_graph::NoProgress)?)
    })
    .map_err(|e: RunFailure| e.into_py(spec, &[checkpoint.as_path(), ds.as_path()]))
}

/// Reads a fanout checkpoint: `(metadata, model_config, tensors)`, where `metadata` maps
/// every safetensors metadata key to its string, `model_config` is the stored model
/// configuration (a dict: kind, in_dim, hidden, num_classes, num_layers, dropout, heads,
/// seed) and `tensors` maps each parameter name (`layers.{i}.{param}`) to a float32 array
/// `[rows, cols]`, weights `in x out`. The file is checked as `fanout eval` checks it.
#[pyfunction]
pub fn read_checkpoint<'py>(
    py: Python<'py>,
    path: PathBuf,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyAny>, Bound<'py, PyDict>)> {
    let bytes = std::fs::read(&path).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound {
            Kind::NotFound
        } else {
            Kind::Io
        };
        raise(kind, format!("cannot read {}: {e}", path.display()))
    })?;
    let bad = |e: fanout_compute::ComputeError| {
        let msg = format!("{}: {e}", path.display());
        let err = compute(e);
        Python::attach(|py| PyErr::from_type(err.get_type(py), (msg,)))
    };
    let (meta, model) = py
        .detach(|| {
            let meta = io::read_metadata(&bytes)?;
            let model = io::from_bytes(CpuBackend, &bytes)?;
            Ok((meta, model))
        })
        .map_err(bad)?;
    let md = PyDict::new(py);
    let mut keys: Vec<_> = meta.keys().collect();
    keys.sort();
    for k in keys {
        md.set_item(k, &meta[k])?;
    }
    let config = to_py(py, model.config())?;
    let tensors = PyDict::new(py);
    let be = model.backend();
    for (name, p) in model.named_params() {
        let t = fanout_compute::Backend::download(be, &p.value)
            .map_err(|e| raise(Kind::Base, format!("tensor {name}: {e}")))?;
        let (r, c) = t.shape();
        let a = Array2::from_shape_vec((r, c), t.into_data())
            .map_err(|e| raise(Kind::Base, format!("tensor {name}: {e}")))?;
        tensors.set_item(name, a.into_pyarray(py))?;
    }
    Ok((md, config, tensors))
}
