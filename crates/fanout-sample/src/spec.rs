//! [`SamplerSpec`]: which sampler a run uses and how, as one serde value shared by the
//! library's run config, the command line (`train`, `sample-bench`, `cache-sim`) and the
//! Python package, and [`SamplerSpec::build`], the one place samplers are constructed from it.

use crate::alias::AliasTables;
use crate::khop::{KHopConfig, KHopSampler};
use crate::layerwise::{LayerwiseConfig, LayerwiseSampler};
use crate::randomwalk::{RandomWalkConfig, RandomWalkSampler};
use crate::remap::RemapKind;
use crate::sampler::Sampler;
use crate::weighted::{WeightedConfig, WeightedSampler};
use fanout_graph::{Dataset, Error, NoProgress, Progress, Residency, Result};
use std::sync::Arc;

/// The sampling algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplerKind {
    /// Uniform k-hop neighbour sampling ([`KHopSampler`]).
    Khop,
    /// Weighted k-hop through per-arc alias tables over `weight.bin` ([`WeightedSampler`]).
    Weighted,
    /// PinSAGE random-walk neighbourhoods ([`RandomWalkSampler`]).
    Randomwalk,
    /// LADIES-style layer-wise importance sampling ([`LayerwiseSampler`]).
    Layerwise,
}

impl SamplerKind {
    /// The lower-case name (`khop`, `weighted`, `randomwalk`, `layerwise`).
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Khop => "khop",
            SamplerKind::Weighted => "weighted",
            SamplerKind::Randomwalk => "randomwalk",
            SamplerKind::Layerwise => "layerwise",
        }
    }
}

/// Which sampler and its settings. Fanouts are not part of it: their defaults belong to the
/// model (training) or the command. Unknown fields are refused when deserialising.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplerSpec {
    /// The algorithm; `None`: the caller's default (random walks for PinSAGE, k-hop otherwise).
    pub kind: Option<SamplerKind>,
    /// Draw neighbours with replacement (k-hop, weighted).
    pub replace: bool,
    /// Global-to-local id table.
    pub remap: RemapKind,
    /// Where the topology is read from (a huge-page copy or the mapped files).
    pub residency: Residency,
    /// Random walks per vertex (random walks).
    pub walks: u32,
    /// Maximum steps per walk (random walks).
    pub walk_length: u32,
    /// Probability of stopping a walk after each step, in `[0, 1)` (random walks).
    pub stop_prob: f64,
}

impl Default for SamplerSpec {
    /// The model's default algorithm, without replacement, automatic remapping and residency,
    /// and GNNLab's PinSAGE walks (4 walks of length 3, stop probability 0.5).
    fn default() -> Self {
        SamplerSpec {
            kind: None,
            replace: false,
            remap: RemapKind::Auto,
            residency: Residency::Auto,
            walks: 4,
            walk_length: 3,
            stop_prob: 0.5,
        }
    }
}

/// A sampler built by [`SamplerSpec::build_with`], with what the user should be told about it.
pub struct BuiltSampler {
    /// The sampler.
    pub sampler: Arc<dyn Sampler>,
    /// A line about how it was set up (e.g. whether alias tables were loaded or built).
    pub note: Option<String>,
    /// The alias tables a weighted sampler draws with (for another sampler of the same
    /// draws, such as a GPU one); `None` for the other kinds.
    pub tables: Option<Arc<AliasTables>>,
}

impl SamplerSpec {
    /// The algorithm in effect: `self.kind`, else `default_kind`.
    pub fn kind_or(&self, default_kind: SamplerKind) -> SamplerKind {
        self.kind.unwrap_or(default_kind)
    }

    /// Checks the settings that do not depend on the dataset: the random walks' settings,
    /// unless another sampler is named (they are not used then).
    pub fn validate(&self) -> Result<()> {
        if self.kind.is_some_and(|k| k != SamplerKind::Randomwalk) {
            return Ok(());
        }
        if !(0.0..1.0).contains(&self.stop_prob) {
            return Err(Error::Invalid(format!(
                "--stop-prob {} (stop_prob): a random walk's stop probability must be in [0, 1)",
                self.stop_prob
            )));
        }
        if self.walks == 0 || self.walk_length == 0 {
            return Err(Error::Invalid(format!(
                "--walks {} and --walk-length {} (walks, walk_length): random walks need at \
                 least one walk of at least one step",
                self.walks, self.walk_length
            )));
        }
        Ok(())
    }

    /// Builds the sampler of [`SamplerSpec::kind_or`]`(default_kind)` over `ds` with
    /// hop-order `fanouts` (k-hop and weighted: neighbours per vertex; random walks: top-k
    /// per layer; layer-wise: vertices per layer). Weighted sampling loads the alias tables
    /// saved beside the dataset or builds and saves them once (needs `weight.bin`).
    pub fn build(
        &self,
        ds: &Arc<Dataset>,
        fanouts: Vec<u32>,
        default_kind: SamplerKind,
    ) -> Result<Arc<dyn Sampler>> {
        Ok(self
            .build_with(ds, fanouts, default_kind, &NoProgress)?
            .sampler)
    }

