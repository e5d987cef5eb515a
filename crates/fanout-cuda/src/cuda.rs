//! The CUDA device (feature `cuda`): a context on one GPU through the dynamically loaded CUDA
//! driver API, plus pinned host buffers and streams on it.
//!
//! Every driver call goes through [`guarded`], which turns both driver errors and panics of
//! the binding layer (cudarc panics when the library or one of its symbols is missing) into
//! [`Error`]s. Before the first call, [`driver_present`] checks that `libcuda` loads at all, so
//! the common "no driver" case returns [`Error::NoDriver`] without a panic being raised.

use crate::{DeviceInfo, DeviceKind, DeviceSpec, Error};
use cudarc::driver::{
    sys, CudaContext, CudaStream, DeviceRepr, DriverError, PinnedHostSlice, ValidAsZeroBits,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Runs driver call(s) `f`, mapping a driver error or a panic inside the bindings to
/// [`Error::Driver`] named after `call`.
fn guarded<T>(call: &'static str, f: impl FnOnce() -> Result<T, DriverError>) -> Result<T, Error> {
    guarded_any(call, f)
}

/// [`guarded`] for any library whose errors display (NVRTC, cuBLAS, or a message): its error
/// or a panic inside the bindings (a missing library or symbol) becomes [`Error::Driver`].
pub(crate) fn guarded_any<T, E: std::fmt::Display>(
    call: &'static str,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, Error> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::Driver {
            call,
            detail: e.to_string(),
        }),
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(Error::Driver {
                call,
                detail: format!("the CUDA driver bindings failed: {msg}"),
            })
        }
    }
}

/// Whether the CUDA driver library (`libcuda.so` or one of the versioned names cudarc tries)
/// can be loaded from the library search path. Loads and unloads it; calls no CUDA function.
pub fn driver_present() -> bool {
    // SAFETY: loading libcuda runs its initialisers, which is what any CUDA program does; the
    // handle is closed again right away and no symbol from it is used.
    unsafe { sys::is_culib_present() }
}

fn no_driver() -> Error {
    Error::NoDriver {
        searched: cudarc::get_lib_name_candidates("cuda"),
    }
}

/// The number of CUDA devices the driver reports (after `cuInit`).
///
/// Errors: [`Error::NoDriver`] without a loadable driver, [`Error::Driver`] when `cuInit` or
/// `cuDeviceGetCount` fails (a driver that sees no GPU fails `cuInit` with
/// `CUDA_ERROR_NO_DEVICE`).
pub fn cuda_device_count() -> Result<usize, Error> {
    if !driver_present() {
        return Err(no_driver());
    }
    let n = guarded("cuInit/cuDeviceGetCount", CudaContext::device_count)?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// A context on one CUDA device (the device's primary context, as the CUDA runtime uses).
///
/// Guarantees: the device exists, its context was created and made current on the thread that
/// opened it, and `name` and `total_memory` were read from the driver. Dropping the last clone
/// of [`context`](Self::context) releases the context.
#[derive(Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    index: u32,
    name: String,
    total_memory: u64,
}

impl CudaDevice {
    /// Opens device `index`: see [`open`](crate::open) for the errors.
    pub fn open(index: u32) -> Result<Self, Error> {
        let count = cuda_device_count()?;
        if index as usize >= count {
            return Err(Error::NoSuchDevice { index, count });
        }
        let ctx = guarded("cuDevicePrimaryCtxRetain", || {
            CudaContext::new(index as usize)
        })?;
        let name = guarded("cuDeviceGetName", || ctx.name())?;
        let total = guarded("cuDeviceTotalMem", || ctx.total_mem())?;
        Ok(CudaDevice {
            ctx,
            index,
            name,
            total_memory: total as u64,
        })
    }

    /// The device index (`N` of `cuda:N`).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The device's model name, as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's total memory in bytes.
    pub fn total_memory(&self) -> u64 {
        self.total_memory
    }

    /// The device's free memory in bytes now (`cuMemGetInfo`; binds the context to the
    /// calling thread).
    pub fn free_memory(&self) -> Result<u64, Error> {
        let (free, _total) = guarded("cuMemGetInfo", || self.ctx.mem_get_info())?;
        Ok(free as u64)
    }

