//! The Publisher's CPU hot path without Kafka: parse an envelope, validate it (JSON Schema +
//! identity), encode the record (value + headers), and frame it for the spool. Run with
//! `cargo bench -p weft-producers`; `weft bench publish` measures the whole path into a broker.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use weft_producers::spool::SpoolRecord;
use weft_schemas::wire::{self, ContentType, SchemaIds};
use weft_schemas::Envelope;

const ENVELOPE: &str = r#"{"kind":"trace_event","request_id":"req-1","tenant":"acme","payload":{"event_id":"bench-1","event_type":"capability_executed","timestamp":"2026-03-08T06:00:05.123456Z","capability_id":"org.weft.bench","decision_id":"pd-1","outcome":"success","metadata":{"flow_id":"f-1","pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}}"#;

fn hot_path(c: &mut Criterion) {
    let env: Envelope = serde_json::from_str(ENVELOPE).unwrap_or_else(|e| panic!("{e}"));
    let ids = SchemaIds::default();
    let mut g = c.benchmark_group("publish_hot_path");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse_envelope", |b| {
        b.iter(|| serde_json::from_str::<Envelope>(black_box(ENVELOPE)))
    });
    g.bench_function("validate", |b| b.iter(|| black_box(&env).validate()));
    // validate's parts: the payload parsed into a serde_json tree, then the schema check.
    g.bench_function("validate_parse_value", |b| {
        b.iter(|| serde_json::from_str::<serde_json::Value>(black_box(env.payload.get())))
    });
    let payload = env.payload_value().unwrap_or_else(|e| panic!("{e}"));
    let validator = weft_schemas::validate::Validator::global();
    g.bench_function("validate_schema_is_valid", |b| {
        b.iter(|| validator.is_valid("trace_event", black_box(&payload)))
    });
    g.bench_function("validate_schema_report", |b| {
        b.iter(|| validator.check("trace_event", black_box(&payload)))
    });
    g.bench_function("emitted_at_now", |b| {
        b.iter(weft_schemas::time::now_rfc3339)
    });
    g.bench_function("encode_json", |b| {
        b.iter(|| {
            let v = wire::encode_value(black_box(&env), ContentType::Json, &ids);
            let h = wire::encode_headers(black_box(&env), ContentType::Json);
            (v, h)
        })
    });
    g.bench_function("encode_avro_single_object", |b| {
        b.iter(|| wire::encode_value(black_box(&env), ContentType::AvroSingleObject, &ids))
    });
    let rec = SpoolRecord {
        topic: "weaver.trace_events".into(),
        key: Some(b"req-1".to_vec()),
        value: env.payload.get().as_bytes().to_vec(),
        headers: wire::encode_headers(&env, ContentType::Json)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into_bytes()))
            .collect(),
    };
    g.bench_function("spool_frame", |b| {
        let mut buf = Vec::with_capacity(1024);
        b.iter(|| {
            buf.clear();
            black_box(&rec).encode_into(&mut buf);
            crc32fast::hash(&buf)
        })
    });
    g.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
