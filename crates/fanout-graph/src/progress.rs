//! Progress reporting without a terminal dependency: library code reports phases and amounts,
//! the command line draws bars (indicatif) and tests pass [`NoProgress`].

/// Receives progress from long-running library work. Implementations must be cheap to call
/// and safe to call from several threads.
pub trait Progress: Sync {
    /// A new phase begins, with `total` units of work (`0` when unknown) and a unit name
    /// ("arcs", "bytes", "rows").
    fn phase(&self, name: &str, total: u64, unit: &'static str);
    /// `n` more units of the current phase are done.
    fn advance(&self, n: u64);
    /// The current phase is finished.
    fn finish_phase(&self) {}
}

/// Discards all progress.
pub struct NoProgress;

impl Progress for NoProgress {
    fn phase(&self, _: &str, _: u64, _: &'static str) {}
    fn advance(&self, _: u64) {}
}
