//! Unit tests of the spool: format, rotation, replay order, recovery, bounds.

use super::*;

fn opts() -> SpoolOptions {
    SpoolOptions {
        fsync: FsyncPolicy::Always,
        max_bytes: 1 << 20,
        segment_bytes: 1024,
    }
}

fn rec(i: usize) -> SpoolRecord {
    SpoolRecord {
        topic: "t.trace_events".into(),
        key: (!i.is_multiple_of(3)).then(|| format!("req-{}", i % 7).into_bytes()),
        value: format!("{{\"event_id\":\"e{i}\"}}").into_bytes(),
        headers: vec![
            ("weft-kind".into(), b"trace_event".to_vec()),
            ("weft-seq".into(), i.to_string().into_bytes()),
        ],
    }
}

fn drain(s: &mut Spool) -> Vec<SpoolRecord> {
    let mut out = Vec::new();
    loop {
        let b = s.read_batch(7, u64::MAX).unwrap();
        if b.records.is_empty() {
            return out;
        }
        let n = b.records.len() as u64;
        out.extend(b.records);
        s.commit(b.end, n).unwrap();
    }
}

#[test]
fn record_body_round_trips_and_rejects_truncation() {
    let r = rec(1);
    let mut b = Vec::new();
    r.encode_into(&mut b);
    assert_eq!(b.len(), r.encoded_len());
    assert_eq!(SpoolRecord::decode(&b).unwrap(), r);
    assert!(SpoolRecord::decode(&b[..b.len() - 1]).is_err());
    let none = SpoolRecord {
        key: None,
        ..rec(3)
    };
    let mut b = Vec::new();
    none.encode_into(&mut b);
    assert_eq!(SpoolRecord::decode(&b).unwrap().key, None);
}

#[test]
fn appends_rotate_replay_in_order_and_reclaim_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, rep) = Spool::open(dir.path(), opts()).unwrap();
    assert_eq!(rep.pending, 0);
    let recs: Vec<_> = (0..100).map(rec).collect();
    s.append(&recs[..40]).unwrap();
    s.append(&recs[40..]).unwrap();
    assert!(s.segments.len() > 3, "segments rotate at 1 KiB");
    assert_eq!(s.pending(), 100);
    assert_eq!(drain(&mut s), recs);
    assert_eq!(s.pending(), 0);
    assert_eq!(s.bytes(), 0, "delivered segments are deleted");
    let segs = fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("seg".as_ref()))
        .count();
    assert_eq!(segs, 1, "only the fresh active segment remains");
}

#[test]
fn restart_replays_undelivered_records_only() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<_> = (0..50).map(rec).collect();
    {
        let (mut s, _) = Spool::open(dir.path(), opts()).unwrap();
        s.append(&recs).unwrap();
        let b = s.read_batch(20, u64::MAX).unwrap();
        s.commit(b.end, 20).unwrap();
        // Read but not committed: must come back after a restart.
        let _ = s.read_batch(10, u64::MAX).unwrap();
    }
    let (mut s, rep) = Spool::open(dir.path(), opts()).unwrap();
    assert_eq!(rep.pending, 30);
    assert_eq!(drain(&mut s), recs[20..].to_vec());
}

#[test]
fn rewind_resends_from_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, _) = Spool::open(dir.path(), opts()).unwrap();
    let recs: Vec<_> = (0..10).map(rec).collect();
    s.append(&recs).unwrap();
    let first = s.read_batch(5, u64::MAX).unwrap();
    assert_eq!(s.unread(), 5);
    s.rewind();
    assert_eq!(s.unread(), 10);
    assert_eq!(s.read_batch(5, u64::MAX).unwrap().records, first.records);
}

