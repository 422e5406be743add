//! Retention: audit facts have no TTL. A tenant may be given a retention in days, applied
//! on demand (`weft audit retention apply`), and a legal hold that blocks every deletion.
//!
//! Applying retention records `pruned_before` *before* deleting, so the hash chain's
//! verification can tell rows removed by retention from rows deleted behind weft's back.
//! The value is signed with the sealer's key ([`statement`]) when the apply is given one;
//! `weft audit verify --keyring` uses only a value whose signature verifies
//! ([`check_signature`]).

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::error;

use crate::sign::{Key, Keyring};
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
    /// The key that signed `pruned_before` ([`statement`]); empty when unsigned.
    #[serde(default)]
    pub kid: String,
    /// Ed25519 signature of [`statement`] over `pruned_before`, base64url; empty when
    /// unsigned (an apply without a key, a row written before migration 0019, or a forgery).
    #[serde(default)]
    pub sig: String,
}

/// What a signature of `pruned_before` covers: JCS of `{purpose, tenant, pruned_before}`.
/// The fixed `purpose` (and the members, which a checkpoint's statement does not have) keep
/// it from ever reading as another signed document. `pruned_before` is the decimal string of
/// its microseconds (JCS writes numbers as doubles, exact only up to 2^53).
pub fn statement(tenant: &str, pruned_before: i64) -> serde_json::Value {
    json!({
        "purpose": PURPOSE,
        "tenant": tenant,
        "pruned_before": pruned_before.to_string(),
    })
}

/// The `purpose` member of [`statement`].
pub const PURPOSE: &str = "weft.audit.retention.pruned_before.v1";

/// Whether `r.pruned_before` is signed by a key of `keyring` for `tenant` (`Ok` when there is
/// no keyring: like a checkpoint's, the signature is then not checked).
pub fn check_signature(
    keyring: Option<&Keyring>,
    tenant: &str,
    r: &Retention,
) -> Result<(), String> {
    Keyring::check(keyring, &r.kid, &statement(tenant, r.pruned_before), &r.sig)
}

#[derive(Debug, Row, Serialize)]
struct RetentionRow<'a> {
    tenant: &'a str,
    days: u32,
    legal_hold: u8,
    pruned_before: i64,
    kid: &'a str,
    sig: &'a str,
    version: u64,
    updated_at: i64,
}

/// The tenant's current settings (the latest row).
pub async fn get(store: &Store, tenant: &str) -> Result<Retention, AuditError> {
    Ok(read(store, tenant).await?.0)
}

/// The tenant's current settings and the version of the latest row (0: none yet).
async fn read(store: &Store, tenant: &str) -> Result<(Retention, u64), AuditError> {
    #[derive(Row, Deserialize)]
    struct Latest {
        days: u32,
        legal_hold: u8,
        pruned_before: i64,
        kid: String,
        sig: String,
        version: u64,
    }
    let rows: Vec<Latest> = store
        .client()
        .query(
            "SELECT argMax(days, version) AS days, argMax(legal_hold, version) AS legal_hold, \
                    toUnixTimestamp64Micro(argMax(pruned_before, version)) AS pruned_before, \
                    argMax(kid, version) AS kid, argMax(sig, version) AS sig, \
                    max(version) AS version \
             FROM weft_audit_retention WHERE tenant = {t:String} GROUP BY tenant",
        )
        .param("t", tenant)
        .fetch_all()
        .await
        .map_err(ch_err(store))?;
    Ok(rows.into_iter().next().map_or_else(Default::default, |l| {
        let r = Retention {
            days: l.days,
            legal_hold: l.legal_hold,
            pruned_before: l.pruned_before,
            kid: l.kid,
            sig: l.sig,
        };
        (r, l.version)
    }))
}

/// How far a clock may be ahead of another's (the apply's and the verify's) before
/// [`check_pruned`] calls a `pruned_before` impossible: one hour.
pub const CLOCK_SLACK_MICROS: i64 = 3_600_000_000;

