//! GNN layers with explicit forward and backward passes.
//!
//! Every layer maps one block: `h_src` (`num_src x in_dim`, one row per local source id) to
//! `h_dst` (`num_dst x out_dim`). A training forward ([`Pass::Train`]) caches what backward
//! needs and applies the model's dropout to the output in the layer's last pass over it (the
//! epilogue: bias, activation, dropout); [`Layer::backward`] consumes that cache, **adds** the parameter gradients into each
//! [`Param::grad`] (PyTorch accumulation semantics: call `zero_grad` between steps) and returns
//! the gradient with respect to `h_src` when asked. Weights are stored `in x out` (the layer
//! computes `x W`), biases `1 x out`; all initialised Glorot-uniform from a seeded stream,
//! biases at zero.

mod gat;
mod gcn;
mod gin;
mod pinsage;
mod sage;

use fanout_rand::Rng;

use crate::backend::{Aggregation, Backend, DropoutSpec};
use crate::block::BlockDims;
use crate::error::{ComputeError, Result};
use crate::failure::DeviceResult;
use crate::source::RowSource;
use crate::tensor::Tensor;

pub use gat::{GatLayer, HeadMerge, GAT_NEGATIVE_SLOPE};
pub use gcn::GcnLayer;
pub use gin::GinLayer;
pub use pinsage::PinSageLayer;
pub use sage::SageLayer;

/// A learnable tensor and its accumulated gradient (same shape, on the same device).
#[derive(Debug)]
pub struct Param<B: Backend> {
    name: &'static str,
    /// The current value.
    pub value: B::Tensor,
    /// The gradient accumulated by backward passes since the last zeroing.
    pub grad: B::Tensor,
}

impl<B: Backend> Param<B> {
    /// A parameter named `name` (unique within its layer) holding `init`, gradient zero;
    /// `Err` when the device fails.
    pub fn new(be: &B, name: &'static str, init: &Tensor) -> DeviceResult<Self> {
        Ok(Param {
            name,
            value: be.upload(init)?,
            grad: be.zeros(init.rows(), init.cols())?,
        })
    }

