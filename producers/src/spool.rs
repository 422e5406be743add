//! The durable spool: where events wait, on disk, while Kafka cannot take them.
//!
//! Layout of the spool directory:
//! - `LOCK`: held with `flock` by the one process that owns the spool;
//! - `NNNNNNNNNNNNNNNNNNNN.seg`: append-only segment files, numbered in write order. Each
//!   record is `len: u32 LE | crc32(body): u32 LE | body`, where body is a [`SpoolRecord`];
//! - `cursor`: the durable read position (segment, offset) up to which records are known
//!   to be delivered to Kafka, written by atomic rename.
//!
//! Why this shape: appends never rewrite bytes, so a crash can only leave a torn record at the
//! tail of the last segment, which `open` cuts off with a warning (it was never acknowledged
//! as durable). Any other bad frame is damage to acknowledged data: only it (or, when its
//! length cannot be trusted, the rest of its segment) is set aside, skipped by the reader,
//! copied to a `corrupt-*` file and counted; every good record around it is replayed (the
//! rules are in [`scan`]). Delivery is tracked by the cursor rather than by rewriting
//! records, and whole segments are deleted once the cursor has passed them, so disk use stays
//! bounded.
//!
//! This type is synchronous and does no locking of its own: the publisher wraps it in a mutex
//! and calls it from its writer and replayer threads.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tracing::{error, warn};

use crate::config::FsyncPolicy;

mod read;
mod record;
mod scan;
pub use record::SpoolRecord;

/// Bytes before each record body: length and CRC32.
const FRAME: u64 = 8;
/// Largest record body. Reading treats a larger length as corruption (a torn length field
/// must not make `open` read gigabytes), so `append` refuses larger records up front.
pub const MAX_RECORD: u32 = 64 << 20;

/// Why the spool failed. `Full` is back-pressure; the others are I/O or corruption.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The records would take the spool past `max_bytes`; nothing was written.
    #[error(
        "spool is full ({used} of {max} bytes used, refused.jsonl included); retry later, \
         empty refused.jsonl (weft publish --republish-refused) or raise spool_max_bytes"
    )]
    Full {
        /// Bytes the spool holds now.
        used: u64,
        /// The spool's bound (`max_bytes`).
        max: u64,
    },
    /// A record's body is over [`MAX_RECORD`] bytes; nothing was written.
    #[error("record of {size} bytes is over the spool's {max}-byte record limit")]
    TooLarge {
        /// Encoded body size of the record.
        size: usize,
        /// [`MAX_RECORD`].
        max: u32,
    },
    /// Another process holds the directory's `LOCK`; holds the directory.
    #[error("spool directory {0} is locked by another process (one spool per process)")]
    Locked(PathBuf),
    /// A file operation failed.
    #[error("spool I/O on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A record failed to decode or its CRC did not match; holds what was wrong.
    #[error("spool record is corrupt: {0}")]
    Corrupt(&'static str),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A place in the spool: a segment and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Position {
    /// Segment id (the number in its file name).
    pub segment: u64,
    /// Byte offset within that segment.
    pub offset: u64,
}

/// Limits and durability of a spool.
#[derive(Debug, Clone)]
pub struct SpoolOptions {
    /// When appends are fsynced.
    pub fsync: FsyncPolicy,
    /// Bound on the bytes all segments, and the records set aside beside them
    /// ([`Spool::set_aside_bytes`]), may occupy; past it appends fail with `Full`.
    pub max_bytes: u64,
    /// Size at which the active segment is closed and a new one started.
    pub segment_bytes: u64,
}

/// What [`Spool::open`] found on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Records not yet delivered, which will be replayed.
    pub pending: u64,
    /// Bytes cut off a torn tail (an append a crash interrupted).
    pub truncated_bytes: u64,
    /// Damaged ranges set aside (one record each, unless its length was damaged too).
    pub corrupt_records: u64,
    /// Bytes in them.
    pub corrupt_bytes: u64,
}

