//! STUB until wt-sampler merges.
use crate::{KHopConfig, KHopSampler, RandomWalkConfig, RandomWalkSampler, RemapKind, Sampler};
use fanout_graph::{Dataset, Residency};
use std::sync::Arc;
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplerKind {
    Khop,
    Weighted,
    Randomwalk,
    Layerwise,
}
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplerSpec {
    pub kind: Option<SamplerKind>,
    pub replace: bool,
    pub residency: Residency,
    pub walks: u32,
    pub walk_length: u32,
    pub stop_prob: f64,
}
impl Default for SamplerSpec {
    fn default() -> Self {
        SamplerSpec {
            kind: None,
            replace: false,
            residency: Residency::Auto,
            walks: 4,
            walk_length: 3,
            stop_prob: 0.5,
        }
    }
}
impl SamplerSpec {
    pub fn build(
        &self,
        ds: &Arc<Dataset>,
        fanouts: Vec<u32>,
        default_kind: SamplerKind,
    ) -> fanout_graph::Result<Arc<dyn Sampler>> {
        Ok(match self.kind.unwrap_or(default_kind) {
            SamplerKind::Randomwalk => Arc::new(RandomWalkSampler::new(
                ds.clone(),
                RandomWalkConfig {
                    top_k: fanouts,
                    ..RandomWalkConfig::default()
                },
            )?),
            _ => Arc::new(KHopSampler::new(
                ds.clone(),
                KHopConfig {
                    fanouts,
                    replace: self.replace,
                    remap: RemapKind::Auto,
                },
            )?),
        })
    }
}
