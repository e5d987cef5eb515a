//! PinSAGE: importance-weighted aggregation by random-walk visit counts.

use fanout_rand::Rng;

use super::{
    acc_at_b, acc_bias, check_grad, check_input, epilogue_backward, glorot_gain, no_cache,
    Activation, Layer, MaybeOwned, Param, Pass, RELU_GAIN,
};
use crate::backend::{Aggregation, Backend};
use crate::error::Result;
use crate::tensor::Tensor;

/// PinSAGE layer (DGL's PinSAGE example, `WeightedSAGEConv`, without its internal dropout):
/// `n = relu(h_src Q + q_bias)`; `agg[d] = sum_e w(e) n[src(e)] / max(sum_e w(e), 1)` with the
/// block's edge weights (visit counts; 1 where absent, see [`Aggregation::WeightedMean`]);
/// `z = act(agg W_neigh + h_dst_in W_self + bias)` (DGL's `W [agg; h_dst]` split in two);
/// with `normalize`, `h_dst = z / ||z||` per row (rows of norm 0 kept). Parameters: `q`
/// (`in x hidden`), `q_bias`, `w_neigh` (`hidden x out`), `w_self` (`in x out`), `bias`.
#[derive(Debug)]
pub struct PinSageLayer<B: Backend> {
    be: B,
    in_dim: usize,
    hidden: usize,
    out_dim: usize,
    act: Activation,
    normalize: bool,
    q: Param<B>,
    q_bias: Param<B>,
    w_neigh: Param<B>,
    w_self: Param<B>,
    bias: Param<B>,
    cache: Option<Cache<B>>,
}

#[derive(Debug)]
struct Cache<B: Backend> {
    block: B::Block,
    coeff: Option<B::Tensor>,
    h_src: B::Tensor,
    h_dst: B::Tensor,
    n: B::Tensor,
    agg: B::Tensor,
    /// Output of the activation, before normalisation.
    z: B::Tensor,
    /// Final output and the row norms used (when normalising).
    normalized: Option<(B::Tensor, B::Tensor)>,
    /// The dropout's mask, when the pass had one ([`Activation::finish`]).
    kept: Option<B::Tensor>,
}

impl<B: Backend> PinSageLayer<B> {
    /// A layer `in_dim -> out_dim` whose neighbour projection is `hidden` wide; `normalize`
    /// turns the row L2 normalisation on (hidden layers), weights drawn from `rng`; `Err`
    /// when the device fails.
    pub fn new(
        be: B,
        in_dim: usize,
        hidden: usize,
        out_dim: usize,
        act: Activation,
        normalize: bool,
        rng: &mut Rng,
    ) -> Result<Self> {
        // DGL's PinSAGE example: xavier_uniform_ with the ReLU gain.
        let q = Param::new(&be, "q", &glorot_gain(in_dim, hidden, RELU_GAIN, rng))?;
        let q_bias = Param::new(&be, "q_bias", &Tensor::zeros(1, hidden))?;
        let w_neigh = Param::new(
            &be,
            "w_neigh",
            &glorot_gain(hidden, out_dim, RELU_GAIN, rng),
        )?;
        let w_self = Param::new(&be, "w_self", &glorot_gain(in_dim, out_dim, RELU_GAIN, rng))?;
        let bias = Param::new(&be, "bias", &Tensor::zeros(1, out_dim))?;
        Ok(PinSageLayer {
            be,
            in_dim,
            hidden,
            out_dim,
            act,
            normalize,
            q,
            q_bias,
            w_neigh,
            w_self,
            bias,
            cache: None,
        })
    }

    /// Width of the neighbour projection `Q`.
    pub fn hidden(&self) -> usize {
        self.hidden
    }
}

