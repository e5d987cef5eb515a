//! `--device` of the commands that compute (`train`, `eval`).

use fanout_cuda::{DeviceInfo, DeviceSpec};

/// Where a command computes, opened from its `--device`.
pub enum Compute {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend on an opened GPU (only in a build with the `cuda` feature).
    #[cfg(feature = "cuda")]
    Cuda(fanout_cuda::CudaBackend),
}

/// Opens the device `--device` names and, for a GPU, starts the CUDA backend on it (compiling
/// its kernels); returns it with the device's summary for the run's metrics JSON (its name and
/// memory as the run starts). Errors read `--device SPEC: why` (no CUDA in this build, no
/// driver, no such device, NVRTC or cuBLAS missing, ...); a run asked to use a GPU never
/// quietly runs on the CPU instead.
pub fn open_for_compute(spec: DeviceSpec) -> Result<(Compute, DeviceInfo), String> {
    let device = fanout_cuda::open(spec).map_err(|e| format!("--device {spec}: {e}"))?;
    let info = device.info();
    if device.is_cpu() {
        return Ok((Compute::Cpu, info));
    }
    Ok((cuda_backend(spec, device)?, info))
}

#[cfg(feature = "cuda")]
fn cuda_backend(spec: DeviceSpec, device: fanout_cuda::Device) -> Result<Compute, String> {
    let fanout_cuda::Device::Cuda(gpu) = &device else {
        return Err(format!("--device {spec}: not a CUDA device"));
    };
    fanout_cuda::CudaBackend::new(gpu)
        .map(Compute::Cuda)
        .map_err(|e| format!("--device {spec}: opened {}, but {e}", device.info()))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(spec: DeviceSpec, device: fanout_cuda::Device) -> Result<Compute, String> {
    // `open` refuses CUDA specs in a build without the feature; this is only reached if that
    // ever changes.
    Err(format!(
        "--device {spec}: opened {}, but this build has no CUDA compute path; rebuild with `{}`",
        device.info(),
        fanout_cuda::REBUILD_HINT
    ))
}
