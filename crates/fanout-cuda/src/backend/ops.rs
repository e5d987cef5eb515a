//! `impl Backend for CudaBackend`: shape checks on the host, the work in `kernels.cu` or cuBLAS.

use super::block::CudaBlock;
use super::kernels::{launch, launch_with, THREADS};
use super::{device_error, CudaBackend, CudaTensor, GraphKernels};
use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use fanout_compute::{
    check_labels, dropout_threshold, AdamUpdate, Aggregation, Backend, BlockDims, BlockRef,
    CrossEntropy, DeviceResult, DropoutSpec, MappedRows, PendingRead, Result, SgdUpdate,
    StepFigures, Tensor,
};

/// Rows summed per thread and pass by the column-sum kernel.
const COL_SUM_CHUNK: usize = 32;
/// Blocks of the f64 dot product's partial sums (a fixed grid: the result does not depend on
/// the size of the device).
const DOT_BLOCKS: usize = 256;

fn same_shape(what: &str, a: &CudaTensor, b: &CudaTensor) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes differ");
}

fn heads_split(cols: usize, heads: usize, what: &str) -> usize {
    assert!(
        heads > 0 && cols.is_multiple_of(heads),
        "{what}: {cols} columns do not split into {heads} heads"
    );
    cols / heads
}

/// Panics (as the `Backend` contract says) when an id of `idx` is `rows` or more; `what` names
/// the operation.
pub(crate) fn check_ids(idx: &[u32], rows: usize, what: &str) {
    if let Some(&bad) = idx.iter().find(|&&i| i as usize >= rows) {
        panic!("{what}: index {bad} out of range for {rows} rows");
    }
}

/// Warps (destinations) per thread block of the Memory-Aware aggregation (`MA_WARPS` in
/// kernels.cu; the paper's X = 8 targets).
const MA_WARPS: usize = 8;
/// The most coefficient columns (attention heads) the Memory-Aware kernel stages: 8 warps x 32
/// edges x (1 + heads) words stay within 48 KiB of shared memory. More heads take the plain
/// kernel.
const MA_MAX_HEADS: usize = 32;

impl CudaBackend {
    /// Whether aggregations with `heads` coefficient columns use the Memory-Aware kernel: it
    /// is chosen and its shared memory (32 x (1 + heads) words per warp) stays within the 48 KiB
    /// every device allows a block without opting in.
    fn memory_aware(&self, heads: usize) -> bool {
        self.graph_kernels() == GraphKernels::MemoryAware && heads <= MA_MAX_HEADS
    }

    /// 1 when the Memory-Aware kernels are chosen, segments of `width` floats can be read 16
    /// bytes at a time (a multiple of 4), and every buffer starts 16-byte aligned; else 0 (the
    /// kernels' `vec` argument).
    fn vec4(&self, width: usize, buffers: &[&CudaSlice<f32>]) -> i32 {
        let aligned = buffers
            .iter()
            .all(|b| self.addr(Some(b)).is_multiple_of(16));
        (self.graph_kernels() == GraphKernels::MemoryAware && width.is_multiple_of(4) && aligned)
            as i32
    }

    /// `out = sum over each row's edges of coeff * x[nbr]` with the Memory-Aware kernel
    /// (`spmm_ma`, or `spmm_ma4` with 16-byte reads where [`CudaBackend::vec4`] allows, in
    /// kernels.cu): `ptr`/`nbr` are a block's CSR (forward, `eid` 0) or its
    /// transpose (backward, `eid` the transpose's edge ids); `coeff` is a device address or 0.
    #[allow(clippy::too_many_arguments)]
    fn spmm_ma(
        &self,
        ptr: &CudaSlice<u32>,
        nbr: &CudaSlice<u32>,
        eid: u64,
        coeff: u64,
        heads: usize,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> DeviceResult<()> {
        if out.rows == 0 || out.cols == 0 {
            return Ok(());
        }
        let (h32, rows, cols) = (heads as i32, out.rows as i64, out.cols as i32);
        let blocks = out.rows.div_ceil(MA_WARPS).clamp(1, 1 << 16) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (32 * MA_WARPS as u32, 1, 1),
            shared_mem_bytes: (MA_WARPS * 32 * (1 + heads) * 4) as u32,
        };
        // The two kernels take the same arguments; `launch_with!` names its kernel by literal.
        macro_rules! launch_ma {
            ($name:literal) => {
                launch_with!(
                    self.inner,
                    $name,
                    cfg,
                    [
                        ptr,
                        nbr,
                        &eid,
                        &coeff,
                        &h32,
                        &x.data,
                        &mut out.data,
                        &rows,
                        &cols
                    ]
                )
            };
        }
        if self.vec4(out.cols, &[&x.data, &out.data]) == 1 {
            launch_ma!("spmm_ma4");
        } else {
            launch_ma!("spmm_ma");
        }
        Ok(())
    }

    /// `x`'s rows at the first `n` of the device ids `ids`, gathered on the device (a warp per
    /// row). Ids are not checked on the host: an id of `x`'s row count or more gives a row of
    /// zeros. Panics when `ids` holds fewer than `n` elements.
    pub fn gather_rows_device(
        &self,
        x: &CudaTensor,
        ids: &CudaSlice<u32>,
        n: usize,
    ) -> DeviceResult<CudaTensor> {
        assert!(
            ids.len() >= n,
            "gather_rows_device: {n} rows asked of {} ids",
            ids.len()
        );
        let mut out = self.new_tensor(n, x.cols)?;
        if n == 0 || x.cols == 0 {
            return Ok(out);
        }
        let (x_rows, n64, cols) = (x.rows as i64, n as i64, x.cols as i32);
        launch!(
            self.inner,
            "gather_rows_warp",
            n * 32,
            [&x.data, &x_rows, ids, &mut out.data, &n64, &cols]
        );
        Ok(out)
    }

    /// A device copy of the ids `host` (for [`CudaBackend::gather_rows_device`]).
    pub fn upload_ids(&self, host: &[u32]) -> DeviceResult<CudaSlice<u32>> {
        self.to_device(host)
    }

