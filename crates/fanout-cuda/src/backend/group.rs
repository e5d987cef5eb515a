//! A group of GPUs, one per worker, that sums gradients on the devices through NCCL
//! (`Backend::sum_over_group`), so data-parallel workers on several GPUs need not read their
//! gradients back to the host at every step.
//!
//! # The sum
//!
//! NCCL's own reductions (`ncclAllReduce`, `ncclReduceScatter`) do not fix the order in which
//! ranks' values are added, so their sums need not equal the host communicators' (which add
//! in rank order; see `fanout_comm`). The group therefore moves values with
//! `ncclAllGather` only, which copies bytes, and adds them on each device in rank order with
//! the `sum_slots` kernel: every rank gets the bits the host path would have given. An
//! all-gather moves `(N - 1) L` values into each of `N` devices for `L` gradient values (a
//! reduce-scatter then all-gather would move about `2 (N - 1) L / N`); gradients of GNNs are
//! small (a few MB), so the extra bytes cost little next to a step, and one collective with the
//! same call for one rank or many leaves less to go wrong.
//!
//! # Joining
//!
//! NCCL is loaded at run time (`libnccl.so`, as the driver is); [`nccl_present`] says whether
//! it can be. Rank 0 makes the group's id ([`nccl_unique_id`]), the caller hands it to every
//! rank through its host communicator, and every rank calls [`CudaBackend::join_group`]
//! (a collective: it returns once every rank has joined). NCCL refuses two ranks on one GPU.

use super::kernels::launch;
use super::{device_error, CudaBackend, CudaTensor};
use crate::Error;
use cudarc::nccl::safe::{Comm, Id};
use fanout_compute::DeviceResult;
use std::sync::Mutex;

/// The NCCL communicator of one rank, on its backend's stream.
pub(super) struct Group {
    /// Locked for each collective: NCCL allows a communicator on one thread at a time.
    comm: Mutex<NcclComm>,
    rank: usize,
    size: usize,
}

/// `cudarc`'s communicator, made `Send`.
struct NcclComm(Comm);

// SAFETY: an NCCL communicator may be used from any thread, one thread at a time (NCCL's
// thread-safety rules); `Group` keeps it behind a mutex and never hands it out.
unsafe impl Send for NcclComm {}

