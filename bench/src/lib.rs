//! weft's benchmarks, behind `weft bench ...`: tools, not product code. Nothing in the
//! product crates depends on this crate; the `weft` binary parses the flags and calls in.
//!
//! Errors are `anyhow`: every one ends as a message to whoever runs the benchmark, as at the
//! binary's own edge.

pub mod route;