    /// The name within its layer (e.g. `"w_self"`), used in checkpoints.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// One GNN layer over one block. Object safe, so a model holds `Box<dyn Layer<B>>`.
pub trait Layer<B: Backend>: Send + Sync {
    /// Short kind name, e.g. `"sage"`.
    fn kind(&self) -> &'static str;
    /// Width of the input rows.
    fn in_dim(&self) -> usize;
    /// Width of the output rows.
    fn out_dim(&self) -> usize;
    /// Computes `h_dst` for `block` from `h_src` (`num_src x in_dim`). In a [`Pass::Train`]
    /// the activations needed by [`Layer::backward`] are kept (replacing any earlier cache)
    /// and the pass's dropout, if any, is applied to the output (after the activation; its
    /// backward is part of [`Layer::backward`]); in [`Pass::Eval`] nothing is kept. `Err` on
    /// a shape mismatch between block, input and layer.
    fn forward(&mut self, block: &B::Block, h_src: B::Tensor, pass: Pass<'_>) -> Result<B::Tensor>;
    /// Back-propagates `grad_out` (`num_dst x out_dim`) through the last training forward:
    /// adds every parameter's gradient into its `grad`, consumes the cache, and returns the
    /// gradient with respect to `h_src` if `need_input_grad` (else `None`, skipping that work).
    /// `Err` if there was no training forward since the last backward, or on a shape mismatch.
    fn backward(
        &mut self,
        grad_out: &B::Tensor,
        need_input_grad: bool,
    ) -> Result<Option<B::Tensor>>;
    /// The parameters, in a fixed order (the checkpoint order).
    fn params(&self) -> Vec<&Param<B>>;
    /// The parameters, mutable, in the same order as [`Layer::params`].
    fn params_mut(&mut self) -> Vec<&mut Param<B>>;
    /// Drops the forward cache (frees its memory).
    fn clear_cache(&mut self);
    /// When this layer starts by aggregating its input rows and then needs nothing of its
    /// input but the destinations' rows and that aggregate ([`InputPlan`]), so a caller may
    /// aggregate where the rows are stored and call [`Layer::forward_aggregated`]; `None`
    /// otherwise (the default).
    fn input_plan(&self) -> Option<InputPlan> {
        None
    }
    /// [`Layer::forward`] given, instead of `h_src`, its first `num_dst` rows and their
    /// aggregate over `block` by [`Layer::input_plan`] (both `num_dst x in_dim`; `h_dst` of
    /// any number of rows where the plan does not read it, [`InputPlan::reads_dst`]): the
    /// same output and gradients as `forward` on the whole `h_src`, bit for bit. `Err` for a layer
    /// without an input aggregation for this block, or on a shape mismatch.
    fn forward_aggregated(
        &mut self,
        block: &B::Block,
        _h_dst: B::Tensor,
        _agg: B::Tensor,
        _pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let _ = block;
        Err(ComputeError::State(format!(
            "{} layers take their whole input, not a pre-aggregated one",
            self.kind()
        )))
    }
    /// [`Layer::forward_aggregated`] with the aggregate made by `src` (`num_dst x in_dim`)
    /// as the layer consumes it: the same output and cache, bit for bit. The default makes
    /// the whole aggregate first; a layer whose first product is by the aggregate makes it
    /// inside that product ([`Backend::matmul_sourced`]). `Err` as `forward_aggregated`.
    fn forward_sourced(
        &mut self,
        block: &B::Block,
        h_dst: B::Tensor,
        src: &dyn RowSource,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = self.backend();
        let agg = be.upload_owned(crate::source::made_whole(src))?;
        self.forward_aggregated(block, h_dst, agg, pass)
    }
    /// The backend this layer computes on.
    fn backend(&self) -> &B;
}

/// For which blocks a layer aggregates its input first and with what: the destinations' rows
/// and the aggregate of `aggregation` over the block are then all it reads of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputPlan {
    /// The aggregation applied to the input rows.
    pub aggregation: Aggregation,
    /// The layer's order rule.
    pub order: AggregateOrder,
    /// Input and output widths (the order rule's other arguments).
    pub in_dim: usize,
    /// See `in_dim`.
    pub out_dim: usize,
    /// Whether [`Layer::forward_sourced`] makes the aggregate inside the layer's product by it
    /// (`Backend::matmul_sourced`) rather than whole first: only then is it worth leaving the
    /// aggregate to the layer.
    pub made_in_product: bool,
    /// Whether the layer reads the destinations' own rows (`h_dst`) besides their aggregate.
    /// Where it does not, [`Layer::forward_aggregated`] and [`Layer::forward_sourced`] take an
    /// `h_dst` of any number of rows (a loader may pass none rather than gather them).
    pub reads_dst: bool,
}

impl InputPlan {
    /// The aggregation to apply for a block of `dims`, or `None` where the layer projects
    /// its whole input first (then it needs every input row).
    pub fn for_block(&self, dims: BlockDims) -> Option<Aggregation> {
        (!self.order.project_first(dims, self.in_dim, self.out_dim)).then_some(self.aggregation)
    }
}

/// How a layer's forward runs.
#[derive(Clone, Copy, Debug)]
pub enum Pass<'a> {
    /// Evaluation: nothing kept, no dropout.
    Eval,
    /// Training: what backward needs is kept.
    Train {
        /// The dropout applied to the layer's output (after its activation), if any.
        dropout: Option<DropoutSpec<'a>>,
    },
}

impl Pass<'static> {
    /// A training pass without dropout.
    pub const TRAIN: Pass<'static> = Pass::Train { dropout: None };
}

impl<'a> Pass<'a> {
    /// Whether this is a training pass.
    pub fn is_train(self) -> bool {
        matches!(self, Pass::Train { .. })
    }

    /// The dropout on the output, if any (never in evaluation).
    pub fn dropout(self) -> Option<DropoutSpec<'a>> {
        match self {
            Pass::Train { dropout } => dropout,
            Pass::Eval => None,
        }
    }
}

