#![warn(missing_docs)]

//! `weft-consumers`: the storage side of weft.
//!
//! - [`decode`]: one Kafka record to a validated [`decode::Fact`] or a dead-letter reason;
//! - [`facts`]: the `weft_events` rows, identity deduplication and exactly-once progress;
//! - [`narrative`]: the per-request narratives (assignment rule, projector, queries);
//! - [`store`]: ClickHouse settings and the migration runner (`weft migrate`);
//! - [`telemetry`]: ingest's own figures (batches, dead letters, lag) in ClickHouse.

pub mod decode;
pub mod facts;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod narrative;
pub mod store;
pub mod telemetry;
