//! Importers: NumPy directories, OGB raw node-property datasets and (gzipped) edge lists into
//! fanout's native dataset directory (GUIDE sections 1 and 2).
//!
//! [`import`] writes through one `DatasetWriter`, so a failed import leaves nothing behind;
//! topology goes through the store's two-pass `build_topology`, so no importer ever holds the
//! whole edge list in memory.

#![warn(missing_docs)]

mod edgelist;
pub mod npy;
mod npy_dir;
mod ogb;
mod text;
mod vertex;

use fanout_graph::{
    BuildOptions, BuildStats, Cancel, DatasetWriter, Error, FeatDtype, Meta, Progress, Result,
};
use std::path::Path;
use std::time::Instant;

/// An input format [`import`] understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A directory of `.npy` files: `edge_index.npy` [2, E] and optional `node_feat.npy`,
    /// `node_label.npy`, `train_idx.npy`, `valid_idx.npy`, `test_idx.npy`.
    Npy,
    /// The OGB raw node-property layout as downloaded: `raw/edge.csv[.gz]`,
    /// `raw/num-node-list.csv[.gz]`, optional `raw/node-feat.csv[.gz]`,
    /// `raw/node-label.csv[.gz]` and `split/<scheme>/{train,valid,test}.csv[.gz]`.
    Ogb,
    /// One text file (optionally gzip) of `src dst` lines, SNAP/KONECT style.
    EdgeList,
}

impl Format {
    /// The name accepted by [`std::str::FromStr`] and written in [`ImportSummary::format`].
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Npy => "npy",
            Format::Ogb => "ogb",
            Format::EdgeList => "edgelist",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    /// Accepts exactly `npy`, `ogb` or `edgelist`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "npy" => Ok(Format::Npy),
            "ogb" => Ok(Format::Ogb),
            "edgelist" => Ok(Format::EdgeList),
            _ => Err(format!("expected npy, ogb or edgelist, found {s:?}")),
        }
    }
}

/// Generated, learnable vertex data for a topology-only graph: uniform labels, class-centroid
/// features and random splits (see `fanout_synth`). Deterministic per `seed`.
#[derive(Clone, Debug, PartialEq)]
pub struct RandomFeatures {
    /// Feature dimension (> 0).
    pub dim: usize,
    /// Number of classes (> 0).
    pub classes: u64,
    /// Fraction of vertices in the train split.
    pub train_frac: f64,
    /// Fraction of vertices in the validation split.
    pub valid_frac: f64,
    /// Fraction of vertices in the test split.
    pub test_frac: f64,
    /// Seed of the labels, features and splits (each drawn from its own stream).
    pub seed: u64,
    /// Scale of the class centroids relative to the unit noise (how separable classes are).
    pub signal: f32,
}

/// How [`import`] writes the dataset.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Layout, symmetrisation, self-loops, deduplication and vertex count, for every format.
    pub build: BuildOptions,
    /// Element type of `feat.bin` (f16 halves the bytes; values must fit in f16).
    pub feat_dtype: FeatDtype,
    /// Generate labels, features and splits; the source must then have none of its own.
    pub random: Option<RandomFeatures>,
    /// Replace an existing dataset at the output path.
    pub overwrite: bool,
    /// The OGB split folder under `split/`; `None` picks the only one.
    pub split_scheme: Option<String>,
}

/// What an import did, for people (the CLI headline) and scripts (JSON).
#[derive(serde::Serialize, Debug, Clone)]
pub struct ImportSummary {
    /// `npy`, `ogb` or `edgelist`.
    pub format: String,
    /// The source path as given.
    pub source: String,
    /// The output directory as given.
    pub out: String,
    /// What the topology build read, dropped, added and stored.
    pub build: BuildStats,
    /// Vertices in the dataset (NUM_NODE).
    pub num_nodes: u64,
    /// Arcs stored (NUM_EDGE).
    pub num_arcs: u64,
    /// Feature dimension (FEAT_DIM; 0 for a topology-only dataset).
    pub feat_dim: u64,
    /// Classes (NUM_CLASS = largest label + 1; 0 without labels).
    pub num_classes: u64,
    /// Train split size.
    pub train: u64,
    /// Validation split size.
    pub valid: u64,
    /// Test split size.
    pub test: u64,
    /// True when labels, features and splits were generated.
    pub random_features: bool,
    /// Bytes of input files read (compressed size for gzip files).
    pub input_bytes: u64,
    /// Wall-clock seconds of the whole import.
    pub seconds: f64,
}

/// What a format's importer produced, before generated data and `meta.txt`.
pub(crate) struct Imported {
    pub stats: BuildStats,
    pub vertex: vertex::VertexData,
    /// Bytes of input files (compressed size for gzip).
    pub input_bytes: u64,
}

/// Imports `src` (in `format`) into a new dataset directory at `out`.
///
/// Guarantees: on success `out` holds a complete, checksummed dataset that passes
/// `fanout_graph::verify`; on any error nothing is left at `out` (an existing dataset there is
/// kept unless the import succeeds with `overwrite`). Every error on bad input names the file
/// (and the line or entry) and says what was expected; no input makes it panic. The edge list is
/// never held in memory: it is read twice, streamed.
pub fn import(
    format: Format,
    src: &Path,
    out: &Path,
    opts: &ImportOptions,
    progress: &dyn Progress,
) -> Result<ImportSummary> {
    import_with_cancel(format, src, out, opts, progress, &Cancel::default())
}