/// A tensor borrowed from the caller or made here: what `Cow` is, without asking the tensor
/// to be `Clone` (a device tensor is copied only by a backend call, which can fail).
#[derive(Debug)]
pub enum MaybeOwned<'a, T> {
    /// The caller's.
    Borrowed(&'a T),
    /// Made here.
    Owned(T),
}

impl<T> AsRef<T> for MaybeOwned<'_, T> {
    fn as_ref(&self) -> &T {
        match self {
            MaybeOwned::Borrowed(t) => t,
            MaybeOwned::Owned(t) => t,
        }
    }
}

/// [`epilogue_backward`] for an epilogue that added `bias`: also adds the gradient's column
/// sums into `bias.grad`, the values [`acc_bias`] adds, in the same pass as the product
/// ([`Backend::mul_sum_rows`]) when a factor was kept.
pub(crate) fn epilogue_backward_bias<'a, B: Backend>(
    be: &B,
    grad: &'a B::Tensor,
    kept: Option<&B::Tensor>,
    bias: &mut Param<B>,
) -> DeviceResult<MaybeOwned<'a, B::Tensor>> {
    Ok(match kept {
        Some(factor) => {
            let (g, sums) = be.mul_sum_rows(grad, factor)?;
            be.axpy(1.0, &sums, &mut bias.grad)?;
            MaybeOwned::Owned(g)
        }
        None => {
            acc_bias(be, grad, bias)?;
            MaybeOwned::Borrowed(grad)
        }
    })
}

/// The gradient at the input of [`Activation::finish`] given the gradient at its output and
/// what it kept: `grad * kept`, or `grad` itself when nothing was kept.
pub(crate) fn epilogue_backward<'a, B: Backend>(
    be: &B,
    grad: &'a B::Tensor,
    kept: Option<&B::Tensor>,
) -> DeviceResult<MaybeOwned<'a, B::Tensor>> {
    Ok(match kept {
        Some(factor) => MaybeOwned::Owned(be.mul(grad, factor)?),
        None => MaybeOwned::Borrowed(grad),
    })
}

/// The nonlinearity a layer applies to its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Identity (used on the last layer, which produces logits).
    None,
    /// `max(x, 0)`.
    Relu,
}

impl Activation {
    /// A layer's output epilogue `drop(act(x + bias))` in one pass ([`Backend::epilogue`]):
    /// the bias when given, this activation, and the dropout of `pass` when it has one.
    /// Returns the output and, in a training pass, the gradient factor of
    /// [`Backend::epilogue`] (`None` where the gradient passes through unchanged).
    pub fn finish<B: Backend>(
        self,
        be: &B,
        mut x: B::Tensor,
        bias: Option<&B::Tensor>,
        pass: Pass<'_>,
    ) -> DeviceResult<(B::Tensor, Option<B::Tensor>)> {
        let relu = self == Activation::Relu;
        let kept = be.epilogue(&mut x, bias, relu, pass.dropout(), pass.is_train())?;
        Ok((x, kept))
    }

    /// The gradient at the input, given the gradient at the output and the output itself.
    pub fn backward<'a, B: Backend>(
        self,
        be: &B,
        grad: &'a B::Tensor,
        out: &B::Tensor,
    ) -> DeviceResult<MaybeOwned<'a, B::Tensor>> {
        Ok(match self {
            Activation::None => MaybeOwned::Borrowed(grad),
            Activation::Relu => MaybeOwned::Owned(be.relu_backward(grad, out)?),
        })
    }
}

/// Where a layer that aggregates and then applies a linear map does the matrix product.
/// Both orders compute the same function (aggregation is linear); they differ in cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AggregateOrder {
    /// Pick the cheaper order per block from the flop estimate below.
    #[default]
    Auto,
    /// Aggregate `in_dim`-wide source rows, then multiply `num_dst` rows by `W`:
    /// about `E * in + 2 * D * in * out` flops.
    AggregateFirst,
    /// Multiply all `num_src` rows by `W`, then aggregate `out_dim`-wide rows:
    /// about `2 * S * in * out + E * out` flops.
    ProjectFirst,
}

