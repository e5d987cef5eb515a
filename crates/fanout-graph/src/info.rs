//! `dataset info`: sizes, degree statistics, split sizes and bytes on disk, as a struct that
//! prints for people and serialises to JSON for scripts.

use crate::checks::{IdCheck, STAMP};
use crate::dataset::{Dataset, Ids, Offsets};
use crate::meta::{FeatDtype, Layout};
use crate::partition::{list_partitions, Partition, PartitionStats};
use std::fmt;

/// Summary statistics of a degree array.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct DegreeStats {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    pub median: u64,
    pub p99: u64,
    /// Vertices with degree 0.
    pub zeros: u64,
}

impl DegreeStats {
    /// Statistics of `deg` (all zero for an empty array).
    pub fn of(deg: &[u64]) -> DegreeStats {
        if deg.is_empty() {
            return DegreeStats::default();
        }
        let mut sorted = deg.to_vec();
        sorted.sort_unstable();
        let q = |f: f64| sorted[((sorted.len() - 1) as f64 * f).round() as usize];
        DegreeStats {
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            mean: deg.iter().sum::<u64>() as f64 / deg.len() as f64,
            median: q(0.5),
            p99: q(0.99),
            zeros: deg.iter().filter(|&&d| d == 0).count() as u64,
        }
    }
}

/// One file of the dataset and its size.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FileInfo {
    pub name: String,
    pub bytes: u64,
}

/// Everything `dataset info` reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DatasetInfo {
    pub dir: String,
    pub num_nodes: u64,
    pub num_arcs: u64,
    pub layout: Layout,
    pub id_bits: u32,
    pub offset_bits: u32,
    pub feat_dim: u64,
    pub feat_dtype: FeatDtype,
    pub features_present: bool,
    pub num_classes: u64,
    pub labels_present: bool,
    /// Vertices with a label other than -1.
    pub labelled: u64,
    pub train: u64,
    pub valid: u64,
    pub test: u64,
    pub in_degree: DegreeStats,
    pub out_degree: DegreeStats,
    pub self_loops: u64,
    /// Data files (the check stamp excluded).
    pub files: Vec<FileInfo>,
    pub total_bytes: u64,
    /// How this open established that every neighbour id is in range.
    pub id_check: IdCheck,
    /// The partitions stored beside the dataset, by name.
    pub partitions: Vec<PartitionInfo>,
}

/// A partition stored beside a dataset (`dataset partition`): its figures, or why it could not
/// be opened (a damaged partition is listed, not an error of the whole summary).
#[derive(Clone, Debug, serde::Serialize)]
pub struct PartitionInfo {
    /// Its name (a folder under the dataset's `partitions/`).
    pub name: String,
    /// Its figures, when it opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<PartitionStats>,
    /// The error that kept it from opening.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PartitionInfo {
    /// Every partition stored beside `ds`, opened and described (none when the folder of
    /// partitions cannot be listed).
    pub fn all_of(ds: &Dataset) -> Vec<PartitionInfo> {
        list_partitions(ds)
            .unwrap_or_default()
            .into_iter()
            .map(|name| match Partition::open(ds, &name) {
                Ok(p) => PartitionInfo {
                    stats: Some(p.stats(ds)),
                    error: None,
                    name,
                },
                Err(e) => PartitionInfo {
                    stats: None,
                    error: Some(e.to_string()),
                    name,
                },
            })
            .collect()
    }
}

