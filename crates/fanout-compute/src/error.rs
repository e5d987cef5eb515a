//! The one error type of this crate.

use std::fmt;

use crate::failure::DeviceFailure;

/// Everything that can go wrong in fanout-compute with a cause a caller can act on.
///
/// Backend kernels themselves panic on mismatched shapes (that is a bug in the calling layer,
/// like an out-of-bounds index); layers, models, optimisers and checkpoint I/O check what they
/// are given and return these errors instead, and pass on the device's failures.
#[derive(Debug)]
pub enum ComputeError {
    /// A tensor had the wrong shape for an operation: `what` names the operation and operand.
    Shape {
        /// The operation and operand, e.g. `"SageLayer::forward h_src"`.
        what: String,
        /// The `(rows, cols)` that was expected (`usize::MAX` = any).
        expected: (usize, usize),
        /// The `(rows, cols)` that was given.
        got: (usize, usize),
    },
    /// A block broke one of the invariants documented on [`crate::BlockRef`].
    Block(String),
    /// A label was neither -1 nor a class index `0..classes`.
    Label {
        /// Row of the offending label.
        row: usize,
        /// The label found.
        label: i64,
        /// Number of classes (columns of the logits).
        classes: usize,
    },
    /// An operation was called in the wrong state, e.g. `backward` without a training `forward`.
    State(String),
    /// A model configuration that cannot be built (e.g. zero layers).
    Config(String),
    /// A checkpoint could not be read or does not match the model it should describe.
    Format(String),
    /// The device failed (from a [`crate::Backend`] method).
    Device(DeviceFailure),
    /// An I/O error, with the path involved.
    Io {
        /// The file being read or written.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl ComputeError {
    /// Shorthand for a [`ComputeError::Shape`].
    pub fn shape(what: impl Into<String>, expected: (usize, usize), got: (usize, usize)) -> Self {
        ComputeError::Shape {
            what: what.into(),
            expected,
            got,
        }
    }
}

fn dim(d: usize) -> String {
    if d == usize::MAX {
        "*".to_string()
    } else {
        d.to_string()
    }
}

impl fmt::Display for ComputeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ComputeError::Shape {
                what,
                expected,
                got,
            } => write!(
                f,
                "{what}: expected shape [{}, {}], got [{}, {}]",
                dim(expected.0),
                dim(expected.1),
                got.0,
                got.1
            ),
            ComputeError::Block(m) => write!(f, "invalid block: {m}"),
            ComputeError::Label {
                row,
                label,
                classes,
            } => write!(
                f,
                "label {label} at row {row} is neither -1 nor a class in 0..{classes}"
            ),
            ComputeError::State(m) => write!(f, "{m}"),
            ComputeError::Config(m) => write!(f, "invalid model configuration: {m}"),
            ComputeError::Format(m) => write!(f, "checkpoint: {m}"),
            ComputeError::Device(e) => write!(f, "{e}"),
            ComputeError::Io { path, source } => write!(f, "{path}: {source}"),
        }
    }
}

impl std::error::Error for ComputeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ComputeError::Io { source, .. } => Some(source),
            ComputeError::Device(e) => Some(e),
            _ => None,
        }
    }
}

impl From<DeviceFailure> for ComputeError {
    fn from(e: DeviceFailure) -> Self {
        ComputeError::Device(e)
    }
}

/// Result alias of this crate.
pub type Result<T, E = ComputeError> = std::result::Result<T, E>;