/// A batch handed to the replayer, and where the cursor goes once it is delivered.
#[derive(Debug)]
pub struct ReadBatch {
    /// The records, in append order.
    pub records: Vec<SpoolRecord>,
    /// Position just past the last record; the cursor moves here once they are delivered.
    pub end: Position,
    /// Pending records in damaged ranges the batch skipped: delivered as far as the count
    /// goes (commit `records.len() + skipped`).
    pub skipped: u64,
    /// Damaged ranges this read found (not those found before), and their bytes.
    pub corrupt_records: u64,
    /// See `corrupt_records`.
    pub corrupt_bytes: u64,
}

/// The spool itself. See the module docs for the format.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    opts: SpoolOptions,
    /// Segment id -> bytes written (only valid, complete records).
    segments: BTreeMap<u64, u64>,
    active: u64,
    writer: File,
    /// The segment `writer` writes: `active`, except after a failed append whose rollback
    /// could not reopen the segment it returned to.
    writer_of: u64,
    /// Durable: everything before it is delivered.
    cursor: Position,
    /// Where the next `read_batch` starts (>= cursor; rewound on failure).
    read_pos: Position,
    reader: Option<(u64, File)>,
    /// Records between the cursor and the end.
    pending: u64,
    /// Records between read_pos and the end.
    unread: u64,
    /// Damaged ranges the reader skips: start -> (end offset, pending records they held).
    bad: BTreeMap<Position, (u64, u64)>,
    dirty: bool,
    /// The next append starts a new segment: a rolled-back append could not cut its bytes
    /// off the active segment (appending behind bytes `segments` does not count would misplace
    /// records), or the active segment holds damage (records behind it could be taken for
    /// part of it on the next open).
    cut_failed: bool,
    last_sync: Instant,
    buf: Vec<u8>,
    /// Bytes of records the owner keeps beside the segments (`refused.jsonl`), counted
    /// against `max_bytes` so that the folder as a whole stays bounded.
    aside: u64,
    _lock: File,
}

/// What an append started from, to undo it (see [`Spool::roll_back`]).
#[derive(Debug, Clone, Copy)]
struct Mark {
    active: u64,
    size: u64,
    pending: u64,
    unread: u64,
}

fn seg_name(id: u64) -> String {
    format!("{id:020}.seg")
}

fn fsync_dir(dir: &Path) -> Result<(), SpoolError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

