//! GIN: sum aggregation plus an MLP, learnable epsilon.

use fanout_rand::Rng;

use super::{
    acc_at_b, acc_bias, check_aggregated, check_grad, check_input, epilogue_backward_bias, glorot,
    no_cache, Activation, AggregateOrder, InputPlan, Layer, Param, Pass,
};
use crate::backend::{Aggregation, Backend};
use crate::error::Result;
use crate::tensor::Tensor;

/// GIN layer (DGL `GINConv(apply_func=MLP, aggregator_type="sum", learn_eps=True)`):
/// `a[d] = (1 + eps) h_src[d] + sum_{e: s -> d} h_src[s]`, then the two-layer MLP
/// `h_dst = act(relu(a W1 + b1) W2 + b2)`. The MLP has no batch normalisation (the GIN paper's
/// MLPs do; with mini-batches of blocks we leave it out). Parameters: `eps` (`1 x 1`, starts at
/// 0), `w1` (`in x hidden`), `b1`, `w2` (`hidden x out`), `b2`.
#[derive(Debug)]
pub struct GinLayer<B: Backend> {
    be: B,
    in_dim: usize,
    hidden: usize,
    out_dim: usize,
    act: Activation,
    eps: Param<B>,
    w1: Param<B>,
    b1: Param<B>,
    w2: Param<B>,
    b2: Param<B>,
    cache: Option<Cache<B>>,
}

#[derive(Debug)]
struct Cache<B: Backend> {
    block: B::Block,
    h_dst: B::Tensor,
    agg: B::Tensor,
    hid: B::Tensor,
    /// Shape of the output (checked against the incoming gradient).
    out_shape: (usize, usize),
    /// What the epilogue's backward needs ([`Activation::finish`]).
    kept: Option<B::Tensor>,
}

impl<B: Backend> GinLayer<B> {
    /// A layer `in_dim -> out_dim` whose MLP is `hidden` wide, weights drawn from `rng`;
    /// `Err` when the device fails.
    pub fn new(
        be: B,
        in_dim: usize,
        hidden: usize,
        out_dim: usize,
        act: Activation,
        rng: &mut Rng,
    ) -> Result<Self> {
        let eps = Param::new(&be, "eps", &Tensor::zeros(1, 1))?;
        let w1 = Param::new(&be, "w1", &glorot(in_dim, hidden, rng))?;
        let b1 = Param::new(&be, "b1", &Tensor::zeros(1, hidden))?;
        let w2 = Param::new(&be, "w2", &glorot(hidden, out_dim, rng))?;
        let b2 = Param::new(&be, "b2", &Tensor::zeros(1, out_dim))?;
        Ok(GinLayer {
            be,
            in_dim,
            hidden,
            out_dim,
            act,
            eps,
            w1,
            b1,
            w2,
            b2,
            cache: None,
        })
    }

    /// Width of the MLP's hidden layer.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Its input plan: always a plain sum first (then it reads only that sum and the
    /// destinations' own rows).
    fn plan(&self) -> InputPlan {
        InputPlan {
            aggregation: Aggregation::Sum,
            order: AggregateOrder::AggregateFirst,
            in_dim: self.in_dim,
            out_dim: self.hidden,
            made_in_product: false,
            reads_dst: true,
        }
    }

    /// The forward from the neighbours' sum `agg` and the destinations' own rows `h_dst`
    /// (`num_dst x in_dim` each): adds `(1 + eps) h_dst` to `agg`, then the MLP.
    fn forward_from_sum(
        &mut self,
        block: &B::Block,
        h_dst: B::Tensor,
        mut agg: B::Tensor,
        pass: Pass<'_>,
    ) -> Result<B::Tensor> {
        let be = &self.be;
        // eps is read where it lives (no read back to the host on a device).
        let rows = be.shape(&h_dst).0;
        be.axpy_prefix_one_plus(&self.eps.value, &h_dst, &mut agg, rows)?;
        let mut hid = be.matmul(&agg, false, &self.w1.value, false)?;
        // ReLU's backward reads its output (`hid`), so nothing else is kept.
        be.epilogue(&mut hid, Some(&self.b1.value), true, None, false)?;
        let out = be.matmul(&hid, false, &self.w2.value, false)?;
        let (out, kept) = self.act.finish(be, out, Some(&self.b2.value), pass)?;
        self.cache = pass.is_train().then(|| Cache {
            block: block.clone(),
            h_dst,
            agg,
            hid,
            out_shape: be.shape(&out),
            kept,
        });
        Ok(out)
    }
}

impl<B: Backend> Layer<B> for GinLayer<B> {
    fn backend(&self) -> &B {
        &self.be
    }
    fn kind(&self) -> &'static str {
        "gin"
    }
    fn in_dim(&self) -> usize {
        self.in_dim
    }
    fn out_dim(&self) -> usize {
        self.out_dim
    }

    fn forward(&mut self, block: &B::Block, h_src: B::Tensor, pass: Pass<'_>) -> Result<B::Tensor> {
        let be = &self.be;
        let dims = check_input(be, "gin", block, &h_src, self.in_dim)?;
        let agg = be.spmm(block, None, &h_src)?;
        let h_dst = be.prefix_rows(&h_src, dims.num_dst)?;
        self.forward_from_sum(block, h_dst, agg, pass)
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
        let plan = self.plan();
        check_aggregated(
            &self.be,
            "gin",
            block,
            plan,
            &[("h_dst", &h_dst), ("aggregate", &agg)],
        )?;
        self.forward_from_sum(block, h_dst, agg, pass)
    }

    fn backward(&mut self, grad_out: &B::Tensor, need: bool) -> Result<Option<B::Tensor>> {
        let c = self.cache.take().ok_or_else(|| no_cache("gin"))?;
        let be = &self.be;
        check_grad(be, "gin", grad_out, c.out_shape)?;
        let g = epilogue_backward_bias(be, grad_out, c.kept.as_ref(), &mut self.b2)?;
        let g = g.as_ref();
        acc_at_b(be, &c.hid, g, &mut self.w2)?;
        let ghid = be.matmul(g, false, &self.w2.value, true)?;
        let ghid = be.relu_backward(&ghid, &c.hid)?;
        acc_bias(be, &ghid, &mut self.b1)?;
        acc_at_b(be, &c.agg, &ghid, &mut self.w1)?;
        let gagg = be.matmul(&ghid, false, &self.w1.value, true)?;
        be.add_dot(&gagg, &c.h_dst, &mut self.eps.grad)?;
        if !need {
            return Ok(None);
        }
        let mut dx = be.spmm_backward_x(&c.block, None, &gagg)?;
        let rows = be.shape(&gagg).0;
        // eps has not changed since the forward: the optimiser steps after the backward.
        be.axpy_prefix_one_plus(&self.eps.value, &gagg, &mut dx, rows)?;
        Ok(Some(dx))
    }

    fn params(&self) -> Vec<&Param<B>> {
        vec![&self.eps, &self.w1, &self.b1, &self.w2, &self.b2]
    }
    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        vec![
            &mut self.eps,
            &mut self.w1,
            &mut self.b1,
            &mut self.w2,
            &mut self.b2,
        ]
    }
    fn clear_cache(&mut self) {
        self.cache = None;
    }
}
