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
    fn from(e: fanout_compute::ComputeError) -> Self {
        ExecError::Compute(e)
    }
}

impl From<fanout_comm::CommError> for ExecError {
    fn from(e: fanout_comm::CommError) -> Self {
        ExecError::Comm(e)
    }
}
