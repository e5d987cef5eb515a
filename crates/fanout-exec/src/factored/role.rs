//! One worker of a factored run: the trial and allocation, then the trainer's or the sampler's
//! part (see the module doc of [`crate::factored`]).

use super::queue::{decode_params, encode_gradient, QueueSource, KIND_BATCH, KIND_CLAIM};
use super::{samplers_for, switch_profit, tag, Layout, SamplerEpoch};
use crate::config::{StrategyKind, TrainConfig};
use crate::error::{ExecError, Result};
use crate::hybrid::{tune, RouteCosts, RouteSplit};
use crate::metrics::RunMetrics;
use crate::pipeline::{PipelineConfig, Prepared, RemoteGradient, RemoteWork};
use crate::run::{build_cache, eval_pipelines, sit_out_trials, RunEnv, TrainOutcome, TrialTurns};
use crate::strategy::WorkerPlan;
use crate::trainer::{fit_with, FitConfig, FitControl, FitObserver, Trainer};
use fanout_cache::{Extractor, PlainExtractor};
use fanout_comm::Comm;
use fanout_compute::cpu::gemm;
use fanout_compute::CpuBackend;
use fanout_graph::Dataset;
use fanout_sample::{
    epoch_batches, near_equal_part, wire, BatchKey, BatchPlan, LoaderConfig, MiniBatch, Sampler,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// What [`crate::train_worker`] has built when it hands a factored run over.
pub(crate) struct FactoredRun<'a> {
    pub ds: Arc<Dataset>,
    /// Resolved.
    pub cfg: TrainConfig,
    pub comm: &'a dyn Comm,
    pub pool: Option<Arc<rayon::ThreadPool>>,
    pub env: &'a RunEnv<'a>,
    pub sampler: Arc<dyn Sampler>,
    pub trainer: Trainer<CpuBackend>,
    pub threads: usize,
    pub dataset: String,
    /// The run's description line, without the strategy.
    pub summary: String,
}