/// [`import`], stopping with [`Error::Interrupted`] at the next safe point (between batches of
/// arcs, before each file is written, around the checksums) once `cancel` is cancelled. The
/// temporary directory is then removed and `out` is left as it was.
pub fn import_with_cancel(
    format: Format,
    src: &Path,
    out: &Path,
    opts: &ImportOptions,
    progress: &dyn Progress,
    cancel: &Cancel,
) -> Result<ImportSummary> {
    let start = Instant::now();
    if let Some(r) = &opts.random {
        vertex::check_random(r)?;
    }
    if opts.split_scheme.is_some() && format != Format::Ogb {
        return Err(Error::Invalid(format!(
            "a split scheme applies to the ogb format only, not to {format}"
        )));
    }
    if !src.exists() {
        return Err(Error::Invalid(format!(
            "{}: no such file or directory (the {format} source to import)",
            src.display()
        )));
    }
    let mut writer = DatasetWriter::create(out, opts.overwrite)?.with_cancel(cancel.clone());
    let imported = match format {
        Format::Npy => npy_dir::import(src, &mut writer, opts, progress)?,
        Format::Ogb => ogb::import(src, &mut writer, opts, progress)?,
        Format::EdgeList => edgelist::import(src, &mut writer, opts, progress)?,
    };
    let Imported {
        stats,
        mut vertex,
        input_bytes,
    } = imported;
    if let Some(r) = &opts.random {
        vertex = vertex::write_random(&mut writer, stats.num_nodes, r, opts.feat_dtype, progress)?;
    }
    let meta = Meta {
        num_node: stats.num_nodes,
        num_edge: stats.num_arcs,
        feat_dim: vertex.feat_dim,
        num_class: vertex.num_classes,
        num_train_set: vertex.splits[0],
        num_valid_set: vertex.splits[1],
        num_test_set: vertex.splits[2],
        layout: opts.build.layout,
        feat_dtype: if vertex.feat_dim > 0 {
            opts.feat_dtype
        } else {
            FeatDtype::default()
        },
        checksums: Default::default(),
    };
    writer.finish(meta, progress)?;
    Ok(ImportSummary {
        format: format.as_str().into(),
        source: src.display().to_string(),
        out: out.display().to_string(),
        num_nodes: stats.num_nodes,
        num_arcs: stats.num_arcs,
        build: stats,
        feat_dim: vertex.feat_dim,
        num_classes: vertex.num_classes,
        train: vertex.splits[0],
        valid: vertex.splits[1],
        test: vertex.splits[2],
        random_features: opts.random.is_some(),
        input_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod testutil;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{import_err, import_ok};

    #[test]
    fn format_names_round_trip() {
        for f in [Format::Npy, Format::Ogb, Format::EdgeList] {
            assert_eq!(f.as_str().parse::<Format>(), Ok(f));
            assert_eq!(f.to_string(), f.as_str());
        }
        assert!("csv"
            .parse::<Format>()
            .unwrap_err()
            .contains("npy, ogb or edgelist"));
    }

    #[test]
    fn failed_import_keeps_the_existing_dataset() {
        let d = tempfile::tempdir().unwrap();
        let (good, bad, out) = (
            d.path().join("g.txt"),
            d.path().join("b.txt"),
            d.path().join("out"),
        );
        std::fs::write(&good, "0 1\n1 2\n").unwrap();
        std::fs::write(&bad, "0 1\n1 x\n").unwrap();
        let o = ImportOptions::default();
        let (before, s) = import_ok(Format::EdgeList, &good, &out, &o);
        assert_eq!(
            (s.format.as_str(), s.source.as_str()),
            ("edgelist", good.to_str().unwrap())
        );
        let over = ImportOptions {
            overwrite: true,
            ..Default::default()
        };
        let e = import_err(Format::EdgeList, &bad, &out, &over);
        assert!(e.contains("line 2"), "{e}");
        assert_eq!(fanout_graph::Dataset::open(&out).unwrap().meta, before.meta);
        // A folder that is not a dataset is never replaced.
        let other = d.path().join("photos");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("a.jpg"), "x").unwrap();
        let e = import_err(Format::EdgeList, &good, &other, &over);
        assert!(e.contains("is not a fanout dataset"), "{e}");
    }

    #[test]
    fn summary_serialises_for_scripts() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("e.txt");
        std::fs::write(&src, "0 1\n").unwrap();
        let out = d.path().join("o");
        let s = import(
            Format::EdgeList,
            &src,
            &out,
            &ImportOptions::default(),
            &fanout_graph::NoProgress,
        )
        .unwrap();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["format"], "edgelist");
        assert_eq!(v["num_nodes"], 2);
        assert_eq!(v["build"]["input_arcs"], 1);
        assert_eq!(v["random_features"], false);
        assert_eq!(v["input_bytes"], 4);
    }
}
