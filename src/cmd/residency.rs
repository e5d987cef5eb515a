//! The residency flag shared by subcommands (`sample-bench --residency`, `train` and `eval
//! --feature-residency`).

use clap::ValueEnum;
use fanout_graph::Residency;

/// `--residency` / `--feature-residency`: where large arrays read at random live.
#[derive(Clone, Copy, ValueEnum)]
pub enum ResidencyArg {
    /// Copied into huge-page memory when it takes at most a quarter of available memory (and
    /// 16 GiB); read from the memory-mapped files otherwise.
    Auto,
    /// Always read the memory-mapped dataset files (no copy).
    Mapped,
    /// Always copied into huge-page memory.
    Resident,
}

impl From<ResidencyArg> for Residency {
    fn from(r: ResidencyArg) -> Residency {
        match r {
            ResidencyArg::Auto => Residency::Auto,
            ResidencyArg::Mapped => Residency::Mapped,
            ResidencyArg::Resident => Residency::Resident,
        }
    }
}
