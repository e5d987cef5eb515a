//! The batch source of a split-parallel worker: every step's global batch, sampled together
//! with the other workers, and the features of the vertices this worker owns.

use super::sample::{sample_with, SampleWorkspace, Shuffle};
use crate::error::{ExecError, Result};
use crate::metrics::StageClock;
use crate::pipeline::{BatchSource, EpochStream, Prepared};
use fanout_cache::Extractor;
use fanout_comm::Comm;
use fanout_sample::{epoch_batches, BatchKey, LoaderConfig, MiniBatch, RangeOwners, Sampler};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One worker's [`BatchSource`] in a split-parallel run. Guarantees: every epoch has the steps
/// of the one-worker pipeline with the same seed and batch size (the same seeds per step, the
/// same keys), on every worker; each step's [`Prepared::split`] is this worker's share of the
/// step's batch ([`super::sample`]) and its features are the rows of that share's own
/// vertices, read through this worker's extractor (its cache). Sampling talks to the other
/// workers on a communicator of its own (split from the run's): where the communicator allows
/// collectives on two threads at once ([`Comm::concurrent_collectives`]) a thread prepares up
/// to `PREFETCH` + 1 steps ahead while the current one trains; under MPI's `SERIALIZED`
/// threading, batches are made when the training loop asks for them, on its thread, with no
/// overlap.
pub struct SplitSource {
    inner: Arc<Inner>,
}

/// Prepared steps queued for training; the preparing thread works on one more meanwhile, so
/// it runs up to `PREFETCH + 1` steps ahead.
pub const PREFETCH: usize = 2;

struct Inner {
    sampler: Arc<dyn Sampler>,
    owners: RangeOwners,
    extractor: Mutex<Box<dyn Extractor>>,
    workspace: Mutex<SampleWorkspace>,
    shuffle: Shuffle,
    comm: Box<dyn Comm>,
    seeds: Vec<u32>,
    loader: LoaderConfig,
    sample: StageClock,
    extract: StageClock,
}

impl SplitSource {
    /// The source of worker `comm.rank()`: `seeds` are the whole training set, cut into steps
    /// of `batch_size` shuffled by `seed` as the one-worker pipeline cuts them. Sampling talks
    /// over a sub-communicator split from `comm` here, so every worker of `comm` must call
    /// this together. `shuffle` says what crosses workers ([`Shuffle::Rows`] for GAT).
    /// Errors: `owners` without one part per worker, communication failures.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sampler: Arc<dyn Sampler>,
        owners: RangeOwners,
        extractor: Box<dyn Extractor>,
        comm: &dyn Comm,
        seeds: Vec<u32>,
        batch_size: usize,
        seed: u64,
        shuffle: Shuffle,
    ) -> Result<Self> {
        if owners.parts() != comm.size() {
            return Err(ExecError::Invalid(format!(
                "the dataset's partition has {} parts but the run has {} workers; partition \
                 with --parts {} or run {} workers",
                owners.parts(),
                comm.size(),
                comm.size(),
                owners.parts()
            )));
        }
        let comm = comm.split(0)?;
        Ok(SplitSource {
            inner: Arc::new(Inner {
                sampler,
                owners,
                extractor: Mutex::new(extractor),
                workspace: Mutex::new(SampleWorkspace::default()),
                shuffle,
                comm,
                seeds,
                loader: LoaderConfig {
                    batch_size: batch_size.max(1),
                    shuffle: true,
                    seed,
                    ..LoaderConfig::default()
                },
                sample: StageClock::default(),
                extract: StageClock::default(),
            }),
        })
    }
}

impl Inner {
    /// One step's share. Called on a thread of no rayon pool (the preparing thread, or the
    /// training loop's between steps): its collectives must never occupy a pool thread that
    /// the training step of this worker needs while a peer waits for that step, which with
    /// one-thread worker pools deadlocks. Its parallel loops run on rayon's global pool.
    fn prepare(&self, epoch: u64, step: usize, seeds: &[u32]) -> Result<Prepared> {
        let key = BatchKey {
            seed: self.loader.seed,
            epoch,
            step: step as u64,
        };
        let t = Instant::now();
        let share = {
            // A panic mid-batch could leave slots set: start from a clean table then.
            let mut ws = self.workspace.lock().unwrap_or_else(|poisoned| {
                let mut ws = poisoned.into_inner();
                *ws = SampleWorkspace::default();
                ws
            });
            sample_with(
                &mut ws,
                self.sampler.as_ref(),
                &self.owners,
                seeds,
                key,
                self.shuffle,
                self.comm.as_ref(),
            )?
        };
        self.sample.add_since(t);
        let t = Instant::now();
        let mut features = Vec::new();
        let (extract, dim) = {
            let mut ex = self.extractor.lock().map_err(|_| {
                ExecError::Invalid("the extractor failed in an earlier step".into())
            })?;
            (ex.extract(&share.owned, &mut features)?, ex.dim())
        };
        self.extract.add_since(t);
        let batch = MiniBatch {
            resident: Default::default(),
            key,
            num_seeds: share.reach[0],
            blocks: Vec::new(),
            input_nodes: share.owned.clone(),
            labels: Some(share.labels.clone()),
        };
        Ok(Prepared {
            batch,
            features,
            dim,
            extract,
            remote: None,
            split: Some(Box::new(share)),
            input_agg: None,
            input_store: None,
            cache_split: None,
        })
    }
}

impl BatchSource for SplitSource {
    fn num_batches(&self) -> usize {
        self.inner
            .seeds
            .len()
            .div_ceil(self.inner.loader.batch_size)
    }

    fn epoch(&self, epoch: u64) -> EpochStream {
        let inner = self.inner.clone();
        let steps = epoch_batches(&inner.seeds, &inner.loader, epoch);
        let total = steps.len();
        if !inner.comm.concurrent_collectives() {
            let make = steps
                .into_iter()
                .enumerate()
                .map(move |(step, seeds)| inner.prepare(epoch, step, &seeds));
            return EpochStream::on_demand(Box::new(make), total);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(PREFETCH);
        let spawned = std::thread::Builder::new()
            .name("split-prepare".into())
            .spawn(move || {
                for (step, seeds) in steps.into_iter().enumerate() {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        inner.prepare(epoch, step, &seeds)
                    }))
                    .unwrap_or_else(|panic| {
                        Err(ExecError::Invalid(format!(
                            "preparing split step {step} panicked: {}",
                            panic_message(panic.as_ref())
                        )))
                    });
                    if let Err(e) = &r {
                        // The other workers' preparing threads may be waiting for this one
                        // in a sampling collective: wake them with the error (under MPI this
                        // ends the job with the message).
                        inner.comm.fail(&e.to_string());
                    }
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                }
            });
        match spawned {
            // The thread is not joined when the stream is dropped: it may be inside a
            // collective with the other workers' preparing threads, which end only once their
            // own training threads give up; it ends by itself when its next send fails or a
            // peer's communicator is gone.
            Ok(_) => EpochStream::from_channel(rx, None, total),
            Err(e) => {
                let e = ExecError::Invalid(format!("cannot start a preparing thread: {e}"));
                EpochStream::on_demand(Box::new(std::iter::once(Err(e))), total)
            }
        }
    }

    fn take_times(&self) -> (f64, f64) {
        (self.inner.sample.take(), self.inner.extract.take())
    }
}

/// The text of a panic's payload (`panic!` with a message gives a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}
