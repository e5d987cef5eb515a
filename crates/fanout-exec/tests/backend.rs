//! The run layer over a backend other than the CPU: `train_with_backend` with a backend that
//! delegates every kernel to the CPU backend but is not named "cpu" trains the CPU's model
//! bit for bit (so nothing of the run silently stays on `CpuBackend` or takes a CPU-only
//! path), and the options that run on the CPU only are refused with a clear error.

use fanout_compute::{
    io, AdamUpdate, Aggregation, Backend, BlockDims, BlockRef, CpuBackend, CpuBlock, CrossEntropy,
    DeviceFailure, DeviceResult, DropoutSpec, MappedRows, Model, ModelKind, SgdUpdate, Tensor,
};
use fanout_exec::trainer::block_refs;
use fanout_exec::{
    evaluate_checkpoint, evaluate_checkpoint_with, train, train_with_backend, CacheSpec, Comm,
    EvalRequest, EvalSplit, ExecError, FeaturePlacement, MemoryProbe, RunEnv, SamplingPlacement,
    StrategyKind, TrainConfig, TrainOutcome,
};
use fanout_graph::{Dataset, NoProgress};
use std::sync::atomic::{AtomicUsize, Ordering};

mod common;
use common::saved_tiny;

/// A backend that is the CPU backend under another name: every method, provided ones
/// included, delegates to the inner [`CpuBackend`]. Each option adds one thing; [`NAMED`] has
/// none (build others with `Named { field: .., ..NAMED }`).
#[derive(Clone, Copy, Debug)]
struct Named {
    cpu: CpuBackend,
    /// A countdown of matrix products: the last one fails like a GPU out of memory (an
    /// `Err` of [`DeviceFailure`]).
    products_left: Option<&'static AtomicUsize>,
    /// A countdown of every call that can fail on a device: the last one fails.
    calls_left: Option<&'static AtomicUsize>,
    /// Counts `gather_rows` calls.
    gathers: Option<&'static AtomicUsize>,
    /// Counts `gather_mapped_rows` calls.
    mapped_gathers: Option<&'static AtomicUsize>,
    /// Counts `read_later` calls.
    reads_later: Option<&'static AtomicUsize>,
    /// Its free memory, as a device reports it (`None`: memory it shares with the host).
    free: Option<u64>,
    /// A device group (as NCCL joins GPUs): its `sum_over_group` sums through this member of
    /// a host group, as the trait documents the result.
    group: Option<&'static fanout_exec::LocalComm>,
}

/// [`Named`] that never fails, counts nothing and reports no memory of its own.
const NAMED: Named = Named {
    cpu: CpuBackend,
    products_left: None,
    calls_left: None,
    gathers: None,
    mapped_gathers: None,
    reads_later: None,
    free: None,
    group: None,
};

/// Counts `left` down (when given), failing the device with `message` on the last count.
fn fail_on_last(left: Option<&AtomicUsize>, message: &str) -> DeviceResult<()> {
    match left {
        Some(left) if left.fetch_sub(1, Ordering::SeqCst) == 1 => Err(DeviceFailure::new(message)),
        _ => Ok(()),
    }
}

impl Named {
    /// Counts a matrix product down, failing the device on the last one.
    fn count_down(&self) -> DeviceResult<()> {
        let oom = "CUDA cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (fake)";
        fail_on_last(self.products_left, oom)
    }

    /// Counts a fallible call down, failing the device on the last one.
    fn count_call(&self) -> DeviceResult<()> {
        let refused = "CUDA launch failed: CUDA_ERROR_LAUNCH_FAILED (fake)";
        fail_on_last(self.calls_left, refused)
    }
}

/// Calls of [`Named`]'s optimiser update and accuracy kernels (training and evaluation went
/// through it), all tests together.
static NAMED_CALLS: AtomicUsize = AtomicUsize::new(0);

/// A copy of a batch's blocks "on the device" of [`Named`], which adopts it.
struct HeldBlocks(Vec<fanout_sample::Block>);

/// `Model::prepare_blocks_from` takes the copy a backend adopts, and the host blocks when the
/// backend knows no such copy or there is none.
#[test]
fn blocks_a_backend_adopts_replace_the_host_blocks() {
    let block = |num_dst: usize, num_src: usize, indptr: Vec<u32>, indices: Vec<u32>| {
        fanout_sample::Block {
            num_dst,
            num_src,
            indptr,
            indices,
            weights: None,
        }
    };
    let host = [block(2, 3, vec![0, 1, 2], vec![2, 1])];
    // The held copy differs from the host blocks, so which one was used shows.
    let held = HeldBlocks(vec![block(2, 3, vec![0, 2, 3], vec![2, 1, 0])]);
    let refs = block_refs(&host);
    let cfg = fanout_compute::ModelConfig::new(ModelKind::Sage, 4, 4, 2, 1);
    let model = Model::new(NAMED, cfg).unwrap();
    let edges = |r: Option<&(dyn std::any::Any + Send + Sync)>| {
        let b = model.prepare_blocks_from(r, &refs).unwrap();
        NAMED.block_dims(&b[0]).num_edges
    };
    assert_eq!(edges(Some(&held)), 3, "the held copy was adopted");
    assert_eq!(edges(Some(&"not a copy Named knows")), 2, "host blocks");
    assert_eq!(edges(None), 2, "host blocks");
}

/// Calls of [`Named`]'s `sum_over_group`, all tests together.
static GROUP_SUMS: AtomicUsize = AtomicUsize::new(0);

/// Calls of [`Named`]'s `gather_rows` (batches gathered on the "device"), all tests together.
static GATHER_CALLS: AtomicUsize = AtomicUsize::new(0);
/// [`Named`]'s `gather_mapped_rows` calls, all instances together.
static MAPPED_GATHERS: AtomicUsize = AtomicUsize::new(0);

impl Backend for Named {
    type Tensor = Tensor;
    type Block = CpuBlock;