impl<B: Backend> Layer<B> for PinSageLayer<B> {
    fn backend(&self) -> &B {
        &self.be
    }
    fn kind(&self) -> &'static str {
        "pinsage"
    }
    fn in_dim(&self) -> usize {
        self.in_dim
    }
    fn out_dim(&self) -> usize {
        self.out_dim
    }

    fn forward(&mut self, block: &B::Block, h_src: B::Tensor, pass: Pass<'_>) -> Result<B::Tensor> {
        let be = &self.be;
        let dims = check_input(be, "pinsage", block, &h_src, self.in_dim)?;
        let mut n = be.matmul(&h_src, false, &self.q.value, false)?;
        // ReLU's backward reads its output (`n`), so nothing else is kept.
        be.epilogue(&mut n, Some(&self.q_bias.value), true, None, false)?;
        let coeff = be.edge_coefficients(block, Aggregation::WeightedMean)?;
        let agg = be.spmm(block, coeff.as_ref(), &n)?;
        let h_dst = be.prefix_rows(&h_src, dims.num_dst)?;
        let mut z = be.matmul(&agg, false, &self.w_neigh.value, false)?;
        be.gemm(1.0, &h_dst, false, &self.w_self.value, false, 1.0, &mut z)?;
        // The activation's backward reads its output (`z`), kept below.
        be.epilogue(
            &mut z,
            Some(&self.bias.value),
            self.act == Activation::Relu,
            None,
            false,
        )?;
        let normalized = if self.normalize {
            Some(be.l2_normalize_rows(&z)?)
        } else {
            None
        };
        let out = match &normalized {
            Some((y, _)) => be.copy(y)?,
            None => be.copy(&z)?,
        };
        // The dropout comes after the normalisation.
        let (out, kept) = Activation::None.finish(be, out, None, pass)?;
        if pass.is_train() {
            self.cache = Some(Cache {
                block: block.clone(),
                coeff,
                h_src,
                h_dst,
                n,
                agg,
                z,
                normalized,
                kept,
            });
        } else {
            self.cache = None;
        }
        Ok(out)
    }

    fn backward(&mut self, grad_out: &B::Tensor, need: bool) -> Result<Option<B::Tensor>> {
        let c = self.cache.take().ok_or_else(|| no_cache("pinsage"))?;
        let be = &self.be;
        check_grad(be, "pinsage", grad_out, be.shape(&c.z))?;
        let grad_out = epilogue_backward(be, grad_out, c.kept.as_ref())?;
        let grad_out = grad_out.as_ref();
        let gz = match &c.normalized {
            Some((y, norms)) => {
                MaybeOwned::Owned(be.l2_normalize_rows_backward(grad_out, y, norms)?)
            }
            None => MaybeOwned::Borrowed(grad_out),
        };
        let g = self.act.backward(be, gz.as_ref(), &c.z)?;
        let g = g.as_ref();
        acc_bias(be, g, &mut self.bias)?;
        be.acc_at_b_shared(
            g,
            &mut [
                (&c.agg, &mut self.w_neigh.grad),
                (&c.h_dst, &mut self.w_self.grad),
            ],
        )?;
        let gagg = be.matmul(g, false, &self.w_neigh.value, true)?;
        let gn = be.spmm_backward_x(&c.block, c.coeff.as_ref(), &gagg)?;
        let gn = be.relu_backward(&gn, &c.n)?;
        acc_bias(be, &gn, &mut self.q_bias)?;
        acc_at_b(be, &c.h_src, &gn, &mut self.q)?;
        if !need {
            return Ok(None);
        }
        let mut dx = be.matmul(&gn, false, &self.q.value, true)?;
        let gself = be.matmul(g, false, &self.w_self.value, true)?;
        let rows = be.shape(&gself).0;
        be.axpy_prefix(1.0, &gself, &mut dx, rows)?;
        Ok(Some(dx))
    }

    fn params(&self) -> Vec<&Param<B>> {
        vec![
            &self.q,
            &self.q_bias,
            &self.w_neigh,
            &self.w_self,
            &self.bias,
        ]
    }
    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        vec![
            &mut self.q,
            &mut self.q_bias,
            &mut self.w_neigh,
            &mut self.w_self,
            &mut self.bias,
        ]
    }
    fn clear_cache(&mut self) {
        self.cache = None;
    }
}
