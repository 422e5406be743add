//! The crate's contract with the migrations: every column of `weft_events` has exactly one
//! source and a place in the rows; the chain's hash of a known row is pinned.

use std::borrow::Cow;

use clickhouse::Row;
use serde_json::json;
use weft_schemas::links;
use weft_schemas::{Envelope, Kind};

use crate::chain::{ChainRow, ROWS_SQL};
use crate::ddl::{self, Tables};
use crate::events::{EventRow, TypedColumns, ENVELOPE_COLUMNS, INGEST_COLUMNS};
use crate::typed_columns;
use crate::{Fact, StoredColumns};

fn default_tables() -> Tables {
    ddl::tables(
        weft_schemas::migrations::all()
            .iter()
            .flat_map(|m| m.statements()),
    )
}

fn cluster_tables() -> Tables {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/clickhouse-cluster");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    ddl::tables(files.iter().flat_map(|f| {
        let sql: &'static str = Box::leak(std::fs::read_to_string(f).unwrap().into_boxed_str());
        weft_schemas::migrations::Migration {
            version: 0,
            name: String::new(),
            sql,
        }
        .statements()
    }))
}

/// The hash chain names the payload by its hash.
fn chain_name(column: &str) -> &str {
    if column == "payload" {
        "payload_sha256"
    } else {
        column
    }
}

#[test]
fn every_events_column_has_one_source_and_its_place_in_the_rows_and_the_cluster() {
    let tables = default_tables();
    let cols = &tables["weft_events"];
    assert!(cols.len() >= 30, "{cols:?}");
    let cluster = cluster_tables();
    for c in cols {
        let name = c.name.as_str();
        let sources: Vec<&str> = [
            (
                "derived from the payload by typed_columns",
                TypedColumns::COLUMN_NAMES.contains(&name),
            ),
            (
                "taken from the envelope or its headers",
                ENVELOPE_COLUMNS.contains(&name),
            ),
            ("set by ingest", INGEST_COLUMNS.contains(&name)),
            ("MATERIALIZED", c.materialized.is_some()),
        ]
        .into_iter()
        .filter_map(|(what, yes)| yes.then_some(what))
        .collect();
        assert_eq!(
            sources.len(),
            1,
            "weft_events.{name} comes from {sources:?}: it needs exactly one source"
        );
        let written = EventRow::COLUMN_NAMES.contains(&name);
        if c.materialized.is_some() {
            assert!(
                !written,
                "{name} is MATERIALIZED: ClickHouse computes it, ingest must not write it"
            );
        } else {
            assert!(written, "EventRow lacks weft_events.{name}");
            assert!(
                ChainRow::COLUMN_NAMES.contains(&chain_name(name)),
                "ChainRow lacks weft_events.{name}: the hash chain would not cover it"
            );
        }
        for t in ["weft_events_local", "weft_events"] {
            let there = cluster[t].iter().find(|k| k.name == name);
            assert_eq!(
                there.map(|k| &k.definition),
                Some(&c.definition),
                "deploy/clickhouse-cluster: {t}.{name} differs from the migrations"
            );
        }
    }
    // ... and nothing in the rows or the lists that the table lacks.
    let known = |n: &str| cols.iter().any(|c| c.name == n);
    for n in EventRow::COLUMN_NAMES
        .iter()
        .chain(TypedColumns::COLUMN_NAMES)
        .chain(ENVELOPE_COLUMNS)
        .chain(INGEST_COLUMNS)
    {
        assert!(known(n), "{n} is not a column of weft_events");
    }
    for n in ChainRow::COLUMN_NAMES {
        assert!(
            known(n) || *n == "payload_sha256",
            "ChainRow.{n} is not a column"
        );
    }
    for n in crate::search::Hit::COLUMN_NAMES {
        assert!(known(n), "Hit.{n} is not a column of weft_events");
    }
    assert_eq!(
        crate::search::tests::selected(ROWS_SQL),
        ChainRow::COLUMN_NAMES
    );
}

