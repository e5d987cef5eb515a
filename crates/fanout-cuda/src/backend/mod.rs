//! The CUDA compute backend (feature `cuda`): `fanout_compute::Backend` on one GPU.
//!
//! Tensors live in device memory ([`CudaTensor`]); dense products go to cuBLAS (FP32, no TF32),
//! everything else to the CUDA C kernels of `kernels.cu`, compiled with NVRTC once per process
//! and device. All work is queued on one stream, in order; host values (`download`, `dot`, the
//! loss, accuracy counts) wait for it. The one exception is the zero-copy gather of feature rows
//! from page-locked host memory (`mapped.rs`), queued on a side stream so that it crosses the
//! bus while the backend stream computes the step before; cudarc's per-buffer events order its
//! output before the first kernel that reads it.
//!
//! A device error inside a `Backend` method (out of memory, a failed launch) is returned as a
//! [`fanout_compute::DeviceFailure`] whose message names the CUDA call and the driver's error
//! ([`device_error`]); opening the backend and preparing blocks return errors too.

mod block;
mod deferred;
mod group;
pub(crate) mod kernels;
mod mapped;
mod ops;
mod profile;
mod staging;

pub use block::CudaBlock;
pub use group::{nccl_present, nccl_unique_id};

use crate::{CudaDevice, Error};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use fanout_compute::{DeviceFailure, DeviceResult, Tensor};
use kernels::Kernels;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// `fanout_compute::Backend` on one CUDA device.
///
/// Guarantees: every operation gives the values the trait documents; element-wise, row, graph
/// and optimiser kernels round as the CPU backend does (no fused multiply-add) and sum in the
/// same order where the CPU sums sequentially, so most results equal the CPU's bit for bit;
/// matrix products (cuBLAS), column sums and warp reductions sum in another order and agree
/// to rounding. Results are deterministic (no floating-point atomics: gradients flowing to
/// sources use the block's transpose; out-degrees are exact integer counts). Clones share the
/// device, stream and kernels.
#[derive(Clone)]
pub struct CudaBackend {
    inner: Arc<Inner>,
}

struct Inner {
    stream: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    blas: CudaBlas,
    index: u32,
    name: String,
    /// [`GraphKernels`] as its `u8` (switchable on a shared backend).
    graph_kernels: AtomicU8,
    profile: Option<profile::Profile>,
    staging: staging::Staging,
    /// The zero gate of ungated optimiser steps (`deferred.rs`).
    open_gate: std::sync::OnceLock<CudaSlice<f32>>,
    /// Page-locked buffers for reads started a step early (`deferred.rs`).
    reads: deferred::ReadBuffers,
    /// The NCCL group this backend joined (`group.rs`), if any.
    group: std::sync::OnceLock<group::Group>,
    /// The side stream of the zero-copy gather (`mapped.rs`), made on first use.
    side: std::sync::OnceLock<Arc<CudaStream>>,
    /// The most thread blocks of the zero-copy gather (`mapped.rs`); 0: no limit (the other
    /// gathers' grid, a warp per row up to 65,536 blocks).
    mapped_gather_blocks: u32,
}

impl Inner {
    /// Runs `f` (which queues work on the stream) inside a profile span named `name` when the
    /// backend is profiled, else just runs it.
    fn timed<R>(&self, name: &'static str, f: impl FnOnce() -> R) -> R {
        self.timed_work(name, profile::Work::None, f)
    }

    /// [`Inner::timed`] with the work the call does counted (bytes, operations).
    fn timed_work<R>(&self, name: &'static str, work: profile::Work, f: impl FnOnce() -> R) -> R {
        self.timed_on(&self.stream, name, work, f)
    }

    /// [`Inner::timed_work`] for work queued on `stream` (the backend's or its side stream;
    /// side-stream names start with `profile::SIDE`).
    fn timed_on<R>(
        &self,
        stream: &CudaStream,
        name: &'static str,
        work: profile::Work,
        f: impl FnOnce() -> R,
    ) -> R {
        match &self.profile {
            Some(p) => p.span(stream, name, work, f),
            None => f(),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            eprint!("{}", p.report());
        }
    }
}

/// Which kernels aggregate over a block's edges and gather rows.
///
/// Both give the same results bit for bit (each output element sums the same terms in the
/// same order); they differ only in how threads share the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphKernels {
    /// One thread per output element, each reading its row's edge ids and coefficients from
    /// global memory itself (the first kernels).
    Plain,
    /// FastGL's Memory-Aware aggregation (a warp per destination, its edges' ids and
    /// coefficients staged in shared memory, partial sums in registers) and a warp per
    /// gathered row with 16-byte copies. The default.
    MemoryAware,
}