    fn name(&self) -> &'static str {
        "named"
    }
    fn free_memory(&self) -> Option<u64> {
        self.free
    }
    /// Reads as a device does: every one-worker run here trains with each step's figures
    /// read a step late and the optimiser gated by the backend's non-finite gate.
    fn defers_reads(&self) -> bool {
        true
    }
    fn on_compute_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.cpu.on_compute_threads(f)
    }
    fn upload(&self, host: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.upload(host)
    }
    fn upload_owned(&self, host: Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.upload_owned(host)
    }
    fn download(&self, t: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.download(t)
    }
    fn zeros(&self, rows: usize, cols: usize) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.zeros(rows, cols)
    }
    fn shape(&self, t: &Tensor) -> (usize, usize) {
        self.cpu.shape(t)
    }
    fn fill_zero(&self, t: &mut Tensor) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.fill_zero(t)
    }
    fn prepare_block(&self, block: &BlockRef<'_>) -> fanout_compute::Result<CpuBlock> {
        self.cpu.prepare_block(block)
    }
    fn block_dims(&self, block: &CpuBlock) -> BlockDims {
        self.cpu.block_dims(block)
    }
    /// Adopts a [`HeldBlocks`] copy: prepares *its* blocks, not the host ones it is given.
    fn adopt_blocks(
        &self,
        resident: &(dyn std::any::Any + Send + Sync),
        blocks: &[BlockRef<'_>],
    ) -> DeviceResult<Option<Vec<CpuBlock>>> {
        self.count_call()?;
        let Some(held) = resident.downcast_ref::<HeldBlocks>() else {
            return Ok(None);
        };
        assert_eq!(held.0.len(), blocks.len(), "a held copy of other blocks");
        let refs = block_refs(&held.0);
        Ok(Some(
            refs.iter()
                .map(|r| self.cpu.prepare_block(r).unwrap())
                .collect(),
        ))
    }
    fn gemm(
        &self,
        alpha: f32,
        a: &Tensor,
        trans_a: bool,
        b: &Tensor,
        trans_b: bool,
        beta: f32,
        c: &mut Tensor,
    ) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.gemm(alpha, a, trans_a, b, trans_b, beta, c)
    }
    fn acc_at_b_shared(
        &self,
        g: &Tensor,
        pairs: &mut [(&Tensor, &mut Tensor)],
    ) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.acc_at_b_shared(g, pairs)
    }
    fn matmul(&self, a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.count_down()?;
        self.cpu.matmul(a, trans_a, b, trans_b)
    }
    fn add_bias(&self, x: &mut Tensor, bias: &Tensor) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.add_bias(x, bias)
    }
    fn sum_rows(&self, x: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.sum_rows(x)
    }
    fn axpy(&self, alpha: f32, x: &Tensor, y: &mut Tensor) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.axpy(alpha, x, y)
    }
    fn axpy_prefix(&self, alpha: f32, x: &Tensor, y: &mut Tensor, rows: usize) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.axpy_prefix(alpha, x, y, rows)
    }
    fn prefix_rows(&self, x: &Tensor, rows: usize) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.prefix_rows(x, rows)
    }
    fn scale(&self, x: &mut Tensor, alpha: f32) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.scale(x, alpha)
    }
    fn copy(&self, x: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.copy(x)
    }
    fn mul(&self, a: &Tensor, b: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.mul(a, b)
    }
    fn mul_sum_rows(&self, a: &Tensor, b: &Tensor) -> DeviceResult<(Tensor, Tensor)> {
        self.count_call()?;
        self.cpu.mul_sum_rows(a, b)
    }
    fn dot(&self, a: &Tensor, b: &Tensor) -> DeviceResult<f64> {
        self.count_call()?;
        self.cpu.dot(a, b)
    }
    fn relu(&self, x: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.relu(x)
    }
    fn relu_backward(&self, grad: &Tensor, out: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.relu_backward(grad, out)
    }
    fn leaky_relu(&self, x: &Tensor, slope: f32) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.leaky_relu(x, slope)
    }
    fn leaky_relu_backward(&self, grad: &Tensor, x: &Tensor, slope: f32) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.leaky_relu_backward(grad, x, slope)
    }
    fn dropout(
        &self,
        x: &Tensor,
        p: f32,
        key: u64,
        row_ids: Option<&[u32]>,
    ) -> DeviceResult<(Tensor, Tensor)> {
        self.count_call()?;
        self.cpu.dropout(x, p, key, row_ids)
    }
    fn epilogue(
        &self,
        x: &mut Tensor,
        bias: Option<&Tensor>,
        relu: bool,
        dropout: Option<DropoutSpec<'_>>,
        keep: bool,
    ) -> DeviceResult<Option<Tensor>> {
        self.count_call()?;
        self.cpu.epilogue(x, bias, relu, dropout, keep)
    }
    fn l2_normalize_rows(&self, x: &Tensor) -> DeviceResult<(Tensor, Tensor)> {
        self.count_call()?;
        self.cpu.l2_normalize_rows(x)
    }
    fn l2_normalize_rows_backward(
        &self,
        grad: &Tensor,
        y: &Tensor,
        norms: &Tensor,
    ) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.l2_normalize_rows_backward(grad, y, norms)
    }
    fn head_dot(&self, x: &Tensor, a: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.head_dot(x, a)
    }
    fn head_dot_backward(
        &self,
        grad: &Tensor,
        x: &Tensor,
        a: &Tensor,
    ) -> DeviceResult<(Tensor, Tensor)> {
        self.count_call()?;
        self.cpu.head_dot_backward(grad, x, a)
    }
    fn head_dot_backward_acc(
        &self,
        grad: &Tensor,
        x: &Tensor,
        a: &Tensor,
        acc: &mut Tensor,
    ) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.head_dot_backward_acc(grad, x, a, acc)
    }
    fn head_mean(&self, x: &Tensor, heads: usize) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.head_mean(x, heads)
    }
    fn head_mean_backward(&self, grad: &Tensor, heads: usize) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.head_mean_backward(grad, heads)
    }
    fn edge_coefficients(
        &self,
        block: &CpuBlock,
        agg: Aggregation,
    ) -> DeviceResult<Option<Tensor>> {
        self.count_call()?;
        self.cpu.edge_coefficients(block, agg)
    }
    fn spmm(&self, block: &CpuBlock, coeff: Option<&Tensor>, x: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.spmm(block, coeff, x)
    }
    fn spmm_backward_x(
        &self,
        block: &CpuBlock,
        coeff: Option<&Tensor>,
        grad: &Tensor,
    ) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.spmm_backward_x(block, coeff, grad)
    }
    fn spmm_backward_coeff(
        &self,
        block: &CpuBlock,
        grad: &Tensor,
        x: &Tensor,
        heads: usize,
    ) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.spmm_backward_coeff(block, grad, x, heads)
    }
    fn spmm_backward(
        &self,
        block: &CpuBlock,
        coeff: &Tensor,
        grad: &Tensor,
        x: &Tensor,
    ) -> DeviceResult<(Tensor, Tensor)> {
        self.count_call()?;
        self.cpu.spmm_backward(block, coeff, grad, x)
    }
    fn aggregate(&self, block: &CpuBlock, x: &Tensor, agg: Aggregation) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.aggregate(block, x, agg)
    }
    fn aggregate_backward(
        &self,
        block: &CpuBlock,
        grad: &Tensor,
        agg: Aggregation,
    ) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.aggregate_backward(block, grad, agg)
    }
    fn u_add_v(&self, block: &CpuBlock, el: &Tensor, er: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.u_add_v(block, el, er)
    }
    fn edge_sum_to_src(&self, block: &CpuBlock, e: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.edge_sum_to_src(block, e)
    }
    fn edge_sum_to_dst(&self, block: &CpuBlock, e: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.edge_sum_to_dst(block, e)
    }
    fn edge_softmax(&self, block: &CpuBlock, scores: &Tensor) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.edge_softmax(block, scores)
    }
    fn edge_softmax_backward(
        &self,
        block: &CpuBlock,
        a: &Tensor,
        grad: &Tensor,
    ) -> DeviceResult<Tensor> {
        self.count_call()?;
        self.cpu.edge_softmax_backward(block, a, grad)
    }
    /// "Maps" host rows as a CPU tensor held by the table.
    fn map_host_rows(
        &self,
        rows: usize,
        cols: usize,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Option<fanout_compute::Result<MappedRows>> {
        let mut data = vec![0.0f32; rows * cols];
        fill(&mut data);
        let table = Tensor::new(rows, cols, data);
        Some(Ok(MappedRows::new(rows, cols, std::sync::Arc::new(table))))
    }
    fn gather_mapped_rows(
        &self,
        table: &MappedRows,
        idx: &[u32],
        _resident: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> DeviceResult<Tensor> {
        self.count_call()?;
        MAPPED_GATHERS.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.mapped_gathers {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let t = table
            .table()
            .downcast_ref::<Tensor>()
            .expect("Named's table");
        self.cpu.gather_rows(t, idx)
    }
    fn gather_rows(&self, x: &Tensor, idx: &[u32]) -> DeviceResult<Tensor> {
        self.count_call()?;
        GATHER_CALLS.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.gathers {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.cpu.gather_rows(x, idx)
    }
    fn scatter_add_rows(&self, y: &mut Tensor, idx: &[u32], x: &Tensor) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.scatter_add_rows(y, idx, x)
    }
    fn softmax_cross_entropy(
        &self,
        logits: &Tensor,
        labels: &[i64],
    ) -> fanout_compute::Result<CrossEntropy<Tensor>> {
        self.cpu.softmax_cross_entropy(logits, labels)
    }
    fn add_dot(&self, a: &Tensor, b: &Tensor, y: &mut Tensor) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.add_dot(a, b, y)
    }
    fn axpy_prefix_one_plus(
        &self,
        s: &Tensor,
        x: &Tensor,
        y: &mut Tensor,
        rows: usize,
    ) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.axpy_prefix_one_plus(s, x, y, rows)
    }
    fn all_finite(&self, tensors: &[&Tensor]) -> DeviceResult<bool> {
        self.count_call()?;
        self.cpu.all_finite(tensors)
    }
    /// Counted (with a counter), then the default: a read at once.
    fn read_later(&self, t: &Tensor) -> DeviceResult<fanout_compute::PendingRead> {
        self.count_call()?;
        if let Some(n) = self.reads_later {
            n.fetch_add(1, Ordering::Relaxed);
        }
        self.cpu.read_later(t)
    }
    fn device_group(&self) -> Option<(usize, usize)> {
        self.group.map(|c| (c.rank(), c.size()))
    }
    /// The trait's reference: scaled in, summed in rank order through the group's host
    /// communicator, scaled out (counted).
    fn sum_over_group(
        &self,
        tensors: &mut [&mut Tensor],
        scale_in: f32,
        scale_out: f32,
    ) -> DeviceResult<()> {
        self.count_call()?;
        GROUP_SUMS.fetch_add(1, Ordering::Relaxed);
        let comm = self.group.expect("sum_over_group without a group");
        let mut flat: Vec<f32> = tensors
            .iter()
            .flat_map(|t| t.data().iter().map(move |v| v * scale_in))
            .collect();
        comm.all_reduce_sum_f32(&mut flat).unwrap();
        let mut at = 0;
        for t in tensors.iter_mut() {
            let (rows, cols) = (t.rows(), t.cols());
            let n = rows * cols;
            **t = Tensor::new(
                rows,
                cols,
                flat[at..at + n].iter().map(|v| v * scale_out).collect(),
            );
            at += n;
        }
        Ok(())
    }
    // `gather_input_rows` keeps its default, which calls `gather_rows` above (counted).
    fn accuracy(&self, logits: &Tensor, labels: &[i64]) -> DeviceResult<(usize, usize)> {
        self.count_call()?;
        NAMED_CALLS.fetch_add(1, Ordering::Relaxed);
        self.cpu.accuracy(logits, labels)
    }
    fn adam_update(
        &self,
        value: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        hp: &AdamUpdate,
    ) -> DeviceResult<()> {
        self.count_call()?;
        NAMED_CALLS.fetch_add(1, Ordering::Relaxed);
        self.cpu.adam_update(value, grad, m, v, hp)
    }
    fn sgd_update(
        &self,
        value: &mut Tensor,
        grad: &Tensor,
        buf: &mut Tensor,
        hp: &SgdUpdate,
    ) -> DeviceResult<()> {
        self.count_call()?;
        self.cpu.sgd_update(value, grad, buf, hp)
    }
}

