//! The tamper-evident hash chain on the local stack: sealed facts verify; one row altered
//! (ALTER UPDATE), deleted (lightweight DELETE) or inserted (INSERT at a sealed offset, of
//! the partition's kind or another)
//! directly in ClickHouse makes `weft audit verify` fail and name it; a forged link in the
//! chain table breaks the chain and its signed checkpoint. After the last seal, a row that
//! disagrees with its own payload or shares an offset is named too. `--from/--to` verifies a
//! range from the checkpoint before it. Retention: a legal hold blocks
//! deletion; retention then removes old facts, which verify tells apart from tampering.

mod common;

use std::process::Output;
use std::time::Duration;

use common::pipeline::Pipeline;
use serde_json::Value;

fn audit(p: &Pipeline, args: &[&str]) -> Output {
    p.weft().arg("audit").args(args).output().unwrap()
}

fn verify(p: &Pipeline, ring: &str) -> (Option<i32>, Value) {
    let out = audit(p, &["verify", "--format", "json", "--keyring", ring]);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify output: {e}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

/// `weft audit retention apply` (signed with `key`), which must succeed; the facts left.
async fn apply_retention(p: &Pipeline, key: Option<&str>) -> u64 {
    let sign = key.map_or(vec![], |k| vec!["--sign-key", k]);
    let out = audit(p, &[&["retention", "apply"], &sign[..]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    p.scalar("SELECT count() FROM weft_events").await
}

fn named(report: &Value, what: &str, id: &str) -> bool {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["what"] == what && p["id"] == id)
}

/// `flows` simulated flows three days old (so that a one-day retention removes all of them
/// whatever the clock), ingested: how many facts, and the ingest process.
async fn old_facts(p: &Pipeline, flows: &str, seed: &str) -> (u64, common::pipeline::Proc) {
    let start = weft_schemas::time::micros_to_rfc3339(
        weft_schemas::time::parse_micros(&weft_schemas::time::now_rfc3339()).unwrap()
            - 3 * 86_400_000_000,
    );
    let truth = p.simulate(&["--flows", flows, "--seed", seed, "--start", &start]);
    let ingest = p.ingest(None);
    p.publish(&p.path("events.jsonl"));
    let n = truth.totals.distinct_events;
    p.wait_for_facts(n, Duration::from_secs(120)).await;
    (n, ingest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected_and_named() {
    let p = Pipeline::new("it_chain");
    let (n, _ingest) = old_facts(&p, "30", "77").await;

    let key = p.path("sealer.key");
    let out = audit(
        &p,
        &[
            "keygen",
            "--kid",
            "sealer-1",
            "--out",
            key.to_str().unwrap(),
        ],
    );
    assert!(out.status.success());
    let ring = p.path("ring.json");
    std::fs::write(&ring, &out.stdout).unwrap();
    let ring = ring.to_str().unwrap().to_owned();

    let out = audit(&p, &["seal", "--sign-key", key.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(p.scalar("SELECT count() FROM weft_audit_chain").await, n);
    // Untouched data verifies; sealing again adds nothing.
    let (code, r) = verify(&p, &ring);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["verified"], n);
    assert_eq!(r["unsealed"], 0);
    assert!(r["checkpoints_ok"].as_u64().unwrap() > 0);
    assert!(audit(&p, &["seal", "--sign-key", key.to_str().unwrap()])
        .status
        .success());
    assert_eq!(p.scalar("SELECT count() FROM weft_audit_chain").await, n);
    // The checkpoints export, for offline keeping.
    let cps = audit(&p, &["checkpoints"]);
    let cps_v: Value = serde_json::from_slice(&cps.stdout).unwrap();
    assert!(cps_v
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["sig"].as_str().unwrap().len() == 86));
    let cps_file = p.path("checkpoints.json");
    std::fs::write(&cps_file, &cps.stdout).unwrap();

    let ids: Vec<String> = p
        .client()
        .query("SELECT id FROM weft_events WHERE kind = 'trace_event' ORDER BY id LIMIT 6")
        .fetch_all()
        .await
        .unwrap();
    let (altered, deleted, copied) = (&ids[0], &ids[1], &ids[2]);
    let c = p.client().with_setting("mutations_sync", "2");

    // 1. Altered in place.
    c.query("ALTER TABLE weft_events UPDATE principal = 'mallory' WHERE id = ?")
        .bind(altered)
        .execute()
        .await
        .unwrap();
    let (code, r) = verify(&p, &ring);
    assert_eq!(code, Some(1));
    assert!(named(&r, "altered", altered), "{r}");
    assert_eq!(r["problems"].as_array().unwrap().len(), 1, "{r}");

    // 2. Deleted.
    c.query("DELETE FROM weft_events WHERE id = ?")
        .bind(deleted)
        .execute()
        .await
        .unwrap();
    let (code, r) = verify(&p, &ring);
    assert_eq!(code, Some(1));
    assert!(named(&r, "deleted", deleted), "{r}");
    assert!(named(&r, "altered", altered), "{r}");
    // ... also when its link is backdated first (a link's time is not in its hash): without
    // retention applied, nothing is "pruned". It was taken for a fact pruned before 1970.
    let backdated = &ids[5];
    c.query("ALTER TABLE weft_audit_chain UPDATE ts = toDateTime64('1960-01-01 00:00:00', 6, 'UTC') WHERE id = ?")
        .bind(backdated)
        .execute()
        .await
        .unwrap();
    c.query("DELETE FROM weft_events WHERE id = ?")
        .bind(backdated)
        .execute()
        .await
        .unwrap();
    let (code, r) = verify(&p, &ring);
    assert_eq!(code, Some(1));
    assert!(named(&r, "deleted", backdated), "{r}");
    assert_eq!(r["pruned"], 0, "{r}");

    // 3. Inserted at a sealed position (a forged copy of a real row under a new id).
    c.query("INSERT INTO weft_events SELECT * REPLACE ('forged-event' AS id) FROM (SELECT * FROM weft_events WHERE id = ?)")
        .bind(copied)
        .execute()
        .await
        .unwrap();
    // ... and one of another kind than its partition's rows: verify reads a partition's
    // facts through their kind's range of the sort key when the partition has one kind, so
    // this row must make it read them all.
    c.query("INSERT INTO weft_events SELECT * REPLACE ('forged-kind' AS id, if(kind = 'frame', 'handle', 'frame') AS kind) FROM (SELECT * FROM weft_events WHERE id = ?)")
        .bind(copied)
        .execute()
        .await
        .unwrap();
    let (code, r) = verify(&p, &ring);
    assert_eq!(code, Some(1));
    assert!(named(&r, "inserted", "forged-event"), "{r}");
    assert!(named(&r, "inserted", "forged-kind"), "{r}");
    let text = audit(&p, &["verify"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("BROKEN"));
    assert!(String::from_utf8_lossy(&text.stdout).contains("first: "));

    // 4. After the last sealed offset there is no link yet, but a row must still agree with
    //    its own payload: a copy under a new id is named...
    c.query("INSERT INTO weft_events SELECT * REPLACE ('late-forgery' AS id, offset + 1000000 AS offset) FROM (SELECT * FROM weft_events WHERE id = ?)")
        .bind(copied)
        .execute()
        .await
        .unwrap();
    let (_, r) = verify(&p, &ring);
    assert_eq!(r["unsealed"], 1, "{r}");
    assert!(named(&r, "altered", "late-forgery"), "{r}");
    // ... so is an exact copy of a genuine row at a free offset: consistent in itself, but
    // ingest stores one copy of a fact per partition...
    let repeated = &ids[4];
    c.query("INSERT INTO weft_events SELECT * REPLACE (offset + 2000000 AS offset) FROM (SELECT * FROM weft_events WHERE id = ?)")
        .bind(repeated)
        .execute()
        .await
        .unwrap();
    let (_, r) = verify(&p, &ring);
    assert_eq!(r["unsealed"], 2, "{r}");
    let original: u64 = c
        .query("SELECT offset FROM weft_events WHERE id = ? AND offset < 2000000")
        .bind(repeated)
        .fetch_one()
        .await
        .unwrap();
    assert!(
        r["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["what"] == "inserted"
                && x["id"] == repeated.as_str()
                && x["detail"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("as offset {original},"))),
        "{r}"
    );
    c.query("DELETE FROM weft_events WHERE id = ? AND offset > 2000000")
        .bind(repeated)
        .execute()
        .await
        .unwrap();
    // ... so is a second fact at the same (unsealed) offset, consistent in itself (a copy of
    // a genuine row: Kafka gives each record its own offset)...
    let twin = &ids[3];
    c.query("INSERT INTO weft_events SELECT * REPLACE ((SELECT any(offset) FROM weft_events WHERE id = 'late-forgery') AS offset) FROM (SELECT * FROM weft_events WHERE id = ?)")
        .bind(twin)
        .execute()
        .await
        .unwrap();
    let (_, r) = verify(&p, &ring);
    assert_eq!(r["unsealed"], 2, "{r}");
    assert!(named(&r, "inserted", twin), "{r}");
    // ... and a column of an unsealed row changed by ALTER UPDATE.
    c.query(
        "ALTER TABLE weft_events UPDATE principal = 'mallory' WHERE id = ? AND offset > 1000000",
    )
    .bind(twin)
    .execute()
    .await
    .unwrap();
    let (_, r) = verify(&p, &ring);
    assert!(
        r["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["what"] == "altered"
                && x["id"] == twin.as_str()
                && x["offset"].as_u64().unwrap() > 1_000_000
                && x["detail"].as_str().unwrap().contains("principal")),
        "{r}"
    );
    c.query("DELETE FROM weft_events WHERE id = ? AND offset > 1000000")
        .bind(twin)
        .execute()
        .await
        .unwrap();

    // 5. Rewriting a link of the chain table itself breaks the chain and its checkpoint,
    //    including against the exported checkpoints.
    c.query("ALTER TABLE weft_audit_chain UPDATE row_hash = lower(hex(SHA256('x'))) WHERE id = ?")
        .bind(altered)
        .execute()
        .await
        .unwrap();
    let out = audit(
        &p,
        &[
            "verify",
            "--format",
            "json",
            "--keyring",
            &ring,
            "--checkpoints",
            cps_file.to_str().unwrap(),
        ],
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(named(&r, "chain_broken", altered), "{r}");
    assert!(
        r["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["what"] == "checkpoint_mismatch"),
        "{r}"
    );

    // Retention: a number of days past 100 years is refused (it once overflowed into a
    // cutoff after every fact)...
    let out = audit(&p, &["retention", "set", "--days", "999999999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("0..=36500"));
    // ... a legal hold blocks deletion...
    assert!(audit(&p, &["retention", "set", "--days", "1"])
        .status
        .success());
    assert!(audit(&p, &["retention", "hold", "--on"]).status.success());
    let before = p.scalar("SELECT count() FROM weft_events").await;
    let out = audit(&p, &["retention", "apply"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("legal hold"));
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, before);
    // ... lifted, retention removes the (three days old) facts, and verify counts them
    // as pruned, not deleted.
    assert!(audit(&p, &["retention", "hold", "--off"]).status.success());
    let highest: Vec<(String, u32, u64)> = p
        .client()
        .query("SELECT topic, partition, max(offset) FROM weft_events GROUP BY topic, partition")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(apply_retention(&p, key.to_str()).await, 0);
    // Ingest resumes after each partition's highest stored offset: deleting every fact must
    // not move it back, or a restarted ingest would read them from Kafka and store them again.
    let store = p.store();
    assert!(!highest.is_empty());
    for (topic, partition, offset) in &highest {
        let resume = weft_consumers::facts::stored_max_offset(&store, topic, *partition as i32)
            .await
            .unwrap();
        assert_eq!(resume, *offset as i64, "{topic}/{partition}");
    }
    let (_, r) = verify(&p, &ring);
    assert_eq!(r["pruned"], n, "{r}");
    assert!(!named(&r, "deleted", deleted), "{r}");
}

/// `weft audit verify --from/--to`: two batches sealed apart (six and two days old); a
/// range over the newer batch recomputes only its rows, starting from each partition's
/// signed checkpoint before it (a wrong start would break every link), ignores tampering
/// before the range, names tampering inside it, and rejects a forged anchor checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_a_range_from_the_checkpoint_before_it() {
    let p = Pipeline::new("it_chain_range");
    let now = weft_schemas::time::parse_micros(&weft_schemas::time::now_rfc3339()).unwrap();
    let days_ago = |d: i64| weft_schemas::time::micros_to_rfc3339(now - d * 86_400_000_000);
    let key = p.path("sealer.key");
    let out = audit(
        &p,
        &["keygen", "--kid", "s", "--out", key.to_str().unwrap()],
    );
    assert!(out.status.success());
    let ring = p.path("ring.json");
    std::fs::write(&ring, &out.stdout).unwrap();
    let ring = ring.to_str().unwrap().to_owned();
    let seal = |p: &Pipeline| {
        let out = audit(p, &["seal", "--sign-key", key.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    let _ingest = p.ingest(None);
    let old = p.simulate(&["--flows", "12", "--seed", "41", "--start", &days_ago(6)]);
    p.publish(&p.path("events.jsonl"));
    let n_old = old.totals.distinct_events;
    p.wait_for_facts(n_old, Duration::from_secs(120)).await;
    // Nothing sealed yet: every genuine fact agrees with its own payload.
    let (code, r) = verify(&p, &ring);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["unsealed"], n_old, "{r}");
    seal(&p);
    let new = p.simulate(&["--flows", "12", "--seed", "42", "--start", &days_ago(2)]);
    p.publish(&p.path("events.jsonl"));
    let n_new = new.totals.distinct_events;
    p.wait_for_facts(n_old + n_new, Duration::from_secs(120))
        .await;
    seal(&p);

    let ranged = |p: &Pipeline| -> (Option<i32>, Value) {
        let from = days_ago(4);
        let out = audit(
            p,
            &[
                "verify",
                "--format",
                "json",
                "--keyring",
                &ring,
                "--from",
                &from,
                "--to",
                "now",
            ],
        );
        let v = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("verify: {e}\n{}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), v)
    };
    let (code, full) = verify(&p, &ring);
    assert_eq!(code, Some(0), "{full}");
    assert_eq!(full["verified"], n_old + n_new);
    let (code, r) = ranged(&p);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["verified"], n_new, "{r}");
    assert!(r["anchored"].as_u64().unwrap() > 0, "{r}");

    let c = p.client().with_setting("mutations_sync", "2");
    let pick = |older: bool| {
        let c = p.client();
        async move {
            let ids: Vec<String> = c
                .query(if older {
                    "SELECT id FROM weft_events WHERE kind = 'trace_event' AND ts < now64() - INTERVAL 4 DAY ORDER BY id LIMIT 1"
                } else {
                    "SELECT id FROM weft_events WHERE kind = 'trace_event' AND ts > now64() - INTERVAL 4 DAY ORDER BY id LIMIT 1"
                })
                .fetch_all()
                .await
                .unwrap();
            ids[0].clone()
        }
    };
    // Tampering before the range: the full check names it, the ranged one does not look.
    let before = pick(true).await;
    c.query("ALTER TABLE weft_events UPDATE principal = 'mallory' WHERE id = ?")
        .bind(&before)
        .execute()
        .await
        .unwrap();
    let (code, full) = verify(&p, &ring);
    assert_eq!(code, Some(1));
    assert!(named(&full, "altered", &before), "{full}");
    let (code, r) = ranged(&p);
    assert_eq!(code, Some(0), "{r}");
    // Tampering inside the range is named.
    let inside = pick(false).await;
    c.query("ALTER TABLE weft_events UPDATE principal = 'mallory' WHERE id = ?")
        .bind(&inside)
        .execute()
        .await
        .unwrap();
    let (code, r) = ranged(&p);
    assert_eq!(code, Some(1), "{r}");
    assert!(named(&r, "altered", &inside), "{r}");
    assert!(!named(&r, "altered", &before), "{r}");
    // A forged anchor (its head rewritten in ClickHouse) fails its signature.
    c.query("ALTER TABLE weft_audit_checkpoints UPDATE head = lower(hex(SHA256('forged'))) WHERE sealed_at = (SELECT min(sealed_at) FROM weft_audit_checkpoints)")
        .execute()
        .await
        .unwrap();
    let (_, r) = ranged(&p);
    assert!(
        r["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["what"] == "checkpoint_mismatch"
                && x["detail"].as_str().unwrap().contains("anchor")),
        "{r}"
    );
}

/// Nothing sealed: every column derived from the payload (by `weft_store::typed_columns`)
/// and the MATERIALIZED token columns the I-06 check reads are checked against the payload on
/// unsealed rows. Each column is changed alone, on a row of its own, with ALTER UPDATE (the
/// MATERIALIZED ones, which ClickHouse will not UPDATE, on an inserted copy), and `verify`
/// names that row and that column (before, a forged decision_id, frame_id or handle_id passed
/// as INTACT). The next seal holds those rows back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsealed_rows_are_checked_column_by_column() {
    let p = Pipeline::new("it_unsealed");
    let truth = p.simulate(&["--flows", "20", "--seed", "91"]);
    let _ingest = p.ingest(None);
    p.publish(&p.path("events.jsonl"));
    p.wait_for_facts(truth.totals.distinct_events, Duration::from_secs(120))
        .await;
    let out = audit(&p, &["verify", "--format", "json"]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["unsealed"], truth.totals.distinct_events, "{r}");

    let c = p.client().with_setting("mutations_sync", "2");
    // (column, its forged value as SQL, the rows that may carry it)
    let forgeries = [
        ("decision_id", "'pd-forged'", "notEmpty(decision_id)"),
        ("frame_id", "'fr-forged'", "notEmpty(frame_id)"),
        ("handle_id", "'h-forged'", "notEmpty(handle_id)"),
        ("handle_refs", "['h-forged']", "notEmpty(handle_refs)"),
        ("candidate_id", "'c-forged'", "notEmpty(candidate_id)"),
        ("flow_id", "'flow-forged'", "notEmpty(flow_id)"),
        ("token_id", "'tok-forged'", "notEmpty(token_id)"),
        ("links", "[]", "notEmpty(links)"),
        // MATERIALIZED: ClickHouse refuses to UPDATE them, so they are forged on a copy of a
        // token inserted with its own values (the only way to write them).
        (
            "token_scope",
            "['forged.scope']",
            "kind = 'capability_token'",
        ),
        (
            "token_single_use",
            "1 - token_single_use",
            "kind = 'capability_token'",
        ),
    ];
    let columns: Vec<String> = c
        .query("SELECT name FROM system.columns WHERE database = currentDatabase() AND table = 'weft_events' ORDER BY position")
        .fetch_all()
        .await
        .unwrap();
    let mut altered: Vec<String> = Vec::new();
    for (n, (col, value, which)) in forgeries.into_iter().enumerate() {
        let id: String = c
            .query(&format!(
                "SELECT id FROM weft_events WHERE {which} AND NOT has(CAST(? AS Array(String)), id) ORDER BY id LIMIT 1"
            ))
            .bind(&altered)
            .fetch_one()
            .await
            .unwrap_or_else(|e| panic!("no row with {col}: {e}"));
        if col.starts_with("token_s") {
            let select: Vec<String> = columns
                .iter()
                .map(|k| match k.as_str() {
                    k if k == col => format!("{value} AS {k}"),
                    "offset" => format!("offset + {} AS offset", 5_000_000 + n),
                    k => k.to_owned(),
                })
                .collect();
            c.clone()
                .with_setting("insert_allow_materialized_columns", "1")
                .query(&format!(
                    "INSERT INTO weft_events ({}) SELECT {} FROM weft_events WHERE id = ?",
                    columns.join(", "),
                    select.join(", ")
                ))
                .bind(&id)
                .execute()
                .await
                .unwrap_or_else(|e| panic!("INSERT forged {col}: {e}"));
        } else {
            c.query(&format!(
                "ALTER TABLE weft_events UPDATE {col} = {value} WHERE id = ?"
            ))
            .bind(&id)
            .execute()
            .await
            .unwrap_or_else(|e| panic!("ALTER UPDATE {col}: {e}"));
        }
        altered.push(id.clone());
        let out = audit(&p, &["verify", "--format", "json"]);
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(1), "{col}: {r}");
        let named: Vec<&Value> = r["problems"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["id"] == id.as_str())
            .collect();
        assert_eq!(named.len(), 1, "{col}: {r}");
        assert_eq!(named[0]["what"], "altered", "{col}: {r}");
        let detail = named[0]["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("{col} is not its payload's")),
            "{col}: {detail}"
        );
        // Only this row's column, and one problem per altered row so far.
        assert_eq!(
            detail.matches("is not its payload's").count(),
            1,
            "{col}: {detail}"
        );
        assert_eq!(
            r["problems"].as_array().unwrap().len(),
            altered.len(),
            "{r}"
        );
    }

    // Sealing does not launder them: each partition is sealed up to its first bad row, the
    // seal says so (exit 1), and verify still names every altered row.
    let out = audit(&p, &["seal"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for id in &altered {
        assert!(
            stderr.contains(&format!(":{id} at ")),
            "{id} not held: {stderr}"
        );
    }
    let sealed = p.scalar("SELECT count() FROM weft_audit_chain").await;
    assert!(
        sealed > 0 && sealed + 8 <= truth.totals.distinct_events,
        "{sealed}"
    );
    let out = audit(&p, &["verify", "--format", "json"]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    for id in &altered {
        assert!(named(&r, "altered", id), "{id}: {r}");
    }
    assert_eq!(
        r["problems"].as_array().unwrap().len(),
        altered.len(),
        "{r}"
    );
    assert_eq!(r["verified"], sealed, "{r}");
    // Two sealers at once write the same links twice: harmless copies, read once.
    c.query("INSERT INTO weft_audit_chain SELECT * FROM weft_audit_chain")
        .execute()
        .await
        .unwrap();
    let out = audit(&p, &["verify", "--format", "json"]);
    let r2: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r2["problems"], r["problems"], "{r2}");
    assert_eq!(r2["verified"], sealed, "{r2}");
}

/// Retention's window: a fact stored while `apply` runs (after it read each partition's
/// highest stored offset, before it deletes) is not deleted, even when it is older than
/// the cutoff, so the floor apply records covers every row it deletes and ingest's resume
/// point never moves back. The next apply takes it. The concurrent writer is played by an
/// insert between the two steps, which makes the interleaving certain, not a matter of
/// timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_spares_a_fact_stored_while_it_applies() {
    let p = Pipeline::new("it_retention_window");
    let (n, ingest) = old_facts(&p, "5", "78").await;
    drop(ingest);
    assert!(audit(&p, &["retention", "set", "--days", "1"])
        .status
        .success());

    // A dry run says what would go, and deletes nothing.
    let out = audit(&p, &["retention", "apply", "--dry-run"]);
    assert!(out.status.success());
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["retention"]["would_delete"], n, "{r}");
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, n);

    let store = p.store();
    // A plan made before the retention changed deletes nothing.
    let stale = weft_audit::retention::plan(&store, "default")
        .await
        .unwrap()
        .expect("a one-day retention");
    assert!(audit(&p, &["retention", "set", "--days", "30"])
        .status
        .success());
    let refused = stale.execute(&store, None).await;
    assert!(
        matches!(refused, Err(weft_audit::AuditError::Refused(_))),
        "{refused:?}"
    );
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, n);
    assert!(audit(&p, &["retention", "set", "--days", "1"])
        .status
        .success());
    let plan = weft_audit::retention::plan(&store, "default")
        .await
        .unwrap()
        .expect("a one-day retention");
    assert_eq!(plan.facts, n);
    // Ingest stores one more old fact, past its partition's highest offset, in between.
    let (topic, partition, last): (String, u32, u64) = p
        .client()
        .query(
            "SELECT topic, partition, max(offset) FROM weft_events \
             GROUP BY topic, partition ORDER BY topic, partition LIMIT 1",
        )
        .fetch_one()
        .await
        .unwrap();
    p.client()
        .query(
            "INSERT INTO weft_events SELECT * REPLACE (? AS offset, concat(id, '-late') AS id) \
             FROM (SELECT * FROM weft_events WHERE topic = ? AND partition = ? AND offset = ?)",
        )
        .bind(last + 1)
        .bind(&topic)
        .bind(partition)
        .bind(last)
        .execute()
        .await
        .unwrap();
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, n + 1);
    let applied = plan.execute(&store, None).await.unwrap();
    assert_eq!(applied.deleted, n);
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, 1);
    let late = p
        .scalar("SELECT offset FROM weft_events WHERE endsWith(id, '-late')")
        .await;
    assert_eq!(late, last + 1);
    let resume = || weft_consumers::facts::stored_max_offset(&store, &topic, partition as i32);
    assert_eq!(resume().await.unwrap(), late as i64);
    // The next apply records a floor that covers it, and deletes it.
    assert_eq!(apply_retention(&p, None).await, 0);
    assert_eq!(resume().await.unwrap(), late as i64);
}

/// The sealing loop of `weft audit serve --seal-every-secs 1` (one `Sealer` for the
/// process, reading only what was stored since its last round): it seals each batch as it
/// arrives, for a tenant that appears later too; and after a seal killed between its links
/// and its checkpoint (played by deleting the newest checkpoints, so links run past the
/// last checkpoint), the next round resumes from the last link, not from the checkpoint's
/// offset or from genesis: every chain verifies and every checkpoint counts its links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sealing_loop_seals_what_arrives_and_resumes_after_a_killed_seal() {
    let p = Pipeline::new("it_seal_loop");
    let _ingest = p.ingest(None);
    let mut stored = 0;
    let mut batch = |tenant: &str, seed: &str| {
        let truth = p.simulate(&["--flows", "6", "--seed", seed, "--tenant", tenant]);
        p.publish(&p.path("events.jsonl"));
        stored += truth.totals.distinct_events;
        stored
    };
    let links = "SELECT count() FROM weft_audit_chain";
    // Chains whose last link is past their last checkpoint.
    let dangling = "SELECT count() FROM ( \
           SELECT tenant, topic, partition, max(offset) AS o FROM weft_audit_chain \
           GROUP BY tenant, topic, partition) AS l \
         LEFT JOIN (SELECT tenant, topic, partition, max(offset) AS o \
           FROM weft_audit_checkpoints GROUP BY tenant, topic, partition) AS c \
         USING (tenant, topic, partition) WHERE l.o > c.o";

    let n = batch("acme", "91");
    p.wait_for_facts(n, Duration::from_secs(120)).await;
    let addr = format!("127.0.0.1:{}", common::pipeline::free_port());
    let log = std::fs::File::create(p.path("serve.log")).unwrap();
    let _serve = common::pipeline::Proc(
        p.weft()
            .args([
                "audit",
                "serve",
                "--listen",
                &addr,
                "--seal-every-secs",
                "1",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    p.wait_for_count(links, n, Duration::from_secs(60)).await;

    let n = batch("acme", "92");
    p.wait_for_facts(n, Duration::from_secs(120)).await;
    p.wait_for_count(links, n, Duration::from_secs(60)).await;
    // ... and the round's checkpoints (a round writes each partition's links, then its
    // checkpoint), so that the round is over before its checkpoints are taken away.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while p.scalar(dangling).await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a round never checkpointed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The last round's checkpoints go, as if its seal had died after writing its links.
    p.client()
        .with_setting("mutations_sync", "2")
        .query(
            "DELETE FROM weft_audit_checkpoints WHERE sealed_at = \
             (SELECT max(sealed_at) FROM weft_audit_checkpoints)",
        )
        .execute()
        .await
        .unwrap();
    let killed = p.scalar(dangling).await;
    assert!(killed > 0);

    // A new tenant, and more of the first.
    batch("globex", "93");
    let n = batch("acme", "94");
    p.wait_for_facts(n, Duration::from_secs(120)).await;
    p.wait_for_count(links, n, Duration::from_secs(60)).await;
    assert_eq!(p.scalar(links).await, n, "a fact sealed twice");
    assert!(
        p.scalar(dangling).await < killed,
        "no chain resumed past its checkpoint"
    );
    for tenant in ["acme", "globex"] {
        let out = audit(&p, &["verify", "--format", "json", "--tenant", tenant]);
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{tenant}: {r}");
        let facts = p
            .client()
            .query("SELECT count() FROM weft_events WHERE tenant = ?")
            .bind(tenant)
            .fetch_one::<u64>()
            .await
            .unwrap();
        assert_eq!(r["verified"], facts, "{tenant}: {r}");
        assert_eq!(r["unsealed"], 0, "{tenant}: {r}");
    }
    // Every chain's newest checkpoint counts the links up to it.
    let miscounted = p
        .scalar(
            "SELECT count() FROM ( \
               SELECT c.n AS n, countIf(l.offset <= c.o) AS k FROM ( \
                 SELECT tenant, topic, partition, max(offset) AS o, argMax(rows, offset) AS n \
                 FROM weft_audit_checkpoints GROUP BY tenant, topic, partition) AS c \
               JOIN weft_audit_chain AS l USING (tenant, topic, partition) \
               GROUP BY tenant, topic, partition, c.n, c.o HAVING k != n)",
        )
        .await;
    assert_eq!(miscounted, 0);
    // What an operator alerts on: rounds that sealed every tenant, none failed or held back.
    let m = |name: &'static str| {
        let addr = addr.clone();
        async move { common::metric(&addr, name).await.expect("GET /metrics") }
    };
    assert!(m("weft_audit_seal_rounds_total").await > 0);
    assert!(m("weft_audit_seal_last_success_seconds").await > 1_700_000_000);
    assert_eq!(m("weft_audit_seal_rows_held").await, 0);
}

/// A signing key and its keyring in `p`'s folder: (key path, keyring path).
fn sealing_key(p: &Pipeline) -> (String, String) {
    let key = p.path("sealer.key");
    let out = audit(p, &["keygen", "--kid", "s", "--out", key.to_str().unwrap()]);
    assert!(out.status.success());
    let ring = p.path("ring.json");
    std::fs::write(&ring, &out.stdout).unwrap();
    (
        key.to_str().unwrap().to_owned(),
        ring.to_str().unwrap().to_owned(),
    )
}

/// `weft audit seal` of `tenant`, which must succeed.
fn seal_tenant(p: &Pipeline, key: &str, tenant: &str) {
    let out = audit(p, &["seal", "--tenant", tenant, "--sign-key", key]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `weft audit verify --format json --keyring RING --tenant TENANT ARGS`.
fn verify_with(p: &Pipeline, ring: &str, tenant: &str, args: &[&str]) -> (Option<i32>, Value) {
    let out = audit(
        p,
        &[
            &[
                "verify",
                "--format",
                "json",
                "--keyring",
                ring,
                "--tenant",
                tenant,
            ],
            args,
        ]
        .concat(),
    );
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("verify: {e}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), v)
}

fn days_ago(d: i64) -> String {
    let now = weft_schemas::time::parse_micros(&weft_schemas::time::now_rfc3339()).unwrap();
    weft_schemas::time::micros_to_rfc3339(now - d * 86_400_000_000)
}

/// Each (topic, partition)'s last sealed offset of `tenant`.
async fn last_links(p: &Pipeline, tenant: &str) -> Vec<(String, u32, u64)> {
    p.client()
        .query(
            "SELECT topic, partition, max(offset) FROM weft_audit_chain WHERE tenant = ? \
             GROUP BY topic, partition ORDER BY topic, partition",
        )
        .bind(tenant)
        .fetch_all()
        .await
        .unwrap()
}

/// Delete `tenant`'s facts and links of `topic`/`partition` with an offset in `(after, upto]`.
async fn delete_span(
    p: &Pipeline,
    tenant: &str,
    topic: &str,
    partition: u32,
    after: i64,
    upto: u64,
) {
    let c = p.client().with_setting("mutations_sync", "2");
    for table in ["weft_events", "weft_audit_chain"] {
        c.query(&format!(
            "DELETE FROM {table} WHERE tenant = ? AND topic = ? AND partition = ? \
             AND toInt64(offset) > ? AND offset <= ?"
        ))
        .bind(tenant)
        .bind(topic)
        .bind(partition)
        .bind(after)
        .bind(upto)
        .execute()
        .await
        .unwrap();
    }
}

/// Finding: a range verify took its offsets from the rows still stored with an event time in
/// the range, and checked only the checkpoints among them. Deleting the facts and links of
/// the range's last sealed batch ended the window early (the checkpoint at the old head was
/// never read); deleting those of its first batch moved the anchor to that batch's own
/// checkpoint. Both said INTACT. Three batches are sealed apart (six, three and two days
/// old) for two tenants; a range from four days ago covers the last two. For tenant `tail`
/// the last batch is deleted, for `head` the first in the range: each must be named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_verify_names_a_sealed_batch_deleted_at_either_end() {
    let p = Pipeline::new("it_chain_ends");
    let (key, ring) = sealing_key(&p);
    let _ingest = p.ingest(None);
    let mut stored = 0;
    // The last sealed offsets after each seal, per tenant.
    let mut after: Vec<Vec<Vec<(String, u32, u64)>>> = vec![Vec::new(), Vec::new()];
    for (b, age) in [6, 3, 2].into_iter().enumerate() {
        for (t, tenant) in ["tail", "head"].into_iter().enumerate() {
            let seed = format!("{}", 60 + 10 * b + t);
            let truth = p.simulate(&[
                "--flows",
                "6",
                "--seed",
                &seed,
                "--tenant",
                tenant,
                "--start",
                &days_ago(age),
            ]);
            p.publish(&p.path("events.jsonl"));
            stored += truth.totals.distinct_events;
            p.wait_for_facts(stored, Duration::from_secs(120)).await;
            seal_tenant(&p, &key, tenant);
            after[t].push(last_links(&p, tenant).await);
        }
    }
    let from = days_ago(4);
    let range = ["--from", from.as_str(), "--to", "now"];
    for tenant in ["tail", "head"] {
        let (code, r) = verify_with(&p, &ring, tenant, &range);
        assert_eq!(code, Some(0), "{r}");
        assert!(r["anchored"].as_u64().unwrap() > 0, "{r}");
    }
    let offset_at = |seals: &Vec<(String, u32, u64)>, topic: &str, partition: u32| -> i64 {
        seals
            .iter()
            .find(|(t, p, _)| t == topic && *p == partition)
            .map_or(-1, |x| x.2 as i64)
    };

    // Deletes, in every partition of `tenant`, the facts and links sealed between seal
    // `from` and seal `to`; a verify of the range must then name a checkpoint mismatch.
    let delete_between = |tenant: &'static str, seals: usize, from: usize, to: usize| {
        let (p, ring, range, after) = (&p, &ring, &range, &after);
        async move {
            let mut deleted = 0;
            for (topic, partition, last) in &after[seals][to] {
                let before = offset_at(&after[seals][from], topic, *partition);
                if before < *last as i64 {
                    delete_span(p, tenant, topic, *partition, before, *last).await;
                    deleted += 1;
                }
            }
            assert!(deleted > 0);
            let (code, r) = verify_with(p, ring, tenant, range);
            assert_eq!(code, Some(1), "{r}");
            assert!(
                r["problems"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x["what"] == "checkpoint_mismatch"),
                "{r}"
            );
        }
    };
    // The last batch of every partition of `tail`: facts and links past the second seal.
    delete_between("tail", 0, 1, 2).await;
    // The first batch in the range of every partition of `head`: facts and links between
    // the first and the second seal.
    delete_between("head", 1, 0, 1).await;
}

/// Finding: the partitions verified were those of the tenant's facts and links, so deleting
/// every fact and link of one partition (or a whole tenant) left its checkpoints unread and
/// verify said INTACT. They are listed from the checkpoints too (ClickHouse's and an
/// exported file's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_deleted_whole_is_named() {
    let p = Pipeline::new("it_chain_part");
    let (key, ring) = sealing_key(&p);
    let _ingest = p.ingest(None);
    let truth = p.simulate(&["--flows", "8", "--seed", "91"]);
    p.publish(&p.path("events.jsonl"));
    p.wait_for_facts(truth.totals.distinct_events, Duration::from_secs(120))
        .await;
    seal_tenant(&p, &key, "default");
    let cps = audit(&p, &["checkpoints"]);
    assert!(cps.status.success());
    let cps_file = p.path("checkpoints.json");
    std::fs::write(&cps_file, &cps.stdout).unwrap();
    let cps_file = cps_file.to_str().unwrap().to_owned();
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(0), "{r}");

    let parts = last_links(&p, "default").await;
    assert!(parts.len() > 1, "{parts:?}");
    let (topic, partition, last) = parts[0].clone();
    delete_span(&p, "default", &topic, partition, -1, last).await;
    let named_part = |r: &Value| {
        r["problems"].as_array().unwrap().iter().any(|x| {
            x["what"] == "checkpoint_mismatch" && x["topic"] == topic && x["partition"] == partition
        })
    };
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(1), "{r}");
    assert!(named_part(&r), "{r}");
    // A range too.
    let (code, r) = verify_with(&p, &ring, "default", &["--from", "1d"]);
    assert_eq!(code, Some(1), "{r}");
    assert!(named_part(&r), "{r}");
    // Its checkpoints deleted as well: the exported file still names it.
    p.client()
        .with_setting("mutations_sync", "2")
        .query("DELETE FROM weft_audit_checkpoints WHERE topic = ? AND partition = ?")
        .bind(&topic)
        .bind(partition)
        .execute()
        .await
        .unwrap();
    let (code, r) = verify_with(&p, &ring, "default", &["--checkpoints", &cps_file]);
    assert_eq!(code, Some(1), "{r}");
    assert!(named_part(&r), "{r}");
}

/// Finding: `pruned_before` is read from an unsigned row of `weft_audit_retention` (the one
/// of the highest version), and nothing bounded it: a row forged with a huge version and
/// `pruned_before` in 2200 made any deletion count as `pruned`. A tenant never given a
/// retention has nothing pruned, and no value later than its shortest retention allows is
/// used: verify names the row and the deletion. A version at the end of the range no longer
/// overflows `retention set` (it is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_retention_row_does_not_hide_a_deletion() {
    let p = Pipeline::new("it_chain_prune");
    let (key, ring) = sealing_key(&p);
    let _ingest = p.ingest(None);
    let truth = p.simulate(&["--flows", "6", "--seed", "92"]);
    p.publish(&p.path("events.jsonl"));
    p.wait_for_facts(truth.totals.distinct_events, Duration::from_secs(120))
        .await;
    seal_tenant(&p, &key, "default");
    let c = p.client().with_setting("mutations_sync", "2");
    // `pruned` is an SQL expression.
    let forge = |version: u64, days: u32, pruned: &str| {
        let c = p.client();
        let sql = format!(
            "INSERT INTO weft_audit_retention (tenant, days, legal_hold, pruned_before, version, updated_at) \
             SELECT 'default', ?, 0, {pruned}, ?, now64(6)"
        );
        async move {
            c.query(&sql)
                .bind(days)
                .bind(version)
                .execute()
                .await
                .unwrap();
        }
    };
    forge(1 << 63, 0, "toDateTime64('2200-01-01 00:00:00', 6, 'UTC')").await;
    let id = delete_first_trace_event(&c).await;
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(1), "{r}");
    assert!(named(&r, "deleted", &id), "{r}");
    assert_eq!(r["pruned"], 0, "{r}");
    assert!(
        r["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["what"] == "pruned_before_invalid"),
        "{r}"
    );
    // With a retention set (30 days), a value in 2200 is still impossible.
    assert!(audit(&p, &["retention", "set", "--days", "30"])
        .status
        .success());
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(1), "{r}");
    assert!(named(&r, "deleted", &id), "{r}");
    // So is one an hour ago: no retention is shorter than a day.
    forge((1 << 63) + 10, 1, "now64(6) - INTERVAL 1 HOUR").await;
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(1), "{r}");
    assert!(named(&r, "deleted", &id), "{r}");
    assert_eq!(r["pruned"], 0, "{r}");
    // A version no write can follow is refused, not overflowed.
    forge(u64::MAX, 30, "toDateTime64(0, 6, 'UTC')").await;
    let out = audit(&p, &["retention", "set", "--days", "31"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("supersede"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Finding: `pruned_before` came from an unsigned row of `weft_audit_retention`, so a row
/// forged with a value a day or more old (inside the bound of the test above) made the
/// deletion of an older sealed fact count as `pruned`. Now `retention apply --sign-key` signs
/// the value it records and `verify --keyring` uses only a value whose signature verifies:
/// the forged row (unsigned, like every row written before migration 0019) is named,
/// `pruned_before_unsigned`, first, and the deletion is `deleted`. A genuine signed apply
/// still counts what it removed as `pruned`, also after `retention hold` and `set` wrote rows
/// on top of it (they carry its signature forward); its signature copied onto another value
/// does not verify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_pruned_before_does_not_hide_a_deletion() {
    let p = Pipeline::new("it_chain_prune_signed");
    let (n, _ingest) = old_facts(&p, "6", "94").await;
    let (key, ring) = sealing_key(&p);
    seal_tenant(&p, &key, "default");
    let c = p.client().with_setting("mutations_sync", "2");
    let forge = |pruned: &'static str, kid: String, sig: String| {
        let c = p.client();
        let sql = format!(
            "INSERT INTO weft_audit_retention \
             (tenant, days, legal_hold, pruned_before, kid, sig, version, updated_at) \
             SELECT 'default', 1, 0, {pruned}, ?, ?, \
                    (SELECT max(version) + 1 FROM weft_audit_retention), now64(6)"
        );
        async move {
            c.query(&sql).bind(kid).bind(sig).execute().await.unwrap();
        }
    };
    // Two days ago: within the bound, and after the (three days old) facts.
    forge("now64(6) - INTERVAL 2 DAY", String::new(), String::new()).await;
    let id = delete_first_trace_event(&c).await;
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(1), "{r}");
    assert_eq!(r["problems"][0]["what"], "pruned_before_unsigned", "{r}");
    assert!(named(&r, "deleted", &id), "{r}");
    assert_eq!(r["pruned"], 0, "{r}");
    assert_eq!(r["pruned_before"], 0, "{r}");

    // A genuine apply, signed: everything it removed (and the fact deleted before it, older
    // than its cutoff) is `pruned`, and the chain is intact.
    assert!(audit(&p, &["retention", "set", "--days", "1"])
        .status
        .success());
    assert_eq!(apply_retention(&p, Some(&key)).await, 0);
    let intact = |r: &Value| {
        assert_eq!(r["pruned"], n, "{r}");
        assert!(r["problems"].as_array().unwrap().is_empty(), "{r}");
        assert!(r["pruned_before"].as_i64().unwrap() > 0, "{r}");
        assert_eq!(r["pruned_before_signature"], "verified", "{r}");
    };
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(0), "{r}");
    intact(&r);
    // Without a keyring the value is used unchecked, and verify says so.
    let out = audit(&p, &["verify", "--format", "json"]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["pruned"], n, "{r}");
    assert_eq!(r["pruned_before_signature"], "not_checked", "{r}");
    let out = audit(&p, &["verify"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("taken unchecked: pass --keyring"), "{text}");
    // Rows written on top by `hold` and `set` keep the signed value and its signature.
    assert!(audit(&p, &["retention", "hold", "--on"]).status.success());
    assert!(audit(&p, &["retention", "set", "--days", "2"])
        .status
        .success());
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(0), "{r}");
    intact(&r);
    // The genuine signature copied onto a later value does not verify.
    let (kid, sig): (String, String) = c
        .query(
            "SELECT argMax(kid, version), argMax(sig, version) FROM weft_audit_retention \
             WHERE tenant = 'default'",
        )
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(sig.len(), 86);
    forge("now64(6) - INTERVAL 1 DAY", kid, sig).await;
    let (code, r) = verify_with(&p, &ring, "default", &[]);
    assert_eq!(code, Some(1), "{r}");
    assert_eq!(r["problems"][0]["what"], "pruned_before_unsigned", "{r}");
    assert_eq!(r["pruned"], 0, "{r}");
    let deleted = r["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["what"] == "deleted")
        .count() as u64;
    assert_eq!(deleted, n, "{r}");
}

/// Finding: a bounded verify (the API's `max_verify_rows`) did not count the copy lookup of
/// unsealed facts, which scans the partition's facts ingested within the copy window. Nothing
/// sealed: the spans hold the F facts, and the copy lookup scans the same F again. A budget
/// of F was enough before; now 2F is needed, and F is refused as too large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_verify_counts_the_copy_lookup() {
    let p = Pipeline::new("it_chain_copies");
    let _ingest = p.ingest(None);
    let truth = p.simulate(&["--flows", "4", "--seed", "93"]);
    p.publish(&p.path("events.jsonl"));
    let f = truth.totals.distinct_events;
    p.wait_for_facts(f, Duration::from_secs(120)).await;
    let store = p.store();
    let opt = |max| weft_audit::chain::VerifyOptions {
        range: None,
        copy_window_secs: weft_audit::chain::copy_window_secs(7 * 86_400),
        max_rows: Some(max),
    };
    let r = weft_audit::chain::verify(&store, "default", &[], None, opt(2 * f))
        .await
        .unwrap();
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.unsealed, f);
    let r = weft_audit::chain::verify(&store, "default", &[], None, opt(f)).await;
    assert!(
        matches!(r, Err(weft_audit::AuditError::TooLarge(_))),
        "{r:?}"
    );
}

/// Delete the TraceEvent of the smallest id behind weft's back (`c` waits for the mutation);
/// its id.
async fn delete_first_trace_event(c: &clickhouse::Client) -> String {
    let id: String = c
        .query("SELECT id FROM weft_events WHERE kind = 'trace_event' ORDER BY id LIMIT 1")
        .fetch_one()
        .await
        .unwrap();
    c.query("DELETE FROM weft_events WHERE id = ?")
        .bind(&id)
        .execute()
        .await
        .unwrap();
    id
}
