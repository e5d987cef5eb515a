//! Uploads of a few kilobytes to a few megabytes (a batch's ids, labels and blocks) pass
//! through a ring of page-locked buffers instead of going straight from pageable memory.
//!
//! A copy from pageable memory larger than the driver's own staging buffer makes the calling
//! thread wait for the copy's turn on the stream, behind every kernel queued before it: each
//! step's id upload stopped the host from queueing ahead. Copied into page-locked memory first
//! (a host `memcpy`), the upload is queued and the call returns at once; the device copies at
//! the bus's rate. A buffer is written again only after the copy that read it has finished (an
//! event per buffer). Uploads outside the range, or when page-locked memory cannot be had, take
//! the plain path: staging only changes when the host waits, never what arrives.

use super::{device_failed, CudaBackend};
use cudarc::driver::{result, CudaEvent, CudaSlice, DevicePtrMut, DeviceRepr, PinnedHostSlice};
use std::sync::Mutex;

/// Buffers in the ring: an upload waits for the copy four uploads back.
const STAGES: usize = 4;
/// Smaller uploads fit the driver's own staging and never wait.
pub(crate) const STAGED_MIN: usize = 64 << 10;
/// Larger uploads (feature rows gathered on the host) go straight from pageable memory: a
/// host copy of them would cost as much as the upload, and the ring stays small.
pub(crate) const STAGED_MAX: usize = 32 << 20;

/// One page-locked buffer and the event after the last copy that read it.
#[derive(Default)]
struct Stage {
    buf: Option<PinnedHostSlice<u8>>,
    done: Option<CudaEvent>,
}

impl Drop for Stage {
    fn drop(&mut self) {
        // The buffer is freed after this: let the copy reading it finish first.
        if let Some(done) = self.done.take() {
            let _ = done.synchronize();
        }
    }
}

/// The ring of one backend.
pub(crate) struct Staging {
    ring: Mutex<(Vec<Stage>, usize)>,
}

impl Default for Staging {
    fn default() -> Self {
        Staging {
            ring: Mutex::new(((0..STAGES).map(|_| Stage::default()).collect(), 0)),
        }
    }
}

impl CudaBackend {
    /// A device copy of `host` passed through the next page-locked buffer, or `None` (nothing
    /// queued) when that buffer cannot be had or waited for; the caller then uploads `host`
    /// directly.
    pub(crate) fn staged_upload<T: DeviceRepr>(&self, host: &[T]) -> Option<CudaSlice<T>> {
        let bytes = std::mem::size_of_val(host);
        let stream = self.stream();
        let mut ring = self
            .inner
            .staging
            .ring
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (stages, next) = &mut *ring;
        let stage = &mut stages[*next];
        *next = (*next + 1) % STAGES;
        if let Some(done) = stage.done.take() {
            done.synchronize().ok()?;
        }
        if stage.buf.as_ref().is_none_or(|b| b.len() < bytes) {
            stage.buf = None;
            // SAFETY: only the first `bytes` bytes are read, after they are written below.
            let buf = unsafe {
                stream
                    .context()
                    .alloc_pinned::<u8>(bytes.next_power_of_two())
            };
            stage.buf = Some(buf.ok()?);
        }
        let staged = stage.buf.as_mut()?.as_mut_slice().ok()?;
        // SAFETY: `T` is a plain device type (`DeviceRepr`): its bytes are its value.
        let src = unsafe { std::slice::from_raw_parts(host.as_ptr().cast::<u8>(), bytes) };
        staged[..bytes].copy_from_slice(src);
        // SAFETY: every element is written by the copy queued below, before any later work on
        // this stream reads it.
        let mut dst = unsafe { stream.alloc::<T>(host.len()) }
            .unwrap_or_else(|e| device_failed("cuMemAlloc", e));
        let work = super::profile::Work::Bytes(bytes as f64);
        self.inner.timed_work("copy to device (staged)", work, || {
            let (ptr, _record) = dst.device_ptr_mut(stream);
            // SAFETY: `dst` holds `bytes` bytes; the page-locked source is not written again
            // until the event recorded below has completed.
            unsafe { result::memcpy_htod_async(ptr, &staged[..bytes], stream.cu_stream()) }
                .unwrap_or_else(|e| device_failed("cuMemcpyHtoDAsync", e));
        });
        stage.done = Some(
            stream
                .record_event(None)
                .unwrap_or_else(|e| device_failed("cuEventRecord", e)),
        );
        Some(dst)
    }
}
