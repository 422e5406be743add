//! `weft ingest` hands freed memory back to the system within a quarter second: jemalloc's
//! background purge threads run, from the settings compiled into the binary (`src/main.rs`,
//! `malloc_conf`), and `MALLOC_CONF` still overrides them. The memory budget counts on it: with
//! jemalloc's defaults, a drain's peak also held the batches freed in the last ten seconds
//! (docs/BENCHMARKS.md, "Batch size and the allocator").
#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::pipeline::{distinct_facts, Pipeline, Proc};

/// The names of the process's threads (`/proc/PID/task/*/comm`).
fn threads(p: &Proc) -> Vec<String> {
    let dir = format!("/proc/{}/task", p.0.id());
    std::fs::read_dir(dir)
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (at most 30 s) until the process runs a thread named `name`.
fn wait_for_thread(p: &Proc, name: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let names = threads(p);
        if names.iter().any(|n| n == name) || Instant::now() > deadline {
            return names;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_runs_the_allocators_purge_threads_unless_malloc_conf_says_otherwise() {
    let p = Pipeline::new("it_alloc");
    p.simulate(&["--events", "200", "--seed", "3", "--clean"]);
    let events = p.path("events.jsonl");
    p.publish(&events);
    let valid = distinct_facts(&[&events]);

    let ingest = p.ingest(None);
    p.wait_for_facts(valid, Duration::from_secs(60)).await;
    let names = wait_for_thread(&ingest, "jemalloc_bg_thd");
    assert!(
        names.iter().any(|n| n == "jemalloc_bg_thd"),
        "no jemalloc background thread in weft ingest: the compiled-in malloc_conf is not in \
         effect (threads: {names:?})"
    );
    drop(ingest);

    // The environment overrides the compiled-in settings. Once the runtime's workers run,
    // the allocator has long been initialized, so its threads would be there by now.
    let off = p.ingest_with(None, &[("MALLOC_CONF", "background_thread:false")]);
    let names = wait_for_thread(&off, "tokio-rt-worker");
    assert!(
        names.iter().any(|n| n == "tokio-rt-worker"),
        "weft ingest did not start its runtime: {names:?}\n{}",
        p.ingest_log()
    );
    assert!(
        !names.iter().any(|n| n == "jemalloc_bg_thd"),
        "MALLOC_CONF=background_thread:false left a background thread: {names:?}"
    );
}
