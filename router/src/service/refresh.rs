//! The refresh: the aggregates and the contextual model re-read from ClickHouse every
//! `refresh_period`, in the background; decisions never wait for it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use weft_http::prometheus::IntCounter;
use weft_store::Store;

use super::{Health, Service};
use crate::error::RouterError;
use crate::live::{Live, Rebuild};
use crate::metrics::RouterMetrics;
use crate::policy::PolicyConfig;
use crate::store::{OutcomeRow, OUTCOMES_PAGE};

/// How long an outcome stays in the overlay when the model's base never holds it: feedback
/// that joins no stored decision (an unknown decision, a candidate it did not offer) reaches
/// the aggregates but never the base, and held longer it would count twice. Twelve refreshes,
/// at least a minute, at most the window: an outcome whose feedback ingest stores later than
/// that counts late, from the aggregates, never twice for long.
pub(super) fn overlay_settle(refresh: Duration, window_s: u64) -> Duration {
    (refresh * 12)
        .max(Duration::from_secs(60))
        .min(Duration::from_secs(window_s))
}

/// Re-read this much before the last visible row at each refresh (rows of an insert in
/// flight become visible after their `ingested_at`); identities already learnt are skipped.
const VISIBILITY_MARGIN_US: i64 = 10_000_000;
/// The whole refresh at most (the aggregates, then the contextual model's part).
const REFRESH_TIMEOUT: Duration = Duration::from_secs(60);
/// The contextual model's part of a refresh (the new rows, then a step of a full rebuild)
/// at most. A rebuild that needs longer resumes at the next.
const MODEL_READ_BUDGET: Duration = Duration::from_secs(45);
/// Left of [`REFRESH_TIMEOUT`] after the model's deadline, whatever the aggregates took: a
/// page that arrives just before the deadline is still learnt (up to `OUTCOMES_PAGE` rows
/// parsed), then the aggregates are installed. Without it a slow aggregates read let the
/// refresh's timeout drop them at every try.
const MODEL_MARGIN: Duration = Duration::from_secs(5);
/// Incremental refreshes between two full rebuilds of the contextual model.
pub const REBUILD_EVERY: u32 = 60;

/// The model's deadline: its budget from `now` (once the aggregates are read), cut so that
/// [`MODEL_MARGIN`] remains before the refresh's deadline `outer`.
fn model_deadline(now: Instant, outer: Instant) -> Instant {
    let last = outer.checked_sub(MODEL_MARGIN).unwrap_or(outer);
    (now + MODEL_READ_BUDGET).min(last)
}

impl Health {
    /// A full rebuild is due: none was installed yet, [`REBUILD_EVERY`] incremental
    /// refreshes passed, or a row came out of the visibility order.
    fn rebuild_due(&self) -> bool {
        self.watermark.is_none() || self.since_rebuild >= REBUILD_EVERY || self.late
    }

    /// Book the contextual model's part of a refresh (`new`: the incremental read;
    /// `rebuilt`: the rebuild's step, `Some` where the incremental read resumes once a
    /// rebuild is installed, [`Rebuild::resume_point`]); its error, if either failed. An incremental refresh counts toward the
    /// next rebuild even when it failed or ran out of time: a read that never completes (a
    /// backlog longer than the budget) would otherwise never let the rebuild take over.
    fn settle_model(
        &mut self,
        full: bool,
        new: Result<(), RouterError>,
        rebuilt: Result<Option<i64>, RouterError>,
    ) -> Option<RouterError> {
        match &rebuilt {
            Ok(Some(resume)) => {
                self.since_rebuild = 0;
                self.late = false;
                self.rebuilt_at = std::time::Instant::now();
                // Not the highest of the two: the rebuild's resume point may lie behind the
                // watermark on purpose (`Rebuild::resume_point`).
                self.watermark = Some(*resume);
            }
            _ if !full => self.since_rebuild = self.since_rebuild.saturating_add(1),
            _ => {}
        }
        new.err().or(rebuilt.err())
    }