#[test]
fn torn_tail_is_truncated_with_the_good_records_kept() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<_> = (0..5).map(rec).collect();
    let big = SpoolOptions {
        segment_bytes: 1 << 20,
        ..opts()
    };
    {
        let (mut s, _) = Spool::open(dir.path(), big.clone()).unwrap();
        s.append(&recs).unwrap();
    }
    let seg = dir.path().join(seg_name(1));
    let good_len = fs::metadata(&seg).unwrap().len();
    // A crash mid-write: a frame promising more bytes than were written.
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&200u32.to_le_bytes()).unwrap();
    f.write_all(&[1, 2, 3, 4, 5, 6]).unwrap();
    drop(f);
    let (mut s, rep) = Spool::open(dir.path(), big.clone()).unwrap();
    assert_eq!(rep.pending, 5);
    assert_eq!(rep.truncated_bytes, 10);
    assert_eq!(fs::metadata(&seg).unwrap().len(), good_len);
    // Appends after the repair are readable, in order.
    s.append(&[rec(9)]).unwrap();
    let mut want = recs.clone();
    want.push(rec(9));
    assert_eq!(drain(&mut s), want);
    drop(s);

    // A flipped bit in the last record is caught by the CRC, not accepted; the frame is
    // whole, so it is damage, not a torn append: set aside, not cut.
    {
        let (mut s, _) = Spool::open(dir.path(), big.clone()).unwrap();
        s.append(&recs[..2]).unwrap();
    }
    let seg = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some("seg".as_ref()))
        .max()
        .unwrap();
    let mut data = fs::read(&seg).unwrap();
    let last = data.len() - 3;
    data[last] ^= 0x40;
    fs::write(&seg, &data).unwrap();
    let (mut s, rep) = Spool::open(dir.path(), big).unwrap();
    assert_eq!(
        (rep.pending, rep.truncated_bytes, rep.corrupt_records),
        (1, 0, 1)
    );
    assert_eq!(fs::metadata(&seg).unwrap().len(), data.len() as u64);
    assert_eq!(drain(&mut s), recs[..1].to_vec());
}

/// A torn tail cut below the durable cursor (the cursor was committed, the segment's unsynced
/// tail lost) lowers the cursor, and the lowered cursor must be on disk before new records are
/// appended below the old one: else a second restart before the next commit reads from the
/// stale, higher cursor and skips (or sets aside as damaged) acknowledged records.
#[test]
fn a_cursor_lowered_at_open_is_persisted_so_later_appends_survive_a_second_restart() {
    let dir = tempfile::tempdir().unwrap();
    let big = SpoolOptions {
        segment_bytes: 1 << 20,
        ..opts()
    };
    let recs: Vec<_> = (0..5).map(rec).collect();
    {
        let (mut s, _) = Spool::open(dir.path(), big.clone()).unwrap();
        s.append(&recs[..3]).unwrap();
        let b = s.read_batch(2, u64::MAX).unwrap();
        s.commit(b.end, 2).unwrap();
    }
    // Power loss: the cursor (after record 1) survived, the segment only up to inside record 1.
    let seg = dir.path().join(seg_name(1));
    let cut = frame_offset(&recs[..3], 1) + 10;
    OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(cut as u64)
        .unwrap();
    {
        let (mut s, rep) = Spool::open(dir.path(), big.clone()).unwrap();
        assert_eq!(rep.pending, 0);
        // Fsynced (`always`), so acknowledged; then a crash before any commit.
        s.append(&recs[3..]).unwrap();
        assert_eq!(s.pending(), 2);
    }
    let (mut s, rep) = Spool::open(dir.path(), big).unwrap();
    assert_eq!(
        (rep.pending, rep.corrupt_records),
        (2, 0),
        "both new records pending, none taken for damage"
    );
    assert_eq!(drain(&mut s), recs[3..].to_vec());
}

/// Records kept beside the segments (`refused.jsonl`) count against the bound: the folder as
/// a whole stays under `max_bytes`. They used to be outside it, so a spool of records Kafka
/// refuses could fill the disk.
#[test]
fn bytes_set_aside_count_against_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SpoolOptions {
        max_bytes: 4096,
        segment_bytes: 1024,
        fsync: FsyncPolicy::Never,
    };
    let (mut s, _) = Spool::open(dir.path(), opts).unwrap();
    let r = rec(1);
    let one = Spool::size_of(std::slice::from_ref(&r));
    s.set_aside_bytes(4096 - one + 1);
    assert_eq!(s.bytes(), 4096 - one + 1);
    match s.append(std::slice::from_ref(&r)) {
        Err(SpoolError::Full { used, max }) => assert_eq!((used, max), (4096 - one + 1, 4096)),
        other => panic!("expected Full, got {other:?}"),
    }
    s.set_aside_bytes(4096 - one);
    s.append(std::slice::from_ref(&r)).unwrap();
    assert_eq!(s.bytes(), 4096);
}