    /// Each row's dropout seed, `mix_keys([key, id])` with `id` the row's vertex
    /// (`row_ids[r]`) or its index, computed on the device (the ids uploaded, 4 bytes a row).
    fn dropout_seeds(
        &self,
        rows: usize,
        key: u64,
        row_ids: Option<&[u32]>,
    ) -> DeviceResult<CudaSlice<u64>> {
        let ids = match row_ids {
            Some(ids) => {
                assert!(
                    ids.len() >= rows,
                    "dropout: {} row ids for {rows} rows",
                    ids.len()
                );
                Some(self.to_device(&ids[..rows])?)
            }
            None => None,
        };
        let ids_addr = self.addr(ids.as_ref());
        let mut seeds = self.alloc::<u64>(rows)?;
        let r64 = rows as i64;
        launch!(
            self.inner,
            "dropout_seeds",
            rows,
            [&ids_addr, &key, &r64, &mut seeds]
        );
        Ok(seeds)
    }

    /// The [`DOT_BLOCKS`] partial sums of `a . b` in f64 (`dot_partials`), on the device.
    fn dot_partials(&self, a: &CudaTensor, b: &CudaTensor) -> DeviceResult<CudaSlice<f64>> {
        same_shape("dot", a, b);
        let mut partial = self.alloc::<f64>(DOT_BLOCKS)?;
        let n = a.len() as i64;
        let cfg = LaunchConfig {
            grid_dim: (DOT_BLOCKS as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let func = self.inner.kernels.get("dot_partials");
        let mut l = self.stream().launch_builder(func);
        l.arg(&a.data).arg(&b.data).arg(&mut partial).arg(&n);
        // SAFETY: dot_partials(const float*, const float*, double*, i64) with DOT_BLOCKS
        // partials and blocks of THREADS (= 256, the kernel's shared buffer) threads.
        if let Err(e) = self
            .inner
            .timed("dot_partials", || unsafe { l.launch(cfg) })
        {
            return Err(device_error("launch dot_partials", e));
        }
        Ok(partial)
    }

    /// `labels` as the loss kernels read them, on the device: `i32`, anything outside `i32`
    /// as -1 (unlabelled; the loss checks its labels before).
    pub(super) fn labels_to_device(&self, labels: &[i64]) -> DeviceResult<CudaSlice<i32>> {
        let lab: Vec<i32> = labels
            .iter()
            .map(|&l| i32::try_from(l).unwrap_or(-1))
            .collect();
        self.to_device(&lab)
    }

    /// `softmax_xent`: writes the mean loss's gradient (over `count` labelled rows) into
    /// `grad` and returns each row's loss (f64, 0 for unlabelled rows), on the device.
    pub(super) fn xent_rows(
        &self,
        logits: &CudaTensor,
        lab_d: &CudaSlice<i32>,
        count: usize,
        grad: &mut CudaTensor,
    ) -> DeviceResult<CudaSlice<f64>> {
        let mut row_loss = self.alloc::<f64>(logits.rows)?;
        let inv = 1.0 / count as f32;
        let (r64, c32) = (logits.rows as i64, logits.cols as i32);
        launch!(
            self.inner,
            "softmax_xent",
            logits.rows,
            [
                &logits.data,
                lab_d,
                &inv,
                &mut grad.data,
                &mut row_loss,
                &r64,
                &c32
            ]
        );
        Ok(row_loss)
    }

    /// The labelled count, the mean loss's gradient, and each row's loss and hit on the device
    /// (`None` when no row is labelled): the kernels `loss_and_accuracy` and
    /// `loss_and_accuracy_on_device` share. `Err` as `check_labels`.
    #[allow(clippy::type_complexity)]
    pub(super) fn loss_and_hits(
        &self,
        logits: &CudaTensor,
        labels: &[i64],
    ) -> Result<(usize, CudaTensor, Option<(CudaSlice<f64>, CudaSlice<i32>)>)> {
        let (rows, classes) = logits.shape();
        let count = check_labels(rows, classes, labels)?;
        let mut grad = self.new_tensor(rows, classes)?;
        if count == 0 {
            return Ok((count, grad, None));
        }
        let lab_d = self.labels_to_device(labels)?;
        let row_loss = self.xent_rows(logits, &lab_d, count, &mut grad)?;
        let hit = self.hits(logits, &lab_d)?;
        Ok((count, grad, Some((row_loss, hit))))
    }

    /// `argmax_hits`: 1 for each row whose first arg-max is its label, else 0, on the device.
    pub(super) fn hits(
        &self,
        logits: &CudaTensor,
        lab_d: &CudaSlice<i32>,
    ) -> DeviceResult<CudaSlice<i32>> {
        let mut hit = self.alloc::<i32>(logits.rows)?;
        let (r64, c32) = (logits.rows as i64, logits.cols as i32);
        launch!(
            self.inner,
            "argmax_hits",
            logits.rows,
            [&logits.data, lab_d, &mut hit, &r64, &c32]
        );
        Ok(hit)
    }

    /// Column sums (`1 x cols`) by passes of [`COL_SUM_CHUNK`] rows.
    fn col_sums(&self, x: &CudaTensor) -> DeviceResult<CudaTensor> {
        let (mut rows, cols) = x.shape();
        let mut cur: Option<CudaTensor> = None;
        loop {
            let src = cur.as_ref().unwrap_or(x);
            let chunks = rows.div_ceil(COL_SUM_CHUNK).max(1);
            let mut o = self.new_tensor(chunks, cols)?;
            let (r64, c32, ch) = (rows as i64, cols as i32, COL_SUM_CHUNK as i32);
            launch!(
                self.inner,
                "col_sum_chunks",
                chunks * cols,
                [&src.data, &mut o.data, &r64, &c32, &ch]
            );
            rows = chunks;
            cur = Some(o);
            if rows == 1 {
                return Ok(cur.expect("set above"));
            }
        }
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Block = CudaBlock;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn free_memory(&self) -> Option<u64> {
        self.stream()
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, _)| free as u64)
    }

    // ----- memory -----

    fn upload(&self, host: &Tensor) -> DeviceResult<CudaTensor> {
        self.tensor_from_host(host)
    }
    fn download(&self, t: &CudaTensor) -> DeviceResult<Tensor> {
        self.tensor_to_host(t)
    }
    fn zeros(&self, rows: usize, cols: usize) -> DeviceResult<CudaTensor> {
        self.new_tensor(rows, cols)
    }
    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        t.shape()
    }
    fn fill_zero(&self, t: &mut CudaTensor) -> DeviceResult<()> {
        if let Err(e) = self.stream().memset_zeros(&mut t.data) {
            return Err(device_error("cuMemsetD8", e));
        }
        Ok(())
    }
    fn prepare_block(&self, block: &BlockRef<'_>) -> Result<CudaBlock> {
        block.validate()?;
        Ok(self.upload_block(block)?)
    }
    fn adopt_blocks(
        &self,
        resident: &(dyn std::any::Any + Send + Sync),
        blocks: &[BlockRef<'_>],
    ) -> DeviceResult<Option<Vec<CudaBlock>>> {
        CudaBackend::adopt_blocks(self, resident, blocks)
    }
    fn block_dims(&self, block: &CudaBlock) -> BlockDims {
        block.0.dims
    }

    // ----- dense -----

    fn gemm(
        &self,
        alpha: f32,
        a: &CudaTensor,
        trans_a: bool,
        b: &CudaTensor,
        trans_b: bool,
        beta: f32,
        c: &mut CudaTensor,
    ) -> DeviceResult<()> {
        let (m, k) = if trans_a {
            (a.cols, a.rows)
        } else {
            (a.rows, a.cols)
        };
        let (kb, n) = if trans_b {
            (b.cols, b.rows)
        } else {
            (b.rows, b.cols)
        };
        assert_eq!(k, kb, "gemm: inner dimensions {k} and {kb} differ");
        assert_eq!(
            c.shape(),
            (m, n),
            "gemm: C is {:?}, expected {:?}",
            c.shape(),
            (m, n)
        );
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            if beta == 0.0 {
                self.fill_zero(c)?;
            } else {
                self.scale(c, beta)?;
            }
            return Ok(());
        }
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B's
        // buffer first (leading dimension = B's row length) and A's second.
        let op = |t| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let cfg = GemmConfig {
            transa: op(trans_b),
            transb: op(trans_a),
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha,
            lda: b.cols.max(1) as i32,
            ldb: a.cols.max(1) as i32,
            beta,
            ldc: n as i32,
        };
        // SAFETY: the shapes above make every matrix cuBLAS reads or writes lie inside the
        // buffers (lda/ldb/ldc are the row lengths of the row-major operands).
        let product = || unsafe { self.inner.blas.gemm(cfg, &b.data, &a.data, &mut c.data) };
        let flops = super::profile::Work::Flops(2.0 * (m * n * k) as f64);
        if let Err(e) = self.inner.timed_work("cublasSgemm", flops, product) {
            return Err(device_error("cublasSgemm", e));
        }
        Ok(())
    }
    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaTensor) -> DeviceResult<()> {
        assert_eq!(bias.shape(), (1, x.cols), "add_bias: bias shape");
        let (n, cols) = (x.len() as i64, x.cols as i32);
        launch!(
            self.inner,
            "add_bias",
            x.len(),
            [&mut x.data, &bias.data, &n, &cols]
        );
        Ok(())
    }
    fn sum_rows(&self, x: &CudaTensor) -> DeviceResult<CudaTensor> {
        if x.rows == 0 {
            return self.new_tensor(1, x.cols);
        }
        self.col_sums(x)
    }
    fn axpy(&self, alpha: f32, x: &CudaTensor, y: &mut CudaTensor) -> DeviceResult<()> {
        same_shape("axpy", x, y);
        let n = x.len() as i64;
        launch!(
            self.inner,
            "axpy",
            x.len(),
            [&alpha, &x.data, &mut y.data, &n]
        );
        Ok(())
    }
    fn axpy_prefix(
        &self,
        alpha: f32,
        x: &CudaTensor,
        y: &mut CudaTensor,
        rows: usize,
    ) -> DeviceResult<()> {
        assert_eq!(x.cols, y.cols, "axpy_prefix: column counts differ");
        assert!(
            x.rows >= rows && y.rows >= rows,
            "axpy_prefix: {rows} rows asked of {} and {}",
            x.rows,
            y.rows
        );
        let n = rows * x.cols;
        let n64 = n as i64;
        launch!(self.inner, "axpy", n, [&alpha, &x.data, &mut y.data, &n64]);
        Ok(())
    }
    /// A device-to-device copy of the whole buffer (not zeroed first).
    fn copy(&self, x: &CudaTensor) -> DeviceResult<CudaTensor> {
        let data = x
            .data
            .try_clone()
            .map_err(|e| device_error("cuMemcpyDtoD (copy)", e))?;
        Ok(CudaTensor {
            rows: x.rows,
            cols: x.cols,
            data,
        })
    }
    fn prefix_rows(&self, x: &CudaTensor, rows: usize) -> DeviceResult<CudaTensor> {
        assert!(rows <= x.rows, "prefix_rows: {rows} of {} rows", x.rows);
        let mut out = self.new_tensor(rows, x.cols)?;
        let n = rows * x.cols;
        if n > 0 {
            let src = x.data.slice(0..n);
            let mut dst = out.data.slice_mut(0..n);
            if let Err(e) = self.stream().memcpy_dtod(&src, &mut dst) {
                return Err(device_error("cuMemcpyDtoD", e));
            }
        }
        Ok(out)
    }
    fn scale(&self, x: &mut CudaTensor, alpha: f32) -> DeviceResult<()> {
        let n = x.len() as i64;
        launch!(self.inner, "scale", x.len(), [&mut x.data, &alpha, &n]);
        Ok(())
    }
    fn mul(&self, a: &CudaTensor, b: &CudaTensor) -> DeviceResult<CudaTensor> {
        same_shape("mul", a, b);
        let mut out = self.new_tensor(a.rows, a.cols)?;
        let n = a.len() as i64;
        launch!(
            self.inner,
            "mul",
            a.len(),
            [&a.data, &b.data, &mut out.data, &n]
        );
        Ok(out)
    }
    fn mul_sum_rows(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
    ) -> DeviceResult<(CudaTensor, CudaTensor)> {
        let p = self.mul(a, b)?;
        let s = self.sum_rows(&p)?;
        Ok((p, s))
    }
    fn dot(&self, a: &CudaTensor, b: &CudaTensor) -> DeviceResult<f64> {
        Ok(self
            .to_host(&self.dot_partials(a, b)?, DOT_BLOCKS)?
            .iter()
            .sum())
    }
    fn add_dot(&self, a: &CudaTensor, b: &CudaTensor, y: &mut CudaTensor) -> DeviceResult<()> {
        assert_eq!(
            y.shape(),
            (1, 1),
            "add_dot: y is {:?}, not 1 x 1",
            y.shape()
        );
        let partial = self.dot_partials(a, b)?;
        let blocks = DOT_BLOCKS as i32;
        launch!(
            self.inner,
            "add_partials",
            1,
            [&partial, &blocks, &mut y.data]
        );
        Ok(())
    }
    fn axpy_prefix_one_plus(
        &self,
        s: &CudaTensor,
        x: &CudaTensor,
        y: &mut CudaTensor,
        rows: usize,
    ) -> DeviceResult<()> {
        assert_eq!(
            s.shape(),
            (1, 1),
            "axpy_prefix_one_plus: s is {:?}",
            s.shape()
        );
        assert_eq!(x.cols, y.cols, "axpy_prefix_one_plus: column counts differ");
        assert!(
            x.rows >= rows && y.rows >= rows,
            "axpy_prefix_one_plus: {rows} rows asked of {} and {}",
            x.rows,
            y.rows
        );
        let n = rows * x.cols;
        let n64 = n as i64;
        launch!(
            self.inner,
            "axpy_one_plus",
            n,
            [&s.data, &x.data, &mut y.data, &n64]
        );
        Ok(())
    }
    fn relu(&self, x: &CudaTensor) -> DeviceResult<CudaTensor> {
        let mut out = self.new_tensor(x.rows, x.cols)?;
        let n = x.len() as i64;
        launch!(self.inner, "relu", x.len(), [&x.data, &mut out.data, &n]);
        Ok(out)
    }
    fn relu_backward(&self, grad: &CudaTensor, out: &CudaTensor) -> DeviceResult<CudaTensor> {
        same_shape("relu_backward", grad, out);
        let mut o = self.new_tensor(grad.rows, grad.cols)?;
        let n = grad.len() as i64;
        launch!(
            self.inner,
            "relu_backward",
            grad.len(),
            [&grad.data, &out.data, &mut o.data, &n]
        );
        Ok(o)
    }
    fn leaky_relu(&self, x: &CudaTensor, slope: f32) -> DeviceResult<CudaTensor> {
        let mut o = self.new_tensor(x.rows, x.cols)?;
        let n = x.len() as i64;
        launch!(
            self.inner,
            "leaky_relu",
            x.len(),
            [&x.data, &mut o.data, &slope, &n]
        );
        Ok(o)
    }
    fn leaky_relu_backward(
        &self,
        grad: &CudaTensor,
        x: &CudaTensor,
        slope: f32,
    ) -> DeviceResult<CudaTensor> {
        same_shape("leaky_relu_backward", grad, x);
        let mut o = self.new_tensor(x.rows, x.cols)?;
        let n = x.len() as i64;
        launch!(
            self.inner,
            "leaky_relu_backward",
            x.len(),
            [&grad.data, &x.data, &mut o.data, &slope, &n]
        );
        Ok(o)
    }
    fn dropout(
        &self,
        x: &CudaTensor,
        p: f32,
        key: u64,
        row_ids: Option<&[u32]>,
    ) -> DeviceResult<(CudaTensor, CudaTensor)> {
        let (thr, keep) = dropout_threshold(p);
        let seeds = self.dropout_seeds(x.rows, key, row_ids)?;
        let mut out = self.new_tensor(x.rows, x.cols)?;
        let mut mask = self.new_tensor(x.rows, x.cols)?;
        let (n, cols) = (x.len() as i64, x.cols as i32);
        launch!(
            self.inner,
            "dropout",
            x.len(),
            [
                &x.data,
                &seeds,
                &thr,
                &keep,
                &mut out.data,
                &mut mask.data,
                &n,
                &cols
            ]
        );
        Ok((out, mask))
    }
    fn epilogue(
        &self,
        x: &mut CudaTensor,
        bias: Option<&CudaTensor>,
        relu: bool,
        dropout: Option<DropoutSpec<'_>>,
        keep: bool,
    ) -> DeviceResult<Option<CudaTensor>> {
        if let Some(b) = bias {
            assert_eq!(b.shape(), (1, x.cols), "epilogue: bias shape");
        }
        let (thr, scale) = dropout.map_or((0, 1.0), |d| dropout_threshold(d.p));
        let seeds = match dropout {
            Some(d) => Some(self.dropout_seeds(x.rows, d.key, d.row_ids)?),
            None => None,
        };
        let mut factor = if keep && (relu || dropout.is_some()) {
            Some(self.new_tensor(x.rows, x.cols)?)
        } else {
            None
        };
        let bias_addr = self.addr(bias.map(|b| &b.data));
        let seeds_addr = self.addr(seeds.as_ref());
        let factor_addr = self.addr(factor.as_mut().map(|f| &f.data));
        let relu_on = relu as i32;
        let (n, cols) = (x.len() as i64, x.cols as i32);
        launch!(
            self.inner,
            "epilogue",
            x.len(),
            [
                &mut x.data,
                &bias_addr,
                &relu_on,
                &seeds_addr,
                &thr,
                &scale,
                &factor_addr,
                &n,
                &cols
            ]
        );
        Ok(factor)
    }
    fn l2_normalize_rows(&self, x: &CudaTensor) -> DeviceResult<(CudaTensor, CudaTensor)> {
        let mut norms = self.new_tensor(x.rows, 1)?;
        let mut y = self.new_tensor(x.rows, x.cols)?;
        let (rows, cols, n) = (x.rows as i64, x.cols as i32, x.len() as i64);
        launch!(
            self.inner,
            "l2_norms",
            x.rows * 32,
            [&x.data, &mut norms.data, &rows, &cols]
        );
        launch!(
            self.inner,
            "div_rows",
            x.len(),
            [&x.data, &norms.data, &mut y.data, &n, &cols]
        );
        Ok((y, norms))
    }
    fn l2_normalize_rows_backward(
        &self,
        grad: &CudaTensor,
        y: &CudaTensor,
        norms: &CudaTensor,
    ) -> DeviceResult<CudaTensor> {
        same_shape("l2_normalize_rows_backward", grad, y);
        assert_eq!(
            norms.shape(),
            (y.rows, 1),
            "l2_normalize_rows_backward: norms"
        );
        let mut out = self.new_tensor(y.rows, y.cols)?;
        let (rows, cols) = (y.rows as i64, y.cols as i32);
        launch!(
            self.inner,
            "l2_backward",
            y.rows * 32,
            [
                &grad.data,
                &y.data,
                &norms.data,
                &mut out.data,
                &rows,
                &cols
            ]
        );
        Ok(out)
    }
    fn head_dot(&self, x: &CudaTensor, a: &CudaTensor) -> DeviceResult<CudaTensor> {
        let (heads, f) = a.shape();
        assert_eq!(
            x.cols,
            heads * f,
            "head_dot: x has {} columns, a is {heads} x {f}",
            x.cols
        );
        let mut out = self.new_tensor(x.rows, heads)?;
        let (rows, h32, f32_) = (x.rows as i64, heads as i32, f as i32);
        let vec = self.vec4(f, &[&x.data, &a.data]);
        launch!(
            self.inner,
            "head_dot",
            x.rows * heads,
            [&x.data, &a.data, &mut out.data, &rows, &h32, &f32_, &vec]
        );
        Ok(out)
    }
    fn head_dot_backward(
        &self,
        grad: &CudaTensor,
        x: &CudaTensor,
        a: &CudaTensor,
    ) -> DeviceResult<(CudaTensor, CudaTensor)> {
        let mut dx = self.new_tensor(x.rows, x.cols)?;
        let da = self.head_dot_backward_acc(grad, x, a, &mut dx)?;
        Ok((dx, da))
    }
    fn head_dot_backward_acc(
        &self,
        grad: &CudaTensor,
        x: &CudaTensor,
        a: &CudaTensor,
        acc: &mut CudaTensor,
    ) -> DeviceResult<CudaTensor> {
        let (heads, f) = a.shape();
        assert_eq!(x.cols, heads * f, "head_dot_backward: x columns");
        assert_eq!(
            grad.shape(),
            (x.rows, heads),
            "head_dot_backward: grad shape"
        );
        assert!(
            acc.cols == x.cols && acc.rows >= x.rows,
            "head_dot_backward_acc: acc is {:?} for x {:?}",
            acc.shape(),
            x.shape()
        );
        let (rows, h32, f32_) = (x.rows as i64, heads as i32, f as i32);
        let n = x.len();
        // d x[n, j] += g[n, j / F] * a[j] (a shared by every row: stride 0).
        let (zero_stride, one) = (0i64, 1i32);
        launch!(
            self.inner,
            "head_scale",
            n,
            [
                &grad.data,
                &a.data,
                &zero_stride,
                &mut acc.data,
                &rows,
                &h32,
                &f32_,
                &one
            ]
        );
        // d a = column sums of g[n, j / F] * x[n, j].
        let mut prod = self.new_tensor(x.rows, x.cols)?;
        let (stride, zero) = (x.cols as i64, 0i32);
        launch!(
            self.inner,
            "head_scale",
            n,
            [
                &grad.data,
                &x.data,
                &stride,
                &mut prod.data,
                &rows,
                &h32,
                &f32_,
                &zero
            ]
        );
        let mut da = self.sum_rows(&prod)?;
        da.rows = heads;
        da.cols = f;
        Ok(da)
    }
    fn head_mean(&self, x: &CudaTensor, heads: usize) -> DeviceResult<CudaTensor> {
        let f = heads_split(x.cols, heads, "head_mean");
        let mut out = self.new_tensor(x.rows, f)?;
        let inv = 1.0 / heads as f32;
        let (rows, h32, f32_) = (x.rows as i64, heads as i32, f as i32);
        launch!(
            self.inner,
            "head_mean",
            x.rows * f,
            [&x.data, &mut out.data, &rows, &h32, &f32_, &inv]
        );
        Ok(out)
    }
    fn head_mean_backward(&self, grad: &CudaTensor, heads: usize) -> DeviceResult<CudaTensor> {
        assert!(heads > 0, "head_mean_backward: zero heads");
        let f = grad.cols;
        let mut out = self.new_tensor(grad.rows, heads * f)?;
        let inv = 1.0 / heads as f32;
        let (rows, h32, f32_) = (grad.rows as i64, heads as i32, f as i32);
        launch!(
            self.inner,
            "head_mean_backward",
            grad.rows * heads * f,
            [&grad.data, &mut out.data, &rows, &h32, &f32_, &inv]
        );
        Ok(out)
    }

    // ----- graph -----

    fn edge_coefficients(
        &self,
        block: &CudaBlock,
        agg: Aggregation,
    ) -> DeviceResult<Option<CudaTensor>> {
        let kind: i32 = match agg {
            Aggregation::Sum => return Ok(None),
            Aggregation::Mean => 0,
            Aggregation::Weighted => 1,
            Aggregation::WeightedMean => 2,
            Aggregation::GcnBoth => 3,
        };
        let b = &block.0;
        let outdeg = if kind == 3 {
            self.addr(Some(self.out_degrees(block)?))
        } else {
            0
        };
        let w = self.addr(b.weights.as_ref());
        let mut out = self.new_tensor(b.dims.num_edges, 1)?;
        let dsts = b.dims.num_dst as i64;
        launch!(
            self.inner,
            "edge_coefficients",
            b.dims.num_dst,
            [
                &b.indptr,
                &b.indices,
                &w,
                &outdeg,
                &kind,
                &mut out.data,
                &dsts
            ]
        );
        Ok(Some(out))
    }
    fn spmm(
        &self,
        block: &CudaBlock,
        coeff: Option<&CudaTensor>,
        x: &CudaTensor,
    ) -> DeviceResult<CudaTensor> {
        let b = &block.0;
        let heads = coeff.map_or(1, |c| c.cols);
        if let Some(c) = coeff {
            assert_eq!(c.rows, b.dims.num_edges, "spmm: coefficient rows != edges");
        }
        heads_split(x.cols, heads, "spmm");
        assert_eq!(x.rows, b.dims.num_src, "spmm: x rows != num_src");
        let mut out = self.new_tensor(b.dims.num_dst, x.cols)?;
        let c = self.addr(coeff.map(|c| &c.data));
        if self.memory_aware(heads) {
            self.spmm_ma(&b.indptr, &b.indices, 0, c, heads, x, &mut out)?;
            return Ok(out);
        }
        let (h32, dsts, cols) = (heads as i32, b.dims.num_dst as i64, x.cols as i32);
        launch!(
            self.inner,
            "spmm",
            b.dims.num_dst * x.cols,
            [
                &b.indptr,
                &b.indices,
                &c,
                &h32,
                &x.data,
                &mut out.data,
                &dsts,
                &cols
            ]
        );
        Ok(out)
    }
    fn spmm_backward_x(
        &self,
        block: &CudaBlock,
        coeff: Option<&CudaTensor>,
        grad: &CudaTensor,
    ) -> DeviceResult<CudaTensor> {
        let dims = block.0.dims;
        let heads = coeff.map_or(1, |c| c.cols);
        if let Some(c) = coeff {
            assert_eq!(c.rows, dims.num_edges, "spmm_backward_x: coefficient rows");
        }
        heads_split(grad.cols, heads, "spmm_backward_x");
        assert_eq!(
            grad.rows, dims.num_dst,
            "spmm_backward_x: grad rows != num_dst"
        );
        let t = self.transposed(block)?;
        let mut out = self.new_tensor(dims.num_src, grad.cols)?;
        let c = self.addr(coeff.map(|c| &c.data));
        if self.memory_aware(heads) {
            let eid = self.addr(Some(&t.eid));
            self.spmm_ma(&t.ptr, &t.dst, eid, c, heads, grad, &mut out)?;
            return Ok(out);
        }
        let (h32, srcs, cols) = (heads as i32, dims.num_src as i64, grad.cols as i32);
        launch!(
            self.inner,
            "spmm_t",
            dims.num_src * grad.cols,
            [
                &t.ptr,
                &t.dst,
                &t.eid,
                &c,
                &h32,
                &grad.data,
                &mut out.data,
                &srcs,
                &cols
            ]
        );
        Ok(out)
    }
    fn spmm_backward_coeff(
        &self,
        block: &CudaBlock,
        grad: &CudaTensor,
        x: &CudaTensor,
        heads: usize,
    ) -> DeviceResult<CudaTensor> {
        let b = &block.0;
        let f = heads_split(x.cols, heads, "spmm_backward_coeff");
        assert_eq!(
            grad.shape(),
            (b.dims.num_dst, x.cols),
            "spmm_backward_coeff: grad"
        );
        assert_eq!(x.rows, b.dims.num_src, "spmm_backward_coeff: x rows");
        let mut out = self.new_tensor(b.dims.num_edges, heads)?;
        let (edges, h32, f32_) = (b.dims.num_edges as i64, heads as i32, f as i32);
        let vec = self.vec4(f, &[&grad.data, &x.data]);
        launch!(
            self.inner,
            "spmm_coeff_grad",
            b.dims.num_edges * heads,
            [
                &b.indices,
                &b.edst,
                &grad.data,
                &x.data,
                &mut out.data,
                &edges,
                &h32,
                &f32_,
                &vec
            ]
        );
        Ok(out)
    }
    fn u_add_v(
        &self,
        block: &CudaBlock,
        el: &CudaTensor,
        er: &CudaTensor,
    ) -> DeviceResult<CudaTensor> {
        let b = &block.0;
        let heads = el.cols;
        assert_eq!(el.rows, b.dims.num_src, "u_add_v: el rows");
        assert_eq!(er.shape(), (b.dims.num_dst, heads), "u_add_v: er shape");
        let mut out = self.new_tensor(b.dims.num_edges, heads)?;
        let (edges, h32) = (b.dims.num_edges as i64, heads as i32);
        launch!(
            self.inner,
            "u_add_v",
            b.dims.num_edges * heads,
            [
                &b.indices,
                &b.edst,
                &el.data,
                &er.data,
                &mut out.data,
                &edges,
                &h32
            ]
        );
        Ok(out)
    }
    fn edge_sum_to_src(&self, block: &CudaBlock, e: &CudaTensor) -> DeviceResult<CudaTensor> {
        let dims = block.0.dims;
        assert_eq!(e.rows, dims.num_edges, "edge_sum_to_src: rows != edges");
        let t = self.transposed(block)?;
        let mut out = self.new_tensor(dims.num_src, e.cols)?;
        let (srcs, h32) = (dims.num_src as i64, e.cols as i32);
        launch!(
            self.inner,
            "edge_sum_to_src",
            dims.num_src * e.cols,
            [&t.ptr, &t.eid, &e.data, &mut out.data, &srcs, &h32]
        );
        Ok(out)
    }
    fn edge_sum_to_dst(&self, block: &CudaBlock, e: &CudaTensor) -> DeviceResult<CudaTensor> {
        let b = &block.0;
        assert_eq!(e.rows, b.dims.num_edges, "edge_sum_to_dst: rows != edges");
        let mut out = self.new_tensor(b.dims.num_dst, e.cols)?;
        let (dsts, h32) = (b.dims.num_dst as i64, e.cols as i32);
        launch!(
            self.inner,
            "edge_sum_to_dst",
            b.dims.num_dst * e.cols,
            [&b.indptr, &e.data, &mut out.data, &dsts, &h32]
        );
        Ok(out)
    }
    fn edge_softmax(&self, block: &CudaBlock, scores: &CudaTensor) -> DeviceResult<CudaTensor> {
        let b = &block.0;
        assert_eq!(
            scores.rows, b.dims.num_edges,
            "edge_softmax: rows != num_edges"
        );
        let mut out = self.new_tensor(scores.rows, scores.cols)?;
        let (dsts, h32) = (b.dims.num_dst as i64, scores.cols as i32);
        launch!(
            self.inner,
            "edge_softmax",
            b.dims.num_dst * scores.cols,
            [&b.indptr, &scores.data, &mut out.data, &dsts, &h32]
        );
        Ok(out)
    }
    fn edge_softmax_backward(
        &self,
        block: &CudaBlock,
        a: &CudaTensor,
        grad: &CudaTensor,
    ) -> DeviceResult<CudaTensor> {
        let b = &block.0;
        assert_eq!(a.rows, b.dims.num_edges, "edge_softmax_backward: a rows");
        same_shape("edge_softmax_backward", a, grad);
        let mut out = self.new_tensor(a.rows, a.cols)?;
        let (dsts, h32) = (b.dims.num_dst as i64, a.cols as i32);
        launch!(
            self.inner,
            "edge_softmax_backward",
            b.dims.num_dst * a.cols,
            [&b.indptr, &a.data, &grad.data, &mut out.data, &dsts, &h32]
        );
        Ok(out)
    }
    fn map_host_rows(
        &self,
        rows: usize,
        cols: usize,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Option<Result<MappedRows>> {
        Some(self.map_rows(rows, cols, fill))
    }
    fn gather_mapped_rows(
        &self,
        table: &MappedRows,
        idx: &[u32],
        resident: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> DeviceResult<CudaTensor> {
        self.gather_mapped(table, idx, resident)
    }
    fn gather_input_rows(
        &self,
        x: &CudaTensor,
        idx: &[u32],
        resident: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> DeviceResult<CudaTensor> {
        Ok(match self.resident_inputs(resident, idx) {
            Some(ids) => {
                check_ids(idx, x.rows, "gather_input_rows");
                self.gather_rows_device(x, ids, idx.len())?
            }
            None => self.gather_rows(x, idx)?,
        })
    }
    fn gather_rows(&self, x: &CudaTensor, idx: &[u32]) -> DeviceResult<CudaTensor> {
        check_ids(idx, x.rows, "gather_rows");
        let idx_d = self.to_device(idx)?;
        if self.graph_kernels() == GraphKernels::MemoryAware {
            return self.gather_rows_device(x, &idx_d, idx.len());
        }
        let mut out = self.new_tensor(idx.len(), x.cols)?;
        let (n, cols) = (idx.len() as i64, x.cols as i32);
        launch!(
            self.inner,
            "gather_rows",
            idx.len() * x.cols,
            [&x.data, &idx_d, &mut out.data, &n, &cols]
        );
        Ok(out)
    }
    fn scatter_add_rows(
        &self,
        y: &mut CudaTensor,
        idx: &[u32],
        x: &CudaTensor,
    ) -> DeviceResult<()> {
        assert_eq!(x.rows, idx.len(), "scatter_add_rows: x rows != indices");
        assert_eq!(x.cols, y.cols, "scatter_add_rows: column counts differ");
        if let Some(&bad) = idx.iter().find(|&&i| i as usize >= y.rows) {
            panic!(
                "scatter_add_rows: index {bad} out of range for {} rows",
                y.rows
            );
        }
        // Group the rows by target (a stable sort: each target adds its rows in index order),
        // so that one thread owns each target element and no atomics are needed.
        let mut order: Vec<u32> = (0..idx.len() as u32).collect();
        order.sort_by_key(|&i| idx[i as usize]);
        let (mut targets, mut gptr) = (Vec::new(), vec![0u32]);
        for (k, &i) in order.iter().enumerate() {
            let t = idx[i as usize];
            if targets.last() != Some(&t) {
                if k > 0 {
                    gptr.push(k as u32);
                }
                targets.push(t);
            }
        }
        gptr.push(order.len() as u32);
        if targets.is_empty() {
            return Ok(());
        }
        let (t_d, p_d, m_d) = (
            self.to_device(&targets)?,
            self.to_device(&gptr)?,
            self.to_device(&order)?,
        );
        let (groups, cols) = (targets.len() as i64, x.cols as i32);
        launch!(
            self.inner,
            "scatter_add_groups",
            targets.len() * x.cols,
            [&t_d, &p_d, &m_d, &x.data, &mut y.data, &groups, &cols]
        );
        Ok(())
    }

    // ----- loss and metrics -----

    fn softmax_cross_entropy(
        &self,
        logits: &CudaTensor,
        labels: &[i64],
    ) -> Result<CrossEntropy<CudaTensor>> {
        let (rows, classes) = logits.shape();
        let count = check_labels(rows, classes, labels)?;
        let mut grad = self.new_tensor(rows, classes)?;
        if count == 0 {
            return Ok(CrossEntropy {
                loss: 0.0,
                count,
                grad,
            });
        }
        let lab_d = self.labels_to_device(labels)?;
        let row_loss = self.xent_rows(logits, &lab_d, count, &mut grad)?;
        let total: f64 = self.to_host(&row_loss, rows)?.iter().sum();
        Ok(CrossEntropy {
            loss: (total / count as f64) as f32,
            count,
            grad,
        })
    }
    fn loss_and_accuracy(
        &self,
        logits: &CudaTensor,
        labels: &[i64],
    ) -> Result<(CrossEntropy<CudaTensor>, usize)> {
        let (count, grad, per_row) = self.loss_and_hits(logits, labels)?;
        let Some((row_loss, hit)) = per_row else {
            // No row is labelled: no loss, no hit.
            let ce = CrossEntropy {
                loss: 0.0,
                count,
                grad,
            };
            return Ok((ce, 0));
        };
        let mut figures = self.alloc::<f64>(2)?;
        let r64 = logits.rows as i64;
        launch!(
            self.inner,
            "step_figures",
            1,
            [&row_loss, &hit, &r64, &mut figures]
        );
        // One read for both figures (the separate calls read back a value per row, twice).
        let f = self.to_host(&figures, 2)?;
        let ce = CrossEntropy {
            loss: (f[0] / count as f64) as f32,
            count,
            grad,
        };
        Ok((ce, f[1] as usize))
    }
    fn all_finite(&self, tensors: &[&CudaTensor]) -> DeviceResult<bool> {
        let mut flag = self.alloc::<i32>(1)?;
        for t in tensors {
            let n = t.len() as i64;
            launch!(
                self.inner,
                "any_non_finite",
                t.len(),
                [&t.data, &n, &mut flag]
            );
        }
        Ok(self.to_host(&flag, 1)?[0] == 0)
    }
    fn accuracy(&self, logits: &CudaTensor, labels: &[i64]) -> DeviceResult<(usize, usize)> {
        assert_eq!(labels.len(), logits.rows, "accuracy: label count != rows");
        let labelled = labels.iter().filter(|&&l| l >= 0).count();
        let hit = self.hits(logits, &self.labels_to_device(labels)?)?;
        let correct = self
            .to_host(&hit, logits.rows)?
            .iter()
            .filter(|&&h| h != 0)
            .count();
        Ok((correct, labelled))
    }

    // ----- optimiser updates -----

    fn adam_update(
        &self,
        value: &mut CudaTensor,
        grad: &CudaTensor,
        m: &mut CudaTensor,
        v: &mut CudaTensor,
        hp: &AdamUpdate,
    ) -> DeviceResult<()> {
        self.adam(value, grad, m, v, hp, self.open_gate()?)?;
        Ok(())
    }
    fn adam_update_gated(
        &self,
        value: &mut CudaTensor,
        grad: &CudaTensor,
        m: &mut CudaTensor,
        v: &mut CudaTensor,
        hp: &AdamUpdate,
        gate: &CudaTensor,
    ) -> DeviceResult<()> {
        self.adam(value, grad, m, v, hp, gate_of(gate))?;
        Ok(())
    }
    fn sgd_update(
        &self,
        value: &mut CudaTensor,
        grad: &CudaTensor,
        buf: &mut CudaTensor,
        hp: &SgdUpdate,
    ) -> DeviceResult<()> {
        self.sgd(value, grad, buf, hp, self.open_gate()?)?;
        Ok(())
    }
    fn sgd_update_gated(
        &self,
        value: &mut CudaTensor,
        grad: &CudaTensor,
        buf: &mut CudaTensor,
        hp: &SgdUpdate,
        gate: &CudaTensor,
    ) -> DeviceResult<()> {
        self.sgd(value, grad, buf, hp, gate_of(gate))?;
        Ok(())
    }

    // ----- reads a step late (`deferred.rs`) -----

    fn defers_reads(&self) -> bool {
        true
    }
    fn device_group(&self) -> Option<(usize, usize)> {
        self.group_rank()
    }
    fn sum_over_group(
        &self,
        tensors: &mut [&mut CudaTensor],
        scale_in: f32,
        scale_out: f32,
    ) -> DeviceResult<()> {
        self.group_sum(tensors, scale_in, scale_out)?;
        Ok(())
    }
    fn loss_and_accuracy_on_device(
        &self,
        logits: &CudaTensor,
        labels: &[i64],
    ) -> Result<StepFigures<CudaTensor>> {
        self.figures_on_device(logits, labels)
    }
    fn mark_non_finite(
        &self,
        x: &CudaTensor,
        gate: &mut CudaTensor,
        slot: usize,
    ) -> DeviceResult<()> {
        self.mark_gate(x, gate, slot)
    }
    fn read_later(&self, t: &CudaTensor) -> DeviceResult<PendingRead> {
        self.start_read(t)
    }
    fn finish_read(&self, read: PendingRead) -> DeviceResult<Tensor> {
        self.end_read(read)
    }
}

/// The device flag of a gate tensor (`Backend::mark_non_finite`'s layout).
fn gate_of(gate: &CudaTensor) -> &CudaSlice<f32> {
    assert!(
        gate.rows == 1 && gate.cols >= 1,
        "a gate is 1 x (1 + slots), not {} x {}",
        gate.rows,
        gate.cols
    );
    &gate.data
}

impl CudaBackend {
    fn adam(
        &self,
        value: &mut CudaTensor,
        grad: &CudaTensor,
        m: &mut CudaTensor,
        v: &mut CudaTensor,
        hp: &AdamUpdate,
        gate: &CudaSlice<f32>,
    ) -> DeviceResult<()> {
        let shape = value.shape();
        assert!(
            grad.shape() == shape && m.shape() == shape && v.shape() == shape,
            "adam_update: shapes differ"
        );
        let (step_size, inv_sqrt_bc2) = hp.scalars();
        let n = value.len() as i64;
        launch!(
            self.inner,
            "adam",
            value.len(),
            [
                &mut value.data,
                &grad.data,
                &mut m.data,
                &mut v.data,
                &hp.beta1,
                &hp.beta2,
                &hp.eps,
                &hp.weight_decay,
                &step_size,
                &inv_sqrt_bc2,
                &n,
                gate
            ]
        );
        Ok(())
    }

    fn sgd(
        &self,
        value: &mut CudaTensor,
        grad: &CudaTensor,
        buf: &mut CudaTensor,
        hp: &SgdUpdate,
        gate: &CudaSlice<f32>,
    ) -> DeviceResult<()> {
        same_shape("sgd_update", value, grad);
        let n = value.len() as i64;
        if hp.momentum == 0.0 {
            launch!(
                self.inner,
                "sgd",
                value.len(),
                [
                    &mut value.data,
                    &grad.data,
                    &hp.lr,
                    &hp.weight_decay,
                    &n,
                    gate
                ]
            );
            return Ok(());
        }
        same_shape("sgd_update momentum buffer", value, buf);
        launch!(
            self.inner,
            "sgd_momentum",
            value.len(),
            [
                &mut value.data,
                &grad.data,
                &mut buf.data,
                &hp.lr,
                &hp.momentum,
                &hp.weight_decay,
                &n,
                gate
            ]
        );
        Ok(())
    }
}
