//! A private pipeline for one test: its own topic prefix, ClickHouse database, consumer group
//! and spool folder on the shared local stack, plus the `weft` processes it runs.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use clickhouse::Client;
use serde_json::Value;
use weft_schemas::Envelope;
use weft_sim::GroundTruth;

use super::{brokers, clickhouse_url, unique, wait_for, weft};

/// Narrative id -> its live members as (kind, id).
pub type Membership = BTreeMap<String, BTreeSet<(String, String)>>;

pub struct Pipeline {
    pub prefix: String,
    pub db: String,
    pub dir: PathBuf,
}

/// A child process killed (SIGKILL) when dropped, so a failing test leaves nothing behind.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Send SIGTERM and wait for a clean exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.0.id() as i32;
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        self.0.wait().unwrap()
    }

    /// SIGKILL, as a crash would.
    pub fn sigkill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// The exit status once the process ends on its own, or `None` if it still runs after
    /// `timeout`.
    pub fn exit_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        super::wait_for(timeout, || self.0.try_wait().ok().flatten())
    }
}

/// `out`, after asserting that its command (`what`) succeeded.
pub fn check(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The temp folder goes with the pipeline; a failing test keeps it, for its logs and files.
impl Drop for Pipeline {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Pipeline {
    /// Fresh names, a temp folder, and a migrated database.
    pub fn new(tag: &str) -> Self {
        let name = unique(tag);
        let p = Self {
            prefix: format!("{name}."),
            db: name.clone(),
            dir: std::env::temp_dir().join(&name),
        };
        std::fs::create_dir_all(&p.dir).unwrap();
        check(p.weft().arg("migrate").output().unwrap(), "weft migrate");
        p
    }

    /// `weft` bound to this pipeline's database, topics and stack.
    pub fn weft(&self) -> Command {
        let mut c = weft();
        c.env("WEFT_KAFKA_BROKERS", brokers())
            .env("WEFT_CLICKHOUSE_URL", clickhouse_url())
            .env("WEFT_CLICKHOUSE_DATABASE", &self.db)
            .env("WEFT_TOPIC_PREFIX", &self.prefix)
            .env("RUST_LOG", "warn");
        c
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `weft simulate ARGS --out events.jsonl --truth truth.json`; returns the truth.
    pub fn simulate(&self, args: &[&str]) -> GroundTruth {
        let out = self
            .weft()
            .arg("simulate")
            .args(args)
            .arg("--out")
            .arg(self.path("events.jsonl"))
            .arg("--truth")
            .arg(self.path("truth.json"))
            .output()
            .unwrap();
        check(out, "weft simulate");
        serde_json::from_slice(&std::fs::read(self.path("truth.json")).unwrap()).unwrap()
    }

    /// `weft publish FILE --drain-spool` into this pipeline's topics: returns once every
    /// event is in Kafka. The long delivery timeout keeps a slow (loaded) broker from
    /// counting as down: a timed-out idempotent producer bumps its epoch, which makes
    /// tansu 0.6's sqlite engine panic (see deploy/local/README.md). Spooling has its own tests.
    pub fn publish(&self, file: &Path) {
        self.publish_with(file, &[]);
    }

    /// [`Pipeline::publish`] with extra environment variables (`WEFT_CONFIG`, say).
    pub fn publish_with(&self, file: &Path, env: &[(&str, &str)]) {
        let out = self
            .weft()
            .envs(env.iter().copied())
            .arg("publish")
            .arg(file)
            .arg("--drain-spool")
            .args(["--message-timeout-ms", "300000"])
            .arg("--topic-prefix")
            .arg(&self.prefix)
            .arg("--spool-dir")
            .arg(self.path("spool"))
            .output()
            .unwrap();
        check(out, "weft publish");
    }

    /// Write `lines` (one event each) to `name` in this pipeline's folder, start ingest,
    /// publish them, and wait until every one is stored.
    pub async fn ingest_events(&self, name: &str, lines: &[String]) -> Proc {
        let file = self.path(name);
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        let ingest = self.ingest(None);
        self.publish(&file);
        self.wait_for_facts(lines.len() as u64, Duration::from_secs(120))
            .await;
        ingest
    }

    /// Start `weft ingest` for this pipeline (status server off unless `listen` is given).
    pub fn ingest(&self, listen: Option<&str>) -> Proc {
        self.ingest_with(listen, &[])
    }

    /// [`Pipeline::ingest`] with extra environment variables.
    pub fn ingest_with(&self, listen: Option<&str>, env: &[(&str, &str)]) -> Proc {
        self.ingest_args(listen, env, &[])
    }

    /// [`Pipeline::ingest`] with extra environment variables and arguments.
    pub fn ingest_args(&self, listen: Option<&str>, env: &[(&str, &str)], args: &[&str]) -> Proc {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("ingest.log"))
            .unwrap();
        let child = self
            .weft()
            .arg("ingest")
            .arg("--listen")
            .arg(listen.unwrap_or(""))
            // The pipeline's own group, unless `args` names another.
            .args(
                ["--group", &self.db]
                    .iter()
                    .filter(|_| !args.contains(&"--group")),
            )
            .args(args)
            // `WEFT_TEST_RUST_LOG=info,weft_consumers::ingest=debug`, say, when a test fails.
            .env(
                "RUST_LOG",
                std::env::var("WEFT_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Proc(child)
    }

    /// Start `weft router` on a free loopback port for this pipeline's topics, with one key
    /// for `tenant` and the given policy flags; returns the process and its base URL.
    pub fn router(&self, key: &str, tenant: &str, policy: &[&str]) -> (Proc, String) {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(self.path("router.log")).unwrap();
        let child = self
            .weft()
            .env("WEFT_ROUTER_KEYS", format!("{key}={tenant}"))
            .args(["router", "--listen", &addr])
            .args(policy)
            .args(["--topic-prefix", &self.prefix, "--no-create-topics"])
            .arg("--spool-dir")
            .arg(self.path("router-spool"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        assert!(
            wait_for_port(&addr, Duration::from_secs(30)),
            "router did not listen"
        );
        (Proc(child), format!("http://{addr}"))
    }

    /// Everything the ingest processes of this pipeline have logged so far.
    pub fn ingest_log_all(&self) -> String {
        std::fs::read_to_string(self.path("ingest.log")).unwrap_or_default()
    }

    /// The last 30 lines of the ingest processes' shared log, for failure messages. Assert on
    /// [`Pipeline::ingest_log_all`]: a line can scroll out of the tail.
    pub fn ingest_log(&self) -> String {
        let text = self.ingest_log_all();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn client(&self) -> Client {
        Client::default()
            .with_url(clickhouse_url())
            .with_database(&self.db)
            .with_setting("prefer_column_name_to_alias", "1")
    }

    /// `weft audit serve` on a free loopback port with the API keys `keys`
    /// (`WEFT_AUDIT_KEYS`: `key=tenant,...`) and `extra` flags, its log in `log`: the process
    /// and its address (`host:port`), once it listens.
    pub fn audit_serve(&self, keys: &str, log: &str, extra: &[&str]) -> (Proc, String) {
        let addr = format!("127.0.0.1:{}", free_port());
        let proc = Proc(
            self.weft()
                .args(["audit", "serve", "--listen", &addr])
                .args(extra)
                .env("WEFT_AUDIT_KEYS", keys)
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(self.path(log)).unwrap())
                .spawn()
                .unwrap(),
        );
        assert!(
            wait_for_port(&addr, Duration::from_secs(20)),
            "audit API did not start (log: {log})"
        );
        (proc, addr)
    }

    /// weft's own handle on this pipeline's database, for calling the product crates.
    pub fn store(&self) -> weft_store::Store {
        weft_store::Store::new(weft_store::ClickHouseConfig {
            url: clickhouse_url(),
            database: self.db.clone(),
            ..Default::default()
        })
        .unwrap()
    }

    /// A single number from ClickHouse.
    pub async fn scalar(&self, sql: &str) -> u64 {
        self.client().query(sql).fetch_one::<u64>().await.unwrap()
    }

    /// Wait until `weft_events` holds `n` rows; panics with the ingest log otherwise.
    pub async fn wait_for_facts(&self, n: u64, timeout: Duration) {
        self.wait_for_count("SELECT count() FROM weft_events", n, timeout)
            .await;
    }

    /// Wait until the count `sql` returns reaches `n`; panics with the ingest log otherwise.
    pub async fn wait_for_count(&self, sql: &str, n: u64, timeout: Duration) -> u64 {
        let deadline = std::time::Instant::now() + timeout;
        let mut last = 0;
        while std::time::Instant::now() < deadline {
            last = self.scalar(sql).await;
            if last >= n {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "only {last} of {n} after {timeout:?} ({sql}); ingest log:\n{}",
            self.ingest_log()
        );
    }

    /// The distinct `shard` labels of the projector's progress rows.
    pub async fn progress_shards(&self) -> Vec<String> {
        self.client()
            .query("SELECT DISTINCT shard FROM weft_projector_progress ORDER BY shard")
            .fetch_all()
            .await
            .unwrap()
    }

    /// The live narrative membership stored in ClickHouse.
    pub async fn membership(&self) -> Membership {
        let rows: Vec<(String, String, String)> = self
            .client()
            .query(
                "SELECT narrative_id, kind, id FROM ( \
                   SELECT narrative_id, kind, id, content_hash, argMax(is_deleted, version) AS gone \
                   FROM weft_narratives GROUP BY narrative_id, kind, id, content_hash) \
                 WHERE gone = 0",
            )
            .fetch_all()
            .await
            .unwrap();
        let mut m = Membership::new();
        for (n, k, i) in rows {
            m.entry(n).or_default().insert((k, i));
        }
        m
    }

    /// Poll until the stored narratives equal `want`, or panic with the first difference.
    pub async fn wait_for_narratives(&self, want: &Membership, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let got = self.membership().await;
            if &got == want {
                return;
            }
            if std::time::Instant::now() >= deadline {
                let diff = first_difference(&got, want);
                panic!(
                    "narratives differ from the ground truth: {diff}\ningest log:\n{}",
                    self.ingest_log()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// The ground truth as a membership map.
pub fn truth_membership(t: &GroundTruth) -> Membership {
    t.requests
        .iter()
        .map(|r| {
            let members = r
                .members
                .iter()
                .map(|m| (m.kind.as_str().to_owned(), m.id.clone()))
                .collect();
            (r.request_id.clone(), members)
        })
        .collect()
}

/// The first narrative where two memberships differ, keyed by narrative (or by tenant and
/// narrative), for failure messages.
pub fn first_difference<K: Ord + std::fmt::Debug>(
    got: &BTreeMap<K, BTreeSet<(String, String)>>,
    want: &BTreeMap<K, BTreeSet<(String, String)>>,
) -> String {
    for (n, w) in want {
        match got.get(n) {
            None => return format!("narrative {n:?} missing ({} members expected)", w.len()),
            Some(g) if g != w => {
                let missing: Vec<_> = w.difference(g).take(5).collect();
                let extra: Vec<_> = g.difference(w).take(5).collect();
                return format!("narrative {n:?}: missing {missing:?}, unexpected {extra:?}");
            }
            _ => {}
        }
    }
    let extra: Vec<&K> = got
        .keys()
        .filter(|k| !want.contains_key(*k))
        .take(5)
        .collect();
    format!(
        "unexpected narratives {extra:?} ({} in total vs {})",
        got.len(),
        want.len()
    )
}

/// Distinct facts (tenant, kind, id, content) in JSONL files of envelopes.
pub fn distinct_facts(files: &[&Path]) -> u64 {
    let mut seen = HashSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let env: Envelope = serde_json::from_str(line).unwrap();
            let (payload, id): (Value, String) = env.validate().unwrap();
            let hash = weft_schemas::identity::content_hash(&payload).unwrap();
            seen.insert((env.tenant.clone(), env.kind, id, hash));
        }
    }
    seen.len() as u64
}

/// Wait (bounded) for a TCP port to accept connections.
pub fn wait_for_port(addr: &str, timeout: Duration) -> bool {
    wait_for(timeout, || {
        std::net::TcpStream::connect(addr).ok().map(|_| ())
    })
    .is_some()
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
