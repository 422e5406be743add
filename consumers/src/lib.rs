#![warn(missing_docs)]

//! `weft-consumers`: the storage side of weft.
//!
//! - [`decode`]: one Kafka record to a validated [`decode::Fact`] or a dead-letter reason;
//! - [`facts`]: identity deduplication and exactly-once progress over `weft_events`;
//! - [`narrative`]: the per-request narratives (assignment rule, projector, rebuild);
//! - [`telemetry`]: ingest's own figures (batches, dead letters, lag) in ClickHouse.
//!
//! The ClickHouse side (the store, migrations, every row and the typed columns) is
//! `weft-store`.

pub mod decode;
pub mod facts;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod narrative;
pub mod telemetry;
