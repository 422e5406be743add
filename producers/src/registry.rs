//! Confluent schema registry client, just enough for the `avro-confluent` content type.
//!
//! The Confluent framing carries a 4-byte schema id instead of the schema, so before the first
//! record the publisher registers each kind's Avro schema under the topic's value subject
//! (`<topic>-value`, Confluent's default TopicNameStrategy) and learns its id. Registering an
//! identical schema again is idempotent on the registry and returns the same id.

use serde::Deserialize;
use weft_schemas::avro::schema_text;
use weft_schemas::wire::SchemaIds;
use weft_schemas::{Kind, Topics};

/// Why schema ids could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry could not be reached, or its answer could not be read.
    #[error("schema registry request for subject `{subject}` failed: {source}")]
    Http {
        /// The subject being registered (`<topic>-value`).
        subject: String,
        /// The HTTP client error.
        source: reqwest::Error,
    },
    /// The registry answered with a non-success status.
    #[error("schema registry refused subject `{subject}`: HTTP {status}: {body}")]
    Status {
        /// The subject being registered (`<topic>-value`).
        subject: String,
        /// The HTTP status code.
        status: u16,
        /// The response body, for the registry's own reason.
        body: String,
    },
}

#[derive(Deserialize)]
struct Registered {
    id: u32,
}

/// Register every kind's schema under `<topic>-value` and return the ids.
pub async fn register_all(base_url: &str, topics: &Topics) -> Result<SchemaIds, RegistryError> {
    let client = reqwest::Client::new();
    let base = base_url.trim_end_matches('/');
    let mut ids = SchemaIds::default();
    for kind in Kind::ALL {
        let subject = format!("{}-value", topics.topic(kind));
        let id = register(&client, base, &subject, kind).await?;
        ids.insert(kind, id);
    }
    Ok(ids)
}

async fn register(
    client: &reqwest::Client,
    base: &str,
    subject: &str,
    kind: Kind,
) -> Result<u32, RegistryError> {
    let http = |source| RegistryError::Http {
        subject: subject.to_owned(),
        source,
    };
    let resp = client
        .post(format!("{base}/subjects/{subject}/versions"))
        .header("content-type", "application/vnd.schemaregistry.v1+json")
        .json(&serde_json::json!({ "schema": schema_text(kind) }))
        .send()
        .await
        .map_err(http)?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        return Err(RegistryError::Status {
            subject: subject.to_owned(),
            status: status.as_u16(),
            body,
        });
    }
    Ok(resp.json::<Registered>().await.map_err(http)?.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::{Path, State};
    use axum::routing::post;
    use axum::{Json, Router};
    use std::sync::{Arc, Mutex};

    /// A stand-in registry that hands out ids in registration order and records subjects.
    async fn fake_registry() -> (String, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route(
                "/subjects/{subject}/versions",
                post(
                    |State(seen): State<Arc<Mutex<Vec<String>>>>,
                     Path(subject): Path<String>,
                     Json(body): Json<serde_json::Value>| async move {
                        assert!(body["schema"].as_str().unwrap().contains("\"type\""));
                        let mut s = seen.lock().unwrap();
                        s.push(subject);
                        Json(serde_json::json!({ "id": 100 + s.len() }))
                    },
                ),
            )
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}/"), seen)
    }

    #[tokio::test]
    async fn registers_each_kind_under_its_value_subject() {
        let (url, seen) = fake_registry().await;
        let ids = register_all(&url, &Topics::with_prefix("x."))
            .await
            .unwrap();
        assert_eq!(ids.id_of(Kind::TraceEvent), Some(101));
        assert_eq!(ids.kind_of(108), Some(Kind::CapabilityToken));
        assert_eq!(seen.lock().unwrap()[0], "x.trace_events-value");
    }

    #[tokio::test]
    async fn unreachable_registry_is_a_clear_error() {
        let err = register_all("http://127.0.0.1:9", &Topics::default())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("weaver.trace_events-value"),
            "{err}"
        );
    }
}
