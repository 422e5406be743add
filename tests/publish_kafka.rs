//! The Publisher against the real local broker: what goes in comes back out byte for byte,
//! keyed per the key rule, with the envelope in headers; invalid events never reach Kafka.

mod common;
mod publish_support;

use std::collections::HashMap;
use std::time::Duration;

use publish_support::{config, consume, count, event_ids, trace_envelope};
use serde_json::Value;
use weft_producers::{Delivery, PublishError, Publisher, ValueFormat};
use weft_schemas::wire::header;
use weft_schemas::{Envelope, Kind};
use weft_sim::{generate, SimConfig};

async fn close(p: Publisher) {
    tokio::task::spawn_blocking(move || p.close(Duration::from_secs(10)))
        .await
        .unwrap();
}

/// Wait (up to 120 s) until `p`'s spool holds nothing more to send.
async fn wait_drained(p: &Publisher) {
    let drained = common::wait_for(Duration::from_secs(120), || {
        (p.spool_pending() == 0).then_some(())
    });
    assert!(
        drained.is_some(),
        "the spool did not drain: {} pending",
        p.spool_pending()
    );
}

/// The lines of the spool's `refused.jsonl`, parsed.
fn refused_lines(spool: &std::path::Path) -> Vec<Value> {
    let refused = std::fs::read_to_string(spool.join("refused.jsonl")).unwrap();
    refused
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_round_trips_byte_identical_with_the_key_rule() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let p = Publisher::connect(config(&prefix, spool.path()))
        .await
        .unwrap();
    let created = p.ensure_topics().await.unwrap();
    assert_eq!(created.len(), 9, "8 event topics and the dead-letter topic");
    assert!(p.ensure_topics().await.unwrap().is_empty(), "idempotent");

    // Realistic traffic of all eight kinds, some without a request id.
    let (envs, _) = generate(&SimConfig {
        seed: 7,
        flows: 12,
        no_request_id: 0.2,
        ..SimConfig::default()
    })
    .unwrap();
    let kinds: std::collections::BTreeSet<Kind> = envs.iter().map(|e| e.kind).collect();
    assert_eq!(kinds.len(), 8, "the sample covers every kind");
    assert!(envs.iter().any(|e| e.request_id.is_none()));

    let mut receipts = Vec::new();
    for e in &envs {
        receipts.push((e.clone(), p.publish(e.clone()).unwrap()));
    }
    let mut expected: HashMap<String, (Envelope, String)> = HashMap::new();
    for (e, r) in receipts {
        let id = r.id.clone();
        let d = r.await.unwrap();
        assert!(
            matches!(d, Delivery::Kafka { offset, .. } if offset >= 0),
            "{d:?}"
        );
        expected.insert(id.clone(), (e, id));
    }

    let topics = p.topics().event_topics();
    let recs = consume(&topics, envs.len(), Duration::from_secs(60));
    assert_eq!(recs.len(), envs.len(), "every event arrives");
    let mut seqs = std::collections::HashSet::new();
    for rec in &recs {
        let back = rec.envelope();
        let id =
            weft_schemas::identity::identity(back.kind, &back.payload_value().unwrap()).unwrap();
        let (sent, _) = expected
            .remove(&id)
            .unwrap_or_else(|| panic!("unexpected or duplicate record {id}"));
        assert_eq!(
            rec.value,
            sent.payload.get().as_bytes(),
            "value is the submitted payload text"
        );
        assert_eq!(back.payload.get(), sent.payload.get());
        assert_eq!(back.kind, sent.kind);
        assert_eq!(rec.topic, p.topics().topic(sent.kind));
        assert_eq!(back.tenant, sent.tenant);
        assert_eq!(back.request_id, sent.request_id);
        let want_key = sent.request_id.clone().unwrap_or(id.clone());
        assert_eq!(rec.key.as_deref(), Some(want_key.as_bytes()), "key rule");
        assert_eq!(
            back.producer_id.as_deref(),
            Some(p.producer_id()),
            "stamped"
        );
        assert!(back.emitted_at.is_some(), "stamped");
        assert!(seqs.insert(back.seq.unwrap()), "seq is unique per producer");
        assert_eq!(
            rec.header(header::CONTENT_TYPE).as_deref(),
            Some("application/json")
        );
    }
    assert!(
        expected.is_empty(),
        "missing: {:?}",
        expected.keys().collect::<Vec<_>>()
    );
    assert_eq!(p.metrics().published.get(), envs.len() as u64);
    close(p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_events_are_errors_and_never_published() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let p = Publisher::connect(config(&prefix, spool.path()))
        .await
        .unwrap();
    p.ensure_topics().await.unwrap();

    let bad_schema: Envelope = serde_json::from_str(
        r#"{"kind":"trace_event","payload":{"event_id":"x","event_type":"not_a_type","timestamp":"2026-03-08T06:00:05Z"}}"#,
    )
    .unwrap();
    let err = p.publish(bad_schema).unwrap_err();
    assert_eq!(err.code(), "schema_invalid", "{err}");
    let bad_tenant = trace_envelope("inv", 1, Some("r")).with_tenant("no spaces allowed");
    assert_eq!(p.publish(bad_tenant).unwrap_err().code(), "bad_tenant");
    let not_object: Envelope = serde_json::from_str(r#"{"kind":"frame","payload":[1,2]}"#).unwrap();
    assert!(matches!(
        p.publish(not_object),
        Err(PublishError::Invalid(_))
    ));

    // A valid one, published after the invalid ones, is the only record.
    let ok = p.publish(trace_envelope("inv", 2, Some("r"))).unwrap();
    ok.await.unwrap();
    let topics = p.topics().event_topics();
    let recs = consume(&topics, 1, Duration::from_secs(30));
    assert_eq!(recs.len(), 1);
    assert_eq!(count(&topics), 1, "no invalid event reached Kafka");
    close(p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_helper_and_avro_single_object() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let mut cfg = config(&prefix, spool.path());
    cfg.content_type = ValueFormat::Avro;
    cfg.tenant = "acme".into();
    let p = Publisher::connect(cfg).await.unwrap();
    p.ensure_topics().await.unwrap();

    let text = publish_support::trace_payload("avro", 1);
    let typed: weft_schemas::contracts::TraceEvent = serde_json::from_str(&text).unwrap();
    let r = p.publish_contract(&typed, Some("req-avro")).unwrap();
    assert_eq!(r.id, "te-avro-1");
    r.await.unwrap();

    let topics = vec![p.topics().topic(Kind::TraceEvent)];
    let recs = consume(&topics, 1, Duration::from_secs(30));
    assert_eq!(recs.len(), 1);
    let rec = &recs[0];
    assert_eq!(&rec.value[..2], &[0xC3, 0x01], "single-object framing");
    assert_eq!(
        rec.header(header::CONTENT_TYPE).as_deref(),
        Some("application/avro; framing=single-object")
    );
    let back = rec.envelope();
    assert_eq!(back.tenant, "acme");
    assert_eq!(back.request_id.as_deref(), Some("req-avro"));
    let got: Value = serde_json::from_str(back.payload.get()).unwrap();
    let want: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(got, want, "Avro decodes to an equal payload");
    close(p).await;
}

/// A 200 kB trace event: over the 100 kB the tests below restart their publisher with.
fn big() -> Envelope {
    serde_json::from_str(&format!(
        r#"{{"kind":"trace_event","request_id":"r","payload":{{"event_id":"te-big","event_type":"flow_failed","timestamp":"2026-03-08T06:00:05Z","error_message":"{}"}}}}"#,
        "e".repeat(200_000)
    ))
    .unwrap()
}

/// Spool `events` in `online`'s spool: a publisher whose broker is unreachable (nothing
/// listens on the discard port, every delivery times out) spools every one.
async fn spooled(online: &weft_producers::PublisherConfig, events: Vec<Envelope>) {
    let offline = weft_producers::PublisherConfig {
        brokers: "127.0.0.1:9".into(),
        message_timeout_ms: 300,
        max_message_bytes: 400_000,
        ..online.clone()
    };
    let p = Publisher::connect(offline).await.unwrap();
    for e in events {
        assert_eq!(p.publish(e).unwrap().await.unwrap(), Delivery::Spooled);
    }
    close(p).await;
}

/// A publisher of `online`'s spool against the real broker, allowing 100 kB messages only:
/// [`big`] is refused for good on replay.
async fn restarted(online: &weft_producers::PublisherConfig) -> Publisher {
    let p = Publisher::connect(weft_producers::PublisherConfig {
        max_message_bytes: 100_000,
        ..online.clone()
    })
    .await
    .unwrap();
    p.ensure_topics().await.unwrap();
    p
}

/// A record refused for good that cannot be set aside (`refused.jsonl` cannot be written) stays
/// the spool's: its round is retried, and nothing moves past it until the file can be
/// written. The cursor used to move on with the record only in a log line: an acknowledged
/// event lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_event_that_cannot_be_set_aside_stays_in_the_spool() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let online = config(&prefix, spool.path());
    spooled(&online, vec![trace_envelope("noroom", 1, Some("r")), big()]).await;
    // Where refused.jsonl goes, a directory: the append fails.
    let file = spool.path().join("refused.jsonl");
    std::fs::create_dir(&file).unwrap();

    let p = restarted(&online).await;
    // The small event is acknowledged in every round: two copies mean two rounds went.
    let topics = p.topics().event_topics();
    let recs = consume(&topics, 2, Duration::from_secs(60));
    assert_eq!(recs.len(), 2, "{:?}", event_ids(&recs));
    assert_eq!(
        p.spool_pending(),
        2,
        "neither is settled while one cannot be set aside"
    );
    assert_eq!(p.metrics().spool_refused.get(), 0);

    // The file can be written again: the record is set aside and the spool drains.
    std::fs::remove_dir(&file).unwrap();
    wait_drained(&p).await;
    assert_eq!(p.metrics().spool_refused.get(), 1);
    let lines = refused_lines(spool.path());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0]["value"]["utf8"]
        .as_str()
        .unwrap()
        .contains("\"te-big\""));
    close(p).await;
}

