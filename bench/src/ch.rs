//! The ClickHouse side every benchmark shares: run a statement, read a count, and wait for
//! background merges to settle.

use std::time::{Duration, Instant};

use anyhow::Context;
use weft_store::{ClickHouseConfig, Store};

/// How long no merge may run in the database before merges count as settled.
///
/// Two seconds, not one: after a merge ends, ClickHouse may take a moment to pick the next
/// one (its merge-selecting task reschedules itself), so one quiet second can fall between
/// two merges of the same load and stop the wait early. The extra second is idle time; it
/// adds nothing but ClickHouse's idle CPU to the "settled" figures.
pub const MERGES_QUIET: Duration = Duration::from_secs(2);

/// How often `system.merges` is polled while settling.
const MERGES_POLL: Duration = Duration::from_millis(200);

/// Run one statement; the error names it (its first 200 characters).
pub async fn exec(store: &Store, sql: &str) -> anyhow::Result<()> {
    store.client().query(sql).execute().await.with_context(|| {
        let head: String = sql.chars().take(200).collect();
        format!("ClickHouse: {head}")
    })
}

/// Run a query that returns one `UInt64`.
pub async fn count(store: &Store, sql: &str) -> anyhow::Result<u64> {
    Ok(store.client().query(sql).fetch_one::<u64>().await?)
}

/// Wait (at most `limit`) until ClickHouse has had no merge running in this database for
/// [`MERGES_QUIET`]; returns the seconds waited.
pub async fn settle_merges(store: &Store, limit: Duration) -> f64 {
    let started = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    while started.elapsed() < limit {
        let running = count(
            store,
            "SELECT toUInt64(count()) FROM system.merges WHERE database = currentDatabase()",
        )
        .await
        .unwrap_or(1);
        if running == 0 {
            if quiet_since.get_or_insert_with(Instant::now).elapsed() >= MERGES_QUIET {
                break;
            }
        } else {
            quiet_since = None;
        }
        tokio::time::sleep(MERGES_POLL).await;
    }
    started.elapsed().as_secs_f64()
}

/// `<pid>_<unix seconds>`: names a run's database (and topics) so runs never meet.
pub fn run_id() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{}_{secs}", std::process::id())
}

/// A store on `database` (created and migrated if new) of the ClickHouse `config` names.
pub async fn fresh_database(config: &ClickHouseConfig, database: &str) -> anyhow::Result<Store> {
    let mut ch = config.clone();
    ch.database = database.to_owned();
    let store = Store::new(ch)?;
    store
        .migrate()
        .await
        .context("migrating the bench database")?;
    Ok(store)
}
