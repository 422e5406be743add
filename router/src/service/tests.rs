use super::recent::RecentCap;
use super::*;

#[test]
fn the_overlay_settles_in_twelve_refreshes_between_a_minute_and_the_window() {
    let s = |refresh_ms, window_s| overlay_settle(Duration::from_millis(refresh_ms), window_s);
    assert_eq!(s(5_000, 604_800), Duration::from_secs(60));
    assert_eq!(s(30_000, 604_800), Duration::from_secs(360));
    assert_eq!(s(30_000, 100), Duration::from_secs(100));
}

#[test]
fn remembered_decisions_stay_within_the_byte_cap() {
    use crate::features::Feature;
    let big = || {
        Arc::new(Remembered {
            context_key: "k".repeat(200),
            ctx: vec![
                Feature {
                    hash: 1,
                    value: 1.0
                };
                60
            ],
            cands: (0..64)
                .map(|i| {
                    (
                        format!("{i:0>250}"),
                        vec![
                            Feature {
                                hash: 2,
                                value: 1.0
                            };
                            14
                        ],
                    )
                })
                .collect(),
            ..Remembered::default()
        })
    };
    let one = Recent::size("d-0000", &big());
    assert!(one > 30_000, "a large decision holds {one} bytes");
    let cap = RecentCap {
        decisions: usize::MAX,
        bytes: 10 * one,
    };
    let mut recent = Recent::default();
    recent.insert_capped("quiet", "q-0000".into(), big(), cap);
    for i in 0..1000 {
        recent.insert_capped("busy", format!("d-{i:04}"), big(), cap);
        assert!(
            recent.bytes <= cap.bytes,
            "{} > {}",
            recent.bytes,
            cap.bytes
        );
    }
    assert_eq!(recent.len, 10);
    assert!(
        recent.get("quiet", "q-0000").is_some(),
        "the quiet tenant keeps its own"
    );
    assert!(recent.get("busy", "d-0999").is_some() && recent.get("busy", "d-0990").is_none());
}

#[test]
fn a_busy_tenant_evicts_its_own_decisions_not_a_quiet_ones() {
    let r = || {
        Arc::new(Remembered {
            context_key: String::new(),
            ctx: vec![],
            cands: vec![],
            ..Remembered::default()
        })
    };
    let mut recent = Recent::default();
    let ten = RecentCap {
        decisions: 10,
        bytes: usize::MAX,
    };
    recent.insert_capped("quiet", "q-0".into(), r(), ten);
    recent.insert_capped("quiet", "q-1".into(), r(), ten);
    for i in 0..100 {
        recent.insert_capped("busy", format!("b-{i}"), r(), ten);
    }
    assert_eq!(recent.len, 10);
    assert!(recent.get("quiet", "q-0").is_some() && recent.get("quiet", "q-1").is_some());
    assert!(recent.get("busy", "b-99").is_some() && recent.get("busy", "b-91").is_none());
    // A tenant never reads another's decision, whatever its id.
    assert!(recent.get("busy", "q-0").is_none());
    // Once the quiet tenant holds the most, its own oldest goes first.
    for i in 2..12 {
        recent.insert_capped("quiet", format!("q-{i}"), r(), ten);
    }
    assert_eq!(recent.len, 10);
    assert!(recent.get("quiet", "q-0").is_none() && recent.get("quiet", "q-11").is_some());
    assert!(
        recent.get("busy", "b-99").is_some(),
        "the other tenant keeps its newest"
    );
}

