//! `refused.jsonl`: spooled records Kafka refused for good, set aside beside the spool so
//! that one of them cannot block every event behind it, and sent again on an operator's
//! word (`weft publish --republish-refused`) once the cause is fixed.
//!
//! One JSON object per line ([`RefusedLine`]): when, why, and the record as it was spooled
//! (topic, key, value, headers), each bytes field as `{"utf8": ..}` or `{"hex": ..}`.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use super::replay::enqueue;
use super::state::{lock, read, Shared};
use super::Publisher;
use crate::spool::{Spool, SpoolRecord};

/// The file's name in the spool folder.
pub const FILE: &str = "refused.jsonl";

/// Bytes as they are written: text when they are UTF-8, else hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Bytes {
    Utf8(String),
    Hex(String),
}

impl Bytes {
    fn of(b: &[u8]) -> Self {
        match std::str::from_utf8(b) {
            Ok(s) => Bytes::Utf8(s.to_owned()),
            Err(_) => Bytes::Hex(hex::encode(b)),
        }
    }

    fn into_vec(self) -> Result<Vec<u8>, String> {
        match self {
            Bytes::Utf8(s) => Ok(s.into_bytes()),
            Bytes::Hex(h) => hex::decode(h).map_err(|e| format!("bad hex: {e}")),
        }
    }
}

/// One line of `refused.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RefusedLine {
    at: String,
    error: String,
    topic: String,
    key: Option<Bytes>,
    value: Bytes,
    headers: Vec<(String, Bytes)>,
}

impl RefusedLine {
    fn new(r: &SpoolRecord, error: &str) -> Self {
        RefusedLine {
            at: weft_schemas::time::now_rfc3339(),
            error: error.to_owned(),
            topic: r.topic.clone(),
            key: r.key.as_deref().map(Bytes::of),
            value: Bytes::of(&r.value),
            headers: r
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), Bytes::of(v)))
                .collect(),
        }
    }

    fn into_record(self) -> Result<SpoolRecord, String> {
        Ok(SpoolRecord {
            topic: self.topic,
            key: self.key.map(Bytes::into_vec).transpose()?,
            value: self.value.into_vec()?,
            headers: self
                .headers
                .into_iter()
                .map(|(k, v)| v.into_vec().map(|v| (k, v)))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// Append `lines` to `path` and make them durable.
fn append(path: &Path, lines: &[String]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    for l in lines {
        writeln!(f, "{l}")?;
    }
    f.sync_data()
}

/// Keep records Kafka refused for good (or that failed for too long: `replay::Stuck`) beside
/// the spool, for an operator to fix and publish again; logged and counted
/// (`weft_publisher_spool_refused_total`). An error when the file could not be written
/// durably: the records are then still the spool's, and the round that refused them is
/// retried (moving the cursor past them would lose them). Holds the spool's lock while it
/// writes, so it never runs during [`Publisher::republish_refused`].
pub(super) fn set_aside(sh: &Shared, refused: &[(&SpoolRecord, &str)]) -> std::io::Result<()> {
    if refused.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = refused
        .iter()
        .map(|(r, error)| serde_json::to_string(&RefusedLine::new(r, error)).unwrap_or_default())
        .collect();
    // The spool's lock is held across the append: `republish_refused` holds it for its whole
    // run to rewrite the file, and an append in between would be lost to its rename. Taken
    // here with no other lock held (the replayer calls this between rounds).
    let mut spool = lock(&sh.spool);
    let path = spool.dir().join(FILE);
    append(&path, &lines)?;
    count_aside(&mut spool);
    drop(spool);
    sh.metrics.spool_refused.inc_by(refused.len() as u64);
    for (r, error) in refused {
        error!(%error, topic = %r.topic, path = %path.display(),
            "Kafka refused a spooled event; set aside, the spool moves on");
    }
    Ok(())
}

/// What [`Publisher::republish_refused`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Republished {
    /// Where the set-aside records are (and the ones still refused stay).
    pub path: PathBuf,
    /// Records Kafka acknowledged (acks=all) this time.
    pub delivered: u64,
    /// Records still refused or not acknowledged, kept in the file with this run's error.
    pub kept: u64,
    /// Lines that could not be read as a set-aside record, kept in the file as they were
    /// (with their line number and why).
    pub unreadable: Vec<(u64, String)>,
}

/// Errors of [`Publisher::republish_refused`]: the file could not be read or rewritten.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct RefusedFileError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl Publisher {
    /// Send every record of the spool's `refused.jsonl` to Kafka again, as it was spooled
    /// (same topic, key, value and headers, so consumers drop a copy by identity), once the
    /// cause is fixed (a broker limit raised, a topic authorized). The records Kafka
    /// acknowledges leave the file; the others stay, with this run's error, and so do lines
    /// that cannot be read. The file is replaced atomically at the end (removed when empty): a run killed half
    /// way leaves it as it was, and the next run sends its records again (copies, dropped by
    /// identity downstream). The spool's lock (one process per spool) keeps another
    /// publisher from setting records aside meanwhile; this one's replayer waits.
    pub fn republish_refused(&self, timeout: Duration) -> Result<Republished, RefusedFileError> {
        let sh = &*self.inner.shared;
        // Held throughout: our replayer cannot set a record aside while the file is rewritten.
        let mut spool = lock(&sh.spool);
        let path = spool.dir().join(FILE);
        let fail = |source| RefusedFileError {
            path: path.clone(),
            source,
        };
        let mut out = Republished {
            path: path.clone(),
            ..Default::default()
        };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(fail(e)),
        };
        let tmp = path.with_extension("jsonl.tmp");
        let mut kept = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(fail)?);
        // A chunk at a time, so that memory does not grow with the file.
        let mut lines = std::io::BufReader::new(file).lines().enumerate();
        loop {
            let mut chunk: Vec<(RefusedLine, SpoolRecord)> = Vec::new();
            for (i, raw) in lines.by_ref() {
                let raw = raw.map_err(fail)?;
                if raw.trim().is_empty() {
                    continue;
                }
                let parsed = serde_json::from_str::<RefusedLine>(&raw)
                    .map_err(|e| e.to_string())
                    .and_then(|l| l.clone().into_record().map(|r| (l, r)));
                match parsed {
                    Ok(pair) => chunk.push(pair),
                    Err(why) => {
                        out.unreadable.push((i as u64 + 1, why));
                        writeln!(kept, "{raw}").map_err(fail)?;
                    }
                }
                if chunk.len() == CHUNK {
                    break;
                }
            }
            if chunk.is_empty() {
                break;
            }
            let (chunk, records): (Vec<RefusedLine>, Vec<SpoolRecord>) = chunk.into_iter().unzip();
            for (l, outcome) in chunk.into_iter().zip(send_all(sh, &records, timeout)) {
                match outcome {
                    Ok(()) => out.delivered += 1,
                    Err(error) => {
                        out.kept += 1;
                        let again = RefusedLine {
                            at: weft_schemas::time::now_rfc3339(),
                            error,
                            ..l
                        };
                        let line = serde_json::to_string(&again).unwrap_or_default();
                        writeln!(kept, "{line}").map_err(fail)?;
                    }
                }
            }
        }
        sh.metrics.published.inc_by(out.delivered);
        let kept = kept.into_inner().map_err(|e| fail(e.into_error()))?;
        kept.sync_data().map_err(fail)?;
        let left = kept.metadata().map_err(fail)?.len();
        if left == 0 {
            std::fs::remove_file(&path).map_err(fail)?;
            std::fs::remove_file(&tmp).map_err(fail)?;
        } else {
            std::fs::rename(&tmp, &path).map_err(fail)?;
        }
        if let Ok(d) = std::fs::File::open(spool.dir()) {
            let _ = d.sync_all();
        }
        spool.set_aside_bytes(left);
        sh.spool_bytes.store(spool.bytes(), Ordering::Relaxed);
        sh.metrics.spool_bytes.set(spool.bytes() as i64);
        drop(spool);
        info!(delivered = out.delivered, kept = out.kept, unreadable = out.unreadable.len(),
            path = %path.display(), "republished the records set aside");
        Ok(out)
    }
}

