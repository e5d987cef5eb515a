//! Optimisers: Adam and SGD, both with L2 weight decay (PyTorch semantics).

use crate::backend::{AdamUpdate, Backend, SgdUpdate};
use crate::error::{ComputeError, Result};
use crate::layers::Param;
use crate::model::Model;
use crate::tensor::Tensor;

/// An optimiser's state on the host, for checkpoints that a run resumes from: everything
/// besides the hyper-parameters that its next step depends on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimState {
    /// Steps taken (Adam's bias correction depends on it; 0 for SGD).
    pub step: u64,
    /// The per-parameter state tensors, [`Optimizer::state_per_param`] for each parameter in
    /// [`Model::params_mut`] order (Adam: first then second moment); empty before the first
    /// step.
    pub tensors: Vec<Tensor>,
}

/// Updates parameters from their accumulated gradients. The optimiser keeps per-parameter
/// state by position, so it must always be given the same parameter list in the same order
/// (as [`Model::params_mut`] does); a different count or shape is an `Err`.
pub trait Optimizer<B: Backend> {
    /// One update of every parameter from its `grad` (gradients are not zeroed).
    fn step(&mut self, params: &mut [&mut Param<B>]) -> Result<()>;
    /// [`Optimizer::step`] over all parameters of `model`.
    fn step_model(&mut self, model: &mut Model<B>) -> Result<()> {
        let mut params = model.params_mut();
        self.step(&mut params)
    }
    /// Current learning rate.
    fn lr(&self) -> f32;
    /// Changes the learning rate for later steps.
    fn set_lr(&mut self, lr: f32);
    /// Tensors of state the optimiser keeps per parameter tensor once it has stepped (each of
    /// the parameter's shape): Adam 2 (first and second moments), SGD with momentum 1, plain
    /// SGD 0. Lets memory budgets count the state before the first step allocates it.
    fn state_per_param(&self) -> usize;
    /// A copy of the state on the host (see [`OptimState`]).
    fn export_state(&self) -> OptimState;
    /// Replaces the state by `state` (from [`Optimizer::export_state`] of an optimiser of the
    /// same kind over the same parameters). `Err` if its tensor count is neither 0 nor a
    /// multiple of [`Optimizer::state_per_param`]; shapes are checked against the parameters
    /// at the next step.
    fn import_state(&mut self, state: OptimState) -> Result<()>;
}

/// Checks a state's tensor count and uploads its tensors.
fn upload_state<B: Backend>(
    be: &B,
    per_param: usize,
    state: &OptimState,
) -> Result<Vec<B::Tensor>> {
    let n = state.tensors.len();
    if n > 0 && (per_param == 0 || !n.is_multiple_of(per_param)) {
        return Err(ComputeError::State(format!(
            "optimiser state of {n} tensors, expected a multiple of {per_param}"
        )));
    }
    Ok(state.tensors.iter().map(|t| be.upload(t)).collect())
}

/// Allocates zero state like `params` on first use, then checks that it still matches.
fn ensure_state<B: Backend>(
    be: &B,
    state: &mut Vec<B::Tensor>,
    per_param: usize,
    params: &[&mut Param<B>],
) -> Result<()> {
    if state.is_empty() {
        for p in params {
            let (r, c) = be.shape(&p.value);
            for _ in 0..per_param {
                state.push(be.zeros(r, c));
            }
        }
        return Ok(());
    }
    if state.len() != params.len() * per_param {
        return Err(ComputeError::State(format!(
            "optimiser state is for {} parameters, given {}",
            state.len() / per_param.max(1),
            params.len()
        )));
    }
    for (i, p) in params.iter().enumerate() {
        if be.shape(&state[i * per_param]) != be.shape(&p.value) {
            return Err(ComputeError::State(format!(
                "parameter {i} ({}) changed shape since the optimiser's first step",
                p.name()
            )));
        }
    }
    Ok(())
}

