//! One module per subcommand, and `device` and `residency` for flags several of them take.

pub mod cache_sim;
pub mod dataset;
pub mod device;
pub mod eval;
pub mod mpi;
pub mod residency;
pub mod sample_bench;
pub mod train;
