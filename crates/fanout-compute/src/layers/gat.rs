//! GAT: multi-head attention with edge softmax.

use fanout_rand::Rng;

use super::{
    acc_at_b, acc_bias, check_grad, check_input, epilogue_backward, epilogue_backward_bias, glorot,
    no_cache, Activation, AggregateOrder, Layer, MaybeOwned, Param, Pass,
};
use crate::backend::Backend;
use crate::block::BlockDims;
use crate::error::{ComputeError, Result};
use crate::tensor::Tensor;

/// Negative slope of the leaky ReLU on attention logits (DGL `GATConv` default).
pub const GAT_NEGATIVE_SLOPE: f32 = 0.2;

/// How a GAT layer combines its heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadMerge {
    /// Concatenate: output width `heads * head_dim` (hidden layers).
    Concat,
    /// Average: output width `head_dim` (the output layer).
    Mean,
}

/// GAT layer (DGL `GATConv` with `feat_drop = attn_drop = 0`, no residual, shared projection
/// for sources and destinations): `z = h_src W` split into `H` heads of `F` columns;
/// `el[s,h] = <z[s,h], attn_l[h]>`, `er[d,h] = <z[d,h], attn_r[h]>`;
/// `alpha[e,h] = edge_softmax_d(leaky_relu(el[src(e),h] + er[d,h], 0.2))`;
/// `out[d,h] = sum_e alpha[e,h] z[src(e),h] + bias[h]`; heads merged by [`HeadMerge`], then the
/// activation (ReLU here, where DGL's GAT example uses ELU). A destination without edges gets
/// only the bias. Parameters: `weight` (`in x H*F`), `attn_l`, `attn_r` (`H x F`), `bias`
/// (`1 x H*F`).
///
/// A layer built [`GatLayer::without_input_gradient`] (a model's first) may compute the same
/// function in the other order, aggregating its input rows before projecting them, where a
/// block has far more sources than destinations (see [`GatLayer::with_order`]): with
/// `W_h` head `h`'s columns of `weight`, `el[s,h] = <h_src[s], W_h attn_l[h]>` and
/// `out[d,h] = (sum_e alpha[e,h] h_src[src(e)]) W_h`, so only the destinations' aggregates
/// are multiplied by the weights.
#[derive(Debug)]
pub struct GatLayer<B: Backend> {
    be: B,
    in_dim: usize,
    heads: usize,
    head_dim: usize,
    merge: HeadMerge,
    act: Activation,
    weight: Param<B>,
    attn_l: Param<B>,
    attn_r: Param<B>,
    bias: Param<B>,
    order: AggregateOrder,
    input_grad: bool,
    cache: Option<Cache<B>>,
}

/// What the forward kept of its input's transformations.
#[derive(Debug)]
enum Inputs<B: Backend> {
    /// `z = h_src W` (its first rows are the destinations').
    Projected(B::Tensor),
    /// Every head's aggregate of the input rows, `D x (H*in)` ([`Backend::spmm_heads`]), and
    /// the destinations' input rows.
    Aggregated(B::Tensor, B::Tensor),
}

#[derive(Debug)]
struct Cache<B: Backend> {
    block: B::Block,
    h_src: B::Tensor,
    inputs: Inputs<B>,
    scores: B::Tensor,
    alpha: B::Tensor,
    /// Shape of the output (checked against the incoming gradient).
    out_shape: (usize, usize),
    /// What the epilogue's backward needs ([`Activation::finish`]).
    kept: Option<B::Tensor>,
}