#[test]
fn full_spool_refuses_whole_batches_and_a_second_owner_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let small = SpoolOptions {
        max_bytes: 2048,
        segment_bytes: 1024,
        fsync: FsyncPolicy::Never,
    };
    let (mut s, _) = Spool::open(dir.path(), small.clone()).unwrap();
    let recs: Vec<_> = (0..200).map(rec).collect();
    let mut stored = 0;
    for r in &recs {
        match s.append(std::slice::from_ref(r)) {
            Ok(_) => stored += 1,
            Err(SpoolError::Full { used, max }) => {
                assert!(used <= max);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(stored > 5 && stored < 200);
    assert!(s.bytes() <= 2048);
    assert!(matches!(
        Spool::open(dir.path(), small),
        Err(SpoolError::Locked(_))
    ));
    // Draining frees the space again.
    assert_eq!(drain(&mut s).len(), stored);
    s.append(&recs[..5]).unwrap();
}

#[test]
fn a_failed_rotation_takes_back_the_whole_append() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, _) = Spool::open(dir.path(), opts()).unwrap();
    s.append(&[rec(0)]).unwrap();
    let seg1 = dir.path().join(seg_name(1));
    let before = (s.bytes(), fs::metadata(&seg1).unwrap().len());
    // Segment 3 cannot be created, as when the disk is out of inodes: records land in
    // segments 1 and 2, then the second rotation fails.
    let blocker = dir.path().join(seg_name(3));
    fs::create_dir(&blocker).unwrap();
    let recs: Vec<_> = (1..41).map(rec).collect();
    assert!(matches!(s.append(&recs), Err(SpoolError::Io { .. })));
    assert_eq!((s.pending(), s.unread()), (1, 1), "nothing of it counted");
    assert_eq!((s.bytes(), fs::metadata(&seg1).unwrap().len()), before);
    assert!(
        !dir.path().join(seg_name(2)).exists(),
        "its new segment removed"
    );
    // Once the disk recovers, appends go on; only what was acknowledged is replayed.
    fs::remove_dir(&blocker).unwrap();
    s.append(&recs[..5]).unwrap();
    let mut want = vec![rec(0)];
    want.extend_from_slice(&recs[..5]);
    drop(s);
    let (mut s, rep) = Spool::open(dir.path(), opts()).unwrap();
    assert_eq!(rep.pending, 6);
    assert_eq!(drain(&mut s), want);
}

#[test]
fn a_failed_fsync_takes_back_the_append_and_the_next_starts_a_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    let big = SpoolOptions {
        segment_bytes: 1 << 20,
        ..opts()
    };
    let (mut s, _) = Spool::open(dir.path(), big.clone()).unwrap();
    let recs: Vec<_> = (0..8).map(rec).collect();
    s.append(&recs[..3]).unwrap();
    let bytes = s.bytes();
    // A device that takes writes and refuses fsync (EINVAL), and cannot be truncated.
    let seg1 = dir.path().join(seg_name(1));
    let real = std::mem::replace(
        &mut s.writer,
        OpenOptions::new().append(true).open("/dev/null").unwrap(),
    );
    assert!(matches!(s.append(&recs[3..6]), Err(SpoolError::Io { .. })));
    assert_eq!((s.pending(), s.unread(), s.bytes()), (3, 3, bytes));
    // The disk recovers; the cut failed, so the next append must not follow uncounted bytes.
    s.writer = real;
    s.append(&recs[6..]).unwrap();
    assert_eq!(s.active, 2);
    assert_eq!(fs::metadata(&seg1).unwrap().len(), bytes);
    let mut want = recs[..3].to_vec();
    want.extend_from_slice(&recs[6..]);
    drop(s);
    let (mut s, rep) = Spool::open(dir.path(), big).unwrap();
    assert_eq!(rep.pending, 5);
    assert_eq!(drain(&mut s), want);
}

