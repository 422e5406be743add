//! All of weft's configuration, in one place.
//!
//! Precedence, highest first: command-line flags, `WEFT_*` environment variables, the TOML
//! file given by `--config` / `WEFT_CONFIG`, built-in defaults. Flags and environment are
//! declared together on [`GlobalArgs`] (clap reads both); the TOML file maps onto
//! [`Settings`], whose sections are the libraries' own config types.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;
use tracing::warn;
use weft_kafka::{ClientRole, KafkaConfig, RoleOverride};
use weft_store::{ClickHouseConfig, Compression};

/// Options every subcommand accepts.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// TOML file with `[kafka]` and `[clickhouse]` sections (see `deploy/weft.example.toml`).
    #[arg(long, global = true, env = "WEFT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Kafka bootstrap servers, comma-separated.
    #[arg(
        long,
        global = true,
        env = "WEFT_KAFKA_BROKERS",
        value_name = "HOST:PORT,..."
    )]
    pub brokers: Option<String>,

    /// ClickHouse HTTP URL.
    #[arg(long, global = true, env = "WEFT_CLICKHOUSE_URL", value_name = "URL")]
    pub clickhouse_url: Option<String>,

    /// ClickHouse database holding weft's tables.
    #[arg(
        long,
        global = true,
        env = "WEFT_CLICKHOUSE_DATABASE",
        value_name = "NAME"
    )]
    pub clickhouse_database: Option<String>,

    /// ClickHouse user.
    #[arg(long, global = true, env = "WEFT_CLICKHOUSE_USER", value_name = "USER")]
    pub clickhouse_user: Option<String>,

    /// ClickHouse password (prefer the environment variable over the flag).
    #[arg(
        long,
        global = true,
        env = "WEFT_CLICKHOUSE_PASSWORD",
        hide_env_values = true
    )]
    pub clickhouse_password: Option<String>,

    /// HTTP body compression to and from ClickHouse: `auto` (LZ4 unless the URL is
    /// loopback), `lz4` or `none`.
    #[arg(
        long,
        global = true,
        env = "WEFT_CLICKHOUSE_COMPRESSION",
        value_name = "MODE",
        value_parser = parse_compression
    )]
    pub clickhouse_compression: Option<Compression>,

    /// Log format on stderr.
    #[arg(
        long,
        global = true,
        env = "WEFT_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The merged configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Every Kafka client: brokers and librdkafka properties (SASL/TLS) once, and
    /// `[kafka.ingest]`, `[kafka.publisher]`, `[kafka.router]` overrides.
    pub kafka: KafkaConfig,
    pub clickhouse: ClickHouseConfig,
    /// `weft publish`, `weft gateway`, `weft bench`: the Publisher (empty brokers = `[kafka]`).
    pub publisher: weft_producers::PublisherConfig,
    /// `weft gateway`: listen address, API keys, body limit.
    pub gateway: weft_producers::gateway::GatewayConfig,
    /// `weft ingest`: consumer group, batching, roles (empty brokers = `[kafka]`).
    pub ingest: weft_consumers::ingest::IngestConfig,
    /// `weft router`: its flags by name (`listen`, `refresh_ms`, `policy`...), see
    /// [`crate::config_flags`].
    pub router: toml::Table,
    /// `weft eval`: its flags by name.
    pub eval: toml::Table,
    /// `weft audit`: its flags by name.
    pub audit: toml::Table,
}

impl Settings {
    /// Merge defaults, the TOML file, then environment and flags.
    pub fn load(args: &GlobalArgs) -> anyhow::Result<Self> {
        let mut s = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config file {}", path.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("parsing config file {}", path.display()))?
            }
            None => Settings::default(),
        };
        if let Some(v) = &args.brokers {
            s.kafka.brokers = v.clone();
        }
        s.resolve_kafka();
        let ch = &mut s.clickhouse;
        if let Some(v) = &args.clickhouse_url {
            ch.url = v.clone();
        }
        if let Some(v) = &args.clickhouse_database {
            ch.database = v.clone();
        }
        if let Some(v) = &args.clickhouse_user {
            ch.user = v.clone();
        }
        if let Some(v) = &args.clickhouse_password {
            ch.password = v.clone();
        }
        if let Some(v) = args.clickhouse_compression {
            ch.compression = v;
        }
        Ok(s)
    }

    /// Fill the publisher's and ingest's client settings from `[kafka]` and their role's
    /// overrides, folding in the deprecated per-section keys (`[publisher] brokers`,
    /// `[publisher.kafka_properties]`, and the same under `[ingest]`) with a warning. As
    /// before, the deprecated publisher keys also reach the router, which had no others.
    fn resolve_kafka(&mut self) {
        let p = &mut self.publisher;
        for role in [&mut self.kafka.publisher, &mut self.kafka.router] {
            fold_deprecated(role, &p.brokers, &p.kafka_properties);
        }
        warn_deprecated("publisher", &p.brokers, &p.kafka_properties);
        let i = &mut self.ingest;
        fold_deprecated(&mut self.kafka.ingest, &i.brokers, &i.kafka_properties);
        warn_deprecated("ingest", &i.brokers, &i.kafka_properties);
        let c = self.kafka.client(ClientRole::Publisher);
        (self.publisher.brokers, self.publisher.kafka_properties) = (c.brokers, c.properties);
        let c = self.kafka.client(ClientRole::Ingest);
        (self.ingest.brokers, self.ingest.kafka_properties) = (c.brokers, c.properties);
    }

    /// The settings `weft router` publishes with: the publisher's, with the router's own
    /// Kafka client settings (`[kafka.router]` over `[kafka]`).
    pub fn for_router(&self) -> Settings {
        let mut s = self.clone();
        let c = self.kafka.client(ClientRole::Router);
        (s.publisher.brokers, s.publisher.kafka_properties) = (c.brokers, c.properties);
        s
    }
}