/// The rows of the other tables name only columns their table has.
#[test]
fn every_row_struct_matches_its_table() {
    let tables = default_tables();
    let check = |table: &str, names: &[&str]| {
        let cols: Vec<&str> = tables[table].iter().map(|c| c.name.as_str()).collect();
        let written: Vec<&str> = tables[table]
            .iter()
            .filter(|c| c.materialized.is_none() && !c.definition.contains("DEFAULT"))
            .map(|c| c.name.as_str())
            .collect();
        for n in names {
            assert!(cols.contains(n), "{table} has no column {n}");
        }
        assert_eq!(
            written.len(),
            names.len(),
            "{table}: {written:?} vs {names:?}"
        );
    };
    use crate::narrative::{LinkRow, NarrativeRow, NodeRow, ProgressRow};
    use crate::telemetry::{BatchRow, DeadLetterRow, LagRow};
    check("weft_narratives", <NarrativeRow>::COLUMN_NAMES);
    check("weft_narrative_nodes", <NodeRow>::COLUMN_NAMES);
    check("weft_links", <LinkRow>::COLUMN_NAMES);
    check("weft_projector_progress", ProgressRow::COLUMN_NAMES);
    check("weft_ingest_batches", BatchRow::COLUMN_NAMES);
    check("weft_dead_letters", DeadLetterRow::COLUMN_NAMES);
    check("weft_ingest_lag", LagRow::COLUMN_NAMES);
}

/// A known row hashes to the bytes it hashed to before the row moved into this crate
/// (computed independently: SHA-256 of the row's JSON with sorted keys and no spaces,
/// which is its JCS form), so existing seals stay valid.
#[test]
fn a_known_chain_row_hashes_as_before() {
    let row: ChainRow = serde_json::from_value(json!({
        "topic": "weaver.trace_events", "partition": 3, "offset": 42, "tenant": "acme",
        "kind": "trace_event", "id": "te-1", "content_hash": "ab".repeat(32),
        "ts": 1_700_000_000_000_000_i64, "request_id": "req-1", "producer_id": "p-1", "seq": 7,
        "emitted_at": 1_700_000_000_000_001_i64, "ingested_at": 1_700_000_000_000_002_i64,
        "event_type": "tool_call", "principal": "alice", "capability_id": "cap.read",
        "decision": "", "outcome": "success", "token_id": "tok-1", "decision_id": "pd-1",
        "frame_id": "fr-1", "handle_id": "h-1", "handle_refs": ["h-2", "h-3"],
        "candidate_id": "", "flow_id": "flow-1",
        "links": [["decision_id", "policy_decision", "pd-1"]], "conflict": 0,
        "content_type": "application/json", "payload_sha256": "cd".repeat(32),
    }))
    .unwrap();
    assert_eq!(
        hex::encode(row.hash().unwrap()),
        "1f66e61665b414644194f6c3dff9cd20d0fe0b73ee58cb5a556c959dcfe2eb8e"
    );
}

