//! The router's read of (decision, feedback) pairs (`read_outcomes`, each side read from
//! the slice of time `[cursor, until)` only) gives, on the real ClickHouse, the rows of the
//! plain join of the whole window: read open-ended from any cursor (the incremental
//! refresh), and paged through the window by a rebuild (slices and pages far smaller than
//! the rows, and slices ending on every row's exact `ingested_at`), whatever the order the
//! two halves of a pair were stored in, for orphans, another tenant and conflict rows.

mod common;

use common::pipeline::Pipeline;
use weft_router::live::{read_page, PageRequest, Rebuild, Slices};
use weft_router::policy::PolicyConfig;
use weft_store::router::{read_outcomes, OutcomeRow};
use weft_store::Store;

/// The reference: feedback joined with its decision by (tenant, decision id) over the
/// whole window (`?` s, and twice it for the decisions), then the cursor `(?, ?)`, in its
/// order, one row per feedback identity (what a rebuild's page read before slices).
const WHOLE_JOIN_SQL: &str = "SELECT f.tenant AS tenant, f.id AS feedback_id,
        toUnixTimestamp64Micro(greatest(f.ingested_at, d.ingested_at)) AS visible_us,
        d.payload AS decision, f.payload AS feedback
 FROM (SELECT tenant, id, ingested_at, payload,
              JSONExtractString(payload, 'decision_id') AS did
       FROM weft_events
       WHERE kind = 'execution_feedback' AND conflict = 0
         AND ingested_at >= now64(6) - toIntervalSecond(?)) AS f
 INNER JOIN (SELECT tenant, id, ingested_at, payload FROM weft_events
       WHERE kind = 'execution_routing_decision' AND conflict = 0
         AND ingested_at >= now64(6) - toIntervalSecond(?)) AS d
   ON f.tenant = d.tenant AND f.did = d.id
 WHERE (visible_us, feedback_id) > (?, ?)
 ORDER BY visible_us, feedback_id
 LIMIT 1 BY feedback_id";

/// A pair as (tenant, feedback id, visibility, decision, feedback).
type Key = (String, String, i64, String, String);

fn keys(rows: &[OutcomeRow]) -> Vec<Key> {
    rows.iter()
        .map(|r| {
            let (t, f) = (r.tenant.clone(), r.feedback_id.clone());
            (t, f, r.visible_us, r.decision.clone(), r.feedback.clone())
        })
        .collect()
}

async fn whole_join(store: &Store, after: (i64, &str), window: u64) -> Vec<OutcomeRow> {
    let q = store.client().query(WHOLE_JOIN_SQL);
    q.bind(window)
        .bind(window * 2)
        .bind(after.0)
        .bind(after.1)
        .fetch_all()
        .await
        .unwrap()
}

/// The rows of a whole rebuild through the router's own slicing: pages of `page` rows,
/// slices starting `span_us` long; and the number of pages read.
async fn rebuilt(store: &Store, window: u64, page: u64, span_us: i64) -> (Vec<Key>, usize) {
    let pc = PolicyConfig::default();
    let mut rb = Rebuild::over(window)
        .paged(page)
        .sliced(Slices::spanning(span_us));
    let (mut out, mut pages) = (Vec::new(), 0);
    loop {
        pages += 1;
        assert!(pages < 5_000, "the rebuild does not end");
        let asked = rb.next_page_now();
        let rows = read_page(store, &asked, window).await.unwrap();
        out.extend(keys(&rows));
        if rb.learn_page(&pc, &asked, rows) {
            return (out, pages);
        }
    }
}

