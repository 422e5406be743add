//! Confluent schema registry client, just enough for the `avro-confluent` content type.
//!
//! The Confluent framing carries a 4-byte schema id instead of the schema. Before its first
//! record the publisher registers each kind's Avro schema under the topic's value subject
//! (`<topic>-value`, Confluent's default TopicNameStrategy) and learns its id; registering an
//! identical schema again is idempotent on the registry and returns the same id. Ingest, which
//! may start before any publisher registered anything, asks the registry for the schema of an
//! id it has not met ([`kind_of_id`]) and takes it when it is one of weft's own, compared by
//! canonical form.

use std::time::Duration;

use serde::Deserialize;
use weft_schemas::avro::{schema_text, AvroSchemas};
use weft_schemas::wire::SchemaIds;
use weft_schemas::{Kind, Topics};

/// How long one registry request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why the registry could not answer.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry could not be reached, or its answer could not be read.
    #[error("schema registry request for {what} failed: {source}")]
    Http {
        /// What was asked: a subject (`<topic>-value`) or a schema id.
        what: String,
        /// The HTTP client error.
        source: reqwest::Error,
    },
    /// The registry answered with a status that is neither success nor "not found".
    #[error("schema registry refused {what}: HTTP {status}: {body}")]
    Status {
        /// What was asked: a subject (`<topic>-value`) or a schema id.
        what: String,
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

#[derive(Deserialize)]
struct ById {
    schema: String,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(TIMEOUT)
        .build()
        .unwrap_or_default()
}

/// Register every kind's schema under `<topic>-value` and return the ids.
pub async fn register_all(base_url: &str, topics: &Topics) -> Result<SchemaIds, RegistryError> {
    let client = client();
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
    let what = || format!("subject `{subject}`");
    let resp = client
        .post(format!("{base}/subjects/{subject}/versions"))
        .header("content-type", "application/vnd.schemaregistry.v1+json")
        .json(&serde_json::json!({ "schema": schema_text(kind) }))
        .send()
        .await
        .map_err(|source| RegistryError::Http {
            what: what(),
            source,
        })?;
    let resp = success(resp, what).await?;
    Ok(resp
        .json::<Registered>()
        .await
        .map_err(|source| RegistryError::Http {
            what: what(),
            source,
        })?
        .id)
}

/// The kind whose schema the registry holds under `id`: `Ok(None)` when the registry has no
/// such id, or its schema is not one of weft's (a record framed with it cannot be read).
pub async fn kind_of_id(base_url: &str, id: u32) -> Result<Option<Kind>, RegistryError> {
    let what = || format!("schema id {id}");
    let http = |source| RegistryError::Http {
        what: what(),
        source,
    };
    let base = base_url.trim_end_matches('/');
    let resp = client()
        .get(format!("{base}/schemas/ids/{id}"))
        .send()
        .await
        .map_err(http)?;
    if resp.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    let found: ById = success(resp, what).await?.json().await.map_err(http)?;
    Ok(AvroSchemas::global().kind_of_schema(&found.schema))
}

/// `resp` when its status is a success, else the registry's answer as an error.
async fn success(
    resp: reqwest::Response,
    what: impl Fn() -> String,
) -> Result<reqwest::Response, RegistryError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    Err(RegistryError::Status {
        what: what(),
        status: status.as_u16(),
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::{Json, Router};
    use std::sync::{Arc, Mutex};

    /// Subjects and schema texts, in registration order: the id of the i-th is 101 + i.
    type Registered = Arc<Mutex<Vec<(String, String)>>>;

    /// A stand-in registry that hands out ids in registration order and serves them back.
    async fn fake_registry() -> (String, Registered) {
        let seen = Registered::default();
        let app = Router::new()
            .route(
                "/subjects/{subject}/versions",
                post(
                    |State(seen): State<Registered>,
                     Path(subject): Path<String>,
                     Json(body): Json<serde_json::Value>| async move {
                        let schema = body["schema"].as_str().unwrap_or_default().to_owned();
                        let mut s = seen.lock().unwrap();
                        s.push((subject, schema));
                        Json(serde_json::json!({ "id": 100 + s.len() }))
                    },
                ),
            )
            .route(
                "/schemas/ids/{id}",
                get(
                    |State(seen): State<Registered>, Path(id): Path<usize>| async move {
                        let s = seen.lock().unwrap();
                        match id.checked_sub(101).and_then(|i| s.get(i)) {
                            Some((_, schema)) => Ok(Json(serde_json::json!({ "schema": schema }))),
                            None => Err(StatusCode::NOT_FOUND),
                        }
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
        assert_eq!(seen.lock().unwrap()[0].0, "x.trace_events-value");
    }

    /// An id is weft's kind when the registry's schema for it is that kind's; an id the
    /// registry does not have, or holds another schema under, is no kind's.
    #[tokio::test]
    async fn an_id_is_told_by_the_schema_the_registry_holds_for_it() {
        let (url, seen) = fake_registry().await;
        let ids = register_all(&url, &Topics::default()).await.unwrap();
        seen.lock()
            .unwrap()
            .push(("other-value".into(), r#"{"type":"string"}"#.into()));
        for kind in Kind::ALL {
            let id = ids.id_of(kind).unwrap();
            assert_eq!(kind_of_id(&url, id).await.unwrap(), Some(kind));
        }
        assert_eq!(
            kind_of_id(&url, 109).await.unwrap(),
            None,
            "a foreign schema"
        );
        assert_eq!(kind_of_id(&url, 7).await.unwrap(), None, "an unknown id");
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
        let err = kind_of_id("http://127.0.0.1:9", 5).await.unwrap_err();
        assert!(err.to_string().contains("schema id 5"), "{err}");
    }
}