impl GraphKernels {
    /// The choice named by `FANOUT_CUDA_GRAPH_KERNELS` (`plain` or `memory-aware`; a
    /// switch for measuring one against the other), else [`GraphKernels::MemoryAware`].
    fn from_env() -> Result<Self, Error> {
        match std::env::var("FANOUT_CUDA_GRAPH_KERNELS").as_deref() {
            Err(_) | Ok("") | Ok("memory-aware") => Ok(GraphKernels::MemoryAware),
            Ok("plain") => Ok(GraphKernels::Plain),
            Ok(other) => Err(Error::Setting {
                variable: "FANOUT_CUDA_GRAPH_KERNELS",
                value: other.to_string(),
                expected: "plain or memory-aware",
            }),
        }
    }
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CudaBackend(cuda:{} {})",
            self.inner.index, self.inner.name
        )
    }
}

impl CudaBackend {
    /// The backend on `device`: its default stream, a cuBLAS handle and the kernels (compiled
    /// on first use in this process). Errors: NVRTC or cuBLAS cannot be loaded (their
    /// libraries, `libnvrtc.so` and `libcublas.so`, must be on the library path), or the
    /// kernels do not compile or load.
    pub fn new(device: &CudaDevice) -> Result<Self, Error> {
        let ctx = device.context();
        keep_freed_memory(ctx)?;
        let kernels = kernels::kernels_for(ctx)?;
        let stream = ctx.default_stream();
        let blas = crate::cuda::guarded_any("cublasCreate", || CudaBlas::new(stream.clone()))?;
        Ok(CudaBackend {
            inner: Arc::new(Inner {
                stream,
                kernels,
                blas,
                index: device.index(),
                name: device.name().to_string(),
                graph_kernels: AtomicU8::new(GraphKernels::from_env()? as u8),
                profile: profile::Profile::from_env(),
                staging: staging::Staging::default(),
                open_gate: std::sync::OnceLock::new(),
                reads: deferred::ReadBuffers::default(),
                group: std::sync::OnceLock::new(),
                side: std::sync::OnceLock::new(),
                mapped_gather_blocks: mapped::gather_blocks(ctx)?,
            }),
        })
    }

    /// The device index (`N` of `cuda:N`).
    pub fn index(&self) -> u32 {
        self.inner.index
    }

    /// The kernels that aggregate and gather rows (see [`GraphKernels`]).
    pub fn graph_kernels(&self) -> GraphKernels {
        match self.inner.graph_kernels.load(Ordering::Relaxed) {
            0 => GraphKernels::Plain,
            _ => GraphKernels::MemoryAware,
        }
    }

    /// Switches the kernels that aggregate and gather rows, for this backend and its clones,
    /// from the next call on. The results do not change (see [`GraphKernels`]).
    pub fn set_graph_kernels(&self, kernels: GraphKernels) {
        self.inner
            .graph_kernels
            .store(kernels as u8, Ordering::Relaxed);
    }

    /// Blocks until all queued work has finished, on the backend stream and its side stream
    /// (for timing). `Err` when the device failed.
    pub fn synchronize(&self) -> DeviceResult<()> {
        for s in std::iter::once(&self.inner.stream).chain(self.inner.side.get()) {
            s.synchronize()
                .map_err(|e| device_error("cuStreamSynchronize", e))?;
        }
        Ok(())
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// The side stream (made on first use; see the module documentation). Work queued on it
    /// runs beside the backend stream's: a buffer written there is safe to read on the
    /// backend stream because cudarc records an event at each write and makes the reading
    /// stream wait for it (its event tracking, on by default, and active once a context has a
    /// second stream, which this one then has).
    pub(crate) fn side_stream(&self) -> DeviceResult<&Arc<CudaStream>> {
        if let Some(s) = self.inner.side.get() {
            return Ok(s);
        }
        let s = self
            .stream()
            .context()
            .new_stream()
            .map_err(|e| device_error("cuStreamCreate", e))?;
        // Another thread may have made one meanwhile: the first one made is kept.
        Ok(self.inner.side.get_or_init(|| s))
    }

    pub(crate) fn kernels(&self) -> &Kernels {
        &self.inner.kernels
    }

    /// `len` zeroed device elements (at least one is allocated: the driver refuses empty
    /// allocations).
    pub(crate) fn alloc<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> DeviceResult<CudaSlice<T>> {
        self.stream()
            .alloc_zeros(len.max(1))
            .map_err(|e| device_error("cuMemAlloc", e))
    }

    /// A device copy of `host` (one element more than nothing when empty). Uploads of
    /// `staging::STAGED_MIN` bytes and more pass through page-locked memory, so the call does
    /// not wait for the stream and the bytes cross at the bus's page-locked rate (see the
    /// `staging` module).
    pub(crate) fn to_device<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        host: &[T],
    ) -> DeviceResult<CudaSlice<T>> {
        self.to_device_on(self.stream(), "copy to device", host)
    }

