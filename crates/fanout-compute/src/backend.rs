//! The device-agnostic compute interface that layers, models and optimisers are written against.

use crate::block::{BlockDims, BlockRef};
use crate::error::{ComputeError, Result};
use crate::failure::{DeviceFailure, DeviceResult};
use crate::source::RowSource;
use crate::tensor::Tensor;

/// How a block's edges are weighted when destinations aggregate their sources' rows
/// (`out[d] = sum over edges e into d of coeff(e) * x[src(e)]`). Degrees are counted inside the
/// block (sampled edges), never in the full graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Aggregation {
    /// `coeff(e) = 1`.
    Sum,
    /// `coeff(e) = 1 / in_deg(d)`; a destination without edges gets a zero row.
    Mean,
    /// `coeff(e) = w(e)`, the block's edge weight (1 where the block has no weights).
    Weighted,
    /// `coeff(e) = w(e) / max(sum of w over d's edges, 1)`: PinSAGE's importance pooling as in
    /// DGL's PinSAGE example (weights are visit counts, the denominator is clamped at 1).
    WeightedMean,
    /// DGL `GraphConv(norm="both")` on a block:
    /// `coeff(e) = 1 / sqrt(max(out_deg(src), 1) * max(in_deg(d), 1))` where `out_deg(s)` is the
    /// number of block edges leaving source `s` and `in_deg(d)` the number entering destination
    /// `d`. No self-loops are added (DGL does not add them either).
    GcnBoth,
}

/// Result of [`Backend::softmax_cross_entropy`].
#[derive(Clone, Debug)]
pub struct CrossEntropy<T> {
    /// Mean negative log-likelihood over the labelled rows (0 when none is labelled).
    pub loss: f32,
    /// Number of labelled rows (label != -1), the divisor of `loss`.
    pub count: usize,
    /// Gradient of `loss` with respect to the logits (zero rows for unlabelled rows).
    pub grad: T,
}

/// A feature table in host memory that a device reads in place
/// ([`Backend::map_host_rows`]), opaque outside the backend that made it (which downcasts
/// [`MappedRows::table`]). Clones share the table.
#[derive(Clone)]
pub struct MappedRows {
    rows: usize,
    cols: usize,
    table: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

impl MappedRows {
    /// A `rows x cols` table held by `table` (for backends that implement
    /// [`Backend::map_host_rows`]).
    pub fn new(
        rows: usize,
        cols: usize,
        table: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        MappedRows { rows, cols, table }
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The backend's own table.
    pub fn table(&self) -> &(dyn std::any::Any + Send + Sync) {
        self.table.as_ref()
    }
}

impl std::fmt::Debug for MappedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedRows({} x {})", self.rows, self.cols)
    }
}

/// A read of a tensor back to the host, started by [`Backend::read_later`] and finished by
/// [`Backend::finish_read`]: done already (the default, for backends whose reads do not wait),
/// or the backend's own record of a copy under way (which that backend downcasts).
pub struct PendingRead(PendingInner);

enum PendingInner {
    Done(Tensor),
    Started(Box<dyn std::any::Any + Send>),
}

impl PendingRead {
    /// A read already done: `t` is the value.
    pub fn done(t: Tensor) -> Self {
        PendingRead(PendingInner::Done(t))
    }

    /// A read a backend started; `record` is what it needs to finish it.
    pub fn started(record: Box<dyn std::any::Any + Send>) -> Self {
        PendingRead(PendingInner::Started(record))
    }

    /// The value of a read done already, or the record of one started.
    pub fn into_inner(self) -> std::result::Result<Tensor, Box<dyn std::any::Any + Send>> {
        match self.0 {
            PendingInner::Done(t) => Ok(t),
            PendingInner::Started(r) => Err(r),
        }
    }
}

impl std::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            PendingInner::Done(t) => write!(f, "PendingRead(done, {:?})", t.shape()),
            PendingInner::Started(_) => write!(f, "PendingRead(started)"),
        }
    }
}

/// Result of [`Backend::loss_and_accuracy_on_device`]: a step's figures left where they were
/// computed.
#[derive(Clone, Debug)]
pub struct StepFigures<T> {
    /// `1 x 2`: the mean loss (the bits of [`Backend::loss_and_accuracy`]'s) and the correct
    /// count (exact below 2^24).
    pub figures: T,
    /// Number of labelled rows (label != -1), the divisor of the loss.
    pub count: usize,
    /// Gradient of the loss with respect to the logits (zero rows for unlabelled rows).
    pub grad: T,
}

/// Whether `gate` ([`Backend::mark_non_finite`]) is unmarked, read back: how the default gated
/// updates decide.
fn gate_open<B: Backend>(be: &B, gate: &B::Tensor) -> DeviceResult<bool> {
    Ok(be.download(gate)?.data().first() == Some(&0.0))
}

/// Hyper-parameters of one Adam update, PyTorch `torch.optim.Adam` semantics (L2 weight decay
/// added to the gradient, bias-corrected moments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamUpdate {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon (added after the square root).
    pub eps: f32,
    /// L2 penalty coefficient (`grad += weight_decay * value`).
    pub weight_decay: f32,
    /// 1-based step number, for bias correction.
    pub step: u64,
}

impl AdamUpdate {
    /// The step's two scalars, as every backend computes them once per update (in f64, then
    /// rounded): `(step_size, inv_sqrt_bc2) = (lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t))`,
    /// each element then updated as `g = grad + weight_decay * value`,
    /// `m = beta1 * m + (1 - beta1) * g`, `v = beta2 * v + (1 - beta2) * g * g`,
    /// `value -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)`. Panics if `step` is 0.
    pub fn scalars(&self) -> (f32, f32) {
        assert!(self.step >= 1, "adam_update: step is 1-based");
        let t = self.step.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - (self.beta1 as f64).powi(t);
        let bc2 = 1.0 - (self.beta2 as f64).powi(t);
        ((self.lr as f64 / bc1) as f32, (1.0 / bc2.sqrt()) as f32)
    }
}

