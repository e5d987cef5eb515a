//! Cooperative cancellation: the host (the command line's signal handler, a test) sets a
//! [`Cancel`] token; long-running library work checks it at safe points and stops with
//! [`Error::Interrupted`], leaving no half-written output. Library code never installs signal
//! handlers itself.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared cancellation flag. Clones share the flag; the default token is never cancelled
/// unless [`Cancel::cancel`] is called on it or a clone.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Cancel::default()
    }

    /// Asks the work checking this token to stop at its next safe point.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`Cancel::cancel`] was called (or the flag was set by a signal handler).
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `Err(Error::Interrupted)` once cancelled, else `Ok(())`.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Interrupted)
        } else {
            Ok(())
        }
    }

    /// The flag itself, for a signal handler to set (e.g. `signal_hook::flag::register`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag() {
        let c = Cancel::new();
        let d = c.clone();
        assert!(c.check().is_ok());
        d.cancel();
        assert!(c.is_cancelled());
        assert!(matches!(c.check(), Err(Error::Interrupted)));
        c.flag().store(false, Ordering::SeqCst);
        assert!(!d.is_cancelled());
    }
}
