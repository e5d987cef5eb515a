//! [`CachedExtractor`]: the extract stage with a static device cache and/or FastGL Match in
//! front of the host feature store, and [`build_extractor`], which the trainer calls to get one
//! from a policy name and a size.

use crate::extract::{CacheSplit, ExtractStats, Extractor};
use crate::policy::{degree_ranking, random_ranking, Policy};
use crate::presc::presc_ranking;
use crate::table::{CacheSize, FeatureCache};
use fanout_graph::{Dataset, Error, Result};
use fanout_sample::{LoaderConfig, Sampler};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Input rows per parallel task when a batch is split ([`Extractor::extract_split`]) or
/// remembered for Match: large enough that a task's own lists cost little to join.
const SPLIT_CHUNK: usize = 1 << 14;

/// The previous batch's rows kept "on the device" for Match.
struct Previous {
    /// Per vertex, its stamp in the high 32 bits and its row in the previous batch in the low
    /// ones (one read per lookup): the stamp is `cur` iff `v` was an input node of the previous
    /// batch. Atomic so that a batch's vertices are marked in parallel (a batch's input nodes
    /// are distinct, so each entry has one writer; were one repeated, either of its positions
    /// would be a right answer).
    mark: Vec<AtomicU64>,
    cur: u32,
    /// The previous batch's rows, when [`Extractor::extract`] made it (an
    /// [`Extractor::extract_split`] leaves them on the device and this empty).
    rows: Vec<f32>,
    /// Whether `rows` holds the previous batch (it was extracted on the host).
    rows_kept: bool,
}

/// Extracts through a static cache (hits served from it) and, with Match, from the previous
/// batch's rows (reused), gathering only the rest from the host store. Guarantees: `out` is
/// exactly what [`crate::PlainExtractor`] writes (bit for bit); each row is counted once, as
/// cache if cached, else reused if in the previous batch (Match on), else host, so
/// `bytes_total == bytes_from_cache + bytes_reused + bytes_from_host`.
pub struct CachedExtractor {
    ds: Arc<Dataset>,
    cache: Option<FeatureCache>,
    prev: Option<Previous>,
    /// Splits made so far ([`CacheSplit::seq`] of the next one).
    splits: u64,
}

impl CachedExtractor {
    /// An extractor over `ds`'s features with an optional cache (built from the same features)
    /// and Match on or off. Errors if the dataset has no features or the cache's shape differs.
    pub fn new(
        ds: Arc<Dataset>,
        cache: Option<FeatureCache>,
        match_previous: bool,
    ) -> Result<Self> {
        let f = ds.features.as_ref().ok_or_else(|| {
            Error::Invalid(format!(
                "{}: the dataset has no features; import it with --random-features DIM",
                ds.dir.display()
            ))
        })?;
        if let Some(c) = &cache {
            if c.dim() != f.dim || c.row_bytes() != f.row_bytes() {
                return Err(Error::Invalid("cache built from other features".into()));
            }
        }
        let n = f.num_rows();
        let prev = match_previous.then(|| Previous {
            mark: (0..n).map(|_| AtomicU64::new(0)).collect(),
            cur: 0,
            rows: Vec::new(),
            rows_kept: false,
        });
        Ok(CachedExtractor {
            ds,
            cache,
            prev,
            splits: 0,
        })
    }

    /// The cache, if any.
    pub fn cache(&self) -> Option<&FeatureCache> {
        self.cache.as_ref()
    }

    /// Whether Match (reuse of the previous batch) is on.
    pub fn matches_previous(&self) -> bool {
        self.prev.is_some()
    }

