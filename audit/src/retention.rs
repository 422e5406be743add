//! Retention: audit facts have no TTL. A tenant may be given a retention in days, applied
//! on demand (`weft audit retention apply`), and a legal hold that blocks every deletion.
//!
//! Applying retention records `pruned_before` *before* deleting, so the hash chain's
//! verification can tell rows removed by retention from rows deleted behind weft's back.

use clickhouse::Row;
use serde::{Deserialize, Serialize};

use crate::{ch_err, AuditError, Store};
use weft_store::{FloorRow, INGEST_FLOOR};

/// A tenant's retention settings. The default keeps everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Row, Serialize, Deserialize)]
pub struct Retention {
    /// Keep facts this many days (by event time); 0 = forever.
    pub days: u32,
    /// While set, nothing of the tenant is deleted.
    pub legal_hold: u8,
    /// Facts before this time (µs) were removed by retention.
    pub pruned_before: i64,
}

#[derive(Debug, Row, Serialize)]
struct RetentionRow<'a> {
    tenant: &'a str,
    days: u32,
    legal_hold: u8,
    pruned_before: i64,
    version: u64,
    updated_at: i64,
}

/// The tenant's current settings (the latest row).
pub async fn get(store: &Store, tenant: &str) -> Result<Retention, AuditError> {
    let rows: Vec<Retention> = store
        .client()
        .query(
            "SELECT argMax(days, version) AS days, argMax(legal_hold, version) AS legal_hold, \
                    toUnixTimestamp64Micro(argMax(pruned_before, version)) AS pruned_before \
             FROM weft_audit_retention WHERE tenant = {t:String} GROUP BY tenant",
        )
        .param("t", tenant)
        .fetch_all()
        .await
        .map_err(ch_err(store))?;
    Ok(rows.into_iter().next().unwrap_or_default())
}

async fn put(store: &Store, tenant: &str, r: &Retention) -> Result<(), AuditError> {
    let now = chrono::Utc::now().timestamp_micros();
    let mut ins = store
        .client()
        .insert::<RetentionRow>("weft_audit_retention")
        .await
        .map_err(ch_err(store))?;
    ins.write(&RetentionRow {
        tenant,
        days: r.days,
        legal_hold: r.legal_hold,
        pruned_before: r.pruned_before,
        version: now as u64,
        updated_at: now,
    })
    .await
    .map_err(ch_err(store))?;
    ins.end().await.map_err(ch_err(store))
}

/// Set the retention in days (0 = keep forever).
pub async fn set_days(store: &Store, tenant: &str, days: u32) -> Result<Retention, AuditError> {
    let mut r = get(store, tenant).await?;
    r.days = days;
    put(store, tenant, &r).await?;
    Ok(r)
}

/// Place or lift the legal hold.
pub async fn set_hold(store: &Store, tenant: &str, hold: bool) -> Result<Retention, AuditError> {
    let mut r = get(store, tenant).await?;
    r.legal_hold = u8::from(hold);
    put(store, tenant, &r).await?;
    Ok(r)
}

/// The rows [`apply`] deletes: the tenant's facts before the cutoff (`{c}`) at or below their
/// partition's recorded floor (`{keys}` `topic/partition`, `{offsets}`); a partition without
/// a record keeps every row.
const COVERED: &str = "tenant = {t:String} AND ts < fromUnixTimestamp64Micro({c:Int64}, 'UTC') \
    AND indexOf({keys:Array(String)}, concat(topic, '/', toString(partition))) > 0 \
    AND offset <= arrayElement({offsets:Array(UInt64)}, \
          indexOf({keys:Array(String)}, concat(topic, '/', toString(partition))))";

/// What [`apply`] removed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Applied {
    /// Facts with an event time before this (µs) are gone.
    pub cutoff: i64,
    /// How many facts were deleted (those before the cutoff stored when it began).
    pub deleted: u64,
}

/// What an apply will delete, read before anything is written: the cutoff, and each source
/// partition's highest stored offset (its *floor*). [`Plan::execute`] deletes only the
/// tenant's facts before the cutoff at or below their partition's floor, so a fact stored
/// between the two steps, at a higher offset, stays until the next apply: the floor it
/// records then covers every row it deletes, and ingest's resume point never moves back.
#[derive(Debug)]
pub struct Plan {
    /// The tenant the plan is for.
    pub tenant: String,
    /// Facts with an event time before this (µs) go.
    pub cutoff: i64,
    /// How many facts the plan covers now.
    pub facts: u64,
    /// The retention (days) the cutoff was computed from; [`Plan::execute`] refuses if it
    /// has changed since.
    days: u32,
    floor: Vec<FloorRow>,
}

