//! Client settings: the `[kafka]` TOML section and its per-role overrides.

use std::collections::BTreeMap;

use rdkafka::config::ClientConfig;
use serde::{Deserialize, Serialize};
use weft_schemas::ports;

/// Where a local stack's broker listens (`deploy/local/stack.sh`): the default of `brokers`.
pub fn default_brokers() -> String {
    ports::loopback(ports::KAFKA).to_string()
}

/// The Kafka clients weft makes, each of which may override the shared settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRole {
    /// `weft ingest`: consumer, dead-letter producer, lag monitor, topic admin.
    Ingest,
    /// `weft publish`, `weft gateway`, `weft simulate`, `weft bench`: the Publisher.
    Publisher,
    /// `weft router`: the Publisher of its decisions.
    Router,
}

impl ClientRole {
    /// The name of the role's override table, `[kafka.<name>]`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientRole::Ingest => "ingest",
            ClientRole::Publisher => "publisher",
            ClientRole::Router => "router",
        }
    }
}

/// Per-role overrides of the `[kafka]` settings (`[kafka.ingest]` and the like).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoleOverride {
    /// Bootstrap servers for this role only; empty means `[kafka] brokers`.
    pub brokers: String,
    /// librdkafka properties for this role, applied over `[kafka.properties]`.
    pub properties: BTreeMap<String, String>,
}

/// The `[kafka]` section: settings shared by every Kafka client weft creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma-separated (`WEFT_KAFKA_BROKERS`).
    pub brokers: String,
    /// librdkafka properties for every client, admin clients included: the place for
    /// `security.protocol`, `sasl.*` and `ssl.*`, written once.
    pub properties: BTreeMap<String, String>,
    /// Overrides for `weft ingest`.
    pub ingest: RoleOverride,
    /// Overrides for the Publisher (`weft publish`, `gateway`, `simulate`, `bench`).
    pub publisher: RoleOverride,
    /// Overrides for `weft router`'s Publisher.
    pub router: RoleOverride,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: default_brokers(),
            properties: BTreeMap::new(),
            ingest: RoleOverride::default(),
            publisher: RoleOverride::default(),
            router: RoleOverride::default(),
        }
    }
}

impl KafkaConfig {
    /// The overrides of one role.
    pub fn role(&self, role: ClientRole) -> &RoleOverride {
        match role {
            ClientRole::Ingest => &self.ingest,
            ClientRole::Publisher => &self.publisher,
            ClientRole::Router => &self.router,
        }
    }

    /// The settings of one role's clients: the shared brokers and properties, then the
    /// role's own (a non-empty `brokers`, and each property, win).
    pub fn client(&self, role: ClientRole) -> ClientSettings {
        let o = self.role(role);
        let mut properties = self.properties.clone();
        properties.extend(o.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
        ClientSettings {
            brokers: if o.brokers.is_empty() {
                self.brokers.clone()
            } else {
                o.brokers.clone()
            },
            properties,
        }
    }
}

/// The resolved settings of one client: bootstrap servers and librdkafka properties.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSettings {
    /// Bootstrap servers, comma-separated.
    pub brokers: String,
    /// librdkafka properties, applied over whatever the client sets itself.
    pub properties: BTreeMap<String, String>,
}

impl ClientSettings {
    /// Settings from brokers and properties as a library config holds them.
    pub fn new(brokers: &str, properties: &BTreeMap<String, String>) -> Self {
        Self {
            brokers: brokers.to_owned(),
            properties: properties.clone(),
        }
    }

    /// A client config with the brokers and the properties: the base of every client.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        self.apply(&mut c);
        c
    }

    /// Apply the properties to `c` (after a client's own settings, so they win).
    pub fn apply(&self, c: &mut ClientConfig) {
        for (k, v) in &self.properties {
            c.set(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sasl_written_once_reaches_every_role_and_a_role_may_override() {
        let k: KafkaConfig = toml::from_str(
            r#"
            brokers = "k1:9092"
            [properties]
            "security.protocol" = "SASL_SSL"
            "sasl.mechanism" = "PLAIN"
            [router]
            brokers = "k2:9092"
            [router.properties]
            "sasl.mechanism" = "SCRAM-SHA-512"
            "#,
        )
        .unwrap();
        for role in [
            ClientRole::Ingest,
            ClientRole::Publisher,
            ClientRole::Router,
        ] {
            let c = k.client(role);
            assert_eq!(c.properties["security.protocol"], "SASL_SSL", "{role:?}");
        }
        let ingest = k.client(ClientRole::Ingest);
        assert_eq!(ingest.brokers, "k1:9092");
        assert_eq!(ingest.properties["sasl.mechanism"], "PLAIN");
        let router = k.client(ClientRole::Router);
        assert_eq!(router.brokers, "k2:9092");
        assert_eq!(router.properties["sasl.mechanism"], "SCRAM-SHA-512");
        let c = router.client_config();
        assert_eq!(c.get("bootstrap.servers"), Some("k2:9092"));
        assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
    }

    #[test]
    fn an_empty_section_is_the_local_stack_and_typos_fail() {
        let k: KafkaConfig = toml::from_str("").unwrap();
        assert_eq!(k, KafkaConfig::default());
        assert_eq!(k.client(ClientRole::Publisher).brokers, "127.0.0.1:19092");
        assert!(toml::from_str::<KafkaConfig>("[ingest]\nbroker = \"x\"").is_err());
    }
}
