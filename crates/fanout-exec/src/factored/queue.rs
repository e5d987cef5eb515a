//! The trainer's end of the queue: slices arrive from the samplers, features are extracted
//! here, and [`crate::fit`] trains them through the [`BatchSource`] interface.

use super::{tag, Layout};
use crate::error::{ExecError, Result};
use crate::metrics::StageClock;
use crate::pipeline::{BatchSource, EpochStream, Prepared, RemoteGradient, RemoteWork};
use fanout_cache::{ExtractStats, Extractor};
use fanout_comm::Comm;
use fanout_sample::{wire, BatchKey, MiniBatch};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// First byte of a task message: a sampled slice follows.
pub(crate) const KIND_BATCH: u8 = 0;
/// First byte of a task message: a claim follows (the claiming rank, u64).
pub(crate) const KIND_CLAIM: u8 = 1;

/// A factored trainer's batches: the slices the samplers send it, features extracted through
/// its cache by a producer thread ([`Producer::run`]) that runs for the whole run.
/// Guarantee: every epoch yields, in step order, exactly this trainer's slices of every step
/// ([`Layout::slices_of`]); a slice a standby claimed arrives as a [`Prepared`] with
/// [`Prepared::remote`] set.
pub struct QueueSource<'c> {
    comm: &'c dyn Comm,
    steps: usize,
    per_step: usize,
    epochs: Mutex<Receiver<Receiver<Result<Prepared>>>>,
    extract_clock: Arc<StageClock>,
}

/// What the producer thread needs; made with its [`QueueSource`] by [`QueueSource::new`].
pub struct Producer<'c> {
    comm: &'c dyn Comm,
    layout: Layout,
    steps: usize,
    epochs: u64,
    prefetch: usize,
    seed: u64,
    extractor: Box<dyn Extractor>,
    pool: Option<Arc<rayon::ThreadPool>>,
    out: Sender<Receiver<Result<Prepared>>>,
    extract_clock: Arc<StageClock>,
}

impl<'c> QueueSource<'c> {
    /// The source of trainer `comm.rank()` under `layout`, for `epochs` epochs of `steps`
    /// steps, and the producer that feeds it (run [`Producer::run`] on a thread of its own).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        comm: &'c dyn Comm,
        layout: Layout,
        steps: usize,
        epochs: u64,
        prefetch: usize,
        seed: u64,
        extractor: Box<dyn Extractor>,
        pool: Option<Arc<rayon::ThreadPool>>,
    ) -> (QueueSource<'c>, Producer<'c>) {
        let (tx, rx) = channel();
        let clock = Arc::new(StageClock::default());
        let per_step = layout.slices_of(comm.rank()).len();
        (
            QueueSource {
                comm,
                steps,
                per_step,
                epochs: Mutex::new(rx),
                extract_clock: clock.clone(),
            },
            Producer {
                comm,
                layout,
                steps,
                epochs,
                prefetch: prefetch.max(1),
                seed,
                extractor,
                pool,
                out: tx,
                extract_clock: clock,
            },
        )
    }
}