impl<B: Backend> GatLayer<B> {
    /// A layer `in_dim -> heads x head_dim` (merged per `merge`), weights drawn from `rng`.
    /// Attention vectors are Glorot-uniform with the fans PyTorch computes for DGL's
    /// `(1, H, F)` attention tensor (`H*F`, `F`). `Err` when the device fails.
    pub fn new(
        be: B,
        in_dim: usize,
        heads: usize,
        head_dim: usize,
        merge: HeadMerge,
        act: Activation,
        rng: &mut Rng,
    ) -> Result<Self> {
        assert!(heads > 0, "GatLayer: zero heads");
        let hf = heads * head_dim;
        let weight = Param::new(&be, "weight", &glorot(in_dim, hf, rng))?;
        let attn = |rng: &mut Rng| Tensor::glorot(heads, head_dim, hf, head_dim, rng);
        let attn_l = Param::new(&be, "attn_l", &attn(rng))?;
        let attn_r = Param::new(&be, "attn_r", &attn(rng))?;
        let bias = Param::new(&be, "bias", &Tensor::zeros(1, hf))?;
        Ok(GatLayer {
            be,
            in_dim,
            heads,
            head_dim,
            merge,
            act,
            weight,
            attn_l,
            attn_r,
            bias,
            order: AggregateOrder::Auto,
            input_grad: true,
            cache: None,
        })
    }

    /// The same layer, promised never to be asked for its input's gradient (`backward` with
    /// `need` then fails): what lets it aggregate before projecting.
    pub fn without_input_gradient(mut self) -> Self {
        self.input_grad = false;
        self
    }

    /// The same layer with its order rule: [`AggregateOrder::Auto`] (the default) aggregates
    /// first for the blocks where the estimate below is smaller and the layer is
    /// [`GatLayer::without_input_gradient`] on a backend with per-head products
    /// ([`Backend::has_head_products`]); the other two force an order, and a forward that
    /// cannot aggregate first fails. Both orders compute the same values up to rounding.
    pub fn with_order(mut self, order: AggregateOrder) -> Self {
        self.order = order;
        self
    }

    /// Whether this block's forward aggregates first: for `Auto`, when its estimated cost,
    /// forward and backward, is lower. The estimate counts multiply-adds and, at 40 each
    /// (about the GEMM rate over the copy bandwidth on the machines measured), the floats
    /// moved through memory. Projecting first multiplies all `S` sources (`2 S in HF`: `z`
    /// and its weight gradient), passes `HF`-wide rows over the edges three times, and reads
    /// `h_src` twice and `HF`-wide source rows (`z`, its gradient) about eight times.
    /// Aggregating first multiplies the `D` destinations three times (output, weight and
    /// aggregate gradients), passes every head's `in`-wide rows over the edges twice (counted
    /// double: rows scaled per head run well under the GEMM rate), folds the attention
    /// vectors through all sources (`2 S in H`), and moves `h_src` twice, a source row per
    /// edge twice and the `D x H*in` aggregates and their gradient five times. It is never
    /// taken where those aggregates hold more than four times the floats of `z`.
    fn aggregates_first(&self, dims: BlockDims) -> Result<bool> {
        let possible = !self.input_grad && self.be.has_head_products();
        match self.order {
            AggregateOrder::ProjectFirst => Ok(false),
            AggregateOrder::AggregateFirst if possible => Ok(true),
            AggregateOrder::AggregateFirst => {
                let has = if self.be.has_head_products() {
                    "has"
                } else {
                    "lacks"
                };
                Err(ComputeError::State(format!(
                    "a GAT layer aggregates first only without an input gradient, on a backend \
                     with per-head products (the {} backend {has} them)",
                    self.be.name()
                )))
            }
            AggregateOrder::Auto if !possible => Ok(false),
            AggregateOrder::Auto => {
                let (d, s, e) = (
                    dims.num_dst as f64,
                    dims.num_src as f64,
                    dims.num_edges as f64,
                );
                let (i, h) = (self.in_dim as f64, self.heads as f64);
                let hf = h * self.head_dim as f64;
                const PER_FLOAT: f64 = 40.0;
                let project =
                    2.0 * s * i * hf + 3.0 * e * hf + PER_FLOAT * (2.0 * s * i + 8.0 * s * hf);
                let aggregate = 3.0 * d * i * hf
                    + 4.0 * e * h * i
                    + 2.0 * s * i * h
                    + PER_FLOAT * (2.0 * s * i + 2.0 * e * i + 5.0 * d * h * i);
                Ok(aggregate < project && d * h * i <= 4.0 * s * hf)
            }
        }
    }