    /// With Match, makes `input_nodes` the previous batch (their positions stamped, its rows
    /// cleared for the caller to keep or not) and returns it; `None` without Match.
    fn remember(&mut self, input_nodes: &[u32]) -> Option<&mut Previous> {
        self.prev.as_ref()?;
        self.forget_previous();
        let p = self.prev.as_mut()?;
        let (mark, cur) = (&p.mark, u64::from(p.cur) << 32);
        input_nodes
            .par_chunks(SPLIT_CHUNK)
            .enumerate()
            .for_each(|(k, ids)| {
                for (j, &v) in ids.iter().enumerate() {
                    mark[v as usize].store(cur | (k * SPLIT_CHUNK + j) as u64, Relaxed);
                }
            });
        Some(p)
    }

    /// Forgets the previous batch (the next extraction reuses nothing), e.g. when the device
    /// buffer was freed between epochs.
    pub fn forget_previous(&mut self) {
        if let Some(p) = &mut self.prev {
            p.cur = p.cur.wrapping_add(1);
            if p.cur == 0 {
                p.mark.iter_mut().for_each(|m| *m.get_mut() = 0);
                p.cur = 1;
            }
            p.rows.clear();
        }
    }
}

impl Extractor for CachedExtractor {
    fn dim(&self) -> usize {
        self.ds.features.as_ref().map_or(0, |f| f.dim)
    }

