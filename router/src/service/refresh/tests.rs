use super::*;
use crate::live::observations;
use crate::metrics::RouterMetrics;

/// A stored (decision, feedback) row of tenant `t`, visible `s` seconds into the window.
fn row(s: i64) -> OutcomeRow {
    crate::live::outcome_row(s, s * 1_000_000)
}

/// The rows after `after` in the store `rows`, a page of at most `page`.
fn page_of(rows: &[i64], after: &(i64, String), page: usize) -> Vec<OutcomeRow> {
    rows.iter()
        .map(|s| row(*s))
        .filter(|r| (r.visible_us, &r.feedback_id) > (after.0, &after.1))
        .take(page)
        .collect()
}

/// The page `asked` of a rebuild over the store `rows`.
fn slice_of(rows: &[i64], asked: &crate::live::PageRequest) -> Vec<OutcomeRow> {
    page_of(rows, &asked.after, asked.page as usize)
        .into_iter()
        .filter(|r| asked.until.is_none_or(|u| r.visible_us < u))
        .collect()
}

/// A backlog that takes longer than the model's budget: what the read learnt before the
/// deadline stays booked (watermark, late), the next refresh resumes after it, and every
/// outcome is learnt once.
#[tokio::test]
async fn an_incremental_read_cut_short_keeps_its_progress() {
    let pc = PolicyConfig::default();
    let live = Live::default();
    let rows_read = RouterMetrics::default().refresh_rows;
    // The base learnt up to 100 s; a row at 95 s became visible after it (late), and the
    // backlog runs from 101 s to 130 s.
    live.reconcile(&pc.learner, observations(vec![row(100)], &pc));
    let stored: Vec<i64> = [95, 100].into_iter().chain(101..=130).collect();
    let health = Mutex::new(Health::new(true));
    health.lock().watermark = Some(100_000_000);
    let mut calls = 0;
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        catch_up(&live, &pc, &health, &rows_read, (100_000_000, 3), |after| {
            calls += 1;
            let first = calls == 1;
            let page = page_of(&stored, &after, 3);
            async move {
                if !first {
                    // ClickHouse slower than what is left of the budget.
                    std::future::pending::<()>().await;
                }
                Ok::<_, ()>(page)
            }
        }),
    )
    .await;
    assert!(cut.is_err(), "the read ran out of time");
    {
        let h = health.lock();
        assert_eq!(h.watermark, Some(101_000_000), "the first page is booked");
        assert!(h.late, "its late row is booked");
    }
    assert_eq!(rows_read.get(), 3);
    let mut seen = Vec::new();
    let since = health.lock().watermark.unwrap_or(0);
    catch_up(&live, &pc, &health, &rows_read, (since, 3), |after| {
        seen.push(after.clone());
        std::future::ready(Ok::<_, ()>(page_of(&stored, &after, 3)))
    })
    .await
    .expect("no error");
    assert_eq!(
        seen[0],
        (101_000_000 - VISIBILITY_MARGIN_US, String::new()),
        "resumed after the page learnt"
    );
    assert_eq!(health.lock().watermark, Some(130_000_000));
    assert_eq!(live.served("t").updates, stored.len() as u64, "each once");
}

/// An incremental read that keeps failing (or running out of time) still counts toward
/// the next full rebuild, whose step then runs; once installed, the count starts over.
#[test]
fn failed_incremental_reads_count_toward_the_next_rebuild() {
    let mut h = Health::new(true);
    h.watermark = Some(1);
    for i in 0..REBUILD_EVERY {
        assert!(!h.rebuild_due(), "due after {i} failed reads");
        let e = h.settle_model(false, Err(RouterError::Timeout), Ok(None));
        assert!(matches!(e, Some(RouterError::Timeout)), "{e:?}");
    }
    assert!(h.rebuild_due(), "a rebuild takes over");
    let e = h.settle_model(true, Err(RouterError::Timeout), Ok(Some(5)));
    assert!(
        e.is_some(),
        "the incremental read's error is still reported"
    );
    assert!(!h.rebuild_due());
    assert_eq!((h.since_rebuild, h.watermark), (0, Some(5)));
}

