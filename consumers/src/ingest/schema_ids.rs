//! Which kind a Confluent schema id stands for (`avro-confluent` records).
//!
//! A Confluent-framed record names its schema by a registry id, not by its fingerprint, and
//! ingest may start before any publisher has registered weft's schemas. So the ids are
//! learnt as records bring them: the first record with an id not met yet holds the loop while
//! the registry is asked for that id's schema ([`weft_kafka::registry::kind_of_id`]); an id
//! whose schema is one of weft's is remembered for good, and its records decode. An id the
//! registry does not have, or holds another schema under, leaves its records to the
//! dead-letter topic (`unknown_schema`), and is asked about again at most once a minute, so a
//! schema registered later is found. While the registry cannot be reached the loop waits, as
//! it does for ClickHouse: records are held, not dead-lettered for an outage.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{info, warn};
use weft_kafka::registry;
use weft_schemas::wire::SchemaIds;

/// How long an id the registry said nothing useful about is not asked about again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(60);
/// The longest wait between two tries while the registry cannot be reached.
const MAX_PAUSE: Duration = Duration::from_secs(10);

/// The schema ids learnt so far, and where to learn more.
#[derive(Debug, Default)]
pub(super) struct SchemaBook {
    ids: SchemaIds,
    /// `[publisher] schema_registry_url`; without it no id is learnt.
    registry: Option<String>,
    /// Ids the registry had no schema of weft's for, and when it said so.
    misses: HashMap<u32, Instant>,
}

/// Stopped while waiting for the registry.
#[derive(Debug)]
pub(super) struct Stopped;

impl SchemaBook {
    pub(super) fn new(registry: Option<String>) -> Self {
        Self {
            registry: registry.filter(|u| !u.trim().is_empty()),
            ..Self::default()
        }
    }

    /// The ids known so far, for the decoder.
    pub(super) fn ids(&self) -> &SchemaIds {
        &self.ids
    }

    /// The schema id of a Confluent-framed `value` (magic byte 0, then the id) that is worth
    /// asking the registry about: not known, and not found missing in the last minute.
    /// Called for every record: the clock is read only for an id found missing before.
    pub(super) fn unmet(&self, value: Option<&[u8]>) -> Option<u32> {
        self.registry.as_ref()?;
        let framing = value?.get(..5)?;
        if framing[0] != 0 {
            return None;
        }
        let id = u32::from_be_bytes([framing[1], framing[2], framing[3], framing[4]]);
        let asked = self.misses.get(&id);
        let due = asked.is_none_or(|at| at.elapsed() >= ASK_AGAIN_AFTER);
        (self.ids.kind_of(id).is_none() && due).then_some(id)
    }

    /// Ask the registry which kind `id` is, until it answers or `stop` is set.
    pub(super) async fn learn(
        &mut self,
        id: u32,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), Stopped> {
        let Some(url) = self.registry.clone() else {
            return Ok(());
        };
        let mut attempt = 0u32;
        loop {
            match registry::kind_of_id(&url, id).await {
                Ok(Some(kind)) => {
                    info!(
                        id,
                        kind = kind.as_str(),
                        "learnt a schema id from the registry"
                    );
                    self.ids.insert(kind, id);
                    self.misses.remove(&id);
                    return Ok(());
                }
                Ok(None) => {
                    warn!(
                        id,
                        "the schema registry holds none of weft's schemas under this id: its \
                         records go to the dead-letter topic (unknown_schema)"
                    );
                    self.misses.insert(id, Instant::now());
                    return Ok(());
                }
                Err(e) => {
                    attempt += 1;
                    warn!(error = %e, attempt, "schema registry unavailable; records held, retrying");
                    let pause = Duration::from_millis(200u64 << attempt.min(6)).min(MAX_PAUSE);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stop.wait_for(|s| *s) => return Err(Stopped),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(id: u32) -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend(id.to_be_bytes());
        v.extend(b"datum");
        v
    }

    #[test]
    fn only_confluent_framed_ids_not_met_yet_are_asked_about() {
        let mut book = SchemaBook::new(Some("http://registry".into()));
        assert_eq!(book.unmet(Some(&framed(7))), Some(7));
        assert_eq!(book.unmet(Some(b"{\"json\":1}")), None);
        assert_eq!(
            book.unmet(Some(&[0, 0, 0])),
            None,
            "too short to hold an id"
        );
        assert_eq!(book.unmet(None), None);
        book.ids.insert(weft_schemas::Kind::Frame, 7);
        assert_eq!(book.unmet(Some(&framed(7))), None, "known");
        let without = SchemaBook::new(None);
        assert_eq!(without.unmet(Some(&framed(8))), None, "no registry to ask");
        assert_eq!(
            SchemaBook::new(Some(" ".into())).unmet(Some(&framed(8))),
            None
        );
    }

    #[test]
    fn an_id_found_missing_is_asked_about_again_after_a_minute() {
        let mut book = SchemaBook::new(Some("http://registry".into()));
        book.misses.insert(9, Instant::now());
        assert_eq!(book.unmet(Some(&framed(9))), None, "just asked");
        let long_ago = Instant::now().checked_sub(ASK_AGAIN_AFTER);
        book.misses
            .insert(9, long_ago.expect("a clock a minute old"));
        assert_eq!(book.unmet(Some(&framed(9))), Some(9));
    }
}
