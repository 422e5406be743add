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