impl Producer<'_> {
    /// Receives, acknowledges and extracts every slice of every epoch, in order, until the
    /// last epoch or until the trainer drops an epoch's stream. A communicator or decoding
    /// error is passed to the trainer as the epoch's next item and ends the producer.
    pub fn run(mut self) {
        let rank = self.comm.rank();
        let slices = self.layout.slices_of(rank);
        for epoch in 0..self.epochs {
            let (tx, rx) = sync_channel(self.prefetch);
            if self.out.send(rx).is_err() {
                return;
            }
            let order: Vec<(usize, usize)> = (0..self.steps)
                .flat_map(|k| slices.iter().map(move |&i| (k, i)))
                .collect();
            let ok = if self.layout.workers == 1 {
                // GNNLab's one-device mode: the whole epoch is sampled into the queue first.
                let mut held = Vec::with_capacity(order.len());
                for &(k, i) in &order {
                    match self.take(k, i) {
                        Ok(m) => held.push(m),
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
                held.into_iter()
                    .zip(&order)
                    .all(|(m, &(k, _))| self.forward(&tx, epoch, k, m))
            } else {
                order.iter().all(|&(k, i)| match self.take(k, i) {
                    Ok(m) => self.forward(&tx, epoch, k, m),
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        false
                    }
                })
            };
            if !ok {
                return;
            }
        }
    }

    /// The next message of slice `i` of step `k`, acknowledged to its sampler.
    fn take(&self, k: usize, i: usize) -> Result<Vec<u8>> {
        let from = self.layout.sampler_of(k, i);
        let m = self.comm.recv(from, tag::TASK)?;
        self.comm.send(from, tag::CREDIT, &[])?;
        Ok(m)
    }

    /// Decodes and extracts one message and hands it to the trainer; false when the run
    /// should stop (the trainer is gone, or the message was bad: the error was sent).
    fn forward(
        &mut self,
        tx: &SyncSender<Result<Prepared>>,
        epoch: u64,
        step: usize,
        m: Vec<u8>,
    ) -> bool {
        let item = self.prepare(epoch, step, &m);
        let failed = item.is_err();
        tx.send(item).is_ok() && !failed
    }

    fn prepare(&mut self, epoch: u64, step: usize, m: &[u8]) -> Result<Prepared> {
        let dim = self.extractor.dim();
        let bad = |why: String| ExecError::Invalid(format!("factored queue: {why}"));
        match m.split_first() {
            Some((&KIND_BATCH, rest)) => {
                let batch = wire::decode(rest).map_err(bad)?;
                if batch.key.epoch != epoch || batch.key.step != step as u64 {
                    return Err(bad(format!(
                        "expected a slice of epoch {epoch} step {step}, got epoch {} step {}",
                        batch.key.epoch, batch.key.step
                    )));
                }
                let t = Instant::now();
                let mut features = Vec::new();
                let ex: &mut dyn Extractor = &mut *self.extractor;
                let mut gather = || ex.extract(&batch.input_nodes, &mut features);
                let extract = match &self.pool {
                    Some(p) => p.install(gather),
                    None => gather(),
                }?;
                self.extract_clock.add_since(t);
                Ok(Prepared {
                    batch,
                    features,
                    dim,
                    extract,
                    remote: None,
                    split: None,
                    input_agg: None,
                    input_store: None,
                    cache_split: None,
                })
            }
            Some((&KIND_CLAIM, rest)) if rest.len() == 8 => {
                let rank = u64::from_le_bytes(rest.try_into().unwrap_or([0; 8])) as usize;
                if rank >= self.comm.size() {
                    return Err(bad(format!(
                        "a claim by rank {rank} of {}",
                        self.comm.size()
                    )));
                }
                Ok(Prepared {
                    batch: MiniBatch {
                        resident: Default::default(),
                        key: BatchKey {
                            seed: self.seed,
                            epoch,
                            step: step as u64,
                        },
                        ..MiniBatch::default()
                    },
                    features: Vec::new(),
                    dim,
                    extract: ExtractStats::default(),
                    remote: Some(rank),
                    split: None,
                    input_agg: None,
                    input_store: None,
                    cache_split: None,
                })
            }
            _ => Err(bad(format!(
                "an unreadable task message of {} bytes",
                m.len()
            ))),
        }
    }
}

impl BatchSource for QueueSource<'_> {
    fn num_batches(&self) -> usize {
        self.steps * self.per_step
    }

    fn epoch(&self, _epoch: u64) -> EpochStream {
        let total = self.num_batches();
        let rx = self
            .epochs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv()
            .unwrap_or_else(|_| {
                let (tx, rx) = sync_channel(1);
                let _ = tx.send(Err(ExecError::Invalid(
                    "factored queue: the producer stopped".into(),
                )));
                rx
            });
        EpochStream::from_channel(rx, None, total)
    }

    fn take_times(&self) -> (f64, f64) {
        (0.0, self.extract_clock.take())
    }

    fn items_per_step(&self) -> usize {
        self.per_step
    }

    fn remote_start(&self, p: &Prepared, params: &[f32]) -> Result<()> {
        let rank = p.remote.unwrap_or(usize::MAX);
        let mut m = Vec::with_capacity(16 + 4 * params.len());
        m.extend_from_slice(&p.batch.key.epoch.to_le_bytes());
        m.extend_from_slice(&p.batch.key.step.to_le_bytes());
        for v in params {
            m.extend_from_slice(&v.to_le_bytes());
        }
        Ok(self.comm.send(rank, tag::PARAMS, &m)?)
    }

    fn remote_finish(&self, p: &Prepared) -> Result<RemoteGradient> {
        let rank = p.remote.unwrap_or(usize::MAX);
        let m = self.comm.recv(rank, tag::GRAD)?;
        decode_gradient(&m).ok_or_else(|| {
            ExecError::Invalid(format!(
                "factored queue: rank {rank} sent an unreadable gradient ({} bytes)",
                m.len()
            ))
        })
    }
}

