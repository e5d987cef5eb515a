//! Epoch iteration: the training set shuffled per epoch, split into batches, and sampled ahead
//! by worker threads into a bounded queue that delivers batches in step order, so that feature
//! extraction and training can overlap with sampling.

use crate::graph::tag;
use crate::minibatch::{BatchKey, MiniBatch};
use crate::sampler::Sampler;
use fanout_graph::{Error, Result};
use fanout_rand::Rng;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// How a [`Loader`] splits and schedules an epoch.
#[derive(Clone)]
pub struct LoaderConfig {
    /// Seeds per mini-batch.
    pub batch_size: usize,
    /// Shuffle the seeds each epoch (with a stream keyed by (seed, epoch)); otherwise keep the
    /// given order.
    pub shuffle: bool,
    /// Drop the last batch when it is smaller than `batch_size`.
    pub drop_last: bool,
    /// The run's seed: part of every [`BatchKey`].
    pub seed: u64,
    /// Batches sampled ahead of the consumer (queue bound), at least 1.
    pub prefetch: usize,
    /// Threads that sample batches concurrently (each batch is itself parallel), at least 1.
    pub workers: usize,
    /// The rayon pool batches are sampled on (`None`: the global pool).
    pub pool: Option<Arc<rayon::ThreadPool>>,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 1024,
            shuffle: true,
            drop_last: false,
            seed: 0,
            prefetch: 4,
            workers: 2,
            pool: None,
        }
    }
}

/// Splits one epoch of `seeds` into batches: shuffled by `Rng::keyed(&[seed, SHUFFLE, epoch])`
/// when `shuffle`, then cut into runs of `batch_size` (the last one shorter unless dropped).
/// Guarantee: a pure function of its arguments; every seed appears in exactly one batch (save a
/// dropped tail).
pub fn epoch_batches(seeds: &[u32], cfg: &LoaderConfig, epoch: u64) -> Vec<Vec<u32>> {
    let mut order = seeds.to_vec();
    if cfg.shuffle {
        Rng::keyed(&[cfg.seed, tag::SHUFFLE, epoch]).shuffle(&mut order);
    }
    let bs = cfg.batch_size.max(1);
    order
        .chunks(bs)
        .filter(|c| !cfg.drop_last || c.len() == bs)
        .map(<[u32]>::to_vec)
        .collect()
}

/// How a worker's batches of an epoch are cut from its seeds, for runs spread over several
/// workers. Every plan gives every worker the same number of steps per epoch (data-parallel
/// workers meet at every step's gradient all-reduce, so unequal counts would deadlock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BatchPlan {
    /// One worker: [`epoch_batches`] over the seeds (runs of `batch_size`).
    #[default]
    Whole,
    /// Every worker holds the same (global) seed list: the epoch is cut into global batches
    /// exactly as [`BatchPlan::Whole`] cuts it, and worker `rank` of `workers` takes the
    /// `rank`-th of `workers` contiguous near-equal slices of each global batch (sizes differ by
    /// at most one; a slice may be empty when a batch has fewer seeds than workers). The union
    /// of the workers' batches of a step is the one-worker batch of that step.
    Slice {
        /// This worker's rank.
        rank: usize,
        /// Number of workers.
        workers: usize,
    },
    /// The worker holds its own seeds (e.g. its partition's training vertices): shuffled as in
    /// [`epoch_batches`], then cut into exactly `steps` contiguous near-equal batches (sizes
    /// differ by at most one; empty when there are fewer seeds than steps).
    Steps(usize),
}

impl BatchPlan {
    /// The batches of `epoch` under this plan (see the variants).
    pub fn batches(&self, seeds: &[u32], cfg: &LoaderConfig, epoch: u64) -> Vec<Vec<u32>> {
        match *self {
            BatchPlan::Whole => epoch_batches(seeds, cfg, epoch),
            BatchPlan::Slice { rank, workers } => epoch_batches(seeds, cfg, epoch)
                .iter()
                .map(|b| near_equal_part(b, rank, workers.max(1)).to_vec())
                .collect(),
            BatchPlan::Steps(steps) => {
                let whole = LoaderConfig {
                    batch_size: seeds.len().max(1),
                    drop_last: false,
                    ..cfg.clone()
                };
                let order = epoch_batches(seeds, &whole, epoch)
                    .pop()
                    .unwrap_or_default();
                (0..steps)
                    .map(|i| near_equal_part(&order, i, steps).to_vec())
                    .collect()
            }
        }
    }
}

