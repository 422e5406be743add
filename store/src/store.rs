//! The ClickHouse store: connection settings and the migration runner.
//!
//! Migrations are the files under `schemas/clickhouse/` (embedded by `weft-schemas`). Each is
//! applied once, in version order, and recorded in `weft_schema_migrations` with a checksum,
//! so re-running is a no-op and an edited, already-applied file is refused loudly instead of
//! silently diverging from production.

use std::future::Future;
use std::time::{Duration, Instant};

use clickhouse::{Client, Row, RowWrite};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tracing::{info, instrument, warn};
use weft_schemas::migrations::{self, Migration};

/// How to reach ClickHouse. Defaults match the local stack (`deploy/local/stack.sh`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClickHouseConfig {
    /// HTTP endpoint, e.g. `http://127.0.0.1:18123`.
    pub url: String,
    /// Database holding weft's tables; created by `weft migrate` when missing.
    pub database: String,
    /// ClickHouse user.
    pub user: String,
    /// Password of `user`; empty for none.
    pub password: String,
    /// HTTP body compression between weft and ClickHouse, both ways.
    pub compression: Compression,
}

/// HTTP body compression between weft and ClickHouse (`[clickhouse] compression`).
///
/// LZ4 saves network bandwidth at a CPU cost on both ends: measured in `weft bench ingest`,
/// compressing inserts was 7% of the consumer's CPU, and ClickHouse decompresses them again.
/// Over loopback nothing is saved, so `auto` compresses only when ClickHouse is elsewhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// LZ4 unless the URL's host is a loopback address (`localhost`, `127.0.0.0/8`, `::1`).
    #[default]
    Auto,
    /// Always LZ4.
    Lz4,
    /// Never.
    None,
}

impl Compression {
    /// Whether bodies to and from `url` are compressed.
    pub fn lz4_for(self, url: &str) -> bool {
        match self {
            Compression::Lz4 => true,
            Compression::None => false,
            Compression::Auto => !is_loopback_url(url),
        }
    }
}

/// Whether `url`'s host is a loopback name or address (an unreadable URL is not).
fn is_loopback_url(url: &str) -> bool {
    use url::Host;
    match url::Url::parse(url).ok().as_ref().and_then(url::Url::host) {
        Some(Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(Host::Ipv4(ip)) => ip.is_loopback(),
        Some(Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

impl Default for ClickHouseConfig {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:18123".into(),
            database: "weft".into(),
            user: "default".into(),
            password: String::new(),
            compression: Compression::Auto,
        }
    }
}

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A query or insert failed; `is_transient` says whether to retry.
    #[error("clickhouse at {url}: {source}")]
    ClickHouse {
        /// The ClickHouse endpoint that failed.
        url: String,
        /// The client's error.
        #[source]
        source: clickhouse::error::Error,
    },
    /// A table lacks columns this version writes: the schema is older than the code.
    #[error("table {table} lacks columns {missing}: run `weft migrate`")]
    Schema {
        /// The table checked.
        table: String,
        /// Its missing columns, comma-separated.
        missing: String,
    },
    /// Rows could not be encoded for an insert (a row type whose column list disagrees with
    /// its fields: a bug, not bad input).
    #[error("encoding rows for {table}: {detail}")]
    Encode {
        /// The table the rows were for.
        table: String,
        /// What disagreed.
        detail: String,
    },
    /// The configured database name is not 1..=64 characters of `[A-Za-z0-9_]`.
    #[error("database name `{0}` must be 1..=64 characters of [A-Za-z0-9_]")]
    BadDatabase(String),
    /// A row could not be put in canonical form (JCS) for hashing.
    #[error("canonical form: {0}")]
    Canonical(String),
    /// An applied migration file was edited since.
    #[error("migration {version} ({name}) was changed after it was applied (checksum {applied} != {now}); add a new migration instead of editing an old one")]
    Edited {
        /// Version of the edited migration.
        version: u32,
        /// File name of the edited migration.
        name: String,
        /// Checksum recorded when it was applied.
        applied: String,
        /// Checksum of the file now.
        now: String,
    },
}

impl StoreError {
    /// `true` for failures worth retrying: the server was unreachable or overloaded. A query
    /// the server rejects (unknown table, bad SQL) will fail the same way again.
    pub fn is_transient(&self) -> bool {
        use clickhouse::error::Error as E;
        match self {
            StoreError::ClickHouse {
                source: E::Network(_) | E::TimedOut,
                ..
            } => true,
            // MEMORY_LIMIT_EXCEEDED, TOO_MANY_SIMULTANEOUS_QUERIES, TOO_MANY_PARTS,
            // TIMEOUT_EXCEEDED, ABORTED, and server-side network errors.
            _ => self.server_code_in(&[241, 202, 252, 159, 236, 209, 210]),
        }
    }

    /// `true` when ClickHouse stopped a query at the read limit of
    /// [`Store::with_read_limit`]: the request asked for too much, and will again.
    pub fn is_over_read_limit(&self) -> bool {
        // TOO_MANY_ROWS, TOO_MANY_BYTES, TOO_MANY_ROWS_OR_BYTES.
        self.server_code_in(&[158, 307, 396])
    }

    /// Whether ClickHouse answered with an exception of one of `codes`.
    fn server_code_in(&self, codes: &[u32]) -> bool {
        match self {
            StoreError::ClickHouse {
                source: clickhouse::error::Error::BadResponse(msg),
                ..
            } => codes.iter().any(|c| msg.contains(&format!("Code: {c}."))),
            _ => false,
        }
    }
}

/// A handle on weft's ClickHouse database.
#[derive(Clone)]
pub struct Store {
    cfg: ClickHouseConfig,
    client: Client,
}

#[derive(Debug, clickhouse::Row, Deserialize)]
struct Applied {
    version: u32,
    checksum: String,
}

#[derive(Debug, clickhouse::Row, Serialize)]
struct AppliedRow<'a> {
    version: u32,
    name: &'a str,
    checksum: &'a str,
}

