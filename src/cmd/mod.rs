//! One module per subcommand.

pub mod cache_sim;
pub mod dataset;
pub mod eval;
pub mod sample_bench;
pub mod train;