/// A memory probe with fixed figures, so that `--cache-ratio auto` runs its trial batch.
struct FixedProbe;

impl MemoryProbe for FixedProbe {
    fn name(&self) -> String {
        "fixed".into()
    }
    fn available(&self) -> Result<u64, String> {
        Ok(1 << 30)
    }
    fn reset_peak(&self) -> u64 {
        0
    }
    fn peak(&self) -> u64 {
        1 << 20
    }
}

fn config(ds: &Dataset, model: ModelKind) -> TrainConfig {
    TrainConfig {
        dataset: Some(ds.dir.clone()),
        model,
        fanouts: Some(vec![4, 3]),
        batch_size: Some(40),
        hidden: Some(32),
        epochs: 3,
        lr: Some(0.01),
        dropout: 0.5,
        threads: Some(2),
        seed: 5,
        ..TrainConfig::default()
    }
}

/// `cfg` with a feature cache of `policy` at `ratio` and, with `match_reorder`, Match-Reorder
/// over a window of 4 batches.
fn with_cache(cfg: TrainConfig, policy: &str, ratio: &str, match_reorder: bool) -> TrainConfig {
    TrainConfig {
        cache: CacheSpec {
            policy: policy.into(),
            ratio: ratio.into(),
            match_reorder,
            reorder_window: if match_reorder { 4 } else { 0 },
            ..CacheSpec::default()
        },
        ..cfg
    }
}

/// Every parameter's bits, in `named_params` order.
fn param_bits(m: &Model<CpuBackend>) -> Vec<(String, Vec<u32>)> {
    m.named_params()
        .into_iter()
        .map(|(n, p)| (n, p.value.data().iter().map(|v| v.to_bits()).collect()))
        .collect()
}

/// Bit-identical training: the same losses and accuracies every epoch, the same best model.
fn assert_identical(a: &TrainOutcome, b: &TrainOutcome, what: &str) {
    assert_eq!(a.metrics.epochs.len(), b.metrics.epochs.len(), "{what}");
    for (x, y) in a.metrics.epochs.iter().zip(&b.metrics.epochs) {
        assert_eq!(x.loss.to_bits(), y.loss.to_bits(), "{what}: loss");
        assert_eq!(x.train_acc.to_bits(), y.train_acc.to_bits(), "{what}");
        assert_eq!(
            x.val_acc.map(f64::to_bits),
            y.val_acc.map(f64::to_bits),
            "{what}"
        );
        assert_eq!(
            x.test_acc.map(f64::to_bits),
            y.test_acc.map(f64::to_bits),
            "{what}"
        );
        assert_eq!((x.batches, x.seeds), (y.batches, y.seeds), "{what}");
    }
    assert_eq!(a.metrics.test_acc.to_bits(), b.metrics.test_acc.to_bits());
    assert_eq!(
        a.metrics.best_val_acc.to_bits(),
        b.metrics.best_val_acc.to_bits()
    );
    assert_eq!(a.metrics.best_epoch, b.metrics.best_epoch, "{what}");
    assert_eq!(a.model.config(), b.model.config(), "{what}");
    assert!(
        param_bits(&a.model) == param_bits(&b.model),
        "{what}: parameters differ"
    );
}