#[test]
fn a_failed_commit_changes_no_count_and_can_be_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, _) = Spool::open(dir.path(), opts()).unwrap();
    let recs: Vec<_> = (0..4).map(rec).collect();
    s.append(&recs[..3]).unwrap();
    let b = s.read_batch(2, u64::MAX).unwrap();
    // The cursor cannot be written (stands for a full or failing disk).
    let blocker = dir.path().join("cursor.tmp");
    fs::create_dir(&blocker).unwrap();
    assert!(s.commit(b.end, 2).is_err());
    assert_eq!(s.pending(), 3, "not delivered as far as the spool knows");
    // A failed delivery after it rewinds to the old cursor: everything is resent.
    s.append(&recs[3..]).unwrap();
    let _ = s.read_batch(10, u64::MAX).unwrap();
    s.rewind();
    assert_eq!(s.unread(), 4);
    assert_eq!(s.read_batch(10, u64::MAX).unwrap().records, recs);
    // Or the same commit is retried once the disk recovers.
    fs::remove_dir(&blocker).unwrap();
    s.commit(b.end, 2).unwrap();
    assert_eq!(s.pending(), 2);
    s.rewind();
    assert_eq!(s.read_batch(10, u64::MAX).unwrap().records, recs[2..]);

    // A commit of everything frees the whole segment before it writes the cursor, so after
    // it fails only what was appended since is left to resend.
    s.rewind();
    let b2 = s.read_batch(10, u64::MAX).unwrap();
    assert_eq!(b2.records, recs[2..]);
    fs::create_dir(&blocker).unwrap();
    assert!(s.commit(b2.end, 2).is_err());
    assert_eq!(s.pending(), 2);
    s.append(&recs[..1]).unwrap();
    s.rewind();
    assert_eq!(s.read_batch(10, u64::MAX).unwrap().records, recs[..1]);
    fs::remove_dir(&blocker).unwrap();
    s.commit(b2.end, 2).unwrap();
    assert_eq!(s.pending(), 1);
    s.rewind();
    assert_eq!(s.read_batch(10, u64::MAX).unwrap().records, recs[..1]);
}

#[test]
fn a_record_over_the_limit_is_refused_not_lost_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let roomy = SpoolOptions {
        max_bytes: u64::MAX,
        segment_bytes: 1 << 20,
        ..opts()
    };
    let (mut s, _) = Spool::open(dir.path(), roomy.clone()).unwrap();
    let huge = SpoolRecord {
        value: vec![b'x'; MAX_RECORD as usize],
        ..rec(1)
    };
    let e = s.append(&[rec(0), huge, rec(2)]).unwrap_err();
    assert!(matches!(e, SpoolError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("record limit"), "{e}");
    assert_eq!(
        (s.pending(), s.bytes()),
        (0, 0),
        "none of the batch written"
    );
    s.append(&[rec(0), rec(2)]).unwrap();
    drop(s);
    let (_, rep) = Spool::open(dir.path(), roomy).unwrap();
    assert_eq!((rep.pending, rep.truncated_bytes), (2, 0));
}

/// Offset in the segment where record `i` of `recs` (appended in one go) starts.
fn frame_offset(recs: &[SpoolRecord], i: usize) -> usize {
    recs[..i]
        .iter()
        .map(|r| FRAME as usize + r.encoded_len())
        .sum()
}

fn roomy() -> SpoolOptions {
    SpoolOptions {
        segment_bytes: 1 << 20,
        ..opts()
    }
}