/// Dropout's integer threshold and keep scale for rate `p`, as [`Backend::dropout`] uses
/// them: an element is kept (multiplied by `keep = 1 / (1 - p)`) when its 32-bit draw is at
/// least `thr = round(p * 2^32)` (saturated). Panics unless `0 <= p < 1`.
pub fn dropout_threshold(p: f32) -> (u32, f32) {
    assert!((0.0..1.0).contains(&p), "dropout: p = {p} not in [0, 1)");
    let thr = (p as f64 * 4_294_967_296.0).round().min(u32::MAX as f64) as u32;
    (thr, 1.0 / (1.0 - p))
}

/// Checks the labels of [`Backend::softmax_cross_entropy`] for logits of `rows x classes`:
/// one per row, each -1 or a class index. Returns the number of labelled rows.
pub fn check_labels(rows: usize, classes: usize, labels: &[i64]) -> Result<usize> {
    if labels.len() != rows {
        return Err(ComputeError::shape(
            "softmax_cross_entropy labels",
            (rows, 1),
            (labels.len(), 1),
        ));
    }
    let mut count = 0;
    for (row, &label) in labels.iter().enumerate() {
        if label == -1 {
            continue;
        }
        if label < 0 || label as u64 >= classes as u64 {
            return Err(ComputeError::Label {
                row,
                label,
                classes,
            });
        }
        count += 1;
    }
    Ok(count)
}

/// Hyper-parameters of one SGD update, PyTorch `torch.optim.SGD` semantics without dampening
/// or Nesterov: `g = grad + wd * value; buf = momentum * buf + g; value -= lr * buf`
/// (`buf = g` when momentum is 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdUpdate {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor (0 = plain SGD).
    pub momentum: f32,
    /// L2 penalty coefficient.
    pub weight_decay: f32,
}

/// The dropout a layer applies to its output in training: rate `p` (`0 <= p < 1`), the key of
/// its masks, and the rows' vertex ids when given ([`Backend::dropout`] says how they key
/// the masks).
#[derive(Clone, Copy, Debug)]
pub struct DropoutSpec<'a> {
    /// Probability that an element is dropped.
    pub p: f32,
    /// Key of the masks (distinct per step and layer).
    pub key: u64,
    /// Global vertex id of each row, or `None` to key the masks by row index.
    pub row_ids: Option<&'a [u32]>,
}