impl AggregateOrder {
    /// True when the product should come before the aggregation for this block and widths.
    pub fn project_first(self, dims: BlockDims, in_dim: usize, out_dim: usize) -> bool {
        match self {
            AggregateOrder::AggregateFirst => false,
            AggregateOrder::ProjectFirst => true,
            AggregateOrder::Auto => {
                let (d, s, e) = (
                    dims.num_dst as f64,
                    dims.num_src as f64,
                    dims.num_edges as f64,
                );
                let (i, o) = (in_dim as f64, out_dim as f64);
                2.0 * s * i * o + e * o < e * i + 2.0 * d * i * o
            }
        }
    }
}

/// Glorot-uniform weight `rows x cols` (fans `rows`, `cols`).
pub(crate) fn glorot(rows: usize, cols: usize, rng: &mut Rng) -> Tensor {
    Tensor::glorot(rows, cols, rows, cols, rng)
}

/// PyTorch's `calculate_gain("relu")`, the gain DGL's `SAGEConv` and PinSAGE example put on
/// their Glorot initialisations.
pub(crate) const RELU_GAIN: f32 = std::f32::consts::SQRT_2;

/// Glorot-uniform weight scaled by `gain` (PyTorch `xavier_uniform_(w, gain)`: bound
/// `gain * sqrt(6 / (fan_in + fan_out))`).
pub(crate) fn glorot_gain(rows: usize, cols: usize, gain: f32, rng: &mut Rng) -> Tensor {
    let mut t = glorot(rows, cols, rng);
    t.data_mut().iter_mut().for_each(|x| *x *= gain);
    t
}

/// Checks `h_src` against `block` and the layer's input width; returns the block's sizes.
pub(crate) fn check_input<B: Backend>(
    be: &B,
    kind: &str,
    block: &B::Block,
    h_src: &B::Tensor,
    in_dim: usize,
) -> Result<BlockDims> {
    let dims = be.block_dims(block);
    let got = be.shape(h_src);
    if got != (dims.num_src, in_dim) {
        return Err(ComputeError::shape(
            format!("{kind} forward h_src"),
            (dims.num_src, in_dim),
            got,
        ));
    }
    Ok(dims)
}

/// A block's edge coefficients as a layer keeps them for its backward: made already where the
/// forward needed them, or only named where it did not (an aggregate made outside the layer),
/// to be made by the backward if it reads them. A first layer's backward never does, so its
/// coefficients are not made twice (once by whoever aggregated, once by the layer).
#[derive(Debug)]
pub(crate) enum EdgeCoeff<B: Backend> {
    /// Made in the forward (`None` for a plain sum).
    Made(Option<B::Tensor>),
    /// Not made yet: the coefficients of this aggregation over the cached block.
    Later(Aggregation),
}

impl<B: Backend> EdgeCoeff<B> {
    /// The coefficients (`None` for a plain sum), made from `block` now if the forward did
    /// not make them; the same values either way.
    pub(crate) fn made(self, be: &B, block: &B::Block) -> Result<Option<B::Tensor>> {
        Ok(match self {
            EdgeCoeff::Made(coeff) => coeff,
            EdgeCoeff::Later(aggregation) => be.edge_coefficients(block, aggregation)?,
        })
    }
}

/// Checks a pre-aggregated input ([`Layer::forward_aggregated`]): that `plan` aggregates
/// `block` first, and that each named tensor is `num_dst x in_dim`. Returns the edge
/// coefficients of that aggregation, unmade, to cache for backward ([`EdgeCoeff::Later`]).
pub(crate) fn check_aggregated<B: Backend>(
    be: &B,
    kind: &str,
    block: &B::Block,
    plan: InputPlan,
    inputs: &[(&str, &B::Tensor)],
) -> Result<EdgeCoeff<B>> {
    let dims = be.block_dims(block);
    let aggregation = plan.for_block(dims).ok_or_else(|| {
        ComputeError::State(format!(
            "{kind}: this block is projected before aggregating; pass the whole input"
        ))
    })?;
    for (what, t) in inputs {
        let got = be.shape(t);
        if got != (dims.num_dst, plan.in_dim) {
            return Err(ComputeError::shape(
                format!("{kind} forward {what}"),
                (dims.num_dst, plan.in_dim),
                got,
            ));
        }
    }
    Ok(EdgeCoeff::Later(aggregation))
}

