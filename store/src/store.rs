//! The ClickHouse store: connection settings and the migration runner.
//!
//! Migrations are the files under `schemas/clickhouse/` (embedded by `weft-schemas`). Each is
//! applied once, in version order, and recorded in `weft_schema_migrations` with a checksum,
//! so re-running is a no-op and an edited, already-applied file is refused loudly instead of
//! silently diverging from production.

use clickhouse::{Client, Row, RowWrite};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{info, instrument};
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

    /// Wait (at most `limit`) until the inserts into `tables` of this database running on
    /// the server now have finished. A process killed while its insert was under way leaves
    /// that insert to land on its own, possibly after its successor has read where things
    /// stand; a process taking over these tables (or a share of them) calls this before
    /// reading its resume points. Inserts that start after the call are not waited for: they
    /// are not a predecessor's, and other writers sharing the tables would otherwise keep it
    /// waiting. Returns whether they finished within `limit` (it logs a warning if not).
    pub async fn wait_for_running_inserts(
        &self,
        tables: &[&str],
        limit: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let running = self.running_inserts(tables).await?;
        if running.is_empty() {
            return Ok(true);
        }
        info!(
            running = running.len(),
            ?tables,
            "waiting for the inserts running now (an earlier process's?) to land"
        );
        self.wait_for_queries(&running, limit).await
    }

    /// The `query_id`s of the inserts into `tables` of this database running on the server
    /// now, for [`Store::wait_for_queries`]: a caller that waits for them in several rounds
    /// keeps this list, so inserts started later (other writers') never keep it waiting.
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