/// However long the aggregates took, the model's deadline leaves [`MODEL_MARGIN`] before
/// the refresh's, so the aggregates read are installed before the refresh times out.
#[test]
fn the_model_deadline_leaves_time_to_install_the_aggregates() {
    let start = Instant::now();
    let outer = start + REFRESH_TIMEOUT;
    let fast = start + Duration::from_secs(1);
    assert_eq!(model_deadline(fast, outer), fast + MODEL_READ_BUDGET);
    for secs in [16, 20, 54, 55, 59, 60] {
        let now = start + Duration::from_secs(secs);
        let deadline = model_deadline(now, outer);
        assert!(
            deadline + MODEL_MARGIN <= outer,
            "aggregates read in {secs} s: the model's part ends {:?} before the timeout",
            outer.saturating_duration_since(deadline)
        );
    }
}

/// A refresh whose aggregates were read but whose model's part failed serves them fresh
/// (no `snapshot_stale`), and counts the model's failure on its own.
#[test]
fn a_failed_model_part_leaves_the_aggregates_fresh() {
    let m = RouterMetrics::default();
    let mut h = Health::new(false);
    h.stale = true;
    assert!(h.record(Ok(Some(RouterError::Timeout)), &m));
    assert!(!h.stale && h.has_data && h.last_error.is_none());
    assert_eq!(
        (
            m.refresh_ok.get(),
            m.refresh_errors.get(),
            m.model_errors.get()
        ),
        (1, 0, 1)
    );
    assert!(h.record(Ok(None), &m));
    assert_eq!(m.model_errors.get(), 1);
    assert!(!h.record(Err(RouterError::Timeout), &m), "no aggregates");
    assert!(h.stale);
    assert_eq!(m.refresh_errors.get(), 1);
}

/// A row that becomes visible while a rebuild runs, behind the page that covered its place
/// (an insert in flight), is learnt by the base the rebuild replaces, not by the rebuild;
/// the incremental read resumes from the rebuild's start after the install, so the row is
/// learnt again, and every row once. (Resuming from the rebuild's top, it was missing from
/// the model until the next rebuild, 60 refreshes later.)
#[tokio::test]
async fn a_row_landing_behind_a_rebuild_under_way_is_learnt_after_its_install() {
    let pc = PolicyConfig::default();
    let live = Live::default();
    let rows_read = RouterMetrics::default().refresh_rows;
    let health = Mutex::new(Health::new(true));
    let mut stored: Vec<i64> = vec![100, 140, 160, 180, 200];
    // The base is up to date with the first row; the rebuild starts (as refresh does)
    // at its watermark.
    live.reconcile(&pc.learner, observations(vec![row(100)], &pc));
    health.lock().watermark = Some(100_000_000);
    let mut rb = Rebuild::starting(100_000_000, 604_800).paged(3);
    let one_page = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut calls = 0;
    let done = rb
        .advance(&pc, one_page, |asked| {
            calls += 1;
            let page = slice_of(&stored, &asked);
            async move {
                if calls > 1 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, ()>(page)
            }
        })
        .await;
    assert_eq!(
        done,
        Ok(false),
        "one page read, the rest at the next refresh"
    );
    // A row at 120 s becomes visible now, behind the page that ended at 160 s; the
    // incremental read of the old base learns it.
    stored.insert(1, 120);
    let since = health.lock().watermark.unwrap_or(0);
    catch_up(&live, &pc, &health, &rows_read, (since, 1000), |after| {
        std::future::ready(Ok::<_, ()>(page_of(&stored, &after, 1000)))
    })
    .await
    .expect("no error");
    // The rebuild reads its last page and is installed.
    let done = rb
        .advance(
            &pc,
            tokio::time::Instant::now() + Duration::from_secs(5),
            |asked| std::future::ready(Ok::<_, ()>(slice_of(&stored, &asked))),
        )
        .await;
    assert_eq!(done, Ok(true));
    let resume = rb.resume_point();
    live.install(&pc.learner, rb.finish());
    health.lock().settle_model(true, Ok(()), Ok(Some(resume)));
    assert_eq!(
        health.lock().watermark,
        Some(100_000_000),
        "resumes from the start"
    );
    let since = health.lock().watermark.unwrap_or(0);
    catch_up(&live, &pc, &health, &rows_read, (since, 1000), |after| {
        std::future::ready(Ok::<_, ()>(page_of(&stored, &after, 1000)))
    })
    .await
    .expect("no error");
    assert_eq!(
        live.served("t").updates,
        stored.len() as u64,
        "each row once"
    );
}
