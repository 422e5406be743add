//! Event search: by principal, capability, event type, decision, outcome, token, kind and
//! time range, for one tenant, with keyset pagination.
//!
//! Results are ordered by `(ts, kind, id, content_hash, request_id, offset)`; the cursor is
//! the last row's key,
//! so a page is one range read whatever the depth (no OFFSET), and pages stay stable while
//! new events arrive later in time. Empty filters match everything. The row, its query and
//! the CSV header are `weft_store::search`.

use serde::{Deserialize, Serialize};
use weft_store::search::SQL;
pub use weft_store::search::{Hit, CSV_HEADER};

use crate::{ch_err, AuditError, Range, Store};

/// The largest page a caller may ask for.
pub const MAX_LIMIT: u64 = 10_000;
/// A page ends early, with a cursor, once its hits hold this many bytes of payload (10,000
/// hits of events up to 1 MB each would otherwise be one answer of gigabytes): the budget of
/// every API answer, narratives' too.
pub const PAGE_MAX_BYTES: usize = weft_store::narrative::bounded::API_MAX_PAYLOAD_BYTES as usize;

/// What to search for. Every filter is an exact match; empty means "any".
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Filter {
    /// Event kind, e.g. `policy_decision`.
    pub kind: String,
    /// Who acted (`principal`).
    pub principal: String,
    /// Capability id.
    pub capability: String,
    /// Payload `event_type`.
    pub event_type: String,
    /// `allow` or `deny` (PolicyDecisions).
    pub decision: String,
    /// `success`, `failure`, `partial`, ...
    pub outcome: String,
    /// Capability token id.
    pub token: String,
    /// Request id.
    pub request: String,
}