/// Records [`Publisher::republish_refused`] sends before it waits for their reports.
const CHUNK: usize = 10_000;

/// Count `refused.jsonl` against the spool's bound (at open, and after each set-aside).
pub(super) fn count_aside(spool: &mut Spool) {
    let bytes = std::fs::metadata(spool.dir().join(FILE)).map_or(0, |m| m.len());
    spool.set_aside_bytes(bytes);
}

/// Send each record and wait for its delivery report (at most `timeout` past the last
/// send): each record's outcome, an error text for the ones not acknowledged.
fn send_all(sh: &Shared, records: &[SpoolRecord], timeout: Duration) -> Vec<Result<(), String>> {
    let mut outcomes: Vec<Result<(), String>> =
        vec![Err("no delivery report in time".into()); records.len()];
    let (tx, rx) = mpsc::channel();
    let mut sent = 0;
    {
        let guard = read(&sh.producer);
        let Some(producer) = guard.as_ref() else {
            return vec![Err("the publisher is closed".into()); records.len()];
        };
        for (i, r) in records.iter().enumerate() {
            match enqueue(producer, r, i, &tx) {
                Ok(()) => sent += 1,
                Err(e) => outcomes[i] = Err(e.to_string()),
            }
        }
    }
    drop(tx);
    let deadline = Instant::now() + timeout;
    for _ in 0..sent {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, r)) => outcomes[i] = r.map_err(|e| e.to_string()),
            Err(_) => {
                warn!("delivery reports missing after the timeout; those records stay set aside");
                break;
            }
        }
    }
    outcomes
}
