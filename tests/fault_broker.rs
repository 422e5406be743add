//! Broker faults: the broker is stopped under load, and a publishing process is killed while
//! its spool holds events. Every event the Publisher confirmed as durable must reach Kafka,
//! in per-request order.
//!
//! These tests stop the shared local broker, so they live in this one binary and run alone:
//!   cargo test --test fault_broker -- --test-threads=1
//! (`deploy/local/test.sh` runs every `tests/fault_*.rs` that way; the main test run skips
//! tests named `fault_*`.) A drop guard restarts the broker even when a test fails.

mod common;
mod publish_support;

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use publish_support::{config, consume, event_ids, trace_envelope};
use weft_producers::spool::{Spool, SpoolOptions};
use weft_producers::{Delivery, FsyncPolicy, Publisher, Receipt};
use weft_schemas::Envelope;

/// Stops the local broker, and starts it again when dropped if it is still stopped.
struct Broker {
    stopped: bool,
}

fn stack(action: &str) {
    let out = Command::new("bash")
        .arg(common::repo_root().join("deploy/local/stack.sh"))
        .args([action, "kafka"])
        .current_dir(common::repo_root())
        .output()
        .expect("run stack.sh");
    assert!(
        out.status.success(),
        "stack.sh {action} kafka failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Broker {
    fn stop() -> Self {
        stack("stop");
        Broker { stopped: true }
    }
    fn start(&mut self) {
        stack("start");
        self.stopped = false;
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if self.stopped {
            stack("start");
        }
    }
}

/// Publisher logs on stderr when RUST_LOG is set (e.g. RUST_LOG=weft_producers=info).
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The step number a test event carries (`metadata.step`), to check per-request order.
fn step_of(env: &Envelope) -> u64 {
    env.payload_value().unwrap()["metadata"]["step"]
        .as_u64()
        .unwrap()
}

/// Per key, the steps in partition order (first occurrence; replays may duplicate) must
/// increase.
fn assert_per_request_order(recs: &[publish_support::Rec]) {
    for (key, recs) in publish_support::by_key(recs) {
        let mut seen = HashSet::new();
        let steps: Vec<u64> = recs
            .iter()
            .map(|r| step_of(&r.envelope()))
            .filter(|s| seen.insert(*s))
            .collect();
        let mut sorted = steps.clone();
        sorted.sort_unstable();
        assert_eq!(
            steps,
            sorted,
            "request {} out of order",
            String::from_utf8_lossy(&key)
        );
    }
}

/// 60 s without a broker under constant publishing: every acknowledged event arrives, in
/// per-request order, and the outage really went through the spool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_broker_outage_60s_every_acked_event_arrives_in_order() {
    logs();
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let mut cfg = config(&prefix, spool.path());
    cfg.message_timeout_ms = 5_000;
    cfg.fsync = FsyncPolicy::Always;
    let p = Publisher::connect(cfg).await.unwrap();
    p.ensure_topics().await.unwrap();

    // Publisher thread: ~50 events/s over 20 requests, each request's steps in order. (Kept
    // modest: tansu's sqlite engine fetches each record's headers by scanning every stored
    // header, so reading back tens of thousands of events takes minutes.)
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let p = p.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut receipts: Vec<(String, Receipt)> = Vec::new();
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let req = format!("req-{}", i % 20);
                let env = trace_envelope("outage", i, Some(&req));
                let r = p.publish(env).expect("valid event accepted");
                receipts.push((format!("te-outage-{i}"), r));
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            receipts
        })
    };
    let wait_published = |n: u64| {
        common::wait_for(Duration::from_secs(30), || {
            (p.metrics().published.get() >= n).then_some(())
        })
    };
    assert!(
        wait_published(100).is_some(),
        "publishing before the outage"
    );

    let mut broker = Broker::stop();
    let down_at = Instant::now();
    // The outage must be noticed and spooled while the broker is down.
    assert!(
        common::wait_for(Duration::from_secs(30), || p.is_spooling().then_some(())).is_some(),
        "publisher never switched to the spool"
    );
    while down_at.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let spooled_during_outage = p.metrics().spooled.get();
    assert!(
        spooled_during_outage > 1_000,
        "spooled {spooled_during_outage}"
    );
    broker.start();
    // Under constant load the spool drains and publishing goes direct again (handover) ...
    let direct = common::wait_for(Duration::from_secs(120), || {
        (!p.is_spooling()).then_some(())
    });
    assert!(
        direct.is_some(),
        "still spooling 120 s after the broker came back"
    );
    // ... and keeps going direct for a while.
    let published_at_direct = p.metrics().published.get();
    assert!(wait_published(published_at_direct + 300).is_some());
    stop.store(true, Ordering::SeqCst);
    let receipts = tokio::task::spawn_blocking(move || worker.join().unwrap())
        .await
        .unwrap();

    let mut acked = Vec::new();
    let (mut via_kafka, mut via_spool) = (0, 0);
    for (id, r) in receipts {
        match r.await {
            Ok(Delivery::Kafka { .. }) => via_kafka += 1,
            Ok(Delivery::Spooled) => via_spool += 1,
            Err(e) => panic!("event {id} not made durable: {e}"),
        }
        acked.push(id);
    }
    assert!(
        via_spool > 1_000 && via_kafka > 300,
        "{via_kafka} / {via_spool}"
    );
    let p2 = p.clone();
    let drained = tokio::task::spawn_blocking(move || p2.wait_drained(Duration::from_secs(180)))
        .await
        .unwrap();
    assert!(drained, "spool still holds {} events", p.spool_pending());
    assert_eq!(p.spool_pending(), 0);
    assert!(p.metrics().replayed.get() >= via_spool);

    let topics = vec![p.topics().topic(weft_schemas::Kind::TraceEvent)];
    let recs = consume(&topics, acked.len(), Duration::from_secs(120));
    let got: HashSet<String> = event_ids(&recs).into_iter().collect();
    let missing: Vec<&String> = acked.iter().filter(|id| !got.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged events missing, e.g. {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(5)]
    );
    assert_per_request_order(&recs);
    let p2 = p.clone();
    tokio::task::spawn_blocking(move || p2.close(Duration::from_secs(10)))
        .await
        .unwrap();
}