/// The plan of an apply for `tenant`, without writing anything: `Ok(None)` when its retention
/// is "forever", [`AuditError::Refused`] while it is on legal hold.
pub async fn plan(store: &Store, tenant: &str) -> Result<Option<Plan>, AuditError> {
    let r = get(store, tenant).await?;
    if r.legal_hold == 1 {
        return Err(AuditError::Refused(format!(
            "tenant {tenant} is on legal hold: nothing is deleted"
        )));
    }
    if r.days == 0 {
        return Ok(None);
    }
    let cutoff = chrono::Utc::now().timestamp_micros() - i64::from(r.days) * 86_400_000_000;
    let floor: Vec<FloorRow> = store
        .client()
        .query("SELECT topic, partition, max(offset) AS offset FROM weft_events GROUP BY topic, partition")
        .fetch_all()
        .await
        .map_err(ch_err(store))?;
    let mut plan = Plan {
        tenant: tenant.to_owned(),
        cutoff,
        facts: 0,
        days: r.days,
        floor,
    };
    plan.facts = plan
        .covered(store, "SELECT count() FROM weft_events")
        .fetch_one()
        .await
        .map_err(ch_err(store))?;
    Ok(Some(plan))
}

/// Delete the tenant's facts older than its retention, unless on legal hold: [`plan`], then
/// [`Plan::execute`]. `Ok(None)` when the retention is "forever".
pub async fn apply(store: &Store, tenant: &str) -> Result<Option<Applied>, AuditError> {
    match plan(store, tenant).await? {
        Some(plan) => plan.execute(store).await.map(Some),
        None => Ok(None),
    }
}

impl Plan {
    /// `sql` over the rows this plan covers.
    fn covered(&self, store: &Store, sql: &str) -> clickhouse::query::Query {
        let keys: Vec<String> = self
            .floor
            .iter()
            .map(|f| format!("{}/{}", f.topic, f.partition))
            .collect();
        let offsets: Vec<u64> = self.floor.iter().map(|f| f.offset).collect();
        store
            .client()
            .query(&format!("{sql} WHERE {COVERED}"))
            .param("t", &self.tenant)
            .param("c", self.cutoff)
            .param("offsets", offsets)
            .param("keys", keys)
    }

    /// Record `pruned_before` (chain verification reads it), then the floor in
    /// `weft_ingest_floor` (migration 0015: deleting a partition's newest rows cannot move
    /// ingest's resume point back), then delete the rows the plan covers. A legal hold
    /// placed since the plan, or a retention changed since, wins: nothing is deleted.
    pub async fn execute(self, store: &Store) -> Result<Applied, AuditError> {
        let tenant = self.tenant.as_str();
        let unchanged = || async {
            let r = get(store, tenant).await?;
            if r.legal_hold == 1 {
                return Err(AuditError::Refused(format!(
                    "tenant {tenant} was put on legal hold"
                )));
            }
            if r.days != self.days {
                return Err(AuditError::Refused(format!(
                    "tenant {tenant}'s retention changed from {} to {} days since the plan: \
                     apply again",
                    self.days, r.days
                )));
            }
            Ok(r)
        };
        let mut r = unchanged().await?;
        r.pruned_before = r.pruned_before.max(self.cutoff);
        put(store, tenant, &r).await?;
        let mut deleted = 0;
        if self.facts > 0 {
            // Re-checked right before deleting: a hold placed meanwhile wins.
            unchanged().await?;
            weft_store::insert::<FloorRow>(store, INGEST_FLOOR, &self.floor).await?;
            deleted = self
                .covered(store, "SELECT count() FROM weft_events")
                .fetch_one()
                .await
                .map_err(ch_err(store))?;
            self.covered(store, "DELETE FROM weft_events")
                .with_setting("mutations_sync", "2")
                .execute()
                .await
                .map_err(ch_err(store))?;
        }
        Ok(Applied {
            cutoff: self.cutoff,
            deleted,
        })
    }
}