    /// Number of attention heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// The gradients of the attention logits `el` (`S x H`) and `er` (`D x H`) from that of
    /// the attention coefficients.
    fn score_gradients(&self, c: &Cache<B>, g_alpha: &B::Tensor) -> Result<(B::Tensor, B::Tensor)> {
        let be = &self.be;
        let g_e = be.edge_softmax_backward(&c.block, &c.alpha, g_alpha)?;
        let g_scores = be.leaky_relu_backward(&g_e, &c.scores, GAT_NEGATIVE_SLOPE)?;
        Ok((
            be.edge_sum_to_src(&c.block, &g_scores)?,
            be.edge_sum_to_dst(&c.block, &g_scores)?,
        ))
    }

    /// The parameter gradients of a forward that aggregated first (`y`, every head's
    /// aggregate of the input rows), given `g_rst`, the gradient at the heads' outputs.
    fn backward_aggregated(
        &mut self,
        c: &Cache<B>,
        y: &B::Tensor,
        h_dst: &B::Tensor,
        g_rst: &B::Tensor,
    ) -> Result<()> {
        let be = &self.be;
        let heads = self.heads;
        be.head_acc_at_b(y, g_rst, &mut self.weight.grad, heads)?;
        let g_alpha = {
            let gy = be.head_matmul_bt(g_rst, &self.weight.value, heads)?;
            be.spmm_heads_backward_coeff(&c.block, &gy, &c.h_src)?
        };
        let (g_el, g_er) = self.score_gradients(c, &g_alpha)?;
        // `el = h_src (W_h attn_l[h])_h`: the folded vectors' gradients `h_src^T g_el`, then
        // through the fold into `weight` and `attn_l`; likewise `er` from `h_dst`.
        for (x, g, attn) in [
            (&c.h_src, &g_el, &mut self.attn_l),
            (h_dst, &g_er, &mut self.attn_r),
        ] {
            let g_u = be.matmul(x, true, g, false)?;
            let g_attn = be.head_dot_backward_acc(
                &g_u,
                &self.weight.value,
                &attn.value,
                &mut self.weight.grad,
            )?;
            be.axpy(1.0, &g_attn, &mut attn.grad)?;
        }
        Ok(())
    }
}

