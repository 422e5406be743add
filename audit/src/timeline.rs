//! A request's narrative timeline: the ingest's narratives (`weft_store::narrative`),
//! read for one tenant only, so an id guessed across tenants finds nothing.
//!
//! The API's reads are bounded in members and in payload bytes ([`get_within`]): the sizes
//! of the members' payloads are asked first, and only the members that fit are read.

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use weft_store::narrative::query::{self, Narrative};

use crate::{ch_err, AuditError, Store};

/// The most payload bytes one API timeline or bundle holds: the search page's budget
/// ([`crate::search::PAGE_MAX_BYTES`]). 10,000 members of events up to 1 MB each would
/// otherwise be one answer of gigabytes.
pub const API_MAX_PAYLOAD_BYTES: u64 = crate::search::PAGE_MAX_BYTES as u64;

/// The narrative holding `id` (a request id or any member's id) for `tenant`, with at most
/// `max_members` of its members (the first in time; [`Narrative::members_total`] counts all).
pub async fn get(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
) -> Result<Narrative, AuditError> {
    check_id(id)?;
    query::lookup_at_most(store, tenant, id, max_members)
        .await?
        .ok_or_else(|| not_found(id))
}

fn check_id(id: &str) -> Result<(), AuditError> {
    if id.is_empty() || id.len() > 1024 {
        return Err(AuditError::BadRequest("id must be 1..=1024 bytes".into()));
    }
    Ok(())
}

fn not_found(id: &str) -> AuditError {
    AuditError::NotFound(format!("no narrative contains `{}`", crate::short(id)))
}

/// Why a bounded timeline holds fewer members than its narrative has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cut {
    /// The member cap.
    Members,
    /// The payload byte budget: the next member's payload would have passed it.
    PayloadBytes,
}

/// A timeline bounded in members and payload bytes: the narrative (its first members in
/// time), and what cut it, if anything did.
#[derive(Debug, Clone, Serialize)]
pub struct Bounded {
    /// The narrative, with the members that fit.
    #[serde(flatten)]
    pub narrative: Narrative,
    /// `None` when every member is there.
    pub truncated_by: Option<Cut>,
}

/// The live members of a narrative in timeline order: each one's stored payload size, and
/// how many there are in all.
#[derive(Debug, Row, Deserialize)]
struct Size {
    bytes: u64,
    total: u64,
}

/// The payload sizes of the first `max` members of narrative `nid`, in the order
/// `weft_store`'s lookup gives them (`argMax(ts, version), kind, id, content_hash`), each
/// with the count of every live member. Only numbers leave ClickHouse.
async fn sizes(store: &Store, tenant: &str, nid: &str, max: u64) -> Result<Vec<Size>, AuditError> {
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
        .map_err(ch_err(store))
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

/// Which narrative holds `id`, and how much of it fits in `max_members` and `max_bytes` of
/// payload: the payload sizes are asked, not the payloads.
pub async fn plan(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
    max_bytes: u64,
) -> Result<Plan, AuditError> {
    check_id(id)?;
    let nid = query::resolve(store, tenant, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let sizes = sizes(store, tenant, &nid, max_members).await?;
    let (fit, _) = fitting(&sizes, max_bytes);
    Ok(Plan {
        members_total: sizes.first().map_or(0, |s| s.total),
        fit,
        bytes: sizes.iter().fold(0u64, |a, s| a.saturating_add(s.bytes)),
        capped: sizes.len() as u64,
        narrative_id: nid,
    })
}

/// [`get`], bounded in payload bytes too: the first members in time, as many as fit in
/// `max_members` and `max_bytes` of payload (the first member alone over `max_bytes` is
/// [`AuditError::TooLarge`]). The sizes are read first ([`plan`]), and only the members
/// that fit are read with their payloads, so neither ClickHouse nor this process holds
/// more. A member stored between the two reads, earlier in time than the last one that
/// fit, can push the answer past the budget by its own size.
pub async fn get_within(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
    max_bytes: u64,
) -> Result<Bounded, AuditError> {
    let p = plan(store, tenant, id, max_members, max_bytes).await?;
    if p.fit == 0 && p.capped > 0 {
        return Err(AuditError::TooLarge(format!(
            "the first member of narrative {} alone holds more than the limit of {max_bytes} \
             bytes of payload of one answer: read it with the `weft audit` CLI",
            crate::short(&p.narrative_id),
        )));
    }
    let n = query::lookup_at_most(store, tenant, &p.narrative_id, p.fit.max(1))
        .await?
        .ok_or_else(|| not_found(id))?;
    let given = n.entries.len() as u64;
    let truncated_by = if given < n.members_total {
        Some(p.cut().unwrap_or(Cut::Members))
    } else {
        None
    };
    Ok(Bounded {
        narrative: n,
        truncated_by,
    })
}

/// The timeline as terminal text: one line per event, then the links (the one rendering,
/// shared with `weft narrative`).
pub fn render_text(n: &Narrative) -> String {
    n.to_text()
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
