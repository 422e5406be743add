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
//!
//! Only a record read as Confluent Avro (its `content-type` header says so, or it has none
//! and its value sniffs as such, as `weft_schemas::wire::decode` reads it) is asked about: a
//! JSON record whose value starts with a zero byte costs no lookup. And the registry is asked
//! about at most [`MAX_LOOKUPS`] ids a minute: records bringing more unknown ids than that
//! (garbage, or a producer on another registry) are dead-lettered as `unknown_schema`
//! without a lookup, their message says so, and the loop is never held for them. The ids
//! found missing are remembered a minute, at most [`MAX_MISSES`] of them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{info, warn};
use weft_kafka::registry::{self, RegistryError};
use weft_schemas::wire::{ContentType, SchemaIds};
use weft_schemas::Kind;

use crate::decode::Rejection;

/// How long an id the registry said nothing useful about is not asked about again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(60);
/// The longest wait between two tries while the registry cannot be reached.
const MAX_PAUSE: Duration = Duration::from_secs(10);
/// Most ids asked of the registry per [`ASK_AGAIN_AFTER`].
pub(super) const MAX_LOOKUPS: u32 = 32;
/// Most ids remembered as missing (each for [`ASK_AGAIN_AFTER`]).
const MAX_MISSES: usize = 256;

