//! Uploads of a few kilobytes and up (a batch's ids, labels and blocks; feature rows gathered
//! on the host) pass through a ring of page-locked buffers instead of going straight from
//! pageable memory.
//!
//! A copy from pageable memory larger than the driver's own staging buffer makes the calling
//! thread wait for the copy's turn on the stream, behind every kernel queued before it: each
//! step's id upload stopped the host from queueing ahead. Copied into page-locked memory first
//! (a host `memcpy`), the upload is queued and the call returns at once; the device copies at
//! the bus's rate. A buffer is written again only after the copy that read it has finished (an
//! event per buffer).
//!
//! Uploads larger than one buffer ([`STAGED_MAX`]) go through the ring in buffer-sized chunks,
//! each copied into its buffer by every core (rayon) while the device reads the chunks before
//! it: the driver's own path for pageable memory copies on one thread and measured 7 GB/s on
//! an H200 machine whose bus takes 55 GB/s from page-locked memory. Uploads below the range,
//! or when page-locked memory cannot be had, take the plain path: staging only changes when
//! the host waits and how fast the bytes cross, never what arrives.

use super::{device_error, CudaBackend};
use cudarc::driver::{
    result, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, PinnedHostSlice,
};
use fanout_compute::DeviceResult;
use std::sync::{Arc, Mutex};

/// Buffers in the ring: an upload (or a chunk of one) waits for the copy four chunks back.
const STAGES: usize = 4;
/// Smaller uploads fit the driver's own staging and never wait.
pub(crate) const STAGED_MIN: usize = 64 << 10;
/// One buffer's size: larger uploads (feature rows gathered on the host) pass through the ring
/// in chunks of this many bytes, so the ring never holds more than `STAGES` of them.
pub(crate) const STAGED_MAX: usize = 32 << 20;
/// Bytes each core copies at a time into a buffer of a chunked upload.
const COPY_GRAIN: usize = 1 << 20;

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

impl Stage {
    /// Waits for the copy that last read this buffer, and grows the buffer to hold `bytes`;
    /// `None` when either fails (nothing is queued).
    fn ready(&mut self, backend: &CudaBackend, bytes: usize) -> Option<&mut [u8]> {
        if let Some(done) = self.done.take() {
            done.synchronize().ok()?;
        }
        if self.buf.as_ref().is_none_or(|b| b.len() < bytes) {
            self.buf = None;
            // SAFETY: only the first `bytes` bytes are read, after they are written.
            let buf = unsafe {
                backend
                    .stream()
                    .context()
                    .alloc_pinned::<u8>(bytes.next_power_of_two())
            };
            self.buf = Some(buf.ok()?);
        }
        self.buf.as_mut()?.as_mut_slice().ok()
    }
}

impl CudaBackend {
    /// A device copy of `host` queued on `stream`, passed through the ring's page-locked
    /// buffers, one buffer when it fits in [`STAGED_MAX`] bytes, else in chunks (see the module
    /// documentation); `None` (nothing queued) when a buffer cannot be had or waited for, and
    /// the caller then uploads `host` directly; `Err` when the device fails. Each chunk's copy
    /// is timed as `name` when the backend is profiled.
    pub(crate) fn staged_upload<T: DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        name: &'static str,
        host: &[T],
    ) -> DeviceResult<Option<CudaSlice<T>>> {
        let bytes = std::mem::size_of_val(host);
        if bytes == 0 {
            return Ok(None);
        }
        // SAFETY: `T` is a plain device type (`DeviceRepr`): its bytes are its value.
        let src = unsafe { std::slice::from_raw_parts(host.as_ptr().cast::<u8>(), bytes) };
        let chunk = bytes.min(STAGED_MAX);
        let mut ring = self
            .inner
            .staging
            .ring
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (stages, next) = &mut *ring;
        // Every buffer a chunked upload will use is had before anything is queued, so that a
        // failure leaves nothing half-copied.
        let used = bytes.div_ceil(chunk).min(STAGES);
        for k in 0..used {
            if stages[(*next + k) % STAGES].ready(self, chunk).is_none() {
                return Ok(None);
            }
        }
        // SAFETY: every element is written by the copies queued below, before any later work
        // on this stream reads it.
        let mut dst =
            unsafe { stream.alloc::<T>(host.len()) }.map_err(|e| device_error("cuMemAlloc", e))?;
        let (base, record) = dst.device_ptr_mut(stream);
        for (k, part) in src.chunks(chunk).enumerate() {
            let stage = &mut stages[*next];
            *next = (*next + 1) % STAGES;
            // Ready already, or waited for now: a failed wait on a buffer this upload queued
            // means the device failed.
            let Some(staged) = stage.ready(self, chunk) else {
                return Err(device_error(
                    "cuEventSynchronize",
                    "a staging buffer's copy did not finish",
                ));
            };
            let staged = &mut staged[..part.len()];
            if part.len() > COPY_GRAIN {
                // On the caller's rayon pool, with the ring locked: no job of that pool may
                // upload through this backend (none does: its other jobs gather and sample on
                // the host), or a worker waiting here could take it and lock the ring again.
                use rayon::prelude::*;
                staged
                    .par_chunks_mut(COPY_GRAIN)
                    .zip(part.par_chunks(COPY_GRAIN))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            } else {
                staged.copy_from_slice(part);
            }
            let work = super::profile::Work::Bytes(part.len() as f64);
            self.inner.timed_on(stream, name, work, || {
                let at = base + (k * chunk) as u64;
                // SAFETY: `dst` holds `bytes` bytes from `base`, this chunk is within them; the
                // page-locked source is not written again until the event recorded below has
                // completed.
                unsafe { result::memcpy_htod_async(at, &*staged, stream.cu_stream()) }
                    .map_err(|e| device_error("cuMemcpyHtoDAsync", e))
            })?;
            stage.done = Some(
                stream
                    .record_event(None)
                    .map_err(|e| device_error("cuEventRecord", e))?,
            );
        }
        drop(record);
        Ok(Some(dst))
    }
}