/// What `migrate` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Versions applied by this run.
    pub applied: Vec<u32>,
    /// Versions already applied before, skipped.
    pub already: Vec<u32>,
}

fn checksum(m: &Migration) -> String {
    hex::encode(Sha256::digest(m.sql.as_bytes()))
}

impl Store {
    /// Connect lazily (no I/O until the first query).
    pub fn new(cfg: ClickHouseConfig) -> Result<Self, StoreError> {
        let db_ok = (1..=64).contains(&cfg.database.len())
            && cfg
                .database
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !db_ok {
            return Err(StoreError::BadDatabase(cfg.database));
        }
        let client = Self::client_for(&cfg).with_database(cfg.database.clone());
        Ok(Self { cfg, client })
    }

    fn client_for(cfg: &ClickHouseConfig) -> Client {
        let compression = if cfg.compression.lz4_for(&cfg.url) {
            clickhouse::Compression::Lz4
        } else {
            clickhouse::Compression::None
        };
        Client::default()
            .with_url(cfg.url.clone())
            .with_compression(compression)
            .with_user(cfg.user.clone())
            .with_password(cfg.password.clone())
            // `SELECT argMax(x, version) AS x` must read the column x, not its own alias.
            .with_setting("prefer_column_name_to_alias", "1")
    }

    /// This store, with every query limited to reading `rows` rows (ClickHouse's
    /// `max_rows_to_read`, sent with each query, with `read_overflow_mode = 'throw'` so that
    /// a server profile cannot turn it into silently partial answers; `0`: no limit). Past
    /// it the server stops the query, and the error is [`StoreError::is_over_read_limit`].
    /// For the queries an HTTP request steers. Inserts read nothing and are not limited.
    /// On a cluster each shard applies the limit to its own reads.
    pub fn with_read_limit(&self, rows: u64) -> Store {
        Store {
            cfg: self.cfg.clone(),
            client: self
                .client
                .clone()
                .with_setting("max_rows_to_read", rows.to_string())
                .with_setting("read_overflow_mode", "throw"),
        }
    }

    /// The client, bound to weft's database.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The settings this store was built from.
    pub fn config(&self) -> &ClickHouseConfig {
        &self.cfg
    }

