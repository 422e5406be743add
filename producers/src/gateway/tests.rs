//! Unit tests of the gateway's request handling: status of a refused batch, item splitting,
//! request errors, limits, message cuts.

use super::*;

#[test]
fn a_request_refused_only_for_retriable_reasons_is_503() {
    let refused = |codes: &[&'static str]| -> Vec<ItemResult> {
        codes
            .iter()
            .enumerate()
            .map(|(index, code)| ItemResult {
                index,
                status: "rejected",
                id: None,
                error: Some(ApiError {
                    code: (*code).into(),
                    message: String::new(),
                }),
            })
            .collect()
    };
    let status = |codes: &[&'static str]| batch_status(0, &refused(codes));
    assert_eq!(status(&["spool_failed", "closed", "spool_full"]), 503);
    assert_eq!(status(&["too_large", "too_large"]), 413);
    assert_eq!(status(&["spool_full", "too_large"]), 400);
    // The list is the one `is_retriable` reads.
    assert!(PublishError::Closed.is_retriable());
    assert!(!PublishError::TooLarge { size: 2, max: 1 }.is_retriable());
}

#[test]
fn splits_arrays_objects_and_ndjson() {
    let a = split_items(br#"[{"a":1}, {"b":2}]"#, None, 10).unwrap();
    assert_eq!(a.len(), 2);
    let o = split_items(b"{\"a\":1}", Some("application/json"), 10).unwrap();
    assert_eq!(o.len(), 1);
    let n = split_items(b"{\"a\":1}\n\n{\"b\":2}\nnot json\n", None, 10).unwrap();
    assert_eq!(n.len(), 3);
    assert!(n[2].is_err(), "a bad line is that item's problem only");
    let declared = split_items(b"{\"a\":1}", Some("application/x-ndjson"), 10).unwrap();
    assert_eq!(declared.len(), 1);
}

#[test]
fn malformed_bodies_are_request_errors_with_a_reason() {
    let msg = |b: &[u8]| match split_items(b, None, 10) {
        Err(SplitError::Malformed(m)) => m,
        other => panic!("expected a malformed body, got {other:?}"),
    };
    assert!(msg(b"[{\"a\":1},").contains("not a valid JSON array"));
    assert!(msg(b"   ").contains("empty"));
    assert!(msg(b"nonsense").contains("not valid JSON"));
    assert!(msg(&[0xff, 0xfe]).contains("UTF-8"));
}

#[test]
fn too_many_items_is_refused_before_the_rest_is_read() {
    assert_eq!(split_items(b"[1,2,3]", None, 3).map(|v| v.len()), Ok(3));
    assert_eq!(
        split_items(b"[1,2,3,4]", None, 3).err(),
        Some(SplitError::TooMany(3))
    );
    // The limit is hit before the malformed tail: the cut is at item 4.
    assert_eq!(
        split_items(b"[1,2,3,4,oops", None, 3).err(),
        Some(SplitError::TooMany(3))
    );
    let nd = b"{}\n{}\n\n{}\n{}\n";
    assert_eq!(
        split_items(nd, Some("application/x-ndjson"), 3).err(),
        Some(SplitError::TooMany(3))
    );
    assert_eq!(split_items(nd, None, 4).map(|v| v.len()), Ok(4));
}

#[test]
fn messages_are_cut_on_a_char_boundary() {
    let m = bounded_message("é".repeat(MAX_MESSAGE_BYTES));
    assert!(m.len() <= MAX_MESSAGE_BYTES + 3 && m.ends_with("..."));
    assert_eq!(bounded_message("short".into()), "short");
}
