//! GraphSAGE with the mean aggregator.

use fanout_rand::Rng;

use super::{
    acc_at_b, check_aggregated, check_grad, check_input, check_sourced, epilogue_backward_bias,
    glorot_gain, no_cache, Activation, AggregateOrder, EdgeCoeff, InputPlan, Layer, Param, Pass,
    RELU_GAIN,
};
use crate::backend::{Aggregation, Backend};
use crate::error::Result;
use crate::source::RowSource;
use crate::tensor::Tensor;

/// GraphSAGE layer, mean aggregator (DGL `SAGEConv(aggregator_type="mean")`):
/// `h_dst = act(h_dst_in W_self + mean_{s in N(d)} h_src[s] W_neigh + b)` where `h_dst_in` are
/// the first `num_dst` rows of `h_src` and the mean is over the block's edges into `d` (a
/// destination without edges gets only the self term). Parameters: `w_self`, `w_neigh`
/// (`in x out`), `bias` (`1 x out`).
#[derive(Debug)]
pub struct SageLayer<B: Backend> {
    be: B,
    in_dim: usize,
    out_dim: usize,
    act: Activation,
    order: AggregateOrder,
    w_self: Param<B>,
    w_neigh: Param<B>,
    bias: Param<B>,
    cache: Option<Cache<B>>,
}

#[derive(Debug)]
struct Cache<B: Backend> {
    block: B::Block,
    coeff: EdgeCoeff<B>,
    h_dst: B::Tensor,
    /// `h_src` if the product came first, else the aggregated rows (`D x in`).
    neigh_in: B::Tensor,
    project_first: bool,
    /// Shape of the output (checked against the incoming gradient).
    out_shape: (usize, usize),
    /// What the epilogue's backward needs ([`Activation::finish`]).
    kept: Option<B::Tensor>,
}

impl<B: Backend> SageLayer<B> {
    /// A layer `in_dim -> out_dim` with weights drawn from `rng`; `Err` when the device fails.
    pub fn new(
        be: B,
        in_dim: usize,
        out_dim: usize,
        act: Activation,
        rng: &mut Rng,
    ) -> Result<Self> {
        // DGL SAGEConv: xavier_uniform_ with the ReLU gain on both weights, zero bias.
        let w_self = Param::new(&be, "w_self", &glorot_gain(in_dim, out_dim, RELU_GAIN, rng))?;
        let w_neigh = Param::new(
            &be,
            "w_neigh",
            &glorot_gain(in_dim, out_dim, RELU_GAIN, rng),
        )?;
        let bias = Param::new(&be, "bias", &Tensor::zeros(1, out_dim))?;
        Ok(SageLayer {
            be,
            in_dim,
            out_dim,
            act,
            order: AggregateOrder::Auto,
            w_self,
            w_neigh,
            bias,
            cache: None,
        })
    }

    /// Forces an order for the neighbour product (default [`AggregateOrder::Auto`]).
    pub fn with_order(mut self, order: AggregateOrder) -> Self {
        self.order = order;
        self
    }
}

impl<B: Backend> SageLayer<B> {
    /// The aggregate-first forward from the destinations' rows and their mean aggregate.
    fn forward_from_aggregate(
        &mut self,
        block: &B::Block,
        coeff: EdgeCoeff<B>,
        h_dst: B::Tensor,
        agg: B::Tensor,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = &self.be;
        let mut out = be.matmul(&h_dst, false, &self.w_self.value, false)?;
        be.gemm(1.0, &agg, false, &self.w_neigh.value, false, 1.0, &mut out)?;
        self.finish(block, coeff, h_dst, agg, false, out, pass)
    }

    /// Its input plan: aggregate first (Mean) where its order rule says so.
    fn plan(&self) -> InputPlan {
        InputPlan {
            aggregation: Aggregation::Mean,
            order: self.order,
            in_dim: self.in_dim,
            out_dim: self.out_dim,
            made_in_product: true,
            reads_dst: true,
        }
    }

    /// Bias, activation and the pass's dropout in one pass, and (in training) the cache for
    /// backward.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        block: &B::Block,
        coeff: EdgeCoeff<B>,
        h_dst: B::Tensor,
        neigh_in: B::Tensor,
        project_first: bool,
        out: B::Tensor,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = &self.be;
        let (out, kept) = self.act.finish(be, out, Some(&self.bias.value), pass)?;
        self.cache = pass.is_train().then(|| Cache {
            block: block.clone(),
            coeff,
            h_dst,
            neigh_in,
            project_first,
            out_shape: be.shape(&out),
            kept,
        });
        Ok(out)
    }
}

