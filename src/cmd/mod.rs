//! One module per subcommand. Each exposes `Args` (clap) and `run`.

pub mod bench;
pub mod gateway;
pub mod migrate;
pub mod publish;
pub mod simulate;
pub mod validate;
