//! The named graph shapes (`--preset`) and their parameters.
//!
//! Each preset mimics one of the papers' datasets (degrees, density, classes, feature width,
//! split sizes) at a chosen number of vertices; the default scales generate in seconds on a
//! laptop, and `nodes` reproduces the full-scale size where memory allows (products: 2,449,029).

use crate::features::SplitFractions;

/// A named graph shape. `FromStr` accepts the lower-case [`Preset::name`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// A few thousand vertices and small dimensions, for tests and quick trials.
    Tiny,
    /// ogbn-products: co-purchase graph, power-law degrees, ~50 arcs per vertex.
    Products,
    /// ogbn-papers100M: citation graph, less skewed degrees, tiny training set.
    Papers,
    /// Twitter follower graph (GNNLab's TW): very heavy power law.
    Twitter,
    /// uk-2006 web crawl (GNNLab's UK): strong id locality, hosts are contiguous id blocks.
    Uk,
}

impl Preset {
    /// Every preset, in the order `--help` lists them.
    pub const ALL: [Preset; 5] = [
        Preset::Tiny,
        Preset::Products,
        Preset::Papers,
        Preset::Twitter,
        Preset::Uk,
    ];

    /// The name `FromStr` accepts and summaries print.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Products => "products",
            Preset::Papers => "papers",
            Preset::Twitter => "twitter",
            Preset::Uk => "uk",
        }
    }

    /// One line for `--help`: what the preset mimics and its default scale.
    pub fn describe(self) -> &'static str {
        match self {
            Preset::Tiny => "4,096 vertices, ~12 arcs each, 4 classes, 16-dim features (tests)",
            Preset::Products => {
                "ogbn-products-like: power law, ~50 arcs/vertex, 47 classes, 100-dim, 8% train; \
                 default 250k vertices, full scale --nodes 2449029"
            }
            Preset::Papers => {
                "ogbn-papers100M-like: citations, milder skew, ~29 arcs/vertex, 172 classes, \
                 128-dim, 1.1% train drawn from 3 communities (like arXiv inside papers100M); \
                 default 1M vertices"
            }
            Preset::Twitter => {
                "twitter-like: very heavy power law, ~36 arcs/vertex, 64 classes, 256-dim, \
                 1% train; default 500k vertices"
            }
            Preset::Uk => {
                "uk-2006-like web crawl: hosts are id blocks, 80% of edges inside a host, \
                 ~38 arcs/vertex, 64 classes, 256-dim, 1% train; default 500k vertices"
            }
        }
    }

    /// The default number of vertices (generates in seconds to a minute on two cores).
    pub fn default_nodes(self) -> u64 {
        match self {
            Preset::Tiny => 4096,
            Preset::Products => 250_000,
            Preset::Papers => 1_000_000,
            Preset::Twitter | Preset::Uk => 500_000,
        }
    }

    /// The preset's parameters at `nodes` vertices (`None`: [`Preset::default_nodes`]). Only
    /// `max_degree` depends on the scale: it follows the power law's natural cutoff,
    /// `reference max x (nodes / reference nodes)^(1 / (exponent - 1))`, from the real dataset's
    /// largest degree at its real size, kept within `[avg_degree, nodes / 4]`. Average degree,
    /// exponent, homophily, locality, classes, feature width and signal, and split fractions
    /// are the same at every scale.
    pub fn config(self, nodes: Option<u64>) -> PresetConfig {
        let nodes = nodes.unwrap_or_else(|| self.default_nodes());
        let split = |train, valid, test| SplitFractions { train, valid, test };
        // (largest degree, vertex count) of the dataset each preset mimics; papers' and uk's
        // largest degrees are approximate.
        let (ref_max, ref_nodes) = match self {
            Preset::Tiny => (200.0, 4096.0),
            Preset::Products => (17_481.0, 2_449_029.0),
            Preset::Papers => (10_000.0, 111_059_956.0),
            Preset::Twitter => (3_000_000.0, 41_652_230.0),
            Preset::Uk => (1_000_000.0, 77_741_046.0),
        };
        let base = PresetConfig {
            preset: self.name().to_string(),
            nodes,
            avg_degree: 0.0,
            degree_exponent: 0.0,
            max_degree: 0.0,
            homophily: 0.0,
            locality: 0.0,
            host_size: 0,
            classes: 0,
            feat_dim: 0,
            feature_signal: 0.0,
            split: split(0.0, 0.0, 0.0),
            labelled_classes: 0,
        };
        let cfg = match self {
            Preset::Tiny => PresetConfig {
                avg_degree: 12.0,
                degree_exponent: 2.5,
                homophily: 0.8,
                classes: 4,
                feat_dim: 16,
                feature_signal: 0.3,
                split: split(0.2, 0.1, 0.1),
                ..base
            },
            // ogbn-products: 2,449,029 vertices, 123,718,280 arcs (50.5 per vertex), largest
            // degree 17,481 (0.71% of the vertices), edge homophily 0.81; split 8% / 1.6% / 88%,
            // of which we keep a 5% test set so that evaluation stays cheap.
            Preset::Products => PresetConfig {
                avg_degree: 50.5,
                degree_exponent: 2.3,
                homophily: 0.81,
                classes: 47,
                feat_dim: 100,
                feature_signal: 0.12,
                split: split(0.08, 0.02, 0.05),
                ..base
            },
            // ogbn-papers100M: 111M vertices, 1.6B citations (29 arcs per vertex symmetrised),
            // 172 arXiv subject classes, 128-dim; split 1.09% / 0.11% / 0.19%. Only the arXiv
            // papers (1.4% of the graph) are labelled, so the split sits in one region of the
            // citation graph: here, the vertices of 3 of the 172 communities (1.7%). This is
            // what makes pre-sampling beat the degree cache on papers100M (GNNLab Figure 5).
            Preset::Papers => PresetConfig {
                avg_degree: 29.0,
                degree_exponent: 3.0,
                homophily: 0.65,
                classes: 172,
                feat_dim: 128,
                feature_signal: 0.12,
                split: split(0.011, 0.0011, 0.0019),
                labelled_classes: 3,
                ..base
            },
            // GNNLab's Twitter: 41.7M vertices, 1.47B arcs (35.3 per vertex), no labels of its
            // own (GNNLab draws them at random; ours are planted so that accuracy means
            // something); 1% train.
            Preset::Twitter => PresetConfig {
                avg_degree: 36.0,
                degree_exponent: 2.0,
                homophily: 0.6,
                classes: 64,
                feat_dim: 256,
                feature_signal: 0.1,
                split: split(0.01, 0.001, 0.002),
                ..base
            },
            // GNNLab's UK (uk-2006): 77.7M vertices, 2.97B arcs (38 per vertex); web crawls
            // keep most links inside a host and number pages host by host.
            Preset::Uk => PresetConfig {
                avg_degree: 38.0,
                degree_exponent: 2.1,
                homophily: 0.85,
                locality: 0.8,
                host_size: 256,
                classes: 64,
                feat_dim: 256,
                feature_signal: 0.1,
                split: split(0.01, 0.001, 0.002),
                ..base
            },
        };
        let alpha = 1.0 / (cfg.degree_exponent - 1.0);
        let max_degree = (ref_max * (nodes as f64 / ref_nodes).powf(alpha))
            .min(nodes as f64 / 4.0)
            .max(cfg.avg_degree);
        PresetConfig { max_degree, ..cfg }
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
                format!("unknown preset {s:?}; expected one of {}", names.join(", "))
            })
    }
}

