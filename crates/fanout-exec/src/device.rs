//! The device a run computes on: [`Compute::open`] turns a [`DeviceSpec`] (`cpu`, `cuda`,
//! `cuda:N`) into a backend, and [`Compute::train`] runs the run API there. The command line's
//! `--device` and the Python package's `device=` both go through it, so they accept, refuse and
//! report the same devices.

pub use fanout_cuda::{DeviceInfo, DeviceSpec, CUDA_BUILT};

use crate::run::{train, TrainOutcome};
use crate::{FitObserver, Result, RunEnv, TrainConfig};
use fanout_graph::Progress;

/// Where a run computes, as opened by [`Compute::open`].
#[derive(Debug)]
pub enum Compute {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend on an opened GPU, its kernels compiled (only in a build with the
    /// `cuda` feature).
    #[cfg(feature = "cuda")]
    Cuda(fanout_cuda::CudaBackend),
}

impl Compute {
    /// Opens the device `spec` names and, for a GPU, starts the CUDA backend on it (NVRTC
    /// compiles its kernels, cuBLAS starts); returns it with the device's summary as the run
    /// starts (name, memory), for the run's metrics. The error says what is missing (no CUDA in
    /// this build, no driver, no such device, NVRTC or cuBLAS failing) as a clause meant to
    /// follow the device's name (`--device cuda:1: ...`). A spec naming a GPU never opens the
    /// CPU instead.
    pub fn open(spec: DeviceSpec) -> std::result::Result<(Compute, DeviceInfo), String> {
        let device = fanout_cuda::open(spec).map_err(|e| e.to_string())?;
        let info = device.info();
        if device.is_cpu() {
            return Ok((Compute::Cpu, info));
        }
        Ok((cuda_backend(device)?, info))
    }

    /// Trains `cfg` here: [`train`] on the CPU, [`crate::train_with_backend`] on a GPU (which
    /// refuses, before the dataset is opened, what runs on the CPU only: see
    /// [`crate::check_backend`]).
    pub fn train(
        self,
        cfg: &TrainConfig,
        env: &RunEnv,
        obs: &mut dyn FitObserver,
    ) -> Result<TrainOutcome> {
        match self {
            Compute::Cpu => train(cfg, env, obs),
            #[cfg(feature = "cuda")]
            Compute::Cuda(be) => crate::train_with_backend(be, cfg, env, obs),
        }
    }

    /// Evaluates a checkpoint here: [`crate::evaluate_checkpoint_with`] on this device's
    /// backend.
    pub fn evaluate(self, req: &crate::EvalRequest, progress: &dyn Progress) -> Result<f64> {
        match self {
            Compute::Cpu => crate::evaluate_checkpoint(req, progress),
            #[cfg(feature = "cuda")]
            Compute::Cuda(be) => crate::evaluate_checkpoint_with(be, req, progress),
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_backend(device: fanout_cuda::Device) -> std::result::Result<Compute, String> {
    let fanout_cuda::Device::Cuda(gpu) = &device else {
        return Err("not a CUDA device".into());
    };
    fanout_cuda::CudaBackend::new(gpu)
        .map(Compute::Cuda)
        .map_err(|e| format!("opened {}, but {e}", device.info()))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(device: fanout_cuda::Device) -> std::result::Result<Compute, String> {
    // `open` refuses CUDA specs in a build without the feature; this is only reached if that
    // ever changes.
    Err(format!(
        "opened {}, but this build has no CUDA compute path; rebuild with `{}`",
        device.info(),
        fanout_cuda::REBUILD_HINT
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_opens_and_a_gpu_is_never_quietly_the_cpu() {
        let (c, info) = Compute::open(DeviceSpec::Cpu).expect("the CPU always opens");
        assert!(matches!(c, Compute::Cpu));
        assert_eq!(info.device, "cpu");
        match Compute::open(DeviceSpec::Cuda(0)) {
            // A build without CUDA, or a machine without a driver or GPU: an error that says
            // which.
            Err(why) => {
                assert!(
                    why.contains("CUDA") || why.contains("cuda"),
                    "the error names what is missing: {why}"
                );
                if !fanout_cuda::CUDA_BUILT {
                    assert!(why.contains(fanout_cuda::REBUILD_HINT), "{why}");
                }
            }
            Ok((c, info)) => {
                assert!(!matches!(c, Compute::Cpu), "cuda:0 opened the CPU");
                assert_eq!(info.device, "cuda:0");
            }
        }
    }
}