    /// A summary of the device; `free_memory_bytes` is `None` if the query failed.
    pub fn info(&self) -> DeviceInfo {
        DeviceInfo {
            device: DeviceSpec::Cuda(self.index).to_string(),
            kind: DeviceKind::Cuda,
            index: Some(self.index),
            name: self.name.clone(),
            total_memory_bytes: Some(self.total_memory),
            free_memory_bytes: self.free_memory().ok(),
        }
    }

    /// The cudarc context, for the compute code built on this device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A new (non-default) stream on this device. Work queued on it runs in order; work on
    /// different streams may overlap.
    pub fn new_stream(&self) -> Result<Stream, Error> {
        guarded("cuStreamCreate", || self.ctx.new_stream()).map(Stream)
    }

    /// `len` zeroed elements of page-locked host memory, allocated with
    /// `CU_MEMHOSTALLOC_DEVICEMAP`: copies from and to it run at full PCIe/NVLink speed and
    /// asynchronously, and (with unified addressing, which every 64-bit CUDA platform has)
    /// kernels can read it in place through the same pointer.
    ///
    /// Errors: the byte size overflows, or the driver refuses the allocation (out of page-locked
    /// memory; a zero `len` may be refused too).
    pub fn pinned_zeroed<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<PinnedBuffer<T>, Error> {
        let call = "cuMemHostAlloc";
        if len.checked_mul(std::mem::size_of::<T>()).is_none() {
            return Err(Error::Driver {
                call,
                detail: format!("{len} elements overflow the byte size"),
            });
        }
        guarded(call, || {
            // SAFETY: the memory is uninitialised until the write_bytes below, and nothing
            // reads it before; T: ValidAsZeroBits makes all-zero bytes a valid T.
            let mut buf = unsafe {
                self.ctx
                    .alloc_pinned_with_flags::<T>(len, sys::CU_MEMHOSTALLOC_DEVICEMAP)?
            };
            let p = buf.as_mut_ptr()?;
            // SAFETY: p points to `len` elements owned by `buf`.
            unsafe { std::ptr::write_bytes(p, 0, len) };
            Ok(PinnedBuffer(buf))
        })
    }
}

/// Page-locked host memory of `T`s on a device's context (see
/// [`CudaDevice::pinned_zeroed`]). The accessors wait for work queued on it to finish first.
#[derive(Debug)]
pub struct PinnedBuffer<T>(PinnedHostSlice<T>);

impl<T: ValidAsZeroBits> PinnedBuffer<T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The elements, after any queued copy into or out of the buffer has finished.
    pub fn as_slice(&self) -> Result<&[T], Error> {
        guarded("cuEventSynchronize", || self.0.as_slice())
    }

    /// The elements, mutable, after any queued copy has finished.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T], Error> {
        guarded("cuEventSynchronize", || self.0.as_mut_slice())
    }

    /// The cudarc buffer, for stream copies (`memcpy_htod` and friends).
    pub fn inner(&self) -> &PinnedHostSlice<T> {
        &self.0
    }

    /// The cudarc buffer, mutable, for stream copies into it.
    pub fn inner_mut(&mut self) -> &mut PinnedHostSlice<T> {
        &mut self.0
    }
}

/// A CUDA stream: an in-order queue of device work (see [`CudaDevice::new_stream`]).
#[derive(Debug, Clone)]
pub struct Stream(Arc<CudaStream>);

impl Stream {
    /// Blocks until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<(), Error> {
        guarded("cuStreamSynchronize", || self.0.synchronize())
    }

    /// The cudarc stream, for launches and copies.
    pub fn inner(&self) -> &Arc<CudaStream> {
        &self.0
    }
}