impl Filter {
    /// Every filter with its name as the API and the CLI spell it.
    pub fn fields(&self) -> [(&'static str, &String); 8] {
        [
            ("kind", &self.kind),
            ("principal", &self.principal),
            ("capability", &self.capability),
            ("event_type", &self.event_type),
            ("decision", &self.decision),
            ("outcome", &self.outcome),
            ("token", &self.token),
            ("request", &self.request),
        ]
    }
}

/// One page of results and the cursor of the next page (`None` at the end).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Page {
    /// Matching events in (ts, kind, id, content_hash, request_id, offset) order.
    pub hits: Vec<Hit>,
    /// Pass back as `cursor` to get the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// The key of the last row of a page, hex-encoded JSON
/// `[ts, kind, id, content_hash, request_id, offset]`.
fn encode_cursor(h: &Hit) -> String {
    let key = serde_json::json!([h.ts, h.kind, h.id, h.content_hash, h.request_id, h.offset]);
    hex::encode(key.to_string())
}

/// The longest cursor [`encode_cursor`] can write: hex (2 characters a byte) of JSON whose
/// id and request id are at most `MAX_ID_BYTES` bytes each, each byte escaped to at most 6
/// (`\u001f`), with room for the time, the kind, the hash and the offset.
pub const MAX_CURSOR_BYTES: usize = 2 * (12 * weft_schemas::identity::MAX_ID_BYTES + 256);

/// A cursor's key: the last hit's (ts, kind, id, content_hash, request_id, offset).
type Key = (i64, String, String, String, String, u64);

fn decode_cursor(c: &str) -> Result<Key, AuditError> {
    let bad = || AuditError::BadRequest("malformed cursor".into());
    if c.len() > MAX_CURSOR_BYTES {
        return Err(bad());
    }
    let bytes = hex::decode(c).map_err(|_| bad())?;
    serde_json::from_slice(&bytes).map_err(|_| bad())
}

/// One page of events of `tenant` in `range` matching `filter`, after `cursor`.
pub async fn page(
    store: &Store,
    tenant: &str,
    range: Range,
    filter: &Filter,
    cursor: Option<&str>,
    limit: u64,
) -> Result<Page, AuditError> {
    if limit == 0 || limit > MAX_LIMIT {
        return Err(AuditError::BadRequest(format!(
            "limit must be 1..={MAX_LIMIT}"
        )));
    }
    for (name, v) in filter.fields() {
        if v.len() > 1024 {
            return Err(AuditError::BadRequest(format!(
                "{name} is longer than 1024 bytes"
            )));
        }
    }
    let (has, (cts, ckind, cid, chash, creq, coff)) = match cursor.filter(|c| !c.is_empty()) {
        Some(c) => (1u8, decode_cursor(c)?),
        None => (0u8, Key::default()),
    };
    let mut rows = store
        .client()
        .query(SQL)
        .param("t", tenant)
        .param("from", range.from)
        .param("to", range.to)
        .param("kind", &filter.kind)
        .param("principal", &filter.principal)
        .param("capability", &filter.capability)
        .param("event_type", &filter.event_type)
        .param("decision", &filter.decision)
        .param("outcome", &filter.outcome)
        .param("token", &filter.token)
        .param("request", &filter.request)
        .param("has_cursor", has)
        .param("cts", cts)
        .param("ckind", &ckind)
        .param("cid", &cid)
        .param("chash", &chash)
        .param("creq", &creq)
        .param("coff", coff)
        .param("limit", limit)
        .fetch::<Hit>()
        .map_err(ch_err(store))?;
    // Read as they come, up to the byte budget: a page cut short says so with its cursor.
    let (mut hits, mut bytes, mut cut) = (Vec::new(), 0usize, false);
    while let Some(h) = rows.next().await.map_err(ch_err(store))? {
        bytes += h.payload.len();
        hits.push(h);
        if bytes >= PAGE_MAX_BYTES && (hits.len() as u64) < limit {
            cut = true;
            break;
        }
    }
    let next_cursor = if cut || hits.len() as u64 == limit {
        hits.last().map(encode_cursor)
    } else {
        None
    };
    Ok(Page { hits, next_cursor })
}

fn csv_field(s: &str) -> String {
    // Quote always; a leading =,+,-,@ is prefixed with ' so spreadsheets do not run it.
    let s = if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}")
    } else {
        s.to_owned()
    };
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// One hit as a CSV line under [`CSV_HEADER`] (RFC 4180 quoting, formula-injection safe).
pub fn csv_line(h: &Hit) -> String {
    h.typed(|_, t| {
        let ts = weft_schemas::time::micros_to_rfc3339(h.ts);
        let conflict = h.conflict.to_string();
        let cols: [&str; 13] = [
            &ts,
            &h.kind,
            &h.id,
            &h.content_hash,
            &h.request_id,
            &t.event_type,
            &t.principal,
            &t.capability_id,
            &t.decision,
            &t.outcome,
            &t.token_id,
            &t.decision_id,
            &conflict,
        ];
        cols.iter()
            .map(|s| csv_field(s))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// One hit as a JSON line: the columns, the time as RFC 3339, the payload as JSON.
pub fn json_line(h: &Hit) -> serde_json::Value {
    h.typed(|payload, t| {
        serde_json::json!({
            "ts": weft_schemas::time::micros_to_rfc3339(h.ts),
            "kind": h.kind, "id": h.id, "content_hash": h.content_hash,
            "request_id": h.request_id, "event_type": t.event_type, "principal": t.principal,
            "capability_id": t.capability_id, "decision": t.decision, "outcome": t.outcome,
            "token_id": t.token_id, "decision_id": t.decision_id, "conflict": h.conflict == 1,
            "payload": payload,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let h = Hit {
            ts: 42,
            kind: "frame".into(),
            id: "a\"b'c ✓".into(),
            content_hash: "00ff".into(),
            request_id: String::new(),
            conflict: 0,
            payload: "{}".into(),
            offset: 9,
        };
        let c = encode_cursor(&h);
        assert_eq!(
            decode_cursor(&c).unwrap(),
            (
                42,
                "frame".into(),
                "a\"b'c ✓".into(),
                "00ff".into(),
                String::new(),
                9
            )
        );
        assert!(decode_cursor("zz").is_err());
        assert!(decode_cursor(&hex::encode("[1,2]")).is_err());
        // The longest id, all of it escaped, still makes a cursor the next page takes.
        let longest = Hit {
            id: "\u{1f}".repeat(weft_schemas::identity::MAX_ID_BYTES),
            request_id: "\u{1f}".repeat(weft_schemas::identity::MAX_ID_BYTES),
            offset: u64::MAX,
            content_hash: "0".repeat(64),
            kind: "execution_routing_decision".into(),
            ts: i64::MIN,
            ..h
        };
        let c = encode_cursor(&longest);
        assert!(c.len() <= MAX_CURSOR_BYTES, "{}", c.len());
        assert_eq!(decode_cursor(&c).unwrap().2, longest.id);
    }

    #[test]
    fn csv_quotes_and_defuses_formulas() {
        assert_eq!(csv_field("a\"b"), "\"a\"\"b\"");
        assert_eq!(csv_field("=cmd()"), "\"'=cmd()\"");
    }
}
