//! The sampler flags shared by `train`, `sample-bench` and `cache-sim`: one clap group that
//! becomes a [`SamplerSpec`], so every sampler and setting is reachable from every command.

use crate::cmd::residency::ResidencyArg;
use clap::{Args, ValueEnum};
use fanout_sample::{RemapKind, SamplerKind, SamplerSpec};

/// `--sampler`, `--replace`, `--remap`, `--residency` and the random-walk settings.
#[derive(Args, Clone, Default)]
pub struct SamplerArgs {
    /// Sampling algorithm (default: randomwalk for `train --model pinsage`, khop otherwise).
    #[arg(long, value_enum)]
    pub sampler: Option<SamplerArg>,
    /// Sample neighbours with replacement (khop, weighted); `--replace=false` turns off what
    /// a run config turns on.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub replace: Option<bool>,
    /// Global-to-local id table [default: auto].
    #[arg(long, value_enum)]
    pub remap: Option<RemapArg>,
    /// Where the topology is read from: a resident huge-page copy (auto: when it takes at most
    /// a quarter of available memory) or the memory-mapped files [default: auto].
    #[arg(long, value_enum)]
    pub residency: Option<ResidencyArg>,
    /// Random walks per vertex (randomwalk) [default: 4].
    #[arg(long)]
    pub walks: Option<u32>,
    /// Maximum steps per walk (randomwalk) [default: 3].
    #[arg(long)]
    pub walk_length: Option<u32>,
    /// Probability of stopping a walk after each step (randomwalk) [default: 0.5].
    #[arg(long)]
    pub stop_prob: Option<f64>,
}

/// The algorithms `--sampler` accepts.
#[derive(Clone, Copy, ValueEnum)]
pub enum SamplerArg {
    /// Uniform k-hop neighbour sampling.
    Khop,
    /// Weighted k-hop through alias tables (needs weight.bin; tables are built and saved once).
    Weighted,
    /// PinSAGE random-walk neighbourhoods.
    Randomwalk,
    /// LADIES-style layer-wise importance sampling.
    Layerwise,
}

/// The tables `--remap` accepts.
#[derive(Clone, Copy, ValueEnum)]
pub enum RemapArg {
    /// Dense for small graphs or dense batches, hash otherwise.
    Auto,
    /// One slot per graph vertex.
    Dense,
    /// Concurrent open-addressing hash table (FastGL Fused-Map).
    Hash,
}

impl SamplerArgs {
    /// Sets in `spec` every setting given on the command line (others keep their values).
    pub fn apply(&self, spec: &mut SamplerSpec) {
        if let Some(k) = self.sampler {
            spec.kind = Some(match k {
                SamplerArg::Khop => SamplerKind::Khop,
                SamplerArg::Weighted => SamplerKind::Weighted,
                SamplerArg::Randomwalk => SamplerKind::Randomwalk,
                SamplerArg::Layerwise => SamplerKind::Layerwise,
            });
        }
        if let Some(r) = self.replace {
            spec.replace = r;
        }
        if let Some(r) = self.remap {
            spec.remap = match r {
                RemapArg::Auto => RemapKind::Auto,
                RemapArg::Dense => RemapKind::Dense,
                RemapArg::Hash => RemapKind::Hash,
            };
        }
        if let Some(r) = self.residency {
            spec.residency = r.into();
        }
        if let Some(w) = self.walks {
            spec.walks = w;
        }
        if let Some(l) = self.walk_length {
            spec.walk_length = l;
        }
        if let Some(p) = self.stop_prob {
            spec.stop_prob = p;
        }
    }

    /// The spec of these flags over the defaults.
    pub fn spec(&self) -> SamplerSpec {
        let mut s = SamplerSpec::default();
        self.apply(&mut s);
        s
    }
}
