use super::*;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::time::Duration;

/// A stored (decision, feedback) row of tenant `t`: candidate `a` or `b`, visible at `i`.
fn row(i: i64) -> OutcomeRow {
    outcome_row(i, i)
}

/// The page `asked` of the store `rows` (sorted by visibility, then id), as the store reads
/// it: the rows after the cursor and before the slice's end, at most a page.
fn page_of(rows: &[OutcomeRow], asked: &PageRequest) -> Vec<OutcomeRow> {
    let after = (asked.after.0, asked.after.1.as_str());
    rows.iter()
        .filter(|r| (r.visible_us, r.feedback_id.as_str()) > after)
        .filter(|r| asked.until.is_none_or(|u| r.visible_us < u))
        .take(asked.page as usize)
        .map(|r| outcome_row(r.feedback_id[1..].parse().unwrap_or(0), r.visible_us))
        .collect()
}

#[test]
fn a_slice_ends_after_its_cursor_and_is_open_once_it_reaches_now() {
    let s = Slices::spanning(10);
    assert_eq!(s.until(100, 0, 1_000), Some(110));
    assert_eq!(
        s.until(0, 500, 1_000),
        Some(510),
        "starts at the window's start"
    );
    assert_eq!(s.until(985, 0, 1_000), Some(995));
    assert_eq!(s.until(990, 0, 1_000), None, "reaches now: no bound");
    assert_eq!(
        Slices::spanning(0).until(5, 0, 1_000),
        Some(6),
        "never empty"
    );
    assert_eq!(Slices::spanning(i64::MAX).until(5, 0, i64::MAX), None);
}

#[test]
fn a_slice_grows_while_pages_come_back_small_and_halves_when_one_fills() {
    let mut s = Slices::spanning(1_000);
    s.after_page(0, 100);
    assert_eq!(s.span_us(), 2_000, "empty: twice as long");
    s.after_page(100, 100);
    assert_eq!(s.span_us(), 1_000, "full: half");
    s.after_page(25, 100);
    assert_eq!(s.span_us(), 2_000, "a quarter page: toward half a page");
    s.after_page(50, 100);
    assert_eq!(s.span_us(), 2_000, "half a page: kept");
    s.after_page(99, 100);
    assert_eq!(s.span_us(), 1_011, "nearly full: shorter");
    s.after_page(1, 100);
    assert_eq!(s.span_us(), 4_044, "one row: at most four times longer");
    let mut tiny = Slices::spanning(1);
    tiny.after_page(5, 5);
    assert_eq!(tiny.span_us(), 1, "at least a microsecond");
    let mut huge = Slices::spanning(i64::MAX / 2 + 1);
    huge.after_page(0, 5);
    assert_eq!(huge.span_us(), i64::MAX, "saturates");
}

/// Over slices far shorter than the rows' spread and pages of 3, clumps of rows at one
/// visibility (more than a page), rows on a slice's exact end and long empty stretches
/// are read exactly once each, in order, and the rebuild ends with the open slice.
#[tokio::test]
async fn a_sliced_rebuild_reads_every_row_once_in_order() {
    let mut vis: Vec<i64> = vec![0, 2, 2, 2, 2, 2, 3, 4, 6, 8, 9, 10, 10];
    vis.extend([1_000, 1_001, 50_000, 50_000, 50_002, 999_998, 999_999]);
    let stored: Vec<OutcomeRow> = vis
        .iter()
        .enumerate()
        .map(|(i, v)| outcome_row(i as i64, *v))
        .collect();
    let mut rb = Rebuild::over(1)
        .paged(3)
        .sliced(Slices::spanning(2))
        .clocked(|| 1_000_000);
    let mut read = Vec::new();
    let mut asked = Vec::new();
    let done = rb
        .advance(
            &PolicyConfig::default(),
            Instant::now() + Duration::from_secs(60),
            |a| {
                let page = page_of(&stored, &a);
                read.extend(page.iter().map(|r| (r.visible_us, r.feedback_id.clone())));
                asked.push(a);
                std::future::ready(Ok::<_, ()>(page))
            },
        )
        .await;
    assert_eq!(done, Ok(true));
    let want: Vec<_> = stored
        .iter()
        .map(|r| (r.visible_us, r.feedback_id.clone()))
        .collect();
    assert_eq!(read, want, "every row once, in order");
    assert_eq!(rb.rows(), stored.len() as u64);
    let last = asked.last().map(|a| a.until);
    assert_eq!(last, Some(None), "the last page is the open slice");
    assert!(
        asked.iter().any(|a| a.until == Some(2)),
        "a slice ended on rows visible at its end: {asked:?}"
    );
    assert!(
        asked.len() < 40,
        "long empty stretches cost few pages: {asked:?}"
    );
    assert_eq!(rb.finish().models()["t"].updates, stored.len() as u64);
}

/// With a budget spent after one page, every refresh advances the rebuild by a page
/// while new outcomes keep arriving (one per refresh, fewer than a page), and it
/// completes with exactly the model a one-shot rebuild of the same rows gives.
#[tokio::test]
async fn a_rebuild_longer_than_its_budget_resumes_and_converges() {
    // The clock: new rows are visible at it, so no slice ends past them.
    static NOW: AtomicI64 = AtomicI64::new(9);
    let pc = PolicyConfig::default();
    let mut stored: Vec<OutcomeRow> = (0..9).map(row).collect();
    let mut rb = Rebuild::over(1)
        .paged(3)
        .sliced(Slices::spanning(2))
        .clocked(|| NOW.load(Relaxed));
    let mut refreshes = 0;
    loop {
        refreshes += 1;
        assert!(refreshes < 30, "the rebuild does not converge");
        let now = Instant::now();
        let done = rb
            .advance(&pc, now, |asked| {
                std::future::ready(Ok::<_, ()>(page_of(&stored, &asked)))
            })
            .await
            .expect("pages are read");
        if done {
            break;
        }
        let n = stored.len() as i64;
        stored.push(row(n));
        NOW.store(n + 1, Relaxed);
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
        .advance(&pc, deadline, |asked| {
            calls += 1;
            let first = calls == 1;
            let page = page_of(&stored, &asked);
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
        .advance(&pc, Instant::now() + Duration::from_secs(60), |asked| {
            seen.push(asked.after.clone());
            std::future::ready(Ok::<_, ()>(page_of(&stored, &asked)))
        })
        .await
        .expect("no error");
    assert!(done);
    assert_eq!(seen[0], (1, "f0001".to_owned()), "resumed at the cursor");
    assert_eq!(rb.finish().models()["t"].updates, 5);
}