/// A backend that reads a step late (`Named`) stops a diverging run at the step the CPU's
/// does, naming the same loss or gradient with the same value: the step queued behind the bad
/// one neither hides it nor changes what is reported.
#[test]
fn a_backend_reading_late_stops_where_the_cpu_does() {
    let (_dir, ds) = saved_tiny(800);
    let env = RunEnv::default();
    for (model, lr) in [
        (ModelKind::Sage, 1e38),
        (ModelKind::Gcn, 1e30),
        (ModelKind::Gat, 1e38),
    ] {
        let cfg = TrainConfig {
            lr: Some(lr),
            ..config(&ds, model)
        };
        let fields = |e: ExecError| match e {
            ExecError::NonFinite {
                epoch, step, what, ..
            } => (epoch, step, what),
            other => panic!("{model:?}: not a non-finite stop: {other}"),
        };
        let cpu = fields(
            train(&cfg, &env, &mut ())
                .err()
                .expect("the CPU run diverges"),
        );
        let late = train_with_backend(NAMED, &cfg, &env, &mut ());
        let late = fields(late.err().expect("the late-reading run diverges"));
        assert_eq!(late, cpu, "{model:?}");
    }
}

#[test]
fn another_backend_trains_the_cpu_model_bit_for_bit() {
    let (_dir, ds) = saved_tiny(800);
    let env = RunEnv::default();
    let probe = FixedProbe;
    let auto_env = RunEnv {
        probe: Some(&probe),
        ..RunEnv::default()
    };
    let cached = TrainConfig {
        cache: CacheSpec {
            policy: "degree".into(),
            ratio: "auto".into(),
            ..CacheSpec::default()
        },
        ..config(&ds, ModelKind::Sage)
    };
    let fused = TrainConfig {
        fuse_input: true,
        ..config(&ds, ModelKind::Gcn)
    };
    let cases = [
        ("sage", config(&ds, ModelKind::Sage), &env),
        ("gat", config(&ds, ModelKind::Gat), &env),
        ("gcn, fused input", fused, &env),
        ("sage, auto-sized cache", cached, &auto_env),
    ];
    for (what, cfg, env) in cases {
        let cpu = train(&cfg, env, &mut ()).unwrap();
        let before = NAMED_CALLS.load(Ordering::Relaxed);
        let named = train_with_backend(NAMED, &cfg, env, &mut ()).unwrap();
        assert!(
            NAMED_CALLS.load(Ordering::Relaxed) > before,
            "{what}: not run on Named"
        );
        assert_identical(&named, &cpu, what);
        assert_eq!((cpu.backend, named.backend), ("cpu", "named"));
        let (rc, rn) = (cpu.report(), named.report());
        assert_eq!(
            (rc["backend"].as_str(), rn["backend"].as_str()),
            (Some("cpu"), Some("named"))
        );
        assert_eq!(rc["cache"], rn["cache"], "{what}: the cache built");
        // The CPU's floors are not reported for another backend's steps.
        assert!(rc["machine_rates"].is_object() && rn["machine_rates"].is_null());
    }
}

#[test]
fn another_backend_checkpoints_and_resumes_like_the_cpu() {
    let (_dir, ds) = saved_tiny(800);
    let t = tempfile::tempdir().unwrap();
    let (ckpt, saved) = (t.path().join("ckpt.safetensors"), t.path().join("model.st"));
    let cfg = config(&ds, ModelKind::Sage);
    let cpu = train(&cfg, &RunEnv::default(), &mut ()).unwrap();
    // Two epochs with a checkpoint after each, then the third resumed from it.
    let first = TrainConfig {
        epochs: 2,
        ..cfg.clone()
    };
    let env = RunEnv {
        checkpoint: Some(&ckpt),
        ..RunEnv::default()
    };
    train_with_backend(NAMED, &first, &env, &mut ()).unwrap();
    let env = RunEnv {
        resume: Some(&ckpt),
        ..RunEnv::default()
    };
    let resumed = train_with_backend(NAMED, &cfg, &env, &mut ()).unwrap();
    assert_eq!(resumed.metrics.epochs.len(), 1);
    assert_eq!(
        resumed.metrics.epochs[0].loss.to_bits(),
        cpu.metrics.epochs[2].loss.to_bits()
    );
    assert_eq!(
        resumed.metrics.test_acc.to_bits(),
        cpu.metrics.test_acc.to_bits()
    );
    assert!(param_bits(&resumed.model) == param_bits(&cpu.model));
    // The outcome's model saves as the CPU run's does.
    resumed.save_model(&saved).unwrap();
    let loaded = io::load(CpuBackend, &saved).unwrap();
    assert!(param_bits(&loaded) == param_bits(&cpu.model));
}

#[test]
fn another_backend_evaluates_a_checkpoint_as_the_cpu_does() {
    let (_dir, ds) = saved_tiny(800);
    let t = tempfile::tempdir().unwrap();
    let cfg = config(&ds, ModelKind::Sage);
    let cpu = train(&cfg, &RunEnv::default(), &mut ()).unwrap();
    let saved = t.path().join("model.safetensors");
    cpu.save_model(&saved).unwrap();
    for split in [EvalSplit::Test, EvalSplit::Valid] {
        let req = EvalRequest {
            checkpoint: saved.clone(),
            dataset: Some(ds.dir.clone()),
            split,
            feature_residency: Default::default(),
        };
        let on_cpu = evaluate_checkpoint(&req, &NoProgress).unwrap();
        let before = NAMED_CALLS.load(Ordering::Relaxed);
        static READS_LATER: AtomicUsize = AtomicUsize::new(0);
        READS_LATER.store(0, Ordering::Relaxed);
        let counted = Named {
            reads_later: Some(&READS_LATER),
            ..NAMED
        };
        let named = evaluate_checkpoint_with(counted, &req, &NoProgress).unwrap();
        assert!(
            NAMED_CALLS.load(Ordering::Relaxed) > before,
            "not run on Named"
        );
        // Named defers reads: each batch's count is read after the next one is queued.
        let ids = match split {
            EvalSplit::Test => ds.test.len(),
            _ => ds.valid.len(),
        };
        let batches = ids.div_ceil(cfg.batch_size.unwrap());
        assert!(batches >= 2, "the split spans several batches");
        assert_eq!(
            READS_LATER.load(Ordering::Relaxed),
            batches,
            "{split:?}: one read a batch, each started before it was needed"
        );
        assert_eq!(named.to_bits(), on_cpu.to_bits(), "{split:?}");
        if split == EvalSplit::Test {
            assert_eq!(named.to_bits(), cpu.metrics.test_acc.to_bits());
        }
    }
}