/// Part `i` of `n` contiguous parts of `v` whose lengths differ by at most one (the first
/// `len % n` parts are one longer).
pub fn near_equal_part<T>(v: &[T], i: usize, n: usize) -> &[T] {
    let (q, r) = (v.len() / n, v.len() % n);
    let start = i * q + i.min(r);
    let len = q + usize::from(i < r);
    &v[start.min(v.len())..(start + len).min(v.len())]
}

/// Produces the mini-batches of epochs. Guarantee: the batches of an epoch are yielded in step
/// order and are identical whatever the number of workers, the prefetch depth or the pool size.
pub struct Loader {
    sampler: Arc<dyn Sampler>,
    seeds: Arc<[u32]>,
    cfg: LoaderConfig,
    plan: BatchPlan,
}

impl Loader {
    /// A loader over `seeds` (usually the training set). Errors on a zero batch size.
    pub fn new(sampler: Arc<dyn Sampler>, seeds: Vec<u32>, cfg: LoaderConfig) -> Result<Self> {
        if cfg.batch_size == 0 {
            return Err(Error::Invalid("batch size must be at least 1".into()));
        }
        Ok(Loader {
            sampler,
            seeds: seeds.into(),
            cfg,
            plan: BatchPlan::Whole,
        })
    }

    /// This loader with its epochs cut by `plan` instead of [`BatchPlan::Whole`]. Errors on a
    /// plan with zero workers or steps, or a rank out of range.
    pub fn with_plan(mut self, plan: BatchPlan) -> Result<Self> {
        match plan {
            BatchPlan::Slice { rank, workers } if workers == 0 || rank >= workers => {
                return Err(Error::Invalid(format!(
                    "batch plan: rank {rank} of {workers} workers"
                )))
            }
            BatchPlan::Steps(0) => {
                return Err(Error::Invalid("batch plan: zero steps per epoch".into()))
            }
            _ => {}
        }
        self.plan = plan;
        Ok(self)
    }

    /// The batch plan.
    pub fn plan(&self) -> BatchPlan {
        self.plan
    }

    /// Batches per epoch.
    pub fn num_batches(&self) -> usize {
        if let BatchPlan::Steps(steps) = self.plan {
            return steps;
        }
        let n = self.seeds.len();
        let bs = self.cfg.batch_size;
        if self.cfg.drop_last {
            n / bs
        } else {
            n.div_ceil(bs)
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Starts sampling `epoch` in the background and returns its batches in order. At most
    /// `prefetch` finished or in-progress batches are held ahead of the consumer. Dropping the
    /// iterator early stops the workers after the batches they are sampling.
    pub fn epoch(&self, epoch: u64) -> EpochIter {
        self.epoch_from(epoch, 0)
    }

    /// As [`Loader::epoch`], starting at step `first` (for resuming an epoch): yields the same
    /// batches as `epoch(epoch).skip(first)` without sampling the skipped ones.
    pub fn epoch_from(&self, epoch: u64, first: usize) -> EpochIter {
        let batches: Arc<Vec<Vec<u32>>> =
            Arc::new(self.plan.batches(&self.seeds, &self.cfg, epoch));
        let first = first.min(batches.len());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ready: BTreeMap::new(),
                consumed: first,
            }),
            cv: Condvar::new(),
            next: AtomicUsize::new(first),
            stop: AtomicBool::new(false),
        });
        let depth = self.cfg.prefetch.max(1);
        let workers = (0..self.cfg.workers.max(1).min(batches.len().max(1)))
            .map(|_| {
                let (sh, b, s) = (shared.clone(), batches.clone(), self.sampler.clone());
                let (seed, pool) = (self.cfg.seed, self.cfg.pool.clone());
                std::thread::spawn(move || worker(&sh, &b, &*s, seed, epoch, depth, pool))
            })
            .collect();
        EpochIter {
            shared,
            first,
            total: batches.len(),
            workers,
        }
    }
}

struct State {
    ready: BTreeMap<usize, Result<MiniBatch>>,
    consumed: usize,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    next: AtomicUsize,
    stop: AtomicBool,
}

