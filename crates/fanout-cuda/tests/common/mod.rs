//! What the GPU tests share.

use fanout_cuda::{CudaBackend, CudaDevice};

/// A new backend on GPU 0, or `None` (printing why, so the test skips itself) without one.
/// A GPU that opens but whose backend cannot start fails the test: that is a failure, not a
/// skip.
pub fn gpu() -> Option<CudaBackend> {
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipped: no GPU here ({e})");
            return None;
        }
    };
    match CudaBackend::new(&dev) {
        Ok(b) => Some(b),
        Err(e) => panic!(
            "GPU 0 opened ({}) but the CUDA backend did not start: {e}",
            dev.name()
        ),
    }
}
