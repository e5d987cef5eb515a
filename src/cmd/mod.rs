//! One module per subcommand.

pub mod dataset;
pub mod sample_bench;
pub mod train;
pub mod eval;
pub mod cache_sim;