impl Spool {
    /// Open (or create) the spool in `dir`: take the lock, read the cursor, drop delivered
    /// segments, and scan the rest, truncating any torn tail.
    pub fn open(dir: &Path, opts: SpoolOptions) -> Result<(Self, OpenReport), SpoolError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let lock_path = dir.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        // SAFETY: flock on a valid, owned file descriptor.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(SpoolError::Locked(dir.to_owned()));
        }
        let mut cursor = read_cursor(dir)?;
        let on_disk = cursor;
        let mut ids = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name
                .strip_suffix(".seg")
                .and_then(|s| s.parse::<u64>().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        let last = ids.last().copied();
        let mut report = OpenReport::default();
        let mut segments = BTreeMap::new();
        let mut bad = BTreeMap::new();
        for id in ids {
            let path = dir.join(seg_name(id));
            if id < cursor.segment {
                fs::remove_file(&path).map_err(io_err(&path))?;
                continue;
            }
            let start = if id == cursor.segment {
                cursor.offset
            } else {
                0
            };
            let data = fs::read(&path).map_err(io_err(&path))?;
            let found = scan::scan(&data, start, Some(id) == last);
            let mut size = data.len() as u64;
            if let Some(at) = found.torn {
                report.truncated_bytes += size - at;
                warn!(
                    segment = %path.display(),
                    at,
                    bytes = size - at,
                    "spool: torn tail found (an append a crash interrupted); truncating it (it was never acknowledged as durable)"
                );
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_err(&path))?;
                f.set_len(at).map_err(io_err(&path))?;
                f.sync_all().map_err(io_err(&path))?;
                size = at;
            }
            for (from, to) in found.damaged {
                scan::set_aside(dir, &path, id, from, &data[from as usize..to as usize]);
                report.corrupt_records += 1;
                report.corrupt_bytes += to - from;
                // Never counted as pending, so skipping it settles nothing.
                bad.insert(
                    Position {
                        segment: id,
                        offset: from,
                    },
                    (to, 0),
                );
            }
            report.pending += found.records;
            segments.insert(id, size);
        }
        let damaged_last = bad.keys().any(|p: &Position| Some(p.segment) == last);
        let active = match segments.iter().next_back() {
            Some((&id, &size)) if size < opts.segment_bytes && !damaged_last => id,
            Some((&id, _)) => id + 1,
            None => cursor.segment.max(1),
        };
        segments.entry(active).or_insert(0);
        match segments.get(&cursor.segment) {
            // A torn tail may have been cut below a stale cursor.
            Some(&size) => cursor.offset = cursor.offset.min(size),
            // The cursor's segment is gone (fully delivered, or none yet): start at the oldest.
            None => {
                cursor = Position {
                    segment: segments.keys().next().copied().unwrap_or(active),
                    offset: 0,
                }
            }
        }
        // A lowered cursor must be durable before anything is appended below the old one: a
        // second restart would otherwise read from the stale, higher offset and skip (or take
        // for damage) records acknowledged in between. (A raised one needs no write: the stale
        // cursor is resolved the same way again.)
        if cursor < on_disk {
            write_cursor(dir, cursor)?;
        }
        let path = dir.join(seg_name(active));
        let writer = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        fsync_dir(dir)?;
        let spool = Self {
            dir: dir.to_owned(),
            opts,
            segments,
            active,
            writer,
            writer_of: active,
            cursor,
            read_pos: cursor,
            reader: None,
            pending: report.pending,
            unread: report.pending,
            bad,
            dirty: false,
            cut_failed: false,
            last_sync: Instant::now(),
            buf: Vec::new(),
            aside: 0,
            _lock: lock,
        };
        Ok((spool, report))
    }

    /// Bytes the spool occupies on disk, what `max_bytes` bounds: its segments and the
    /// records set aside beside them.
    pub fn bytes(&self) -> u64 {
        self.segments.values().sum::<u64>() + self.aside
    }

    /// Count `bytes` kept beside the segments (the owner's set-aside records) against
    /// `max_bytes`. Setting records aside never fails for the bound (they were counted in
    /// the segments already); only new appends do, until an operator empties the file.
    pub fn set_aside_bytes(&mut self, bytes: u64) {
        self.aside = bytes;
    }

    /// Records appended but not yet delivered.
    pub fn pending(&self) -> u64 {
        self.pending
    }

    /// Records appended but not yet handed to the replayer.
    pub fn unread(&self) -> u64 {
        self.unread
    }

    /// The spool's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes `records` would take on disk.
    pub fn size_of(records: &[SpoolRecord]) -> u64 {
        records.iter().map(|r| FRAME + r.encoded_len() as u64).sum()
    }

    /// Append records in order, all or nothing: if they do not fit, nothing is written and
    /// [`SpoolError::Full`] is returned; if writing, rotating or the fsync of the `always`
    /// policy fails, what this call wrote is taken back (see [`Spool::roll_back`]), so the
    /// caller may fail every record and none of them is replayed later. Returns whether the
    /// data is now fsynced.
    pub fn append(&mut self, records: &[SpoolRecord]) -> Result<bool, SpoolError> {
        if records.is_empty() {
            return Ok(!self.dirty);
        }
        if let Some(size) = records
            .iter()
            .map(SpoolRecord::encoded_len)
            .find(|n| *n > MAX_RECORD as usize)
        {
            return Err(SpoolError::TooLarge {
                size,
                max: MAX_RECORD,
            });
        }
        let need = Self::size_of(records);
        let used = self.bytes();
        if used + need > self.opts.max_bytes {
            return Err(SpoolError::Full {
                used,
                max: self.opts.max_bytes,
            });
        }
        let mark = Mark {
            active: self.active,
            size: self.segments[&self.active],
            pending: self.pending,
            unread: self.unread,
        };
        match self.write_records(records) {
            Ok(synced) => Ok(synced),
            Err(e) => {
                self.roll_back(mark);
                Err(e)
            }
        }
    }

    fn write_records(&mut self, records: &[SpoolRecord]) -> Result<bool, SpoolError> {
        let mut i = 0;
        while i < records.len() {
            if self.cut_failed || self.segments[&self.active] >= self.opts.segment_bytes {
                self.rotate()?;
            }
            // Fill the active segment up to its size, at least one record per round.
            let room = self
                .opts
                .segment_bytes
                .saturating_sub(self.segments[&self.active]);
            let mut buf = std::mem::take(&mut self.buf);
            buf.clear();
            let mut n = 0;
            while i < records.len() && (n == 0 || (buf.len() as u64) < room) {
                let start = buf.len();
                buf.extend([0u8; FRAME as usize]);
                records[i].encode_into(&mut buf);
                let body = &buf[start + FRAME as usize..];
                let len = body.len() as u32;
                let crc = crc32fast::hash(body);
                buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
                buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
                i += 1;
                n += 1;
            }
            let res = self.writer.write_all(&buf);
            let written = buf.len() as u64;
            self.buf = buf;
            // Possibly written in part: the caller's rollback cuts it off.
            self.dirty = true;
            res.map_err(io_err(&self.dir.join(seg_name(self.active))))?;
            *self.segments.entry(self.active).or_insert(0) += written;
            self.pending += n;
            self.unread += n;
        }
        if self.opts.fsync == FsyncPolicy::Always {
            self.sync()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Undo a failed append: forget its records and cut them off disk, so they are neither
    /// replayed nor counted. After a failed fsync this is also what makes the failure honest:
    /// the bytes may not be durable, so they must not stay as if they were. In memory the
    /// undo is exact; on disk it is best effort: if a cut fails, the next append starts a new
    /// segment, and only a restart could replay the leftovers (duplicates of events whose
    /// callers were told they failed; consumers drop copies by identity).
    fn roll_back(&mut self, mark: Mark) {
        let created: Vec<u64> = self
            .segments
            .range(mark.active + 1..)
            .map(|(id, _)| *id)
            .collect();
        for id in &created {
            self.segments.remove(id);
        }
        self.segments.insert(mark.active, mark.size);
        self.pending = mark.pending;
        self.unread = mark.unread;
        let path = self.dir.join(seg_name(mark.active));
        let mut cut = Ok(());
        self.active = mark.active;
        // Keyed by the writer's own segment, not `active`: after a reopen that failed, the
        // writer is still on a segment this rollback deleted, and a cut of that file would
        // "succeed" and let the next append write into a deleted file.
        if self.writer_of != mark.active {
            match OpenOptions::new().append(true).open(&path) {
                Ok(f) => {
                    self.writer = f;
                    self.writer_of = mark.active;
                }
                Err(e) => cut = Err(e),
            }
        }
        let cut = cut.and_then(|()| self.writer.set_len(mark.size));
        if let Err(e) = &cut {
            error!(segment = %path.display(), error = %e, "spool: could not cut a failed append off its segment; starting a new one");
        }
        self.cut_failed = cut.is_err();
        for id in created {
            let path = self.dir.join(seg_name(id));
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // `rotate` empties a segment file it finds, so this only matters on restart.
                Err(e) => {
                    warn!(segment = %path.display(), error = %e, "spool: could not remove a segment of a failed append")
                }
            }
        }
    }

    /// fsync the active segment if anything was written since the last sync.
    pub fn sync(&mut self) -> Result<(), SpoolError> {
        if self.dirty {
            let path = self.dir.join(seg_name(self.active));
            self.writer.sync_data().map_err(io_err(&path))?;
            self.dirty = false;
        }
        self.last_sync = Instant::now();
        Ok(())
    }

    /// For `interval:<ms>`: sync if the interval has passed. Returns whether data is synced.
    pub fn sync_if_due(&mut self) -> Result<bool, SpoolError> {
        match self.opts.fsync {
            FsyncPolicy::Interval(d) if self.dirty && self.last_sync.elapsed() >= d => {
                self.sync()?;
                Ok(true)
            }
            FsyncPolicy::Interval(_) | FsyncPolicy::Always => Ok(!self.dirty),
            FsyncPolicy::Never => Ok(true),
        }
    }

    /// Whether appended bytes are waiting for an fsync.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Close the active segment and start the next one. Changes nothing in memory unless it
    /// succeeds.
    fn rotate(&mut self) -> Result<(), SpoolError> {
        self.sync()?;
        let next = self.active + 1;
        let path = self.dir.join(seg_name(next));
        let writer = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        // A file already there is left by a failed append or rotation: it holds nothing
        // counted, and appending behind its bytes would misplace records.
        writer.set_len(0).map_err(io_err(&path))?;
        fsync_dir(&self.dir)?;
        self.writer = writer;
        self.writer_of = next;
        self.segments.insert(next, 0);
        self.active = next;
        self.cut_failed = false;
        Ok(())
    }

    /// Go back to the durable cursor (after a failed delivery: everything since is resent).
    pub fn rewind(&mut self) {
        self.read_pos = self.cursor;
        self.unread = self.pending;
    }

    /// Mark everything up to `end` (which covers `n` records) as delivered: delete segments
    /// that are wholly behind it and persist the cursor. When everything is delivered the
    /// active segment is retired too, so an idle spool takes no disk.
    ///
    /// Deleting comes first, so a full disk does not keep the spool from freeing what is
    /// delivered (writing the cursor needs a block; rotating, a file). That order is safe:
    /// a stale cursor on disk then names a deleted segment, and `open` starts at the oldest
    /// one left (at worst resending delivered records of that segment, which consumers drop
    /// by identity). If the cursor cannot be persisted, `pending` and the in-memory cursor
    /// stay as they were, and the same commit may be retried (a `rewind` meanwhile resends
    /// from the oldest segment left).
    pub fn commit(&mut self, end: Position, n: u64) -> Result<(), SpoolError> {
        self.delete_before(end.segment)?;
        let pending = self.pending.saturating_sub(n);
        let at_end = pending == 0
            && end.segment == self.active
            && end.offset > 0
            && end.offset >= self.segments[&self.active];
        let mut cursor = match self.segments.range(end.segment..).next() {
            // Its segment was deleted by an earlier try of this commit.
            Some((&id, _)) if id != end.segment => Position {
                segment: id,
                offset: 0,
            },
            _ => end,
        };
        if at_end {
            // Without room for a new segment the active one stays (and the cursor at its end).
            match self.rotate() {
                Ok(()) => {
                    self.delete_before(self.active)?;
                    cursor = Position {
                        segment: self.active,
                        offset: 0,
                    };
                }
                Err(e) => {
                    warn!(error = %e, "spool: could not retire the delivered active segment; it stays")
                }
            }
        }
        write_cursor(&self.dir, cursor)?;
        self.pending = pending;
        self.cursor = cursor;
        self.read_pos = self.read_pos.max(cursor);
        self.bad.retain(|p, _| *p >= cursor);
        Ok(())
    }

    /// Delete the segments before `segment` (all delivered); needs no disk space.
    fn delete_before(&mut self, segment: u64) -> Result<(), SpoolError> {
        let done: Vec<u64> = self.segments.range(..segment).map(|(k, _)| *k).collect();
        for id in done {
            let path = self.dir.join(seg_name(id));
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
            self.segments.remove(&id);
            if self.reader.as_ref().map(|(r, _)| *r) == Some(id) {
                self.reader = None;
            }
        }
        Ok(())
    }
}