/// The schema ids learnt so far, and where to learn more.
#[derive(Debug, Default)]
pub(super) struct SchemaBook {
    ids: SchemaIds,
    /// `[publisher] schema_registry_url`; without it no id is learnt.
    registry: Option<String>,
    /// Ids the registry had no schema of weft's for, and when it said so (the last
    /// [`ASK_AGAIN_AFTER`], at most [`MAX_LOOKUPS`] of them).
    misses: HashMap<u32, Instant>,
    /// When the current minute of lookups began, and how many ids were asked about in it.
    lookups: Option<(Instant, u32)>,
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
    /// asking the registry about: not known, not found missing in the last minute, and of a
    /// record read as Confluent Avro (`content_type`: its last `content-type` header, asked
    /// only then). Called for every record: the clock is read only for an id found missing
    /// before, the headers only for an id not known.
    pub(super) fn unmet<'v>(
        &self,
        value: Option<&'v [u8]>,
        content_type: impl FnOnce() -> Option<&'v [u8]>,
    ) -> Option<u32> {
        self.registry.as_ref()?;
        let value = value?;
        let framing = value.get(..5)?;
        if framing[0] != 0 {
            return None;
        }
        let id = u32::from_be_bytes([framing[1], framing[2], framing[3], framing[4]]);
        if self.ids.kind_of(id).is_some() {
            return None;
        }
        if self
            .misses
            .get(&id)
            .is_some_and(|at| at.elapsed() < ASK_AGAIN_AFTER)
        {
            return None;
        }
        (read_as(content_type(), value) == Some(ContentType::AvroConfluent)).then_some(id)
    }

    /// Ask the registry which kind `id` is, until it answers or `stop` is set. `Ok(false)`
    /// when it was not asked: [`MAX_LOOKUPS`] ids were asked about in the last minute
    /// already (the record goes to the dead-letter topic; see [`not_asked`]).
    pub(super) async fn learn(
        &mut self,
        id: u32,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, Stopped> {
        let Some(url) = self.registry.clone() else {
            return Ok(true);
        };
        self.learn_by(id, stop, |id| {
            let url = url.clone();
            async move { registry::kind_of_id(&url, id).await }
        })
        .await
    }

    /// [`SchemaBook::learn`], asking `lookup` (the registry's answer: a kind, `None` when it
    /// has none of weft's schemas under the id).
    async fn learn_by<F, Fut>(
        &mut self,
        id: u32,
        stop: &mut watch::Receiver<bool>,
        mut lookup: F,
    ) -> Result<bool, Stopped>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<Option<Kind>, RegistryError>>,
    {
        let now = Instant::now();
        let (since, asked) = self
            .lookups
            .filter(|(since, _)| now.duration_since(*since) < ASK_AGAIN_AFTER)
            .unwrap_or((now, 0));
        if asked >= MAX_LOOKUPS {
            return Ok(false);
        }
        self.lookups = Some((since, asked + 1));
        let mut attempt = 0u32;
        loop {
            match lookup(id).await {
                Ok(Some(kind)) => {
                    info!(
                        id,
                        kind = kind.as_str(),
                        "learnt a schema id from the registry"
                    );
                    self.ids.insert(kind, id);
                    self.misses.remove(&id);
                    return Ok(true);
                }
                Ok(None) => {
                    warn!(
                        id,
                        "the schema registry holds none of weft's schemas under this id: its \
                         records go to the dead-letter topic (unknown_schema)"
                    );
                    self.missed(id);
                    return Ok(true);
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

    /// Remember that the registry has none of weft's schemas under `id`: forget the misses
    /// older than [`ASK_AGAIN_AFTER`] (asked about again anyway), and the oldest beyond
    /// [`MAX_MISSES`].
    fn missed(&mut self, id: u32) {
        let now = Instant::now();
        self.misses
            .retain(|_, at| now.duration_since(*at) < ASK_AGAIN_AFTER);
        while self.misses.len() >= MAX_MISSES {
            let oldest = self
                .misses
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(id, _)| *id);
            match oldest {
                Some(oldest) => self.misses.remove(&oldest),
                None => break,
            };
        }
        self.misses.insert(id, now);
    }
}

/// How `weft_schemas::wire::decode` reads a value: as its `content-type` header says (`None`
/// for one it refuses), or, without the header, as its first bytes look.
fn read_as(content_type: Option<&[u8]>, value: &[u8]) -> Option<ContentType> {
    match content_type {
        Some(ct) => std::str::from_utf8(ct).ok().and_then(ContentType::parse),
        None => ContentType::sniff(value),
    }
}

/// Say in a record's rejection that its schema id `id` was not asked of the registry (too
/// many unknown ids lately), when that is why it is refused.
pub(super) fn not_asked(reason: &mut Rejection, id: u32) {
    if reason.code == "unknown_schema" {
        reason.message = format!(
            "{}; the schema registry was not asked about id {id}: over {MAX_LOOKUPS} schema ids \
             were looked up in the last minute (it is asked about again later)",
            reason.message
        );
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
        let unmet = |book: &SchemaBook, v: Option<&[u8]>| book.unmet(v, || None);
        assert_eq!(unmet(&book, Some(&framed(7))), Some(7));
        assert_eq!(unmet(&book, Some(b"{\"json\":1}")), None);
        assert_eq!(
            unmet(&book, Some(&[0, 0, 0])),
            None,
            "too short to hold an id"
        );
        assert_eq!(unmet(&book, None), None);
        book.ids.insert(weft_schemas::Kind::Frame, 7);
        assert_eq!(unmet(&book, Some(&framed(7))), None, "known");
        let without = SchemaBook::new(None);
        assert_eq!(
            unmet(&without, Some(&framed(8))),
            None,
            "no registry to ask"
        );
        assert_eq!(
            unmet(&SchemaBook::new(Some(" ".into())), Some(&framed(8))),
            None
        );
    }

    /// A record whose content-type header says JSON (or Avro single-object, or something
    /// weft does not read) is not asked about, whatever its first byte; one that says
    /// Confluent Avro is.
    #[test]
    fn only_records_read_as_confluent_avro_are_asked_about() {
        let book = SchemaBook::new(Some("http://registry".into()));
        let v = framed(7);
        for ct in [
            ContentType::Json.as_str(),
            ContentType::AvroSingleObject.as_str(),
            "text/plain",
        ] {
            assert_eq!(book.unmet(Some(&v), || Some(ct.as_bytes())), None, "{ct}");
        }
        assert_eq!(book.unmet(Some(&v), || Some(&b"\xff"[..])), None);
        let confluent = ContentType::AvroConfluent.as_str().as_bytes();
        assert_eq!(book.unmet(Some(&v), || Some(confluent)), Some(7));
    }

    /// 10,000 distinct unknown ids (a registry answering 404 to each): at most
    /// `MAX_LOOKUPS` lookups and as many misses kept; the rest are not asked about, and their
    /// records' message says so.
    #[tokio::test]
    async fn unknown_ids_cost_a_bounded_number_of_lookups_and_misses() {
        let mut book = SchemaBook::new(Some("http://registry".into()));
        let (_tx, mut stop) = watch::channel(false);
        let calls = std::cell::Cell::new(0u32);
        let (mut asked, mut declined) = (0u32, 0u32);
        for id in 0..10_000u32 {
            let Some(id) = book.unmet(Some(&framed(id)), || None) else {
                continue;
            };
            let lookup = |_| {
                calls.set(calls.get() + 1);
                std::future::ready(Ok(None))
            };
            match book.learn_by(id, &mut stop, lookup).await {
                Ok(true) => asked += 1,
                Ok(false) => declined += 1,
                Err(Stopped) => unreachable!("never stopped"),
            }
        }
        assert_eq!(calls.get(), MAX_LOOKUPS);
        assert_eq!((asked, declined), (MAX_LOOKUPS, 10_000 - MAX_LOOKUPS));
        assert!(
            book.misses.len() <= MAX_LOOKUPS as usize,
            "{}",
            book.misses.len()
        );
        let mut reason = Rejection {
            code: "unknown_schema",
            message: "confluent schema id 9999 is not registered".into(),
        };
        not_asked(&mut reason, 9999);
        assert!(
            reason.message.contains("not asked about id 9999"),
            "{}",
            reason.message
        );
    }

    /// Misses older than a minute are forgotten, and there are never more than `MAX_MISSES`.
    #[test]
    fn misses_expire_and_are_capped() {
        let mut book = SchemaBook::new(Some("http://registry".into()));
        let long_ago = Instant::now()
            .checked_sub(ASK_AGAIN_AFTER)
            .expect("a clock a minute old");
        for id in 0..100 {
            book.misses.insert(id, long_ago);
        }
        book.missed(1000);
        assert_eq!(book.misses.keys().copied().collect::<Vec<_>>(), [1000]);
        for id in 0..(2 * MAX_MISSES as u32) {
            book.missed(id);
        }
        assert_eq!(book.misses.len(), MAX_MISSES);
    }

    #[test]
    fn an_id_found_missing_is_asked_about_again_after_a_minute() {
        let mut book = SchemaBook::new(Some("http://registry".into()));
        book.misses.insert(9, Instant::now());
        assert_eq!(book.unmet(Some(&framed(9)), || None), None, "just asked");
        let long_ago = Instant::now().checked_sub(ASK_AGAIN_AFTER);
        book.misses
            .insert(9, long_ago.expect("a clock a minute old"));
        assert_eq!(book.unmet(Some(&framed(9)), || None), Some(9));
    }
}