    /// [`SamplerSpec::build`], reporting the alias tables' construction to `progress`.
    pub fn build_with(
        &self,
        ds: &Arc<Dataset>,
        fanouts: Vec<u32>,
        default_kind: SamplerKind,
        progress: &dyn Progress,
    ) -> Result<BuiltSampler> {
        self.validate()?;
        let (remap, residency) = (self.remap, self.residency);
        let mut note = None;
        let mut alias = None;
        let sampler: Arc<dyn Sampler> = match self.kind_or(default_kind) {
            SamplerKind::Khop => {
                let cfg = KHopConfig {
                    fanouts,
                    replace: self.replace,
                    remap,
                };
                Arc::new(KHopSampler::new(ds.clone(), cfg)?.with_residency(residency))
            }
            SamplerKind::Weighted => {
                let tables = Arc::new(AliasTables::load_or_build(ds, progress)?);
                note = Some(format!("alias tables: {}", tables.origin));
                alias = Some(tables.clone());
                let cfg = WeightedConfig {
                    fanouts,
                    replace: self.replace,
                    remap,
                };
                Arc::new(WeightedSampler::new(ds.clone(), cfg, tables)?.with_residency(residency))
            }
            SamplerKind::Randomwalk => {
                let cfg = RandomWalkConfig {
                    top_k: fanouts,
                    walks: self.walks,
                    length: self.walk_length,
                    stop_prob: self.stop_prob,
                    remap,
                };
                Arc::new(RandomWalkSampler::new(ds.clone(), cfg)?.with_residency(residency))
            }
            SamplerKind::Layerwise => {
                let cfg = LayerwiseConfig {
                    layer_sizes: fanouts,
                    remap,
                };
                Arc::new(LayerwiseSampler::new(ds.clone(), cfg)?.with_residency(residency))
            }
        };
        Ok(BuiltSampler {
            sampler,
            note,
            tables: alias,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::minibatch::BatchKey;
    use crate::testutil::random_graph;

    #[test]
    fn round_trips_through_json_with_defaults_and_refuses_unknown_fields() {
        let s = SamplerSpec {
            kind: Some(SamplerKind::Layerwise),
            replace: true,
            remap: RemapKind::Hash,
            residency: Residency::Mapped,
            ..SamplerSpec::default()
        };
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<SamplerSpec>(&j).unwrap(), s);
        let partial: SamplerSpec = serde_json::from_str(r#"{"kind":"weighted"}"#).unwrap();
        assert_eq!(partial.kind, Some(SamplerKind::Weighted));
        assert_eq!(partial.walks, 4);
        assert!(serde_json::from_str::<SamplerSpec>(r#"{"walk":3}"#).is_err());
        assert!(serde_json::from_str::<SamplerSpec>(r#"{"kind":"bfs"}"#).is_err());
    }

    #[test]
    fn builds_the_samplers_the_commands_built_and_checks_settings() {
        let ds = random_graph(2000, 50, 3);
        let key = BatchKey {
            seed: 1,
            epoch: 0,
            step: 2,
        };
        let seeds: Vec<u32> = (0..40).collect();
        let spec = SamplerSpec::default();
        let built = spec.build(&ds, vec![5, 3], SamplerKind::Khop).unwrap();
        let direct = KHopSampler::new(
            ds.clone(),
            KHopConfig {
                fanouts: vec![5, 3],
                replace: false,
                remap: RemapKind::Auto,
            },
        )
        .unwrap();
        let (a, b) = (
            built.sample(&seeds, key).unwrap(),
            direct.sample(&seeds, key).unwrap(),
        );
        assert_eq!(a.input_nodes, b.input_nodes);
        assert_eq!(built.name(), direct.name());
        for (kind, name) in [
            (
                SamplerKind::Randomwalk,
                RandomWalkSampler::new(
                    ds.clone(),
                    RandomWalkConfig {
                        top_k: vec![3, 3],
                        ..RandomWalkConfig::default()
                    },
                )
                .unwrap()
                .name(),
            ),
            (
                SamplerKind::Layerwise,
                LayerwiseSampler::new(
                    ds.clone(),
                    LayerwiseConfig {
                        layer_sizes: vec![30, 30],
                        remap: RemapKind::Auto,
                    },
                )
                .unwrap()
                .name(),
            ),
        ] {
            let s = SamplerSpec {
                kind: Some(kind),
                ..SamplerSpec::default()
            };
            let built = s.build(&ds, vec![3, 3], SamplerKind::Khop).unwrap();
            assert_eq!(built.name(), name);
            assert_eq!(built.num_layers(), 2);
            built.sample(&seeds, key).unwrap().validate().unwrap();
        }
        let bad = SamplerSpec {
            stop_prob: 1.0,
            ..SamplerSpec::default()
        };
        assert!(bad.build(&ds, vec![3], SamplerKind::Khop).is_err());
        // Weighted sampling without weight.bin: a clean error.
        let w = SamplerSpec {
            kind: Some(SamplerKind::Weighted),
            ..SamplerSpec::default()
        };
        assert!(w.build(&ds, vec![3], SamplerKind::Khop).is_err());
    }
}
