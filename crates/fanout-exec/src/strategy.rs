//! Strategies: which seeds each worker trains, and how its batches are cut.
//!
//! Every strategy runs the same training loop ([`crate::fit`]) over a [`crate::BatchSource`];
//! a strategy only decides each worker's [`WorkerPlan`] (and, through `fit`'s communicator,
//! how replicas are kept equal):
//!
//! - **single**: one worker trains the whole training set in batches of `batch_size`.
//! - **data-parallel** without a partition: every step's global batch (the one-worker batch)
//!   is sliced across the workers ([`BatchPlan::Slice`]), so N workers compute exactly the
//!   one-worker gradient, up to rounding, whatever N.
//! - **data-parallel** over a PaGraph partition (`partition = NAME`): worker `r` trains the
//!   training vertices of part `r`, cut into the same number of steps as every other worker
//!   (`ceil(|train| / batch_size)`, [`BatchPlan::Steps`]); its degree cache ranks vertices
//!   by their degree inside its part. Self-reliant sampling needs no copy of the graph: a
//!   part holds the whole L-hop in-neighbourhood of its training vertices, so sampling at
//!   most L hops from them never leaves it.
//!
//! Evaluation is always sliced ([`BatchPlan::Slice`]): the union of the workers' evaluation
//! batches is the one-worker batch under the same key, so N workers report exactly the
//! one-worker accuracy of the same parameters.

use crate::config::{SampleScope, StrategyKind, TrainConfig};
use crate::error::{ExecError, Result};
use fanout_cache::Policy;
use fanout_graph::{part_degree_ranking, Dataset, Partition};
use fanout_sample::{BatchPlan, RangeOwners, SamplerKind};

/// One worker's share of a run.
#[derive(Clone, Debug)]
pub struct WorkerPlan {
    /// The training seeds this worker's loader holds (all of them when batches are sliced).
    pub train_seeds: Vec<u32>,
    /// How its training epochs are cut.
    pub train_plan: BatchPlan,
    /// How its evaluation passes are cut.
    pub eval_plan: BatchPlan,
    /// Batch size handed to its loader: the global batch when slicing, else about its own
    /// share of a step (what PreSC pre-samples with).
    pub batch_size: usize,
    /// The partition's name and this worker's part, for partitioned data parallelism, and
    /// for split parallelism (the worker's id range; its degree cache ranks inside it).
    pub part: Option<(String, Vec<u32>)>,
    /// Split parallelism: the dataset's METIS ranges, one per worker.
    pub split: Option<RangeOwners>,
}

impl WorkerPlan {
    /// The plan of worker `rank` of `workers` under `cfg` (resolved). Errors: a partition
    /// that cannot be opened or whose part count differs from `workers`, and self-reliant
    /// sampling deeper than the partition's hops.
    pub fn new(ds: &Dataset, cfg: &TrainConfig, rank: usize, workers: usize) -> Result<Self> {
        let batch = cfg.batch_size.unwrap_or(1).max(1);
        let all = ds.train.to_vec();
        if cfg.strategy_kind() == StrategyKind::Split {
            return Self::split(ds, all, batch, rank, workers);
        }
        if cfg.strategy_kind() == StrategyKind::Single || workers == 1 && cfg.partition.is_none() {
            return Ok(WorkerPlan {
                train_seeds: all,
                train_plan: BatchPlan::Whole,
                eval_plan: BatchPlan::Whole,
                batch_size: batch,
                part: None,
                split: None,
            });
        }
        let slice = BatchPlan::Slice { rank, workers };
        let Some(name) = &cfg.partition else {
            return Ok(WorkerPlan {
                train_seeds: all,
                train_plan: slice,
                eval_plan: slice,
                batch_size: batch,
                part: None,
                split: None,
            });
        };
        // A worker reads only its own part, so a damaged part stops the worker that owns it.
        let (parts, hops, train_seeds, vertices) = Partition::open_part(ds, name, rank)?;
        if parts != workers {
            return Err(ExecError::Invalid(format!(
                "partition {name} of {} has {parts} parts but the run has {workers} workers; \
                 partition with --parts {workers}",
                ds.dir.display(),
            )));
        }
        if train_seeds.is_empty() {
            return Err(ExecError::Invalid(format!(
                "partition {name} of {}: part {rank} holds no training vertex (the training \
                 set has {} for {parts} parts); partition with fewer --parts",
                ds.dir.display(),
                all.len()
            )));
        }
        let layers = cfg.fanouts.as_ref().map_or(0, Vec::len);
        if cfg.sample_from == SampleScope::Partition {
            let kind = cfg.sampler_kind();
            if kind == SamplerKind::Randomwalk || layers > hops {
                return Err(ExecError::Invalid(format!(
                    "partition {name} holds the {}-hop neighbourhood of its training vertices, \
                     but the {} sampler with {layers} layers reaches further; repartition with \
                     --hops {layers} or add --sample-from global",
                    hops,
                    match kind {
                        SamplerKind::Randomwalk => "random-walk",
                        SamplerKind::Khop => "k-hop",
                        SamplerKind::Weighted => "weighted",
                        SamplerKind::Layerwise => "layer-wise",
                    }
                )));
            }
        }
        let steps = all.len().div_ceil(batch);
        Ok(WorkerPlan {
            batch_size: train_seeds.len().div_ceil(steps).max(1),
            train_seeds,
            train_plan: BatchPlan::Steps(steps),
            eval_plan: slice,
            part: Some((name.clone(), vertices)),
            split: None,
        })
    }