    /// Wrap a ClickHouse error with the URL it came from.
    pub fn err(&self) -> impl Fn(clickhouse::error::Error) -> StoreError + '_ {
        move |source| StoreError::ClickHouse {
            url: self.cfg.url.clone(),
            source,
        }
    }

    /// `true` when ClickHouse answers a trivial query.
    pub async fn ping(&self) -> Result<(), StoreError> {
        Self::client_for(&self.cfg)
            .query("SELECT 1")
            .execute()
            .await
            .map_err(self.err())
    }

    /// Wait, however long it takes, until the inserts into `tables` of this database that run
    /// on the server at the call have finished; `Err(Stopped)` as soon as `stop` turns true.
    ///
    /// Why: crash consistency. A process killed while its insert was under way leaves that
    /// insert to land on its own, possibly after its successor has read where things stand.
    /// A process taking over these tables (or a share of them) calls this before it reads
    /// them: read before such an insert lands, the facts' resume points would have its rows
    /// stored twice, and the projector's restore would miss a member row that then lands
    /// live in a narrative no node row names. So the wait is not given up on (a warning every
    /// [`EARLIER_INSERTS_ROUND`]): a dead client's insert ends when ClickHouse sees its
    /// connection gone, so the wait ends too; a stop ends it early, before anything is read.
    ///
    /// Only the inserts running at the call are waited for, by their `query_id`s taken once
    /// ([`Store::running_inserts`]): inserts that start later are not a predecessor's, and
    /// other writers sharing the tables (a facts group's other members, other narrative
    /// shards) would otherwise keep it waiting.
    ///
    /// A failure to list them or to tell whether they still run goes to `on_error` with the
    /// count of failures so far: it returns `Err` to give up with it, or `Ok` (after backing
    /// off) to ask again, for the same inserts.
    pub async fn wait_for_earlier_inserts<E, H, HF>(
        &self,
        tables: &[&str],
        stop: &watch::Receiver<bool>,
        on_error: H,
    ) -> Result<(), E>
    where
        E: From<Stopped>,
        H: FnMut(StoreError, u32) -> HF,
        HF: Future<Output = Result<(), E>>,
    {
        wait_for_earlier(
            tables,
            stop,
            EARLIER_INSERTS_ROUND,
            || self.running_inserts(tables),
            |ids, round| async move { self.wait_for_queries(&ids, round).await },
            on_error,
        )
        .await
    }

    /// The `query_id`s of the inserts into `tables` of this database running on the server
    /// now, for [`Store::wait_for_queries`]: a caller that waits for them in several rounds
    /// keeps this list, so inserts started later (other writers') never keep it waiting
    /// ([`Store::wait_for_earlier_inserts`]).
    pub async fn running_inserts(&self, tables: &[&str]) -> Result<Vec<String>, StoreError> {
        self.client
            .query(
                "SELECT query_id FROM system.processes WHERE query_kind = 'Insert' \
                 AND current_database = currentDatabase() \
                 AND multiSearchAny(query, {tables:Array(String)})",
            )
            .param("tables", tables)
            .fetch_all()
            .await
            .map_err(self.err())
    }

    /// Wait (at most `limit`) until the query `query_id` no longer runs on the server: an
    /// insert whose answer was lost may still be writing its part. Returns whether it
    /// finished within `limit` (it logs a warning if not).
    pub async fn wait_for_query(
        &self,
        query_id: &str,
        limit: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.wait_for_queries(&[query_id.to_owned()], limit).await
    }

    /// Poll `system.processes`, with growing pauses, until none of `ids` runs (`Ok(true)`),
    /// or `limit` has passed (`Ok(false)`, with a warning).
    pub async fn wait_for_queries(
        &self,
        ids: &[String],
        limit: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            let running: u64 = self
                .client
                .query(
                    "SELECT count() FROM system.processes WHERE has({ids:Array(String)}, query_id)",
                )
                .param("ids", ids)
                .fetch_one()
                .await
                .map_err(self.err())?;
            if running == 0 {
                return Ok(true);
            }
            let waited = started.elapsed();
            if waited >= limit {
                tracing::warn!(
                    running,
                    waited_ms = waited.as_millis() as u64,
                    "queries still running; going on"
                );
                return Ok(false);
            }
            tracing::debug!(
                running,
                waited_ms = waited.as_millis() as u64,
                "queries still running"
            );
            tokio::time::sleep(pause.min(limit - waited)).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(1));
        }
    }

    /// Apply every pending migration, in order. Safe to run concurrently and repeatedly:
    /// all DDL is `IF NOT EXISTS`, and applied versions are skipped.
    #[instrument(skip(self), fields(database = %self.cfg.database))]
    pub async fn migrate(&self) -> Result<MigrateReport, StoreError> {
        // The database name was checked against [A-Za-z0-9_] in `new`; identifiers cannot be
        // query parameters, so this is the one place a name is formatted into SQL.
        Self::client_for(&self.cfg)
            .query(&format!(
                "CREATE DATABASE IF NOT EXISTS `{}`",
                self.cfg.database
            ))
            .execute()
            .await
            .map_err(self.err())?;
        self.client
            .query(
                "CREATE TABLE IF NOT EXISTS weft_schema_migrations (
                    version UInt32, name String, checksum String,
                    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
                 ) ENGINE = MergeTree ORDER BY version",
            )
            .execute()
            .await
            .map_err(self.err())?;
        let applied: Vec<Applied> = self
            .client
            .query("SELECT version, any(checksum) AS checksum FROM weft_schema_migrations GROUP BY version")
            .fetch_all()
            .await
            .map_err(self.err())?;
        let mut report = MigrateReport::default();
        for m in migrations::all() {
            let sum = checksum(&m);
            if let Some(a) = applied.iter().find(|a| a.version == m.version) {
                if a.checksum != sum {
                    return Err(StoreError::Edited {
                        version: m.version,
                        name: m.name.clone(),
                        applied: a.checksum.clone(),
                        now: sum,
                    });
                }
                report.already.push(m.version);
                continue;
            }
            for stmt in m.statements() {
                self.client
                    .query(&stmt)
                    .execute()
                    .await
                    .map_err(self.err())?;
            }
            let mut insert = self
                .client
                .insert::<AppliedRow>("weft_schema_migrations")
                .await
                .map_err(self.err())?;
            insert
                .write(&AppliedRow {
                    version: m.version,
                    name: &m.name,
                    checksum: &sum,
                })
                .await
                .map_err(self.err())?;
            insert.end().await.map_err(self.err())?;
            info!(version = m.version, name = %m.name, "migration applied");
            report.applied.push(m.version);
        }
        Ok(report)
    }
}