/// A standby's result as bytes: loss sum (f64); correct and labelled; the work's edges, input
/// vertices, the five extraction counts, nominal and skipped flops (u64 each); then the
/// gradient (f32s).
pub(crate) fn encode_gradient(g: &RemoteGradient) -> Vec<u8> {
    let w = &g.work;
    let x = &w.extract;
    let counts = [
        g.correct as u64,
        g.labelled as u64,
        w.edges,
        w.input_nodes,
        x.rows,
        x.bytes_total,
        x.bytes_from_cache,
        x.bytes_reused,
        x.bytes_from_host,
        w.gemm_flops,
        w.gemm_flops_skipped,
    ];
    let mut m = Vec::with_capacity(GRADIENT_HEADER + 4 * g.gradient.len());
    m.extend_from_slice(&g.loss_sum.to_le_bytes());
    for c in counts {
        m.extend_from_slice(&c.to_le_bytes());
    }
    for v in &g.gradient {
        m.extend_from_slice(&v.to_le_bytes());
    }
    m
}

/// Bytes of a gradient message before its gradient: the loss sum and eleven counts.
const GRADIENT_HEADER: usize = 8 * 12;

fn decode_gradient(m: &[u8]) -> Option<RemoteGradient> {
    if m.len() < GRADIENT_HEADER || !(m.len() - GRADIENT_HEADER).is_multiple_of(4) {
        return None;
    }
    let u = |i: usize| u64::from_le_bytes(m[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
    Some(RemoteGradient {
        loss_sum: f64::from_bits(u(0)),
        correct: u(1) as usize,
        labelled: u(2) as usize,
        work: RemoteWork {
            edges: u(3),
            input_nodes: u(4),
            extract: ExtractStats {
                rows: u(5),
                bytes_total: u(6),
                bytes_from_cache: u(7),
                bytes_reused: u(8),
                bytes_from_host: u(9),
            },
            gemm_flops: u(10),
            gemm_flops_skipped: u(11),
        },
        gradient: m[GRADIENT_HEADER..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
            .collect(),
    })
}

/// Parameters sent for a claimed slice: (epoch, step, values), or `None` if malformed.
pub(crate) fn decode_params(m: &[u8]) -> Option<(u64, u64, Vec<f32>)> {
    if m.len() < 16 || !(m.len() - 16).is_multiple_of(4) {
        return None;
    }
    let u = |i: usize| u64::from_le_bytes(m[i..i + 8].try_into().unwrap_or([0; 8]));
    let values = m[16..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
        .collect();
    Some((u(0), u(8), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradient_messages_round_trip() {
        let g = RemoteGradient {
            loss_sum: 3.25,
            correct: 7,
            labelled: 9,
            gradient: vec![1.0, -2.5, 0.125],
            work: RemoteWork {
                edges: 11,
                input_nodes: 12,
                extract: ExtractStats {
                    rows: 13,
                    bytes_total: 14,
                    bytes_from_cache: 15,
                    bytes_reused: 16,
                    bytes_from_host: 17,
                },
                gemm_flops: 18,
                gemm_flops_skipped: 19,
            },
        };
        let m = encode_gradient(&g);
        assert_eq!(m.len(), GRADIENT_HEADER + 12);
        assert_eq!(decode_gradient(&m), Some(g));
        assert_eq!(decode_gradient(&m[..GRADIENT_HEADER - 1]), None);
        assert_eq!(decode_gradient(&m[..GRADIENT_HEADER + 2]), None);
        assert_eq!(decode_params(&[0; 15]), None);
        let mut m = 5u64.to_le_bytes().to_vec();
        m.extend_from_slice(&6u64.to_le_bytes());
        m.extend_from_slice(&1.5f32.to_le_bytes());
        assert_eq!(decode_params(&m), Some((5, 6, vec![1.5])));
    }
}