/// Checks a sourced input ([`Layer::forward_sourced`]) as [`check_aggregated`] does, `src`
/// standing for the aggregate.
pub(crate) fn check_sourced<B: Backend>(
    be: &B,
    kind: &str,
    block: &B::Block,
    plan: InputPlan,
    h_dst: Option<&B::Tensor>,
    src: &dyn RowSource,
) -> Result<EdgeCoeff<B>> {
    let dims = be.block_dims(block);
    let got = (src.rows(), src.cols());
    if got != (dims.num_dst, plan.in_dim) {
        return Err(ComputeError::shape(
            format!("{kind} forward aggregate"),
            (dims.num_dst, plan.in_dim),
            got,
        ));
    }
    let inputs: Vec<(&str, &B::Tensor)> = h_dst.map(|h| ("h_dst", h)).into_iter().collect();
    check_aggregated(be, kind, block, plan, &inputs)
}

/// Checks `grad_out` against the cached forward's output shape.
pub(crate) fn check_grad<B: Backend>(
    be: &B,
    kind: &str,
    grad: &B::Tensor,
    expected: (usize, usize),
) -> Result<()> {
    let got = be.shape(grad);
    if got != expected {
        return Err(ComputeError::shape(
            format!("{kind} backward grad_out"),
            expected,
            got,
        ));
    }
    Ok(())
}

/// The error for a backward without a cached training forward.
pub(crate) fn no_cache(kind: &str) -> ComputeError {
    ComputeError::State(format!(
        "{kind} backward called without a training forward (a training pass) since the last backward"
    ))
}

/// `param.grad += op(a)^T-style product`: `grad += a^T b`.
pub(crate) fn acc_at_b<B: Backend>(
    be: &B,
    a: &B::Tensor,
    b: &B::Tensor,
    p: &mut Param<B>,
) -> DeviceResult<()> {
    be.gemm(1.0, a, true, b, false, 1.0, &mut p.grad)
}