/// The process was asked to stop while it waited: it gives up, having read and written
/// nothing since (a restart resumes as after any stop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stopped while waiting")]
pub struct Stopped;

/// What `f` gives, or `Err(Stopped)` as soon as `stop` turns true (at once if it is true
/// already, without polling `f`). A stop signal whose sender is gone counts as a stop.
pub async fn unless_stopped<T>(
    stop: &watch::Receiver<bool>,
    f: impl Future<Output = T>,
) -> Result<T, Stopped> {
    let mut stop = stop.clone();
    tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => Err(Stopped),
        r = f => Ok(r),
    }
}

/// How long one round of [`Store::wait_for_earlier_inserts`] lasts before a warning says it
/// goes on waiting.
pub const EARLIER_INSERTS_ROUND: Duration = Duration::from_secs(60);

/// [`Store::wait_for_earlier_inserts`], with the snapshot of the running inserts
/// (`running`) and one bounded round of waiting for them (`wait`: `Ok(false)` while they
/// still run after `round`) given, so that tests can play ClickHouse.
async fn wait_for_earlier<E, R, RF, W, WF, H, HF>(
    tables: &[&str],
    stop: &watch::Receiver<bool>,
    round: Duration,
    mut running: R,
    mut wait: W,
    mut on_error: H,
) -> Result<(), E>
where
    E: From<Stopped>,
    R: FnMut() -> RF,
    RF: Future<Output = Result<Vec<String>, StoreError>>,
    W: FnMut(Vec<String>, Duration) -> WF,
    WF: Future<Output = Result<bool, StoreError>>,
    H: FnMut(StoreError, u32) -> HF,
    HF: Future<Output = Result<(), E>>,
{
    let mut failures = 0;
    let ids = loop {
        match unless_stopped(stop, running()).await? {
            Ok(ids) => break ids,
            Err(e) => {
                failures += 1;
                unless_stopped(stop, on_error(e, failures)).await??;
            }
        }
    };
    if ids.is_empty() {
        return Ok(());
    }
    info!(
        running = ids.len(),
        ?tables,
        "waiting for the inserts running now (an earlier process's?) to land"
    );
    let started = Instant::now();
    loop {
        match unless_stopped(stop, wait(ids.clone(), round)).await? {
            Ok(true) => {
                info!(
                    running = ids.len(),
                    ?tables,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "the inserts running before this process read its tables have finished"
                );
                return Ok(());
            }
            Ok(false) => warn!(
                running = ids.len(),
                ?tables,
                waited_s = started.elapsed().as_secs(),
                "inserts started before this process read its tables still run; waiting on \
                 (read now, what they write would be missed or stored twice)"
            ),
            Err(e) => {
                failures += 1;
                unless_stopped(stop, on_error(e, failures)).await??;
            }
        }
    }
}

