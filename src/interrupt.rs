//! Ctrl-C (SIGINT) and SIGTERM for the long-running commands (`train`, `dataset import`,
//! `dataset gen`): the first signal sets a [`Cancel`] token that the library checks at safe
//! points (between training steps, between batches of arcs, before each file); a second one
//! ends the process at once. The library never installs handlers itself.

use fanout_graph::Cancel;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::flag;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The token the handlers set, and which signal came.
pub struct Interrupts {
    /// Cancelled by the first SIGINT or SIGTERM.
    pub cancel: Cancel,
    term: Arc<AtomicBool>,
}

impl Interrupts {
    /// Installs the handlers. If they cannot be installed, the command runs without them
    /// (a signal then ends it the default way).
    pub fn install() -> Self {
        let cancel = Cancel::new();
        let term = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees the flag as the previous signal left it: a second
            // signal ends the process at once.
            let _ = flag::register_conditional_shutdown(sig, 128 + sig, cancel.flag());
            let _ = flag::register(sig, cancel.flag());
        }
        let _ = flag::register(SIGTERM, term.clone());
        Interrupts { cancel, term }
    }

    /// The conventional exit status once a signal came: 128 + its number (130 for SIGINT,
    /// 143 for SIGTERM); `None` when none came.
    pub fn exit_code(&self) -> Option<i32> {
        if !self.cancel.is_cancelled() {
            return None;
        }
        Some(if self.term.load(Ordering::SeqCst) {
            128 + SIGTERM
        } else {
            128 + SIGINT
        })
    }
}