/// Runs this worker's part of a factored run and returns its outcome (the trained model on
/// every rank; epoch metrics on the trainers).
pub(crate) fn run(r: FactoredRun, obs: &mut dyn FitObserver) -> Result<TrainOutcome> {
    let FactoredRun {
        ds,
        cfg,
        comm,
        pool,
        env,
        sampler,
        mut trainer,
        threads,
        dataset,
        summary,
    } = r;
    let (rank, n) = (comm.rank(), comm.size());
    let batch = cfg.batch_size.unwrap_or(1).max(1);
    let seeds = ds.train.to_vec();
    let lcfg = LoaderConfig {
        batch_size: batch,
        shuffle: true,
        drop_last: false,
        seed: cfg.seed,
        ..LoaderConfig::default()
    };
    let steps = seeds.len().div_ceil(batch);
    let f = cfg.factored.clone();

    // Trial and allocation: rank 0 measures, everyone gets its figures.
    let hybrid = cfg.strategy_kind() == StrategyKind::Hybrid;
    let (t_sample, t_extract, t_model) = if n > 1 {
        let mut buf = Vec::new();
        if rank == 0 {
            let t = trial(
                &ds,
                &sampler,
                &mut trainer,
                &seeds,
                &lcfg,
                n,
                f.trial_batches,
                &pool,
            )?;
            for v in [t.0, t.1, t.2] {
                buf.extend_from_slice(&v.to_le_bytes());
            }
        }
        comm.broadcast(0, &mut buf)?;
        if buf.len() != 24 {
            return Err(ExecError::Invalid(
                "factored: rank 0 sent no trial figures".into(),
            ));
        }
        let g = |i: usize| f64::from_le_bytes(buf[i..i + 8].try_into().unwrap_or([0; 8]));
        (g(0), g(8), g(16))
    } else {
        (0.0, 0.0, 0.0)
    };
    let t_train = t_extract + t_model;
    let chosen = f
        .samplers
        .unwrap_or_else(|| samplers_for(n, t_train, t_sample));
    let mut layout = Layout::new(n, chosen);
    let routes = (hybrid && n > 1).then(|| {
        let split = route_split(&layout, steps, t_sample, t_extract, t_model);
        layout = layout.with_routes(split.n_cpu, split.n_gpu);
        split
    });
    let k = if t_sample > 0.0 {
        t_train / t_sample
    } else {
        0.0
    };
    let routes_line = routes.map_or(String::new(), |r| {
        format!(
            "; MorphGL routes: each trainer prepares {} of every {} slices itself (Eq. 6 \
             x = {:.2}, simulated epoch {:.2} s)",
            r.n_cpu,
            r.n_cpu + r.n_gpu,
            r.x_initial,
            r.simulated.epoch_s
        )
    });
    obs.note(&format!(
        "{summary}; {} over {n} worker{}: {}{routes_line}",
        if hybrid { "hybrid" } else { "factored" },
        if n == 1 { "" } else { "s" },
        if n == 1 {
            "each epoch is sampled whole into the queue, then trained (GNNLab's one-device mode)"
                .to_string()
        } else {
            format!(
                "{} sampler{} and {} trainer{} ({}; trial: sample {:.2} ms, train {:.2} ms per \
                 slice, K = {k:.2}){}",
                layout.samplers,
                if layout.samplers == 1 { "" } else { "s" },
                layout.trainers,
                if layout.trainers == 1 { "" } else { "s" },
                if f.samplers.is_some() {
                    "set by hand"
                } else {
                    "GNNLab's cost model"
                },
                t_sample * 1e3,
                t_train * 1e3,
                if f.switching {
                    ", dynamic switching on"
                } else {
                    ""
                }
            )
        }
    ));
    let sub = comm.split(usize::from(!layout.is_trainer(rank)))?;
    let epochs = cfg.epochs;
    let sampling = SamplingJob {
        comm,
        layout,
        sampler: sampler.clone(),
        seeds: &seeds,
        lcfg: &lcfg,
        steps,
        epochs,
        depth: f.queue_depth.max(1),
        pool: pool.clone(),
    };

    let (metrics, cache, mine) = if layout.is_trainer(rank) {
        let lanes = layout.lanes();
        let plan = WorkerPlan {
            train_seeds: seeds.clone(),
            train_plan: BatchPlan::Whole,
            eval_plan: if layout.trainers == 1 {
                BatchPlan::Whole
            } else {
                BatchPlan::Slice {
                    rank,
                    workers: layout.trainers,
                }
            },
            batch_size: batch.div_ceil(lanes).max(1),
            part: None,
            split: None,
        };
        let pcfg = PipelineConfig {
            batch_size: plan.batch_size,
            shuffle: true,
            seed: cfg.seed,
            prefetch: cfg.prefetch.max(1),
            sample_workers: 1,
            reorder_window: 0,
            plan: BatchPlan::Whole,
            pool: pool.clone(),
            input_plan: None,
            aggregate_in_trainer: false,
        };
        // `--cache-ratio auto`: the workers of one process take turns at the trial step (the
        // samplers pass theirs, below) and the trainers share the budget.
        let turns = TrialTurns {
            comm,
            sharing: layout.trainers as u64,
        };
        let (extractor, cache_json, line) = build_cache(
            &ds,
            &cfg,
            &sampler,
            &plan,
            &pcfg,
            &mut trainer,
            env,
            Some(turns),
        )?;
        if let Some(line) = line {
            obs.note(&line);
        }
        let (valid, test) = eval_pipelines(&ds, &sampler, &pcfg, batch, plan.eval_plan)?;
        let (source, producer) = QueueSource::new(
            comm,
            layout,
            steps,
            epochs,
            cfg.prefetch.max(1),
            cfg.seed,
            extractor,
            pool.clone(),
        );
        let fit_cfg = FitConfig {
            epochs,
            eval_every: cfg.eval_every,
        };
        let (res, sampled) = std::thread::scope(|s| {
            let prod = s.spawn(move || producer.run());
            // One worker, or a hybrid trainer's own route, samples on a thread of its own
            // into the queue.
            let own = (n == 1 || layout.routes.is_some_and(|(local, _)| local > 0))
                .then(|| s.spawn(|| sampling.run(None)));
            let ctl = FitControl {
                cancel: env.cancel,
                // Factored trainers compute on the CPU: their epochs report the floors a
                // single or data-parallel run would (the samplers do no products).
                rates: crate::floor::run_rates(cfg.threads),
                ..FitControl::default()
            };
            let res = fit_with(
                &mut trainer,
                &source,
                valid.as_ref().map(|p| p as &dyn crate::BatchSource),
                test.as_ref().map(|p| p as &dyn crate::BatchSource),
                fit_cfg,
                &*sub,
                obs,
                ctl,
            )
            .map_err(|e| {
                // Factored runs write their model only at the end (no per-epoch state).
                let note = env.checkpoint.map(|p| {
                    format!(
                        "nothing was saved to {} (the {} strategy writes its model only at the \
                         end of the run; a file already there is left as it was)",
                        p.display(),
                        cfg.strategy_kind().name()
                    )
                });
                e.with_checkpoint(note)
            });
            if let Err(e) = &res {
                // Unblocks the producer and the sampling thread (and the other workers).
                comm.fail(&e.to_string());
            }
            let _ = prod.join();
            let sampled = own.map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ExecError::Invalid("the sampling thread panicked".into()))
                })
            });
            (res, sampled)
        });
        let metrics = res?;
        let mine = match sampled {
            Some(r) => r?,
            None => Vec::new(),
        };
        (metrics, cache_json, mine)
    } else {
        // A standby's gradients are added to a trainer's step: computed as the trainers'
        // own, with subnormals flushed (`fit_with`).
        let _flush = f
            .switching
            .then(|| fanout_compute::cpu::denormals::FlushDenormals::on(pool.clone()));
        let standby = match f.switching {
            true => Some(Standby {
                trainer: &mut trainer,
                extractor: PlainExtractor::new(ds.clone())?,
                t_train,
            }),
            false => None,
        };
        // No cache here: wait while the trainers measure their trial steps, so that none of
        // this sampler's allocations lands in their peaks.
        let r = sit_out_trials(&cfg, comm).and_then(|()| sampling.run(standby));
        if let Err(e) = &r {
            comm.fail(&e.to_string());
        }
        (
            RunMetrics::default(),
            serde_json::json!({ "policy": "none", "rows": 0 }),
            r?,
        )
    };
    drop(sub);

    // Every sampler's figures to everyone; the trained model from rank 0 to everyone.
    let bytes = serde_json::to_vec(&mine).map_err(|e| ExecError::Invalid(e.to_string()))?;
    let mut samplers: Vec<SamplerEpoch> = Vec::new();
    for b in comm.all_gather(&bytes)? {
        let v: Vec<SamplerEpoch> = serde_json::from_slice(&b)
            .map_err(|e| ExecError::Invalid(format!("a worker sent unreadable figures: {e}")))?;
        samplers.extend(v);
    }
    let mut params = Vec::new();
    if rank == 0 {
        params = trainer
            .parameters()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
    }
    comm.broadcast(0, &mut params)?;
    let values: Vec<f32> = params
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
        .collect();
    trainer.set_parameters(&values)?;
    let claimed: u64 = samplers.iter().map(|s| s.claimed).sum();
    // Sampling ran on the samplers: their busy time is the epoch's sample time.
    let mut metrics = metrics;
    for m in &mut metrics.epochs {
        m.sample_s = samplers
            .iter()
            .filter(|s| s.epoch == m.epoch)
            .map(|s| s.sample_s)
            .sum();
    }
    let report = serde_json::json!({
        "layout": layout,
        "allocation": if f.samplers.is_some() { "by hand" } else { "cost model" },
        "trial": { "batches": f.trial_batches, "t_sample_s": t_sample, "t_train_s": t_train,
                   "t_extract_s": t_extract, "t_model_s": t_model,
                   "k": k, "cost_model_samplers": samplers_for(n, t_train, t_sample) },
        "switching": f.switching,
        "queue_depth": f.queue_depth,
        "claimed_by_standby": claimed,
        "samplers": samplers,
        "hybrid": routes.map(|r| serde_json::json!({
            "costs": RouteCosts {
                t_cbt: t_sample + t_extract,
                t_uva: t_extract,
                t_dma: 0.0,
                t_model,
            },
            "split": r,
            "slices_per_trainer_per_epoch": { "own_route": r.n_cpu, "remote_route": r.n_gpu },
        })),
    });
    Ok(TrainOutcome {
        config: cfg,
        metrics,
        model: trainer.into_model(),
        backend: "cpu",
        rank,
        workers: n,
        comm: comm.kind(),
        comm_stats: comm.stats(),
        gradient_sum: (n > 1).then_some("host"),
        cache,
        dataset,
        features_resident: ds.features.as_ref().is_some_and(|f| f.is_resident()),
        threads,
        strategy_report: Some(report),
        state: None,
        num_nodes: ds.num_nodes(),
    })
}

