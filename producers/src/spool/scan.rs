//! Reading segments back: what a good frame is, what a torn tail is, and how far a damaged
//! frame reaches.
//!
//! - A **good frame** at `at`: its length is at most [`MAX_RECORD`], its body lies within the
//!   data, the CRC matches and the body decodes.
//! - A **torn tail** (only in the last segment, only at open): a frame whose header or
//!   declared body runs past the end of the file, with no good frame starting anywhere after
//!   it, or zeros to the end of the file. That is what a crash in the middle of an append
//!   leaves (or a power loss that kept the file's new size but not its data); the append was
//!   never acknowledged as durable, so the tail is cut off.
//! - Anything else that is not a good frame is **damage**: acknowledged bytes that changed.
//!   If the damaged frame's length is believable (its body ends inside the data and a good
//!   frame, or the end of the data, follows it) only that frame is set aside; otherwise the
//!   length itself may be what is damaged, nothing says where the next record starts, and the
//!   rest of the segment is set aside (guessing a start inside it could replay bytes that were
//!   only ever part of a record's value). Set-aside bytes are kept in the segment (skipped by
//!   the reader) and copied to a `corrupt-*` file for an operator.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use tracing::error;

use super::{SpoolRecord, FRAME, MAX_RECORD};

/// The declared body length of the frame at `at`, if its header is within `data`.
pub(super) fn declared_len(data: &[u8], at: usize) -> Option<usize> {
    let h = data.get(at..at + FRAME as usize)?;
    Some(u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize)
}

/// The record in `frame` (one whole frame, header and body), if the CRC matches and the body
/// decodes.
pub(super) fn decode_frame(frame: &[u8]) -> Option<SpoolRecord> {
    let (h, body) = frame.split_at_checked(FRAME as usize)?;
    let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if crc32fast::hash(body) != crc {
        return None;
    }
    SpoolRecord::decode(body).ok()
}

/// The end of the good frame starting at `at`, if one does.
pub(super) fn good_frame(data: &[u8], at: usize) -> Option<usize> {
    let len = declared_len(data, at)?;
    if len > MAX_RECORD as usize {
        return None;
    }
    let end = at + FRAME as usize + len;
    decode_frame(data.get(at..end)?).map(|_| end)
}

/// Whether the frame at `at` is the torn tail of the data (see the module docs). A frame
/// whose declared length runs past the end but whose bytes to the end match its CRC and
/// decode is not torn: it was written whole, and only its length changed afterwards.
fn torn_tail(data: &[u8], at: usize) -> bool {
    let runs_past = match declared_len(data, at) {
        None => true,
        Some(len) => len <= MAX_RECORD as usize && at + FRAME as usize + len > data.len(),
    };
    let whole = decode_frame(&data[at..]).is_some();
    // Zeros to the end are what a power loss leaves when the file's size was made durable
    // before its data (`fsync = interval|never`): appends never acknowledged, and a copy of
    // zeros would tell an operator nothing.
    let zeros = data[at..].iter().all(|b| *b == 0);
    zeros || (runs_past && !whole && !(at + 1..data.len()).any(|y| good_frame(data, y).is_some()))
}

/// Where the damage starting at `at` (not a good frame) ends: just past the damaged frame if
/// its length is believable, else the end of the data.
pub(super) fn damage_end(data: &[u8], at: usize) -> usize {
    if let Some(len) = declared_len(data, at).filter(|&l| l <= MAX_RECORD as usize) {
        let next = at + FRAME as usize + len;
        if next == data.len() || (next < data.len() && good_frame(data, next).is_some()) {
            return next;
        }
    }
    data.len()
}

/// What a scan of a segment found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Scan {
    /// Good records after the start.
    pub records: u64,
    /// Damaged ranges, `[start, end)`, in order.
    pub damaged: Vec<(u64, u64)>,
    /// Where a torn tail starts (only when scanning the last segment at open).
    pub torn: Option<u64>,
}

