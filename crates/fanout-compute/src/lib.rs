//! Compute layer of fanout: tensors, a device-agnostic [`Backend`] with a multi-threaded CPU
//! implementation, GNN layers with explicit forward and backward, models built from them,
//! optimisers, and safetensors checkpoints.
//!
//! Data flow of one training step (DGL block semantics, see `shared/seeds/NOTES.md`):
//! the sampler produces blocks outermost first ([`BlockRef`], destination-major CSR whose
//! destinations are a prefix of its sources); the backend prepares them
//! ([`Backend::prepare_block`]); [`Model::forward`] runs layer `i` on block `i` and returns
//! logits for the seeds; [`Backend::softmax_cross_entropy`] gives the loss and its gradient;
//! [`Model::backward`] accumulates parameter gradients; an [`Optimizer`] updates them.
//!
//! Layers and models never see the device: a CUDA backend only has to implement [`Backend`].
//!
//! One training step, as `tests/train.rs` runs it:
//!
//! ```text
//! let be = CpuBackend;
//! let mut model = Model::new(be, ModelConfig::new(ModelKind::Sage, in_dim, 256, classes, 2))?;
//! let mut opt = Adam::new(be, 0.003);
//! // per mini-batch:
//! let blocks = model.prepare_blocks(&block_refs)?;          // outermost first
//! let logits = model.forward(&blocks, features, Mode::Train { dropout_key: step })?;
//! let ce = be.softmax_cross_entropy(&logits, &seed_labels)?; // -1 labels ignored
//! model.zero_grad()?;
//! model.backward(&ce.grad)?;
//! opt.step_model(&mut model)?;
//! ```
//!
//! Checkpoints: [`io::save`] / [`io::load`] (safetensors, configuration in the metadata).

pub mod backend;
pub mod block;
pub mod cpu;
pub mod error;
pub mod failure;
pub mod io;
pub mod layers;
pub mod model;
pub mod optim;
pub mod source;
pub mod tensor;

pub use backend::{
    check_labels, dropout_threshold, AdamUpdate, Aggregation, Backend, CrossEntropy, DropoutSpec,
    MappedRows, PendingRead, SgdUpdate, StepFigures,
};
pub use block::{BlockDims, BlockRef, SourceMajor};
pub use cpu::huge_pages::{kept_bytes, HugePageAlloc};
pub use cpu::rates::{MachineRates, GEMM_KERNELS_REVISION};
pub use cpu::{CpuBackend, CpuBlock};
pub use error::{ComputeError, Result};
pub use failure::{DeviceFailure, DeviceResult};
pub use layers::{
    Activation, AggregateOrder, GatLayer, GcnLayer, GinLayer, HeadMerge, InputPlan, Layer,
    MaybeOwned, Param, Pass, PinSageLayer, SageLayer,
};
pub use model::{Mode, Model, ModelConfig, ModelKind, PaperSetting};
pub use optim::{Adam, OptimState, Optimizer, Sgd};
pub use source::RowSource;
pub use tensor::Tensor;
