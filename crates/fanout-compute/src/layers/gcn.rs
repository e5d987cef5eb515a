//! GCN with symmetric normalisation on blocks.

use fanout_rand::Rng;

use super::{
    acc_at_b, check_aggregated, check_grad, check_input, check_sourced, epilogue_backward_bias,
    glorot, no_cache, Activation, AggregateOrder, EdgeCoeff, InputPlan, Layer, Param, Pass,
};
use crate::backend::{Aggregation, Backend};
use crate::error::Result;
use crate::source::RowSource;
use crate::tensor::Tensor;

/// GCN layer, DGL `GraphConv(norm="both")` on a block:
/// `h_dst[d] = act(sum_{e: s -> d} h_src[s] W / sqrt(max(out_deg(s),1) * max(in_deg(d),1)) + b)`
/// with degrees counted on the block's edges ([`Aggregation::GcnBoth`]). No self-loop is
/// added: a destination contributes its own row only if the block has an edge `d -> d`.
/// Parameters: `weight` (`in x out`), `bias` (`1 x out`).
#[derive(Debug)]
pub struct GcnLayer<B: Backend> {
    be: B,
    in_dim: usize,
    out_dim: usize,
    act: Activation,
    order: AggregateOrder,
    weight: Param<B>,
    bias: Param<B>,
    cache: Option<Cache<B>>,
}

#[derive(Debug)]
struct Cache<B: Backend> {
    block: B::Block,
    coeff: EdgeCoeff<B>,
    /// `h_src` if the product came first, else the aggregated rows (`D x in`).
    input: B::Tensor,
    project_first: bool,
    /// Shape of the output (checked against the incoming gradient).
    out_shape: (usize, usize),
    /// What the epilogue's backward needs ([`Activation::finish`]).
    kept: Option<B::Tensor>,
}

impl<B: Backend> GcnLayer<B> {
    /// A layer `in_dim -> out_dim` with weights drawn from `rng`; `Err` when the device fails.
    pub fn new(
        be: B,
        in_dim: usize,
        out_dim: usize,
        act: Activation,
        rng: &mut Rng,
    ) -> Result<Self> {
        let weight = Param::new(&be, "weight", &glorot(in_dim, out_dim, rng))?;
        let bias = Param::new(&be, "bias", &Tensor::zeros(1, out_dim))?;
        Ok(GcnLayer {
            be,
            in_dim,
            out_dim,
            act,
            order: AggregateOrder::Auto,
            weight,
            bias,
            cache: None,
        })
    }

    /// Forces an order for the product (default [`AggregateOrder::Auto`]).
    pub fn with_order(mut self, order: AggregateOrder) -> Self {
        self.order = order;
        self
    }
}

impl<B: Backend> GcnLayer<B> {
    /// The aggregate-first forward from the normalised aggregate of the input rows.
    fn forward_from_aggregate(
        &mut self,
        block: &B::Block,
        coeff: EdgeCoeff<B>,
        agg: B::Tensor,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let out = self.be.matmul(&agg, false, &self.weight.value, false)?;
        self.finish(block, coeff, agg, false, out, pass)
    }

    /// Its input plan: aggregate first (GcnBoth) where its order rule says so.
    fn plan(&self) -> InputPlan {
        InputPlan {
            aggregation: Aggregation::GcnBoth,
            order: self.order,
            in_dim: self.in_dim,
            out_dim: self.out_dim,
            made_in_product: true,
            reads_dst: false,
        }
    }

    /// Bias, activation and the pass's dropout in one pass, and (in training) the cache for
    /// backward.
    fn finish(
        &mut self,
        block: &B::Block,
        coeff: EdgeCoeff<B>,
        input: B::Tensor,
        project_first: bool,
        out: B::Tensor,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = &self.be;
        let (out, kept) = self.act.finish(be, out, Some(&self.bias.value), pass)?;
        self.cache = pass.is_train().then(|| Cache {
            block: block.clone(),
            coeff,
            input,
            project_first,
            out_shape: be.shape(&out),
            kept,
        });
        Ok(out)
    }
}

