//! Stage timers and the metrics of epochs and runs.

use fanout_cache::ExtractStats;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Busy time of one pipeline stage, summed over every thread working in it (so a stage run by
/// two threads may report more busy seconds than wall seconds). Cheap to update from any
/// thread.
#[derive(Debug, Default)]
pub struct StageClock {
    nanos: AtomicU64,
}

impl StageClock {
    /// Adds the time elapsed since `start`.
    pub fn add_since(&self, start: Instant) {
        self.nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Busy seconds so far.
    pub fn seconds(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Returns the busy seconds so far and restarts from zero.
    pub fn take(&self) -> f64 {
        self.nanos.swap(0, Ordering::Relaxed) as f64 * 1e-9
    }
}

/// What one epoch cost and achieved. Times are seconds; `sample_s`, `extract_s` and `train_s`
/// are busy times of the three stages during the training pass (not evaluation); the sample
/// and extract stages of the next epoch start while this epoch's last batch trains, so their
/// first batches' busy time counts here (an epoch whose batches were all prepared ahead shows
/// none of its own), while bytes (`extract`) count in the epoch they fed. `wait_s` is the
/// time the train stage waited for input (0 when the pipeline kept up). Accuracies are in
/// `0..=1`; `val_acc` / `test_acc` are `None` in epochs without evaluation.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EpochMetrics {
    /// Epoch number, from 0.
    pub epoch: u64,
    /// Wall time of the training pass.
    pub wall_s: f64,
    /// Busy time of the sample stage (all sampling threads together).
    pub sample_s: f64,
    /// Busy time of the extract stage.
    pub extract_s: f64,
    /// Busy time of the train stage (forward, backward, optimiser).
    pub train_s: f64,
    /// Time the train stage spent waiting for a prepared batch.
    pub wait_s: f64,
    /// Wall time of evaluation (0 without evaluation).
    pub eval_s: f64,
    /// Mean training loss over the labelled seeds of the epoch.
    pub loss: f64,
    /// Accuracy on the training seeds, from the training forward passes (dropout on).
    pub train_acc: f64,
    /// Validation accuracy, when evaluated this epoch.
    pub val_acc: Option<f64>,
    /// Test accuracy, when evaluated this epoch.
    pub test_acc: Option<f64>,
    /// Mini-batches trained.
    pub batches: u64,
    /// Labelled seeds trained, over all workers (each training seed once per epoch).
    pub seeds: u64,
    /// Sampled edges over the epoch's batches.
    pub edges: u64,
    /// Input nodes (feature rows extracted) over the epoch's batches.
    pub input_nodes: u64,
    /// Where the epoch's feature bytes came from (cache, reuse of the previous batch, host).
    pub extract: ExtractStats,
    /// `extract.hit_rate()`: share of feature bytes not gathered from the host store.
    pub hit_rate: f64,
    /// Seconds this worker spent in the gradient all-reduce (0 with one worker).
    pub allreduce_s: f64,
    /// Bytes this worker contributed to gradient all-reduces (0 with one worker).
    pub allreduce_bytes: u64,
    /// Nominal GEMM flops of the epoch's training steps (forward, backward, every layer's
    /// products at the batches' real sizes), this process's workers together.
    pub gemm_flops: u64,
    /// The part of `gemm_flops` not performed: weight-gradient products that skipped the
    /// zeros of their output gradient (`fanout_compute::cpu::gemm::skipped_flops`).
    #[serde(default)]
    pub gemm_flops_skipped: u64,
    /// Split parallelism: this worker's row and gradient shuffles ([`SplitEpoch`]); `None`
    /// for other strategies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitEpoch>,
    /// `gemm_flops` at this machine's measured GEMM rate: no epoch that computes every product
    /// densely can be shorter. `None` when the rates were not measured.
    #[serde(default)]
    pub compute_floor_s: Option<f64>,
    /// `gemm_flops - gemm_flops_skipped` at the same rate: the time of the arithmetic this
    /// engine actually did, below `compute_floor_s` when weight gradients skipped zeros; no
    /// epoch can be shorter. `None` when the rates were not measured.
    #[serde(default)]
    pub performed_floor_s: Option<f64>,
    /// The epoch's feature bytes gathered from the host store at the measured copy bandwidth.
    #[serde(default)]
    pub memory_floor_s: Option<f64>,
    /// Each worker's own figures, in rank order (empty with one worker). With several workers
    /// `wall_s` is the slowest worker's, the loss and accuracies are over all workers' seeds,
    /// and the stage times, counts and bytes above are this worker's ([`Self::run_extract`]
    /// sums the bytes of all of them).
    pub workers: Vec<WorkerEpochMetrics>,
}

impl EpochMetrics {
    /// Where the whole run's feature bytes came from this epoch: every worker's
    /// [`WorkerEpochMetrics::extract`] added up with several workers, else [`Self::extract`].
    pub fn run_extract(&self) -> ExtractStats {
        if self.workers.is_empty() {
            return self.extract;
        }
        let mut all = ExtractStats::default();
        for w in &self.workers {
            all.add(&w.extract);
        }
        all
    }
}

/// One worker's share of an epoch of a multi-worker run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerEpochMetrics {
    /// The worker's rank.
    pub rank: usize,
    /// Wall time of its training pass.
    pub wall_s: f64,
    /// Busy time of its sample stage.
    pub sample_s: f64,
    /// Busy time of its extract stage.
    pub extract_s: f64,
    /// Busy time of its train stage, all-reduce included.
    pub train_s: f64,
    /// Time its train stage waited for a prepared batch.
    pub wait_s: f64,
    /// Time in gradient all-reduces (waiting for the slowest worker included).
    pub allreduce_s: f64,
    /// Bytes it contributed to gradient all-reduces.
    pub allreduce_bytes: u64,
    /// Batches it trained.
    pub batches: u64,
    /// Labelled seeds it trained.
    pub seeds: u64,
    /// Sampled edges it computed.
    #[serde(default)]
    pub edges: u64,
    /// Feature rows it extracted.
    pub input_nodes: u64,
    /// Feature bytes it gathered from the host store (`extract.bytes_from_host`).
    pub bytes_from_host: u64,
    /// Share of its feature bytes served without the host store (cache and Match reuse):
    /// `extract.hit_rate()`.
    pub hit_rate: f64,
    /// Where its feature bytes came from (zeros in files written before the field existed).
    #[serde(default)]
    pub extract: ExtractStats,
    /// Split parallelism: its shuffles ([`SplitEpoch`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitEpoch>,
}

/// What split parallelism moved in an epoch, for one worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SplitEpoch {
    /// Edges it computed whose source it owns.
    pub local_edges: u64,
    /// Edges it computed whose source another worker owns (each needs a shuffled row).
    pub remote_edges: u64,
    /// Rows it received from other workers: with source rows one per remote source, reading
    /// worker and hop; with partial sums one per (destination, other owner) pair and hop.
    #[serde(default)]
    pub remote_rows: u64,
    /// Rows it would receive with GSplit's pre-aggregated partial sums (equal to
    /// `remote_rows` when partial sums are what it received).
    #[serde(default)]
    pub preaggregated_rows: u64,
    /// Bytes of rows (forward) and row gradients (backward) it sent to other workers (GCN's
    /// degree exchanges not included).
    pub shuffled_bytes: u64,
    /// Seconds in the shuffles, waiting for other workers included, and in the step's other
    /// exchanges (the loss sum, GCN's degrees).
    pub shuffle_s: f64,
}

