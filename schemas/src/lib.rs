//! `weft-schemas`: everything weft knows about what an event *is*.
//!
//! - [`contracts`]: typed weaver-spec 0.9.0 contracts that keep unknown and extension keys;
//! - [`validate`] and [`conformance`]: JSON Schema validation and the single-document
//!   invariant checks (I-01, I-02, I-06), against the spec files embedded by [`spec`];
//! - [`Envelope`] and [`Kind`]: the unit that travels through weft;
//! - [`strict`]: JSON parsed with duplicate keys refused (one reading of a payload);
//! - [`identity`]: natural ids and RFC 8785 content hashes;
//! - [`wire`] and [`avro`]: the Kafka record layout and the JSON / Avro encodings;
//! - [`migrations`]: the ClickHouse DDL, versioned;
//! - [`ports`]: the default ports of every weft service and of the local stack.
//!
//! No I/O lives here: producers, consumers, the router and the audit tools all depend on
//! this crate, so it stays small, synchronous and free of network clients.

#![warn(missing_docs)]

pub mod avro;
pub mod conformance;
pub mod contracts;
pub mod envelope;
pub mod extensions;
pub mod identity;
pub mod kind;
pub mod links;
pub mod migrations;
pub mod ports;
pub mod spec;
pub mod strict;
pub mod time;
pub mod topics;
pub mod validate;
pub mod wire;

pub use envelope::{Envelope, EnvelopeError, DEFAULT_TENANT};
pub use kind::Kind;
pub use topics::Topics;
pub use validate::{Validator, Violation};