/// The device assembles cache misses by adding them onto a row of negative zeros: on the CPU
/// backend (the CUDA one is compared with it op by op) every float but a NaN comes out with
/// its bits, both zeros and subnormals included, where a row of positive zeros loses `-0.0`.
#[test]
fn rows_added_onto_negative_zeros_keep_their_bits() {
    let be = CpuBackend;
    let values = [
        -0.0f32,
        0.0,
        f32::from_bits(1),
        -f32::from_bits(1),
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -3.5,
    ];
    let n = values.len();
    let rows = Tensor::new(1, n, values.to_vec());
    for (zero, keeps) in [(-0.0f32, true), (0.0, false)] {
        let table = Tensor::new(2, n, [vec![1.0; n], vec![zero; n]].concat());
        // Row 0 a cache hit, rows 1 and 2 misses onto the zero row, one of them uploaded.
        let mut x = be.gather_rows(&table, &[0, 1, 1]).unwrap();
        be.scatter_add_rows(&mut x, &[2], &rows).unwrap();
        let got: Vec<u32> = x.row(2).iter().map(|v| v.to_bits()).collect();
        let want: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got == want, keeps, "zero row {zero:?}: {got:?}");
        assert!(x.row(0).iter().all(|&v| v == 1.0));
    }
}

/// Matrix products left before the failing [`Named`] of the test below fails.
static PRODUCTS_LEFT: AtomicUsize = AtomicUsize::new(0);

