//! `weft reshard`: change how many narrative shards run, keeping their progress.
//!
//! A shard's progress rows say how far *its* tenants are projected, and a new shard's
//! tenants come from several old shards. So, per source partition, each new shard starts
//! from the old shards' lowest offset and lowest version: the lowest offset replays some
//! records for tenants whose old shard was further ahead (harmless: every projector write
//! is idempotent), and the lowest version makes the new shard restore, at start, every
//! placement newer than it, so a pass an old shard left unfinished is finished. A partition
//! that some old shard never projected gets no row, and is read from its first offset.
//!
//! Every narrative process must be stopped first; the running inserts into the narrative
//! tables are checked, which catches a process in the middle of a pass, not one between
//! two. Re-running after an interruption is safe: the old rows are deleted last, and the new
//! rows are computed from them again.

use clickhouse::Row;
use serde::Deserialize;
use weft_store::{Store, StoreError};

use super::projector::NARRATIVE_TABLES;
use super::shard::NarrativeShard;

/// Why a reshard did not run.
#[derive(Debug, thiserror::Error)]
pub enum ReshardError {
    /// ClickHouse failed or refused a query.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The progress rows are not those of one shard count.
    #[error(
        "weft_projector_progress holds the shards [{}], not one whole set (0/N .. N-1/N, or \
         one unsharded process) beside the new one: finish the change that left them with \
         the count it was for, or recompute everything with `weft rebuild --narrative-shards N`",
        .0.iter().map(|l| format!("'{l}'")).collect::<Vec<_>>().join(", ")
    )]
    Mixed(Vec<String>),
    /// A narrative process is writing.
    #[error(
        "{0} insert(s) into the narrative tables are running: stop every `weft ingest` that \
         projects narratives (roles all and narratives) first"
    )]
    Busy(usize),
}

/// What a reshard did, or would do (`dry_run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reshard {
    /// The progress labels replaced (empty: nothing to move).
    pub from: Vec<String>,
    /// The new shards' labels.
    pub to: Vec<String>,
    /// Source partitions every old shard has progress for: each new shard resumes on these.
    pub partitions: u64,
}

/// The old shards' labels among `present` (every label the progress table holds), given
/// the new ones: what is left once the new labels are set aside (a run interrupted after
/// some of its inserts left those), which must be one whole set of shards.
fn old_labels(present: &[String], new: &[String]) -> Result<Vec<String>, ReshardError> {
    let old: Vec<String> = present
        .iter()
        .filter(|l| !new.contains(l))
        .cloned()
        .collect();
    if old.is_empty() {
        return Ok(old);
    }
    let shards: Option<Vec<NarrativeShard>> = old
        .iter()
        .map(|l| {
            if l.is_empty() {
                Some(NarrativeShard::WHOLE)
            } else {
                l.parse().ok()
            }
        })
        .collect();
    let count = old.len() as u32;
    let whole = shards.is_some_and(|mut s| {
        s.sort_by_key(|s| s.index());
        s.iter()
            .enumerate()
            .all(|(i, s)| s.count() == count && s.index() == i as u32)
    });
    if whole {
        Ok(old)
    } else {
        let mut all = present.to_vec();
        all.sort();
        Err(ReshardError::Mixed(all))
    }
}

#[derive(Row, Deserialize)]
struct Label {
    shard: String,
}

/// Move the narrative stage's progress to `count` shards (see the module's doc); with
/// `dry_run`, say what would move and change nothing.
pub async fn reshard(store: &Store, count: u32, dry_run: bool) -> Result<Reshard, ReshardError> {
    let c = store.client();
    let present: Vec<String> = c
        .query("SELECT DISTINCT shard FROM weft_projector_progress")
        .fetch_all::<Label>()
        .await
        .map_err(store.err())?
        .into_iter()
        .map(|l| l.shard)
        .collect();
    let to = NarrativeShard::labels(count);
    let from = old_labels(&present, &to)?;
    if from.is_empty() {
        return Ok(Reshard {
            from,
            to,
            partitions: 0,
        });
    }
    let running = store.running_inserts(NARRATIVE_TABLES).await?;
    if !running.is_empty() {
        return Err(ReshardError::Busy(running.len()));
    }
    let n = from.len() as u64;
    // The old shards' newest row per partition, then, per partition all of them have, the
    // lowest offset and version.
    const LOWEST: &str = "SELECT topic, partition, min(o), min(v), {new:String} FROM ( \
           SELECT topic, partition, shard, argMax(offset, version) AS o, max(version) AS v \
           FROM weft_projector_progress WHERE shard IN {old:Array(String)} \
           GROUP BY topic, partition, shard) \
         GROUP BY topic, partition HAVING count() = {n:UInt64}";
    let partitions = c
        .query(&format!("SELECT count() FROM ({LOWEST})"))
        .param("new", "")
        .param("old", &from)
        .param("n", n)
        .fetch_one::<u64>()
        .await
        .map_err(store.err())?;
    if dry_run {
        return Ok(Reshard {
            from,
            to,
            partitions,
        });
    }
    for label in &to {
        c.query(&format!(
            "INSERT INTO weft_projector_progress (topic, partition, offset, version, shard) {LOWEST}"
        ))
        .param("new", label)
        .param("old", &from)
        .param("n", n)
        .execute()
        .await
        .map_err(store.err())?;
    }
    // Last: until the old rows go, a run interrupted here computes the same rows again.
    c.query("DELETE FROM weft_projector_progress WHERE shard IN {old:Array(String)}")
        .param("old", &from)
        .execute()
        .await
        .map_err(store.err())?;
    Ok(Reshard {
        from,
        to,
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_old_set_is_what_the_new_labels_leave() {
        let old =
            |present: &[&str], count| old_labels(&strings(present), &NarrativeShard::labels(count));
        assert_eq!(old(&["0/2", "1/2"], 3).unwrap(), ["0/2", "1/2"]);
        assert_eq!(old(&[""], 2).unwrap(), [""]);
        assert_eq!(old(&["1/2", "0/2"], 1).unwrap(), ["1/2", "0/2"]);
        // Already there, or nothing projected yet: nothing to move.
        assert!(old(&["0/2", "1/2"], 2).unwrap().is_empty());
        assert!(old(&[], 4).unwrap().is_empty());
        // A run interrupted after some of its inserts: the old set is still whole.
        assert_eq!(old(&["0/2", "0/3", "1/2"], 3).unwrap(), ["0/2", "1/2"]);
    }

    #[test]
    fn a_set_that_is_not_one_whole_count_is_refused_with_every_label() {
        for present in [
            &["0/2"][..],
            &["0/2", "1/3"],
            &["", "0/2", "1/2"],
            &["0/2", "1/2", "0/3"],
            &["0/2", "1/2", "garbage"],
        ] {
            let err = old_labels(&strings(present), &NarrativeShard::labels(4)).unwrap_err();
            let ReshardError::Mixed(all) = &err else {
                panic!("{present:?}: {err}")
            };
            assert_eq!(all.len(), present.len(), "{present:?}");
            assert!(err.to_string().contains("weft rebuild"), "{err}");
        }
    }
}
