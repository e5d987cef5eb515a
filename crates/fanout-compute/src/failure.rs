//! A device that fails in the middle of a run: an allocation the GPU has no memory for, a copy
//! or a kernel launch the driver refuses.
//!
//! [`Backend`](crate::Backend)'s methods return values, not `Result`s (on the CPU nothing in
//! them can fail but a bug). A backend whose device fails calls [`device_failed`], which unwinds
//! with a [`DeviceFailure`]; the run layer calls the backend inside [`catch_device_failure`],
//! which turns that unwinding back into an error value, so the user gets an error message (what
//! failed, and what to try) instead of a panic and its backtrace. Any other panic passes through
//! unchanged.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

/// Why a device failed: a message for the user naming the operation, the driver's error and,
/// where there is one, what to try (e.g. a smaller batch when the device ran out of memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFailure {
    /// The message.
    pub message: String,
}

impl std::fmt::Display for DeviceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Stops the work of the backend method that called it: unwinds with a [`DeviceFailure`]
/// carrying `message`, for [`catch_device_failure`] to return as an error. Outside of one,
/// it is a panic whose payload is the [`DeviceFailure`]; once a catch has installed its hook,
/// that hook prints the message before handing the panic to the previous hook.
#[track_caller]
pub fn device_failed(message: String) -> ! {
    std::panic::panic_any(DeviceFailure { message })
}

/// Catches running now, in any thread ([`catch_device_failure`] calls not yet returned).
static CATCHING: AtomicUsize = AtomicUsize::new(0);

/// Runs `work`; a [`device_failed`] inside it (on this thread, or on a thread that hands its
/// panic back to this one, as rayon's `install` and `join` do) becomes `Err`. Every other
/// panic is resumed as it was. The first call installs a panic hook that, while a catch is
/// running, says nothing for device failures (they are reported as errors); it hands every
/// other panic to the hook that was there before.
pub fn catch_device_failure<T>(work: impl FnOnce() -> T) -> Result<T, DeviceFailure> {
    static QUIET: Once = Once::new();
    QUIET.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(f) = info.payload().downcast_ref::<DeviceFailure>() {
                if CATCHING.load(Ordering::SeqCst) > 0 {
                    return;
                }
                eprintln!("device failure: {f}");
            }
            previous(info);
        }));
    });
    /// Counts this catch as running until it returns, unwinding included.
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            CATCHING.fetch_sub(1, Ordering::SeqCst);
        }
    }
    CATCHING.fetch_add(1, Ordering::SeqCst);
    let _running = Running;
    // Unwind safety: after a device failure the run stops and its state (model, optimiser,
    // pipeline) is dropped, never used again.
    catch_unwind(AssertUnwindSafe(work)).map_err(|payload| {
        match payload.downcast::<DeviceFailure>() {
            Ok(failure) => *failure,
            Err(other) => resume_unwind(other),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages of the `(fake)` panics the hook handed on (other tests' panics left out).
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

    #[test]
    fn device_failures_become_errors_and_other_panics_pass_through() {
        // The hook a catch installs chains to this one, which records the `(fake)` panics
        // and hands the others (other tests' failures) to the test harness's hook.
        let harness = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let p = info.payload();
            let m = p
                .downcast_ref::<DeviceFailure>()
                .map(|f| f.message.clone())
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            if m.contains("(fake)") {
                SEEN.lock().unwrap().push(m);
            } else {
                harness(info);
            }
        }));
        assert_eq!(catch_device_failure(|| 7), Ok(7));
        let e = catch_device_failure(|| -> u32 { device_failed("out of memory (fake)".into()) });
        assert_eq!(e.unwrap_err().message, "out of memory (fake)");
        // From a rayon worker thread, handed back by `join`.
        let e = catch_device_failure(|| {
            rayon::join(
                || 1,
                || -> u32 { device_failed("launch failed (fake)".into()) },
            )
        });
        assert_eq!(e.unwrap_err().to_string(), "launch failed (fake)");
        // Any other panic is not a device failure: it keeps unwinding, payload unchanged.
        let other = catch_unwind(|| catch_device_failure(|| panic!("a bug (fake)")));
        let payload = other.expect_err("the panic passed through");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"a bug (fake)"));
        // Outside a catch, a device failure is a panic the hooks report.
        let outside = catch_unwind(|| -> u32 { device_failed("uncaught (fake)".into()) });
        assert!(outside.is_err());
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(
            seen,
            ["a bug (fake)", "uncaught (fake)"],
            "caught device failures are quiet, the rest reach the previous hook"
        );
    }
}
