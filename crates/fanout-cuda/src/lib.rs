//! fanout's CUDA device layer: which device a run computes on, and opening it.
//!
//! Always available, with or without CUDA:
//!
//! - [`DeviceSpec`]: the value of `--device` (`cpu`, `cuda`, `cuda:N`), parsed with errors that
//!   name the value and what is expected, and printed back in a form that parses to the same
//!   spec;
//! - [`open`]: turns a spec into a [`Device`]. `cpu` always opens. `cuda:N` opens only in a
//!   build with the `cuda` cargo feature and on a machine with the NVIDIA driver and a device
//!   `N`; otherwise it returns an [`Error`] that says which of those is missing and what to do;
//!   it never panics for a missing driver;
//! - [`DeviceInfo`]: a serde-serialisable summary of a device (kind, index, name, memory) for
//!   run metrics.
//!
//! With the `cuda` feature, the crate adds `CudaDevice` (a context on one GPU through the CUDA
//! driver API of [`cudarc`](https://docs.rs/cudarc), loaded at run time with `dlopen`, so
//! building needs no CUDA toolkit), pinned host buffers, streams, and `CudaBackend`: the
//! compute `Backend` on that GPU (cuBLAS products, CUDA C kernels compiled at run time by
//! NVRTC), and `CudaSampler`: k-hop (uniform, weighted) and PinSAGE random-walk sampling on
//! the GPU with Fused-Map remapping, the CPU samplers' batches bit for bit.

mod device;
mod error;
mod spec;

#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod sample;
#[cfg(feature = "cuda")]
mod sort;

pub use device::{open, Device, DeviceInfo, DeviceKind};
pub use error::Error;
pub use spec::{DeviceSpec, ParseDeviceError};

#[cfg(feature = "cuda")]
pub use backend::{nccl_present, nccl_unique_id, CudaBackend, CudaBlock, CudaTensor, GraphKernels};
#[cfg(feature = "cuda")]
pub use cuda::{cuda_device_count, driver_present, CudaDevice, PinnedBuffer, Stream};
#[cfg(feature = "cuda")]
pub use sample::{ArcsAt, CudaSampler};

/// Whether this build has the CUDA backend (the `cuda` cargo feature). When `false`, [`open`]
/// of a CUDA spec always returns [`Error::NotBuilt`].
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// The command that builds fanout with CUDA support, quoted in error messages.
pub const REBUILD_HINT: &str = "cargo build --release --features cuda";