/// A spooled event that Kafka refuses for good on replay (here: over the message size of the
/// publisher restarted with a smaller `max_message_bytes`) is set aside in the spool's
/// `refused.jsonl` and counted, and the events behind it are delivered: the replayer used to
/// resend that batch for ever, and every event behind it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spooled_event_refused_for_good_is_set_aside_and_the_rest_delivered() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let online = config(&prefix, spool.path());
    let events = vec![
        trace_envelope("ref", 1, Some("r")),
        big(),
        trace_envelope("ref", 2, Some("r")),
    ];
    spooled(&online, events).await;

    let p = restarted(&online).await;
    wait_drained(&p).await;
    assert_eq!(p.metrics().spool_refused.get(), 1);
    let lines = refused_lines(spool.path());
    assert_eq!(lines.len(), 1, "{lines:?}");
    let file = spool.path().join("refused.jsonl");
    let aside = std::fs::metadata(&file).unwrap().len();
    assert_eq!(
        p.spool_bytes().0,
        aside,
        "the spool's bound counts what it set aside"
    );
    assert_eq!(lines[0]["topic"], format!("{prefix}trace_events"));
    let value = lines[0]["value"]["utf8"].as_str().unwrap();
    assert!(value.contains("\"te-big\""), "the refused event itself");
    assert!(!lines[0]["error"].as_str().unwrap().is_empty());
    let topics = p.topics().event_topics();
    let recs = consume(&topics, 2, Duration::from_secs(30));
    let ids = event_ids(&recs);
    assert_eq!(recs.len(), 2, "{ids:?}");
    assert!(!ids.contains(&"te-big".to_owned()));

    // Republished before the cause is fixed: refused again, kept with the new error; a line
    // an operator mangled is kept as it was.
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("{\"not\": \"a record\"}\n");
    std::fs::write(&file, &text).unwrap();
    let again = republish(&p).await;
    assert_eq!((again.delivered, again.kept), (0, 1), "{again:?}");
    assert_eq!(again.unreadable.len(), 1, "{again:?}");
    assert_eq!(again.unreadable[0].0, 2, "the mangled line's number");
    close(p).await;

    // The cause fixed (a publisher allowing the size): the record goes out as it was spooled,
    // headers included, and leaves the file; the unreadable line stays.
    let p = Publisher::connect(weft_producers::PublisherConfig {
        max_message_bytes: 400_000,
        ..config(&prefix, spool.path())
    })
    .await
    .unwrap();
    let done = republish(&p).await;
    assert_eq!((done.delivered, done.kept), (1, 0), "{done:?}");
    let m = p.metrics().render();
    assert!(
        m.contains("weft_publisher_events_published_total 1"),
        "a republished record counts as published: {m}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "{\"not\": \"a record\"}\n"
    );
    assert_eq!(p.spool_bytes().0, std::fs::metadata(&file).unwrap().len());
    let recs = consume(&topics, 3, Duration::from_secs(30));
    let big = recs
        .iter()
        .find(|r| r.value == lines[0]["value"]["utf8"].as_str().unwrap().as_bytes())
        .expect("the republished record");
    let spooled: Vec<(String, String)> = lines[0]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h[0].as_str().unwrap().into(),
                h[1]["utf8"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(big.key.as_deref(), Some(&b"r"[..]), "the key as spooled");
    let got: Vec<(String, String)> = big
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), String::from_utf8(v.clone()).unwrap()))
        .collect();
    assert_eq!(got, spooled, "the headers as spooled");
    close(p).await;
}