fn worker(
    sh: &Shared,
    batches: &[Vec<u32>],
    sampler: &dyn Sampler,
    seed: u64,
    epoch: u64,
    depth: usize,
    pool: Option<Arc<rayon::ThreadPool>>,
) {
    loop {
        let step = sh.next.fetch_add(1, Ordering::Relaxed);
        if step >= batches.len() {
            return;
        }
        // Wait for room: the step must be within `depth` of the consumer.
        {
            let mut st = sh.state.lock().unwrap();
            while step >= st.consumed + depth && !sh.stop.load(Ordering::Relaxed) {
                st = sh.cv.wait(st).unwrap();
            }
        }
        if sh.stop.load(Ordering::Relaxed) {
            return;
        }
        let key = BatchKey {
            seed,
            epoch,
            step: step as u64,
        };
        let run = || sampler.sample(&batches[step], key);
        // The batch is sampled on a worker of the pool (`install`, or `scope` for the global
        // pool, which moves its body there), so the sampler's parallel loops fork inside the
        // pool instead of each being handed over from this thread and waited for.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &pool {
            Some(p) => p.install(run),
            None => rayon::scope(|_| run()),
        }))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Error::Invalid(format!(
                "sampling step {step} panicked: {msg}"
            )))
        });
        sh.state.lock().unwrap().ready.insert(step, out);
        sh.cv.notify_all();
    }
}

/// The batches of one epoch, in step order (see [`Loader::epoch`]). Yields `Err` for a batch
/// that failed to sample (bad seeds, or a panic in the sampler) and ends after it.
pub struct EpochIter {
    shared: Arc<Shared>,
    first: usize,
    total: usize,
    workers: Vec<JoinHandle<()>>,
}