    /// Book a refresh: `Ok(model error)` when the aggregates were read (they are served
    /// fresh even when the model's part failed; that is counted and logged on its own, so
    /// decisions do not report `snapshot_stale` for it). `true` when the aggregates were.
    fn record(
        &mut self,
        read: Result<Option<RouterError>, RouterError>,
        metrics: &RouterMetrics,
    ) -> bool {
        match read {
            Ok(model_error) => {
                if let Some(e) = model_error {
                    metrics.model_errors.inc();
                    tracing::warn!(error = %e, "contextual model refresh failed; fresh aggregates served, the model resumes at the next refresh");
                }
                self.loaded_at = std::time::Instant::now();
                self.has_data = true;
                self.stale = false;
                self.last_error = None;
                metrics.refresh_ok.inc();
                true
            }
            Err(e) => {
                self.stale = true;
                self.last_error = Some(e.to_string());
                metrics.refresh_errors.inc();
                false
            }
        }
    }
}

/// Learn the rows visible since `since` (less the margin) into every tenant's base, page by
/// page (of `page` rows; `read(cursor)` reads the one after the cursor), as the rebuild
/// does: one page ending inside the visibility margin would otherwise be read again at
/// every refresh. Each page's highest visibility becomes the watermark, and a row out of
/// order marks the model late, in `health` as soon as the page is learnt: a read cut short
/// by the model's deadline or an error keeps its progress, and the next refresh resumes
/// after it. (Booked only at the end, a backlog longer than the budget was read again from
/// the same watermark at every refresh, never completing, and past `APPLIED_MAX` rows of a
/// tenant its oldest identities were forgotten and learnt twice.)
async fn catch_up<F, Fut, E>(
    live: &Live,
    pc: &PolicyConfig,
    health: &Mutex<Health>,
    rows_read: &IntCounter,
    (since, page): (i64, u64),
    mut read: F,
) -> Result<(), E>
where
    F: FnMut((i64, String)) -> Fut,
    Fut: Future<Output = Result<Vec<OutcomeRow>, E>>,
{
    let mut cursor = (since - VISIBILITY_MARGIN_US, String::new());
    loop {
        let rows = read(cursor.clone()).await?;
        let more = rows.len() as u64 >= page;
        let top = rows.iter().map(|r| r.visible_us).max();
        if let Some(last) = rows.last() {
            cursor = (last.visible_us, last.feedback_id.clone());
        }
        rows_read.inc_by(rows.len() as u64);
        let late = crate::live::off_the_runtime(|| {
            live.reconcile(&pc.learner, crate::live::observations(rows, pc))
        });
        {
            let mut h = health.lock();
            h.late |= late;
            if let Some(top) = top {
                h.watermark = Some(h.watermark.map_or(top, |w| w.max(top)));
            }
        }
        if !more {
            return Ok(());
        }
    }
}

impl Service {
    /// Read the aggregates, and the contextual model's new outcomes: incrementally (once
    /// there is a base), and a full rebuild (built off to the side, then installed) on the
    /// first refresh, every [`REBUILD_EVERY`] refreshes (so outcomes older than the window
    /// leave the model) and after a row came out of the visibility order. The rebuild
    /// resumes across refreshes: each advances it until [`MODEL_READ_BUDGET`] is spent, and
    /// it is installed once it has read the last page, while the base it will replace keeps
    /// learning the new rows. `Err` when the aggregates could not be read; `Ok(Some)` the
    /// model's error when only its part failed (the aggregates are installed all the same).
    /// `outer`: the refresh's deadline.
    pub(super) async fn read_all(
        &self,
        store: &Store,
        outer: Instant,
    ) -> Result<Option<RouterError>, RouterError> {
        let stats = crate::store::read_stats(
            store,
            &self.cfg.source,
            self.cfg.window_s,
            self.cfg.half_life_s,
            self.cfg.max_cells,
        )
        .await?;
        let (since, full) = {
            let h = self.health.lock();
            (h.watermark, h.rebuild_due())
        };
        // The model's part has a time budget of its own, ending before the refresh's: when
        // it fails, the aggregates just read are still served.
        let deadline = model_deadline(Instant::now(), outer);
        let new = match since {
            Some(since) => tokio::time::timeout_at(deadline, self.read_new(store, since))
                .await
                .unwrap_or(Err(RouterError::Timeout)),
            None => Ok(()),
        };
        // Advanced even when the new rows could not all be read: a backlog too long for the
        // budget is what the rebuild is for.
        let rebuilt = if full {
            self.advance_rebuild(store, deadline).await
        } else {
            Ok(None)
        };
        // Trimmed before the new aggregates are served, so nothing counts twice.
        self.overlay.trim(
            |t, id| self.live.holds(t, id),
            overlay_settle(self.cfg.refresh_period, self.cfg.window_s),
        );
        *self.snapshot.write() = Arc::new(stats);
        Ok(self.health.lock().settle_model(full, new, rebuilt))
    }

