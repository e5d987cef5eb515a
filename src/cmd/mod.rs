//! One module per subcommand.

pub mod dataset;
