//! `weft-producers`: the publish path.
//!
//! - [`Publisher`]: validates, encodes and sends events to Kafka; an event is confirmed only
//!   once it is durable (acknowledged by Kafka, or written to the on-disk [`spool`]);
//! - [`spool`]: append-only, checksummed segments that hold events while Kafka cannot;
//! - [`gateway`]: the HTTP ingest endpoint for producers that are not written in Rust;
//! - [`config`], [`metrics`]: what those need (API keys live in `weft-http`; the schema
//!   registry client in `weft-kafka`).

#![warn(missing_docs)]

pub mod config;
pub mod gateway;
pub mod metrics;
pub mod publisher;
pub mod spool;

pub use config::{FsyncPolicy, PublisherConfig, ValueFormat};
pub use metrics::Metrics;
pub use publisher::{
    Delivery, PublishError, Publisher, PublisherError, Receipt, RefusedFileError, Republished,
};
