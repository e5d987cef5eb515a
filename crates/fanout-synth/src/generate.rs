//! `dataset gen`: draws a preset's graph, labels, features and splits into a dataset directory.
//!
//! Edges are drawn in fixed-size chunks, chunk `k` from its own keyed stream, in parallel; the
//! two passes of [`build_topology`] regenerate the chunks instead of storing the edge list, so
//! memory stays at a few dozen bytes per vertex plus the output files' page cache, and the result
//! depends on the seed only, never on the thread count.

use crate::calibrate::calibrate;
use crate::features::{split_vertices_from, write_class_features, ClassFeatures};
use crate::model::Model;
use crate::preset::PresetConfig;
use fanout_graph::{
    build_topology, files, ArcSink, ArcSource, BuildOptions, Cancel, CsrVisitor, Dataset,
    DatasetWriter, Error, FeatDtype, Layout, Meta, Offset, Progress, Result, VertexId,
};
use fanout_rand::{mix_keys, Rng};
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

const EDGE_STREAM: u64 = 0xED6E;
/// Edge draws per chunk (one keyed stream each).
const CHUNK: u64 = 1 << 15;
/// Chunks generated in parallel before they are handed, in order, to the builder.
const WINDOW: usize = 64;

/// How to write the generated dataset (the graph's shape is in [`PresetConfig`]).
#[derive(Clone, Debug, Default)]
pub struct GenOptions {
    /// The same seed and configuration always give byte-identical files.
    pub seed: u64,
    /// Element type of `feat.bin`.
    pub feat_dtype: FeatDtype,
    /// CSC or CSR (the graph is symmetric, so both store the same arrays).
    pub layout: Layout,
    /// Replace an existing dataset at the output path.
    pub overwrite: bool,
}

/// What [`generate`] produced, measured on the stored dataset.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GenSummary {
    /// The configuration's preset name.
    pub preset: String,
    /// Vertices (= NUM_NODE).
    pub nodes: u64,
    /// Stored arcs (= NUM_EDGE; each undirected edge counted in both directions).
    pub arcs: u64,
    /// Feature width (= FEAT_DIM).
    pub feat_dim: u64,
    /// Number of classes (= NUM_CLASS).
    pub classes: u64,
    /// Split sizes (= NUM_TRAIN_SET, NUM_VALID_SET, NUM_TEST_SET).
    pub train: u64,
    /// See `train`.
    pub valid: u64,
    /// See `train`.
    pub test: u64,
    /// Measured fraction of stored arcs whose two ends share a label.
    pub homophily: f64,
    /// Wall-clock time of the whole generation, checksums included.
    pub seconds: f64,
    /// `arcs / seconds`.
    pub arcs_per_s: f64,
}

/// The model's edges as a re-readable arc source: every scan yields the same `draws` edges.
struct EdgeStream<'a> {
    model: &'a Model,
    seed: u64,
    draws: u64,
}

impl ArcSource for EdgeStream<'_> {
    fn scan(&mut self, progress: &dyn Progress, sink: &mut ArcSink<'_>) -> Result<()> {
        let chunks = self.draws.div_ceil(CHUNK);
        let mut bufs: Vec<Vec<(u64, u64)>> = (0..WINDOW)
            .map(|_| Vec::with_capacity(CHUNK as usize))
            .collect();
        let mut first = 0u64;
        while first < chunks {
            let count = (chunks - first).min(WINDOW as u64) as usize;
            bufs[..count]
                .par_iter_mut()
                .enumerate()
                .for_each(|(i, buf)| {
                    let k = first + i as u64;
                    let len = CHUNK.min(self.draws - k * CHUNK);
                    let mut rng = Rng::keyed(&[self.seed, EDGE_STREAM, k]);
                    buf.clear();
                    self.model.draw_many(&mut rng, len as usize, buf);
                });
            for buf in &bufs[..count] {
                sink(buf)?;
                progress.advance(buf.len() as u64);
            }
            first += count as u64;
        }
        Ok(())
    }

    fn size_hint(&self) -> (u64, &'static str) {
        (self.draws, "edges")
    }
}

/// Generates the dataset described by `cfg` into `out` (`None`: a self-deleting temporary
/// directory that lives as long as the returned [`Dataset`]).
///
/// Guarantees: the graph is undirected and stored symmetrised (both arcs of every edge), without
/// self-loops or repeated arcs; labels are `0..classes` and every class's vertices form a
/// planted community; features are class centroid plus noise; the three splits are disjoint,
/// sorted and of sizes round(fraction x nodes); every file is a pure function of (`cfg`,
/// `opts.seed`, `opts.feat_dtype`, `opts.layout`), whatever the number of threads. The average
/// degree and homophily meet `cfg`'s targets approximately (calibrated, typically within a few
/// percent); the summary reports the measured values.
pub fn generate(
    cfg: &PresetConfig,
    opts: &GenOptions,
    out: Option<&Path>,
    progress: &dyn Progress,
) -> Result<(Dataset, GenSummary)> {
    generate_with_cancel(cfg, opts, out, progress, &Cancel::default())
}