/// Adam (Kingma & Ba), `torch.optim.Adam` semantics: `weight_decay` is added to the gradient
/// (L2, not AdamW's decoupled decay); bias-corrected moments; `eps` added after the square root.
#[derive(Debug)]
pub struct Adam<B: Backend> {
    be: B,
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay (default 0.9).
    pub beta1: f32,
    /// Second-moment decay (default 0.999).
    pub beta2: f32,
    /// Denominator epsilon (default 1e-8).
    pub eps: f32,
    /// L2 penalty (default 0).
    pub weight_decay: f32,
    step: u64,
    state: Vec<B::Tensor>,
}

impl<B: Backend> Adam<B> {
    /// Adam with PyTorch's defaults and learning rate `lr`.
    pub fn new(be: B, lr: f32) -> Self {
        Adam {
            be,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            step: 0,
            state: Vec::new(),
        }
    }

    /// Sets the L2 penalty.
    pub fn with_weight_decay(mut self, weight_decay: f32) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// Number of steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }
}

impl<B: Backend> Optimizer<B> for Adam<B> {
    fn step(&mut self, params: &mut [&mut Param<B>]) -> Result<()> {
        ensure_state(&self.be, &mut self.state, 2, params)?;
        self.step += 1;
        let hp = AdamUpdate {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            step: self.step,
        };
        for (p, mv) in params.iter_mut().zip(self.state.chunks_mut(2)) {
            let (m, v) = mv.split_at_mut(1);
            self.be
                .adam_update(&mut p.value, &p.grad, &mut m[0], &mut v[0], &hp);
        }
        Ok(())
    }
    fn lr(&self) -> f32 {
        self.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn state_per_param(&self) -> usize {
        2
    }
    fn export_state(&self) -> OptimState {
        OptimState {
            step: self.step,
            tensors: self.state.iter().map(|t| self.be.download(t)).collect(),
        }
    }
    fn import_state(&mut self, state: OptimState) -> Result<()> {
        self.state = upload_state(&self.be, 2, &state)?;
        self.step = state.step;
        Ok(())
    }
}

/// Stochastic gradient descent with optional momentum, `torch.optim.SGD` semantics (no
/// dampening, no Nesterov; weight decay added to the gradient).
#[derive(Debug)]
pub struct Sgd<B: Backend> {
    be: B,
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor (default 0).
    pub momentum: f32,
    /// L2 penalty (default 0).
    pub weight_decay: f32,
    bufs: Vec<B::Tensor>,
}

impl<B: Backend> Sgd<B> {
    /// Plain SGD with learning rate `lr`.
    pub fn new(be: B, lr: f32) -> Self {
        Sgd {
            be,
            lr,
            momentum: 0.0,
            weight_decay: 0.0,
            bufs: Vec::new(),
        }
    }

    /// Sets the momentum factor.
    pub fn with_momentum(mut self, momentum: f32) -> Self {
        self.momentum = momentum;
        self
    }

    /// Sets the L2 penalty.
    pub fn with_weight_decay(mut self, weight_decay: f32) -> Self {
        self.weight_decay = weight_decay;
        self
    }
}

impl<B: Backend> Optimizer<B> for Sgd<B> {
    fn step(&mut self, params: &mut [&mut Param<B>]) -> Result<()> {
        let hp = SgdUpdate {
            lr: self.lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
        };
        if self.momentum == 0.0 {
            // No momentum buffers needed: the update ignores `buf`.
            let mut unused = self.be.zeros(0, 0);
            for p in params.iter_mut() {
                self.be.sgd_update(&mut p.value, &p.grad, &mut unused, &hp);
            }
            return Ok(());
        }
        ensure_state(&self.be, &mut self.bufs, 1, params)?;
        for (p, buf) in params.iter_mut().zip(self.bufs.iter_mut()) {
            self.be.sgd_update(&mut p.value, &p.grad, buf, &hp);
        }
        Ok(())
    }
    fn lr(&self) -> f32 {
        self.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn state_per_param(&self) -> usize {
        usize::from(self.momentum != 0.0)
    }
    fn export_state(&self) -> OptimState {
        OptimState {
            step: 0,
            tensors: self.bufs.iter().map(|t| self.be.download(t)).collect(),
        }
    }
    fn import_state(&mut self, state: OptimState) -> Result<()> {
        self.bufs = upload_state(&self.be, self.state_per_param(), &state)?;
        Ok(())
    }
}