/// Every knob of the generator. [`Preset::config`] fills it; callers may change any field before
/// calling [`crate::generate()`], which validates it (see [`PresetConfig::validate`]).
///
/// The model is a degree-corrected stochastic block model (Chung-Lu weights inside planted
/// communities): each edge picks one end with probability proportional to its weight, then the
/// other end inside the first end's host (probability `locality`), inside its class (a
/// probability the generator calibrates so the stored graph's homophily meets `homophily`), or
/// anywhere, each time proportionally to weight. Expected degrees are proportional to weights.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PresetConfig {
    /// The preset's name (recorded in summaries).
    pub preset: String,
    /// Number of vertices (2 to 2^32 - 1).
    pub nodes: u64,
    /// Target stored arcs per vertex after symmetrisation, deduplication and loop removal (the
    /// generator calibrates its edge count to meet it, typically within 1%; a target that would
    /// need more than 16 draws per stored edge, i.e. a nearly complete graph, falls short).
    pub avg_degree: f64,
    /// Power-law exponent of the degree distribution's tail (P(deg = k) ~ k^-exponent); smaller
    /// is more skewed. Must exceed 1.
    pub degree_exponent: f64,
    /// Largest expected degree (caps the power law's head; at or below `avg_degree` the weights
    /// are uniform). The realised maximum is somewhat lower because repeated edges between hubs
    /// collapse.
    pub max_degree: f64,
    /// Target fraction of stored arcs whose two ends share a class.
    pub homophily: f64,
    /// Probability that an edge stays inside its first end's host (0 = no hosts).
    pub locality: f64,
    /// Mean host size in vertices when `locality > 0`: hosts are contiguous id blocks with
    /// Pareto-distributed sizes, each host entirely in one class.
    pub host_size: u64,
    /// Number of classes (planted communities); labels are `0..classes`.
    pub classes: u64,
    /// Feature width.
    pub feat_dim: u64,
    /// Scale of the class centroids relative to unit feature noise (see
    /// [`crate::write_class_features`]): small enough that one vertex's features classify
    /// poorly, so neighbourhoods matter.
    pub feature_signal: f32,
    /// Train / valid / test fractions of the vertex set (disjoint, uniformly drawn from the
    /// labelled region).
    pub split: SplitFractions,
    /// The labelled region: 0 = every vertex; k > 0 = the vertices of classes `0..k` only, so
    /// the splits sit in k communities (papers100M's labelled arXiv papers inside the citation
    /// graph). When those classes hold fewer vertices than the splits need (small graphs), the
    /// generator adds classes `k, k + 1, ..` until they fit.
    pub labelled_classes: u64,
}