    /// Learn the rows visible since `since` into every tenant's base ([`catch_up`]).
    async fn read_new(&self, store: &Store, since: i64) -> Result<(), RouterError> {
        let window_s = self.cfg.window_s;
        catch_up(
            &self.live,
            &self.cfg.policy,
            &self.health,
            &self.metrics.refresh_rows,
            (since, OUTCOMES_PAGE),
            |after| async move {
                let after = (after.0, after.1.as_str());
                crate::store::read_outcomes(store, after, None, window_s, OUTCOMES_PAGE).await
            },
        )
        .await
        .map_err(RouterError::from)
    }

    /// Advance the full rebuild (started if none is under way) until `deadline`; once it
    /// has read the last page, install it: then `Some(the highest visibility it learnt)`.
    /// What it learnt stays for the next refresh when it runs out of time or fails.
    async fn advance_rebuild(
        &self,
        store: &Store,
        deadline: tokio::time::Instant,
    ) -> Result<Option<i64>, RouterError> {
        let pc = &self.cfg.policy;
        let window_s = self.cfg.window_s;
        // Held across the reads (one refresh at a time); a refresh cancelled by its timeout
        // leaves the rebuild as it was after its last whole page.
        let mut slot = self.rebuilding.lock().await;
        let rb = slot.get_or_insert_with(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
            let started = self.health.lock().watermark.map_or(now, |w| w.min(now));
            Rebuild::starting(started, window_s)
        });
        let done = rb
            .advance(pc, deadline, |asked| async move {
                crate::live::read_page(store, &asked, window_s).await
            })
            .await;
        self.metrics
            .rebuild_rows
            .set(i64::try_from(rb.rows()).unwrap_or(i64::MAX));
        match done {
            Ok(true) => {}
            Ok(false) => {
                self.metrics.rebuild_resumed.inc();
                tracing::info!(
                    rows = rb.rows(),
                    "contextual model rebuild continues at the next refresh"
                );
                return Ok(None);
            }
            Err(e) => {
                self.metrics.rebuild_errors.inc();
                return Err(e.into());
            }
        }
        let Some(rb) = slot.take() else {
            return Ok(None);
        };
        let resume = rb.resume_point();
        let fresh = rb.finish();
        // Serving anew replays the pending outcomes (O(slots²) each): not on an async worker.
        crate::live::off_the_runtime(|| self.live.install(&pc.learner, fresh));
        self.metrics.rebuild_rows.set(0);
        Ok(Some(resume))
    }

    /// Re-read ClickHouse once; on failure keep the last state and mark it stale.
    pub async fn refresh(&self, store: &Store) -> bool {
        let outer = Instant::now() + REFRESH_TIMEOUT;
        let read = tokio::time::timeout_at(outer, self.read_all(store, outer))
            .await
            .unwrap_or(Err(RouterError::Timeout));
        self.health.lock().record(read, &self.metrics)
    }

    /// Refresh forever, every `refresh_period` (returns at once when the period is zero).
    pub async fn refresh_loop(self: Arc<Self>, store: Store) {
        if self.cfg.refresh_period.is_zero() {
            return;
        }
        let mut tick = tokio::time::interval(self.cfg.refresh_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_ok = true;
        loop {
            tick.tick().await;
            let ok = self.refresh(&store).await;
            if was_ok && !ok {
                let err = self.health.lock().last_error.clone();
                tracing::warn!(error = ?err, "router snapshot refresh failed; serving the last snapshot");
            } else if ok && !was_ok {
                tracing::info!("router snapshot refresh recovered");
            }
            was_ok = ok;
        }
    }
}

#[cfg(test)]
mod tests;
