//! The local stack heals: on the sqlite engine, tansu is SIGKILLed while `weft publish` is
//! mid-way through a file; the stack's supervisor restarts it with no manual step, the
//! publisher's spool drains, and ingest stores every event exactly once.
//!
//! Runs in the fault phase (`deploy/local/test.sh`), alone, against a stack started by
//! `stack.sh` with its supervisor (the default).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::pipeline::{distinct_facts, Pipeline};

fn run_dir() -> std::path::PathBuf {
    std::env::var_os("WEFT_RUN_DIR")
        .map(Into::into)
        .unwrap_or_else(|| common::repo_root().join(".weft/run"))
}

fn kafka_pid() -> Option<i32> {
    let text = std::fs::read_to_string(run_dir().join("kafka.pid")).ok()?;
    let pid: i32 = text.trim().parse().ok()?;
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmd)
        .contains("broker")
        .then_some(pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_supervisor_restarts_a_killed_broker_and_nothing_is_lost() {
    let supervisor_log = run_dir().join("supervisor.log");
    let before = std::fs::read_to_string(&supervisor_log).unwrap_or_default();
    assert!(
        std::fs::read_to_string(run_dir().join("supervisor.pid")).is_ok(),
        "no supervisor running: start the stack with deploy/local/stack.sh (WEFT_SUPERVISE=1)"
    );
    let p = Pipeline::new("it_superv");
    p.simulate(&["--events", "20000", "--seed", "17", "--clean"]);
    let file = p.path("events.jsonl");
    let want = distinct_facts(&[&file]);
    // Topics first, so ingest can subscribe before the publisher runs.
    let none = p.path("none.jsonl");
    std::fs::write(&none, "").unwrap();
    p.publish(&none);
    let ingest = p.ingest(None);

    let publish = p
        .weft()
        .arg("publish")
        .arg(&file)
        .args(["--drain-spool", "--drain-timeout", "300"])
        .arg("--spool-dir")
        .arg(p.path("spool"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-way: some events stored, so the kill lands while the publisher is sending.
    p.wait_for_facts(1000, Duration::from_secs(120)).await;
    let pid = kafka_pid().expect("kafka pid of the local stack");
    // SAFETY: SIGKILL to the broker process of our own local stack.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let t0 = std::time::Instant::now();
    let restarted = common::wait_for(Duration::from_secs(120), || {
        let log = std::fs::read_to_string(&supervisor_log).unwrap_or_default();
        let new_lines = log[before.len().min(log.len())..].to_owned();
        new_lines.contains("kafka restarted").then_some(new_lines)
    });
    let new_lines = restarted.unwrap_or_else(|| {
        let log = std::fs::read_to_string(&supervisor_log).unwrap_or_default();
        panic!(
            "the supervisor did not restart the broker:\n{}",
            &log[before.len().min(log.len())..]
        )
    });
    assert!(kafka_pid().is_some_and(|new| new != pid), "{new_lines}");
    eprintln!(
        "broker SIGKILLed; restarted by the supervisor after {:?}",
        t0.elapsed()
    );

    let out = tokio::task::spawn_blocking(move || publish.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "publish: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("wait in the spool"), "{stdout}");

    p.wait_for_facts(want, Duration::from_secs(300)).await;
    let rows = p.scalar("SELECT count() FROM weft_events").await;
    let distinct = p
        .scalar("SELECT uniqExact(tenant, kind, id) FROM weft_events")
        .await;
    assert_eq!(
        (rows, distinct),
        (want, want),
        "every event stored exactly once"
    );
    assert_eq!(ingest.terminate().code(), Some(0), "{}", p.ingest_log());
}