    /// Split parallelism: every worker holds the whole training set and takes every step's
    /// one-worker batch (split by [`crate::split::sample`]); evaluation is sliced as in data
    /// parallelism. Errors: a dataset without METIS ranges, or with another number of parts.
    fn split(
        ds: &Dataset,
        all: Vec<u32>,
        batch: usize,
        rank: usize,
        workers: usize,
    ) -> Result<Self> {
        let offsets = ds.part_offsets()?.ok_or_else(|| {
            ExecError::Invalid(format!(
                "{} has no METIS ranges ({}); --strategy split needs a dataset written by \
                 fanout dataset partition --method metis --parts {workers} DIR OUT",
                ds.dir.display(),
                fanout_graph::files::PART_OFFSETS
            ))
        })?;
        let owners = RangeOwners::new(offsets.clone()).map_err(ExecError::Invalid)?;
        if owners.parts() != workers {
            return Err(ExecError::Invalid(format!(
                "{} is split into {} METIS parts but the run has {workers} workers; run {} \
                 workers or partition again with --parts {workers}",
                ds.dir.display(),
                owners.parts(),
                owners.parts()
            )));
        }
        let mine = (offsets[rank] as u32..offsets[rank + 1] as u32).collect();
        Ok(WorkerPlan {
            train_seeds: all,
            train_plan: BatchPlan::Whole,
            eval_plan: if workers == 1 {
                BatchPlan::Whole
            } else {
                BatchPlan::Slice { rank, workers }
            },
            batch_size: batch,
            part: Some(("metis".into(), mine)),
            split: Some(owners),
        })
    }

    /// The cache ranking that replaces `policy`'s own: PaGraph's degree inside this worker's
    /// part for the degree policy; `None` otherwise (the policy ranks the whole graph, and
    /// PreSC pre-samples this worker's own seeds).
    pub fn cache_ranking(&self, ds: &Dataset, policy: Option<Policy>) -> Option<Vec<u32>> {
        match (&self.part, policy) {
            (Some((_, vertices)), Some(Policy::Degree)) => Some(part_degree_ranking(ds, vertices)),
            _ => None,
        }
    }

    /// A phrase for the run's summary line ("" for one worker).
    pub fn describe(&self, workers: usize, threads: usize) -> String {
        if workers == 1 {
            return String::new();
        }
        if self.split.is_some() {
            let own = self.part.as_ref().map_or(0, |(_, v)| v.len());
            return format!(
                "; split over {workers} workers ({threads} threads each): every step's batch \
                 split by the dataset's METIS ranges, this worker owning {own} vertices"
            );
        }
        match &self.part {
            None => format!(
                "; data-parallel over {workers} workers ({threads} threads each), each step's \
                 batch split between them"
            ),
            Some((name, vertices)) => format!(
                "; data-parallel over {workers} workers ({threads} threads each) on partition \
                 {name}: this worker trains {} seeds in a part of {} vertices",
                self.train_seeds.len(),
                vertices.len()
            ),
        }
    }
}