    fn extract(&mut self, input_nodes: &[u32], out: &mut Vec<f32>) -> Result<ExtractStats> {
        crate::extract::check_input_nodes(&self.ds, input_nodes)?;
        let ds = self.ds.clone();
        let f = ds.features.as_ref().expect("checked in new");
        let d = f.dim;
        out.resize(input_nodes.len() * d, 0.0);
        let cache = self.cache.as_ref();
        let prev = self.prev.as_ref().filter(|p| p.cur != 0 && p.rows_kept);
        // Per row: (cache, reused, host) row counts.
        let (c, r, h) = if d == 0 {
            (0, 0, input_nodes.len() as u64)
        } else {
            out.par_chunks_mut(d)
                .zip(input_nodes.par_iter())
                .map(|(o, &v)| match source(cache, prev, v) {
                    Source::Cache(s) => {
                        cache.expect("a cache hit").copy_row(s, o);
                        (1u64, 0u64, 0u64)
                    }
                    Source::Previous(i) => {
                        let (p, i) = (prev.expect("a reused row"), i as usize);
                        o.copy_from_slice(&p.rows[i * d..(i + 1) * d]);
                        (0, 1, 0)
                    }
                    Source::Host => {
                        f.copy_row(v as usize, o);
                        (0, 0, 1)
                    }
                })
                .reduce(|| (0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
        };
        if let Some(p) = self.remember(input_nodes) {
            p.rows.extend_from_slice(out);
            p.rows_kept = true;
        }
        Ok(stats(f.row_bytes() as u64, c, r, h))
    }

    fn extract_split(
        &mut self,
        input_nodes: &[u32],
        split: &mut CacheSplit,
        misses: Option<&mut Vec<f32>>,
    ) -> Option<Result<ExtractStats>> {
        if self.cache.is_none() && self.prev.is_none() {
            return None;
        }
        Some(self.split(input_nodes, split, misses))
    }

    fn cache_rows(&self) -> Option<Vec<f32>> {
        match (&self.cache, &self.prev) {
            (Some(c), _) => Some(c.rows_f32()),
            (None, Some(_)) => Some(Vec::new()),
            (None, None) => None,
        }
    }
}

impl CachedExtractor {
    /// [`Extractor::extract_split`]: hits of the cache first, then (Match) rows of the
    /// previous batch, then the host, as [`Extractor::extract`] decides.
    fn split(
        &mut self,
        input_nodes: &[u32],
        split: &mut CacheSplit,
        misses: Option<&mut Vec<f32>>,
    ) -> Result<ExtractStats> {
        crate::extract::check_input_nodes(&self.ds, input_nodes)?;
        let ds = self.ds.clone();
        let f = ds.features.as_ref().expect("checked in new");
        let d = f.dim;
        let cache = self.cache.as_ref();
        let miss = cache.map_or(0, FeatureCache::len) as u32;
        let prev = self.prev.as_ref().filter(|p| p.cur != 0);
        split.seq = self.splits;
        split.keep = self.prev.is_some();
        // In parallel over chunks of positions: each row's slot, and the chunk's reused and
        // missed positions (ascending), joined in chunk order below.
        split.slots.resize(input_nodes.len(), 0);
        let lists: Vec<[Vec<u32>; 3]> = split
            .slots
            .par_chunks_mut(SPLIT_CHUNK)
            .zip(input_nodes.par_chunks(SPLIT_CHUNK))
            .enumerate()
            .map(|(k, (slots, ids))| {
                let base = (k * SPLIT_CHUNK) as u32;
                let [mut reused, mut from, mut host] = [Vec::new(), Vec::new(), Vec::new()];
                for (j, (slot, &v)) in slots.iter_mut().zip(ids).enumerate() {
                    let i = base + j as u32;
                    *slot = match source(cache, prev, v) {
                        Source::Cache(s) => s,
                        Source::Previous(p) => {
                            reused.push(i);
                            from.push(p);
                            miss
                        }
                        Source::Host => {
                            host.push(i);
                            miss
                        }
                    };
                }
                [reused, from, host]
            })
            .collect();
        split.reused_positions.clear();
        split.reused_from.clear();
        split.miss_positions.clear();
        for [reused, from, host] in &lists {
            split.reused_positions.extend_from_slice(reused);
            split.reused_from.extend_from_slice(from);
            split.miss_positions.extend_from_slice(host);
        }
        if let Some(misses) = misses {
            misses.resize(split.miss_positions.len() * d, 0.0);
            if d > 0 {
                misses
                    .par_chunks_mut(d)
                    .zip(split.miss_positions.par_iter())
                    .for_each(|(o, &i)| f.copy_row(input_nodes[i as usize] as usize, o));
            }
        }
        if let Some(p) = self.remember(input_nodes) {
            // The rows stay on the device.
            p.rows_kept = false;
        }
        self.splits += 1;
        let (r, h) = (split.reused_positions.len(), split.miss_positions.len());
        let c = input_nodes.len() - r - h;
        Ok(stats(f.row_bytes() as u64, c as u64, r as u64, h as u64))
    }
}

/// Where an input row comes from.
#[derive(Clone, Copy)]
enum Source {
    /// The cache, at this slot.
    Cache(u32),
    /// The previous batch (Match), at this position in it.
    Previous(u32),
    /// The host store.
    Host,
}

/// Where `v`'s row comes from: the cache first, then the previous batch (`prev`, when Match
/// has one), else the host. The one rule both ways of extracting follow.
#[inline]
fn source(cache: Option<&FeatureCache>, prev: Option<&Previous>, v: u32) -> Source {
    if let Some(s) = cache.and_then(|c| c.slot(v)) {
        return Source::Cache(s);
    }
    match prev {
        Some(p) => {
            let m = p.mark[v as usize].load(Relaxed);
            if (m >> 32) as u32 == p.cur {
                Source::Previous(m as u32)
            } else {
                Source::Host
            }
        }
        None => Source::Host,
    }
}

/// The stats of an extraction of `cache + reused + host` rows of `row_bytes` each.
fn stats(row_bytes: u64, cache: u64, reused: u64, host: u64) -> ExtractStats {
    let rows = cache + reused + host;
    ExtractStats {
        rows,
        bytes_total: rows * row_bytes,
        bytes_from_cache: cache * row_bytes,
        bytes_reused: reused * row_bytes,
        bytes_from_host: host * row_bytes,
    }
}

/// What the trainer asks for (`--cache-policy`, `--cache-ratio`/`--cache-bytes`,
/// `--match-reorder`).
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    /// Cache policy; `None` = no cache.
    pub policy: Option<Policy>,
    /// Cache size (ignored without a policy).
    pub size: CacheSize,
    /// Reuse the previous batch's rows (FastGL Match). Reordering is the caller's: buffer a
    /// window of batches and run [`crate::reorder_batches`] on it (the trainer's pipeline does,
    /// with `PipelineConfig::reorder_window`).
    pub match_previous: bool,
    /// Seed of the random policy.
    pub seed: u64,
    /// A ranking (hottest first) that replaces the policy's own, e.g. the degree within a
    /// data-parallel worker's partition (PaGraph); the policy still names the cache in
    /// summaries. Only its first `size` rows are cached.
    pub ranking: Option<Vec<u32>>,
}

/// What PreSC pre-samples: the trainer's own sampler, training set and loader configuration
/// (pre-sampling epochs are keyed apart from training epochs, see [`crate::presc`]).
pub struct PreSampling<'a> {
    /// The sampler the trainer uses.
    pub sampler: Arc<dyn Sampler>,
    /// The training set.
    pub seeds: &'a [u32],
    /// The trainer's loader configuration (batch size, shuffle, seed, pool).
    pub loader: LoaderConfig,
}

