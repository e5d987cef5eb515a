//! One module per subcommand, and `device` for their `--device` flag.

pub mod cache_sim;
pub mod dataset;
pub mod device;
pub mod eval;
pub mod sample_bench;
pub mod train;