    /// [`CudaBackend::to_device`] queued on `stream` (this backend's or its side stream), the
    /// copy timed as `name` when the backend is profiled.
    pub(crate) fn to_device_on<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        stream: &Arc<CudaStream>,
        name: &'static str,
        host: &[T],
    ) -> DeviceResult<CudaSlice<T>> {
        if host.is_empty() {
            return stream
                .alloc_zeros(1)
                .map_err(|e| device_error("cuMemAlloc", e));
        }
        let size = std::mem::size_of_val(host);
        if size >= staging::STAGED_MIN {
            if let Some(dev) = self.staged_upload(stream, name, host)? {
                return Ok(dev);
            }
        }
        let bytes = profile::Work::Bytes(size as f64);
        self.inner
            .timed_on(stream, name, bytes, || stream.clone_htod(host))
            .map_err(|e| device_error("cuMemcpyHtoD", e))
    }

    /// The first `len` elements of `dev`, copied to the host (waits for queued work).
    pub(crate) fn to_host<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaSlice<T>,
        len: usize,
    ) -> DeviceResult<Vec<T>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let bytes = profile::Work::Bytes((len * std::mem::size_of::<T>()) as f64);
        self.inner
            .timed_work("copy to host", bytes, || {
                self.stream().clone_dtoh(&dev.slice(0..len))
            })
            .map_err(|e| device_error("cuMemcpyDtoH", e))
    }

    /// The device address of `s` (for optional kernel arguments, passed as `u64`; 0 = null).
    /// Safe to pass to a kernel on this backend's one stream while `s` lives: frees are
    /// ordered on the same stream.
    pub(crate) fn addr<T>(&self, s: Option<&CudaSlice<T>>) -> u64 {
        s.map_or(0, |s| s.device_ptr(self.stream()).0)
    }
}

/// Makes the device's default memory pool keep the memory that is freed (as PyTorch's caching
/// allocator does) instead of handing it back to the driver at every synchronisation: every
/// kernel call allocates its output, and re-mapping freed memory at each training step costs
/// more than the kernels. Nothing to do on a device without stream-ordered allocation.
fn keep_freed_memory(ctx: &Arc<cudarc::driver::CudaContext>) -> Result<(), Error> {
    use cudarc::driver::{result, sys};
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    crate::cuda::guarded_any("cuMemPoolSetAttribute(release threshold)", || {
        let mut keep: u64 = u64::MAX;
        // SAFETY: the device handle comes from a live context; the attribute takes a u64.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device())?;
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        }
    })
}

/// A row-major `f32` matrix in device memory.
///
/// Guarantees: the buffer holds at least `rows * cols` elements (at least one: empty tensors
/// keep a one-element buffer); element `(r, c)` is at `r * cols + c`. Not `Clone`: a copy
/// is made on the device by `Backend::copy`, which can fail.
pub struct CudaTensor {
    rows: usize,
    cols: usize,
    data: CudaSlice<f32>,
}

impl CudaTensor {
    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaTensor({} x {})", self.rows, self.cols)
    }
}

impl CudaBackend {
    pub(crate) fn new_tensor(&self, rows: usize, cols: usize) -> DeviceResult<CudaTensor> {
        Ok(CudaTensor {
            rows,
            cols,
            data: self.alloc(rows * cols)?,
        })
    }

    pub(crate) fn tensor_from_host(&self, host: &Tensor) -> DeviceResult<CudaTensor> {
        Ok(CudaTensor {
            rows: host.rows(),
            cols: host.cols(),
            data: self.to_device(host.data())?,
        })
    }

    pub(crate) fn tensor_to_host(&self, t: &CudaTensor) -> DeviceResult<Tensor> {
        Ok(Tensor::new(t.rows, t.cols, self.to_host(&t.data, t.len())?))
    }
}

/// The failure of a backend method: a message naming the CUDA call that failed and the
/// driver's error, and for an exhausted device what needs less of its memory (see the module
/// documentation).
pub(crate) fn device_error(call: &str, e: impl fmt::Display) -> DeviceFailure {
    let e = e.to_string();
    let hint = if e.contains("OUT_OF_MEMORY") || e.contains("ALLOC_FAILED") {
        "; the GPU ran out of memory: a smaller batch size, fanouts, hidden size or feature \
         cache, or the features on the host (feature placement host), needs less of it"
    } else {
        ""
    };
    DeviceFailure::new(format!("CUDA {call} failed: {e}{hint}"))
}
