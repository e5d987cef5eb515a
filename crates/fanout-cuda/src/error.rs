//! Why a device could not be opened.

use crate::REBUILD_HINT;
use std::fmt;

/// Why [`open`](crate::open) (or an operation on a CUDA device) failed. Every message says what
/// is missing and, where there is one, what to do about it; messages are meant to follow the
/// device they concern (`--device cuda:1: ...`), and name it themselves only where it matters
/// (the index of [`Error::NoSuchDevice`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA device was asked for, but this build has no CUDA support (no `cuda` feature).
    NotBuilt {
        /// The device index asked for.
        index: u32,
    },
    /// The CUDA driver library (`libcuda.so`) could not be loaded.
    NoDriver {
        /// The library names that were tried, in order.
        searched: Vec<String>,
    },
    /// The driver works but has no device with this index.
    NoSuchDevice {
        /// The device index asked for.
        index: u32,
        /// The number of devices the driver reports.
        count: usize,
    },
    /// A CUDA driver call failed (or the driver library failed inside it).
    Driver {
        /// The driver function or operation that failed.
        call: &'static str,
        /// The driver's error (e.g. `CUDA_ERROR_NO_DEVICE`) or what went wrong.
        detail: String,
    },
    /// An environment variable that tunes the backend holds a value it does not know.
    Setting {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotBuilt { .. } => write!(
                f,
                "this fanout was built without CUDA support; rebuild it with `{REBUILD_HINT}` \
                 (building needs no CUDA toolkit; running needs the NVIDIA driver)"
            ),
            Error::NoDriver { searched } => {
                write!(f, "no CUDA driver found (libcuda.so): ")?;
                match searched.as_slice() {
                    [] => write!(f, "the driver library could not be loaded")?,
                    [one] => write!(f, "{one} could not be loaded")?,
                    [first, .., last] => write!(
                        f,
                        "none of {} library names ({first} ... {last}) could be loaded",
                        searched.len()
                    )?,
                }
                write!(
                    f,
                    "; install the NVIDIA driver, or add the directory holding libcuda.so to \
                     LD_LIBRARY_PATH"
                )
            }
            Error::Setting {
                variable,
                value,
                expected,
            } => write!(f, "{variable} is {value:?}; expected {expected}"),
            Error::NoSuchDevice { index, count } => match count {
                0 => write!(
                    f,
                    "there is no cuda:{index}: the CUDA driver reports no devices (check \
                     nvidia-smi and CUDA_VISIBLE_DEVICES)"
                ),
                1 => write!(
                    f,
                    "there is no cuda:{index}: the CUDA driver reports 1 device (cuda:0)"
                ),
                n => write!(
                    f,
                    "there is no cuda:{index}: the CUDA driver reports {n} devices (cuda:0 to \
                     cuda:{})",
                    n - 1
                ),
            },
            Error::Driver { call, detail } => write!(f, "CUDA driver: {call} failed: {detail}"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_is_missing() {
        let m = Error::NotBuilt { index: 1 }.to_string();
        assert!(
            m.starts_with("this fanout was built without CUDA support"),
            "{m}"
        );
        assert!(m.contains("cargo build --release --features cuda"), "{m}");

        let searched = vec!["libcuda.so".to_string(), "libcuda.so.1".to_string()];
        let m = Error::NoDriver { searched }.to_string();
        assert!(m.starts_with("no CUDA driver found (libcuda.so): "), "{m}");
        assert!(
            m.contains("libcuda.so.1") && m.contains("LD_LIBRARY_PATH"),
            "{m}"
        );
        let m = Error::NoDriver { searched: vec![] }.to_string();
        assert!(m.starts_with("no CUDA driver found (libcuda.so): "), "{m}");

        let m = Error::NoSuchDevice { index: 4, count: 2 }.to_string();
        assert!(
            m.contains("cuda:4") && m.contains("2 devices") && m.contains("cuda:1"),
            "{m}"
        );
        let m = Error::NoSuchDevice { index: 1, count: 1 }.to_string();
        assert!(
            m.contains("cuda:1") && m.contains("1 device (cuda:0)"),
            "{m}"
        );
        let m = Error::NoSuchDevice { index: 0, count: 0 }.to_string();
        assert!(m.contains("cuda:0") && m.contains("no devices"), "{m}");

        let m = Error::Driver {
            call: "cuInit",
            detail: "CUDA_ERROR_NO_DEVICE".into(),
        }
        .to_string();
        assert!(
            m.contains("cuInit") && m.contains("CUDA_ERROR_NO_DEVICE"),
            "{m}"
        );
    }
}
