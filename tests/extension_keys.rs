//! Spec conventions at every entry: top-level payload keys neither defined by their kind nor
//! of the `x_<org>_<field>` shape are counted and logged by ingest and by `weft publish` (and
//! refused by `weft publish --refuse-nonconforming-keys`); the events themselves are valid
//! and stored. (The gateway's count and refusal: `tests/gateway_limits.rs`.)

mod common;

use std::time::Duration;

use common::pipeline::{free_port, wait_for_port, Pipeline};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

fn event(id: &str, extra: &str) -> String {
    format!(
        r#"{{"event_id":"{id}","event_type":"flow_started","timestamp":"2026-03-08T06:00:05Z"{extra}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_counts_and_logs_nonconforming_keys_and_stores_the_events() {
    let p = Pipeline::new("it_extkeys");
    let none = p.path("none.jsonl");
    std::fs::write(&none, "").unwrap();
    p.publish(&none); // the topics
    let topic = format!("{}trace_events", p.prefix);
    let prod: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .create()
        .unwrap();
    // Straight into Kafka, past the publisher: two odd keys, one odd key again, none.
    for (id, extra) in [
        (
            "te-odd-1",
            r#","weaver_reserved":1,"Foo":2,"x_weaver_signature":"s""#,
        ),
        ("te-odd-2", r#","weaver_reserved":3"#),
        ("te-fine", r#","x_acme_note":"n""#),
    ] {
        prod.send(
            FutureRecord::to(&topic).key(id).payload(&event(id, extra)),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let _ingest = p.ingest(Some(&addr));
    p.wait_for_facts(3, Duration::from_secs(120)).await;
    assert!(wait_for_port(&addr, Duration::from_secs(10)));
    assert_eq!(
        common::metric(&addr, "weft_ingest_nonconforming_keys_total").await,
        Some(3)
    );
    let log = p.ingest_log_all();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("neither in the spec nor x_<org>_<field>"))
        .collect();
    // Each odd key once, whatever order the partitions came in (te-odd-2 first logs
    // weaver_reserved alone, and te-odd-1 then only Foo); the x_ extension never.
    let mut keys: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.split("keys=").nth(1)?.split(" tenant=").next())
        .flat_map(|k| k.split(", "))
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["Foo", "weaver_reserved"],
        "each key logged once: {lines:?}"
    );
}

#[test]
fn weft_publish_counts_nonconforming_keys_and_refuses_them_when_told() {
    let p = Pipeline::new("it_extkeys_pub");
    let file = p.path("odd.jsonl");
    let line = |id: &str| {
        format!(
            r#"{{"kind":"trace_event","payload":{}}}"#,
            event(id, r#","weaver_reserved":1"#)
        )
    };
    std::fs::write(&file, format!("{}\n", line("te-pub-odd"))).unwrap();
    let run = |extra: &[&str]| {
        p.weft()
            .arg("publish")
            .arg(&file)
            .args(extra)
            .arg("--spool-dir")
            .arg(p.path("spool"))
            .env("RUST_LOG", "info")
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 published to Kafka"), "{stdout}");
    assert!(
        stderr.contains("keys=weaver_reserved")
            && stderr
                .lines()
                .any(|l| l.contains("(counted;") && l.trim_end().ends_with("keys=1")),
        "logged once with the key, and counted: {stderr}"
    );
    std::fs::write(&file, format!("{}\n", line("te-pub-odd-2"))).unwrap();
    let out = run(&["--refuse-nonconforming-keys"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("line 1: rejected: [nonconforming_key]")
            && stderr.contains("weaver_reserved"),
        "{stderr}"
    );
}