/// What [`build_extractor`] set up, for logs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CacheSummary {
    /// Policy name, or "none".
    pub policy: String,
    /// Cached rows.
    pub rows: usize,
    /// Cached rows / |V|.
    pub ratio: f64,
    /// Bytes of cached rows.
    pub bytes: u64,
    /// Match on.
    pub match_previous: bool,
}

/// Builds the extractor for `cfg`: ranks vertices by the policy (PreSC pre-samples
/// `pre`), loads the top rows into a [`FeatureCache`] and wraps it in a [`CachedExtractor`].
/// Errors: no features; PreSC without `pre`; `optimal`, which is an evaluation oracle (it needs
/// the future trace; use `fanout cache-sim`).
pub fn build_extractor(
    ds: Arc<Dataset>,
    cfg: &CacheConfig,
    pre: Option<&PreSampling>,
) -> Result<(CachedExtractor, CacheSummary)> {
    let f = ds.features.as_ref().ok_or_else(|| {
        Error::Invalid(format!("{}: the dataset has no features", ds.dir.display()))
    })?;
    let n = ds.num_nodes() as usize;
    let cache = match cfg.policy {
        None => None,
        Some(p) => {
            let rows = cfg.size.rows(n, f.row_bytes());
            let ranking =
                match (&cfg.ranking, p) {
                    (Some(r), _) => {
                        if let Some(&v) = r.iter().find(|&&v| v as usize >= n) {
                            return Err(Error::Invalid(format!(
                                "cache ranking: vertex {v} out of range (the graph has {n})"
                            )));
                        }
                        r.clone()
                    }
                    (None, p) => match p {
                        Policy::Random => random_ranking(n, cfg.seed),
                        Policy::Degree => degree_ranking(&ds.topology),
                        Policy::PreSC(k) => {
                            let pre = pre.ok_or_else(|| {
                                Error::Invalid("PreSC needs the sampler and training set".into())
                            })?;
                            presc_ranking(&pre.sampler, pre.seeds, &pre.loader, k)?
                        }
                        Policy::Optimal => return Err(Error::Invalid(
                            "the optimal policy is an evaluation oracle (it needs the evaluated \
                         epoch's trace); use `fanout cache-sim`"
                                .into(),
                        )),
                    },
                };
            Some(FeatureCache::build(f, &ranking[..rows.min(ranking.len())])?)
        }
    };
    let summary = CacheSummary {
        policy: cfg.policy.map_or("none".into(), |p| p.to_string()),
        rows: cache.as_ref().map_or(0, FeatureCache::len),
        ratio: cache
            .as_ref()
            .map_or(0.0, |c| c.len() as f64 / n.max(1) as f64),
        bytes: cache.as_ref().map_or(0, FeatureCache::bytes),
        match_previous: cfg.match_previous,
    };
    Ok((
        CachedExtractor::new(ds, cache, cfg.match_previous)?,
        summary,
    ))
}