/// The `pruned_before` verification may use, or why the recorded one is impossible.
///
/// Whoever can write ClickHouse can insert a row, of the highest version, whose
/// `pruned_before` makes every deletion look like pruning; without the signing key they
/// cannot sign it, which [`check_signature`] catches when verify has a keyring. This bound
/// holds whatever the signature: an apply records `now - days` with `days` at least 1, so no
/// genuine value is later than a day before now, give or take the clocks' difference
/// ([`CLOCK_SLACK_MICROS`]). A later one (in the future, say) is refused. The bound is not
/// the tenant's current retention: a retention lengthened after an apply leaves a genuine
/// `pruned_before` later than the new one allows.
pub fn check_pruned(pruned_before: i64, now_micros: i64) -> Result<i64, String> {
    if pruned_before <= 0 {
        return Ok(0);
    }
    let bound = now_micros
        .saturating_sub(86_400_000_000)
        .saturating_add(CLOCK_SLACK_MICROS);
    if pruned_before > bound {
        return Err(format!(
            "the retention table records facts pruned before {}, later than any retention (at \
             least one day) can have pruned by now: not used, so every missing sealed fact \
             counts as deleted",
            weft_schemas::time::micros_to_rfc3339(pruned_before),
        ));
    }
    Ok(pruned_before)
}

/// The version after `v`, refused at the end of the range (a row written with the highest
/// version, which no write of weft's makes, could not be superseded).
fn next_version(v: u64) -> Result<u64, AuditError> {
    v.checked_add(1).ok_or_else(|| {
        AuditError::Refused(format!(
            "the retention table holds a row of version {v}, which no later row can supersede: \
             it was not written by weft; inspect weft_audit_retention"
        ))
    })
}

/// Write `r` as a whole row. `kid` and `sig` go with `pruned_before`: a write that keeps the
/// value (`set`, `hold`) keeps its signature, which covers only the tenant and the value.
async fn write(store: &Store, tenant: &str, r: &Retention, version: u64) -> Result<(), AuditError> {
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
        kid: &r.kid,
        sig: &r.sig,
        version,
        updated_at: chrono::Utc::now().timestamp_micros(),
    })
    .await
    .map_err(ch_err(store))?;
    ins.end().await.map_err(ch_err(store))
}

/// Write `r`, read at version `read`, as the tenant's latest settings; the settings as they
/// then stand. Every write is a whole row, so a legal hold placed, or a prune recorded,
/// between the read and this write would be lost under it: when one was, it is written
/// again on top (a hold is never lifted, nor `pruned_before` lowered, by a write that did
/// not mean to; a lowered `pruned_before` makes verify report pruned facts as deleted). A
/// `pruned_before` written on top keeps its own signature (of two rows with the value, a
/// signed one's).
async fn put(
    store: &Store,
    tenant: &str,
    r: &Retention,
    read: u64,
) -> Result<Retention, AuditError> {
    let now = u64::try_from(chrono::Utc::now().timestamp_micros()).unwrap_or(0);
    let version = now.max(next_version(read)?);
    write(store, tenant, r, version).await?;
    let (held, pruned, kid, sig): (u8, i64, String, String) = store
        .client()
        .query(
            "SELECT max(legal_hold), max(pruned_before), \
                    argMax(kid, (pruned_before, sig != '')), argMax(sig, (pruned_before, sig != '')) \
             FROM weft_audit_retention \
             WHERE tenant = {t:String} AND version > {read:UInt64} AND version != {ours:UInt64}",
        )
        .param("t", tenant)
        .param("read", read)
        .param("ours", version)
        .fetch_one()
        .await
        .map_err(ch_err(store))?;
    if held <= r.legal_hold && pruned <= r.pruned_before {
        return Ok(r.clone());
    }
    let mut kept = r.clone();
    kept.legal_hold = r.legal_hold.max(held);
    if pruned > r.pruned_before {
        (kept.pruned_before, kept.kid, kept.sig) = (pruned, kid, sig);
    }
    let now = u64::try_from(chrono::Utc::now().timestamp_micros()).unwrap_or(0);
    write(store, tenant, &kept, now.max(next_version(version)?)).await?;
    Ok(kept)
}