/// A spooled event whose topic does not exist fails on replay with an error worth retrying
/// (the broker does not know the topic), not one refused for good, so the replayer used to
/// resend its batch for ever and every event behind it waited. Kafka acknowledging the
/// events beside it, it is set aside after `set_aside_after_secs`, and the rest delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spooled_event_that_keeps_failing_while_others_go_through_is_set_aside() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    // Topics of this prefix are never created.
    let missing = common::unique("missing") + ".";
    let offline = |prefix: &str| weft_producers::PublisherConfig {
        // Nothing listens on the discard port: every delivery times out, so all is spooled.
        brokers: "127.0.0.1:9".into(),
        message_timeout_ms: 300,
        ..config(prefix, spool.path())
    };
    for (prefix, seq) in [(&prefix, 1), (&missing, 2), (&prefix, 3)] {
        let p = Publisher::connect(offline(prefix)).await.unwrap();
        let e = trace_envelope("stuck", seq, Some("r"));
        assert_eq!(p.publish(e).unwrap().await.unwrap(), Delivery::Spooled);
        close(p).await;
    }

    let p = Publisher::connect(weft_producers::PublisherConfig {
        message_timeout_ms: 2_000,
        set_aside_after_secs: 1,
        ..config(&prefix, spool.path())
    })
    .await
    .unwrap();
    p.ensure_topics().await.unwrap();
    wait_drained(&p).await;
    assert_eq!(p.metrics().spool_refused.get(), 1);
    let lines = refused_lines(spool.path());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["topic"], format!("{missing}trace_events"));
    let error = lines[0]["error"].as_str().unwrap();
    assert!(
        error.contains("acknowledged the records sent beside it"),
        "{error}"
    );
    let recs = consume(&p.topics().event_topics(), 2, Duration::from_secs(30));
    let mut ids = event_ids(&recs);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2, "the events beside it are delivered: {ids:?}");
    close(p).await;
}

