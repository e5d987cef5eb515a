//! One module per subcommand, and `residency` and `sampler_args` for flags several of them
//! take (`--device` is opened by `fanout_exec::Compute`).

pub mod cache_sim;
pub mod dataset;
pub mod eval;
pub mod mpi;
pub mod partition;
pub mod report;
pub mod residency;
pub mod sample_bench;
pub mod sampler_args;
pub mod train;