/// `--clickhouse-compression` / `WEFT_CLICKHOUSE_COMPRESSION`.
fn parse_compression(s: &str) -> Result<Compression, String> {
    match s {
        "auto" => Ok(Compression::Auto),
        "lz4" => Ok(Compression::Lz4),
        "none" => Ok(Compression::None),
        _ => Err(format!("expected auto, lz4 or none, got `{s}`")),
    }
}

/// A deprecated section key becomes the role's override where the role sets none.
fn fold_deprecated(role: &mut RoleOverride, brokers: &str, props: &BTreeMap<String, String>) {
    if role.brokers.is_empty() {
        role.brokers = brokers.to_owned();
    }
    for (k, v) in props {
        role.properties
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
}

fn warn_deprecated(section: &str, brokers: &str, props: &BTreeMap<String, String>) {
    if !brokers.is_empty() {
        warn!(
            "`[{section}] brokers` is deprecated: use `[kafka.{section}] brokers` (or `[kafka] brokers` for every client)"
        );
    }
    if !props.is_empty() {
        warn!(
            "`[{section}.kafka_properties]` is deprecated: use `[kafka.{section}.properties]` (or `[kafka.properties]` for every client)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        g: GlobalArgs,
    }

    #[test]
    fn flags_override_file_which_overrides_defaults() {
        // Only keys the test environment never sets (WEFT_CLICKHOUSE_DATABASE, _USER) are
        // asserted from the file, so the stack's exported WEFT_* variables cannot interfere.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("weft.toml");
        std::fs::write(
            &file,
            "[kafka]\nbrokers = \"k:1\"\n[clickhouse]\nurl = \"http://file:1\"\ndatabase = \"filedb\"\n",
        )
        .unwrap();
        let t = T::try_parse_from([
            "weft",
            "--config",
            file.to_str().unwrap(),
            "--clickhouse-url",
            "http://flag:2",
        ])
        .unwrap();
        let s = Settings::load(&t.g).unwrap();
        assert_eq!(s.clickhouse.url, "http://flag:2");
        assert_eq!(s.clickhouse.database, "filedb");
        assert_eq!(s.clickhouse.user, "default");
    }

    #[test]
    fn compression_comes_from_the_file_or_the_flag() {
        let s = load("[clickhouse]\ncompression = \"lz4\"\n");
        assert_eq!(s.clickhouse.compression, Compression::Lz4);
        assert_eq!(
            Settings::default().clickhouse.compression,
            Compression::Auto
        );
        let t = T::try_parse_from(["weft", "--clickhouse-compression", "none"]).unwrap();
        assert_eq!(t.g.clickhouse_compression, Some(Compression::None));
        let bad = T::try_parse_from(["weft", "--clickhouse-compression", "zstd"]);
        assert!(bad.is_err_and(|e| e.to_string().contains("expected auto, lz4 or none")));
    }

    #[test]
    fn the_example_config_parses() {
        let s: Settings = toml::from_str(include_str!("../deploy/weft.example.toml")).unwrap();
        assert_eq!(s.ingest.batch_max_rows, 50_000);
        assert_eq!(s.publisher.topics.prefix, "weaver.");
    }

    fn load(text: &str) -> Settings {
        let mut s: Settings = toml::from_str(text).unwrap();
        s.resolve_kafka();
        s
    }

    #[test]
    fn kafka_properties_written_once_reach_every_client_and_roles_override() {
        let s = load(
            "[kafka]\nbrokers = \"k:1\"\n[kafka.properties]\n\"security.protocol\" = \"SASL_SSL\"\n\
             [kafka.router]\nbrokers = \"r:1\"\n",
        );
        assert_eq!(s.publisher.brokers, "k:1");
        assert_eq!(s.ingest.brokers, "k:1");
        for props in [&s.publisher.kafka_properties, &s.ingest.kafka_properties] {
            assert_eq!(props["security.protocol"], "SASL_SSL");
        }
        let r = s.for_router();
        assert_eq!(r.publisher.brokers, "r:1");
        assert_eq!(
            r.publisher.kafka_properties["security.protocol"],
            "SASL_SSL"
        );
    }

    #[test]
    fn the_deprecated_section_keys_still_work() {
        let s = load(
            "[kafka]\nbrokers = \"k:1\"\n[publisher]\nbrokers = \"p:1\"\n\
             [publisher.kafka_properties]\n\"sasl.mechanism\" = \"PLAIN\"\n\
             [ingest.kafka_properties]\n\"sasl.mechanism\" = \"SCRAM-SHA-256\"\n",
        );
        assert_eq!(s.publisher.brokers, "p:1");
        assert_eq!(s.publisher.kafka_properties["sasl.mechanism"], "PLAIN");
        assert_eq!(s.ingest.brokers, "k:1");
        assert_eq!(s.ingest.kafka_properties["sasl.mechanism"], "SCRAM-SHA-256");
        // As before: the router publishes with the publisher's settings...
        let r = s.for_router();
        assert_eq!(r.publisher.brokers, "p:1");
        assert_eq!(r.publisher.kafka_properties["sasl.mechanism"], "PLAIN");
        // ... unless it has its own, which win.
        let s = load("[publisher]\nbrokers = \"p:1\"\n[kafka.router]\nbrokers = \"r:1\"\n");
        assert_eq!(s.for_router().publisher.brokers, "r:1");
    }

    #[test]
    fn unknown_keys_in_the_file_are_errors() {
        let err = toml::from_str::<Settings>("[kafka]\nbroker = \"typo\"\n").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
