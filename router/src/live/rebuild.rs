//! A full rebuild of every tenant's base from ClickHouse, page by page in visibility order,
//! resumable: a refresh advances it until its time budget is spent, and the next refresh
//! continues from the cursor where it stopped, so a rebuild longer than one refresh's budget
//! still completes (before, it started over at every refresh and never did).

use std::future::Future;

use tokio::time::Instant;

use super::{observations, Rebuilt};
use crate::policy::PolicyConfig;
use crate::store::{OutcomeRow, OUTCOMES_PAGE};

/// One page to read: the pairs after `after` ((visibility µs, feedback id), exclusive),
/// visible before `until` (µs, exclusive; `None`: no bound), at most `page` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// The cursor.
    pub after: (i64, String),
    /// The end of the slice of visibility time.
    pub until: Option<i64>,
    /// Rows at most.
    pub page: u64,
}

/// A rebuild's first slice of visibility time (µs): an hour.
const FIRST_SPAN_US: i64 = 3_600_000_000;
/// A slice grows at most this much from one page to the next, when its page held rows.
const MAX_GROWTH: f64 = 4.0;
/// A slice after an empty one is this much longer. Where the rows start after a long empty
/// stretch the slice is about as long as the stretch, so a larger factor overshoots: with
/// 4, the first slice reaching 1M pairs stored held 2.2 pages and took 5.5 s, against about
/// 2 s for the half-page slices that follow.
const EMPTY_GROWTH: f64 = 2.0;

/// How far past the cursor a rebuild page reads: the page's slice of visibility time. The
/// store reads only the rows of a slice (`weft_store::router::OUTCOMES_SQL`), so a page costs
/// about its rows whatever the window holds, as long as the slice holds about a page. It
/// grows while pages come back small and halves when one fills; correctness never depends
/// on it (a full page resumes at its last row, a short one at the slice's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slices {
    span_us: i64,
}

impl Default for Slices {
    fn default() -> Self {
        Slices {
            span_us: FIRST_SPAN_US,
        }
    }
}

impl Slices {
    /// Slices starting `span_us` long.
    pub fn spanning(span_us: i64) -> Self {
        Slices {
            span_us: span_us.max(1),
        }
    }

    /// The end (µs, exclusive) of the slice after a cursor at `from`, or `None` (no bound)
    /// once it reaches `now`: the last page reads up to the latest row, as the refresh's
    /// incremental read does. The slice starts at the window's start `window_start` when
    /// the cursor lies before it (no row is visible earlier), and always ends after `from`.
    pub fn until(&self, from: i64, window_start: i64, now: i64) -> Option<i64> {
        let end = from.max(window_start).saturating_add(self.span_us);
        (end < now).then_some(end)
    }

    /// Adapt to a page of `rows` read with a limit of `page`: half the span when it filled
    /// (the slice held more than a page), [`EMPTY_GROWTH`] times longer when it was empty,
    /// else scaled toward half a page of rows (at most [`MAX_GROWTH`] times longer, at
    /// least half as long).
    pub fn after_page(&mut self, rows: u64, page: u64) {
        let span = self.span_us as f64;
        let next = if rows >= page {
            span / 2.0
        } else if rows == 0 {
            span * EMPTY_GROWTH
        } else {
            let target = page as f64 / 2.0;
            span * (target / rows as f64).clamp(0.5, MAX_GROWTH)
        };
        // Rounded up, so that a span of a few µs still grows; `as` saturates (a span past
        // i64::MAX µs is no bound anyway).
        self.span_us = (next.ceil() as i64).max(1);
    }

    /// The current span (µs).
    pub fn span_us(&self) -> i64 {
        self.span_us
    }
}

/// Microseconds since the Unix epoch on this host's clock.
fn clock_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A full rebuild in progress: what it has learnt, and where it resumes.
pub struct Rebuild {
    fresh: Rebuilt,
    cursor: (i64, String),
    rows: u64,
    page: u64,
    started: i64,
    slices: Slices,
    window_us: i64,
    clock: fn() -> i64,
}

impl Default for Rebuild {
    fn default() -> Self {
        Rebuild {
            fresh: Rebuilt::default(),
            cursor: (0, String::new()),
            rows: 0,
            page: OUTCOMES_PAGE,
            started: i64::MAX,
            slices: Slices::default(),
            window_us: i64::MAX,
            clock: clock_us,
        }
    }
}

impl Rebuild {
    /// A rebuild of the last `window_s` seconds begun when no row visible later can have a
    /// visibility below `started` (µs; the incremental watermark then, or the clock): see
    /// [`Rebuild::resume_point`].
    pub fn starting(started: i64, window_s: u64) -> Self {
        Rebuild {
            started,
            ..Rebuild::over(window_s)
        }
    }

    /// A rebuild of the last `window_s` seconds (the rows' feedback ingested then): its
    /// first slice starts there.
    pub fn over(window_s: u64) -> Self {
        Rebuild {
            window_us: i64::try_from(window_s)
                .unwrap_or(i64::MAX)
                .saturating_mul(1_000_000),
            ..Rebuild::default()
        }
    }

    /// Where the incremental read resumes once this rebuild is installed. A row that became visible while the rebuild ran, behind the
    /// page that covered its place (an insert in flight), is missing from it: the base it
    /// replaces learnt the row, the rebuild never saw it. So the read resumes from the
    /// rebuild's start, not its top; rows learnt already are skipped by identity.
    pub fn resume_point(&self) -> i64 {
        match self.fresh.top.unwrap_or(i64::MAX).min(self.started) {
            i64::MAX => 0,
            t => t,
        }
    }

