//! A full rebuild of every tenant's base from ClickHouse, page by page in visibility order,
//! resumable: a refresh advances it until its time budget is spent, and the next refresh
//! continues from the cursor where it stopped, so a rebuild longer than one refresh's budget
//! still completes (before, it started over at every refresh and never did).

use std::future::Future;

use tokio::time::Instant;

use super::{observations, Rebuilt};
use crate::policy::PolicyConfig;
use crate::store::{OutcomeRow, OUTCOMES_PAGE};

/// A full rebuild in progress: what it has learnt, and where it resumes.
pub struct Rebuild {
    fresh: Rebuilt,
    cursor: (i64, String),
    rows: u64,
    page: u64,
    started: i64,
}

impl Default for Rebuild {
    fn default() -> Self {
        Rebuild {
            fresh: Rebuilt::default(),
            cursor: (0, String::new()),
            rows: 0,
            page: OUTCOMES_PAGE,
            started: i64::MAX,
        }
    }
}

impl Rebuild {
    /// A rebuild begun when no row visible later can have a visibility below `started`
    /// (µs; the incremental watermark then, or the clock): see [`Rebuild::resume_point`].
    pub fn starting(started: i64) -> Self {
        Rebuild {
            started,
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

    /// The same rebuild over pages of `page` rows (the store reads [`OUTCOMES_PAGE`]).
    #[cfg(test)]
    pub(crate) fn paged(self, page: u64) -> Self {
        Rebuild { page, ..self }
    }

    /// The place (visibility µs, feedback id) after the last row learnt; the next page is
    /// read after it.
    pub fn cursor(&self) -> (i64, &str) {
        (self.cursor.0, &self.cursor.1)
    }

    /// Rows learnt so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Learn one page read after [`Rebuild::cursor`]; `true` when it was the last (not
    /// full).
    pub fn learn_page(&mut self, pc: &PolicyConfig, rows: Vec<OutcomeRow>) -> bool {
        let last = (rows.len() as u64) < self.page;
        if let Some(r) = rows.last() {
            self.cursor = (r.visible_us, r.feedback_id.clone());
        }
        self.rows += rows.len() as u64;
        self.fresh.learn(&pc.learner, observations(rows, pc));
        last
    }

    /// Read (`read(cursor)`) and learn pages until the last one (`Ok(true)`: [`finish`]
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
        F: FnMut((i64, String)) -> Fut,
        Fut: Future<Output = Result<Vec<OutcomeRow>, E>>,
    {
        loop {
            let page = read(self.cursor.clone());
            let rows = match tokio::time::timeout_at(deadline, page).await {
                Ok(rows) => rows?,
                Err(_) => return Ok(false),
            };
            if super::off_the_runtime(|| self.learn_page(pc, rows)) {
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

/// Every tenant's contextual model rebuilt from ClickHouse alone (the outcomes of the last
/// `window_s` seconds, in visibility order, page by page, without a time budget): what
/// `weft router snapshot` writes, and what every replica serves once all outcomes are
/// stored.
pub async fn rebuild(
    store: &weft_store::Store,
    pc: &PolicyConfig,
    window_s: u64,
) -> Result<Rebuilt, weft_store::StoreError> {
    let mut rb = Rebuild::default();
    loop {
        let rows = crate::store::read_outcomes(store, rb.cursor(), window_s).await?;
        if rb.learn_page(pc, rows) {
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
mod tests {
    use super::*;
    use std::time::Duration;

    /// A stored (decision, feedback) row of tenant `t`: candidate `a` or `b`, visible at `i`.
    fn row(i: i64) -> OutcomeRow {
        outcome_row(i, i)
    }

    /// The rows after `after` in the store `rows`, a page of at most `page`.
    fn page_of(rows: &[OutcomeRow], after: &(i64, String), page: usize) -> Vec<OutcomeRow> {
        rows.iter()
            .filter(|r| (r.visible_us, &r.feedback_id) > (after.0, &after.1))
            .take(page)
            .map(|r| row(r.visible_us))
            .collect()
    }

    /// With a budget spent after one page, every refresh advances the rebuild by a page
    /// while new outcomes keep arriving (one per refresh, fewer than a page), and it
    /// completes with exactly the model a one-shot rebuild of the same rows gives.
    #[tokio::test]
    async fn a_rebuild_longer_than_its_budget_resumes_and_converges() {
        let pc = PolicyConfig::default();
        let mut stored: Vec<OutcomeRow> = (0..9).map(row).collect();
        let mut rb = Rebuild::default().paged(3);
        let mut refreshes = 0;
        loop {
            refreshes += 1;
            assert!(refreshes < 20, "the rebuild does not converge");
            let now = Instant::now();
            let done = rb
                .advance(&pc, now, |after| {
                    std::future::ready(Ok::<_, ()>(page_of(&stored, &after, 3)))
                })
                .await
                .expect("pages are read");
            if done {
                break;
            }
            let n = stored.len() as i64;
            stored.push(row(n));
        }
        assert_eq!(rb.rows(), stored.len() as u64);
        assert!(refreshes >= 4, "one page per refresh: {refreshes}");
        let mut one_shot = Rebuilt::default();
        one_shot.learn(
            &pc.learner,
            observations(stored.iter().map(|r| row(r.visible_us)).collect(), &pc),
        );
        let fresh = rb.finish();
        assert_eq!(fresh.top, one_shot.top);
        assert_eq!(fresh.models(), one_shot.models());
        assert_eq!(fresh.models()["t"].updates, stored.len() as u64);
    }

    /// A page still being read when the budget runs out is given up, not what was learnt
    /// before it: the next refresh reads from the last row learnt.
    #[tokio::test]
    async fn a_page_that_outlasts_the_budget_keeps_what_was_learnt() {
        let pc = PolicyConfig::default();
        let stored: Vec<OutcomeRow> = (0..5).map(row).collect();
        let mut rb = Rebuild::default().paged(2);
        let mut calls = 0;
        let deadline = Instant::now() + Duration::from_millis(50);
        let done = rb
            .advance(&pc, deadline, |after| {
                calls += 1;
                let first = calls == 1;
                let page = page_of(&stored, &after, 2);
                async move {
                    if !first {
                        // ClickHouse slower than the budget.
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, ()>(page)
                }
            })
            .await
            .expect("no error");
        assert!(!done);
        assert_eq!((rb.rows(), rb.cursor()), (2, (1, "f0001")));
        let mut seen = Vec::new();
        let done = rb
            .advance(&pc, Instant::now() + Duration::from_secs(60), |after| {
                seen.push(after.clone());
                std::future::ready(Ok::<_, ()>(page_of(&stored, &after, 2)))
            })
            .await
            .expect("no error");
        assert!(done);
        assert_eq!(seen[0], (1, "f0001".to_owned()), "resumed at the cursor");
        assert_eq!(rb.finish().models()["t"].updates, 5);
    }
}