impl<B: Backend> Layer<B> for SageLayer<B> {
    fn backend(&self) -> &B {
        &self.be
    }
    fn kind(&self) -> &'static str {
        "sage"
    }
    fn in_dim(&self) -> usize {
        self.in_dim
    }
    fn out_dim(&self) -> usize {
        self.out_dim
    }

    fn forward(&mut self, block: &B::Block, h_src: B::Tensor, pass: Pass<'_>) -> Result<B::Tensor> {
        let be = &self.be;
        let dims = check_input(be, "sage", block, &h_src, self.in_dim)?;
        let coeff = be.edge_coefficients(block, Aggregation::Mean)?;
        let h_dst = be.prefix_rows(&h_src, dims.num_dst)?;
        if self.order.project_first(dims, self.in_dim, self.out_dim) {
            let mut out = be.matmul(&h_dst, false, &self.w_self.value, false)?;
            let z = be.matmul(&h_src, false, &self.w_neigh.value, false)?;
            let agg = be.spmm(block, coeff.as_ref(), &z)?;
            be.axpy(1.0, &agg, &mut out)?;
            self.finish(block, EdgeCoeff::Made(coeff), h_dst, h_src, true, out, pass)
        } else {
            let agg = be.spmm(block, coeff.as_ref(), &h_src)?;
            self.forward_from_aggregate(block, EdgeCoeff::Made(coeff), h_dst, agg, pass)
        }
    }

    fn input_plan(&self) -> Option<InputPlan> {
        Some(self.plan())
    }

    fn forward_aggregated(
        &mut self,
        block: &B::Block,
        h_dst: B::Tensor,
        agg: B::Tensor,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = &self.be;
        let plan = self.plan();
        let coeff = check_aggregated(
            be,
            "sage",
            block,
            plan,
            &[("h_dst", &h_dst), ("aggregate", &agg)],
        )?;
        self.forward_from_aggregate(block, coeff, h_dst, agg, pass)
    }

    fn forward_sourced(
        &mut self,
        block: &B::Block,
        h_dst: B::Tensor,
        src: &dyn RowSource,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = &self.be;
        let coeff = check_sourced(be, "sage", block, self.plan(), Some(&h_dst), src)?;
        // forward_from_aggregate's two products, the aggregate made inside them.
        let first = Some((&h_dst, &self.w_self.value));
        let (out, agg) = be.matmul_sourced(first, src, &self.w_neigh.value)?;
        self.finish(block, coeff, h_dst, agg, false, out, pass)
    }

    fn backward(&mut self, grad_out: &B::Tensor, need: bool) -> Result<Option<B::Tensor>> {
        let c = self.cache.take().ok_or_else(|| no_cache("sage"))?;
        let be = &self.be;
        check_grad(be, "sage", grad_out, c.out_shape)?;
        if let (false, false, Some(kept)) = (c.project_first, need, c.kept.as_ref()) {
            // Only the weights and the bias need the gradient through the epilogue (a first
            // layer): the backend may make it as it marks its non-zeros, never writing it out.
            be.acc_at_b_shared_product(
                grad_out,
                kept,
                &mut [
                    (&c.h_dst, &mut self.w_self.grad),
                    (&c.neigh_in, &mut self.w_neigh.grad),
                ],
                &mut self.bias.grad,
            )?;
            return Ok(None);
        }
        let g = epilogue_backward_bias(be, grad_out, c.kept.as_ref(), &mut self.bias)?;
        let g = g.as_ref();
        let mut dx = if c.project_first {
            acc_at_b(be, &c.h_dst, g, &mut self.w_self)?;
            let coeff = c.coeff.made(be, &c.block)?;
            let gz = be.spmm_backward_x(&c.block, coeff.as_ref(), g)?;
            acc_at_b(be, &c.neigh_in, &gz, &mut self.w_neigh)?;
            if need {
                Some(be.matmul(&gz, false, &self.w_neigh.value, true)?)
            } else {
                None
            }
        } else {
            // Both weights' gradients multiply the same `g`: one pass over it.
            be.acc_at_b_shared(
                g,
                &mut [
                    (&c.h_dst, &mut self.w_self.grad),
                    (&c.neigh_in, &mut self.w_neigh.grad),
                ],
            )?;
            if need {
                let gagg = be.matmul(g, false, &self.w_neigh.value, true)?;
                let coeff = c.coeff.made(be, &c.block)?;
                Some(be.spmm_backward_x(&c.block, coeff.as_ref(), &gagg)?)
            } else {
                None
            }
        };
        if let Some(dx) = dx.as_mut() {
            let gself = be.matmul(g, false, &self.w_self.value, true)?;
            let rows = be.shape(&gself).0;
            be.axpy_prefix(1.0, &gself, dx, rows)?;
        }
        Ok(dx)
    }

    fn params(&self) -> Vec<&Param<B>> {
        vec![&self.w_self, &self.w_neigh, &self.bias]
    }
    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        vec![&mut self.w_self, &mut self.w_neigh, &mut self.bias]
    }
    fn clear_cache(&mut self) {
        self.cache = None;
    }
}
