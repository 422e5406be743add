#![warn(missing_docs)]

//! `weft-store`: weft's ClickHouse side, in one place.
//!
//! - [`Store`], [`ClickHouseConfig`] and the migration runner (`weft migrate`; the migration
//!   files are `schemas/clickhouse/`, embedded by `weft-schemas`), with the generic
//!   [`insert`] and [`check_columns`];
//! - [`events`]: the facts table's row ([`events::EventRow`]) and the one derivation of the
//!   payload's typed columns ([`events::typed_columns`]), used by ingest and by the audit;
//! - [`chain`]: the hash chain's view of a fact ([`chain::ChainRow`]) and the unsealed check's;
//! - [`search`]: a search hit, its query and CSV header;
//! - [`narrative`]: the narrative tables' rows and the narrative read ([`narrative::query`]);
//! - [`router`]: the router's reads (aggregates, decisions joined with their feedback);
//! - [`telemetry`]: ingest's telemetry tables' rows and its quarantine's;
//! - [`ids`]: the id hash Rust and ClickHouse share, and id lists cut to fit a parameter;
//! - [`ddl`]: the columns the migrations declare, for the code to check itself against.
//!
//! No Kafka here: the audit reads ClickHouse through this crate without linking rdkafka.

pub mod chain;
pub mod ddl;
pub mod events;
pub mod ids;
pub mod narrative;
pub mod native;
pub mod router;
pub mod search;
mod store;
pub mod telemetry;

pub use events::{
    typed_columns, EventRow, Fact, FloorRow, StoredColumns, TypedColumns, INGEST_FLOOR,
};
pub use native::{insert_native, insert_native_as};
pub use store::{
    check_columns, insert, unless_stopped, ClickHouseConfig, Compression, MigrateReport, Stopped,
    Store, StoreError, EARLIER_INSERTS_ROUND,
};

#[cfg(test)]
mod tests;
