//! Per-request narratives: which events belong together, as a projection of the facts.
//! Their rows and the read side are `weft_store::narrative`.

mod direct;
pub mod filter;
pub mod graph;
pub mod loader;
mod moves;
pub mod projector;
pub mod rebuild;
pub mod reshard;
pub mod shard;
