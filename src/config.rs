//! All of weft's configuration, in one place.
//!
//! Precedence, highest first: command-line flags, `WEFT_*` environment variables, the TOML
//! file given by `--config` / `WEFT_CONFIG`, built-in defaults. Flags and environment are
//! declared together on [`GlobalArgs`] (clap reads both); the TOML file maps onto
//! [`Settings`], whose sections are the libraries' own config types.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;
use weft_store::ClickHouseConfig;

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

/// Kafka connection settings shared by every Kafka client weft creates.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSettings {
    pub brokers: String,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:19092".into(),
        }
    }
}

/// The merged configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub clickhouse: ClickHouseConfig,
    /// `weft publish`, `weft gateway`, `weft bench`: the Publisher (empty brokers = `[kafka]`).
    pub publisher: weft_producers::PublisherConfig,
    /// `weft gateway`: listen address, API keys, body limit.
    pub gateway: weft_producers::gateway::GatewayConfig,
    /// `weft ingest`: consumer group, batching, roles (empty brokers = `[kafka]`).
    pub ingest: weft_consumers::ingest::IngestConfig,
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
        Ok(s)
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
        let dir = std::env::temp_dir().join(format!("weft-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("weft.toml");
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
    fn the_example_config_parses() {
        let s: Settings = toml::from_str(include_str!("../deploy/weft.example.toml")).unwrap();
        assert_eq!(s.ingest.batch_max_rows, 50_000);
        assert_eq!(s.publisher.topics.prefix, "weaver.");
    }

    #[test]
    fn unknown_keys_in_the_file_are_errors() {
        let err = toml::from_str::<Settings>("[kafka]\nbroker = \"typo\"\n").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