/// GNNLab's trial on rank 0: `count` slices of epoch 0, each sampled, extracted and put
/// through a training step that changes nothing; the mean seconds per slice of the three
/// (`T_s`, extraction, training; GNNLab's `T_t` is the last two), the first slice (warm-up)
/// left out.
#[allow(clippy::too_many_arguments)]
fn trial(
    ds: &Arc<Dataset>,
    sampler: &Arc<dyn Sampler>,
    trainer: &mut Trainer<CpuBackend>,
    seeds: &[u32],
    lcfg: &LoaderConfig,
    lanes: usize,
    count: usize,
    pool: &Option<Arc<rayon::ThreadPool>>,
) -> Result<(f64, f64, f64)> {
    let batches = epoch_batches(seeds, lcfg, 0);
    let mut ex = PlainExtractor::new(ds.clone())?;
    let (mut ts, mut te, mut tm) = (0.0, 0.0, 0.0);
    for j in 0..=count {
        let (k, i) = ((j / lanes) % batches.len(), j % lanes);
        let slice = near_equal_part(&batches[k], i, lanes);
        let key = BatchKey {
            seed: lcfg.seed,
            epoch: 0,
            step: k as u64,
        };
        let t = Instant::now();
        let mb = on_pool(pool, || sampler.sample(slice, key))?;
        let s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut features = Vec::new();
        let extract = on_pool(pool, || ex.extract(&mb.input_nodes, &mut features))?;
        let e = t.elapsed().as_secs_f64();
        let p = Prepared {
            batch: mb,
            features,
            dim: ex.dim(),
            extract,
            remote: None,
            split: None,
            input_agg: None,
            input_store: None,
            cache_split: None,
        };
        let t = Instant::now();
        on_pool(pool, || trainer.trial_step(p, 0))?;
        if j > 0 {
            ts += s;
            te += e;
            tm += t.elapsed().as_secs_f64();
        }
    }
    let c = count as f64;
    Ok((ts / c, te / c, tm / c))
}

