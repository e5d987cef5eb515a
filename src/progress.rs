//! Terminal progress bars for the library's [`Progress`] reports: one bar per phase with rate
//! and ETA, drawn on stderr (hidden automatically when stderr is not a terminal).

use fanout_graph::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::RwLock;

/// Draws one indicatif bar per phase. `quiet` draws nothing.
pub struct Bars {
    current: RwLock<Option<ProgressBar>>,
    quiet: bool,
}

impl Bars {
    /// Bars on stderr, or none when `quiet`.
    pub fn new(quiet: bool) -> Self {
        Bars {
            current: RwLock::new(None),
            quiet,
        }
    }
}

impl Progress for Bars {
    fn phase(&self, name: &str, total: u64, unit: &'static str) {
        self.finish_phase();
        if self.quiet {
            return;
        }
        let bar = if total == 0 {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template(
                    "{prefix:>28} {spinner} {human_pos} {msg} ({per_sec}) {elapsed}",
                )
                .unwrap(),
            );
            b
        } else {
            let b = ProgressBar::new(total);
            let template = if unit == "bytes" {
                "{prefix:>28} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})"
            } else {
                "{prefix:>28} [{bar:30}] {human_pos}/{human_len} {msg} ({per_sec}, ETA {eta})"
            };
            b.set_style(
                ProgressStyle::with_template(template)
                    .unwrap()
                    .progress_chars("=> "),
            );
            b
        };
        bar.set_draw_target(ProgressDrawTarget::stderr_with_hz(4));
        bar.set_prefix(name.to_string());
        bar.set_message(unit);
        *self.current.write().unwrap() = Some(bar);
    }

    fn advance(&self, n: u64) {
        if let Some(b) = self.current.read().unwrap().as_ref() {
            b.inc(n);
        }
    }

    fn finish_phase(&self) {
        if let Some(b) = self.current.write().unwrap().take() {
            b.finish_and_clear();
        }
    }
}
