//! Feature rows in page-locked host memory that the GPU reads in place (`--feature-placement
//! uva`, `fanout_compute::Backend::map_host_rows`): the zero-copy route of PyG's and MorphGL's
//! UVA feature fetch, for tables that do not fit in device memory. Each batch's rows are
//! gathered by the same warp-per-row kernel as rows in device memory, reading over the bus;
//! nothing is gathered or copied on the host.
//!
//! The gather (with the upload of its ids, when the sampler did not leave them on the device)
//! is queued on the backend's side stream. A step's rows are gathered as soon as the trainer
//! asks for them, which with steps read a step late is while the device still computes the
//! step before: the bus and the compute overlap instead of taking turns on one stream. The
//! gathered rows are the same; the first kernel that reads them waits for the gather (the
//! event cudarc records at each write). The gather takes few thread blocks (two per
//! multiprocessor by default): each warp waits on the bus for its row, and a grid as large as
//! the rows would hold every multiprocessor's warp slots while it waits, leaving none to the
//! kernels it should run beside.

use super::{device_error, CudaBackend, CudaTensor};
use cudarc::driver::{CudaContext, PinnedHostSlice, PushKernelArg};
use fanout_compute::{ComputeError, DeviceResult, MappedRows, Result};
use std::sync::Arc;

/// Thread blocks of the zero-copy gather per multiprocessor, unless
/// `FANOUT_CUDA_MAPPED_GATHER_BLOCKS` says otherwise.
const BLOCKS_PER_SM: u32 = 2;

/// The thread blocks of the zero-copy gather on the device of `ctx`: `BLOCKS_PER_SM` per
/// multiprocessor, or per multiprocessor the number `FANOUT_CUDA_MAPPED_GATHER_BLOCKS` gives
/// (a switch for measuring; `0`: as many as the rows need, the grid of the other gathers).
pub(super) fn gather_blocks(ctx: &Arc<CudaContext>) -> std::result::Result<u32, crate::Error> {
    let per_sm = match std::env::var("FANOUT_CUDA_MAPPED_GATHER_BLOCKS").as_deref() {
        Err(_) | Ok("") => BLOCKS_PER_SM,
        Ok(v) => v.parse().map_err(|_| crate::Error::Setting {
            variable: "FANOUT_CUDA_MAPPED_GATHER_BLOCKS",
            value: v.to_string(),
            expected: "thread blocks per multiprocessor, a whole number (0: no limit)",
        })?,
    };
    let sms = crate::cuda::guarded_any("cuDeviceGetAttribute(multiprocessors)", || {
        ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
    })?;
    Ok(per_sm.saturating_mul(sms.max(1) as u32))
}

/// The page-locked, device-mapped table of a [`MappedRows`] made by a [`CudaBackend`].
struct HostMappedTable {
    /// Keeps the memory alive (and page-locked) while the table is shared.
    _buf: PinnedHostSlice<f32>,
    /// The address the kernels read the table at.
    addr: u64,
    /// The context that mapped it.
    ctx: Arc<CudaContext>,
    /// Elements in the table (`rows x cols` of its `MappedRows`, checked at each gather).
    len: usize,
}

impl Drop for HostMappedTable {
    fn drop(&mut self) {
        // Kernels read the table by address, which cudarc's tracking of the buffer does not
        // see: wait for every queued kernel before the memory is freed.
        let _ = self.ctx.synchronize();
    }
}

impl CudaBackend {
    /// See `fanout_compute::Backend::map_host_rows`.
    pub(crate) fn map_rows(
        &self,
        rows: usize,
        cols: usize,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<MappedRows> {
        let ctx = self.stream().context().clone();
        let len = rows
            .checked_mul(cols)
            .ok_or_else(|| ComputeError::Config(format!("a {rows} x {cols} table overflows")))?;
        let failed = |call: &str, e: &dyn std::fmt::Display| {
            ComputeError::Config(format!(
                "CUDA {call} failed for a {rows} x {cols} table in page-locked host memory \
                 ({:.0} MB): {e}; use feature placement host",
                (len * 4) as f64 / 1e6
            ))
        };
        // The table keeps the buffer alive as long as any clone of it lives, and its drop
        // waits for the kernels that read it.
        let (buf, addr) =
            crate::cuda::mapped_pinned(&ctx, len, fill).map_err(|(call, e)| failed(call, &e))?;
        let table = HostMappedTable {
            _buf: buf,
            addr,
            ctx,
            len,
        };
        Ok(MappedRows::new(rows, cols, Arc::new(table)))
    }

    /// See `fanout_compute::Backend::gather_mapped_rows`.
    pub(crate) fn gather_mapped(
        &self,
        table: &MappedRows,
        idx: &[u32],
        resident: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> DeviceResult<CudaTensor> {
        let (rows, cols) = table.shape();
        let mapped = table
            .table()
            .downcast_ref::<HostMappedTable>()
            .filter(|t| {
                t.ctx.ordinal() == self.stream().context().ordinal() && t.len == rows * cols
            })
            .unwrap_or_else(|| {
                panic!("gather_mapped_rows: a {rows} x {cols} table this device did not map")
            });
        super::ops::check_ids(idx, rows, "gather_mapped_rows");
        let side = self.side_stream()?;
        let len = idx.len() * cols;
        // Allocated on the side stream (not zeroed: the kernel writes every element), so that
        // nothing here waits for the backend stream's queued work.
        // SAFETY: every element of `out` is written by the gather below before any kernel
        // reads it (the empty case allocates one element that nothing reads).
        let data =
            unsafe { side.alloc::<f32>(len.max(1)) }.map_err(|e| device_error("cuMemAlloc", e))?;
        let mut out = CudaTensor {
            rows: idx.len(),
            cols,
            data,
        };
        if len == 0 {
            return Ok(out);
        }
        let uploaded;
        let ids = match self.resident_inputs(resident, idx) {
            Some(ids) => ids,
            None => {
                uploaded = self.to_device_on(side, "side: copy to device", idx)?;
                &uploaded
            }
        };
        let (x_rows, n, c32) = (rows as i64, idx.len() as i64, cols as i32);
        let func = self.kernels().get("gather_rows_warp");
        let mut b = side.launch_builder(func);
        b.arg(&mapped.addr)
            .arg(&x_rows)
            .arg(ids)
            .arg(&mut out.data)
            .arg(&n)
            .arg(&c32);
        let work = super::profile::Work::Bytes((len * 8) as f64);
        // The kernel strides over the rows by the grid's warps: any grid gathers them all.
        let mut cfg = super::kernels::grid(idx.len() * 32);
        if self.inner.mapped_gather_blocks > 0 {
            cfg.grid_dim.0 = cfg.grid_dim.0.min(self.inner.mapped_gather_blocks);
        }
        // SAFETY: the arguments are `gather_rows_warp`'s in kernels.cu: the mapped table's
        // address (read-only, `rows x cols`, alive while `table` is), its row count, `n` ids
        // (each below `rows`, checked above) and an output of `n x cols` elements.
        let launched = self
            .inner
            .timed_on(side, "side: gather_rows_warp", work, || unsafe {
                b.launch(cfg)
            });
        if let Err(e) = launched {
            return Err(device_error("launch gather_rows_warp", e));
        }
        Ok(out)
    }
}
