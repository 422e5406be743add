//! Shared helpers for the integration tests in `tests/`.
//!
//! These tests talk to the real local stack (tansu and ClickHouse), started by
//! `deploy/local/test.sh` (the README's test command), which exports `WEFT_KAFKA_BROKERS`
//! and `WEFT_CLICKHOUSE_URL`. Without them a test fails with a message saying so: a test
//! that silently skips would report green without checking anything.
#![allow(dead_code)]

pub mod facts;
pub mod kafka;
pub mod pipeline;
pub mod proxy;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Kafka bootstrap servers of the local stack.
pub fn brokers() -> String {
    std::env::var("WEFT_KAFKA_BROKERS").unwrap_or_else(|_| {
        panic!("WEFT_KAFKA_BROKERS is not set: run the tests with deploy/local/test.sh (it starts the stack)")
    })
}

/// ClickHouse HTTP URL of the local stack.
pub fn clickhouse_url() -> String {
    std::env::var("WEFT_CLICKHOUSE_URL").unwrap_or_else(|_| {
        panic!("WEFT_CLICKHOUSE_URL is not set: run the tests with deploy/local/test.sh (it starts the stack)")
    })
}

/// A name unique to this test process and call, for topics prefixes and databases, so tests
/// running in parallel (and earlier runs) never see each other's data.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{tag}_{}_{n}_{nanos:x}", std::process::id())
}

/// The `weft` binary built for this test run, with the stack's environment.
pub fn weft() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weft"))
}

/// Poll `cond` until it returns `Some` or `timeout` passes. Tests wait for conditions,
/// never for fixed sleeps.
pub fn wait_for<T>(timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`wait_for`], for a condition that is a future.
pub async fn wait_for_async<T, F>(timeout: Duration, mut cond: impl FnMut() -> F) -> Option<T>
where
    F: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Path of the repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The sum of a counter or gauge (every label set) on the `/metrics` page at `addr` (0 when
/// the page does not name it yet), `None` when the page does not answer.
pub async fn metric(addr: &str, name: &str) -> Option<u64> {
    let values = series(addr, name, &[]).await?;
    Some(values.iter().sum::<f64>() as u64)
}

/// The values of metric `name` on the `/metrics` page at `addr`, one per series whose labels
/// include every one of `labels` (`("topic", "t")` for `topic="t"`); `None` when the page
/// does not answer.
pub async fn series(addr: &str, name: &str, labels: &[(&str, &str)]) -> Option<Vec<f64>> {
    let body = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    Some(
        body.lines()
            .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
            .filter(|l| labels.iter().all(|label| l.contains(label.as_str())))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .collect(),
    )
}

/// The findings of `invariant` (`"I-02"`, `"orphan"`, …) in the report of
/// `weft audit check --format json`.
pub fn findings<'r>(report: &'r serde_json::Value, invariant: &str) -> Vec<&'r serde_json::Value> {
    report["findings"]
        .as_array()
        .expect("an audit check report lists its findings")
        .iter()
        .filter(|f| f["invariant"] == invariant)
        .collect()
}
