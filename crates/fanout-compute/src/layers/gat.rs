//! GAT: multi-head attention with edge softmax.

use fanout_rand::Rng;

use super::{
    acc_at_b, acc_bias, check_grad, check_input, epilogue_backward, epilogue_backward_bias, glorot,
    no_cache, Activation, Layer, MaybeOwned, Param, Pass,
};
use crate::backend::Backend;
use crate::error::Result;
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
    cache: Option<Cache<B>>,
}

#[derive(Debug)]
struct Cache<B: Backend> {
    block: B::Block,
    h_src: B::Tensor,
    z: B::Tensor,
    z_dst: B::Tensor,
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
            cache: None,
        })
    }

    /// Number of attention heads.
    pub fn heads(&self) -> usize {
        self.heads
    }
}

impl<B: Backend> Layer<B> for GatLayer<B> {
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
        let z = be.matmul(&h_src, false, &self.weight.value, false)?;
        let z_dst = be.prefix_rows(&z, dims.num_dst)?;
        let el = be.head_dot(&z, &self.attn_l.value)?;
        let er = be.head_dot(&z_dst, &self.attn_r.value)?;
        let scores = be.u_add_v(block, &el, &er)?;
        let e = be.leaky_relu(&scores, GAT_NEGATIVE_SLOPE)?;
        let alpha = be.edge_softmax(block, &e)?;
        let mut rst = be.spmm(block, Some(&alpha), &z)?;
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
            z,
            z_dst,
            scores,
            alpha,
            out_shape: be.shape(&out),
            kept,
        });
        Ok(out)
    }

    fn backward(&mut self, grad_out: &B::Tensor, need: bool) -> Result<Option<B::Tensor>> {
        let c = self.cache.take().ok_or_else(|| no_cache("gat"))?;
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
        let (mut gz, g_alpha) = be.spmm_backward(&c.block, &c.alpha, g_rst, &c.z)?;
        let g_e = be.edge_softmax_backward(&c.block, &c.alpha, &g_alpha)?;
        let g_scores = be.leaky_relu_backward(&g_e, &c.scores, GAT_NEGATIVE_SLOPE)?;
        let g_el = be.edge_sum_to_src(&c.block, &g_scores)?;
        let g_er = be.edge_sum_to_dst(&c.block, &g_scores)?;
        let g_attn_l = be.head_dot_backward_acc(&g_el, &c.z, &self.attn_l.value, &mut gz)?;
        be.axpy(1.0, &g_attn_l, &mut self.attn_l.grad)?;
        let g_attn_r = be.head_dot_backward_acc(&g_er, &c.z_dst, &self.attn_r.value, &mut gz)?;
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
