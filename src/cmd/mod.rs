//! One module per subcommand. Each exposes `Args` (clap) and `run`.

pub mod migrate;
pub mod simulate;
pub mod validate;