impl DatasetInfo {
    /// Computes the summary (one pass over the topology and labels).
    pub fn of(ds: &Dataset) -> DatasetInfo {
        let topo = &ds.topology;
        let self_loops = (0..ds.num_nodes())
            .filter(|&v| topo.row(v).iter().any(|u| u == v))
            .count() as u64;
        let mut file_list = Vec::new();
        if let Ok(rd) = std::fs::read_dir(&ds.dir) {
            let mut entries: Vec<_> = rd.flatten().collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                if let Ok(m) = e.metadata() {
                    if m.is_file() && e.file_name() != STAMP {
                        file_list.push(FileInfo {
                            name: e.file_name().to_string_lossy().into_owned(),
                            bytes: m.len(),
                        });
                    }
                }
            }
        }
        DatasetInfo {
            dir: ds.dir.display().to_string(),
            num_nodes: ds.num_nodes(),
            num_arcs: ds.num_arcs(),
            layout: topo.layout,
            id_bits: match topo.indices {
                Ids::U32(_) => 32,
                Ids::U64(_) => 64,
            },
            offset_bits: match topo.indptr {
                Offsets::U32(_) => 32,
                Offsets::U64(_) => 64,
            },
            feat_dim: ds.meta.feat_dim,
            feat_dtype: ds.meta.feat_dtype,
            features_present: ds.features.is_some(),
            num_classes: ds.meta.num_class,
            labels_present: ds.labels.is_some(),
            labelled: ds
                .labels
                .as_ref()
                .map_or(0, |l| l.iter().filter(|&&x| x >= 0).count() as u64),
            train: ds.train.len() as u64,
            valid: ds.valid.len() as u64,
            test: ds.test.len() as u64,
            in_degree: DegreeStats::of(&topo.in_degrees()),
            out_degree: DegreeStats::of(&topo.out_degrees()),
            self_loops,
            total_bytes: file_list.iter().map(|f| f.bytes).sum(),
            files: file_list,
            id_check: ds.id_check,
            partitions: PartitionInfo::all_of(ds),
        }
    }
}

fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut i = 0;
    while x >= 1024.0 && i < U.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", U[i])
    }
}

impl fmt::Display for DatasetInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "dataset      {}", self.dir)?;
        writeln!(
            f,
            "nodes        {}\narcs         {}  ({} layout, {}-bit ids, {}-bit offsets, {} self-loops)",
            self.num_nodes,
            self.num_arcs,
            self.layout.as_str(),
            self.id_bits,
            self.offset_bits,
            self.self_loops
        )?;
        let feat = if self.features_present {
            format!("{} x {}", self.feat_dim, self.feat_dtype.as_str())
        } else if self.feat_dim > 0 {
            format!("{} (feat.bin absent)", self.feat_dim)
        } else {
            "none".into()
        };
        writeln!(f, "features     {feat}")?;
        let labels = if self.labels_present {
            format!(
                "{} classes, {} labelled vertices",
                self.num_classes, self.labelled
            )
        } else {
            format!("{} classes (label.bin absent)", self.num_classes)
        };
        writeln!(f, "labels       {labels}")?;
        writeln!(
            f,
            "split        train {} / valid {} / test {}",
            self.train, self.valid, self.test
        )?;
        for (name, d) in [
            ("in-degree ", &self.in_degree),
            ("out-degree", &self.out_degree),
        ] {
            writeln!(
                f,
                "{name}   min {} / median {} / mean {:.2} / p99 {} / max {}  ({} zero)",
                d.min, d.median, d.mean, d.p99, d.max, d.zeros
            )?;
        }
        let ids = match self.id_check {
            IdCheck::Scanned {
                seconds,
                remembered: true,
            } => format!("scanned on this open ({seconds:.3} s), remembered in {STAMP}"),
            IdCheck::Scanned {
                seconds,
                remembered: false,
            } => format!(
                "scanned on this open ({seconds:.3} s), not remembered (read-only folder or files changed in the last 2 s)"
            ),
            IdCheck::Remembered => format!("remembered from an earlier scan ({STAMP})"),
        };
        writeln!(
            f,
            "checked      offsets, labels, split ids on every open; neighbour ids {ids}"
        )?;
        writeln!(
            f,
            "bytes        {} in {} files",
            human_bytes(self.total_bytes),
            self.files.len()
        )?;
        for file in &self.files {
            writeln!(f, "  {:<16} {:>12}", file.name, human_bytes(file.bytes))?;
        }
        Ok(())
    }
}