#[test]
fn a_device_failing_mid_run_ends_it_with_an_error_not_a_panic() {
    let (_dir, ds) = saved_tiny(400);
    let cfg = TrainConfig {
        epochs: 2,
        ..config(&ds, ModelKind::Sage)
    };
    let t = tempfile::tempdir().unwrap();
    let ckpt = t.path().join("ckpt.safetensors");
    let env = RunEnv {
        checkpoint: Some(&ckpt),
        ..RunEnv::default()
    };
    // The run takes 24 products: fail at the 10th (in epoch 0, nothing saved yet)
    // and at the 20th (epoch 1, after epoch 0's checkpoint), some steps in, with the
    // pipeline's sampling and extraction threads running.
    for (at, saved) in [(10, false), (20, true)] {
        PRODUCTS_LEFT.store(at, Ordering::SeqCst);
        let failing = Named {
            products_left: Some(&PRODUCTS_LEFT),
            ..NAMED
        };
        let Err(e) = train_with_backend(failing, &cfg, &env, &mut ()) else {
            panic!("the run ended without the device failure")
        };
        assert!(matches!(e, ExecError::Device { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("the device failed: ")
                && msg.contains("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (fake)"),
            "{msg}"
        );
        // Where the last checkpoint is, as an interruption's message says.
        let note = if saved {
            "the last good checkpoint is"
        } else {
            "no epoch finished, so nothing was saved to"
        };
        assert!(
            msg.contains(note) && msg.contains(&*ckpt.to_string_lossy()),
            "{at}: {msg}"
        );
        assert_eq!(ckpt.exists(), saved, "{at}");
    }
    assert_eq!(
        PRODUCTS_LEFT.load(Ordering::SeqCst),
        0,
        "the run stopped at the failure: no product after it"
    );
    // Nothing is left in a bad state: the next run trains to the CPU's model.
    let again = train_with_backend(NAMED, &cfg, &RunEnv::default(), &mut ()).unwrap();
    let cpu = train(&cfg, &RunEnv::default(), &mut ()).unwrap();
    assert_identical(&again, &cpu, "after a device failure");
}

/// One training step of a two-layer `kind` model on `be` (blocks, input rows and labels
/// fixed): every kind of backend call a step makes, the optimiser's included.
fn one_step(be: Named, kind: ModelKind) -> fanout_compute::Result<()> {
    // Block 0: 3 destinations of 6 sources; block 1: 2 seeds of those 3.
    let (p0, i0) = ([0u32, 2, 4, 6], [1u32, 3, 2, 4, 5, 0]);
    let (p1, i1) = ([0u32, 2, 3], [1u32, 2, 0]);
    let refs = [
        BlockRef {
            num_dst: 3,
            num_src: 6,
            indptr: &p0,
            indices: &i0,
            weights: None,
        },
        BlockRef {
            num_dst: 2,
            num_src: 3,
            indptr: &p1,
            indices: &i1,
            weights: None,
        },
    ];
    let mut model = Model::new(be, fanout_compute::ModelConfig::new(kind, 4, 8, 3, 2))?;
    let mut opt = fanout_compute::Adam::new(be, 0.01);
    let blocks = model.prepare_blocks(&refs)?;
    let x = be.upload(&Tensor::from_fn(6, 4, |r, c| {
        (r * 4 + c) as f32 * 0.1 - 1.0
    }))?;
    let logits = model.forward(&blocks, x, fanout_compute::Mode::Train { dropout_key: 3 })?;
    let ce = be.softmax_cross_entropy(&logits, &[2, 0])?;
    model.zero_grad()?;
    model.backward(&ce.grad)?;
    fanout_compute::Optimizer::step_model(&mut opt, &mut model)?;
    Ok(())
}

/// The countdown of [`a_device_failing_at_any_call_of_a_step_returns_its_error`].
static CALLS_LEFT: AtomicUsize = AtomicUsize::new(0);

/// Whichever backend call of a training step the device fails in, for every model kind, the
/// step returns that failure as an error (no panic, no later call), and the same step on a
/// device that does not fail then runs.
#[test]
fn a_device_failing_at_any_call_of_a_step_returns_its_error() {
    let failing = Named {
        calls_left: Some(&CALLS_LEFT),
        ..NAMED
    };
    for kind in ModelKind::ALL {
        // How many calls the step makes: a countdown that does not reach zero.
        let plenty = 1_000_000;
        CALLS_LEFT.store(plenty, Ordering::SeqCst);
        one_step(failing, kind).unwrap();
        let calls = plenty - CALLS_LEFT.load(Ordering::SeqCst);
        assert!(calls > 20, "{kind:?}: only {calls} calls");
        for at in 1..=calls {
            CALLS_LEFT.store(at, Ordering::SeqCst);
            match one_step(failing, kind) {
                Err(fanout_compute::ComputeError::Device(f)) => assert!(
                    f.message.contains("CUDA_ERROR_LAUNCH_FAILED (fake)"),
                    "{kind:?} call {at}: {f}"
                ),
                other => panic!("{kind:?}: call {at} of {calls} failed, the step gave {other:?}"),
            }
            assert_eq!(
                CALLS_LEFT.load(Ordering::SeqCst),
                0,
                "{kind:?}: a call after the failure at call {at}"
            );
        }
        one_step(NAMED, kind).unwrap();
    }
}

#[test]
fn another_backend_refuses_what_runs_on_the_cpu_only() {
    let (_dir, ds) = saved_tiny(400);
    let base = config(&ds, ModelKind::Sage);
    let refused = |cfg: TrainConfig| -> String {
        match train_with_backend(NAMED, &cfg, &RunEnv::default(), &mut ()) {
            Ok(_) => panic!("{cfg:?} ran on another backend"),
            Err(e) => e.to_string(),
        }
    };
    let e = refused(TrainConfig {
        workers: 2,
        ..base.clone()
    });
    assert!(
        e.contains("--workers 2 on one backend runs on --device cpu only")
            && e.contains("--device cuda --workers N")
            && e.contains("mpirun"),
        "{e}"
    );
    for s in [
        StrategyKind::Factored,
        StrategyKind::Hybrid,
        StrategyKind::Split,
    ] {
        let e = refused(TrainConfig {
            strategy: Some(s),
            ..base.clone()
        });
        let want = format!("--strategy {} runs on --device cpu only for now", s.name());
        assert!(e.contains(&want), "{e}");
    }
    // Sampling on the device needs the CUDA backend, here and on the CPU.
    let on_device = TrainConfig {
        sampling_placement: SamplingPlacement::Device,
        ..base.clone()
    };
    let e = refused(on_device.clone());
    assert!(
        e.contains("--sampling-placement device needs a GPU (--device cuda); this run computes on"),
        "{e}"
    );
    let e = train(&on_device, &RunEnv::default(), &mut ())
        .err()
        .expect("sampling on the device ran on the CPU")
        .to_string();
    assert!(e.contains("--sampling-placement device needs a GPU"), "{e}");
    let uva = TrainConfig {
        sampling_placement: SamplingPlacement::Uva,
        ..base.clone()
    };
    let e = refused(uva);
    assert!(e.contains("--sampling-placement uva needs a GPU"), "{e}");
    // Auto samples on the host here: the run is the CPU's.
    let auto = TrainConfig {
        sampling_placement: SamplingPlacement::Auto,
        epochs: 1,
        ..base.clone()
    };
    let cpu = train(&auto, &RunEnv::default(), &mut ()).unwrap();
    let named = train_with_backend(NAMED, &auto, &RunEnv::default(), &mut ()).unwrap();
    assert_identical(&named, &cpu, "auto sampling placement on another backend");
    // A one-worker data-parallel run is allowed.
    let dp = TrainConfig {
        strategy: Some(StrategyKind::DataParallel),
        epochs: 1,
        ..base
    };
    train_with_backend(NAMED, &dp, &RunEnv::default(), &mut ()).unwrap();
}

/// `--feature-placement device`: every row copied to the backend once and each batch gathered
/// there trains the CPU's host-gathered model bit for bit (fused first layer or not), with
/// every byte counted as served from the device; what it cannot do is refused.
#[test]
fn rows_gathered_on_the_device_train_the_host_gathered_model() {
    let (_dir, ds) = saved_tiny(800);
    let env = RunEnv::default();
    for model in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let host = config(&ds, model);
        let device = TrainConfig {
            feature_placement: FeaturePlacement::Device,
            ..host.clone()
        };
        let cpu = train(&host, &env, &mut ()).unwrap();
        let before = GATHER_CALLS.load(Ordering::Relaxed);
        let named = train_with_backend(NAMED, &device, &env, &mut ()).unwrap();
        let gathers = GATHER_CALLS.load(Ordering::Relaxed) - before;
        let batches: u64 = named.metrics.epochs.iter().map(|e| e.batches).sum();
        assert!(
            gathers as u64 >= batches,
            "{model:?}: {gathers} device gathers for {batches} batches"
        );
        assert_identical(&named, &cpu, &format!("{model:?} rows on the device"));
        for e in &named.metrics.epochs {
            assert_eq!(e.hit_rate, 1.0, "{model:?}: every row served on the device");
            assert_eq!(e.extract.bytes_from_host, 0);
        }
        assert!(cpu.metrics.epochs.iter().all(|e| e.hit_rate == 0.0));
    }
    // Auto keeps the rows on the host for a backend that reports no device memory.
    let auto = train_with_backend(NAMED, &config(&ds, ModelKind::Sage), &env, &mut ());
    assert!(auto
        .unwrap()
        .metrics
        .epochs
        .iter()
        .all(|e| e.hit_rate == 0.0));
    // Refused: on the CPU backend, and with a cache.
    let on_cpu = TrainConfig {
        feature_placement: FeaturePlacement::Device,
        ..config(&ds, ModelKind::Sage)
    };
    let refused = |r: Result<TrainOutcome, fanout_exec::ExecError>| match r {
        Ok(_) => panic!("ran"),
        Err(e) => e.to_string(),
    };
    let e = refused(train(&on_cpu, &env, &mut ()));
    assert!(e.contains("--feature-placement device needs a GPU"), "{e}");
    // Every strategy refuses it, the factored ones included.
    let factored = TrainConfig {
        strategy: Some(StrategyKind::Factored),
        workers: 2,
        ..on_cpu.clone()
    };
    let e = refused(train(&factored, &env, &mut ()));
    assert!(e.contains("--feature-placement device needs a GPU"), "{e}");
}

/// `--feature-placement uva`: every row in host memory the backend reads in place, each batch
/// gathered by the backend from there, trains the CPU's host-gathered model bit for bit (the
/// fused first layer there or not), with every byte counted as read from the host and none
/// from a cache; on the CPU it is refused, with a cache or without.
#[test]
fn rows_mapped_from_host_memory_train_the_host_gathered_model() {
    let (_dir, ds) = saved_tiny(800);
    let env = RunEnv::default();
    for model in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let host = config(&ds, model);
        let uva = TrainConfig {
            feature_placement: FeaturePlacement::Uva,
            ..host.clone()
        };
        let cpu = train(&host, &env, &mut ()).unwrap();
        let before = MAPPED_GATHERS.load(Ordering::Relaxed);
        let named = train_with_backend(NAMED, &uva, &env, &mut ()).unwrap();
        let gathers = MAPPED_GATHERS.load(Ordering::Relaxed) - before;
        let batches: u64 = named.metrics.epochs.iter().map(|e| e.batches).sum();
        assert!(
            gathers as u64 >= batches,
            "{model:?}: {gathers} mapped gathers for {batches} batches"
        );
        assert_identical(&named, &cpu, &format!("{model:?} rows mapped"));
        for n in &named.metrics.epochs {
            // Every input row, each read whole from the host (the CPU run's SAGE extracts
            // fewer: its first layer is aggregated on the host).
            assert_eq!(n.hit_rate, 0.0, "{model:?}: no row from a cache");
            assert_eq!(n.extract.rows, n.input_nodes, "{model:?}");
            assert_eq!(n.extract.bytes_total % n.extract.rows, 0, "{model:?}");
            assert_eq!(
                n.extract.bytes_from_host, n.extract.bytes_total,
                "{model:?}"
            );
            assert_eq!(n.extract.bytes_from_cache, 0, "{model:?}");
            assert!(n.extract.bytes_total > 0, "{model:?}");
        }
    }
    let refused = |cfg: &TrainConfig, on_cpu: bool| {
        let r = if on_cpu {
            train(cfg, &env, &mut ())
        } else {
            train_with_backend(NAMED, cfg, &env, &mut ())
        };
        match r {
            Ok(_) => panic!("ran"),
            Err(e) => e.to_string(),
        }
    };
    let uva = TrainConfig {
        feature_placement: FeaturePlacement::Uva,
        ..config(&ds, ModelKind::Sage)
    };
    let e = refused(&uva, true);
    assert!(e.contains("--feature-placement uva needs a GPU"), "{e}");
    let cached = with_cache(uva, "degree", "0.3", false);
    let e = refused(&cached, true);
    assert!(e.contains("--feature-placement uva needs a GPU"), "{e}");
}