impl<B: Backend> Layer<B> for GcnLayer<B> {
    fn backend(&self) -> &B {
        &self.be
    }
    fn kind(&self) -> &'static str {
        "gcn"
    }
    fn in_dim(&self) -> usize {
        self.in_dim
    }
    fn out_dim(&self) -> usize {
        self.out_dim
    }

    fn forward(&mut self, block: &B::Block, h_src: B::Tensor, pass: Pass<'_>) -> Result<B::Tensor> {
        let be = &self.be;
        let dims = check_input(be, "gcn", block, &h_src, self.in_dim)?;
        let coeff = be.edge_coefficients(block, Aggregation::GcnBoth)?;
        if self.order.project_first(dims, self.in_dim, self.out_dim) {
            let z = be.matmul(&h_src, false, &self.weight.value, false)?;
            let out = be.spmm(block, coeff.as_ref(), &z)?;
            self.finish(block, EdgeCoeff::Made(coeff), h_src, true, out, pass)
        } else {
            let agg = be.spmm(block, coeff.as_ref(), &h_src)?;
            self.forward_from_aggregate(block, EdgeCoeff::Made(coeff), agg, pass)
        }
    }

    fn input_plan(&self) -> Option<InputPlan> {
        Some(self.plan())
    }

    /// GCN reads only the aggregate (`h_dst` is not used).
    fn forward_aggregated(
        &mut self,
        block: &B::Block,
        _h_dst: B::Tensor,
        agg: B::Tensor,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = &self.be;
        let plan = self.plan();
        let coeff = check_aggregated(be, "gcn", block, plan, &[("aggregate", &agg)])?;
        self.forward_from_aggregate(block, coeff, agg, pass)
    }

    fn forward_sourced(
        &mut self,
        block: &B::Block,
        _h_dst: B::Tensor,
        src: &dyn RowSource,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = &self.be;
        let coeff = check_sourced(be, "gcn", block, self.plan(), None, src)?;
        // forward_from_aggregate's product, the aggregate made inside it.
        let (out, agg) = be.matmul_sourced(None, src, &self.weight.value)?;
        self.finish(block, coeff, agg, false, out, pass)
    }

    fn backward(&mut self, grad_out: &B::Tensor, need: bool) -> Result<Option<B::Tensor>> {
        let c = self.cache.take().ok_or_else(|| no_cache("gcn"))?;
        let be = &self.be;
        check_grad(be, "gcn", grad_out, c.out_shape)?;
        if let (false, false, Some(kept)) = (c.project_first, need, c.kept.as_ref()) {
            // Only the weight and the bias need the gradient through the epilogue (a first
            // layer): the backend may make it as it marks its non-zeros, never writing it out.
            be.acc_at_b_shared_product(
                grad_out,
                kept,
                &mut [(&c.input, &mut self.weight.grad)],
                &mut self.bias.grad,
            )?;
            return Ok(None);
        }
        let g = epilogue_backward_bias(be, grad_out, c.kept.as_ref(), &mut self.bias)?;
        let g = g.as_ref();
        if c.project_first {
            let coeff = c.coeff.made(be, &c.block)?;
            let gz = be.spmm_backward_x(&c.block, coeff.as_ref(), g)?;
            acc_at_b(be, &c.input, &gz, &mut self.weight)?;
            Ok(if need {
                Some(be.matmul(&gz, false, &self.weight.value, true)?)
            } else {
                None
            })
        } else {
            acc_at_b(be, &c.input, g, &mut self.weight)?;
            if !need {
                return Ok(None);
            }
            let gagg = be.matmul(g, false, &self.weight.value, true)?;
            let coeff = c.coeff.made(be, &c.block)?;
            Ok(Some(be.spmm_backward_x(&c.block, coeff.as_ref(), &gagg)?))
        }
    }

    fn params(&self) -> Vec<&Param<B>> {
        vec![&self.weight, &self.bias]
    }
    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        vec![&mut self.weight, &mut self.bias]
    }
    fn clear_cache(&mut self) {
        self.cache = None;
    }
}