impl EpochIter {
    /// Batches this iterator yields in total (from its first step to the end of the epoch).
    pub fn len(&self) -> usize {
        self.total - self.first
    }
    /// True when there is nothing to yield.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Iterator for EpochIter {
    type Item = Result<MiniBatch>;
    fn next(&mut self) -> Option<Result<MiniBatch>> {
        let mut st = self.shared.state.lock().unwrap();
        if st.consumed >= self.total {
            return None;
        }
        loop {
            let c = st.consumed;
            if let Some(out) = st.ready.remove(&c) {
                st.consumed = if out.is_ok() { c + 1 } else { self.total };
                if out.is_err() {
                    self.shared.stop.store(true, Ordering::Relaxed);
                }
                drop(st);
                self.shared.cv.notify_all();
                return Some(out);
            }
            st = self.shared.cv.wait(st).unwrap();
        }
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        // Set under the lock: a worker checks `stop` and then waits while holding it, so a
        // flag set and notified in between (without the lock) would be a lost wake-up and
        // the join below would hang (seen once in CI as a test stuck in a dropped pipeline).
        {
            let _st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.stop.store(true, Ordering::Relaxed);
        }
        self.shared.cv.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::khop::{KHopConfig, KHopSampler};
    use crate::remap::RemapKind;
    use crate::testutil::*;

    fn loader(workers: usize, prefetch: usize, pool: Option<usize>) -> Loader {
        let ds = random_graph(3000, 100, 31);
        let cfg = KHopConfig {
            fanouts: vec![5, 3],
            replace: false,
            remap: RemapKind::Auto,
        };
        let s = Arc::new(KHopSampler::new(ds.clone(), cfg).unwrap());
        let lc = LoaderConfig {
            batch_size: 64,
            seed: 9,
            workers,
            prefetch,
            pool: pool.map(|t| Arc::new(crate::testutil::pool(t))),
            ..Default::default()
        };
        Loader::new(s, ds.train.to_vec(), lc).unwrap()
    }

    #[test]
    fn batches_cover_the_training_set_once_per_epoch() {
        let cfg = LoaderConfig {
            batch_size: 7,
            ..Default::default()
        };
        let seeds: Vec<u32> = (100..150).collect();
        let b = epoch_batches(&seeds, &cfg, 0);
        assert_eq!(b.len(), 8);
        assert_eq!(b[7].len(), 1);
        let mut all: Vec<u32> = b.concat();
        assert_ne!(all, seeds, "shuffled");
        all.sort_unstable();
        assert_eq!(all, seeds);
        assert_ne!(epoch_batches(&seeds, &cfg, 1), b, "a new order each epoch");
        let drop = LoaderConfig {
            drop_last: true,
            ..cfg
        };
        assert_eq!(epoch_batches(&seeds, &drop, 0).len(), 7);
    }

    #[test]
    fn in_order_and_identical_across_workers_prefetch_and_pools() {
        let want: Vec<MiniBatch> = loader(1, 1, Some(1)).epoch(2).map(|b| b.unwrap()).collect();
        assert_eq!(want.len(), 1500usize.div_ceil(64));
        for (i, mb) in want.iter().enumerate() {
            assert_eq!(mb.key.step, i as u64);
            assert_eq!(mb.key.epoch, 2);
            mb.validate().unwrap();
        }
        for (w, p, t) in [(3, 2, Some(2)), (4, 8, None), (2, 1, Some(4))] {
            let l = loader(w, p, t);
            assert_eq!(l.num_batches(), want.len());
            let got: Vec<MiniBatch> = l.epoch(2).map(|b| b.unwrap()).collect();
            assert_eq!(got, want, "workers {w} prefetch {p} pool {t:?}");
        }
        // Resuming mid-epoch gives the rest of the same batches.
        let l = loader(2, 2, None);
        let rest = l.epoch_from(2, 20);
        assert_eq!(rest.len(), want.len() - 20);
        let rest: Vec<MiniBatch> = rest.map(|b| b.unwrap()).collect();
        assert_eq!(rest, want[20..]);
        assert_eq!(l.epoch_from(2, 99).count(), 0);
    }

    /// Wraps a sampler and records how far ahead of the consumer sampling ever started.
    struct Probe {
        inner: KHopSampler,
        consumed: Arc<AtomicUsize>,
        max_ahead: AtomicUsize,
    }

    impl Sampler for Probe {
        fn sample(&self, seeds: &[u32], key: BatchKey) -> Result<MiniBatch> {
            let ahead = key.step as usize - self.consumed.load(Ordering::SeqCst);
            self.max_ahead.fetch_max(ahead, Ordering::SeqCst);
            self.inner.sample(seeds, key)
        }
        fn num_layers(&self) -> usize {
            self.inner.num_layers()
        }
        fn dataset(&self) -> &Arc<fanout_graph::Dataset> {
            self.inner.dataset()
        }
        fn name(&self) -> &'static str {
            "probe"
        }
    }

    #[test]
    fn queue_is_bounded_by_prefetch() {
        let ds = random_graph(2000, 10, 3);
        let cfg = KHopConfig {
            fanouts: vec![3],
            replace: false,
            remap: RemapKind::Auto,
        };
        let consumed = Arc::new(AtomicUsize::new(0));
        let probe = Arc::new(Probe {
            inner: KHopSampler::new(ds.clone(), cfg).unwrap(),
            consumed: consumed.clone(),
            max_ahead: AtomicUsize::new(0),
        });
        let lc = LoaderConfig {
            batch_size: 10,
            workers: 4,
            prefetch: 3,
            ..Default::default()
        };
        let l = Loader::new(probe.clone(), ds.train.to_vec(), lc).unwrap();
        for (i, mb) in l.epoch(0).enumerate() {
            assert_eq!(mb.unwrap().key.step, i as u64);
            std::thread::sleep(std::time::Duration::from_micros(200)); // a slow consumer
            consumed.store(i + 1, Ordering::SeqCst);
        }
        let ahead = probe.max_ahead.load(Ordering::SeqCst);
        assert!(
            (1..=3).contains(&ahead),
            "sampling ran {ahead} batches ahead"
        );
    }

    #[test]
    fn early_drop_stops_and_errors_end_the_epoch() {
        let l = loader(3, 2, None);
        let mut it = l.epoch(0);
        assert_eq!(it.len(), 24);
        assert!(it.next().unwrap().is_ok());
        drop(it); // Must not hang.

        let ds = random_graph(100, 10, 1);
        let s = Arc::new(
            KHopSampler::new(
                ds,
                KHopConfig {
                    fanouts: vec![2],
                    replace: false,
                    remap: RemapKind::Auto,
                },
            )
            .unwrap(),
        );
        let cfg = LoaderConfig {
            batch_size: 2,
            shuffle: false,
            ..Default::default()
        };
        let l = Loader::new(s, vec![1, 2, 3, 500, 4, 5], cfg).unwrap();
        let out: Vec<Result<MiniBatch>> = l.epoch(0).collect();
        assert_eq!(out.len(), 2);
        assert!(out[0].is_ok());
        assert!(out[1].as_ref().unwrap_err().to_string().contains("500"));
    }