#[test]
fn typed_columns_per_kind() {
    let te = json!({"event_type": "tool_call", "principal": "alice", "capability_id": "cap",
        "outcome": "success", "token_id": "tok", "decision_id": "pd", "frame_id": "fr",
        "handle_id": "h", "handle_refs": ["h1", 2, "h2"], "metadata": {"flow_id": "fl"}});
    let l = links::extract(Kind::TraceEvent, &te);
    let t = typed_columns(Kind::TraceEvent, &te, &l);
    assert_eq!(
        (
            &*t.decision_id,
            &*t.frame_id,
            &*t.handle_id,
            &*t.flow_id,
            &*t.token_id
        ),
        ("pd", "fr", "h", "fl", "tok")
    );
    assert_eq!(t.handle_refs, ["h1", "h2"]);
    assert!(t
        .links
        .contains(&("decision_id", "policy_decision", "pd".into())));
    // Feedback's decision_id is the routing decision: a link, not the column.
    let fb = json!({"decision_id": "erd", "candidate_id": "c1"});
    let l = links::extract(Kind::ExecutionFeedback, &fb);
    let t = typed_columns(Kind::ExecutionFeedback, &fb, &l);
    assert_eq!((&*t.decision_id, &*t.candidate_id), ("", "c1"));
    assert_eq!(t.links.len(), 1);
    let erd = json!({"candidate": {"candidate_id": "c2"}, "frame_id": "fr"});
    let t = typed_columns(Kind::ExecutionRoutingDecision, &erd, &[]);
    assert_eq!((&*t.candidate_id, &*t.frame_id), ("c2", ""));
    let h = json!({"handle_id": "h", "frame_id": "fr"});
    let t = typed_columns(Kind::Handle, &h, &[]);
    assert_eq!((&*t.handle_id, &*t.frame_id), ("h", ""));
}

/// A fact keeps its typed columns packed (`StoredColumns`): each column of the row it
/// writes is read back from its own place, with its own value, whichever columns are empty.
#[test]
fn each_row_column_reads_its_own_packed_value() {
    let names = |row: &EventRow<'_>| serde_json::to_value(row).unwrap();
    let links = links::extract(
        Kind::TraceEvent,
        &json!({"decision_id": "pd", "frame_id": "fr"}),
    );
    for empty in std::iter::once(None).chain(TypedColumns::COLUMN_NAMES.iter().map(Some)) {
        let value = |col: &'static str| -> Cow<'static, str> {
            if empty == Some(&col) {
                "".into()
            } else {
                format!("{col}-value").into()
            }
        };
        let typed = TypedColumns {
            event_type: value("event_type"),
            principal: value("principal"),
            capability_id: value("capability_id"),
            decision: value("decision"),
            outcome: value("outcome"),
            token_id: value("token_id"),
            decision_id: value("decision_id"),
            frame_id: value("frame_id"),
            handle_id: value("handle_id"),
            handle_refs: vec![value("handle_refs"), "second".into()],
            candidate_id: value("candidate_id"),
            flow_id: value("flow_id"),
            links: Vec::new(),
        };
        let fact = Fact {
            envelope: Envelope {
                kind: Kind::TraceEvent,
                request_id: None,
                tenant: "t".into(),
                producer_id: None,
                seq: None,
                emitted_at: None,
                payload: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            },
            typed: StoredColumns::new(&typed),
            id: "id".into(),
            content_hash: [0; 32],
            ts_micros: 0,
            emitted_micros: 0,
            links: links.clone(),
            content_type: Default::default(),
        };
        let row = names(&EventRow::new(&fact, "topic", 0, 0, 0, false));
        for col in TypedColumns::COLUMN_NAMES {
            let want = match *col {
                "handle_refs" => json!([value("handle_refs"), "second"]),
                "links" => json!([
                    ["decision_id", "policy_decision", "pd"],
                    ["frame_id", "frame", "fr"]
                ]),
                _ => json!(value(col)),
            };
            assert_eq!(row[*col], want, "column {col} with {empty:?} empty");
        }
    }
}

/// `differences` names each column that differs, whichever it is.
#[test]
fn differences_name_every_changed_column() {
    let te = json!({"event_type": "e", "principal": "p", "capability_id": "c", "decision": "d",
        "outcome": "o", "token_id": "t", "decision_id": "pd", "frame_id": "f", "handle_id": "h",
        "handle_refs": ["r"], "metadata": {"flow_id": "fl"}});
    let l = links::extract(Kind::TraceEvent, &te);
    let t = typed_columns(Kind::TraceEvent, &te, &l);
    let stored = serde_json::to_value(&t).unwrap();
    assert!(t.differences(&stored).is_empty());
    for col in TypedColumns::COLUMN_NAMES {
        let mut forged = stored.clone();
        forged[*col] = match &forged[*col] {
            serde_json::Value::Array(_) => json!([]),
            _ => json!("forged"),
        };
        assert_eq!(t.differences(&forged), [*col], "{col}");
        let mut missing = stored.clone();
        missing.as_object_mut().unwrap().remove(*col);
        assert_eq!(t.differences(&missing), [*col], "{col}");
    }
}