    /// The same rebuild over pages of `page` rows (by default [`OUTCOMES_PAGE`]; smaller
    /// for tests, which check that the pages give the rows of one read).
    pub fn paged(self, page: u64) -> Self {
        Rebuild {
            page: page.max(1),
            ..self
        }
    }

    /// The same rebuild with slices starting as `slices` (for tests, as [`Rebuild::paged`]).
    pub fn sliced(self, slices: Slices) -> Self {
        Rebuild { slices, ..self }
    }

    /// The same rebuild on the clock `clock` (µs).
    #[cfg(test)]
    pub(crate) fn clocked(self, clock: fn() -> i64) -> Self {
        Rebuild { clock, ..self }
    }

    /// The next page to read now ([`Rebuild::next_page`] on the rebuild's clock).
    pub fn next_page_now(&self) -> PageRequest {
        self.next_page((self.clock)())
    }

    /// The place (visibility µs, feedback id) after the last row learnt, or the end of the
    /// last slice read whole; the next page is read after it.
    pub fn cursor(&self) -> (i64, &str) {
        (self.cursor.0, &self.cursor.1)
    }

    /// Rows learnt so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The next page to read, at `now` (µs).
    pub fn next_page(&self, now: i64) -> PageRequest {
        PageRequest {
            after: self.cursor.clone(),
            until: self
                .slices
                .until(self.cursor.0, now.saturating_sub(self.window_us), now),
            page: self.page,
        }
    }

    /// Learn one page read for `asked` ([`Rebuild::next_page`]); `true` when it was the
    /// last: it held fewer rows than asked and its slice had no end. A short page of a
    /// bounded slice read every row of it, so the cursor moves to the slice's end, and
    /// an empty slice still makes progress.
    pub fn learn_page(
        &mut self,
        pc: &PolicyConfig,
        asked: &PageRequest,
        rows: Vec<OutcomeRow>,
    ) -> bool {
        let n = rows.len() as u64;
        if let Some(r) = rows.last() {
            self.cursor = (r.visible_us, r.feedback_id.clone());
        }
        self.rows += n;
        self.slices.after_page(n, asked.page);
        self.fresh.learn(&pc.learner, observations(rows, pc));
        if n >= asked.page {
            return false;
        }
        match asked.until {
            Some(end) => {
                self.cursor = (end, String::new());
                false
            }
            None => true,
        }
    }

    /// Read (`read(page)`) and learn pages until the last one (`Ok(true)`: [`finish`]
    /// it) or until `deadline` (`Ok(false)`: call again later; a page still being read at
    /// the deadline is dropped and read again then). On an error what was learnt stays.
    ///
    /// [`finish`]: Rebuild::finish
    pub async fn advance<F, Fut, E>(
        &mut self,
        pc: &PolicyConfig,
        deadline: Instant,
        mut read: F,
    ) -> Result<bool, E>
    where
        F: FnMut(PageRequest) -> Fut,
        Fut: Future<Output = Result<Vec<OutcomeRow>, E>>,
    {
        loop {
            let asked = self.next_page_now();
            let page = read(asked.clone());
            let rows = match tokio::time::timeout_at(deadline, page).await {
                Ok(rows) => rows?,
                Err(_) => return Ok(false),
            };
            if super::off_the_runtime(|| self.learn_page(pc, &asked, rows)) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }

    /// The rebuilt bases, to be [`super::Live::install`]ed.
    pub fn finish(self) -> Rebuilt {
        self.fresh
    }
}

/// Read the page `asked` of the pairs of the last `window_s` seconds
/// ([`crate::store::read_outcomes`]).
pub async fn read_page(
    store: &weft_store::Store,
    asked: &PageRequest,
    window_s: u64,
) -> Result<Vec<OutcomeRow>, weft_store::StoreError> {
    let after = (asked.after.0, asked.after.1.as_str());
    crate::store::read_outcomes(store, after, asked.until, window_s, asked.page).await
}

/// Every tenant's contextual model rebuilt from ClickHouse alone (the outcomes of the last
/// `window_s` seconds, in visibility order, page by page, without a time budget): what
/// `weft router snapshot` writes, and what every replica serves once all outcomes are
/// stored.
pub async fn rebuild(
    store: &weft_store::Store,
    pc: &PolicyConfig,
    window_s: u64,
) -> Result<Rebuilt, weft_store::StoreError> {
    let mut rb = Rebuild::over(window_s);
    loop {
        let asked = rb.next_page_now();
        let rows = read_page(store, &asked, window_s).await?;
        if rb.learn_page(pc, &asked, rows) {
            return Ok(rb.finish());
        }
    }
}

/// A stored (decision, feedback) row of tenant `t` for tests: decision `d{i}` chose `a` or
/// `b` (every third), a gold or free tier, succeeded but every fourth; visible at
/// `visible_us`.
#[cfg(test)]
pub(crate) fn outcome_row(i: i64, visible_us: i64) -> OutcomeRow {
    let cand = if i % 3 == 0 { "b" } else { "a" };
    let decision = serde_json::json!({"decision_id": format!("d{i}"),
        "candidate": {"candidate_id": cand, "candidate_type": "tool"},
        "metadata": {"x_weft_features": {"tier": if i % 2 == 0 { "gold" } else { "free" }}}});
    let feedback = serde_json::json!({"decision_id": format!("d{i}"), "candidate_id": cand,
        "success": i % 4 != 0, "latency_ms": 100 + i});
    OutcomeRow {
        tenant: "t".into(),
        feedback_id: format!("f{i:04}"),
        visible_us,
        decision: decision.to_string(),
        feedback: feedback.to_string(),
    }
}

#[cfg(test)]
mod tests;
