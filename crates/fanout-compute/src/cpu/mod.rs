//! The CPU backend: multi-threaded on the current rayon pool.
//!
//! Dense products go through `matrixmultiply` split into row or inner-dimension blocks, or
//! through a kernel that reads a row-major `A` in place for a narrow `B` (`rowmajor`)
//! ([`gemm`]); graph kernels run in parallel over destinations (or over sources for gradients,
//! via the block's transpose) in [`graph`]; elementwise, loss and optimiser kernels in
//! `dense`, `loss` and `optim`. The thread count is rayon's: set `RAYON_NUM_THREADS` or run
//! inside a `rayon::ThreadPool::install`. Results are bit-identical for any thread count.

pub mod denormals;
mod dense;
pub mod gemm;
pub mod graph;
mod heads;
pub mod huge_pages;
#[cfg(target_os = "linux")]
mod large_blocks;
mod loss;
mod optim;
pub(crate) mod par;
pub mod rates;
mod rowmajor;
mod rows;
pub mod sparse_grad;
pub mod sparse_rows;

use crate::backend::{AdamUpdate, Aggregation, Backend, CrossEntropy, DropoutSpec, SgdUpdate};
use crate::block::{BlockDims, BlockRef};
use crate::error::Result;
use crate::failure::DeviceResult;
use crate::source::RowSource;
use crate::tensor::Tensor;

pub use graph::CpuBlock;