/// `--feature-placement device` with a feature cache and/or Match-Reorder: the cached rows
/// copied to the backend once, the previous batch's rows kept there, each batch uploading only
/// its misses, trains the model of the same cache and Match on the host bit for bit, with the
/// same bytes from cache, reuse and host; the rows are assembled on the backend. So does
/// `--feature-placement uva` with the same cache, the backend reading the misses in place
/// from mapped host memory (nothing uploaded).
#[test]
fn a_cache_on_the_device_trains_the_host_cached_model() {
    let (_dir, ds) = saved_tiny(800);
    let env = RunEnv::default();
    for (model, policy, ratio, match_reorder) in [
        (ModelKind::Sage, "degree", "0.3", false),
        (ModelKind::Gat, "presc", "0.5", false),
        (ModelKind::Gcn, "degree", "1.0", false),
        (ModelKind::Sage, "degree", "0.2", true),
        (ModelKind::Gcn, "none", "0.1", true),
    ] {
        let host = with_cache(config(&ds, model), policy, ratio, match_reorder);
        let device = TrainConfig {
            feature_placement: FeaturePlacement::Device,
            ..host.clone()
        };
        let what = format!("{model:?} {policy} {ratio} match {match_reorder}");
        let cpu = train(&host, &env, &mut ()).unwrap();
        // This test's own count: other tests gather on NAMED at the same time.
        static GATHERS: AtomicUsize = AtomicUsize::new(0);
        static MAPPED: AtomicUsize = AtomicUsize::new(0);
        GATHERS.store(0, Ordering::SeqCst);
        let counted = Named {
            gathers: Some(&GATHERS),
            mapped_gathers: Some(&MAPPED),
            ..NAMED
        };
        let named = train_with_backend(counted, &device, &env, &mut ()).unwrap();
        let gathers = GATHERS.load(Ordering::SeqCst);
        let batches: u64 = named.metrics.epochs.iter().map(|e| e.batches).sum();
        assert!(gathers as u64 >= batches, "{what}: {gathers} gathers");
        assert_identical(&named, &cpu, &what);
        for (n, c) in named.metrics.epochs.iter().zip(&cpu.metrics.epochs) {
            assert_eq!(
                n.extract, c.extract,
                "{what}: the same bytes from cache and host"
            );
            assert!(n.hit_rate > 0.0, "{what}");
            assert_eq!(n.extract.bytes_reused > 0, match_reorder, "{what}");
        }
        // uva: the same cache on the backend, the misses read in place. Its evaluation reads
        // every row in place, as a uva run without a cache does for training too; so the
        // training steps' reads in place are its count less the evaluation's.
        let uva = TrainConfig {
            feature_placement: FeaturePlacement::Uva,
            ..host.clone()
        };
        let uva_alone = TrainConfig {
            cache: CacheSpec::default(),
            ..uva.clone()
        };
        MAPPED.store(0, Ordering::SeqCst);
        train_with_backend(counted, &uva_alone, &env, &mut ()).unwrap();
        let eval_reads = (MAPPED.load(Ordering::SeqCst) as u64)
            .checked_sub(batches)
            .expect("uva without a cache reads every training batch in place");
        GATHERS.store(0, Ordering::SeqCst);
        MAPPED.store(0, Ordering::SeqCst);
        let mapped = train_with_backend(counted, &uva, &env, &mut ()).unwrap();
        let step_reads = (MAPPED.load(Ordering::SeqCst) as u64)
            .checked_sub(eval_reads)
            .expect("evaluation reads every row in place with a cache too");
        assert!(
            GATHERS.load(Ordering::SeqCst) as u64 >= batches,
            "{what} uva"
        );
        assert_identical(&mapped, &cpu, &format!("{what} uva"));
        let misses: u64 = cpu
            .metrics
            .epochs
            .iter()
            .map(|e| e.extract.bytes_from_host)
            .sum();
        if misses == 0 {
            assert_eq!(
                step_reads, 0,
                "{what} uva: nothing missed, nothing read in place"
            );
        } else {
            // Every step with a miss reads it in place; none uploads it.
            assert!(
                (1..=batches).contains(&step_reads),
                "{what} uva: {step_reads} reads"
            );
        }
        for (n, c) in mapped.metrics.epochs.iter().zip(&cpu.metrics.epochs) {
            assert_eq!(n.extract, c.extract, "{what} uva: the same bytes");
        }
        // The host-cached run on the same backend uploads every row: the same model, and
        // no gather.
        GATHERS.store(0, Ordering::SeqCst);
        let host_named = train_with_backend(counted, &host, &env, &mut ()).unwrap();
        assert_identical(&host_named, &cpu, &format!("{what} on the host"));
        assert_eq!(
            GATHERS.load(Ordering::SeqCst),
            0,
            "{what}: gathered on the host path"
        );
    }
}

/// Records the run's notes.
#[derive(Default)]
struct Notes(Vec<String>);

impl fanout_exec::trainer::FitObserver for Notes {
    fn note(&mut self, line: &str) {
        self.0.push(line.to_string());
    }
}

impl Notes {
    /// Panics, listing every note, unless one of them starts with `prefix` (`what` says which
    /// run).
    fn assert_has(&self, prefix: &str, what: &str) {
        assert!(
            self.0.iter().any(|n| n.starts_with(prefix)),
            "{what}: no note starts with {prefix:?}: {:?}",
            self.0
        );
    }
}