/// A device that runs fanout's tensor and graph operations.
///
/// Layers and models are generic over `Backend` and touch data only through it, so a CUDA
/// backend implements this trait and everything above runs unchanged. Conventions for every
/// method: tensors are row-major `f32` matrices; "edge tensors" have one row per block edge in
/// the block's CSR order (`E x H` for `H` heads); "multi-head" row tensors are `N x (H * F)`
/// with head `h` in columns `h*F..(h+1)*F`. Methods panic when shapes do not match what they
/// document (a bug in the caller); inputs from outside (blocks, labels) give `Err`.
/// Every method that touches the device returns a [`DeviceResult`]: `Err` with a
/// [`DeviceFailure`] when the device fails (an allocation it has no memory for, a copy or a
/// kernel launch its driver refuses); the CPU backend never fails. After an `Err` the tensors
/// the call was writing hold unspecified values.
/// Results are deterministic: the same inputs give bit-identical outputs whatever the thread
/// count, except that the order of floating-point sums may differ between backends.
pub trait Backend: Clone + Send + Sync + std::fmt::Debug + 'static {
    /// A tensor on this device.
    type Tensor: Send + Sync + std::fmt::Debug + 'static;
    /// A block prepared on this device (cheap to clone; shares the prepared data).
    type Block: Clone + Send + Sync + std::fmt::Debug + 'static;

    /// Short device name, e.g. `"cpu"`.
    fn name(&self) -> &'static str;

    /// Bytes of free memory on the device now, or `None` where tensors live in host memory
    /// (the default).
    fn free_memory(&self) -> Option<u64> {
        None
    }

    /// Runs `f` (a training step, say: many kernel calls) where this backend's kernels are
    /// cheapest to launch, and returns its result. The default just calls `f`. The CPU backend
    /// runs it on a thread of its rayon pool, so each kernel's parallel loop is forked from
    /// inside the pool instead of being handed over from an outside thread and waited for
    /// (which costs a wake-up and a sleep per kernel). Results are the same either way.
    fn on_compute_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    // ----- memory -----

    /// Copies a host tensor to the device.
    fn upload(&self, host: &Tensor) -> DeviceResult<Self::Tensor>;
    /// Moves a host tensor to the device: same result as [`Backend::upload`], but a backend
    /// whose tensors live in host memory takes the buffer without copying it.
    fn upload_owned(&self, host: Tensor) -> DeviceResult<Self::Tensor> {
        self.upload(&host)
    }
    /// Copies a device tensor to the host.
    fn download(&self, t: &Self::Tensor) -> DeviceResult<Tensor>;
    /// A `rows x cols` tensor of zeros.
    fn zeros(&self, rows: usize, cols: usize) -> DeviceResult<Self::Tensor>;
    /// `(rows, cols)` of `t`.
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);
    /// Sets every element of `t` to zero.
    fn fill_zero(&self, t: &mut Self::Tensor) -> DeviceResult<()>;
    /// Validates `block` ([`BlockRef::validate`]) and copies it to the device.
    fn prepare_block(&self, block: &BlockRef<'_>) -> Result<Self::Block>;
    /// The blocks of a batch that a sampler left on this device (`resident`: that sampler's
    /// opaque copy; `blocks`: the same blocks on the host, in model order), prepared without a
    /// copy from the host; `None` when `resident` is not a copy this backend knows (the caller
    /// then prepares `blocks`). The default knows none.
    fn adopt_blocks(
        &self,
        resident: &(dyn std::any::Any + Send + Sync),
        blocks: &[BlockRef<'_>],
    ) -> DeviceResult<Option<Vec<Self::Block>>> {
        let _ = (resident, blocks);
        Ok(None)
    }
    /// `out[i] = x[idx[i]]` for a batch's input vertices `idx`: the rows of
    /// [`Backend::gather_rows`]. `resident` is the sampler's copy of the batch on a device
    /// (as for [`Backend::adopt_blocks`]), whose input vertices are `idx`; a backend that
    /// knows it may read the ids there instead of copying `idx` (the default gathers by
    /// `idx`). Panics if an index is out of range.
    fn gather_input_rows(
        &self,
        x: &Self::Tensor,
        idx: &[u32],
        resident: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> DeviceResult<Self::Tensor> {
        let _ = resident;
        self.gather_rows(x, idx)
    }
    /// A `rows x cols` f32 table in host memory that this device reads in place, over its bus
    /// (zero-copy), for feature rows that do not fit in device memory: page-locked memory,
    /// zeroed, handed once, whole and row-major, to `fill`, then read by
    /// [`Backend::gather_mapped_rows`]. `None` where the backend has no such memory (the
    /// default; the CPU backend's tensors are host memory already); `Some(Err)` when the
    /// memory cannot be had (page-locked memory is limited).
    fn map_host_rows(
        &self,
        rows: usize,
        cols: usize,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Option<Result<MappedRows>> {
        let _ = (rows, cols, fill);
        None
    }
    /// `out[i] = table[idx[i]]`, gathered by the device from the host memory of
    /// [`Backend::map_host_rows`]: the same rows as [`Backend::gather_rows`] of the same
    /// table; `resident` as for [`Backend::gather_input_rows`]. Panics if an index is out of
    /// range or `table` was not made by this backend (the default, which makes none).
    fn gather_mapped_rows(
        &self,
        table: &MappedRows,
        idx: &[u32],
        resident: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> DeviceResult<Self::Tensor> {
        let _ = (idx, resident);
        panic!(
            "{}: a {} x {} mapped table from another backend",
            self.name(),
            table.rows,
            table.cols
        )
    }
    /// The sizes of a prepared block.
    fn block_dims(&self, block: &Self::Block) -> BlockDims;

    // ----- dense -----

    /// `C <- alpha * op(A) * op(B) + beta * C`, `op(X)` = `X` or `X^T` per flag; `beta == 0`
    /// ignores C's old contents. Multi-threaded. A backend may skip the zeros of `B` in
    /// `A^T B` (a weight gradient behind ReLU or dropout) and those of `A` in `A op(B)` (an
    /// input gradient `G W^T`), so a NaN or infinity in one factor that meets only zeros of
    /// the other need not reach C.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        alpha: f32,
        a: &Self::Tensor,
        trans_a: bool,
        b: &Self::Tensor,
        trans_b: bool,
        beta: f32,
        c: &mut Self::Tensor,
    ) -> DeviceResult<()>;
    /// `(C, A)` with `C = X W_x + A W` (`first = Some((X, W_x))`) or `C = A W`, where `src`
    /// makes the rows of `A` (`m x k`) on the host and `A` is returned on the device (a layer
    /// keeps it for its backward). The same values as making `A` whole, uploading it,
    /// [`Backend::matmul`] of `X W_x` (or zeros) and [`Backend::gemm`] adding `A W` (the
    /// default does exactly that); the CPU backend makes `A`'s rows a few at a time inside the
    /// products, fetching the next ones' stored rows meanwhile, with the same bits.
    fn matmul_sourced(
        &self,
        first: Option<(&Self::Tensor, &Self::Tensor)>,
        src: &dyn RowSource,
        w: &Self::Tensor,
    ) -> DeviceResult<(Self::Tensor, Self::Tensor)> {
        let m = src.rows();
        let a = self.upload_owned(crate::source::made_whole(src))?;
        let mut c = match first {
            Some((x, wx)) => self.matmul(x, false, wx, false)?,
            None => self.zeros(m, self.shape(w).1)?,
        };
        let beta = if first.is_some() { 1.0 } else { 0.0 };
        self.gemm(1.0, &a, false, w, false, beta, &mut c)?;
        Ok((c, a))
    }
    /// Weight gradients that share one output gradient: `c_i <- c_i + a_i^T g` for every
    /// `(a_i, c_i)` in `pairs`, each `a_i` with `g`'s rows. The same values as one
    /// `gemm(1, a_i, true, g, false, 1, c_i)` per pair up to rounding (the default does
    /// exactly that); a backend may read `g` once for all pairs and skip its zeros.
    fn acc_at_b_shared(
        &self,
        g: &Self::Tensor,
        pairs: &mut [(&Self::Tensor, &mut Self::Tensor)],
    ) -> DeviceResult<()> {
        for (a, c) in pairs.iter_mut() {
            self.gemm(1.0, a, true, g, false, 1.0, c)?;
        }
        Ok(())
    }
    /// Weight and bias gradients through an epilogue that kept `factor`, when nothing else
    /// needs the gradient at its input `g = grad * factor` (elementwise): `bias <- bias +
    /// column sums of g` and `c_i <- c_i + a_i^T g` for every pair. The same values as
    /// [`Backend::mul_sum_rows`], [`Backend::axpy`] of the sums into `bias` and
    /// [`Backend::acc_at_b_shared`] (the default does exactly that, and the CPU backend gives
    /// the same bits); a backend may make `g` where it marks its non-zeros instead of
    /// writing it out. Panics if the shapes differ.
    fn acc_at_b_shared_product(
        &self,
        grad: &Self::Tensor,
        factor: &Self::Tensor,
        pairs: &mut [(&Self::Tensor, &mut Self::Tensor)],
        bias: &mut Self::Tensor,
    ) -> DeviceResult<()> {
        let (g, sums) = self.mul_sum_rows(grad, factor)?;
        self.axpy(1.0, &sums, bias)?;
        self.acc_at_b_shared(&g, pairs)
    }
    /// `op(A) * op(B)` as a new tensor.
    fn matmul(
        &self,
        a: &Self::Tensor,
        trans_a: bool,
        b: &Self::Tensor,
        trans_b: bool,
    ) -> DeviceResult<Self::Tensor> {
        let (ar, ac) = self.shape(a);
        let (br, bc) = self.shape(b);
        let m = if trans_a { ac } else { ar };
        let n = if trans_b { br } else { bc };
        let mut c = self.zeros(m, n)?;
        self.gemm(1.0, a, trans_a, b, trans_b, 0.0, &mut c)?;
        Ok(c)
    }
    /// `x[r] += bias` for every row (`bias` is `1 x cols`).
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Tensor) -> DeviceResult<()>;
    /// Column sums as a `1 x cols` tensor (the bias gradient).
    fn sum_rows(&self, x: &Self::Tensor) -> DeviceResult<Self::Tensor>;
    /// `y <- y + alpha * x` (same shapes).
    fn axpy(&self, alpha: f32, x: &Self::Tensor, y: &mut Self::Tensor) -> DeviceResult<()>;
    /// `y[..rows] <- y[..rows] + alpha * x[..rows]`: both need at least `rows` rows and the same
    /// column count. Moves data between a block's destination rows and its source rows.
    fn axpy_prefix(
        &self,
        alpha: f32,
        x: &Self::Tensor,
        y: &mut Self::Tensor,
        rows: usize,
    ) -> DeviceResult<()>;
    /// [`Backend::axpy_prefix`] with `alpha = 1 + s`, `s` the value of the `1 x 1` tensor `s`
    /// and the sum taken in f32, bit for bit, without reading `s` back on a device (GIN's
    /// eps). The default reads it back.
    fn axpy_prefix_one_plus(
        &self,
        s: &Self::Tensor,
        x: &Self::Tensor,
        y: &mut Self::Tensor,
        rows: usize,
    ) -> DeviceResult<()> {
        let v = self.download(s)?.data()[0];
        self.axpy_prefix(1.0 + v, x, y, rows)
    }
    /// The first `rows` rows of `x` as a new tensor (e.g. `h_dst` from `h_src`).
    fn prefix_rows(&self, x: &Self::Tensor, rows: usize) -> DeviceResult<Self::Tensor>;
    /// A copy of `x` (tensors are not `Clone`: a device copy can fail). The default copies
    /// every row with [`Backend::prefix_rows`].
    fn copy(&self, x: &Self::Tensor) -> DeviceResult<Self::Tensor> {
        self.prefix_rows(x, self.shape(x).0)
    }
    /// `x <- alpha * x`.
    fn scale(&self, x: &mut Self::Tensor, alpha: f32) -> DeviceResult<()>;
    /// Elementwise product.
    fn mul(&self, a: &Self::Tensor, b: &Self::Tensor) -> DeviceResult<Self::Tensor>;
    /// `(mul(a, b), sum_rows(mul(a, b)))` in one pass over the product, bit for bit: the
    /// gradient at a layer's epilogue input and its bias gradient. Panics if the shapes differ.
    fn mul_sum_rows(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
    ) -> DeviceResult<(Self::Tensor, Self::Tensor)>;
    /// Sum of the elementwise product, accumulated in f64 (reads back to the host).
    fn dot(&self, a: &Self::Tensor, b: &Self::Tensor) -> DeviceResult<f64>;
    /// `y[0, 0] += dot(a, b)` rounded to f32, for a `1 x 1` `y`: [`Backend::dot`] as f32,
    /// added as [`Backend::axpy`] with `alpha = 1` adds it, bit for bit, and without reading
    /// the sum back on a device (GIN's eps gradient). The default reads it back.
    fn add_dot(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        y: &mut Self::Tensor,
    ) -> DeviceResult<()> {
        let d = self.dot(a, b)? as f32;
        self.axpy(1.0, &self.upload(&Tensor::scalar(d))?, y)
    }
    /// `max(x, 0)`.
    fn relu(&self, x: &Self::Tensor) -> DeviceResult<Self::Tensor>;
    /// Gradient of [`Backend::relu`] given its output: `grad * (out > 0)`.
    fn relu_backward(&self, grad: &Self::Tensor, out: &Self::Tensor) -> DeviceResult<Self::Tensor>;
    /// `x` where `x > 0`, else `slope * x`.
    fn leaky_relu(&self, x: &Self::Tensor, slope: f32) -> DeviceResult<Self::Tensor>;
    /// Gradient of [`Backend::leaky_relu`] given its input.
    fn leaky_relu_backward(
        &self,
        grad: &Self::Tensor,
        x: &Self::Tensor,
        slope: f32,
    ) -> DeviceResult<Self::Tensor>;
    /// Inverted dropout: returns `(x * mask, mask)` where each mask element is independently 0
    /// with probability `p` and `1 / (1 - p)` otherwise. The mask is a pure function of `key`
    /// and the rows' identities: element `(r, c)` comes from a hash of `mix_keys(&[key, id])`
    /// and `c`, the same on every CPU, where `id` is `row_ids[r]` when given (the global vertex
    /// id of the row, so that a vertex gets the same mask whatever row it lands in, on any
    /// worker) and `r` otherwise. Backward is `mul(grad, mask)`. Panics unless `0 <= p < 1`
    /// and `row_ids`, when given, has at least one entry per row.
    fn dropout(
        &self,
        x: &Self::Tensor,
        p: f32,
        key: u64,
        row_ids: Option<&[u32]>,
    ) -> DeviceResult<(Self::Tensor, Self::Tensor)>;
    /// A layer's epilogue in one pass over `x`, in place: `x <- drop(act(x + bias))`, where
    /// the bias (`1 x cols`) is added when given, `act` is ReLU when `relu` (else the
    /// identity) and `drop` is `dropout`'s (the masks of [`Backend::dropout`] with the same
    /// arguments) when given. The values are those of [`Backend::add_bias`], [`Backend::relu`]
    /// and [`Backend::dropout`] in turn, bit for bit. With `keep`, returns the gradient factor
    /// `F` (same shape; 0 where ReLU cut or dropout dropped, else the dropout scale, 1 without
    /// dropout), so that the gradient at `x + bias` is `mul(grad, F)`; `None` when `keep` is
    /// false or there is neither ReLU nor dropout (the gradient passes through). Panics on a
    /// bias of the wrong shape or a `dropout` that [`Backend::dropout`] would refuse.
    fn epilogue(
        &self,
        x: &mut Self::Tensor,
        bias: Option<&Self::Tensor>,
        relu: bool,
        dropout: Option<DropoutSpec<'_>>,
        keep: bool,
    ) -> DeviceResult<Option<Self::Tensor>>;
    /// Row-wise L2 normalisation `y = x / r` with `r = ||x_row||`, rows of norm 0 left as they
    /// are (`r` taken as 1, as DGL's PinSAGE example does). Returns `(y, r)`, `r` being `N x 1`.
    fn l2_normalize_rows(&self, x: &Self::Tensor) -> DeviceResult<(Self::Tensor, Self::Tensor)>;
    /// Gradient of [`Backend::l2_normalize_rows`]: `(grad - y * <y, grad>) / r` per row.
    fn l2_normalize_rows_backward(
        &self,
        grad: &Self::Tensor,
        y: &Self::Tensor,
        norms: &Self::Tensor,
    ) -> DeviceResult<Self::Tensor>;
    /// Per-head dot products: `x` is `N x (H*F)`, `a` is `H x F`, result `N x H` with
    /// `out[n, h] = sum_f x[n, h*F + f] * a[h, f]` (GAT's attention logits).
    fn head_dot(&self, x: &Self::Tensor, a: &Self::Tensor) -> DeviceResult<Self::Tensor>;
    /// Gradients of [`Backend::head_dot`] given `grad` (`N x H`): `(d x, d a)`.
    fn head_dot_backward(
        &self,
        grad: &Self::Tensor,
        x: &Self::Tensor,
        a: &Self::Tensor,
    ) -> DeviceResult<(Self::Tensor, Self::Tensor)>;
    /// [`Backend::head_dot_backward`] with `d x` added into the first `N` rows of `acc`
    /// instead of returned (`acc` as after `axpy_prefix(1.0, d x, acc, N)`, bit for bit up to
    /// the sign of a zero: the temporary `d x` holds `+0` where a product is `-0`), and
    /// `d a` returned. Spares a layer the `N x (H*F)` temporary. Panics unless `acc` has
    /// `x`'s width and at least its rows.
    fn head_dot_backward_acc(
        &self,
        grad: &Self::Tensor,
        x: &Self::Tensor,
        a: &Self::Tensor,
        acc: &mut Self::Tensor,
    ) -> DeviceResult<Self::Tensor> {
        let (gx, ga) = self.head_dot_backward(grad, x, a)?;
        let rows = self.shape(&gx).0;
        self.axpy_prefix(1.0, &gx, acc, rows)?;
        Ok(ga)
    }
    /// [`Backend::head_dot`] of the first `rows` rows of `x` (`rows x H`): GAT's destination
    /// logits, the destinations being the sources' first rows. The same values as
    /// `head_dot(prefix_rows(x, rows), a)` (the default does exactly that); a backend may read
    /// the rows where they lie. Panics if `rows` exceeds `x`'s rows.
    fn head_dot_prefix(
        &self,
        x: &Self::Tensor,
        a: &Self::Tensor,
        rows: usize,
    ) -> DeviceResult<Self::Tensor> {
        let prefix = self.prefix_rows(x, rows)?;
        self.head_dot(&prefix, a)
    }
    /// [`Backend::head_dot_backward_acc`] for [`Backend::head_dot_prefix`]: `grad` is
    /// `N x H` for the first `N` rows of `x`, whose terms go into the first `N` rows of `acc`;
    /// `d a` is returned. The same values as `head_dot_backward_acc(grad,
    /// prefix_rows(x, N), a, acc)`, bit for bit (the default does exactly that). Panics
    /// unless `x` has at least `N` rows and `acc` has `x`'s width and at least `N` rows.
    fn head_dot_prefix_backward_acc(
        &self,
        grad: &Self::Tensor,
        x: &Self::Tensor,
        a: &Self::Tensor,
        acc: &mut Self::Tensor,
    ) -> DeviceResult<Self::Tensor> {
        let prefix = self.prefix_rows(x, self.shape(grad).0)?;
        self.head_dot_backward_acc(grad, &prefix, a, acc)
    }
    /// Mean over heads: `N x (H*F)` to `N x F`.
    fn head_mean(&self, x: &Self::Tensor, heads: usize) -> DeviceResult<Self::Tensor>;
    /// Gradient of [`Backend::head_mean`]: `N x F` to `N x (H*F)`, each head getting `grad / H`.
    fn head_mean_backward(&self, grad: &Self::Tensor, heads: usize) -> DeviceResult<Self::Tensor>;

    // ----- attention over whole source rows (a GAT layer aggregating before projecting) -----

    /// Whether [`Backend::spmm_heads`], [`Backend::spmm_heads_backward_coeff`],
    /// [`Backend::head_matmul`], [`Backend::head_acc_at_b`] and [`Backend::head_matmul_bt`]
    /// are implemented; where this is false (the default) they return `Err` and a layer must
    /// not call them.
    fn has_head_products(&self) -> bool {
        false
    }
    /// Every head's coefficients applied to whole source rows: `x` is `S x K`, `coeff` is
    /// `E x H`, the result `D x (H*K)` with
    /// `out[d, h*K + k] = sum over edges e into d of coeff[e, h] * x[src(e), k]`.
    fn spmm_heads(
        &self,
        block: &Self::Block,
        coeff: &Self::Tensor,
        x: &Self::Tensor,
    ) -> DeviceResult<Self::Tensor> {
        let _ = (block, coeff, x);
        Err(no_head_products(self.name()))
    }
    /// Gradient of [`Backend::spmm_heads`] with respect to `coeff` (`E x H`, `H` being
    /// `grad`'s width over `x`'s): `d coeff[e, h] = <grad[dst(e), h*K..(h+1)*K], x[src(e)]>`.
    fn spmm_heads_backward_coeff(
        &self,
        block: &Self::Block,
        grad: &Self::Tensor,
        x: &Self::Tensor,
    ) -> DeviceResult<Self::Tensor> {
        let _ = (block, grad, x);
        Err(no_head_products(self.name()))
    }
    /// Per-head products: `y` is `N x (H*K)`, `w` is `K x (H*F)`, the result `N x (H*F)` with
    /// `out[:, h*F..(h+1)*F] = y[:, h*K..(h+1)*K] w[:, h*F..(h+1)*F]`.
    fn head_matmul(
        &self,
        y: &Self::Tensor,
        w: &Self::Tensor,
        heads: usize,
    ) -> DeviceResult<Self::Tensor> {
        let _ = (y, w, heads);
        Err(no_head_products(self.name()))
    }
    /// Weight gradient of [`Backend::head_matmul`]: `gw[:, h*F..(h+1)*F] +=
    /// y[:, h*K..(h+1)*K]^T g[:, h*F..(h+1)*F]` (`g` is `N x (H*F)`, `gw` is `K x (H*F)`).
    fn head_acc_at_b(
        &self,
        y: &Self::Tensor,
        g: &Self::Tensor,
        gw: &mut Self::Tensor,
        heads: usize,
    ) -> DeviceResult<()> {
        let _ = (y, g, gw, heads);
        Err(no_head_products(self.name()))
    }
    /// Input gradient of [`Backend::head_matmul`]: `g` is `N x (H*F)`, `w` is `K x (H*F)`,
    /// the result `N x (H*K)` with `out[:, h*K..(h+1)*K] = g[:, h*F..(h+1)*F]
    /// w[:, h*F..(h+1)*F]^T`.
    fn head_matmul_bt(
        &self,
        g: &Self::Tensor,
        w: &Self::Tensor,
        heads: usize,
    ) -> DeviceResult<Self::Tensor> {
        let _ = (g, w, heads);
        Err(no_head_products(self.name()))
    }

    // ----- graph (parallel over destinations, or over sources for the transposed side) -----

    /// The per-edge coefficients (`E x 1`) that implement `agg` on `block`; `None` for
    /// [`Aggregation::Sum`] (all ones).
    fn edge_coefficients(
        &self,
        block: &Self::Block,
        agg: Aggregation,
    ) -> DeviceResult<Option<Self::Tensor>>;
    /// Generalised sparse-dense product (DGL `u_mul_e_sum`): `x` is `S x (H*F)`, `coeff` is
    /// `E x H` (or `None` = all ones, any H), result `D x (H*F)` with
    /// `out[d, h*F+f] = sum over edges e into d of coeff[e, h] * x[src(e), h*F+f]`.
    fn spmm(
        &self,
        block: &Self::Block,
        coeff: Option<&Self::Tensor>,
        x: &Self::Tensor,
    ) -> DeviceResult<Self::Tensor>;
    /// Gradient of [`Backend::spmm`] with respect to `x` (`S x (H*F)`); rows of sources
    /// without outgoing edges are zero.
    fn spmm_backward_x(
        &self,
        block: &Self::Block,
        coeff: Option<&Self::Tensor>,
        grad: &Self::Tensor,
    ) -> DeviceResult<Self::Tensor>;
    /// Gradient of [`Backend::spmm`] with respect to `coeff` (`E x H`):
    /// `d coeff[e, h] = <grad[dst(e), head h], x[src(e), head h]>`.
    fn spmm_backward_coeff(
        &self,
        block: &Self::Block,
        grad: &Self::Tensor,
        x: &Self::Tensor,
        heads: usize,
    ) -> DeviceResult<Self::Tensor>;
    /// Both gradients of [`Backend::spmm`] with coefficients, `(d x, d coeff)`: the results of
    /// [`Backend::spmm_backward_x`] and [`Backend::spmm_backward_coeff`] (with `heads` the
    /// columns of `coeff`), bit for bit. A backend may compute them in one pass.
    fn spmm_backward(
        &self,
        block: &Self::Block,
        coeff: &Self::Tensor,
        grad: &Self::Tensor,
        x: &Self::Tensor,
    ) -> DeviceResult<(Self::Tensor, Self::Tensor)> {
        let heads = self.shape(coeff).1;
        Ok((
            self.spmm_backward_x(block, Some(coeff), grad)?,
            self.spmm_backward_coeff(block, grad, x, heads)?,
        ))
    }
    /// [`Backend::spmm`] with the coefficients of `agg` (block aggregation).
    fn aggregate(
        &self,
        block: &Self::Block,
        x: &Self::Tensor,
        agg: Aggregation,
    ) -> DeviceResult<Self::Tensor> {
        let c = self.edge_coefficients(block, agg)?;
        self.spmm(block, c.as_ref(), x)
    }
    /// Gradient of [`Backend::aggregate`] with respect to `x`.
    fn aggregate_backward(
        &self,
        block: &Self::Block,
        grad: &Self::Tensor,
        agg: Aggregation,
    ) -> DeviceResult<Self::Tensor> {
        let c = self.edge_coefficients(block, agg)?;
        self.spmm_backward_x(block, c.as_ref(), grad)
    }
    /// Edge scores from endpoint scores (DGL `u_add_v`): `el` is `S x H`, `er` is `D x H`,
    /// result `E x H` with `out[e] = el[src(e)] + er[dst(e)]`.
    fn u_add_v(
        &self,
        block: &Self::Block,
        el: &Self::Tensor,
        er: &Self::Tensor,
    ) -> DeviceResult<Self::Tensor>;
    /// Sums an `E x H` edge tensor onto sources: `S x H` (the `el` gradient of `u_add_v`).
    fn edge_sum_to_src(&self, block: &Self::Block, e: &Self::Tensor) -> DeviceResult<Self::Tensor>;
    /// Sums an `E x H` edge tensor onto destinations: `D x H` (the `er` gradient of `u_add_v`).
    fn edge_sum_to_dst(&self, block: &Self::Block, e: &Self::Tensor) -> DeviceResult<Self::Tensor>;
    /// Softmax of `E x H` scores over the incoming edges of each destination, per head
    /// (numerically stable: the maximum is subtracted first).
    fn edge_softmax(
        &self,
        block: &Self::Block,
        scores: &Self::Tensor,
    ) -> DeviceResult<Self::Tensor>;
    /// Gradient of [`Backend::edge_softmax`] given its output `a`:
    /// `d s[e] = a[e] * (grad[e] - sum over edges e' of dst(e) of a[e'] * grad[e'])`.
    fn edge_softmax_backward(
        &self,
        block: &Self::Block,
        a: &Self::Tensor,
        grad: &Self::Tensor,
    ) -> DeviceResult<Self::Tensor>;
    /// `out[i] = x[idx[i]]`. Panics if an index is out of range.
    fn gather_rows(&self, x: &Self::Tensor, idx: &[u32]) -> DeviceResult<Self::Tensor>;
    /// `y[idx[i]] += x[i]` for every `i`, duplicates summed. Panics if an index is out of range.
    fn scatter_add_rows(
        &self,
        y: &mut Self::Tensor,
        idx: &[u32],
        x: &Self::Tensor,
    ) -> DeviceResult<()>;

    // ----- loss and metrics -----

    /// Softmax cross-entropy of `logits` (`N x C`) against `labels` (`N` entries, -1 = no
    /// label, ignored), averaged over the labelled rows. `Err` on a label outside `-1..C` or a
    /// length mismatch.
    fn softmax_cross_entropy(
        &self,
        logits: &Self::Tensor,
        labels: &[i64],
    ) -> Result<CrossEntropy<Self::Tensor>>;
    /// `(correct, labelled)`: rows whose arg-max (first maximum on ties) equals the label, and
    /// rows with a label other than -1.
    fn accuracy(&self, logits: &Self::Tensor, labels: &[i64]) -> DeviceResult<(usize, usize)>;
    /// [`Backend::softmax_cross_entropy`] and the `correct` count of [`Backend::accuracy`] of
    /// the same logits and labels, in one call (a device backend reads both back at once; the
    /// default calls the two). The labelled count is the cross-entropy's `count`.
    fn loss_and_accuracy(
        &self,
        logits: &Self::Tensor,
        labels: &[i64],
    ) -> Result<(CrossEntropy<Self::Tensor>, usize)> {
        let ce = self.softmax_cross_entropy(logits, labels)?;
        let (correct, _) = self.accuracy(logits, labels)?;
        Ok((ce, correct))
    }
    /// Whether every element of every tensor of `tensors` is finite (no NaN, no infinity).
    /// The default reads each one back; a device backend answers with one read of a flag.
    fn all_finite(&self, tensors: &[&Self::Tensor]) -> DeviceResult<bool> {
        for t in tensors {
            if !self.download(t)?.data().iter().all(|v| v.is_finite()) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether reading a value back waits for the work queued before it (a device with its
    /// own queue): the training loop then reads a step's figures one step late
    /// ([`Backend::read_later`]) and gates the optimiser on the device
    /// ([`Backend::mark_non_finite`]). The default, `false`, reads at once.
    fn defers_reads(&self) -> bool {
        false
    }
    /// [`Backend::loss_and_accuracy`] with the loss and correct count left on the backend as a
    /// `1 x 2` tensor, nothing read back. The default computes them with
    /// `loss_and_accuracy` and uploads them.
    fn loss_and_accuracy_on_device(
        &self,
        logits: &Self::Tensor,
        labels: &[i64],
    ) -> Result<StepFigures<Self::Tensor>> {
        let (ce, correct) = self.loss_and_accuracy(logits, labels)?;
        let figures = Tensor::new(1, 2, vec![ce.loss, correct as f32]);
        Ok(StepFigures {
            figures: self.upload_owned(figures)?,
            count: ce.count,
            grad: ce.grad,
        })
    }
    /// Marks `gate` (a `1 x (1 + slots)` tensor, zeros when made) when `x` holds a value that
    /// is not finite: `gate[0]` becomes 1 and `gate[1 + slot]` one of `x`'s non-finite values
    /// (the first, in the default). A gate once marked stays marked; the gated updates
    /// ([`Backend::adam_update_gated`]) skip from then on. Nothing is read back on a device.
    /// Panics if `slot` is outside the gate.
    fn mark_non_finite(
        &self,
        x: &Self::Tensor,
        gate: &mut Self::Tensor,
        slot: usize,
    ) -> DeviceResult<()> {
        let (rows, cols) = self.shape(gate);
        assert!(
            rows == 1 && slot + 1 < cols,
            "mark_non_finite: slot {slot} outside the gate"
        );
        let Some(&bad) = self.download(x)?.data().iter().find(|v| !v.is_finite()) else {
            return Ok(());
        };
        let mut g = self.download(gate)?.data().to_vec();
        g[0] = 1.0;
        if g[1 + slot] == 0.0 {
            g[1 + slot] = bad;
        }
        *gate = self.upload_owned(Tensor::new(1, cols, g))?;
        Ok(())
    }
    /// Starts reading `t` back to the host without waiting for the work queued before it; the
    /// value is had with [`Backend::finish_read`]. The default reads at once.
    fn read_later(&self, t: &Self::Tensor) -> DeviceResult<PendingRead> {
        Ok(PendingRead::done(self.download(t)?))
    }
    /// The value of a read started by [`Backend::read_later`] (waits for it). Panics on a
    /// read another backend started.
    fn finish_read(&self, read: PendingRead) -> DeviceResult<Tensor> {
        Ok(read
            .into_inner()
            .unwrap_or_else(|_| panic!("finish_read: a read {} did not start", self.name())))
    }

    // ----- several workers -----

    /// `(rank, size)` in the group of devices this backend joined to sum gradients among
    /// themselves ([`Backend::sum_over_group`]; NCCL on CUDA), or `None` (the default): the
    /// workers then sum on the host through their communicator.
    fn device_group(&self) -> Option<(usize, usize)> {
        None
    }
    /// Sums `tensors`, read as one vector in order, over the device group: every rank's
    /// tensors become `scale_out * (scale_in_0 t_0 + scale_in_1 t_1 + ... )`, where `t_r` and
    /// `scale_in_r` are rank `r`'s, added in rank order with the product by `scale_out` after
    /// the adds. So the result is, bit for bit, that of downloading `scale_in * t`, summing it
    /// with `fanout_comm`'s rank-order all-reduce and uploading it multiplied by `scale_out`
    /// (for finite values; a NaN's payload may differ).
    /// Every rank must call it with the same shapes and `scale_out`. Nothing is read back.
    /// `Err` on a backend with no group: the default.
    fn sum_over_group(
        &self,
        tensors: &mut [&mut Self::Tensor],
        scale_in: f32,
        scale_out: f32,
    ) -> DeviceResult<()> {
        let _ = (tensors, scale_in, scale_out);
        Err(DeviceFailure::new(format!(
            "sum_over_group: the {} backend has joined no device group",
            self.name()
        )))
    }

    // ----- optimiser updates -----

    /// [`Backend::adam_update`] unless `gate` ([`Backend::mark_non_finite`]) is marked. The
    /// default reads the gate.
    fn adam_update_gated(
        &self,
        value: &mut Self::Tensor,
        grad: &Self::Tensor,
        m: &mut Self::Tensor,
        v: &mut Self::Tensor,
        hp: &AdamUpdate,
        gate: &Self::Tensor,
    ) -> DeviceResult<()> {
        if gate_open(self, gate)? {
            self.adam_update(value, grad, m, v, hp)?;
        }
        Ok(())
    }
    /// [`Backend::sgd_update`] unless `gate` ([`Backend::mark_non_finite`]) is marked. The
    /// default reads the gate.
    fn sgd_update_gated(
        &self,
        value: &mut Self::Tensor,
        grad: &Self::Tensor,
        buf: &mut Self::Tensor,
        hp: &SgdUpdate,
        gate: &Self::Tensor,
    ) -> DeviceResult<()> {
        if gate_open(self, gate)? {
            self.sgd_update(value, grad, buf, hp)?;
        }
        Ok(())
    }
    /// One Adam update of `value` in place, moments `m`, `v` updated (all of one shape).
    fn adam_update(
        &self,
        value: &mut Self::Tensor,
        grad: &Self::Tensor,
        m: &mut Self::Tensor,
        v: &mut Self::Tensor,
        hp: &AdamUpdate,
    ) -> DeviceResult<()>;
    /// One SGD update of `value` in place; `buf` is the momentum buffer (ignored when
    /// `hp.momentum == 0`).
    fn sgd_update(
        &self,
        value: &mut Self::Tensor,
        grad: &Self::Tensor,
        buf: &mut Self::Tensor,
        hp: &SgdUpdate,
    ) -> DeviceResult<()>;
}

/// The failure of a per-head product asked of a backend without them
/// ([`Backend::has_head_products`]).
fn no_head_products(backend: &str) -> DeviceFailure {
    DeviceFailure::new(format!(
        "the {backend} backend has no per-head products (a GAT layer asked for them without checking `has_head_products`)"
    ))
}
