//! A narrative read bounded in payload bytes as well as members: what the HTTP APIs answer
//! (`GET /v1/narratives/{id}`, the audit timeline) and what a bundle checks before it reads.
//!
//! The sizes of the members' payloads are asked first (only numbers leave ClickHouse), and
//! only the members that fit are read with their payloads, so neither ClickHouse nor this
//! process holds more: 10,000 members of events up to 1 MB each would otherwise be one
//! answer of gigabytes.

use clickhouse::Row;
use serde::{Deserialize, Serialize};

use super::query::{self, Narrative};
use crate::{Store, StoreError};

/// The most payload bytes one API answer holds (the audit search page's budget).
pub const API_MAX_PAYLOAD_BYTES: u64 = 16 << 20;

/// Why a bounded read holds fewer members than its narrative has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cut {
    /// The member cap.
    Members,
    /// The payload byte budget: the next member's payload would have passed it.
    PayloadBytes,
}

/// A narrative bounded in members and payload bytes: its first members in time, and what
/// cut it, if anything did.
#[derive(Debug, Clone, Serialize)]
pub struct Bounded {
    /// The narrative, with the members that fit.
    #[serde(flatten)]
    pub narrative: Narrative,
    /// `None` when every member is there.
    pub truncated_by: Option<Cut>,
}

/// What a bounded read of a narrative would hold, known before any payload is read.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The narrative's id.
    pub narrative_id: String,
    /// Its live members.
    pub members_total: u64,
    /// How many of its first members (at most the member cap) fit in the byte budget.
    pub fit: u64,
    /// The payload bytes of its first members up to the member cap, fitting or not.
    pub bytes: u64,
    /// How many members the member cap leaves (at most the cap).
    pub capped: u64,
}

impl Plan {
    /// What would cut a read of the narrative under the plan's bounds, if anything.
    pub fn cut(&self) -> Option<Cut> {
        if self.fit < self.capped {
            Some(Cut::PayloadBytes)
        } else if self.capped < self.members_total {
            Some(Cut::Members)
        } else {
            None
        }
    }
}

/// The outcome of [`lookup_within`] for a narrative that exists.
#[derive(Debug, Clone)]
pub enum Within {
    /// Its first members, as many as fit.
    Read(Bounded),
    /// Its first member alone holds more payload than the budget.
    FirstTooLarge(Plan),
}

/// A live member's stored payload size, and how many live members there are in all.
#[derive(Debug, Row, Deserialize)]
struct Size {
    bytes: u64,
    total: u64,
}

/// The payload sizes of the first `max` members of narrative `nid`, in the order the lookup
/// gives them (`argMax(ts, version), kind, id, content_hash`), each with the count of every
/// live member.
async fn sizes(store: &Store, tenant: &str, nid: &str, max: u64) -> Result<Vec<Size>, StoreError> {
    const SQL: &str = "SELECT argMax(length(payload), version) AS bytes, count() OVER () AS total \
        FROM weft_narratives WHERE tenant = {t:String} AND narrative_id = {n:String} \
        GROUP BY kind, id, content_hash HAVING argMax(is_deleted, version) = 0 \
        ORDER BY argMax(ts, version), kind, id, content_hash LIMIT {max:UInt64}";
    store
        .client()
        .query(SQL)
        .param("t", tenant)
        .param("n", nid)
        .param("max", max)
        .fetch_all::<Size>()
        .await
        .map_err(store.err())
}

/// How many of the first members fit in `max_bytes`, and their bytes.
fn fitting(sizes: &[Size], max_bytes: u64) -> (u64, u64) {
    let (mut n, mut bytes) = (0u64, 0u64);
    for s in sizes {
        match bytes.checked_add(s.bytes) {
            Some(b) if b <= max_bytes => {
                bytes = b;
                n += 1;
            }
            _ => break,
        }
    }
    (n, bytes)
}

/// Which narrative of `tenant` holds `id`, and how much of it fits in `max_members` and
/// `max_bytes` of payload. `None` when the id is unknown there.
pub async fn plan(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
    max_bytes: u64,
) -> Result<Option<Plan>, StoreError> {
    let Some(nid) = query::resolve(store, tenant, id).await? else {
        return Ok(None);
    };
    let sizes = sizes(store, tenant, &nid, max_members).await?;
    let (fit, _) = fitting(&sizes, max_bytes);
    Ok(Some(Plan {
        members_total: sizes.first().map_or(0, |s| s.total),
        fit,
        bytes: sizes.iter().fold(0u64, |a, s| a.saturating_add(s.bytes)),
        capped: sizes.len() as u64,
        narrative_id: nid,
    }))
}

/// [`query::lookup_at_most`], bounded in payload bytes too: the first members in time, as
/// many as fit in `max_members` and `max_bytes` of payload. A member stored between the
/// two reads, earlier in time than the last one that fit, can push the answer past the
/// budget by its own size. `None` when the id is unknown for `tenant`.
pub async fn lookup_within(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
    max_bytes: u64,
) -> Result<Option<Within>, StoreError> {
    let Some(p) = plan(store, tenant, id, max_members, max_bytes).await? else {
        return Ok(None);
    };
    if p.fit == 0 && p.capped > 0 {
        return Ok(Some(Within::FirstTooLarge(p)));
    }
    let Some(n) = query::lookup_at_most(store, tenant, &p.narrative_id, p.fit.max(1)).await? else {
        return Ok(None);
    };
    let truncated_by = if (n.entries.len() as u64) < n.members_total {
        Some(p.cut().unwrap_or(Cut::Members))
    } else {
        None
    };
    Ok(Some(Within::Read(Bounded {
        narrative: n,
        truncated_by,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(b: &[u64]) -> Vec<Size> {
        b.iter()
            .map(|&bytes| Size {
                bytes,
                total: b.len() as u64,
            })
            .collect()
    }

    #[test]
    fn the_members_that_fit_are_a_prefix() {
        assert_eq!(fitting(&sizes(&[5, 5, 5]), 15), (3, 15));
        assert_eq!(fitting(&sizes(&[5, 5, 5]), 14), (2, 10));
        // A small member after a large one does not jump the queue: timeline order.
        assert_eq!(fitting(&sizes(&[5, 20, 1]), 14), (1, 5));
        assert_eq!(fitting(&sizes(&[20]), 14), (0, 0));
        assert_eq!(fitting(&sizes(&[u64::MAX, 1]), u64::MAX), (1, u64::MAX));
        assert_eq!(fitting(&[], 14), (0, 0));
    }
}