/// `auto` with a cache asked for, by the device's free memory. Where it holds every feature
/// row twice over, they all go there even when a cache or Match is asked for: the cache flags
/// are checked but no cache is built, Match's batch order is kept, and the run trains the
/// host-cached CPU model bit for bit with every batch gathered on the device. With the rows
/// too large for the device, the cache goes there (its bytes from cache and host as on the
/// CPU); with the cache too large as well, every row is read in place and no cache is kept.
#[test]
fn auto_places_rows_and_cache_by_the_device_memory() {
    let (_dir, ds) = saved_tiny(800);
    let env = RunEnv::default();
    let rows_bytes = ds.num_nodes() * ds.features.as_ref().unwrap().dim as u64 * 4;
    for (policy, ratio, match_reorder) in [("degree", "0.3", false), ("none", "0.1", true)] {
        let cfg = with_cache(config(&ds, ModelKind::Sage), policy, ratio, match_reorder);
        assert_eq!(cfg.feature_placement, FeaturePlacement::Auto);
        let what = format!("{policy} {ratio} match {match_reorder}");
        let cpu = train(&cfg, &env, &mut ()).unwrap();
        static GATHERS: AtomicUsize = AtomicUsize::new(0);
        GATHERS.store(0, Ordering::SeqCst);
        let roomy = Named {
            gathers: Some(&GATHERS),
            free: Some(2 * rows_bytes),
            ..NAMED
        };
        let mut notes = Notes::default();
        let named = train_with_backend(roomy, &cfg, &env, &mut notes).unwrap();
        assert_identical(&named, &cpu, &what);
        let batches: u64 = named.metrics.epochs.iter().map(|e| e.batches).sum();
        assert!(
            GATHERS.load(Ordering::SeqCst) as u64 >= batches,
            "{what}: every batch gathered on the device"
        );
        notes.assert_has("the feature cache is not built", &what);
        notes.assert_has("features on the device", &what);
        // Its figures are those of the same backend asked for no cache.
        let uncached = TrainConfig {
            cache: CacheSpec::default(),
            ..cfg.clone()
        };
        let plain = train_with_backend(roomy, &uncached, &env, &mut ()).unwrap();
        for ((n, p), c) in named
            .metrics
            .epochs
            .iter()
            .zip(&plain.metrics.epochs)
            .zip(&cpu.metrics.epochs)
        {
            assert_eq!(
                (n.hit_rate, n.extract),
                (p.hit_rate, p.extract),
                "{what}: as without a cache"
            );
            assert_eq!(n.extract.bytes_reused, 0, "{what}: nothing reused");
            assert_ne!(n.extract, c.extract, "{what}: the CPU's cache differs");
        }
        // Rows just over half the free memory: the cache is built, on the device.
        let tight = Named {
            free: Some(2 * rows_bytes - 1),
            ..roomy
        };
        let cached = train_with_backend(tight, &cfg, &env, &mut ()).unwrap();
        assert_identical(&cached, &cpu, &format!("{what} tight"));
        for (n, c) in cached.metrics.epochs.iter().zip(&cpu.metrics.epochs) {
            assert_eq!(n.extract, c.extract, "{what} tight: the cache's bytes");
        }
        // Flags the cache would refuse are refused though no cache is built.
        let bad = TrainConfig {
            cache: CacheSpec {
                ratio: "1.5".into(),
                ..cfg.cache.clone()
            },
            ..cfg.clone()
        };
        let Err(e) = train_with_backend(roomy, &bad, &env, &mut ()) else {
            panic!("{what}: a cache ratio of 1.5 was taken");
        };
        let e = e.to_string();
        assert!(e.contains("1.5"), "{what}: {e}");
    }
    // Rows over half the free memory and a cache of every row (larger still): the cache does
    // not fit on the device, so every row is read in place and the host cache is dropped. The
    // run is then the uncached `uva` run: same figures, no cache reported, the CPU's model.
    let cfg = with_cache(config(&ds, ModelKind::Gcn), "degree", "1.0", false);
    let cpu = train(&cfg, &env, &mut ()).unwrap();
    let tight = Named {
        free: Some(2 * rows_bytes - 1),
        ..NAMED
    };
    let mut notes = Notes::default();
    let fell_back = train_with_backend(tight, &cfg, &env, &mut notes).unwrap();
    notes.assert_has("every row is read in place instead", "fallback");
    assert_identical(&fell_back, &cpu, "fallback");
    assert_eq!(fell_back.cache["policy"], "none", "{}", fell_back.cache);
    let uva = TrainConfig {
        feature_placement: FeaturePlacement::Uva,
        cache: CacheSpec::default(),
        ..cfg.clone()
    };
    let read_in_place = train_with_backend(tight, &uva, &env, &mut ()).unwrap();
    for (f, u) in fell_back
        .metrics
        .epochs
        .iter()
        .zip(&read_in_place.metrics.epochs)
    {
        assert_eq!((f.hit_rate, f.extract), (u.hit_rate, u.extract), "fallback");
    }
}

/// A data-parallel group whose workers each compute on a backend of their own other than the
/// CPU (one process per GPU under mpirun; here threads, each with its own `Named`) trains the
/// CPU group's model bit for bit: each worker's gradients are read from its backend, summed in
/// rank order through the communicator and written back, or, when the backends joined a device
/// group (NCCL), summed there (`Backend::sum_over_group`, once a step on every worker); its
/// steps are read at once (not late). A device failing in one worker (of a group summing on
/// the host) ends it with the device's error, and the group with it, without a panic.
#[test]
fn a_group_of_workers_on_other_backends_trains_the_cpu_group_model() {
    let (_dir, ds) = saved_tiny(800);
    let env = RunEnv::default();
    for (model, workers) in [(ModelKind::Sage, 2), (ModelKind::Gcn, 3)] {
        let cfg = TrainConfig {
            workers,
            strategy: Some(StrategyKind::DataParallel),
            ..config(&ds, model)
        };
        let cpu = train(&cfg, &env, &mut ()).unwrap();
        let group = |be: &(dyn Fn(usize) -> Named + Sync)| -> Vec<Result<TrainOutcome, String>> {
            std::thread::scope(|s| {
                let hs: Vec<_> = fanout_exec::LocalComm::group(workers)
                    .into_iter()
                    .map(|comm| {
                        let (ds, cfg, env) = (ds.clone(), &cfg, &env);
                        s.spawn(move || {
                            let r = fanout_exec::train_worker_with(
                                be(comm.rank()),
                                ds,
                                cfg,
                                &comm,
                                None,
                                env,
                                &mut (),
                            );
                            if let Err(e) = &r {
                                comm.fail(&e.to_string());
                            }
                            r.map_err(|e| e.to_string())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        let what = format!("{model:?} on {workers} workers");
        // Host sums, then device-group sums (each worker's `Named` holds its member, leaked
        // for the test's 'static backend).
        let members: Vec<&'static fanout_exec::LocalComm> = fanout_exec::LocalComm::group(workers)
            .into_iter()
            .map(|c| &*Box::leak(Box::new(c)))
            .collect();
        let on_devices = |rank: usize| Named {
            group: Some(members[rank]),
            ..NAMED
        };
        let before = GROUP_SUMS.load(Ordering::SeqCst);
        for (outs, how) in [(group(&|_| NAMED), "host"), (group(&on_devices), "device")] {
            assert_identical(outs[0].as_ref().unwrap(), &cpu, &format!("{what}, {how}"));
            for o in &outs {
                let o = o.as_ref().unwrap();
                assert_eq!(o.metrics.epochs.len(), cpu.metrics.epochs.len(), "{what}");
                assert_eq!(o.gradient_sum, Some(how), "{what}");
                assert_eq!(o.report()["comm"]["gradient_sum"], how, "{what}");
            }
        }
        assert_eq!(cpu.gradient_sum, Some("host"), "{what}: the CPU group");
        let steps: u64 = cpu.metrics.epochs.iter().map(|e| e.batches).sum();
        assert_eq!(
            (GROUP_SUMS.load(Ordering::SeqCst) - before) as u64,
            steps * workers as u64,
            "{what}: one device sum a step on every worker"
        );
        // The workers but rank 0 count down one shared counter: whichever of them makes the
        // fifth matrix product among them sees its device fail.
        static LEFT: AtomicUsize = AtomicUsize::new(0);
        LEFT.store(5, Ordering::SeqCst);
        let failing = |rank: usize| -> Named {
            if rank == 0 {
                return NAMED;
            }
            Named {
                products_left: Some(&LEFT),
                ..NAMED
            }
        };
        let outs = group(&failing);
        let errors: Vec<&String> = outs.iter().filter_map(|o| o.as_ref().err()).collect();
        assert_eq!(errors.len(), workers, "{what}: every worker stops");
        assert!(
            errors
                .iter()
                .any(|e| e.contains("CUDA_ERROR_OUT_OF_MEMORY (fake)")),
            "{what}: {errors:?}"
        );
    }
}
