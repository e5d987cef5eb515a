//! The one error type of the store: every message names the file, the field or entry, and what
//! was expected, so a user can act on it without reading the code.

use std::fmt;
use std::path::{Path, PathBuf};

/// An error from reading, writing, building or verifying a dataset.
#[derive(Debug)]
pub enum Error {
    /// An operating-system error while touching `path`.
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    /// The content of `path` is not what the format requires; `detail` says what was found and
    /// what was expected (field, entry or line number included).
    Format { path: PathBuf, detail: String },
    /// A request that cannot be carried out as asked (bad option, existing output, ...).
    Invalid(String),
    /// The work was cancelled through a [`crate::Cancel`] token (Ctrl-C, SIGTERM) and stopped
    /// at a safe point; nothing half-written was left behind.
    Interrupted,
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error on `path` while doing `action` ("open", "read", "rename", ...).
    pub fn io(path: impl AsRef<Path>, action: &'static str, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            action,
            source,
        }
    }

    /// A format error in `path`.
    pub fn format(path: impl AsRef<Path>, detail: impl Into<String>) -> Self {
        Error::Format {
            path: path.as_ref().to_path_buf(),
            detail: detail.into(),
        }
    }

    /// The file this error is about, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Error::Io { path, .. } | Error::Format { path, .. } => Some(path),
            Error::Invalid(_) | Error::Interrupted => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io {
                path,
                action,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
            Error::Format { path, detail } => write!(f, "{}: {detail}", path.display()),
            Error::Invalid(msg) => f.write_str(msg),
            Error::Interrupted => f.write_str("interrupted"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