/// MorphGL's split of each trainer's slices of an epoch between its own route (it samples and
/// extracts: `T_CBT = T_s + T_e`) and the remote route (the samplers sample, the trainer only
/// extracts: `T_UVA = T_e`), training `T_Model`, no device copy (`T_DMA = 0`), tuned by the
/// Dual-Buffer simulator ([`crate::hybrid::tune`]). The remote route is capped at what the
/// samplers can sample in the predicted epoch.
fn route_split(layout: &Layout, steps: usize, ts: f64, te: f64, tm: f64) -> RouteSplit {
    let per_trainer = steps * layout.slices_of(0).len();
    let costs = RouteCosts {
        t_cbt: ts + te,
        t_uva: te,
        t_dma: 0.0,
        t_model: tm,
    };
    let mut split = tune(&costs, per_trainer);
    if ts > 0.0 && split.n_gpu > 0 {
        let supply = split.simulated.epoch_s * layout.samplers as f64 / ts / layout.trainers as f64;
        let cap = (supply.floor() as usize).min(per_trainer);
        if split.n_gpu > cap {
            split.n_gpu = cap;
            split.n_cpu = per_trainer - cap;
        }
    }
    split
}

fn on_pool<R: Send>(pool: &Option<Arc<rayon::ThreadPool>>, f: impl FnOnce() -> R + Send) -> R {
    match pool {
        Some(p) => p.install(f),
        None => f(),
    }
}

/// A sampler's standby trainer (dynamic switching).
struct Standby<'t, E> {
    trainer: &'t mut Trainer<CpuBackend>,
    extractor: E,
    t_train: f64,
}

enum Item {
    Batch(MiniBatch),
    Claimed(usize),
}

struct Entry {
    trainer: usize,
    epoch: u64,
    step: usize,
    item: Item,
}

/// The sampler's backlog: sampled slices not yet sent (its part of GNNLab's global queue).
#[derive(Default)]
struct Backlog {
    q: VecDeque<Entry>,
    closed: bool,
    failed: bool,
}

struct Shared {
    backlog: Mutex<Backlog>,
    cond: Condvar,
    /// Slices sent and not yet acknowledged.
    in_flight: AtomicUsize,
}