fn spool_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `weft publish` of a big file while the broker is down is killed with SIGKILL once its
/// spool holds events; after the broker is back, `weft publish --drain-spool` delivers
/// every event the spool held, in per-request order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_broker_sigkill_of_a_spooling_publisher_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spool_dir = dir.path().join("spool");
    let prefix = common::unique("t") + ".";
    {
        let p = Publisher::connect(config(&prefix, &dir.path().join("setup-spool")))
            .await
            .unwrap();
        p.ensure_topics().await.unwrap();
        tokio::task::spawn_blocking(move || p.close(Duration::from_secs(5)))
            .await
            .unwrap();
    }
    let conf = dir.path().join("weft.toml");
    std::fs::write(
        &conf,
        "[publisher]\nqueue_bound = 100\nmessage_timeout_ms = 300\nfsync = \"always\"\n",
    )
    .unwrap();
    let weft = |extra: &[&str]| {
        let mut c = common::weft();
        c.arg("--config")
            .arg(&conf)
            .args(["publish", "--no-create-topics", "--topic-prefix", &prefix])
            .arg("--spool-dir")
            .arg(&spool_dir)
            .args(extra);
        c
    };

    let mut broker = Broker::stop();
    // A big input fed through stdin at ~2,000 lines/s, so the spool grows steadily (and
    // stays small enough to read back quickly) and the process is surely mid-way when killed.
    let mut child = weft(&["-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        for i in 0..1_000_000 {
            let env = trace_envelope("kill", i, Some(&format!("req-{}", i % 50)));
            if writeln!(stdin, "{}", serde_json::to_string(&env).unwrap()).is_err() {
                return; // the publisher was killed
            }
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    });
    let held = common::wait_for(Duration::from_secs(120), || {
        (spool_bytes(&spool_dir) > 400_000).then_some(())
    });
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    feeder.join().unwrap();
    assert!(held.is_some(), "the spool never held 400 KB");
    assert!(
        still_running,
        "publisher finished before it could be killed"
    );

    // What the spool holds now (a torn tail, if any, is cut on open).
    let in_spool: Vec<String> = {
        let (mut s, report) = Spool::open(
            &spool_dir,
            SpoolOptions {
                fsync: FsyncPolicy::Never,
                max_bytes: u64::MAX,
                segment_bytes: 64 << 20,
            },
        )
        .unwrap();
        assert!(report.pending >= 500, "spool holds {}", report.pending);
        let mut ids = Vec::new();
        loop {
            let b = s.read_batch(10_000, u64::MAX).unwrap();
            if b.records.is_empty() {
                break;
            }
            for r in b.records {
                let v: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
                ids.push(v["event_id"].as_str().unwrap().to_owned());
            }
        }
        ids
    };
    assert_eq!(in_spool.len() as u64, {
        let uniq: HashSet<&String> = in_spool.iter().collect();
        uniq.len() as u64
    });

    broker.start();
    let out = weft(&[
        "--drain-spool",
        "--drain-timeout",
        "180",
        "--message-timeout-ms",
        "10000",
    ])
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drain failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("{} replayed from the spool", in_spool.len())),
        "{stdout}"
    );

    let topics = vec![format!("{prefix}trace_events")];
    let recs = consume(&topics, in_spool.len(), Duration::from_secs(120));
    let got: HashSet<String> = event_ids(&recs).into_iter().collect();
    let missing: Vec<&String> = in_spool.iter().filter(|id| !got.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} spooled events missing, e.g. {:?}",
        missing.len(),
        in_spool.len(),
        &missing[..missing.len().min(5)]
    );
    assert_per_request_order(&recs);
    // The spool is empty afterwards.
    assert!(
        spool_bytes(&spool_dir) == 0,
        "spool still has {} bytes",
        spool_bytes(&spool_dir)
    );
}
