//! Topic creation: the one routine every command that creates topics uses.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tracing::{info, warn};
use weft_schemas::Topics;

use crate::ClientSettings;

/// How created topics are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicLayout {
    /// Partitions per topic.
    pub partitions: i32,
    /// Replicas per partition (1 on one local broker; typically 3 in production).
    pub replication_factor: i32,
}

/// Why the topics could not be made to exist.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// The admin client could not be created, or its request failed.
    #[error("kafka admin: {0}")]
    Kafka(#[from] KafkaError),
    /// Kafka refused to create a topic and it does not exist; holds the topic and the code.
    #[error("creating topic `{0}`: {1}")]
    Create(String, RDKafkaErrorCode),
}

/// How long the broker may take to create the topics (`operation_timeout`: the answer comes
/// once they exist, so a record sent right after finds them) and how long the whole request
/// may take (`request_timeout`).
const TIMEOUT: Duration = Duration::from_secs(30);

/// Create the event topics (one per kind) and the dead-letter topic that do not exist yet;
/// existing topics are left as they are. Returns the names created now.
///
/// A topic Kafka refuses to create is an error unless it exists anyway (a client allowed to
/// describe topics but not to create them, on a cluster where they were made beforehand): a
/// missing topic would otherwise surface later as records that go nowhere.
pub async fn ensure_topics(
    client: &ClientSettings,
    topics: &Topics,
    layout: TopicLayout,
) -> Result<Vec<String>, TopicError> {
    let admin: AdminClient<DefaultClientContext> = client.client_config().create()?;
    let mut names = topics.event_topics();
    names.push(topics.dead_letter());
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            NewTopic::new(
                n,
                layout.partitions,
                TopicReplication::Fixed(layout.replication_factor),
            )
        })
        .collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(TIMEOUT))
        .request_timeout(Some(TIMEOUT));
    let mut created = Vec::new();
    for r in admin.create_topics(&new, &opts).await? {
        match r {
            Ok(name) => {
                info!(topic = %name, "created topic");
                created.push(name);
            }
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                if exists(&admin, &name) {
                    warn!(topic = %name, error = %code, "could not create topic, but it exists");
                } else {
                    return Err(TopicError::Create(name, code));
                }
            }
        }
    }
    Ok(created)
}

/// Whether the broker knows `topic` with at least one partition.
fn exists(admin: &AdminClient<DefaultClientContext>, topic: &str) -> bool {
    admin
        .inner()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .is_ok_and(|md| {
            md.topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        })
}