impl<B: Backend> Layer<B> for GatLayer<B> {
    fn backend(&self) -> &B {
        &self.be
    }
    fn kind(&self) -> &'static str {
        "gat"
    }
    fn in_dim(&self) -> usize {
        self.in_dim
    }
    fn out_dim(&self) -> usize {
        match self.merge {
            HeadMerge::Concat => self.heads * self.head_dim,
            HeadMerge::Mean => self.head_dim,
        }
    }

    fn forward(&mut self, block: &B::Block, h_src: B::Tensor, pass: Pass<'_>) -> Result<B::Tensor> {
        let be = &self.be;
        let dims = check_input(be, "gat", block, &h_src, self.in_dim)?;
        let w = &self.weight.value;
        let aggregate_first = self.aggregates_first(dims)?;
        let (el, er, z) = if aggregate_first {
            // The attention vectors folded into the weights: `W_h attn[h]`, `in x H`.
            let ul = be.head_dot(w, &self.attn_l.value)?;
            let ur = be.head_dot(w, &self.attn_r.value)?;
            let h_dst = be.prefix_rows(&h_src, dims.num_dst)?;
            let el = be.matmul(&h_src, false, &ul, false)?;
            let er = be.matmul(&h_dst, false, &ur, false)?;
            (el, er, Err(h_dst))
        } else {
            let z = be.matmul(&h_src, false, w, false)?;
            let el = be.head_dot(&z, &self.attn_l.value)?;
            let er = be.head_dot_prefix(&z, &self.attn_r.value, dims.num_dst)?;
            (el, er, Ok(z))
        };
        let scores = be.u_add_v(block, &el, &er)?;
        let e = be.leaky_relu(&scores, GAT_NEGATIVE_SLOPE)?;
        let alpha = be.edge_softmax(block, &e)?;
        let (mut rst, inputs) = match z {
            Ok(z) => (be.spmm(block, Some(&alpha), &z)?, Inputs::Projected(z)),
            Err(h_dst) => {
                let y = be.spmm_heads(block, &alpha, &h_src)?;
                (
                    be.head_matmul(&y, w, self.heads)?,
                    Inputs::Aggregated(y, h_dst),
                )
            }
        };
        // Concatenated heads take the bias in the epilogue's pass; averaged ones before it.
        let (merged, bias) = match self.merge {
            HeadMerge::Concat => (rst, Some(&self.bias.value)),
            HeadMerge::Mean => {
                be.add_bias(&mut rst, &self.bias.value)?;
                (be.head_mean(&rst, self.heads)?, None)
            }
        };
        let (out, kept) = self.act.finish(be, merged, bias, pass)?;
        self.cache = pass.is_train().then(|| Cache {
            block: block.clone(),
            h_src,
            inputs,
            scores,
            alpha,
            out_shape: be.shape(&out),
            kept,
        });
        Ok(out)
    }

    fn backward(&mut self, grad_out: &B::Tensor, need: bool) -> Result<Option<B::Tensor>> {
        let c = self.cache.take().ok_or_else(|| no_cache("gat"))?;
        if need && !self.input_grad {
            return Err(ComputeError::State(
                "a GAT layer built `without_input_gradient` was asked for its input's gradient; \
                 build layers whose input needs one without that call"
                    .into(),
            ));
        }
        let be = &self.be;
        check_grad(be, "gat", grad_out, c.out_shape)?;
        let kept = c.kept.as_ref();
        let g_rst = match self.merge {
            HeadMerge::Concat => epilogue_backward_bias(be, grad_out, kept, &mut self.bias)?,
            HeadMerge::Mean => {
                let g = epilogue_backward(be, grad_out, kept)?;
                let g_rst = be.head_mean_backward(g.as_ref(), self.heads)?;
                acc_bias(be, &g_rst, &mut self.bias)?;
                MaybeOwned::Owned(g_rst)
            }
        };
        let g_rst = g_rst.as_ref();
        let z = match &c.inputs {
            Inputs::Projected(z) => z,
            Inputs::Aggregated(y, h_dst) => {
                return self.backward_aggregated(&c, y, h_dst, g_rst).map(|()| None)
            }
        };
        let (mut gz, g_alpha) = be.spmm_backward(&c.block, &c.alpha, g_rst, z)?;
        let (g_el, g_er) = self.score_gradients(&c, &g_alpha)?;
        let g_attn_l = be.head_dot_backward_acc(&g_el, z, &self.attn_l.value, &mut gz)?;
        be.axpy(1.0, &g_attn_l, &mut self.attn_l.grad)?;
        let g_attn_r = be.head_dot_prefix_backward_acc(&g_er, z, &self.attn_r.value, &mut gz)?;
        be.axpy(1.0, &g_attn_r, &mut self.attn_r.grad)?;
        acc_at_b(be, &c.h_src, &gz, &mut self.weight)?;
        Ok(if need {
            Some(be.matmul(&gz, false, &self.weight.value, true)?)
        } else {
            None
        })
    }

    fn params(&self) -> Vec<&Param<B>> {
        vec![&self.weight, &self.attn_l, &self.attn_r, &self.bias]
    }
    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        vec![
            &mut self.weight,
            &mut self.attn_l,
            &mut self.attn_r,
            &mut self.bias,
        ]
    }
    fn clear_cache(&mut self) {
        self.cache = None;
    }
}
