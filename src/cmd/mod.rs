//! One module per subcommand. Each exposes `Args` (clap) and `run`.

pub mod audit;
pub mod bench;
pub mod eval;
pub mod gateway;
pub mod ingest;
pub mod migrate;
pub mod narrative;
pub mod publish;
pub mod rebuild;
pub mod reshard;
pub mod router;
pub mod simulate;
pub mod validate;
