//! The check of facts after the last seal: each against its own payload (through the one
//! derivation ingest uses, `weft_store::typed_columns`) and against the other facts of its
//! partition. Used by [`super::verify`], and by [`super::seal`] so that it never seals a
//! forgery.

use std::collections::BTreeMap;

use clickhouse::Row;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use weft_store::chain::{Unsealed, UNSEALED_SQL};

use super::{events_span_where, kind_where, Span};
use crate::{ch_err, AuditError, Store};

/// Every fact of the partition that shares its identity, content and request id with an
/// unsealed one, grouped: each row lists one fact's copies as (offset, ingested_at µs), by
/// offset. A copy under another request id is no copy: ingest stores it (`facts::copy_hash`),
/// since the narratives take a node's color from its request ids. Copies
/// ingested more than `{w}` µs before the earliest unsealed row cannot matter and are not
/// read (the table is partitioned by month of `ingested_at`).
const COPIES_SQL: &str = concat!(
    "WITH unsealed AS (SELECT kind, id, content_hash, request_id, ingested_at FROM weft_events WHERE ",
    events_span_where!(),
    ")
SELECT arraySort(groupArray((offset, toUnixTimestamp64Micro(ingested_at)))) AS copies
FROM weft_events
WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32}
  AND ",
    kind_where!(),
    "
  AND ingested_at >= (SELECT min(ingested_at) FROM unsealed) - toIntervalMicrosecond({w:UInt64})
  AND (kind, id, content_hash, request_id) IN (SELECT kind, id, content_hash, request_id FROM unsealed)
GROUP BY kind, id, content_hash, request_id
HAVING count() > 1
"
);

/// How many rows [`COPIES_SQL`] scans: the partition's facts (of its kind) ingested at most
/// the window before the earliest unsealed one. What a bounded verify counts against its
/// budget before the lookup (`VerifyOptions::max_rows`).
const COPIES_COUNT_SQL: &str = concat!(
    "WITH unsealed AS (SELECT ingested_at FROM weft_events WHERE ",
    events_span_where!(),
    ")
SELECT count() FROM weft_events
WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32}
  AND ",
    kind_where!(),
    "
  AND ingested_at >= (SELECT min(ingested_at) FROM unsealed) - toIntervalMicrosecond({w:UInt64})
"
);

/// How many rows the copy lookup of [`unsealed_problems`] over `span` scans.
pub(super) async fn copies_rows(
    store: &Store,
    span: Span<'_>,
    copy_window_secs: u64,
) -> Result<u64, AuditError> {
    span.query(store, COPIES_COUNT_SQL)
        .param("w", copy_window_secs.saturating_mul(1_000_000))
        .fetch_one()
        .await
        .map_err(ch_err(store))
}

/// How far apart two stored copies of one fact (same partition, identity, content and request
/// id) must have been ingested for the second to be legitimate, given ingest's
/// `dedup_window_secs`: half of it, the least its two-generation dedup cache is sure to
/// remember.
pub fn copy_window_secs(dedup_window_secs: u64) -> u64 {
    dedup_window_secs / 2
}

/// One fact stored more than once in a partition: its copies as (offset, ingested_at µs).
#[derive(Debug, Row, Deserialize)]
struct CopiesRow {
    copies: Vec<(u64, i64)>,
}