/// The longest retention a tenant can be given, in days (100 years; 0 keeps forever). A
/// larger number would put the cutoff before the Unix epoch or, once it overflowed, after
/// every fact.
pub const MAX_DAYS: u32 = 36_500;

/// Set the retention in days (0 = keep forever, at most [`MAX_DAYS`]).
pub async fn set_days(store: &Store, tenant: &str, days: u32) -> Result<Retention, AuditError> {
    if days > MAX_DAYS {
        return Err(AuditError::Refused(format!(
            "retention of {days} days: at most {MAX_DAYS} (100 years); 0 keeps facts forever"
        )));
    }
    let (mut r, read) = self::read(store, tenant).await?;
    r.days = days;
    put(store, tenant, &r, read).await
}

/// Place or lift the legal hold.
pub async fn set_hold(store: &Store, tenant: &str, hold: bool) -> Result<Retention, AuditError> {
    let (mut r, read) = self::read(store, tenant).await?;
    r.legal_hold = u8::from(hold);
    put(store, tenant, &r, read).await
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
    // A cutoff that does not fit (days set before MAX_DAYS existed) deletes nothing.
    let Some(cutoff) = (r.days > 0 && r.days <= MAX_DAYS)
        .then(|| chrono::Utc::now().timestamp_micros() - i64::from(r.days) * 86_400_000_000)
    else {
        return Ok(None);
    };
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
/// [`Plan::execute`] (signing `pruned_before` with `key`). `Ok(None)` when the retention is
/// "forever".
pub async fn apply(
    store: &Store,
    tenant: &str,
    key: Option<&Key>,
) -> Result<Option<Applied>, AuditError> {
    match plan(store, tenant).await? {
        Some(plan) => plan.execute(store, key).await.map(Some),
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

    /// Record `pruned_before` (chain verification reads it), signed with `key` when given
    /// ([`statement`]; unsigned otherwise, like a seal's checkpoints without a key), then the
    /// floor in `weft_ingest_floor` (migration 0015: deleting a partition's newest rows
    /// cannot move ingest's resume point back), then delete the rows the plan covers. A
    /// recorded value later than the cutoff (a retention lengthened since) stays, with its
    /// own signature or none: an apply never signs a value it did not compute. A legal hold
    /// placed since the plan, or a retention changed since, wins: nothing is deleted.
    pub async fn execute(self, store: &Store, key: Option<&Key>) -> Result<Applied, AuditError> {
        let tenant = self.tenant.as_str();
        let unchanged = || async {
            let (r, version) = read(store, tenant).await?;
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
            Ok((r, version))
        };
        let (mut r, read) = unchanged().await?;
        if self.cutoff > r.pruned_before {
            r.pruned_before = self.cutoff;
            (r.kid, r.sig) = match key {
                Some(k) => (k.kid.clone(), k.sign(&statement(tenant, self.cutoff))?),
                None => (String::new(), String::new()),
            };
        }
        if put(store, tenant, &r, read).await?.legal_hold == 1 {
            return Err(AuditError::Refused(format!(
                "tenant {tenant} was put on legal hold"
            )));
        }
        let mut deleted = 0;
        if self.facts > 0 {
            weft_store::insert::<FloorRow>(store, INGEST_FLOOR, &self.floor).await?;
            deleted = self
                .covered(store, "SELECT count() FROM weft_events")
                .fetch_one()
                .await
                .map_err(ch_err(store))?;
            // Re-checked right before deleting, nothing in between: a hold placed meanwhile
            // wins.
            unchanged().await?;
            self.covered(store, "DELETE FROM weft_events")
                .with_setting("mutations_sync", "2")
                .execute()
                .await
                .map_err(ch_err(store))?;
            if get(store, tenant).await?.legal_hold == 1 {
                error!(%tenant, cutoff = self.cutoff, deleted,
                    "a legal hold was placed while retention deleted this tenant's facts older \
                     than the cutoff: they are deleted");
            }
        }
        Ok(Applied {
            cutoff: self.cutoff,
            deleted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000_000;

    #[test]
    fn pruned_before_is_bounded_by_a_day_before_now() {
        let now = 1_800_000_000_000_000;
        assert_eq!(check_pruned(0, now), Ok(0));
        assert_eq!(check_pruned(-5, now), Ok(0));
        // What an apply of a one-day retention records, and earlier.
        assert_eq!(check_pruned(now - DAY, now), Ok(now - DAY));
        assert_eq!(check_pruned(now - 400 * DAY, now), Ok(now - 400 * DAY));
        // Within the clocks' slack.
        assert!(check_pruned(now - DAY + CLOCK_SLACK_MICROS, now).is_ok());
        // Later than a day before now, in the future, or at the end of the range: impossible.
        assert!(check_pruned(now - DAY + CLOCK_SLACK_MICROS + 1, now).is_err());
        assert!(check_pruned(now - 3_600_000_000, now).is_err());
        assert!(check_pruned(7_258_118_400_000_000, now).is_err());
        assert!(check_pruned(i64::MAX, now).is_err());
        assert!(check_pruned(i64::MAX, i64::MIN).is_err());
    }

    /// A signature of `pruned_before` verifies for its tenant and value only, under a key
    /// of the keyring; an unsigned value does not; a checkpoint's signature is not one.
    #[test]
    fn pruned_before_is_trusted_only_signed_for_its_tenant_and_value() {
        let key = Key::generate("k1").unwrap();
        let ring = Keyring {
            keys: vec![key.public()],
        };
        let signed = |tenant: &str, v: i64| Retention {
            days: 1,
            legal_hold: 0,
            pruned_before: v,
            kid: key.kid.clone(),
            sig: key.sign(&statement(tenant, v)).unwrap(),
        };
        let r = signed("acme", 1_700_000_000_000_001);
        assert_eq!(check_signature(Some(&ring), "acme", &r), Ok(()));
        assert!(check_signature(Some(&ring), "other", &r).is_err());
        let later = Retention {
            pruned_before: r.pruned_before + 1,
            ..r.clone()
        };
        assert!(check_signature(Some(&ring), "acme", &later).is_err());
        let unsigned = Retention {
            kid: String::new(),
            sig: String::new(),
            ..r.clone()
        };
        assert!(check_signature(Some(&ring), "acme", &unsigned).is_err());
        let other_key = Keyring {
            keys: vec![Key::generate("k1").unwrap().public()],
        };
        assert!(check_signature(Some(&other_key), "acme", &r).is_err());
        // Without a keyring nothing is checked (as for checkpoints).
        assert_eq!(check_signature(None, "acme", &unsigned), Ok(()));
        // A checkpoint's signature by the same key does not pass for a retention's.
        let cp = crate::chain::Checkpoint {
            tenant: "acme".into(),
            topic: "t".into(),
            partition: 0,
            offset: 1,
            head: "00".into(),
            rows: 1,
            kid: "k1".into(),
            sig: String::new(),
            sealed_at: 0,
        };
        let forged = Retention {
            sig: key.sign(&cp.statement()).unwrap(),
            ..r.clone()
        };
        assert!(check_signature(Some(&ring), "acme", &forged).is_err());
    }

    #[test]
    fn the_version_after_the_last_is_refused() {
        assert_eq!(next_version(0).ok(), Some(1));
        assert_eq!(next_version(1 << 63).ok(), Some((1 << 63) + 1));
        assert!(matches!(
            next_version(u64::MAX),
            Err(AuditError::Refused(_))
        ));
    }
}
