//! The reader: records from the read position in append order, skipping damaged ranges and
//! setting aside damage it meets first.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};

use super::{io_err, scan, seg_name, Position, ReadBatch, Spool, SpoolError, FRAME, MAX_RECORD};

impl Spool {
    /// Up to `max` records and `max_bytes` bytes (frames included; at least one record,
    /// however large) from the read position, in append order. Empty when everything
    /// appended so far has been handed out. Damaged ranges are skipped (see [`ReadBatch`]);
    /// one found here for the first time is set aside and counted.
    pub fn read_batch(&mut self, max: usize, max_bytes: u64) -> Result<ReadBatch, SpoolError> {
        let mut b = ReadBatch {
            records: Vec::new(),
            end: self.read_pos,
            skipped: 0,
            corrupt_records: 0,
            corrupt_bytes: 0,
        };
        let mut pos = self.read_pos;
        let mut at_end = false;
        let mut bytes = 0u64;
        let mut full = false;
        while b.records.len() < max && !full {
            let size = match self.segments.range(pos.segment..).next() {
                Some((&id, &size)) if id == pos.segment => size,
                // Its segment is gone (a commit deleted it): the next one follows.
                Some((&id, _)) => {
                    pos = Position {
                        segment: id,
                        offset: 0,
                    };
                    continue;
                }
                None => {
                    at_end = true;
                    break;
                }
            };
            if pos.offset >= size {
                // End of this segment: move on if a later one exists.
                match self.segments.range(pos.segment + 1..).next() {
                    Some((&next, _)) => {
                        pos = Position {
                            segment: next,
                            offset: 0,
                        };
                        continue;
                    }
                    None => {
                        at_end = true;
                        break;
                    }
                }
            }
            if let Some(&(end, k)) = self.bad.get(&pos) {
                b.skipped += k;
                pos.offset = end;
                continue;
            }
            // Frames are read up to the next damaged range, which starts on a frame boundary.
            let limit = self
                .bad
                .range(pos..)
                .next()
                .filter(|(p, _)| p.segment == pos.segment)
                .map_or(size, |(p, _)| p.offset);
            let path = self.dir.join(seg_name(pos.segment));
            if self.reader.as_ref().map(|(id, _)| *id) != Some(pos.segment) {
                let f = File::open(&path).map_err(io_err(&path))?;
                self.reader = Some((pos.segment, f));
            }
            let Some((_, f)) = self.reader.as_mut() else {
                break;
            };
            f.seek(SeekFrom::Start(pos.offset)).map_err(io_err(&path))?;
            // Read a chunk of whole records, bounded by the segment's valid size.
            let chunk = (limit - pos.offset).min(4 << 20);
            let mut data = vec![0u8; chunk as usize];
            f.read_exact(&mut data).map_err(io_err(&path))?;
            let mut at = 0usize;
            let mut damaged = false;
            while b.records.len() < max && at < data.len() {
                let need = match scan::declared_len(&data, at) {
                    Some(len) if len <= MAX_RECORD as usize => FRAME as usize + len,
                    Some(_) => {
                        damaged = true;
                        break;
                    }
                    None => FRAME as usize,
                };
                if !b.records.is_empty() && bytes + need as u64 > max_bytes {
                    full = true;
                    break;
                }
                if at + need > data.len() {
                    if pos.offset + (at + need) as u64 > limit {
                        // Runs past the valid bytes.
                        damaged = true;
                        break;
                    }
                    if at == 0 {
                        // One record larger than the chunk: read it whole.
                        let mut big = vec![0u8; need];
                        f.seek(SeekFrom::Start(pos.offset)).map_err(io_err(&path))?;
                        f.read_exact(&mut big).map_err(io_err(&path))?;
                        data = big;
                        continue;
                    }
                    break;
                }
                let Some(r) = scan::decode_frame(&data[at..at + need]) else {
                    damaged = true;
                    break;
                };
                b.records.push(r);
                bytes += need as u64;
                at += need;
            }
            pos.offset += at as u64;
            if damaged {
                let left = self
                    .unread
                    .saturating_sub(b.records.len() as u64 + b.skipped);
                let (end, k) = self.damage_at(pos, limit, left)?;
                b.skipped += k;
                b.corrupt_records += 1;
                b.corrupt_bytes += end - pos.offset;
                pos.offset = end;
            } else if at == 0 {
                break;
            }
        }
        // Saturating: a miscount must not take the replayer down (it only delays the drain).
        self.unread = if at_end {
            0
        } else {
            self.unread
                .saturating_sub(b.records.len() as u64 + b.skipped)
        };
        self.read_pos = pos;
        b.end = pos;
        Ok(b)
    }

    /// A damaged frame at `at` that the reader met first (the bytes changed after they were
    /// counted): set it aside up to where [`scan::damage_end`] says (at most `limit`), and
    /// return that end and how many pending records it held. `left` counts the pending
    /// records from `at` on; the good ones behind the range are counted again on disk, so
    /// what is missing is what the range held (and the spool mode can end).
    fn damage_at(&mut self, at: Position, limit: u64, left: u64) -> Result<(u64, u64), SpoolError> {
        let path = self.dir.join(seg_name(at.segment));
        let mut data = fs::read(&path).map_err(io_err(&path))?;
        data.truncate(limit as usize);
        let end = scan::damage_end(&data, at.offset as usize) as u64;
        scan::set_aside(
            &self.dir,
            &path,
            at.segment,
            at.offset,
            &data[at.offset as usize..end as usize],
        );
        let mut behind = 0;
        for (&id, &size) in self.segments.range(at.segment..) {
            let from = if id == at.segment { end } else { 0 };
            let p = self.dir.join(seg_name(id));
            let mut seg = fs::read(&p).map_err(io_err(&p))?;
            seg.truncate(size as usize);
            behind += scan::scan(&seg, from, false).records;
        }
        // Ranges found earlier further on hold their own count.
        let ahead: u64 = self.bad.range(at..).map(|(_, &(_, k))| k).sum();
        let k = left.saturating_sub(behind + ahead);
        self.bad.insert(at, (end, k));
        if at.segment == self.active {
            self.cut_failed = true;
        }
        Ok((end, k))
    }
}