#[test]
fn a_damaged_record_inside_a_segment_costs_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<_> = (0..4).map(rec).collect();
    {
        let (mut s, _) = Spool::open(dir.path(), roomy()).unwrap();
        s.append(&recs).unwrap();
    }
    let seg = dir.path().join(seg_name(1));
    let mut data = fs::read(&seg).unwrap();
    let len = data.len();
    // One flipped bit in the body of record 1 (of 4, all acknowledged).
    let at = frame_offset(&recs, 1) + FRAME as usize + 5;
    data[at] ^= 0x10;
    fs::write(&seg, &data).unwrap();
    let (mut s, rep) = Spool::open(dir.path(), roomy()).unwrap();
    assert_eq!((rep.pending, rep.truncated_bytes), (3, 0));
    let frame1 = FRAME + recs[1].encoded_len() as u64;
    assert_eq!((rep.corrupt_records, rep.corrupt_bytes), (1, frame1));
    assert_eq!(fs::metadata(&seg).unwrap().len(), len as u64, "nothing cut");
    // The damaged frame is kept for an operator.
    let from = frame_offset(&recs, 1);
    let copy = fs::read(scan::corrupt_path(dir.path(), 1, from as u64)).unwrap();
    assert_eq!(copy, data[from..from + frame1 as usize]);
    let want = vec![rec(0), rec(2), rec(3)];
    assert_eq!(drain(&mut s), want);
    // And again after a restart: the damage is skipped, nothing is counted twice.
    drop(s);
    let (mut s, rep) = Spool::open(dir.path(), roomy()).unwrap();
    assert_eq!((rep.pending, rep.corrupt_records), (0, 0));
    assert!(drain(&mut s).is_empty());
}

#[test]
fn a_damaged_length_sets_the_rest_of_the_segment_aside_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<_> = (0..4).map(rec).collect();
    {
        let (mut s, _) = Spool::open(dir.path(), roomy()).unwrap();
        s.append(&recs).unwrap();
    }
    let seg = dir.path().join(seg_name(1));
    let mut data = fs::read(&seg).unwrap();
    let len = data.len() as u64;
    // The length of record 1 now claims more bytes than the file holds.
    let at = frame_offset(&recs, 1);
    data[at + 2] ^= 0x01;
    fs::write(&seg, &data).unwrap();
    let (mut s, rep) = Spool::open(dir.path(), roomy()).unwrap();
    assert_eq!((rep.pending, rep.truncated_bytes), (1, 0));
    assert_eq!(rep.corrupt_bytes, len - at as u64);
    assert_eq!(fs::metadata(&seg).unwrap().len(), len, "nothing cut");
    let copy = fs::read(scan::corrupt_path(dir.path(), 1, at as u64)).unwrap();
    assert_eq!(copy, data[at..]);
    // Appends go on, in a new segment (behind the damage they could be taken for part of it).
    s.append(&[rec(9)]).unwrap();
    assert_eq!(s.active, 2);
    drop(s);
    let (mut s, rep) = Spool::open(dir.path(), roomy()).unwrap();
    assert_eq!((rep.pending, rep.corrupt_records), (2, 1));
    assert_eq!(drain(&mut s), vec![rec(0), rec(9)]);
}

#[test]
fn a_record_damaged_after_open_is_skipped_on_replay_not_retried_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<_> = (0..4).map(rec).collect();
    let (mut s, _) = Spool::open(dir.path(), roomy()).unwrap();
    s.append(&recs).unwrap();
    let seg = dir.path().join(seg_name(1));
    let mut data = fs::read(&seg).unwrap();
    let at = frame_offset(&recs, 1) + FRAME as usize + 5;
    data[at] ^= 0x10;
    fs::write(&seg, &data).unwrap();
    let b = s.read_batch(10, u64::MAX).unwrap();
    assert_eq!(b.records, vec![rec(0), rec(2), rec(3)]);
    assert_eq!((b.skipped, b.corrupt_records), (1, 1));
    assert_eq!(s.unread(), 0);
    // A failed delivery rewinds: the same batch again, the damage not counted twice.
    s.rewind();
    let b = s.read_batch(10, u64::MAX).unwrap();
    assert_eq!(b.records, vec![rec(0), rec(2), rec(3)]);
    assert_eq!((b.skipped, b.corrupt_records), (1, 0));
    s.commit(b.end, b.records.len() as u64 + b.skipped).unwrap();
    assert_eq!(
        s.pending(),
        0,
        "the damaged record settles, so spool mode can end"
    );
    // Its length damaged as well: the rest of the segment is set aside, and the count still
    // comes out right.
    let recs: Vec<_> = (10..14).map(rec).collect();
    s.append(&recs).unwrap();
    let b = s.read_batch(1, u64::MAX).unwrap();
    assert_eq!(b.records, vec![rec(10)]);
    let seg = dir.path().join(seg_name(b.end.segment));
    let mut data = fs::read(&seg).unwrap();
    data[b.end.offset as usize + 3] ^= 0x20;
    fs::write(&seg, &data).unwrap();
    let c = s.read_batch(10, u64::MAX).unwrap();
    assert_eq!((c.records.len(), c.skipped, c.corrupt_records), (0, 3, 1));
    s.commit(c.end, 4).unwrap();
    assert_eq!((s.pending(), s.unread()), (0, 0));
}

