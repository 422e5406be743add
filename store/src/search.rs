//! Event search over `weft_events` (the audit's `weft audit search`): the row a hit is, its
//! query and its CSV header. Results are ordered by `(ts, kind, id, content_hash,
//! request_id, offset)`, the keyset the audit's cursor resumes after: the copies of one
//! event stored under several request ids share the first four, and the last two tell every
//! stored row apart (copies of a record meet in one partition).

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use weft_schemas::Kind;

use crate::events::{typed_columns, TypedColumns};

/// One event of a search result. Its payload-derived columns (`event_type` … `decision_id`)
/// are not fetched again: [`Hit::typed`] derives them from the payload as ingest did.
#[derive(Debug, Clone, PartialEq, Row, Serialize, Deserialize)]
pub struct Hit {
    /// Event time, microseconds since the epoch.
    pub ts: i64,
    /// Event kind.
    pub kind: String,
    /// The event's identity.
    pub id: String,
    /// SHA-256 of the canonical payload, lowercase hex; tells conflicting versions apart.
    pub content_hash: String,
    /// Request id, empty when none.
    pub request_id: String,
    /// 1 when the identity was stored before with different content.
    pub conflict: u8,
    /// The producer's payload JSON text, as stored.
    pub payload: String,
    /// The Kafka offset the fact was read at (the keyset's last part).
    pub offset: u64,
}

impl Hit {
    /// Call `f` with the parsed payload (the text as a JSON string if it does not parse) and
    /// the hit's payload-derived columns, by [`typed_columns`] (the derivation ingest wrote
    /// them with; `verify` flags a row whose stored columns differ).
    pub fn typed<R>(&self, f: impl FnOnce(&Value, &TypedColumns<'_>) -> R) -> R {
        let payload = serde_json::from_str(&self.payload)
            .unwrap_or_else(|_| Value::String(self.payload.clone()));
        match self.kind.parse::<Kind>() {
            Ok(kind) if payload.is_object() => {
                let links = weft_schemas::links::extract(kind, &payload);
                f(&payload, &typed_columns(kind, &payload, &links))
            }
            _ => f(&payload, &TypedColumns::default()),
        }
    }
}

/// One page of hits of one tenant. Parameters: `{t}`, `{from}`/`{to}` (micros), one per
/// filter (empty matches any), the cursor (`{has_cursor}`, `{cts}`, `{ckind}`, `{cid}`,
/// `{chash}`, `{creq}`, `{coff}`) and `{limit}`.
pub const SQL: &str = "
SELECT toUnixTimestamp64Micro(ts) AS ts, kind, id, lower(hex(content_hash)) AS content_hash,
       request_id, conflict, payload, offset
FROM weft_events
WHERE tenant = {t:String}
  AND ts >= fromUnixTimestamp64Micro({from:Int64}, 'UTC') AND ts < fromUnixTimestamp64Micro({to:Int64}, 'UTC')
  AND ({kind:String} = '' OR kind = {kind:String})
  AND ({principal:String} = '' OR principal = {principal:String})
  AND ({capability:String} = '' OR capability_id = {capability:String})
  AND ({event_type:String} = '' OR event_type = {event_type:String})
  AND ({decision:String} = '' OR decision = {decision:String})
  AND ({outcome:String} = '' OR outcome = {outcome:String})
  AND ({token:String} = '' OR token_id = {token:String})
  AND ({request:String} = '' OR request_id = {request:String})
  AND ({has_cursor:UInt8} = 0
       OR (toUnixTimestamp64Micro(ts), kind, id, lower(hex(content_hash)), request_id, offset)
          > ({cts:Int64}, {ckind:String}, {cid:String}, {chash:String}, {creq:String}, {coff:UInt64}))
ORDER BY ts, kind, id, content_hash, request_id, offset
LIMIT {limit:UInt64}
";

/// The CSV header of a hit: its columns and its payload-derived columns, but the payload
/// (left out of CSV), in order.
pub const CSV_HEADER: &str =
    "ts,kind,id,content_hash,request_id,event_type,principal,capability_id,decision,outcome,token_id,decision_id,conflict";

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The select list of `sql`, by output name (the alias, else the column).
    pub(crate) fn selected(sql: &str) -> Vec<String> {
        let body = sql.split("SELECT").nth(1).unwrap_or_default();
        let body = body.split("FROM").next().unwrap_or_default();
        let mut out = Vec::new();
        let (mut depth, mut cur) = (0, String::new());
        for c in body.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        out.push(cur);
        out.iter()
            .map(|e| e.split_whitespace().last().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn sql_and_csv_header_follow_the_hit() {
        assert_eq!(selected(SQL), Hit::COLUMN_NAMES);
        let h = Hit {
            ts: 1,
            kind: "policy_decision".into(),
            id: "pd-1".into(),
            content_hash: "00".into(),
            request_id: "r".into(),
            conflict: 0,
            payload: r#"{"decision_id":"pd-1","principal":"p","capability_id":"c"}"#.into(),
            offset: 7,
        };
        let typed = h.typed(|_, t| serde_json::to_value(t).unwrap());
        assert_eq!(typed["decision_id"], "pd-1");
        assert_eq!(typed["principal"], "p");
        // Every CSV column is a hit column or a derived one.
        for c in CSV_HEADER.split(',') {
            assert!(
                Hit::COLUMN_NAMES.contains(&c) || typed.get(c).is_some(),
                "{c} is neither a hit column nor derived"
            );
        }
    }
}
