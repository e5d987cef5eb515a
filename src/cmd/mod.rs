//! One module per subcommand, and `device`, `residency` and `sampler_args` for flags several
//! of them take.

pub mod cache_sim;
pub mod dataset;
pub mod device;
pub mod eval;
pub mod mpi;
pub mod partition;
pub mod report;
pub mod residency;
pub mod sample_bench;
pub mod sampler_args;
pub mod train;