fn seg_files(dir: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".seg")?.parse().ok()
        })
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn a_commit_frees_delivered_segments_before_it_needs_new_disk_space() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, _) = Spool::open(dir.path(), opts()).unwrap();
    let recs: Vec<_> = (0..40).map(rec).collect();
    s.append(&recs).unwrap();
    let b = s.read_batch(30, u64::MAX).unwrap();
    assert!(b.end.segment > 2, "the batch spans segments");
    // Nothing new can be written (stands for a full disk): not the cursor, not a segment.
    let blocker = dir.path().join("cursor.tmp");
    fs::create_dir(&blocker).unwrap();
    let before = s.bytes();
    assert!(s.commit(b.end, 30).is_err());
    assert!(s.bytes() < before, "delivered segments freed first");
    assert_eq!(seg_files(dir.path())[0], b.end.segment);
    assert_eq!(
        s.pending(),
        30 + 10,
        "not counted delivered without the cursor"
    );
    // A crash here loses nothing undelivered: the stale cursor's segment is gone, so a
    // restart replays from the oldest one left (copies of delivered records at most).
    {
        let copy = tempfile::tempdir().unwrap();
        for id in seg_files(dir.path()) {
            fs::copy(
                dir.path().join(seg_name(id)),
                copy.path().join(seg_name(id)),
            )
            .unwrap();
        }
        fs::copy(dir.path().join("cursor"), copy.path().join("cursor")).ok();
        let (mut r, _) = Spool::open(copy.path(), opts()).unwrap();
        let got = drain(&mut r);
        assert!(
            got.ends_with(&recs[30..]) && recs.ends_with(&got),
            "{got:?}"
        );
    }
    // Or the retry succeeds once the disk has room.
    fs::remove_dir(&blocker).unwrap();
    s.commit(b.end, 30).unwrap();
    assert_eq!(s.pending(), 10);

    // Everything delivered: the active segment is retired too, before the cursor is written.
    let b = s.read_batch(100, u64::MAX).unwrap();
    assert_eq!(b.records, recs[30..]);
    fs::create_dir(&blocker).unwrap();
    assert!(s.commit(b.end, 10).is_err());
    assert_eq!(s.bytes(), 0, "every delivered byte freed");
    fs::remove_dir(&blocker).unwrap();
    s.commit(b.end, 10).unwrap();
    assert_eq!((s.pending(), s.unread()), (0, 0));
    s.append(&recs[..3]).unwrap();
    drop(s);
    let (mut s, rep) = Spool::open(dir.path(), opts()).unwrap();
    assert_eq!(rep.pending, 3);
    assert_eq!(drain(&mut s), recs[..3]);
}

#[test]
fn a_read_batch_is_bounded_by_bytes_and_holds_at_least_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, _) = Spool::open(dir.path(), roomy()).unwrap();
    let recs: Vec<_> = (0..10)
        .map(|i| SpoolRecord {
            value: vec![b'x'; 1000 + i],
            ..rec(i)
        })
        .collect();
    s.append(&recs).unwrap();
    let frame = |r: &SpoolRecord| FRAME + r.encoded_len() as u64;
    // Room for three and a half records: three.
    let bound = recs[..3].iter().map(frame).sum::<u64>() + frame(&recs[3]) / 2;
    let b = s.read_batch(100, bound).unwrap();
    assert_eq!(b.records.len(), 3);
    assert_eq!(b.records, recs[..3]);
    // A bound below one record still yields one, so the replayer always makes progress.
    let b = s.read_batch(100, 1).unwrap();
    assert_eq!(b.records, recs[3..4]);
    let b = s.read_batch(100, u64::MAX).unwrap();
    assert_eq!(b.records, recs[4..]);
    assert_eq!(s.unread(), 0);
}
