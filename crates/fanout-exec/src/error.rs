//! The error type of the execution layer.

use std::fmt;

/// Why a run stopped. Every variant carries a message meant for the user.
#[derive(Debug)]
pub enum ExecError {
    /// Reading or sampling the dataset failed (damaged files, bad seeds, ...).
    Graph(fanout_graph::Error),
    /// A compute error (shapes, labels out of range, checkpoint format, ...).
    Compute(fanout_compute::ComputeError),
    /// A request that cannot be carried out (missing labels, empty training set, ...).
    Invalid(String),
    /// Talking to the other workers failed, or one of them failed (its rank and message).
    Comm(fanout_comm::CommError),
    /// The compute device failed during the run (ran out of memory, refused a launch): what
    /// failed and what to try ([`fanout_compute::DeviceFailure`]).
    Device {
        /// What failed.
        failure: fanout_compute::DeviceFailure,
        /// Where the last checkpoint is, as a clause for the user (`None`: not known here, or
        /// no checkpoint was asked for).
        checkpoint: Option<String>,
    },
    /// Training was cancelled (Ctrl-C, SIGTERM) and stopped before step `step` of epoch
    /// `epoch` (both counted from 0, as the epoch lines are).
    Interrupted {
        /// The epoch it stopped in.
        epoch: u64,
        /// Steps of that epoch already taken.
        step: u64,
        /// Where the last checkpoint is, as a clause for the user (`None`: nothing was saved).
        checkpoint: Option<String>,
    },
    /// A step's loss or gradient was NaN or infinite; the optimiser did not apply it.
    NonFinite {
        /// The epoch (from 0).
        epoch: u64,
        /// The step within the epoch (from 0).
        step: u64,
        /// What was not finite ("the loss (NaN)", "the gradient of layers.0.w_self (inf)").
        what: String,
        /// The learning rate in use.
        lr: f32,
        /// Where the last good checkpoint is, as a clause for the user (`None`: nothing was
        /// saved).
        checkpoint: Option<String>,
    },
}

impl ExecError {
    /// [`ExecError::Device`] for `failure`, no checkpoint named yet.
    pub fn device(failure: fanout_compute::DeviceFailure) -> Self {
        ExecError::Device {
            failure,
            checkpoint: None,
        }
    }

    /// Whether the run stopped because it was cancelled (training, or generating the
    /// embedded dataset).
    pub fn is_interrupted(&self) -> bool {
        matches!(
            self,
            ExecError::Interrupted { .. } | ExecError::Graph(fanout_graph::Error::Interrupted)
        )
    }

    /// This error with `note` (a clause saying where the last checkpoint is) attached, when it is an
    /// interruption, a non-finite step or a device failure; other errors are returned as they
    /// are.
    pub fn with_checkpoint(self, note: Option<String>) -> Self {
        match self {
            ExecError::Interrupted { epoch, step, .. } => ExecError::Interrupted {
                epoch,
                step,
                checkpoint: note,
            },
            ExecError::NonFinite {
                epoch,
                step,
                what,
                lr,
                ..
            } => ExecError::NonFinite {
                epoch,
                step,
                what,
                lr,
                checkpoint: note,
            },
            ExecError::Device { failure, .. } => ExecError::Device {
                failure,
                checkpoint: note,
            },
            e => e,
        }
    }
}

/// The end of an interruption's or a non-finite step's message: where the checkpoint is.
fn checkpoint_note(c: &Option<String>) -> String {
    match c {
        Some(c) => c.clone(),
        None => "no checkpoint was saved (--save-model PATH writes one after every epoch)".into(),
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = ExecError> = std::result::Result<T, E>;

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::Graph(e) => write!(f, "{e}"),
            ExecError::Compute(e) => write!(f, "{e}"),
            ExecError::Invalid(m) => f.write_str(m),
            ExecError::Comm(e) => write!(f, "{e}"),
            ExecError::Device {
                failure,
                checkpoint,
            } => {
                write!(f, "the device failed: {failure}")?;
                match checkpoint {
                    Some(c) => write!(f, "; {c}"),
                    None => Ok(()),
                }
            }
            ExecError::Interrupted {
                epoch,
                step,
                checkpoint,
            } => write!(
                f,
                "interrupted at epoch {epoch}, step {step}; {}",
                checkpoint_note(checkpoint)
            ),
            ExecError::NonFinite {
                epoch,
                step,
                what,
                lr,
                checkpoint,
            } => write!(
                f,
                "training stopped at epoch {epoch}, step {step}: {what} is not finite; likely \
                 causes: NaN or Inf values in the features (`fanout dataset verify` reports \
                 them) or a learning rate too high (lr {lr:?}); {}",
                checkpoint_note(checkpoint)
            ),
        }
    }
}

impl std::error::Error for ExecError {}

impl From<fanout_graph::Error> for ExecError {
    fn from(e: fanout_graph::Error) -> Self {
        ExecError::Graph(e)
    }
}

impl From<fanout_compute::ComputeError> for ExecError {
    /// A device's failure passed up through the compute layer becomes [`ExecError::Device`].
    fn from(e: fanout_compute::ComputeError) -> Self {
        match e {
            fanout_compute::ComputeError::Device(f) => ExecError::device(f),
            e => ExecError::Compute(e),
        }
    }
}

impl From<fanout_compute::DeviceFailure> for ExecError {
    fn from(f: fanout_compute::DeviceFailure) -> Self {
        ExecError::device(f)
    }
}

impl From<fanout_comm::CommError> for ExecError {
    fn from(e: fanout_comm::CommError) -> Self {
        ExecError::Comm(e)
    }
}
