//! Feature rows in page-locked host memory that the GPU reads in place (`--feature-placement
//! uva`, `fanout_compute::Backend::map_host_rows`): the zero-copy route of PyG's and MorphGL's
//! UVA feature fetch, for tables that do not fit in device memory. Each batch's rows are
//! gathered by the same warp-per-row kernel as rows in device memory, reading over the bus;
//! nothing is gathered or copied on the host.

use super::kernels::launch;
use super::{CudaBackend, CudaTensor};
use cudarc::driver::{CudaContext, PinnedHostSlice};
use fanout_compute::{ComputeError, MappedRows, Result};
use std::sync::Arc;

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
    ) -> CudaTensor {
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
        let mut out = self.new_tensor(idx.len(), cols);
        if idx.is_empty() || cols == 0 {
            return out;
        }
        let uploaded;
        let ids = match self.resident_inputs(resident, idx) {
            Some(ids) => ids,
            None => {
                uploaded = self.to_device(idx);
                &uploaded
            }
        };
        let (x_rows, n, c32) = (rows as i64, idx.len() as i64, cols as i32);
        launch!(
            self.inner,
            "gather_rows_warp",
            idx.len() * 32,
            [&mapped.addr, &x_rows, ids, &mut out.data, &n, &c32]
        );
        out
    }
}
