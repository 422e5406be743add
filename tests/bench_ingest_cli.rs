//! `weft bench ingest` on the local stack, small: the report's counts must add up, so the
//! figures in docs/BENCHMARKS.md come from a run that stored and checked every event.

mod common;

use serde_json::Value;

#[test]
fn bench_ingest_stores_every_event_and_every_floor_sees_every_record() {
    let out = common::weft()
        .args([
            "bench",
            "ingest",
            "--events",
            "3000",
            "--partitions",
            "2",
            "--kafka-engine",
            "none",
            "--floor",
            "--sample",
            "200",
            "--json",
        ])
        .output()
        .expect("run weft bench ingest");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weft bench ingest failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report on stdout");

    let envelopes = report["envelopes"].as_u64().expect("envelopes");
    let distinct = report["distinct_events"].as_u64().expect("distinct_events");
    assert!(envelopes >= 3000, "{envelopes} envelopes");
    assert_eq!(report["weft"]["rows"].as_u64(), Some(distinct));
    assert_eq!(report["weft_totals"]["dead_lettered"].as_u64(), Some(0));
    assert!(report["weft"]["events_per_consumer_cpu_s"].as_f64() > Some(0.0));

    let floors = report["floors"].as_array().expect("floors");
    assert_eq!(floors.len(), 3, "{floors:?}");
    for f in floors {
        assert_eq!(f["events"].as_u64(), Some(envelopes), "{f}");
        assert_eq!(f["invalid"].as_u64(), Some(0), "{f}");
        assert!(f["consumer_cpu_s"].as_f64() > Some(0.0), "{f}");
    }
    // Only the last floor stores, and it stores every record it received.
    assert_eq!(floors[0]["stored"].as_u64(), Some(0));
    assert_eq!(floors[2]["stored"].as_u64(), Some(envelopes));

    let steps = report["steps"].as_array().expect("steps");
    assert!(!steps.is_empty());
}