    #[test]
    fn dropping_an_epoch_while_workers_wait_for_room_never_hangs() {
        // Prefetch 1 and four workers: at the drop, most workers wait for room. Repeated so a
        // lost wake-up (the stop flag set without the lock, between a worker's check and its
        // wait) shows as a hang, which the watchdog turns into a failure.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let l = loader(4, 1, None);
            for e in 0..5000 {
                let mut it = l.epoch(e);
                assert!(it.next().unwrap().is_ok());
                drop(it);
            }
            // Dropped before reporting: the test process may end as soon as this is received,
            // and a loader still alive then would leave its temporary dataset behind.
            drop(l);
            let _ = tx.send(());
        });
        let done = rx.recv_timeout(std::time::Duration::from_secs(120));
        assert!(
            done.is_ok(),
            "dropping an epoch hung (or the test thread failed)"
        );
    }

    #[test]
    fn near_equal_parts_cover_in_order() {
        for len in [0usize, 1, 5, 7, 64] {
            let v: Vec<usize> = (0..len).collect();
            for n in 1..6 {
                let parts: Vec<&[usize]> = (0..n).map(|i| near_equal_part(&v, i, n)).collect();
                assert_eq!(parts.concat(), v, "len {len} n {n}");
                let (lo, hi) = (
                    parts.iter().map(|p| p.len()).min().unwrap(),
                    parts.iter().map(|p| p.len()).max().unwrap(),
                );
                assert!(hi - lo <= 1, "len {len} n {n}: {lo}..{hi}");
            }
        }
    }

    #[test]
    fn slice_plan_splits_each_global_batch() {
        let seeds: Vec<u32> = (0..103).map(|i| i * 7).collect();
        let cfg = LoaderConfig {
            batch_size: 10,
            seed: 5,
            ..LoaderConfig::default()
        };
        let whole = BatchPlan::Whole.batches(&seeds, &cfg, 3);
        for workers in [1, 2, 3, 4] {
            let per: Vec<Vec<Vec<u32>>> = (0..workers)
                .map(|rank| BatchPlan::Slice { rank, workers }.batches(&seeds, &cfg, 3))
                .collect();
            for (step, w) in whole.iter().enumerate() {
                let union: Vec<u32> = per.iter().flat_map(|b| b[step].clone()).collect();
                assert_eq!(&union, w, "{workers} workers, step {step}");
            }
        }
    }

    #[test]
    fn steps_plan_has_equal_step_counts_and_covers_the_seeds() {
        let cfg = LoaderConfig {
            batch_size: 10,
            seed: 9,
            ..LoaderConfig::default()
        };
        for n in [0usize, 3, 17, 40] {
            let seeds: Vec<u32> = (0..n as u32).collect();
            let b = BatchPlan::Steps(5).batches(&seeds, &cfg, 1);
            assert_eq!(b.len(), 5);
            let mut all: Vec<u32> = b.concat();
            all.sort_unstable();
            assert_eq!(all, seeds);
            let shuffled = b.concat();
            assert!(n < 10 || shuffled != seeds, "not shuffled");
            assert_eq!(b, BatchPlan::Steps(5).batches(&seeds, &cfg, 1));
        }
    }

    #[test]
    fn plans_with_bad_ranks_are_refused() {
        let l = loader(1, 1, None);
        let l = l.with_plan(BatchPlan::Slice {
            rank: 2,
            workers: 2,
        });
        assert!(l.is_err());
        assert!(loader(1, 1, None).with_plan(BatchPlan::Steps(0)).is_err());
        let l = loader(1, 1, None).with_plan(BatchPlan::Steps(7)).unwrap();
        assert_eq!(l.num_batches(), 7);
        assert_eq!(l.epoch(0).count(), 7);
    }
}
