//! fanout's execution layer: how a training run is scheduled.
//!
//! An epoch is a pipeline of three stages, each on its own threads, joined by bounded queues
//! ([`Pipeline`]):
//!
//! ```text
//! sample (Loader workers) --queue--> extract (1 thread, an Extractor) --queue--> train (caller)
//! ```
//!
//! so an epoch costs close to its slowest stage rather than the sum. With a reorder window the
//! extract stage passes each window of sampled batches on in FastGL's Greedy Reorder order
//! ([`PipelineConfig::reorder_window`]). Every stage has a busy timer ([`StageClock`]);
//! [`EpochMetrics`] reports them with the wall time, the loss and the accuracies, and
//! [`RunMetrics`] a whole run (the JSON of `fanout train --metrics-out`).
//!
//! [`measure_trial_batch`] runs PaGraph's trial batch (one step that changes nothing) and
//! measures its peak through a [`MemoryProbe`], the device-agnostic memory interface a backend
//! implements, for sizing the feature cache.
//!
//! [`Trainer`] owns a model and its optimiser on one [`Backend`](fanout_compute::Backend) and
//! turns prepared batches into steps; [`fit`] drives epochs with evaluation on the validation
//! and test sets every `k` epochs and keeps the best-validation model.
//!
//! A run is described by one serde value, [`TrainConfig`], and executed by [`train`] (all
//! workers in this process) or [`train_worker`] (one worker of a group whose [`Comm`] the
//! caller made, e.g. one MPI process); both return a [`TrainOutcome`], and both have a
//! variant over any [`Backend`](fanout_compute::Backend) ([`train_with_backend`],
//! [`train_worker_with`]) for devices other than the CPU. The command line and
//! the Python package are thin shells over these. Workers talk only through
//! [`fanout_comm::Comm`]; a strategy ([`strategy`]) decides which seeds each worker trains,
//! and every strategy runs the same loop, [`fit`], which all-reduces gradients between
//! [`Trainer::compute_gradients`] and [`Trainer::apply_gradients`] when there are several
//! workers. Where a trainer's batches come from is a [`BatchSource`]: a local [`Pipeline`],
//! or the queue sampler workers fill in GNNLab's factored design ([`factored::QueueSource`];
//! MorphGL's routes, [`hybrid`], split a trainer's batches between its own threads and that
//! queue).
//! [`evaluate_checkpoint`] repeats a saved model's evaluation.

pub mod buffers;
pub mod config;
pub mod device;
pub mod error;
pub mod eval;
pub mod factored;
pub mod floor;
pub mod gpus;
pub mod hybrid;
pub mod memory;
pub mod metrics;
pub mod outputs;
pub mod pipeline;
mod placement;
pub mod run;
pub mod split;
pub mod store_input;
pub mod strategy;
pub mod trainer;

pub use buffers::BufferPool;
pub use config::{
    CacheSpec, FactoredSpec, FeaturePlacement, SampleScope, SamplingPlacement, StrategyKind,
    TrainConfig,
};
pub use device::{device_for_node_rank, gpu_count, Compute, DeviceInfo, DeviceSpec};
pub use error::{ExecError, Result};
pub use eval::{evaluate_checkpoint, evaluate_checkpoint_with, EvalRequest, EvalSplit};
pub use fanout_comm::{Comm, LocalComm};
pub use gpus::{
    gradient_sum_choice, gradient_sum_plan, gradient_sum_vote, join_group_of, sharing_rank,
    GradientSum, GroupDevice, GRADIENT_SUM_VARIABLE,
};
pub use memory::{measure_trial_batch, minibatch_bytes, MemoryProbe, TrialMemory};
pub use metrics::{EpochMetrics, RunMetrics, SplitEpoch, StageClock, WorkerEpochMetrics};
pub use outputs::check_outputs;
pub use pipeline::{
    BatchSource, EpochStream, Pipeline, PipelineConfig, Prepared, RemoteGradient, RemoteWork,
    TimedSampler,
};
pub use run::{
    check_backend, checkpoint_meta, open_dataset, stopped_run_report, train, train_with_backend,
    train_worker, train_worker_with, RunEnv, TrainOutcome, EMBEDDED_NODES, EMBEDDED_SEED,
};
pub use strategy::WorkerPlan;

/// The communicator of a single-worker run: a group of one, whose collectives return at once.
pub fn solo() -> LocalComm {
    LocalComm::group(1).pop().expect("a group of one member")
}
pub use trainer::{
    block_refs, fit, fit_with, BatchOutcome, BestState, FitConfig, FitControl, FitObserver,
    FitState, ReducedStep, Trainer, EVAL_EPOCH,
};

/// Tunes the C allocator for training's allocation pattern: large buffers of similar sizes
/// freed and re-requested every step. With glibc's defaults every buffer above 128 KiB is a
/// fresh `mmap` (page faults and zeroing on each step) and freed memory is returned at once;
/// this raises the mmap threshold to 1 GiB and disables trimming so freed buffers are reused.
/// Process-wide; call once at start-up. No effect (and harmless) on other C libraries.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only changes allocator tuning parameters; glibc documents it as safe
        // to call at any time.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 1 << 30);
            mallopt(M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}