async fn republish(p: &Publisher) -> weft_producers::Republished {
    let p = p.clone();
    tokio::task::spawn_blocking(move || p.republish_refused(Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap()
}

/// `fsync = interval:<ms>`: a spooled event's receipt resolves only with the fsync that
/// covers it, not when its bytes are written; closing the publisher makes that fsync. With a
/// one-hour interval, an event appended (and a second one appended after it, so the writer is
/// past the first one's group) is still unconfirmed until the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_fsync_receipt_waits_for_the_fsync_that_covers_it() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("t") + ".";
    let p = Publisher::connect(weft_producers::PublisherConfig {
        // Nothing listens on the discard port: every delivery times out, so all is spooled.
        brokers: "127.0.0.1:9".into(),
        message_timeout_ms: 300,
        fsync: weft_producers::FsyncPolicy::Interval(Duration::from_secs(3600)),
        ..config(&prefix, spool.path())
    })
    .await
    .unwrap();
    let mut first = p.publish(trace_envelope("iv", 1, Some("r"))).unwrap();
    let spooled = |n: u64| {
        common::wait_for(Duration::from_secs(30), || {
            (p.metrics().spooled.get() >= n).then_some(())
        })
        .unwrap_or_else(|| panic!("{n} event(s) not spooled in 30 s"))
    };
    spooled(1);
    let second = p.publish(trace_envelope("iv", 2, Some("r"))).unwrap();
    spooled(2);
    assert!(
        tokio::time::timeout(Duration::ZERO, &mut first)
            .await
            .is_err(),
        "a receipt resolved before any fsync covered its event"
    );
    close(p.clone()).await;
    assert_eq!(first.await.unwrap(), Delivery::Spooled);
    assert_eq!(second.await.unwrap(), Delivery::Spooled);
}
