//! `--device` of the commands that compute (`train`, `eval`).

use fanout_cuda::{Device, DeviceSpec};

/// Opens the device `--device` names for computing.
///
/// Only the CPU compute path exists so far: a CUDA device that opens is still refused, with an
/// error, so that a run asked to use a GPU never quietly runs on the CPU instead. Errors read
/// `--device SPEC: why` (no CUDA in this build, no driver, no such device, ...).
pub fn open_for_compute(spec: DeviceSpec) -> Result<Device, String> {
    let device = fanout_cuda::open(spec).map_err(|e| format!("--device {spec}: {e}"))?;
    if device.is_cpu() {
        return Ok(device);
    }
    Err(format!(
        "--device {spec}: opened {}, but the CUDA compute path is not implemented in this build \
         (its kernels must first be verified on a GPU); use --device cpu",
        device.info()
    ))
}