impl SplitEpoch {
    /// Adds one step's figures.
    pub fn add(&mut self, s: &crate::split::SplitStep) {
        self.local_edges += s.local_edges;
        self.remote_edges += s.remote_edges;
        self.shuffled_bytes += s.shuffled_bytes;
        self.remote_rows += s.remote_rows;
        self.preaggregated_rows += s.preaggregated_rows;
        self.shuffle_s += s.shuffle_s;
    }
}

/// A whole run: the per-epoch metrics and the test accuracy of the best-validation epoch.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunMetrics {
    /// Test accuracy of the epoch with the best validation accuracy (ties: earliest), in
    /// `0..=1`; without validation set, of the last evaluated epoch.
    pub test_acc: f64,
    /// Validation accuracy of that epoch.
    pub best_val_acc: f64,
    /// That epoch.
    pub best_epoch: u64,
    /// Median `wall_s` over epochs 1.. (epoch 0 is warm-up); epoch 0's when it is the only one.
    pub median_epoch_s: f64,
    /// Every epoch, in order.
    pub epochs: Vec<EpochMetrics>,
    /// The machine rates the floors were computed with.
    #[serde(default)]
    pub rates: Option<fanout_compute::MachineRates>,
}

impl EpochMetrics {
    /// The larger of the two floors, when measured.
    pub fn floor_s(&self) -> Option<f64> {
        larger(self.compute_floor_s, self.memory_floor_s)
    }