/// `bias.grad += column sums of g`.
pub(crate) fn acc_bias<B: Backend>(be: &B, g: &B::Tensor, p: &mut Param<B>) -> DeviceResult<()> {
    let s = be.sum_rows(g)?;
    be.axpy(1.0, &s, &mut p.grad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::BlockRef;
    use crate::cpu::CpuBackend;

    /// A pre-aggregated input gives the whole input's output bit for bit, and a wrong shape or
    /// a block the layer projects first is refused by name.
    #[test]
    fn forward_aggregated_equals_forward_and_refuses_what_it_cannot_take() {
        let be = CpuBackend;
        // 2 destinations, 5 sources, 6 edges.
        let (indptr, indices) = ([0u32, 4, 6], [1u32, 2, 3, 4, 0, 4]);
        let block = be
            .prepare_block(&BlockRef {
                num_dst: 2,
                num_src: 5,
                indptr: &indptr,
                indices: &indices,
                weights: None,
            })
            .unwrap();
        let x = Tensor::from_fn(5, 3, |i, j| (i * 3 + j) as f32 * 0.25 - 1.0);
        for kind in ["sage", "gcn", "gin"] {
            let make = |order| -> Box<dyn Layer<CpuBackend>> {
                let mut rng = Rng::new(7);
                match kind {
                    "sage" => Box::new(
                        super::SageLayer::new(be, 3, 2, Activation::Relu, &mut rng)
                            .unwrap()
                            .with_order(order),
                    ),
                    "gcn" => Box::new(
                        super::GcnLayer::new(be, 3, 2, Activation::Relu, &mut rng)
                            .unwrap()
                            .with_order(order),
                    ),
                    // GIN always sums first; a non-zero eps so its self term counts.
                    _ => {
                        let mut l =
                            super::GinLayer::new(be, 3, 4, 2, Activation::Relu, &mut rng).unwrap();
                        l.params_mut()[0].value = Tensor::scalar(0.375);
                        Box::new(l)
                    }
                }
            };
            let mut layer = make(AggregateOrder::AggregateFirst);
            let want = layer.forward(&block, x.clone(), Pass::Eval).unwrap();
            let agg_kind = layer.input_plan().unwrap().for_block(be.block_dims(&block));
            let coeff = be.edge_coefficients(&block, agg_kind.unwrap()).unwrap();
            let agg = be.spmm(&block, coeff.as_ref(), &x).unwrap();
            let h_dst = be.prefix_rows(&x, 2).unwrap();
            let got = layer
                .forward_aggregated(&block, h_dst.clone(), agg.clone(), Pass::Eval)
                .unwrap();
            assert_eq!(got.data(), want.data(), "{kind}");
            let short = Tensor::zeros(1, 3);
            let e = layer
                .forward_aggregated(&block, h_dst.clone(), short, Pass::Eval)
                .unwrap_err();
            assert!(e.to_string().contains("aggregate"), "{kind}: {e}");
            if kind == "gin" {
                continue;
            }
            let e = make(AggregateOrder::ProjectFirst)
                .forward_aggregated(&block, h_dst, agg, Pass::Eval)
                .unwrap_err();
            assert!(
                e.to_string().contains("projected before aggregating"),
                "{kind}: {e}"
            );
        }
    }

    /// The backward after a pre-aggregated forward (whose edge coefficients the layer makes
    /// only if the backward reads them) gives the whole forward's gradients bit for bit: the
    /// input gradient where it is asked for, and the parameter gradients either way.
    #[test]
    fn backward_after_an_aggregated_forward_equals_the_whole_forwards() {
        let be = CpuBackend;
        // 3 destinations, 6 sources, uneven degrees (the coefficients differ per edge).
        let (indptr, indices) = ([0u32, 4, 5, 8], [1u32, 2, 3, 5, 0, 4, 5, 1]);
        let block = be
            .prepare_block(&BlockRef {
                num_dst: 3,
                num_src: 6,
                indptr: &indptr,
                indices: &indices,
                weights: None,
            })
            .unwrap();
        let x = Tensor::from_fn(6, 4, |i, j| ((i * 4 + j) as f32 * 0.37).sin());
        let grad_out = Tensor::from_fn(3, 3, |i, j| ((i * 3 + j) as f32 * 0.71).cos());
        for kind in ["sage", "gcn"] {
            for need in [true, false] {
                let make = || -> Box<dyn Layer<CpuBackend>> {
                    let mut rng = Rng::new(11);
                    match kind {
                        "sage" => Box::new(
                            super::SageLayer::new(be, 4, 3, Activation::None, &mut rng)
                                .unwrap()
                                .with_order(AggregateOrder::AggregateFirst),
                        ),
                        _ => Box::new(
                            super::GcnLayer::new(be, 4, 3, Activation::None, &mut rng)
                                .unwrap()
                                .with_order(AggregateOrder::AggregateFirst),
                        ),
                    }
                };
                let mut whole = make();
                whole.forward(&block, x.clone(), Pass::TRAIN).unwrap();
                let want_dx = whole.backward(&grad_out, need).unwrap();
                let mut aggregated = make();
                let agg_kind = aggregated
                    .input_plan()
                    .unwrap()
                    .for_block(be.block_dims(&block));
                let coeff = be.edge_coefficients(&block, agg_kind.unwrap()).unwrap();
                let agg = be.spmm(&block, coeff.as_ref(), &x).unwrap();
                let h_dst = be.prefix_rows(&x, 3).unwrap();
                aggregated
                    .forward_aggregated(&block, h_dst, agg, Pass::TRAIN)
                    .unwrap();
                let got_dx = aggregated.backward(&grad_out, need).unwrap();
                assert_eq!(got_dx.is_some(), need, "{kind}");
                if let (Some(got), Some(want)) = (&got_dx, &want_dx) {
                    assert_eq!(got.data(), want.data(), "{kind}: input gradient");
                }
                for (g, w) in aggregated.params().iter().zip(whole.params()) {
                    assert_eq!(g.grad.data(), w.grad.data(), "{kind} {}", w.name());
                }
            }
        }
    }
}