/// The sampling side of a factored run (a sampler rank, or one worker's sampling thread).
struct SamplingJob<'a> {
    comm: &'a dyn Comm,
    layout: Layout,
    sampler: Arc<dyn Sampler>,
    seeds: &'a [u32],
    lcfg: &'a LoaderConfig,
    steps: usize,
    epochs: u64,
    depth: usize,
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl SamplingJob<'_> {
    /// Samples this rank's slices of every epoch into the backlog while a sender thread moves
    /// them to their trainers; with a standby, trains claimed slices after each epoch's share.
    fn run(&self, mut standby: Option<Standby<'_, PlainExtractor>>) -> Result<Vec<SamplerEpoch>> {
        let me = self.comm.rank();
        let lanes = self.layout.lanes();
        let mine: Vec<(usize, usize)> = (0..self.steps)
            .flat_map(|k| (0..lanes).map(move |i| (k, i)))
            .filter(|&(k, i)| self.layout.sampler_of(k, i) == me)
            .collect();
        // At most one epoch of slices waits in the backlog.
        let cap = mine.len().max(1);
        let shared = Shared {
            backlog: Mutex::new(Backlog::default()),
            cond: Condvar::new(),
            in_flight: AtomicUsize::new(0),
        };
        std::thread::scope(|s| {
            let sender = s.spawn(|| {
                let r = self.send_loop(&shared);
                if r.is_err() {
                    shared
                        .backlog
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .failed = true;
                    shared.cond.notify_all();
                }
                r
            });
            let r = self.sample_loop(&shared, &mine, cap, &mut standby);
            {
                let mut b = shared.backlog.lock().unwrap_or_else(|e| e.into_inner());
                b.closed = true;
                if r.is_err() {
                    b.q.clear();
                }
            }
            shared.cond.notify_all();
            let sent = sender
                .join()
                .unwrap_or_else(|_| Err(ExecError::Invalid("the queue's sender panicked".into())));
            let stats = r?;
            sent?;
            Ok(stats)
        })
    }

    fn sample_loop(
        &self,
        shared: &Shared,
        mine: &[(usize, usize)],
        cap: usize,
        standby: &mut Option<Standby<'_, PlainExtractor>>,
    ) -> Result<Vec<SamplerEpoch>> {
        let me = self.comm.rank();
        let lanes = self.layout.lanes();
        let mut stats = Vec::new();
        for epoch in 0..self.epochs {
            let batches = epoch_batches(self.seeds, self.lcfg, epoch);
            let mut sample_s = 0.0;
            for &(k, i) in mine {
                let key = BatchKey {
                    seed: self.lcfg.seed,
                    epoch,
                    step: k as u64,
                };
                let t = Instant::now();
                let slice = near_equal_part(&batches[k], i, lanes);
                let mb = on_pool(&self.pool, || self.sampler.sample(slice, key))?;
                sample_s += t.elapsed().as_secs_f64();
                let mut b = shared.backlog.lock().unwrap_or_else(|e| e.into_inner());
                while b.q.len() >= cap && !b.failed {
                    b = shared.cond.wait(b).unwrap_or_else(|e| e.into_inner());
                }
                if b.failed {
                    return Err(ExecError::Invalid(
                        "factored: the queue to the trainers failed".into(),
                    ));
                }
                b.q.push_back(Entry {
                    trainer: self.layout.trainer_of(i),
                    epoch,
                    step: k,
                    item: Item::Batch(mb),
                });
                drop(b);
                shared.cond.notify_all();
            }
            let (claimed, standby_s) = match standby.as_mut() {
                Some(sb) => self.standby_epoch(shared, sb, epoch)?,
                None => (0, 0.0),
            };
            stats.push(SamplerEpoch {
                rank: me,
                epoch,
                sample_s,
                tasks: mine.len() as u64,
                claimed,
                standby_s,
            });
        }
        Ok(stats)
    }

    /// Dynamic switching for `epoch`: while the profit is positive, claim the next queued
    /// slice of this epoch, train it with its trainer's parameters and send back the gradient.
    fn standby_epoch(
        &self,
        shared: &Shared,
        sb: &mut Standby<'_, PlainExtractor>,
        epoch: u64,
    ) -> Result<(u64, f64)> {
        let me = self.comm.rank();
        let start = Instant::now();
        let mut claimed = 0u64;
        loop {
            let claim = {
                let mut b = shared.backlog.lock().unwrap_or_else(|e| e.into_inner());
                let queued = b.q.len() + shared.in_flight.load(Ordering::Relaxed);
                // This sampler sees its own queue; the others' are about as long.
                let remaining = queued * self.layout.samplers;
                if switch_profit(remaining, sb.t_train, self.layout.trainers) <= 0.0 {
                    None
                } else {
                    b.q.iter_mut()
                        .find(|e| e.epoch == epoch && matches!(e.item, Item::Batch(_)))
                        .map(|e| {
                            let item = std::mem::replace(&mut e.item, Item::Claimed(me));
                            (e.trainer, e.step, item)
                        })
                }
            };
            let Some((owner, step, Item::Batch(mb))) = claim else {
                break;
            };
            let m = self.comm.recv(owner, tag::PARAMS)?;
            let (e, k, params) = decode_params(&m)
                .filter(|(e, k, _)| *e == epoch && *k == step as u64)
                .ok_or_else(|| {
                    ExecError::Invalid(format!(
                        "factored: rank {owner} sent parameters for another slice than epoch \
                         {epoch} step {step}"
                    ))
                })?;
            debug_assert_eq!((e, k), (epoch, step as u64));
            sb.trainer.set_parameters(&params)?;
            let mut features = Vec::new();
            let ex = &mut sb.extractor;
            let extract = on_pool(&self.pool, || ex.extract(&mb.input_nodes, &mut features))?;
            let (edges, input_nodes) = (mb.num_edges() as u64, mb.input_nodes.len() as u64);
            let p = Prepared {
                batch: mb,
                features,
                dim: sb.extractor.dim(),
                extract,
                remote: None,
                split: None,
                input_agg: None,
                input_store: None,
                cache_split: None,
            };
            let key = (epoch << 32) | step as u64;
            let trainer = &mut *sb.trainer;
            // The step's products, for the owner's compute floor where it cannot count them
            // itself (a process of its own; in-process the counters are shared).
            let flops = (gemm::nominal_flops(), gemm::skipped_flops());
            let o = on_pool(&self.pool, || trainer.compute_gradients(p, key))?;
            let mut gradient = Vec::new();
            sb.trainer
                .gradients_into(o.labelled as f32, &mut gradient)?;
            let g = RemoteGradient {
                loss_sum: o.loss * o.labelled as f64,
                correct: o.correct,
                labelled: o.labelled,
                gradient,
                work: RemoteWork {
                    edges,
                    input_nodes,
                    extract,
                    gemm_flops: gemm::nominal_flops().saturating_sub(flops.0),
                    gemm_flops_skipped: gemm::skipped_flops().saturating_sub(flops.1),
                },
            };
            self.comm.send(owner, tag::GRAD, &encode_gradient(&g))?;
            claimed += 1;
        }
        Ok((claimed, start.elapsed().as_secs_f64()))
    }

    /// Sends the backlog in order, at most `depth` unacknowledged slices per trainer, then
    /// waits for the last acknowledgements.
    fn send_loop(&self, shared: &Shared) -> Result<()> {
        let mut outstanding = vec![0usize; self.comm.size()];
        loop {
            let next = {
                let mut b = shared.backlog.lock().unwrap_or_else(|e| e.into_inner());
                while b.q.is_empty() && !b.closed {
                    b = shared.cond.wait(b).unwrap_or_else(|e| e.into_inner());
                }
                b.q.pop_front()
            };
            shared.cond.notify_all();
            let Some(e) = next else { break };
            let t = e.trainer;
            if outstanding[t] >= self.depth {
                self.comm.recv(t, tag::CREDIT)?;
                outstanding[t] -= 1;
                shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            }
            let msg = match &e.item {
                Item::Batch(mb) => {
                    let mut m = vec![KIND_BATCH];
                    m.extend_from_slice(&wire::encode(mb));
                    m
                }
                Item::Claimed(r) => {
                    let mut m = vec![KIND_CLAIM];
                    m.extend_from_slice(&(*r as u64).to_le_bytes());
                    m
                }
            };
            self.comm.send(t, tag::TASK, &msg)?;
            outstanding[t] += 1;
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
        }
        for (t, n) in outstanding.iter_mut().enumerate() {
            while *n > 0 {
                self.comm.recv(t, tag::CREDIT)?;
                *n -= 1;
                shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}