/// Facts after the last seal are not in the chain yet, but each must still agree with
/// itself and with how ingest writes: its `content_hash` is the SHA-256 of its payload's
/// canonical JSON, its `id` the payload's identity, its `ts` the payload's time (else its
/// `emitted_at`), every column derived from the payload equals what
/// [`weft_store::typed_columns`] derives (the function ingest writes them with) and every
/// MATERIALIZED column its expression over the payload ([`disagreements`]), no two facts
/// share an offset (a Kafka record holds
/// one), and no fact repeats another of its partition (same identity, content and request id) ingested
/// less than `copy_window_secs` apart (ingest's dedup cache drops such copies: the window is
/// half of ingest's `dedup_window_secs`, the least its two-generation cache is sure to
/// remember). This names a row altered after the last seal (an ALTER UPDATE of a column, or
/// of the payload without its hash) and a forged row that copies another under a new id, at
/// a taken offset, or at a free one with an `ingested_at` near the original's. A forgery of
/// a *new* event, consistent in every column at a free offset, still passes as `unsealed`
/// (so does a copy whose `ingested_at` was moved a window away): only the broker's record
/// at that offset can refute it.
///
/// `expect`: how many facts the span holds, when the caller knows; a span read from its
/// parts ([`Span::parts`]) that yields another number (a part merged away meanwhile) is read
/// again from every part. The copy lookup always reads every part: it is one query, whose
/// count of the span's facts could not be checked.
pub(super) async fn unsealed_problems(
    store: &Store,
    mut span: Span<'_>,
    expect: Option<usize>,
    copy_window_secs: u64,
) -> Result<Vec<(&'static str, Unsealed, String)>, AuditError> {
    let t = std::time::Instant::now();
    let (after, upto) = (span.after, span.upto);
    let mut rows: Vec<Unsealed> = span.rows(store, &UNSEALED_SQL).await?;
    let from_parts = !std::mem::take(&mut span.parts).is_empty();
    if from_parts && expect.is_some_and(|n| n != rows.len()) {
        rows = span.rows(store, &UNSEALED_SQL).await?;
    }
    let read_unsealed = t.elapsed();
    let window_micros = copy_window_secs.saturating_mul(1_000_000);
    let copies = span
        .query(store, COPIES_SQL)
        .param("w", window_micros)
        .fetch_all::<CopiesRow>()
        .await
        .map_err(ch_err(store))?;
    // Unsealed offset -> an earlier offset holding the same fact, ingested within the window.
    let mut repeats: BTreeMap<u64, u64> = BTreeMap::new();
    for CopiesRow { copies } in copies {
        for (j, &(offset, at)) in copies.iter().enumerate() {
            let unsealed = i128::from(offset) > i128::from(after) && offset <= upto;
            let near = copies[..j]
                .iter()
                .find(|(_, earlier)| at.abs_diff(*earlier) < window_micros);
            if let (true, Some(&(original, _))) = (unsealed, near) {
                repeats.insert(offset, original);
            }
        }
    }
    let read_copies = t.elapsed() - read_unsealed;
    let t = std::time::Instant::now();
    let mut per_offset: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &rows {
        *per_offset.entry(r.offset).or_default() += 1;
    }
    let mut out = Vec::new();
    for r in rows {
        let wrong = disagreements(&r);
        let shared = per_offset.get(&r.offset).copied().unwrap_or(0);
        let repeated = repeats.get(&r.offset);
        if !wrong.is_empty() {
            let d = format!(
                "unsealed {}:{} at offset {} does not match itself: {}",
                r.kind,
                r.id,
                r.offset,
                wrong.join("; ")
            );
            out.push(("altered", r, d));
        } else if shared > 1 {
            let d = format!(
                "unsealed {}:{} shares offset {} with {} other fact(s); a Kafka record holds one",
                r.kind,
                r.id,
                r.offset,
                shared - 1
            );
            out.push(("inserted", r, d));
        } else if let Some(original) = repeated {
            let d = format!(
                "unsealed {}:{} at offset {} is the same fact (identity, content and request id) as offset \
                 {original}, ingested less than {} h apart: ingest stores it once, so one of the \
                 two was written behind its back",
                r.kind,
                r.id,
                r.offset,
                copy_window_secs / 3600
            );
            out.push(("inserted", r, d));
        }
    }
    tracing::debug!(
        read_unsealed_ms = read_unsealed.as_millis() as u64,
        read_copies_ms = read_copies.as_millis() as u64,
        check_rows_ms = t.elapsed().as_millis() as u64,
        "unsealed check of one partition"
    );
    Ok(out)
}

/// What in an unsealed row disagrees with its own payload, one phrase per column: the content
/// hash, the identity, the event time, every column [`weft_store::typed_columns`] derives,
/// and the MATERIALIZED columns (evaluated again by ClickHouse, [`UNSEALED_SQL`]). Columns
/// from the envelope's headers (tenant, request id, producer id, sequence, emitted time) and
/// ingest's own (topic, partition, offset, ingested_at, conflict, content type) have nothing
/// in the payload to agree with.
fn disagreements(r: &Unsealed) -> Vec<String> {
    let mut wrong = Vec::new();
    let v = match serde_json::from_str::<serde_json::Value>(&r.payload) {
        Ok(v) => v,
        Err(e) => return vec![format!("payload is not JSON ({e})")],
    };
    let mut canon = Vec::new();
    let hash = weft_schemas::identity::write_canonical(&v, &mut canon)
        .map(|()| hex::encode(Sha256::digest(&canon)));
    if hash.as_deref().ok() != Some(r.content_hash.as_str()) {
        wrong.push("content_hash is not its payload's".into());
    }
    let Ok(kind) = r.kind.parse::<weft_schemas::Kind>() else {
        wrong.push(format!(
            "kind `{}` is not a weft kind",
            crate::short(&r.kind)
        ));
        return wrong;
    };
    let ident = weft_schemas::identity::identity(kind, &v).ok();
    if ident.as_deref() != Some(r.id.as_str()) {
        wrong.push(format!(
            "id is not its payload's identity ({})",
            ident.as_deref().unwrap_or("none")
        ));
    }
    let ts = v
        .get(kind.time_field())
        .and_then(serde_json::Value::as_str)
        .and_then(weft_schemas::time::parse_micros)
        .unwrap_or(r.emitted_at);
    if ts != r.ts {
        wrong.push("ts is not its payload's time".into());
    }
    let links = weft_schemas::links::extract(kind, &v);
    match serde_json::from_str::<serde_json::Value>(&r.typed) {
        Ok(stored) => {
            for col in weft_store::typed_columns(kind, &v, &links).differences(&stored) {
                wrong.push(format!("{col} is not its payload's"));
            }
        }
        Err(e) => wrong.push(format!("typed columns unreadable ({e})")),
    }
    for col in &r.materialized_wrong {
        wrong.push(format!("{col} is not its payload's (MATERIALIZED)"));
    }
    wrong
}