fn read_cursor(dir: &Path) -> Result<Position, SpoolError> {
    let path = dir.join("cursor");
    let data = match fs::read(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Position::default()),
        Err(e) => return Err(io_err(&path)(e)),
    };
    if data.len() != 20 || crc32fast::hash(&data[..16]).to_le_bytes() != data[16..20] {
        // A bad cursor only costs duplicates: replay from the oldest segment.
        warn!(path = %path.display(), "spool: cursor file is corrupt; replaying from the oldest segment");
        return Ok(Position::default());
    }
    let mut seg = [0u8; 8];
    let mut off = [0u8; 8];
    seg.copy_from_slice(&data[..8]);
    off.copy_from_slice(&data[8..16]);
    Ok(Position {
        segment: u64::from_le_bytes(seg),
        offset: u64::from_le_bytes(off),
    })
}

fn write_cursor(dir: &Path, pos: Position) -> Result<(), SpoolError> {
    let mut data = Vec::with_capacity(20);
    data.extend(pos.segment.to_le_bytes());
    data.extend(pos.offset.to_le_bytes());
    data.extend(crc32fast::hash(&data).to_le_bytes());
    let tmp = dir.join("cursor.tmp");
    let path = dir.join("cursor");
    let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(&data).map_err(io_err(&tmp))?;
    f.sync_data().map_err(io_err(&tmp))?;
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    Ok(())
}

#[cfg(test)]
mod tests;