/// The CPU backend. Its tensor is the host [`Tensor`] itself (upload and download are copies)
/// and its block a [`CpuBlock`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Tensor = Tensor;
    type Block = CpuBlock;

    fn name(&self) -> &'static str {
        "cpu"
    }
    fn on_compute_threads<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        // `scope` runs its body on a worker of the current pool (moving there when called from
        // outside it); the kernels' loops then fork and join inside the pool.
        rayon::scope(|_| f())
    }

    fn upload(&self, host: &Tensor) -> DeviceResult<Tensor> {
        Ok(host.clone())
    }
    fn upload_owned(&self, host: Tensor) -> DeviceResult<Tensor> {
        Ok(host)
    }
    fn download(&self, t: &Tensor) -> DeviceResult<Tensor> {
        Ok(t.clone())
    }
    fn all_finite(&self, tensors: &[&Tensor]) -> DeviceResult<bool> {
        Ok(tensors.iter().all(|t| dense::all_finite(t.data())))
    }
    fn zeros(&self, rows: usize, cols: usize) -> DeviceResult<Tensor> {
        Ok(Tensor::zeros(rows, cols))
    }
    fn shape(&self, t: &Tensor) -> (usize, usize) {
        t.shape()
    }
    fn fill_zero(&self, t: &mut Tensor) -> DeviceResult<()> {
        t.data_mut().fill(0.0);
        Ok(())
    }
    fn prepare_block(&self, block: &BlockRef<'_>) -> Result<CpuBlock> {
        CpuBlock::new(block)
    }
    fn block_dims(&self, block: &CpuBlock) -> BlockDims {
        block.dims()
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
        gemm::gemm(alpha, a, trans_a, b, trans_b, beta, c);
        Ok(())
    }
    fn matmul_sourced(
        &self,
        first: Option<(&Tensor, &Tensor)>,
        src: &dyn RowSource,
        w: &Tensor,
    ) -> DeviceResult<(Tensor, Tensor)> {
        Ok(gemm::matmul_sourced(first, src, w))
    }
    fn acc_at_b_shared(
        &self,
        g: &Tensor,
        pairs: &mut [(&Tensor, &mut Tensor)],
    ) -> DeviceResult<()> {
        gemm::acc_at_b_shared(g, pairs);
        Ok(())
    }
    fn acc_at_b_shared_product(
        &self,
        grad: &Tensor,
        factor: &Tensor,
        pairs: &mut [(&Tensor, &mut Tensor)],
        bias: &mut Tensor,
    ) -> DeviceResult<()> {
        let sums = gemm::acc_at_b_shared_product(grad, factor, pairs);
        dense::axpy(1.0, &sums, bias);
        Ok(())
    }
    fn matmul(&self, a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool) -> DeviceResult<Tensor> {
        Ok(gemm::matmul(a, trans_a, b, trans_b))
    }
    fn add_bias(&self, x: &mut Tensor, bias: &Tensor) -> DeviceResult<()> {
        dense::add_bias(x, bias);
        Ok(())
    }
    fn sum_rows(&self, x: &Tensor) -> DeviceResult<Tensor> {
        Ok(dense::sum_rows(x))
    }
    fn axpy(&self, alpha: f32, x: &Tensor, y: &mut Tensor) -> DeviceResult<()> {
        dense::axpy(alpha, x, y);
        Ok(())
    }
    fn axpy_prefix(&self, alpha: f32, x: &Tensor, y: &mut Tensor, rows: usize) -> DeviceResult<()> {
        dense::axpy_prefix(alpha, x, y, rows);
        Ok(())
    }
    fn prefix_rows(&self, x: &Tensor, rows: usize) -> DeviceResult<Tensor> {
        Ok(dense::prefix_rows(x, rows))
    }
    fn copy(&self, x: &Tensor) -> DeviceResult<Tensor> {
        Ok(x.clone())
    }
    fn scale(&self, x: &mut Tensor, alpha: f32) -> DeviceResult<()> {
        dense::scale(x, alpha);
        Ok(())
    }
    fn mul(&self, a: &Tensor, b: &Tensor) -> DeviceResult<Tensor> {
        Ok(dense::mul(a, b))
    }
    fn mul_sum_rows(&self, a: &Tensor, b: &Tensor) -> DeviceResult<(Tensor, Tensor)> {
        Ok(dense::mul_sum_rows(a, b))
    }
    fn dot(&self, a: &Tensor, b: &Tensor) -> DeviceResult<f64> {
        Ok(dense::dot(a, b))
    }
    fn relu(&self, x: &Tensor) -> DeviceResult<Tensor> {
        Ok(dense::relu(x))
    }
    fn relu_backward(&self, grad: &Tensor, out: &Tensor) -> DeviceResult<Tensor> {
        Ok(dense::relu_backward(grad, out))
    }
    fn leaky_relu(&self, x: &Tensor, slope: f32) -> DeviceResult<Tensor> {
        Ok(dense::leaky_relu(x, slope))
    }
    fn leaky_relu_backward(&self, grad: &Tensor, x: &Tensor, slope: f32) -> DeviceResult<Tensor> {
        Ok(dense::leaky_relu_backward(grad, x, slope))
    }
    fn dropout(
        &self,
        x: &Tensor,
        p: f32,
        key: u64,
        row_ids: Option<&[u32]>,
    ) -> DeviceResult<(Tensor, Tensor)> {
        Ok(dense::dropout(x, p, key, row_ids))
    }
    fn epilogue(
        &self,
        x: &mut Tensor,
        bias: Option<&Tensor>,
        relu: bool,
        dropout: Option<DropoutSpec<'_>>,
        keep: bool,
    ) -> DeviceResult<Option<Tensor>> {
        Ok(dense::epilogue(x, bias, relu, dropout, keep))
    }
    fn l2_normalize_rows(&self, x: &Tensor) -> DeviceResult<(Tensor, Tensor)> {
        Ok(dense::l2_normalize_rows(x))
    }
    fn l2_normalize_rows_backward(
        &self,
        grad: &Tensor,
        y: &Tensor,
        norms: &Tensor,
    ) -> DeviceResult<Tensor> {
        Ok(dense::l2_normalize_rows_backward(grad, y, norms))
    }
    fn head_dot(&self, x: &Tensor, a: &Tensor) -> DeviceResult<Tensor> {
        Ok(dense::head_dot(x, a))
    }
    fn head_dot_backward(
        &self,
        grad: &Tensor,
        x: &Tensor,
        a: &Tensor,
    ) -> DeviceResult<(Tensor, Tensor)> {
        Ok(dense::head_dot_backward(grad, x, a))
    }
    fn head_dot_backward_acc(
        &self,
        grad: &Tensor,
        x: &Tensor,
        a: &Tensor,
        acc: &mut Tensor,
    ) -> DeviceResult<Tensor> {
        Ok(dense::head_dot_backward_acc(grad, x, a, acc))
    }
    fn head_dot_prefix(&self, x: &Tensor, a: &Tensor, rows: usize) -> DeviceResult<Tensor> {
        Ok(dense::head_dot_prefix(x, a, rows))
    }
    fn head_dot_prefix_backward_acc(
        &self,
        grad: &Tensor,
        x: &Tensor,
        a: &Tensor,
        acc: &mut Tensor,
    ) -> DeviceResult<Tensor> {
        Ok(dense::head_dot_prefix_backward_acc(grad, x, a, acc))
    }
    fn has_head_products(&self) -> bool {
        true
    }
    fn spmm_heads(&self, block: &CpuBlock, coeff: &Tensor, x: &Tensor) -> DeviceResult<Tensor> {
        Ok(heads::spmm_heads(block, coeff, x))
    }
    fn spmm_heads_backward_coeff(
        &self,
        block: &CpuBlock,
        grad: &Tensor,
        x: &Tensor,
    ) -> DeviceResult<Tensor> {
        Ok(heads::spmm_heads_backward_coeff(block, grad, x))
    }
    fn head_matmul(&self, y: &Tensor, w: &Tensor, heads: usize) -> DeviceResult<Tensor> {
        Ok(heads::head_matmul(y, w, heads))
    }
    fn head_acc_at_b(
        &self,
        y: &Tensor,
        g: &Tensor,
        gw: &mut Tensor,
        heads: usize,
    ) -> DeviceResult<()> {
        heads::head_acc_at_b(y, g, gw, heads);
        Ok(())
    }
    fn head_matmul_bt(&self, g: &Tensor, w: &Tensor, heads: usize) -> DeviceResult<Tensor> {
        Ok(heads::head_matmul_bt(g, w, heads))
    }
    fn head_mean(&self, x: &Tensor, heads: usize) -> DeviceResult<Tensor> {
        Ok(dense::head_mean(x, heads))
    }
    fn head_mean_backward(&self, grad: &Tensor, heads: usize) -> DeviceResult<Tensor> {
        Ok(dense::head_mean_backward(grad, heads))
    }

    fn edge_coefficients(
        &self,
        block: &CpuBlock,
        agg: Aggregation,
    ) -> DeviceResult<Option<Tensor>> {
        Ok(graph::edge_coefficients(block, agg))
    }
    fn spmm(&self, block: &CpuBlock, coeff: Option<&Tensor>, x: &Tensor) -> DeviceResult<Tensor> {
        Ok(graph::spmm(block, coeff, x))
    }
    fn spmm_backward_x(
        &self,
        block: &CpuBlock,
        coeff: Option<&Tensor>,
        grad: &Tensor,
    ) -> DeviceResult<Tensor> {
        Ok(graph::spmm_backward_x(block, coeff, grad))
    }
    fn spmm_backward_coeff(
        &self,
        block: &CpuBlock,
        grad: &Tensor,
        x: &Tensor,
        heads: usize,
    ) -> DeviceResult<Tensor> {
        Ok(graph::spmm_backward_coeff(block, grad, x, heads))
    }
    fn spmm_backward(
        &self,
        block: &CpuBlock,
        coeff: &Tensor,
        grad: &Tensor,
        x: &Tensor,
    ) -> DeviceResult<(Tensor, Tensor)> {
        Ok(graph::spmm_backward(block, coeff, grad, x))
    }
    fn u_add_v(&self, block: &CpuBlock, el: &Tensor, er: &Tensor) -> DeviceResult<Tensor> {
        Ok(graph::u_add_v(block, el, er))
    }
    fn edge_sum_to_src(&self, block: &CpuBlock, e: &Tensor) -> DeviceResult<Tensor> {
        Ok(graph::edge_sum_to_src(block, e))
    }
    fn edge_sum_to_dst(&self, block: &CpuBlock, e: &Tensor) -> DeviceResult<Tensor> {
        Ok(graph::edge_sum_to_dst(block, e))
    }
    fn edge_softmax(&self, block: &CpuBlock, scores: &Tensor) -> DeviceResult<Tensor> {
        Ok(graph::edge_softmax(block, scores))
    }
    fn edge_softmax_backward(
        &self,
        block: &CpuBlock,
        a: &Tensor,
        grad: &Tensor,
    ) -> DeviceResult<Tensor> {
        Ok(graph::edge_softmax_backward(block, a, grad))
    }
    fn gather_rows(&self, x: &Tensor, idx: &[u32]) -> DeviceResult<Tensor> {
        Ok(graph::gather_rows(x, idx))
    }
    fn scatter_add_rows(&self, y: &mut Tensor, idx: &[u32], x: &Tensor) -> DeviceResult<()> {
        graph::scatter_add_rows(y, idx, x);
        Ok(())
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Tensor,
        labels: &[i64],
    ) -> Result<CrossEntropy<Tensor>> {
        loss::softmax_cross_entropy(logits, labels)
    }
    fn accuracy(&self, logits: &Tensor, labels: &[i64]) -> DeviceResult<(usize, usize)> {
        Ok(loss::accuracy(logits, labels))
    }
    fn adam_update(
        &self,
        value: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        hp: &AdamUpdate,
    ) -> DeviceResult<()> {
        optim::adam_update(value, grad, m, v, hp);
        Ok(())
    }
    fn sgd_update(
        &self,
        value: &mut Tensor,
        grad: &Tensor,
        buf: &mut Tensor,
        hp: &SgdUpdate,
    ) -> DeviceResult<()> {
        optim::sgd_update(value, grad, buf, hp);
        Ok(())
    }
}
