//! Optimisers: Adam and SGD, both with L2 weight decay (PyTorch semantics).

use crate::backend::{AdamUpdate, Backend, SgdUpdate};
use crate::error::{ComputeError, Result};
use crate::failure::DeviceResult;
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
    /// One update of every parameter from its `grad` (gradients are not zeroed), skipped on
    /// the backend when `gate` is given and marked ([`Backend::mark_non_finite`]); the
    /// optimiser's own count of steps (Adam's bias correction) advances either way.
    fn step_gated(&mut self, params: &mut [&mut Param<B>], gate: Option<&B::Tensor>) -> Result<()>;
    /// One update of every parameter from its `grad` (gradients are not zeroed).
    fn step(&mut self, params: &mut [&mut Param<B>]) -> Result<()> {
        self.step_gated(params, None)
    }
    /// [`Optimizer::step`] over all parameters of `model`.
    fn step_model(&mut self, model: &mut Model<B>) -> Result<()> {
        let mut params = model.params_mut();
        self.step(&mut params)
    }
    /// [`Optimizer::step_gated`] over all parameters of `model`.
    fn step_model_gated(&mut self, model: &mut Model<B>, gate: &B::Tensor) -> Result<()> {
        let mut params = model.params_mut();
        self.step_gated(&mut params, Some(gate))
    }
    /// Current learning rate.
    fn lr(&self) -> f32;
    /// Changes the learning rate for later steps.
    fn set_lr(&mut self, lr: f32);
    /// Tensors of state the optimiser keeps per parameter tensor once it has stepped (each of
    /// the parameter's shape): Adam 2 (first and second moments), SGD with momentum 1, plain
    /// SGD 0. Lets memory budgets count the state before the first step allocates it.
    fn state_per_param(&self) -> usize;
    /// A copy of the state on the host (see [`OptimState`]); `Err` when the device fails.
    fn export_state(&self) -> Result<OptimState>;
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
    let tensors = state.tensors.iter().map(|t| be.upload(t));
    Ok(tensors.collect::<std::result::Result<_, _>>()?)
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
                state.push(be.zeros(r, c)?);
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
    fn step_gated(&mut self, params: &mut [&mut Param<B>], gate: Option<&B::Tensor>) -> Result<()> {
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
            let (value, m, v) = (&mut p.value, &mut m[0], &mut v[0]);
            match gate {
                Some(g) => self.be.adam_update_gated(value, &p.grad, m, v, &hp, g)?,
                None => self.be.adam_update(value, &p.grad, m, v, &hp)?,
            }
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
    fn export_state(&self) -> Result<OptimState> {
        let tensors = self.state.iter().map(|t| self.be.download(t));
        Ok(OptimState {
            step: self.step,
            tensors: tensors.collect::<std::result::Result<_, _>>()?,
        })
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
    fn step_gated(&mut self, params: &mut [&mut Param<B>], gate: Option<&B::Tensor>) -> Result<()> {
        let hp = SgdUpdate {
            lr: self.lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
        };
        if self.momentum == 0.0 {
            // No momentum buffers needed: the update ignores `buf`.
            let mut unused = self.be.zeros(0, 0)?;
            for p in params.iter_mut() {
                sgd_update(&self.be, p, &mut unused, &hp, gate)?;
            }
            return Ok(());
        }
        ensure_state(&self.be, &mut self.bufs, 1, params)?;
        for (p, buf) in params.iter_mut().zip(self.bufs.iter_mut()) {
            sgd_update(&self.be, p, buf, &hp, gate)?;
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
    fn export_state(&self) -> Result<OptimState> {
        let tensors = self.bufs.iter().map(|t| self.be.download(t));
        Ok(OptimState {
            step: 0,
            tensors: tensors.collect::<std::result::Result<_, _>>()?,
        })
    }
    fn import_state(&mut self, state: OptimState) -> Result<()> {
        self.bufs = upload_state(&self.be, self.state_per_param(), &state)?;
        Ok(())
    }
}

/// One SGD update of `p`, gated when `gate` is given.
fn sgd_update<B: Backend>(
    be: &B,
    p: &mut Param<B>,
    buf: &mut B::Tensor,
    hp: &SgdUpdate,
    gate: Option<&B::Tensor>,
) -> DeviceResult<()> {
    match gate {
        Some(g) => be.sgd_update_gated(&mut p.value, &p.grad, buf, hp, g),
        None => be.sgd_update(&mut p.value, &p.grad, buf, hp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;

    fn param(be: &CpuBackend, grad: &[f32]) -> Param<CpuBackend> {
        let mut p = Param::new(be, "w", &Tensor::new(1, 3, vec![0.5, -1.0, 2.0])).unwrap();
        p.grad = Tensor::new(1, 3, grad.to_vec());
        p
    }

    /// A gate marked by a non-finite value stops every later gated update of both
    /// optimisers and stays marked; an unmarked gate updates as the ungated step does.
    #[test]
    fn a_marked_gate_skips_updates_and_stays_marked() {
        let be = CpuBackend;
        let mut gate = be.zeros(1, 3).unwrap();
        // Adam, plain SGD and SGD with momentum, each made afresh.
        let make = |k: usize| -> Box<dyn Optimizer<CpuBackend>> {
            match k {
                0 => Box::new(Adam::new(CpuBackend, 0.1)),
                1 => Box::new(Sgd::new(CpuBackend, 0.1)),
                _ => Box::new(Sgd::new(CpuBackend, 0.1).with_momentum(0.9)),
            }
        };
        for k in 0..3 {
            let (mut gated, mut plain) = (make(k), make(k));
            let (mut a, mut b) = (param(&be, &[1.0, 2.0, 3.0]), param(&be, &[1.0, 2.0, 3.0]));
            gated.step_gated(&mut [&mut a], Some(&gate)).unwrap();
            plain.step(&mut [&mut b]).unwrap();
            assert_eq!(a.value, b.value, "an unmarked gate updates");
            assert_ne!(a.value, param(&be, &[0.0; 3]).value, "the step moved");
        }
        be.mark_non_finite(&Tensor::new(1, 2, vec![1.0, 2.0]), &mut gate, 0)
            .unwrap();
        assert_eq!(gate.data(), &[0.0, 0.0, 0.0], "finite values mark nothing");
        be.mark_non_finite(
            &Tensor::new(1, 3, vec![1.0, f32::INFINITY, f32::NAN]),
            &mut gate,
            1,
        )
        .unwrap();
        assert_eq!(gate.data()[..2], [1.0, 0.0]);
        assert_eq!(
            gate.data()[2],
            f32::INFINITY,
            "the first bad value, in its slot"
        );
        be.mark_non_finite(&Tensor::new(1, 1, vec![f32::NAN]), &mut gate, 1)
            .unwrap();
        assert_eq!(
            gate.data()[2],
            f32::INFINITY,
            "a slot keeps its first value"
        );
        be.mark_non_finite(&Tensor::new(1, 1, vec![7.0]), &mut gate, 0)
            .unwrap();
        assert_eq!(gate.data()[0], 1.0, "a marked gate stays marked");
        for k in 0..3 {
            let mut gated = make(k);
            let mut a = param(&be, &[1.0, 2.0, 3.0]);
            let before = a.value.clone();
            gated.step_gated(&mut [&mut a], Some(&gate)).unwrap();
            assert_eq!(a.value, before, "a marked gate skips the update");
        }
    }

    /// The figures left on the backend are `loss_and_accuracy`'s, bit for bit, and a read
    /// started later gives the tensor.
    #[test]
    fn figures_on_the_backend_are_the_read_ones() {
        let be = CpuBackend;
        let logits = Tensor::from_fn(5, 3, |r, c| ((r * 7 + c * 3) % 5) as f32 * 0.37 - 0.5);
        let labels = [0, 2, -1, 1, 2];
        let (ce, correct) = be.loss_and_accuracy(&logits, &labels).unwrap();
        let f = be.loss_and_accuracy_on_device(&logits, &labels).unwrap();
        let read = be.finish_read(be.read_later(&f.figures).unwrap()).unwrap();
        assert_eq!(read.data()[0].to_bits(), ce.loss.to_bits());
        assert_eq!(read.data()[1], correct as f32);
        assert_eq!((f.count, &f.grad), (ce.count, &ce.grad));
    }
}
