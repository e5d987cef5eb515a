//! A device that fails in the middle of a run: an allocation the GPU has no memory for, a copy
//! or a kernel launch the driver refuses.
//!
//! Every [`Backend`](crate::Backend) method that touches the device returns a
//! [`DeviceResult`], and layers, models and optimisers pass its `Err` up with `?`
//! ([`ComputeError::Device`](crate::ComputeError::Device)), so a run whose device fails ends
//! with an error message (what failed, and what to try) rather than a panic.

/// Why a device failed: a message for the user naming the operation, the driver's error and,
/// where there is one, what to try (e.g. a smaller batch when the device ran out of memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFailure {
    /// The message.
    pub message: String,
}

impl DeviceFailure {
    /// A failure with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        DeviceFailure {
            message: message.into(),
        }
    }
}

impl std::fmt::Display for DeviceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeviceFailure {}

/// What a [`Backend`](crate::Backend) method returns: its value, or why the device failed.
pub type DeviceResult<T> = std::result::Result<T, DeviceFailure>;