/// Fail unless `table` has every column `T` writes: a clear start-up error instead of
/// inserts that fail (or worse, misalign) later.
pub async fn check_columns<T: Row>(store: &Store, table: &str) -> Result<(), StoreError> {
    let have: Vec<String> = store
        .client()
        .query("SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {t:String}")
        .param("t", table)
        .fetch_all()
        .await
        .map_err(store.err())?;
    let missing: Vec<&str> = T::COLUMN_NAMES
        .iter()
        .copied()
        .filter(|c| !have.iter().any(|h| h == c))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(StoreError::Schema {
            table: table.to_owned(),
            missing: missing.join(", "),
        })
    }
}

/// Insert rows into a table in one statement, as RowBinary (no-op when empty). `T` names the
/// row type, since rows may borrow. The tables written once per event go through
/// [`crate::native::insert_native`] instead, which costs ClickHouse less per row.
pub async fn insert<T: RowWrite>(
    store: &Store,
    table: &str,
    rows: &[T::Value<'_>],
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut ins = store
        .client()
        .insert::<T>(table)
        .await
        .map_err(store.err())?;
    for r in rows {
        ins.write(r).await.map_err(store.err())?;
    }
    ins.end().await.map_err(store.err())
}

#[cfg(test)]
mod earlier_inserts_tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::future::{ready, Ready};

    /// A failure as ClickHouse down would give it (transient).
    fn unreachable_error() -> StoreError {
        StoreError::ClickHouse {
            url: "http://127.0.0.1:1".into(),
            source: clickhouse::error::Error::TimedOut,
        }
    }

    /// [`wait_for_earlier`] on `weft_events` in rounds of 5 ms, ClickHouse played by
    /// `running` and `wait`.
    async fn play<E: From<Stopped>>(
        stop: &watch::Receiver<bool>,
        running: impl FnMut() -> Ready<Result<Vec<String>, StoreError>>,
        wait: impl FnMut(Vec<String>, Duration) -> Ready<Result<bool, StoreError>>,
        on_error: impl FnMut(StoreError, u32) -> Ready<Result<(), E>>,
    ) -> Result<(), E> {
        let round = Duration::from_millis(5);
        wait_for_earlier(&["weft_events"], stop, round, running, wait, on_error).await
    }

    /// An `on_error` that asks again at once.
    fn ask_again(_: StoreError, _: u32) -> Ready<Result<(), Stopped>> {
        ready(Ok(()))
    }

    /// A predecessor's insert still running after a round is waited for in further rounds
    /// (of the same insert only), not given up on.
    #[tokio::test]
    async fn an_earlier_insert_is_waited_for_until_it_has_finished() {
        let (_tx, stop) = watch::channel(false);
        let snapshots = Cell::new(0);
        let rounds = RefCell::new(Vec::new());
        let r = play(
            &stop,
            || {
                snapshots.set(snapshots.get() + 1);
                ready(Ok(vec!["killed-insert".to_owned()]))
            },
            |ids, limit| {
                rounds.borrow_mut().push((ids, limit));
                // Still running for three rounds, then finished.
                ready(Ok(rounds.borrow().len() > 3))
            },
            ask_again,
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(
            snapshots.get(),
            1,
            "one snapshot: later inserts are not waited for"
        );
        let rounds = rounds.into_inner();
        assert_eq!(rounds.len(), 4, "waited until the insert finished");
        assert!(rounds
            .iter()
            .all(|(ids, limit)| ids == &["killed-insert"] && *limit == Duration::from_millis(5)));
    }

    /// Waiting on gives way to a stop.
    #[tokio::test]
    async fn waiting_for_an_earlier_insert_gives_way_to_a_stop() {
        let (tx, stop) = watch::channel(false);
        let rounds = Cell::new(0);
        let r = play(
            &stop,
            || ready(Ok(vec!["never-ends".to_owned()])),
            |_, _| {
                rounds.set(rounds.get() + 1);
                if rounds.get() == 2 {
                    let _ = tx.send(true);
                }
                ready(Ok(false))
            },
            ask_again,
        )
        .await;
        assert_eq!(r, Err(Stopped));
        assert_eq!(rounds.get(), 2);
    }

    /// A process asked to stop before the wait does not even ask for the running inserts.
    #[tokio::test]
    async fn a_stop_before_the_wait_ends_it_at_once() {
        let (tx, stop) = watch::channel(false);
        let _ = tx.send(true);
        let listed = Cell::new(false);
        let r = wait_for_earlier(
            &["weft_events"],
            &stop,
            Duration::from_millis(5),
            || async {
                listed.set(true);
                Ok(vec!["running".to_owned()])
            },
            |_, _| ready(Ok(true)),
            ask_again,
        )
        .await;
        assert_eq!(r, Err(Stopped));
        assert!(!listed.get());
    }

    /// Failures (listing, then a round) go to `on_error`, counted; asking again after a
    /// failed round waits for the same inserts, without a new snapshot.
    #[tokio::test]
    async fn a_failure_is_asked_again_for_the_same_inserts() {
        let (_tx, stop) = watch::channel(false);
        let snapshots = Cell::new(0);
        let rounds = RefCell::new(Vec::new());
        let errors = RefCell::new(Vec::new());
        let r = play(
            &stop,
            || {
                snapshots.set(snapshots.get() + 1);
                ready(if snapshots.get() == 1 {
                    Err(unreachable_error())
                } else {
                    Ok(vec!["killed-insert".to_owned()])
                })
            },
            |ids, _| {
                rounds.borrow_mut().push(ids);
                ready(match rounds.borrow().len() {
                    1 => Err(unreachable_error()),
                    2 => Ok(false),
                    _ => Ok(true),
                })
            },
            |e: StoreError, failures| {
                errors.borrow_mut().push((e.is_transient(), failures));
                ready(Ok::<(), Stopped>(()))
            },
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(snapshots.get(), 2, "the failed listing was asked again");
        assert_eq!(errors.into_inner(), [(true, 1), (true, 2)]);
        assert_eq!(rounds.into_inner().len(), 3);
    }

    /// `on_error` giving up ends the wait with its error.
    #[tokio::test]
    async fn on_error_gives_up_with_its_error() {
        #[derive(Debug, PartialEq)]
        enum Gave {
            Up(u32),
            Stopped,
        }
        impl From<Stopped> for Gave {
            fn from(_: Stopped) -> Self {
                Gave::Stopped
            }
        }
        let (_tx, stop) = watch::channel(false);
        let r = play(
            &stop,
            || ready(Ok(vec!["killed-insert".to_owned()])),
            |_, _| ready(Err(unreachable_error())),
            |_, failures| ready(Err(Gave::Up(failures))),
        )
        .await;
        assert_eq!(r, Err(Gave::Up(1)));
    }
}
