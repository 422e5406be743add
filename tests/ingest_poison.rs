//! No poison record stops ingest, written as the attacks: a 1,050,000-byte random value and
//! a 5 MB spec-valid event on a `trace_events` partition between good events (the first once
//! stopped all of ingest for good: its dead-letter copy was over the producer's limit and was
//! retried forever); an event at the configured maximum stored end to end; a stall forced by
//! taking `weft_events` away turns `/healthz` to 503 and shows in `/metrics`; SIGTERM in that
//! state ends the process within 10 s, and so does SIGTERM while a dead letter is retried.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::kafka::{producer, send};
use common::pipeline::{distinct_facts, free_port, wait_for_port, Pipeline};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedHeaders, Headers, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sha2::{Digest, Sha256};

/// A spec-valid trace event of about `size` bytes (a long `error_message`).
fn big_event(id: &str, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"event_id":"{id}","event_type":"flow_failed","timestamp":"2026-03-08T06:00:05Z","error_message":""#
    );
    let mut v = head.into_bytes();
    v.resize(size - 2, b'e');
    v.extend_from_slice(b"\"}");
    v
}

fn random_bytes(n: usize) -> Vec<u8> {
    // xorshift: reproducible noise that is neither JSON nor Avro.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

type Dead = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

/// Key -> (header name -> value, plus "" -> the value) of every dead letter.
fn dead_letters(dlq: &str, want: usize) -> Dead {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .set("group.id", common::unique("dlq"))
        .create()
        .unwrap();
    let md = consumer
        .fetch_metadata(Some(dlq), Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for part in md.topics()[0].partitions() {
        tpl.add_partition_offset(dlq, part.id(), Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut got = Dead::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < want && Instant::now() < deadline {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let mut h: BTreeMap<String, Vec<u8>> = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        h.insert(String::new(), m.payload().unwrap_or_default().to_vec());
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        assert!(
            got.insert(key.clone(), h).is_none(),
            "{key} dead-lettered twice"
        );
    }
    got
}

/// Headers holding one header whose name is the raw bytes `name`: rdkafka's `insert` takes a
/// `&str`, so the header is added through librdkafka's C API.
fn raw_named_header(name: &[u8], value: &[u8]) -> OwnedHeaders {
    use rdkafka::bindings as rd;
    let h = OwnedHeaders::new_with_capacity(1);
    let list = h.as_borrowed() as *const BorrowedHeaders as *mut rd::rd_kafka_headers_t;
    // SAFETY: rdkafka lends an `OwnedHeaders` as a `&BorrowedHeaders` whose address is
    // librdkafka's header list; `rd_kafka_header_add` copies both buffers into it.
    let err = unsafe {
        rd::rd_kafka_header_add(
            list,
            name.as_ptr().cast(),
            name.len() as isize,
            value.as_ptr().cast(),
            value.len() as isize,
        )
    };
    assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    h
}

fn text(h: &BTreeMap<String, Vec<u8>>, k: &str) -> String {
    String::from_utf8_lossy(h.get(k).map(Vec::as_slice).unwrap_or_default()).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_records_between_good_events_do_not_stop_ingest() {
    let p = Pipeline::new("it_poison");
    p.simulate(&["--events", "300", "--seed", "41", "--clean"]);
    let before = p.path("events.jsonl");
    std::fs::rename(p.path("events.jsonl"), p.path("before.jsonl")).unwrap();
    let before = before.with_file_name("before.jsonl");
    p.publish(&before);
    let topic = format!("{}trace_events", p.prefix);
    let prod = producer();
    let noise = random_bytes(1_050_000);
    let five_mb = big_event("te-5mb", 5_000_000);
    send(&prod, &topic, "poison-random", &noise).await;
    send(&prod, &topic, "poison-5mb", &five_mb).await;
    p.simulate(&["--events", "300", "--seed", "42", "--clean"]);
    let after = p.path("events.jsonl");
    p.publish(&after);
    let good = distinct_facts(&[&before, &after]);

    let addr = format!("127.0.0.1:{}", free_port());
    let _ingest = p.ingest(Some(&addr));
    p.wait_for_facts(good, Duration::from_secs(180)).await;
    let rows = p.scalar("SELECT count() FROM weft_events").await;
    let ids = p
        .scalar("SELECT uniqExact(tenant, kind, id) FROM weft_events")
        .await;
    assert_eq!(
        (rows, ids),
        (good, good),
        "every good event stored exactly once"
    );

    let dl = dead_letters(&format!("{}dead_letter", p.prefix), 2);
    assert_eq!(dl.len(), 2, "{:?}", dl.keys().collect::<Vec<_>>());
    for (key, original, reason) in [
        ("poison-random", &noise, "too_large"),
        ("poison-5mb", &five_mb, "too_large"),
    ] {
        let h = &dl[key];
        assert_eq!(text(h, "weft-dlq-reason"), reason, "{key}");
        assert_eq!(text(h, "weft-dlq-truncated"), "1", "{key}: bounded form");
        assert_eq!(
            text(h, "weft-dlq-original-bytes"),
            original.len().to_string()
        );
        assert_eq!(
            text(h, "weft-dlq-sha256"),
            hex::encode(Sha256::digest(original)),
            "{key}"
        );
        assert_eq!(text(h, "weft-dlq-topic"), topic);
        assert_eq!(text(h, "weft-dlq-partition"), "0");
        assert!(!text(h, "weft-dlq-offset").is_empty());
        let cut = &h[""];
        assert!(
            cut.len() > 900_000 && cut.len() < 1_000_000,
            "{key}: {}",
            cut.len()
        );
        assert_eq!(
            cut.as_slice(),
            &original[..cut.len()],
            "{key}: a prefix of the original"
        );
    }
    assert!(wait_for_port(&addr, Duration::from_secs(5)));
    let health = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

/// Two records only a hand-made producer sends, between good events: one with a header whose
/// name is not UTF-8 (rdkafka's header reader panics on it, and ingest once died on it at every
/// restart) is dead-lettered `bad_header`; one stamped with the largest CreateTime (time-aligned
/// reading once summed it past `i64::MAX` and then read no lane, forever) is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_and_an_extreme_record_time_do_not_stop_ingest() {
    let p = Pipeline::new("it_oddrec");
    p.simulate(&["--events", "300", "--seed", "43", "--clean"]);
    let before = p.path("before.jsonl");
    std::fs::rename(p.path("events.jsonl"), &before).unwrap();
    p.publish(&before);
    let topic = format!("{}trace_events", p.prefix);
    let prod = producer();
    let odd_name = big_event("te-odd-header", 400);
    let record = FutureRecord::to(&topic)
        .key("odd-header")
        .payload(&odd_name)
        .headers(raw_named_header(b"\xff\xfeweft", b"x"))
        .partition(0);
    prod.send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let far = big_event("te-far-time", 400);
    let record = FutureRecord::to(&topic)
        .key("far-time")
        .payload(&far)
        .timestamp(i64::MAX - 1)
        .partition(0);
    prod.send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    // More events behind them, on every partition, so the far-future lane still has records
    // waiting once the others are caught up.
    p.simulate(&["--events", "300", "--seed", "44", "--clean"]);
    let after = p.path("events.jsonl");
    p.publish(&after);
    let good = distinct_facts(&[&before, &after]) + 1;

    let addr = format!("127.0.0.1:{}", free_port());
    let _ingest = p.ingest(Some(&addr));
    p.wait_for_facts(good, Duration::from_secs(180)).await;
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events WHERE id = 'te-far-time'")
            .await,
        1
    );
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events WHERE id = 'te-odd-header'")
            .await,
        0
    );
    let dl = dead_letters(&format!("{}dead_letter", p.prefix), 1);
    let h = &dl["odd-header"];
    assert_eq!(text(h, "weft-dlq-reason"), "bad_header");
    assert!(text(h, "weft-dlq-message").contains("not UTF-8"), "{h:?}");
    assert_eq!(h[""], odd_name, "the original value");
    assert!(wait_for_port(&addr, Duration::from_secs(5)));
    let health = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

/// The high watermarks of the dead-letter topic, summed: what it has received so far.
fn received(dlq: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .create()
        .unwrap();
    let md = consumer
        .fetch_metadata(Some(dlq), Duration::from_secs(10))
        .unwrap();
    md.topics()[0]
        .partitions()
        .iter()
        .map(|part| {
            consumer
                .fetch_watermarks(dlq, part.id(), Duration::from_secs(10))
                .unwrap()
                .1
        })
        .sum()
}

/// Dead letters at the end of a partition are not sent again by a restart. Ingest resumes
/// after the last stored fact, which is before them: the batch that dead-letters them also
/// records how far the partition is done (`weft_ingest_floor`). (Named `fault_`: it runs in
/// `deploy/local/test.sh`'s sqlite phase, since tansu's memory engine turns a caught-up
/// restart into a rewound log.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_restart_does_not_dead_letter_the_same_records_again() {
    let p = Pipeline::new("it_dlq_again");
    p.simulate(&["--events", "200", "--seed", "45", "--clean"]);
    let events = p.path("events.jsonl");
    p.publish(&events);
    let valid = distinct_facts(&[&events]);
    let topic = format!("{}trace_events", p.prefix);
    let prod = producer();
    for i in 0..3 {
        send(&prod, &topic, &format!("junk-{i}"), b"{\"event_id\": ").await;
    }
    let ingest = p.ingest(None);
    p.wait_for_facts(valid, Duration::from_secs(120)).await;
    let dlq = format!("{}dead_letter", p.prefix);
    assert_eq!(dead_letters(&dlq, 3).len(), 3);
    let before = received(&dlq);
    assert_eq!(ingest.terminate().code(), Some(0));

    // Restarted, it reads on from there: a good event behind the junk on the same partition
    // is stored once the junk is behind it.
    let _ingest = p.ingest(None);
    send(&prod, &topic, "after", &big_event("te-after-restart", 400)).await;
    p.wait_for_facts(valid + 1, Duration::from_secs(120)).await;
    assert_eq!(received(&dlq), before, "a dead letter was sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_at_the_configured_maximum_is_stored() {
    let p = Pipeline::new("it_maxsize");
    let none = p.path("none.jsonl");
    std::fs::write(&none, "").unwrap();
    p.publish(&none); // the topics
    let topic = format!("{}trace_events", p.prefix);
    let max = 2_000_000;
    let at_max = big_event("te-at-max", max);
    let over = big_event("te-over-max", max + 1);
    send(&producer(), &topic, "at-max", &at_max).await;
    send(&producer(), &topic, "over-max", &over).await;
    let _ingest = p.ingest_args(None, &[], &["--max-message-bytes", &max.to_string()]);
    p.wait_for_facts(1, Duration::from_secs(120)).await;
    let stored = p
        .scalar("SELECT length(payload) FROM weft_events WHERE id = 'te-at-max'")
        .await;
    assert_eq!(stored, max as u64, "stored whole");
    let dl = dead_letters(&format!("{}dead_letter", p.prefix), 1);
    assert_eq!(text(&dl["over-max"], "weft-dlq-reason"), "too_large");
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_stall_turns_healthz_503_and_sigterm_still_ends_within_10_s() {
    let p = Pipeline::new("it_stall");
    p.simulate(&["--events", "200", "--seed", "43", "--clean"]);
    let file = p.path("events.jsonl");
    let addr = format!("127.0.0.1:{}", free_port());
    let ingest = p.ingest_args(Some(&addr), &[], &["--stall-after-secs", "3"]);
    assert!(wait_for_port(&addr, Duration::from_secs(30)));
    common::wait_for(Duration::from_secs(60), || {
        let log = p.ingest_log_all();
        log.contains("assigned every partition").then_some(())
    })
    .unwrap_or_else(|| panic!("ingest did not start:\n{}", p.ingest_log()));
    let get = |path: &str| {
        let url = format!("http://{addr}{path}");
        async move { reqwest::get(url).await.unwrap() }
    };
    assert_eq!(get("/healthz").await.status(), 200);
    // Take the facts table away: every insert fails and is retried, nothing is stored.
    p.client()
        .query("RENAME TABLE weft_events TO weft_events_away")
        .execute()
        .await
        .unwrap();
    p.publish(&file);
    let stalled = common::wait_for(Duration::from_secs(60), || {
        let s = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async { get("/healthz").await.status() })
        });
        (s == 503).then_some(())
    });
    assert!(
        stalled.is_some(),
        "healthz never turned 503:\n{}",
        p.ingest_log()
    );
    let body: serde_json::Value = get("/healthz").await.json().await.unwrap();
    assert_eq!(body["error"]["code"], "stalled", "{body}");
    let metrics = get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("weft_ingest_stalled 1"), "{metrics}");

    // SIGTERM while the insert is being retried: the process ends within 10 s.
    let t0 = Instant::now();
    let status = ingest.terminate();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "took {took:?} to stop");
    assert!(status.code().is_some(), "{status}");
    eprintln!("SIGTERM during a stalled insert: stopped in {took:?} ({status})");

    // Back: the table returns, a new ingest stores everything once and is healthy.
    p.client()
        .query("RENAME TABLE weft_events_away TO weft_events")
        .execute()
        .await
        .unwrap();
    let addr2 = format!("127.0.0.1:{}", free_port());
    let _ingest = p.ingest_args(Some(&addr2), &[], &["--stall-after-secs", "3"]);
    let want = distinct_facts(&[&file]);
    p.wait_for_facts(want, Duration::from_secs(120)).await;
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, want);
    assert!(wait_for_port(&addr2, Duration::from_secs(10)));
    let s = reqwest::get(format!("http://{addr2}/healthz"))
        .await
        .unwrap()
        .status();
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_a_dead_letter_is_retried_ends_within_10_s() {
    let p = Pipeline::new("it_dlq_term");
    let none = p.path("none.jsonl");
    std::fs::write(&none, "").unwrap();
    p.publish(&none); // the topics
    let topic = format!("{}trace_events", p.prefix);
    // A dead letter that cannot be queued: the ingest producers' buffer is 1 KiB, so sending
    // this 4 KiB garbage record fails with QueueFull, a transient error, retried forever
    // with the partition's offsets held (the broker and the dead-letter topic stay fine).
    send(&producer(), &topic, "poison-retried", &random_bytes(4096)).await;
    let config = p.path("weft.toml");
    std::fs::write(
        &config,
        "[kafka.ingest.properties]\n\"queue.buffering.max.kbytes\" = \"1\"\n",
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let ingest = p.ingest_with(Some(&addr), &[("WEFT_CONFIG", config.to_str().unwrap())]);
    assert!(wait_for_port(&addr, Duration::from_secs(30)));
    let metric = |name: &'static str| {
        let addr = addr.clone();
        tokio::task::block_in_place(move || {
            tokio::runtime::Handle::current().block_on(common::metric(&addr, name))
        })
    };
    let retrying = common::wait_for(Duration::from_secs(90), || {
        (metric("weft_ingest_dead_letter_retries_total")? >= 2).then_some(())
    });
    assert!(
        retrying.is_some(),
        "no dead-letter retries seen:\n{}",
        p.ingest_log()
    );
    let log = p.ingest_log_all();
    assert!(
        log.contains("dead-letter publish failed; retrying"),
        "{}",
        p.ingest_log()
    );
    assert_eq!(
        metric("weft_ingest_dead_lettered_total"),
        Some(0),
        "the dead letter must still be pending"
    );

    let t0 = Instant::now();
    let status = ingest.terminate();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "took {took:?} to stop");
    assert!(status.code().is_some(), "{status}");
    eprintln!("SIGTERM during a dead-letter retry: stopped in {took:?} ({status})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_refused_in_every_form_is_quarantined_in_clickhouse_and_the_partition_moves_on(
) {
    let p = Pipeline::new("it_quarantine");
    let none = p.path("none.jsonl");
    std::fs::write(&none, "").unwrap();
    p.publish(&none); // the topics
    let topic = format!("{}trace_events", p.prefix);
    let prod = producer();
    let good = |id: &str| big_event(id, 300);
    send(&prod, &topic, "good-before", &good("te-before")).await;
    // Garbage with a 1 KiB key: its smallest dead letter (no value, the key cut to 1 KiB,
    // weft's headers) is over the 1,000-byte `message.max.bytes` this ingest's producers get,
    // so the dead-letter producer refuses every form for good.
    let key = "k".repeat(1024);
    let poison = random_bytes(3000);
    send(&prod, &topic, &key, &poison).await;
    send(&prod, &topic, "good-after", &good("te-after")).await;
    let config = p.path("weft.toml");
    std::fs::write(
        &config,
        "[kafka.ingest.properties]\n\"message.max.bytes\" = \"1000\"\n",
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _ingest = p.ingest_with(Some(&addr), &[("WEFT_CONFIG", config.to_str().unwrap())]);
    p.wait_for_facts(2, Duration::from_secs(120)).await;
    let q = p
        .wait_for_count(
            "SELECT count() FROM weft_quarantine",
            1,
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(q, 1, "{}", p.ingest_log());
    #[derive(clickhouse::Row, serde::Deserialize)]
    struct Q {
        topic: String,
        partition: i32,
        offset: i64,
        reason: String,
        refused: String,
        original_bytes: u64,
        sha256: String,
        truncated: bool,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    }
    let row: Q = p
        .client()
        .query(
            "SELECT topic, partition, offset, reason, refused, original_bytes, sha256, truncated, \
             key, value FROM weft_quarantine",
        )
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(
        (row.topic.as_str(), row.partition, row.offset),
        (topic.as_str(), 0, 1)
    );
    assert_eq!(row.reason, "undecodable");
    assert!(
        row.refused.contains("MessageSizeTooLarge"),
        "{}",
        row.refused
    );
    assert_eq!(row.original_bytes, 3000);
    assert_eq!(row.sha256, hex::encode(Sha256::digest(&poison)));
    assert!(!row.truncated);
    assert_eq!(row.key, key.as_bytes());
    assert_eq!(
        row.value, poison,
        "the original bytes, whole (under max_message_bytes)"
    );
    // The partition moved on: the event after the poison record is stored, once.
    let after = p
        .scalar("SELECT count() FROM weft_events WHERE id = 'te-after' AND offset = 2")
        .await;
    assert_eq!(after, 1);
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 2);
    assert!(wait_for_port(&addr, Duration::from_secs(5)));
    assert_eq!(
        common::metric(&addr, "weft_ingest_dead_letters_quarantined_total").await,
        Some(1)
    );
    // Quarantined, not acknowledged by the dead-letter topic: counted in its own metric only.
    assert_eq!(
        common::metric(&addr, "weft_ingest_dead_lettered_total").await,
        Some(0)
    );
}
