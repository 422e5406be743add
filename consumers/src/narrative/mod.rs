//! Per-request narratives: which events belong together, as a projection of the facts.

pub mod graph;
pub mod projector;
pub mod query;
pub mod rebuild;