/// Whether the NCCL library (`libnccl.so`) can be loaded.
pub fn nccl_present() -> bool {
    // SAFETY: only tries to open the library; no NCCL function is called.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// A new NCCL group id (128 bytes) for [`CudaBackend::join_group`], made by one rank and sent
/// to the others. Errors: NCCL cannot be loaded or cannot make an id (no network interface).
pub fn nccl_unique_id() -> Result<Vec<u8>, Error> {
    if !nccl_present() {
        return Err(no_nccl());
    }
    let id = crate::cuda::guarded_any("ncclGetUniqueId", || {
        Id::new().map_err(|e| format!("{e:?}"))
    })?;
    Ok(id.internal().iter().map(|&c| c as u8).collect())
}

fn no_nccl() -> Error {
    Error::Driver {
        call: "dlopen(libnccl.so)",
        detail: "the NCCL library could not be loaded; install NCCL (libnccl2) or add the \
                 directory holding libnccl.so to LD_LIBRARY_PATH"
            .to_string(),
    }
}

impl CudaBackend {
    /// Joins rank `rank` of `size` to the NCCL group `id` (from [`nccl_unique_id`] on one
    /// rank); from then on [`fanout_compute::Backend::sum_over_group`] sums over the group on
    /// the devices. A collective: every rank must call it, each on its own GPU, and it returns
    /// once all have (a rank that never joins leaves the others waiting: NCCL's blocking join
    /// has no timeout). Errors: a bad id or rank, NCCL missing or refusing (two ranks on one
    /// GPU), a backend that already joined a group.
    pub fn join_group(&self, id: &[u8], rank: usize, size: usize) -> Result<(), Error> {
        let bad = |detail: String| Error::Driver {
            call: "ncclCommInitRank",
            detail,
        };
        let internal: [std::ffi::c_char; 128] = id
            .iter()
            .map(|&b| b as std::ffi::c_char)
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|_| bad(format!("a group id of {} bytes; expected 128", id.len())))?;
        if rank >= size {
            return Err(bad(format!("rank {rank} of a group of {size}")));
        }
        if self.inner.group.get().is_some() {
            return Err(bad("this backend already belongs to a group".to_string()));
        }
        if !nccl_present() {
            return Err(no_nccl());
        }
        let stream = self.stream().clone();
        // NCCL takes the communicator's GPU from the calling thread's current context.
        crate::cuda::guarded_any("cuCtxSetCurrent", || stream.context().bind_to_thread())?;
        let comm = crate::cuda::guarded_any("ncclCommInitRank", || {
            Comm::from_rank(stream, rank, size, Id::uninit(internal)).map_err(|e| format!("{e:?}"))
        })?;
        let group = Group {
            comm: Mutex::new(NcclComm(comm)),
            rank,
            size,
        };
        self.inner
            .group
            .set(group)
            .map_err(|_| bad("this backend already belongs to a group".to_string()))
    }

    /// The UUID of this backend's GPU (16 bytes, unique to the device), as the driver
    /// reports it: what tells ranks whether they share a GPU, whatever each one sees of the
    /// machine. Errors: the driver cannot read it.
    pub fn device_uuid(&self) -> Result<Vec<u8>, Error> {
        let ctx = self.stream().context().clone();
        let uuid = crate::cuda::guarded_any("cuDeviceGetUuid", || ctx.uuid())?;
        Ok(uuid.bytes.iter().map(|&b| b as u8).collect())
    }

    /// `(rank, size)` of the group this backend joined, if any.
    pub fn group_rank(&self) -> Option<(usize, usize)> {
        self.inner.group.get().map(|g| (g.rank, g.size))
    }

    /// The body of `Backend::sum_over_group`: `tensors` packed into one vector and multiplied
    /// by `scale_in`, every rank's vector gathered on every device, summed in rank order and
    /// multiplied by `scale_out` ([`CudaBackend::sum_rows_in_order`]), and unpacked. All on
    /// the stream; no host wait.
    pub(super) fn group_sum(
        &self,
        tensors: &mut [&mut CudaTensor],
        scale_in: f32,
        scale_out: f32,
    ) -> DeviceResult<()> {
        let Some(group) = self.inner.group.get() else {
            return Err(device_error(
                "sum_over_group",
                "this backend has joined no device group (join_group)",
            ));
        };
        let len: usize = tensors.iter().map(|t| t.len()).sum();
        if len == 0 {
            return Ok(());
        }
        let mut mine = self.alloc::<f32>(len)?;
        let mut at = 0;
        for t in tensors.iter() {
            let n = t.len();
            if n > 0 {
                let mut dst = mine.slice_mut(at..at + n);
                if let Err(e) = self.stream().memcpy_dtod(&t.data.slice(0..n), &mut dst) {
                    return Err(device_error("cuMemcpyDtoD (pack gradients)", e));
                }
            }
            at += n;
        }
        let n64 = len as i64;
        launch!(self.inner, "scale", len, [&mut mine, &scale_in, &n64]);
        let mut slots = self.new_tensor(group.size, len)?;
        {
            let comm = group.comm.lock().unwrap_or_else(|p| p.into_inner());
            let gathered = self.inner.timed("ncclAllGather", || {
                comm.0.all_gather(&mine, &mut slots.data)
            });
            if let Err(e) = gathered {
                return Err(device_error("ncclAllGather", format!("{e:?}")));
            }
        }
        drop(mine);
        let sum = self.sum_rows_in_order(&slots, scale_out)?;
        let mut at = 0;
        for t in tensors.iter_mut() {
            let n = t.len();
            if n > 0 {
                let mut dst = t.data.slice_mut(0..n);
                if let Err(e) = self
                    .stream()
                    .memcpy_dtod(&sum.data.slice(at..at + n), &mut dst)
                {
                    return Err(device_error("cuMemcpyDtoD (unpack gradients)", e));
                }
            }
            at += n;
        }
        Ok(())
    }

    /// `scale` times the sum of `x`'s rows, added in row order: element `c` of the one-row
    /// result is `scale * (((x[0][c] + x[1][c]) + x[2][c]) + ... + x[rows-1][c])`, the product
    /// after the adds (the `sum_slots` kernel), so with one row per rank it is the host
    /// communicators' sum, bit for bit. (`Backend::sum_rows` adds in another order.)
    pub fn sum_rows_in_order(&self, x: &CudaTensor, scale: f32) -> DeviceResult<CudaTensor> {
        let mut out = self.new_tensor(1, x.cols)?;
        if x.rows == 0 {
            return Ok(out);
        }
        let n64 = x.cols as i64;
        let rows = i32::try_from(x.rows).expect("sum_rows_in_order: at most 2^31 rows");
        launch!(
            self.inner,
            "sum_slots",
            x.cols,
            [&x.data, &mut out.data, &scale, &n64, &rows]
        );
        Ok(out)
    }
}