    /// [`EpochMetrics::floor_s`] with `performed_floor_s` for the compute floor.
    pub fn performed_bound_s(&self) -> Option<f64> {
        larger(self.performed_floor_s, self.memory_floor_s)
    }
}

/// The larger of two floors, or the one that was measured.
fn larger(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

impl RunMetrics {
    /// Median of `wall_s` excluding epoch 0 (or epoch 0 alone if nothing else ran).
    pub fn median_epoch_time(epochs: &[EpochMetrics]) -> f64 {
        Self::median_over_epochs(epochs, |e| Some(e.wall_s)).unwrap_or(0.0)
    }

    /// Median of [`EpochMetrics::floor_s`] over the epochs `median_epoch_s` is taken over: the
    /// floor to compare it with. `None` without measured rates.
    pub fn median_floor_s(&self) -> Option<f64> {
        Self::median_over_epochs(&self.epochs, EpochMetrics::floor_s)
    }

    /// Median of [`EpochMetrics::performed_bound_s`] over the same epochs: the floor of the
    /// arithmetic actually done. `None` without measured rates.
    pub fn median_performed_bound_s(&self) -> Option<f64> {
        Self::median_over_epochs(&self.epochs, EpochMetrics::performed_bound_s)
    }

    /// Median of `f` over epochs 1.. (epoch 0 alone if nothing else ran), skipping `None`s.
    fn median_over_epochs(
        epochs: &[EpochMetrics],
        f: impl Fn(&EpochMetrics) -> Option<f64>,
    ) -> Option<f64> {
        let rest: Vec<f64> = epochs.iter().skip(1).filter_map(&f).collect();
        median(rest).or_else(|| epochs.first().and_then(&f))
    }
}

/// The median of `v` (mean of the middle two for an even count); `None` when empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_skips_warmup() {
        let e = |w| EpochMetrics {
            wall_s: w,
            ..Default::default()
        };
        assert_eq!(RunMetrics::median_epoch_time(&[e(9.0)]), 9.0);
        assert_eq!(
            RunMetrics::median_epoch_time(&[e(9.0), e(1.0), e(3.0)]),
            2.0
        );
        assert_eq!(
            RunMetrics::median_epoch_time(&[e(9.0), e(1.0), e(5.0), e(3.0)]),
            3.0
        );
    }

    #[test]
    fn clock_accumulates_and_resets() {
        let c = StageClock::default();
        c.add_since(Instant::now() - std::time::Duration::from_millis(5));
        assert!(c.seconds() >= 0.005);
        assert!(c.take() >= 0.005);
        assert_eq!(c.seconds(), 0.0);
    }
}