#[tokio::test]
async fn a_decision_the_publisher_refuses_is_answered_4xx_or_503_with_retry_after() {
    let invalid = PublishError::Invalid(EnvelopeError::BadTenant);
    assert_eq!(decision_publish_status(&invalid), StatusCode::BAD_REQUEST);
    let long = PublishError::Invalid(EnvelopeError::IdTooLong {
        field: "request_id",
        len: 2000,
    });
    assert_eq!(
        decision_publish_status(&long),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let full = PublishError::SpoolFull { used: 1, max: 1 };
    assert_eq!(
        decision_publish_status(&full),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let r = RouterError::Publish(
        full.code(),
        full.to_string(),
        decision_publish_status(&full),
    )
    .into_response();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()[header::RETRY_AFTER], "5");
    assert_eq!(
        decision_publish_status(&PublishError::Spool("disk".into())),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// A service over a publisher whose broker is unreachable (it spools), with one key `ta`.
async fn offline_service(
    dir: &std::path::Path,
    max_concurrent_requests: usize,
    body_timeout: Duration,
) -> Arc<Service> {
    let publisher = Publisher::connect(weft_producers::PublisherConfig {
        brokers: "127.0.0.1:9".into(),
        spool_dir: dir.to_owned(),
        message_timeout_ms: 300,
        ..weft_producers::PublisherConfig::default()
    })
    .await
    .unwrap();
    let mut keys = ApiKeys::default();
    keys.add_list("key-of-tenant-a-0001=ta").unwrap();
    Service::new(
        ServiceConfig {
            policy: PolicyConfig::default(),
            refresh_period: Duration::ZERO,
            window_s: 604_800,
            half_life_s: 0.0,
            max_cells: 50_000,
            source: "test".into(),
            max_concurrent_requests,
            body_timeout,
        },
        keys,
        publisher,
        None,
    )
}

/// The tenant's constrained gate is not held while a decision is published (a slow broker
/// makes publishing wait up to the message timeout, and the gate is a blocking lock): the
/// choice is counted in flight before, under the gate, and taken back when publishing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_is_free_while_publishing_and_a_failed_decision_spends_no_budget() {
    let dir = tempfile::tempdir().unwrap();
    let s = offline_service(dir.path(), 8, Duration::from_secs(5)).await;
    let req = || -> RouteRequest {
        serde_json::from_value(json!({
            "context": {"intent": "x"},
            "candidates": [{"candidate_id": "a", "candidate_type": "tool"}],
            "constraints": {"max_latency_ms": 1000},
        }))
        .unwrap()
    };
    let mut rng = Rng::new(1);
    let refused = s.decide_with("ta", req(), &mut rng, |_, _| {
        assert!(
            s.live.constrained_gate("ta").try_lock().is_some(),
            "the gate is held while publishing"
        );
        assert_eq!(s.live.inflight("ta", "a"), 1, "counted before publishing");
        Err(StatusCode::SERVICE_UNAVAILABLE.into_response())
    });
    assert_eq!(
        refused.map(|_| ()).unwrap_err().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        s.live.inflight("ta", "a"),
        0,
        "a failed decision is taken back"
    );
    let made = s.decide_with("ta", req(), &mut rng, |_, _| {
        assert!(s.live.constrained_gate("ta").try_lock().is_some());
        Ok(())
    });
    assert!(made.is_ok());
    assert_eq!(
        s.live.inflight("ta", "a"),
        1,
        "a decision made stays in flight"
    );
}

/// One request, HTTP/1.1 over `stream`: the answer's status line and body.
async fn send(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(head.as_bytes()).await.unwrap();
    c.write_all(body).await.unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out).await;
    out
}

/// A body that stops coming is answered 408 `body_timeout` within the body timeout, and
/// its request slot is freed: before, `to_bytes` waited for as long as the client kept the
/// connection alive, so clients trickling bodies on every slot kept every tenant at 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_answered_408_in_time_and_frees_its_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_secs(2);
    let s = offline_service(dir.path(), 1, timeout).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app(s)).await });
    let auth = "authorization: Bearer key-of-tenant-a-0001\r\n";
    let model = format!("GET /v1/model HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n");

    // The slow client: 100 bytes declared, one sent, then silence.
    let started = Instant::now();
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(
        format!(
            "POST /v1/route HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\n\
             content-length: 100\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // It holds the only slot: another request is busy.
    let mut busy = String::new();
    for _ in 0..20 {
        busy = send(addr, &model, b"").await;
        if busy.starts_with("HTTP/1.1 503") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        busy.starts_with("HTTP/1.1 503") && busy.contains("\"busy\""),
        "{busy}"
    );
    // Read until the answer's code arrives (the server may keep the connection open).
    let mut answer = String::new();
    tokio::time::timeout(timeout * 3, async {
        let mut buf = [0u8; 4096];
        while !answer.contains("body_timeout") {
            match slow.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(k) => answer.push_str(&String::from_utf8_lossy(&buf[..k])),
            }
        }
    })
    .await
    .expect("answered within the body timeout");
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"body_timeout\""), "{answer}");
    assert!(took >= timeout && took < timeout * 3, "{took:?}");
    // The slot is free again.
    let served = send(addr, &model, b"").await;
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
}