/// The rows read through slices ending on each of `ends` in turn (then open), pages of
/// `page` rows, the cursor moving as a rebuild's does.
async fn through(store: &Store, window: u64, page: u64, ends: &[i64]) -> Vec<Key> {
    let pc = PolicyConfig::default();
    let mut rb = Rebuild::over(window).paged(page);
    let mut out = Vec::new();
    let mut ends = ends.iter().copied().peekable();
    loop {
        while ends.next_if(|e| *e <= rb.cursor().0).is_some() {}
        let (at, id) = rb.cursor();
        let asked = PageRequest {
            after: (at, id.to_owned()),
            until: ends.peek().copied(),
            page,
        };
        let rows = read_page(store, &asked, window).await.unwrap();
        out.extend(keys(&rows));
        if rb.learn_page(&pc, &asked, rows) {
            return out;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_gives_the_rows_of_the_whole_join() {
    let p = Pipeline::new("it_routeroutcomes");
    // 300 decisions and their feedback, one minute apart going back from now: pairs with
    // i % 3 == 0 had their decision stored 30 s after the feedback, i % 3 == 1 30 s
    // before, i % 3 == 2 in the same microsecond; every 7th feedback names a decision
    // never stored, every 11th decision is of another tenant (no pair), and every 13th
    // feedback is a conflict row (not read). 60 pairs of another tenant interleave, their
    // decisions stored 10 s after their feedback.
    let insert = |kind: &str,
                  id: &str,
                  offset_s: &str,
                  payload: &str,
                  tenant: &str,
                  conflict: &str,
                  n: u32| {
        format!(
            "INSERT INTO weft_events (tenant, kind, id, ts, ingested_at, conflict, topic, partition, \
             offset, payload) WITH toDateTime64('{{NOW}}', 6, 'UTC') AS now \
             SELECT {tenant}, '{kind}', concat('{id}', toString(number)), \
             now, now - toIntervalMicrosecond(toInt64(({offset_s}) * 1000000)), {conflict}, 't', 0, number, {payload} \
             FROM numbers({n})"
        )
    };
    let ch = p.client();
    let now = ch
        .query("SELECT toString(now64(6))")
        .fetch_one::<String>()
        .await
        .unwrap();
    let inserts = [
        insert(
            "execution_routing_decision",
            "d",
            "(300 - number) * 60 + multiIf(number % 3 = 0, -30, number % 3 = 1, 30, 0)",
            "concat('{\"decision_id\":\"d', toString(number), '\"}')",
            "if(number % 11 = 0, 'globex', 'acme')",
            "0",
            300,
        ),
        insert(
            "execution_feedback",
            "f",
            "(300 - number) * 60",
            "concat('{\"decision_id\":\"', if(number % 7 = 0, 'nowhere', concat('d', toString(number))), '\",\"success\":true}')",
            "'acme'",
            "if(number % 13 = 0, 1, 0)",
            300,
        ),
        insert(
            "execution_routing_decision",
            "gd",
            "(300 - number * 5) * 60 - 20.5",
            "concat('{\"decision_id\":\"gd', toString(number), '\"}')",
            "'globex'",
            "0",
            60,
        ),
        insert(
            "execution_feedback",
            "gf",
            "(300 - number * 5) * 60 - 10.5",
            "concat('{\"decision_id\":\"gd', toString(number), '\"}')",
            "'globex'",
            "0",
            60,
        ),
    ];
    for sql in inserts {
        ch.query(&sql.replace("{NOW}", &now))
            .execute()
            .await
            .unwrap();
    }

    let store = p.store();
    let window = 7 * 86_400;
    let all = whole_join(&store, (0, ""), window).await;
    let pairs = (0..300)
        .filter(|i| i % 7 != 0 && i % 11 != 0 && i % 13 != 0)
        .count();
    assert_eq!(all.len(), pairs + 60, "every pair once, and nothing else");
    assert!(all
        .windows(2)
        .all(|w| (w[0].visible_us, &w[0].feedback_id) < (w[1].visible_us, &w[1].feedback_id)));
    let all = keys(&all);

    // A rebuild through the router's own slices and pages: tiny slices, pages of one row,
    // pages and slices of about the rows' spacing, one page for everything.
    for (page, span_us) in [
        (7, 1_000_000),
        (1, 600_000_000),
        (50, 1),
        (10_000, 3_600_000_000),
    ] {
        let (got, pages) = rebuilt(&store, window, page, span_us).await;
        assert_eq!(got, all, "pages of {page}, slices from {span_us} µs");
        assert!(pages > 1 || page >= 10_000, "{pages} pages");
    }

    // Slices ending on every row's exact ingest time (the rows' visibilities, and the
    // first-stored halves of the pairs), with pages larger and smaller than a slice: a
    // bound off by one microsecond reads a row twice or never.
    let ends = ch
        .query(
            "SELECT DISTINCT toUnixTimestamp64Micro(ingested_at) AS t FROM weft_events ORDER BY t",
        )
        .fetch_all::<i64>()
        .await
        .unwrap();
    assert!(ends.len() > 500, "{} ingest times", ends.len());
    let got = through(&store, window, 1_000, &ends).await;
    assert_eq!(got, all, "slices on every ingest time");
    let every_third: Vec<i64> = ends.iter().copied().step_by(3).collect();
    let got = through(&store, window, 2, &every_third).await;
    assert_eq!(got, all, "slices on every third ingest time, pages of 2");

    // The incremental read (open-ended) from cursors before everything; on the exact
    // visibility of a pair made visible by its feedback, of one made visible by its
    // decision, and of one whose halves were stored together (both tie-breaks); in the
    // last minutes; after everything.
    let n = |k: &Key| k.1.trim_start_matches('f').parse::<u64>().ok();
    let half = &all[all.len() / 2..];
    let find = |rest: u64| half.iter().find(|k| n(k).is_some_and(|i| i % 3 == rest));
    let mut cursors = vec![(0, String::new())];
    let picked = [
        find(1),
        find(0),
        find(2),
        all.get(all.len() - 5),
        all.last(),
    ];
    for k in picked.into_iter().map(Option::unwrap) {
        cursors.push((k.2, String::new()));
        cursors.push((k.2, k.1.clone()));
        cursors.push((k.2 - 1, String::new()));
    }
    for (us, id) in cursors {
        let whole = keys(&whole_join(&store, (us, &id), window).await);
        let new = read_outcomes(&store, (us, &id), None, window, 200_000)
            .await
            .unwrap();
        assert_eq!(keys(&new), whole, "after ({us}, {id:?})");
    }
    // Both halves of the rule are exercised: after the middle, pairs made visible by their
    // decision (stored after the feedback) and by their feedback.
    let after = read_outcomes(&store, (all[all.len() / 2].2, ""), None, window, 200_000)
        .await
        .unwrap();
    let after = keys(&after);
    assert!(after.iter().any(|k| n(k).is_some_and(|i| i % 3 == 0)));
    assert!(after.iter().any(|k| n(k).is_some_and(|i| i % 3 == 1)));
}

/// `read_logged` (what `weft eval` reads) joins a decision to the feedback naming its choice,
/// even when a fallback's feedback is dated earlier; a decision answered only by a fallback
/// keeps that feedback (evaluation sets it aside), and one with none is counted missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_decision_keeps_its_choices_feedback_over_an_earlier_fallbacks() {
    let p = Pipeline::new("it_routerlogged");
    let ch = p.client();
    // (kind, id, seconds before now, payload)
    let rows = [
        (
            "execution_routing_decision",
            "d1",
            100,
            r#"{"decision_id":"d1","candidate":{"candidate_id":"a"}}"#,
        ),
        (
            "execution_routing_decision",
            "d2",
            100,
            r#"{"decision_id":"d2","candidate":{"candidate_id":"a"}}"#,
        ),
        (
            "execution_routing_decision",
            "d3",
            100,
            r#"{"decision_id":"d3","candidate":{"candidate_id":"a"}}"#,
        ),
        // d1: the fallback b answered first, then the choice a (its failure).
        (
            "execution_feedback",
            "f1b",
            90,
            r#"{"decision_id":"d1","candidate_id":"b","success":true}"#,
        ),
        (
            "execution_feedback",
            "f1a",
            80,
            r#"{"decision_id":"d1","candidate_id":"a","success":false}"#,
        ),
        // d2: only the fallback answered.
        (
            "execution_feedback",
            "f2b",
            90,
            r#"{"decision_id":"d2","candidate_id":"b","success":true}"#,
        ),
    ];
    for (kind, id, ago, payload) in rows {
        ch.query(
            "INSERT INTO weft_events (tenant, kind, id, ts, ingested_at, conflict, topic, partition, offset, payload) \
             SELECT 'acme', ?, ?, now64(6) - toIntervalSecond(?), now64(6), 0, 't', 0, 0, ?",
        )
        .bind(kind)
        .bind(id)
        .bind(ago)
        .bind(payload)
        .execute()
        .await
        .unwrap();
    }
    let store = p.store();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let (pairs, missing) =
        weft_store::router::read_logged(&store, "acme", now_us - 3_600_000_000, now_us)
            .await
            .unwrap();
    let got: Vec<(String, String)> = pairs
        .iter()
        .map(|p| {
            let s = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_owned();
            (
                s(&p.decision, "decision_id"),
                s(&p.feedback, "candidate_id"),
            )
        })
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.contains(&("d1".into(), "a".into())), "{got:?}");
    assert!(got.contains(&("d2".into(), "b".into())), "{got:?}");
    assert_eq!(missing, 1);
}