/// Page-locked host memory of `len` elements (at least one) mapped into `ctx`'s device address
/// space, zeroed, its first `len` elements handed to `fill`, and the address kernels read it at:
/// the zero-copy buffers of `uva` features and `uva` sampling. `Err` names the failed call.
/// Kernels read the buffer by address, which cudarc's event tracking does not see: whoever
/// holds it must wait for their work before dropping it.
pub(crate) fn mapped_pinned<T: DeviceRepr + ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    len: usize,
    fill: impl FnOnce(&mut [T]),
) -> Result<(PinnedHostSlice<T>, u64), (&'static str, DriverError)> {
    // SAFETY: the whole buffer is zeroed (a valid `T`: `ValidAsZeroBits`) before anything
    // reads it.
    let mut buf =
        unsafe { ctx.alloc_pinned_with_flags::<T>(len.max(1), sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .map_err(|e| ("cuMemHostAlloc", e))?;
    let host = buf.as_mut_slice().map_err(|e| ("cuEventSynchronize", e))?;
    // SAFETY: `host` is `host.len()` writable elements, and all-zero bytes are a valid `T`.
    unsafe { std::ptr::write_bytes(host.as_mut_ptr(), 0, host.len()) };
    fill(&mut host[..len]);
    let ptr = host.as_mut_ptr();
    // `fill` may have made another context current on this thread.
    ctx.bind_to_thread().map_err(|e| ("cuCtxSetCurrent", e))?;
    let mut addr: sys::CUdeviceptr = 0;
    // SAFETY: `ptr` starts a live allocation made with CU_MEMHOSTALLOC_DEVICEMAP in this
    // context, which `buf` keeps alive; the caller holds `buf` as long as kernels read `addr`.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut addr, ptr.cast(), 0) }
        .result()
        .map_err(|e| ("cuMemHostGetDevicePointer", e))?;
    Ok((buf, addr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::open;

    /// The device count, or `None` (printing why) when this machine has no usable GPU.
    fn gpus() -> Option<usize> {
        match cuda_device_count() {
            Ok(n) if n > 0 => Some(n),
            Ok(_) => {
                eprintln!("skipped: the CUDA driver reports no devices");
                None
            }
            Err(e) => {
                eprintln!("skipped: no GPU here ({e})");
                None
            }
        }
    }

    #[test]
    fn open_cuda_errors_without_a_driver_and_describes_a_gpu_with_one() {
        const { assert!(crate::CUDA_BUILT) };
        let r = open(DeviceSpec::Cuda(0));
        if !driver_present() {
            let m = r.unwrap_err().to_string();
            assert!(m.starts_with("no CUDA driver found (libcuda.so): "), "{m}");
            assert!(matches!(
                cuda_device_count(),
                Err(Error::NoDriver { searched }) if searched.iter().any(|s| s == "libcuda.so")
            ));
            return;
        }
        let Some(_) = gpus() else {
            // A driver without a GPU: open fails with a driver error, without panicking.
            assert!(r.is_err());
            return;
        };
        let d = r.unwrap();
        assert_eq!(d.spec(), DeviceSpec::Cuda(0));
        let info = d.info();
        eprintln!("{info}");
        assert_eq!((info.kind, info.index), (DeviceKind::Cuda, Some(0)));
        assert_eq!(info.device, "cuda:0");
        assert!(!info.name.is_empty());
        let total = info.total_memory_bytes.unwrap();
        let free = info.free_memory_bytes.unwrap();
        assert!(total > 0 && free > 0 && free <= total, "{info:?}");
    }

    #[test]
    fn an_index_past_the_device_count_is_named() {
        let Some(n) = gpus() else { return };
        let e = open(DeviceSpec::Cuda(n as u32)).unwrap_err();
        assert_eq!(
            e,
            Error::NoSuchDevice {
                index: n as u32,
                count: n
            }
        );
        let m = e.to_string();
        assert!(m.contains(&format!("cuda:{n}")), "{m}");
    }

    #[test]
    fn pinned_buffers_and_streams_work_on_a_gpu() {
        let Some(_) = gpus() else { return };
        let d = CudaDevice::open(0).unwrap();
        let mut b = d.pinned_zeroed::<u32>(1000).unwrap();
        assert_eq!(b.len(), 1000);
        assert!(b.as_slice().unwrap().iter().all(|&v| v == 0));
        b.as_mut_slice().unwrap()[999] = 7;
        assert_eq!(b.as_slice().unwrap()[999], 7);
        let s = d.new_stream().unwrap();
        s.synchronize().unwrap();
        assert!(d.pinned_zeroed::<u64>(usize::MAX).is_err());
    }
}
