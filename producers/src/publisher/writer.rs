//! The spool writer thread: group-commit appends, fsync per policy, resolve receipts.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use tracing::{error, warn};

use super::receipt::Delivery;
use super::state::{lock, Job, Shared};
use super::PublishError;
use crate::config::FsyncPolicy;
use crate::spool::{Spool, SpoolError, SpoolRecord};

pub(super) enum WriterMsg {
    Append(Job),
    Stop,
}

/// The spool writer: group-commit appends, fsync per policy, then resolve receipts.
pub(super) fn writer_loop(sh: Arc<Shared>, rx: mpsc::Receiver<WriterMsg>, fsync: FsyncPolicy) {
    let mut unsynced: Vec<Job> = Vec::new();
    let tick = match fsync {
        FsyncPolicy::Interval(d) => d.min(Duration::from_millis(100)),
        _ => Duration::from_millis(100),
    };
    let mut stop = false;
    while !stop {
        let first = match rx.recv_timeout(tick) {
            Ok(m) => Some(m),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                stop = true;
                None
            }
        };
        let mut batch = Vec::new();
        let mut bytes = 0u64;
        let mut next = first;
        while let Some(m) = next {
            match m {
                WriterMsg::Append(job) => {
                    bytes += job.size;
                    batch.push(job);
                }
                WriterMsg::Stop => stop = true,
            }
            if batch.len() >= 20_000 || bytes >= 8 << 20 {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !batch.is_empty() {
            append_batch(&sh, batch, fsync, &mut unsynced);
        }
        // Interval policy: sync when due; `stop` forces a final sync.
        if !unsynced.is_empty() {
            let res = {
                let mut sp = lock(&sh.spool);
                if stop {
                    sp.sync().map(|_| true)
                } else {
                    sp.sync_if_due()
                }
            };
            match res {
                Ok(true) => resolve_spooled(&sh, unsynced.drain(..)),
                Ok(false) => {}
                Err(e) => {
                    error!(error = %e, "spool fsync failed");
                    // The records were written but may not be durable, so their receipts
                    // fail (a retry only makes a copy, which consumers drop by identity).
                    // They are not settled: they stay in the spool, where they cannot be
                    // cut off (the replayer may have read or sent them already), and the
                    // replayer settles them once delivered. Settling them here as well
                    // would count them twice and keep spool mode from ever ending.
                    reply_failed(unsynced.drain(..), &e);
                }
            }
        }
    }
    // Anything that raced in after Stop is refused, never silently dropped.
    while let Ok(WriterMsg::Append(job)) = rx.try_recv() {
        fail_jobs(
            &sh,
            std::iter::once(job),
            &SpoolError::Corrupt("publisher closed"),
            1,
        );
    }
}

pub(super) fn append_batch(
    sh: &Shared,
    batch: Vec<Job>,
    fsync: FsyncPolicy,
    unsynced: &mut Vec<Job>,
) {
    let records: Vec<SpoolRecord> = batch.iter().map(|j| j.record.clone()).collect();
    let bytes: u64 = batch.iter().map(|j| j.size).sum();
    let n = batch.len();
    // Append the whole group; if it does not fit, the longest prefix that does (a later
    // event never lands when an earlier one was refused, so per-request order holds).
    let (res, refused) = {
        let mut sp = lock(&sh.spool);
        let mut res = sp.append(&records).map(|synced| (synced, n));
        if let Err(SpoolError::Full { used, max }) = res {
            let room = max.saturating_sub(used);
            let (mut k, mut acc) = (0, 0);
            for r in &records {
                acc += Spool::size_of(std::slice::from_ref(r));
                if acc > room {
                    break;
                }
                k += 1;
            }
            if k > 0 {
                res = sp.append(&records[..k]).map(|synced| (synced, k));
            }
        }
        sh.spool_bytes.store(sp.bytes(), Ordering::Relaxed);
        sh.metrics.spool_bytes.set(sp.bytes() as i64);
        sh.metrics.spool_pending.set(sp.pending() as i64);
        let refused = SpoolError::Full {
            used: sp.bytes(),
            max: sh.max_bytes,
        };
        (res, refused)
    };
    lock(&sh.state).queued_bytes -= bytes;
    match res {
        Ok((synced, k)) => {
            let mut batch = batch;
            let rest = batch.split_off(k);
            sh.metrics.spooled.inc_by(k as u64);
            sh.wake.notify_all();
            if synced || fsync == FsyncPolicy::Never {
                resolve_spooled(sh, batch.into_iter());
            } else {
                unsynced.extend(batch);
            }
            if !rest.is_empty() {
                warn!(events = rest.len(), "spool is full; refusing events");
                let m = rest.len() as u64;
                fail_jobs(sh, rest.into_iter(), &refused, m);
            }
        }
        Err(e) => {
            error!(error = %e, events = n, "could not spool events; their receipts fail");
            // A failed append leaves nothing in the spool: these are settled here, once.
            fail_jobs(sh, batch.into_iter(), &e, n as u64);
            if matches!(e, SpoolError::Io { .. }) {
                // The error may be the fsync of a rotation, which covered the unsynced
                // records of earlier appends too: they fail as after a failed interval
                // fsync, unsettled (see `writer_loop`).
                reply_failed(unsynced.drain(..), &e);
            }
        }
    }
}

pub(super) fn resolve_spooled(sh: &Shared, jobs: impl Iterator<Item = Job>) {
    for job in jobs {
        sh.metrics
            .publish_latency
            .observe(job.started.elapsed().as_secs_f64());
        if let Some(r) = job.reply {
            let _ = r.send(Ok(Delivery::Spooled));
        }
    }
}

/// Receipts of jobs that never reached the disk fail, and the jobs are settled: nothing of
/// them is left for the replayer.
pub(super) fn fail_jobs(sh: &Shared, jobs: impl Iterator<Item = Job>, e: &SpoolError, n: u64) {
    reply_failed(jobs, e);
    let mut st = lock(&sh.state);
    st.settled += n;
    sh.maybe_resume_direct(&mut st);
    drop(st);
    sh.changed.notify_all();
}

fn reply_failed(jobs: impl Iterator<Item = Job>, e: &SpoolError) {
    for job in jobs {
        if let Some(r) = job.reply {
            let _ = r.send(Err(match e {
                SpoolError::Full { used, max } => PublishError::SpoolFull {
                    used: *used,
                    max: *max,
                },
                other => PublishError::Spool(other.to_string()),
            }));
        }
    }
}