/// [`generate`], stopping with [`Error::Interrupted`] at the next safe point (between batches
/// of edges, before each file) once `cancel` is cancelled. The temporary directory is then
/// removed and `out` is left as it was.
pub fn generate_with_cancel(
    cfg: &PresetConfig,
    opts: &GenOptions,
    out: Option<&Path>,
    progress: &dyn Progress,
    cancel: &Cancel,
) -> Result<(Dataset, GenSummary)> {
    let start = Instant::now();
    cfg.validate().map_err(Error::Invalid)?;
    let mut writer = match out {
        Some(p) => DatasetWriter::create(p, opts.overwrite)?,
        None => DatasetWriter::temporary()?,
    }
    .with_cancel(cancel.clone());
    let n = cfg.nodes;
    let seed = opts.seed;

    progress.phase("model: weights, classes, samplers", 0, "steps");
    let mut model = Model::new(cfg, seed);
    let plan = calibrate(&model, cfg.avg_degree * n as f64, cfg.homophily, seed);
    model.p_class = plan.p_class;
    progress.finish_phase();

    let mut edges = EdgeStream {
        model: &model,
        seed,
        draws: plan.draws,
    };
    let build = BuildOptions {
        layout: opts.layout,
        symmetrize: true,
        drop_self_loops: true,
        dedup: true,
        num_nodes: Some(n),
    };
    cancel.check()?;
    let stats = build_topology(&mut edges, &build, &mut writer, progress)?;

    let labels: Vec<i64> = model.labels.iter().map(|&l| l as i64).collect();
    writer.write_array(files::LABEL, &labels)?;
    let spec = ClassFeatures {
        num_classes: cfg.classes,
        dim: cfg.feat_dim as usize,
        dtype: opts.feat_dtype,
        signal: cfg.feature_signal,
        seed: mix_keys(&[seed, 0xFEA7]),
    };
    write_class_features(&mut writer, &labels, &spec, progress)?;
    drop(labels);
    // The labelled region: every vertex, or those of the first `labelled_classes` classes,
    // widened class by class when they hold fewer vertices than the splits need (small graphs).
    let pool: Option<Vec<u32>> = (cfg.labelled_classes > 0).then(|| {
        let wanted = cfg.split.sizes(n).iter().sum::<usize>() as u64;
        let mut per_class = vec![0u64; cfg.classes as usize];
        model
            .labels
            .iter()
            .for_each(|&l| per_class[l as usize] += 1);
        let mut k = (cfg.labelled_classes as usize).min(per_class.len());
        while k < per_class.len() && per_class[..k].iter().sum::<u64>() < wanted {
            k += 1;
        }
        let k = k as u32;
        (0..n as u32)
            .filter(|&v| model.labels[v as usize] < k)
            .collect()
    });
    let [train, valid, test] =
        split_vertices_from(n, pool.as_deref(), cfg.split, mix_keys(&[seed, 0x5917]))?;
    drop(pool);
    writer.write_array(files::TRAIN, &train)?;
    writer.write_array(files::VALID, &valid)?;
    writer.write_array(files::TEST, &test)?;

    let meta = Meta {
        num_node: n,
        num_edge: stats.num_arcs,
        feat_dim: cfg.feat_dim,
        num_class: cfg.classes,
        num_train_set: train.len() as u64,
        num_valid_set: valid.len() as u64,
        num_test_set: test.len() as u64,
        layout: opts.layout,
        feat_dtype: opts.feat_dtype,
        ..Meta::default()
    };
    let ds = writer.finish(meta, progress)?;
    let homophily = measure_homophily(&ds, &model.labels, progress);
    let seconds = start.elapsed().as_secs_f64();
    let summary = GenSummary {
        preset: cfg.preset.clone(),
        nodes: n,
        arcs: stats.num_arcs,
        feat_dim: cfg.feat_dim,
        classes: cfg.classes,
        train: train.len() as u64,
        valid: valid.len() as u64,
        test: test.len() as u64,
        homophily,
        seconds,
        arcs_per_s: stats.num_arcs as f64 / seconds.max(1e-9),
    };
    Ok((ds, summary))
}

/// Fraction of stored arcs whose ends carry the same label (0 for an empty graph).
pub(crate) fn measure_homophily(ds: &Dataset, labels: &[u32], progress: &dyn Progress) -> f64 {
    struct Count<'a>(&'a [u32], &'a dyn Progress);
    impl CsrVisitor for Count<'_> {
        type Output = u64;
        fn visit<O: Offset, I: VertexId>(self, indptr: &[O], indices: &[I]) -> u64 {
            let (labels, progress) = (self.0, self.1);
            let n = indptr.len().saturating_sub(1);
            const ROWS: usize = 1 << 14;
            (0..n.div_ceil(ROWS))
                .into_par_iter()
                .map(|b| {
                    let rows = b * ROWS..((b + 1) * ROWS).min(n);
                    progress.advance(rows.len() as u64);
                    rows.map(|v| {
                        let row = &indices[indptr[v].idx()..indptr[v + 1].idx()];
                        row.iter().filter(|u| labels[u.idx()] == labels[v]).count() as u64
                    })
                    .sum::<u64>()
                })
                .sum()
        }
    }
    progress.phase("measure homophily", ds.num_nodes(), "rows");
    let same = ds.topology.visit(Count(labels, progress));
    progress.finish_phase();
    same as f64 / ds.num_arcs().max(1) as f64
}