/// The chain's row hash keeps its bytes: chains sealed when it was computed with serde_jcs
/// still verify.
#[test]
fn the_row_hash_is_the_sha256_of_serde_jcs_bytes() {
    use sha2::Digest as _;
    let row = ChainRow {
        topic: "weaver.trace_events".into(),
        partition: 3,
        offset: 9_007_199_254_740_993,
        tenant: "acme".into(),
        kind: "trace_event".into(),
        id: "e-\u{e9}\u{1f600}\"q\"\n".into(),
        content_hash: "ab".repeat(32),
        ts: -1,
        request_id: "r\u{2028}".into(),
        producer_id: "p".into(),
        seq: u64::MAX,
        emitted_at: 1_700_000_000_000_000,
        ingested_at: 1_700_000_000_000_001,
        event_type: "flow_started".into(),
        principal: "\u{10ffff}".into(),
        capability_id: String::new(),
        decision: "allow".into(),
        outcome: String::new(),
        token_id: "t".into(),
        decision_id: "d".into(),
        frame_id: String::new(),
        handle_id: String::new(),
        handle_refs: vec!["h1".into(), "\u{7f}".into()],
        candidate_id: String::new(),
        flow_id: "f".into(),
        links: vec![("via".into(), "frame".into(), "f1".into())],
        conflict: 1,
        content_type: "application/json".into(),
        payload_sha256: "cd".repeat(32),
    };
    let v = serde_json::to_value(&row).unwrap();
    let want: [u8; 32] = sha2::Sha256::digest(serde_jcs::to_vec(&v).unwrap()).into();
    assert_eq!(row.hash().unwrap(), want);
}

/// `auto` compresses HTTP bodies only when ClickHouse is not on this machine's loopback.
#[test]
fn auto_compression_is_off_on_loopback_only() {
    use crate::Compression;
    for url in [
        "http://127.0.0.1:18123",
        "http://localhost:8123/",
        "http://LOCALHOST",
        "https://user:pw@127.8.9.10:8443/?x=1",
        "http://[::1]:8123",
    ] {
        assert!(!Compression::Auto.lz4_for(url), "{url}");
        assert!(Compression::Lz4.lz4_for(url), "{url}");
    }
    for url in [
        "http://clickhouse:8123",
        "https://10.0.0.5:8443",
        "http://[2001:db8::1]:8123",
        "http://localhost.example.com",
    ] {
        assert!(Compression::Auto.lz4_for(url), "{url}");
        assert!(!Compression::None.lz4_for(url), "{url}");
    }
}

#[test]
fn server_errors_are_classified_by_their_code() {
    let err = |msg: &str| crate::StoreError::ClickHouse {
        url: "http://127.0.0.1:8123".into(),
        source: clickhouse::error::Error::BadResponse(msg.into()),
    };
    let over = err("Code: 158. DB::Exception: Limit for rows (controlled by 'max_rows_to_read' setting) exceeded, max rows: 1.00, current rows: 8.19 thousand. (TOO_MANY_ROWS)");
    assert!(over.is_over_read_limit());
    assert!(!over.is_transient(), "asking again reads as much again");
    let timeout = err("Code: 159. DB::Exception: Timeout exceeded. (TIMEOUT_EXCEEDED)");
    assert!(timeout.is_transient());
    assert!(!timeout.is_over_read_limit());
    // A code that only starts with a limit's digits is not one.
    assert!(!err("Code: 1580. DB::Exception: other").is_over_read_limit());
    assert!(!err("Code: 60. DB::Exception: Unknown table").is_transient());
}