impl PresetConfig {
    /// Checks every field's range; the error names the field, its value and the allowed range.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |field: &str, value: String, want: &str| {
            Err(format!(
                "preset {}: {field} = {value}, expected {want}",
                self.preset
            ))
        };
        if !(2..=u32::MAX as u64).contains(&self.nodes) {
            return bad("nodes", self.nodes.to_string(), "2 to 2^32 - 1");
        }
        if !(self.avg_degree >= 0.0 && self.avg_degree <= (self.nodes - 1) as f64 / 2.0) {
            return bad(
                "avg_degree",
                self.avg_degree.to_string(),
                "0 to (nodes - 1) / 2",
            );
        }
        if !(self.degree_exponent > 1.0 && self.degree_exponent.is_finite()) {
            return bad("degree_exponent", self.degree_exponent.to_string(), "> 1");
        }
        if !(self.max_degree >= 0.0 && self.max_degree < self.nodes as f64) {
            return bad("max_degree", self.max_degree.to_string(), "in [0, nodes)");
        }
        if !(0.0..=1.0).contains(&self.homophily) {
            return bad("homophily", self.homophily.to_string(), "in [0, 1]");
        }
        if !(0.0..1.0).contains(&self.locality) {
            return bad("locality", self.locality.to_string(), "in [0, 1)");
        }
        if self.locality > 0.0 && self.host_size < 2 {
            return bad(
                "host_size",
                self.host_size.to_string(),
                "at least 2 when locality > 0",
            );
        }
        if !(1..=u32::MAX as u64).contains(&self.classes) {
            return bad("classes", self.classes.to_string(), "1 to 2^32 - 1");
        }
        if self.labelled_classes > self.classes {
            return bad(
                "labelled_classes",
                self.labelled_classes.to_string(),
                &format!("0 (all) to classes = {}", self.classes),
            );
        }
        if !(self.feature_signal >= 0.0 && self.feature_signal.is_finite()) {
            return bad("feature_signal", self.feature_signal.to_string(), ">= 0");
        }
        // The generator holds one centroid of feat_dim floats per class, and writes
        // nodes x feat_dim values.
        if !matches!(self.feat_dim.checked_mul(self.classes), Some(x) if x <= crate::MAX_CENTROID_VALUES)
            || !matches!(self.feat_dim.checked_mul(self.nodes), Some(x) if x <= fanout_graph::meta::MAX_ELEMENTS)
        {
            return bad(
                "feat_dim",
                self.feat_dim.to_string(),
                &format!(
                    "at most 2^28 / classes ({}) and nodes x feat_dim at most 2^58",
                    self.classes
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_configs_validate() {
        for p in Preset::ALL {
            assert_eq!(p.name().parse::<Preset>().unwrap(), p);
            assert_eq!(p.to_string(), p.name());
            assert!(!p.describe().contains('\n'));
            let c = p.config(None);
            assert_eq!((c.nodes, c.preset.as_str()), (p.default_nodes(), p.name()));
            c.validate().unwrap();
            assert_eq!(p.config(Some(123)).nodes, 123);
        }
        let e = "product".parse::<Preset>().unwrap_err();
        assert!(e.contains("expected one of tiny, products"), "{e}");
        let mut c = Preset::Tiny.config(Some(1));
        assert!(c.validate().unwrap_err().contains("nodes = 1"));
        c.nodes = 100;
        c.degree_exponent = 1.0;
        assert!(c.validate().unwrap_err().contains("degree_exponent"));
    }
}
