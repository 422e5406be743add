//! A request's narrative timeline: the ingest's narratives (`weft_store::narrative`),
//! read for one tenant only, so an id guessed across tenants finds nothing.
//!
//! The API's reads are bounded in members and in payload bytes ([`get_within`], over
//! `weft_store::narrative::bounded`, which the narrative API shares).

use weft_store::narrative::bounded::{self, Within};
use weft_store::narrative::query::{self, Narrative};

use crate::{AuditError, Store};

pub use weft_store::narrative::bounded::{Bounded, Cut, Plan, API_MAX_PAYLOAD_BYTES};

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

/// Which narrative holds `id`, and how much of it fits in `max_members` and `max_bytes` of
/// payload (`weft_store::narrative::bounded::plan`): the sizes are asked, not the payloads.
pub async fn plan(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
    max_bytes: u64,
) -> Result<Plan, AuditError> {
    check_id(id)?;
    bounded::plan(store, tenant, id, max_members, max_bytes)
        .await?
        .ok_or_else(|| not_found(id))
}

/// [`get`], bounded in payload bytes too (`weft_store::narrative::bounded::lookup_within`):
/// the first members in time, as many as fit in `max_members` and `max_bytes` of payload;
/// the first member alone over `max_bytes` is [`AuditError::TooLarge`].
pub async fn get_within(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
    max_bytes: u64,
) -> Result<Bounded, AuditError> {
    check_id(id)?;
    match bounded::lookup_within(store, tenant, id, max_members, max_bytes).await? {
        Some(Within::Read(b)) => Ok(b),
        Some(Within::FirstTooLarge(p)) => Err(AuditError::TooLarge(format!(
            "the first member of narrative {} alone holds more than the limit of {max_bytes} \
             bytes of payload of one answer: read it with the `weft audit` CLI",
            crate::short(&p.narrative_id),
        ))),
        None => Err(not_found(id)),
    }
}

/// The timeline as terminal text: one line per event, then the links (the one rendering,
/// shared with `weft narrative`).
pub fn render_text(n: &Narrative) -> String {
    n.to_text()
}