/// Scan `data` (a segment's bytes) from `start`. `last`: it is the last segment and may end
/// in a torn tail.
pub(super) fn scan(data: &[u8], start: u64, last: bool) -> Scan {
    let mut out = Scan::default();
    let mut at = (start as usize).min(data.len());
    while at < data.len() {
        if let Some(end) = good_frame(data, at) {
            out.records += 1;
            at = end;
        } else if last && torn_tail(data, at) {
            out.torn = Some(at as u64);
            break;
        } else {
            let end = damage_end(data, at);
            out.damaged.push((at as u64, end as u64));
            at = end;
        }
    }
    out
}

/// The file a damaged range of segment `segment` starting at `at` is copied to.
pub(super) fn corrupt_path(dir: &Path, segment: u64, at: u64) -> PathBuf {
    dir.join(format!("corrupt-{segment:020}-{at:020}.bin"))
}

/// Report a damaged range and copy its bytes beside the spool, for an operator. Best effort:
/// if the copy fails, the bytes are still in the segment until it is delivered and deleted.
pub(super) fn set_aside(dir: &Path, segment: &Path, id: u64, at: u64, bytes: &[u8]) {
    let copy = corrupt_path(dir, id, at);
    let res = File::create(&copy).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_data()
    });
    match res {
        Ok(()) => error!(
            segment = %segment.display(), at, bytes = bytes.len(), copy = %copy.display(),
            "spool: damaged record(s) found; set aside (not replayed), copied for an operator"
        ),
        Err(e) => error!(
            segment = %segment.display(), at, bytes = bytes.len(), error = %e,
            "spool: damaged record(s) found; set aside (not replayed), and copying them aside failed"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(r: &SpoolRecord) -> Vec<u8> {
        let mut body = Vec::new();
        r.encode_into(&mut body);
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend(crc32fast::hash(&body).to_le_bytes());
        out.extend(body);
        out
    }

    fn rec(i: u8) -> SpoolRecord {
        SpoolRecord {
            topic: "t".into(),
            key: None,
            value: vec![i; 20],
            headers: vec![],
        }
    }

    #[test]
    fn what_counts_as_torn_and_what_as_damage() {
        let (a, b) = (frame(&rec(1)), frame(&rec(2)));
        let good = [a.clone(), b.clone()].concat();
        assert_eq!(scan(&good, 0, true).records, 2);
        // A frame running past the end, nothing good after it: torn, in the last segment only.
        let torn = [good.clone(), a[..a.len() - 3].to_vec()].concat();
        let s = scan(&torn, 0, true);
        assert_eq!((s.records, s.torn), (2, Some(good.len() as u64)));
        let s = scan(&torn, 0, false);
        let range = (good.len() as u64, torn.len() as u64);
        assert_eq!((s.records, s.torn, s.damaged), (2, None, vec![range]));
        // A complete frame with a bad CRC at the end is damage, not a torn tail.
        let mut flipped = good.clone();
        let n = flipped.len();
        flipped[n - 1] ^= 1;
        let s = scan(&flipped, 0, true);
        let range = (a.len() as u64, n as u64);
        assert_eq!((s.records, s.torn, s.damaged), (1, None, vec![range]));
        // A length running past the end with a good frame after it is damage too.
        let mut long = [a.clone(), b.clone(), a.clone()].concat();
        long[0] = 0xff;
        let s = scan(&long, 0, true);
        assert_eq!((s.records, s.torn), (0, None));
        assert_eq!(s.damaged, vec![(0, long.len() as u64)]);
        // The last frame written whole, its length raised afterwards: damage to an
        // acknowledged record, set aside, not cut off as if an append never finished.
        let mut raised = good.clone();
        let at = a.len();
        let len = u32::from_le_bytes(raised[at..at + 4].try_into().unwrap());
        raised[at..at + 4].copy_from_slice(&(len + 16).to_le_bytes());
        let s = scan(&raised, 0, true);
        assert_eq!((s.records, s.torn), (1, None));
        assert_eq!(s.damaged, vec![(at as u64, raised.len() as u64)]);
        // Zeros to the end (a power loss kept the size, not the data): torn, in the last
        // segment; damage in another.
        let zeroed = [good.clone(), vec![0; 4096]].concat();
        let s = scan(&zeroed, 0, true);
        assert_eq!((s.records, s.torn), (2, Some(good.len() as u64)));
        assert!(s.damaged.is_empty());
        assert_eq!(scan(&zeroed, 0, false).damaged.len(), 1);
    }
}
