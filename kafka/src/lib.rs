//! `weft-kafka`: what every Kafka client of weft shares.
//!
//! - [`KafkaConfig`]: the `[kafka]` section: brokers and librdkafka properties (SASL/TLS)
//!   written once, with per-role overrides (`[kafka.ingest]`, `[kafka.publisher]`,
//!   `[kafka.router]`) resolved by [`KafkaConfig::client`] into a [`ClientSettings`];
//! - [`ensure_topics`]: the one topic-creation routine (event topics and dead letters);
//! - [`Topics`]: the topic names, re-exported from `weft-schemas`, where the decoder needs
//!   them without linking librdkafka;
//! - [`registry`]: the Confluent schema registry, for the `avro-confluent` content type: the
//!   publisher registers weft's schemas, ingest learns which kind an id it meets stands for.

#![warn(missing_docs)]

mod admin;
mod config;
pub mod registry;

pub use admin::{ensure_topics, TopicError, TopicLayout};
pub use config::{default_brokers, ClientRole, ClientSettings, KafkaConfig, RoleOverride};
pub use weft_schemas::Topics;
