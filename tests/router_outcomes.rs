//! The router's two reads of (decision, feedback) pairs give the same rows on the real
//! ClickHouse: `read_new_outcomes` (the incremental read, each side from the cursor's time
//! on) and `read_outcomes` (the whole window joined, then the cursor), whatever the order
//! the two halves of a pair were stored in, for cursors before, inside and after the rows,
//! on a row's exact visibility included.

mod common;

use common::pipeline::Pipeline;
use weft_store::router::{read_new_outcomes, read_outcomes, OutcomeRow};

/// The pairs as (tenant, feedback id, visibility).
fn keys(rows: &[OutcomeRow]) -> Vec<(String, String, i64)> {
    rows.iter()
        .map(|r| (r.tenant.clone(), r.feedback_id.clone(), r.visible_us))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incremental_read_gives_the_rows_of_the_whole_join() {
    let p = Pipeline::new("it_routeroutcomes");
    // 300 decisions and their feedback, one minute apart going back from now: pairs with
    // i % 3 == 0 had their decision stored 30 s after the feedback, the others 30 s
    // before; every 7th feedback names a decision never stored, every 11th decision is of
    // another tenant (no pair), and every 13th feedback is a conflict row (not read).
    let insert = |kind: &str,
                  id: &str,
                  offset_s: &str,
                  payload: &str,
                  tenant: &str,
                  conflict: &str| {
        format!(
            "INSERT INTO weft_events (tenant, kind, id, ts, ingested_at, conflict, topic, partition, \
             offset, payload) SELECT '{tenant}', '{kind}', concat('{id}', toString(number)), \
             now64(6), now64(6) - toIntervalSecond({offset_s}), {conflict}, 't', 0, number, {payload} \
             FROM numbers(300)"
        )
    };
    let decision = insert(
        "execution_routing_decision",
        "d",
        "(300 - number) * 60 + if(number % 3 = 0, -30, 30)",
        "concat('{\"decision_id\":\"d', toString(number), '\"}')",
        "acme",
        "0",
    )
    .replace(
        "SELECT 'acme'",
        "SELECT if(number % 11 = 0, 'globex', 'acme')",
    );
    let feedback = insert(
        "execution_feedback",
        "f",
        "(300 - number) * 60",
        "concat('{\"decision_id\":\"', if(number % 7 = 0, 'nowhere', concat('d', toString(number))), '\",\"success\":true}')",
        "acme",
        "if(number % 13 = 0, 1, 0)",
    );
    let ch = p.client();
    ch.query(&decision).execute().await.unwrap();
    ch.query(&feedback).execute().await.unwrap();

    let store = p.store();
    let window = 7 * 86_400;
    let all = read_outcomes(&store, (0, ""), window).await.unwrap();
    let pairs = (0..300)
        .filter(|i| i % 7 != 0 && i % 11 != 0 && i % 13 != 0)
        .count();
    assert_eq!(all.len(), pairs, "every pair once, and nothing else");
    assert!(all
        .windows(2)
        .all(|w| (w[0].visible_us, &w[0].feedback_id) < (w[1].visible_us, &w[1].feedback_id)));
    // Cursors: before everything; on the exact visibility of a pair made visible by its
    // feedback and of one made visible by its decision (both tie-breaks); in the last
    // minutes; after everything.
    let n = |r: &OutcomeRow| {
        r.feedback_id
            .trim_start_matches('f')
            .parse::<u64>()
            .unwrap_or(0)
    };
    let half = &all[all.len() / 2..];
    let by_feedback = half.iter().find(|r| n(r) % 3 != 0).unwrap();
    let by_decision = half.iter().find(|r| n(r) % 3 == 0).unwrap();
    let late = &all[all.len() - 5];
    let last = &all[all.len() - 1];
    let mut cursors = vec![(0, String::new())];
    for r in [by_feedback, by_decision, late, last] {
        cursors.push((r.visible_us, String::new()));
        cursors.push((r.visible_us, r.feedback_id.clone()));
        cursors.push((r.visible_us - 1, String::new()));
    }
    for (us, id) in cursors {
        let whole = read_outcomes(&store, (us, &id), window).await.unwrap();
        let new = read_new_outcomes(&store, (us, &id), window).await.unwrap();
        assert_eq!(keys(&new), keys(&whole), "after ({us}, {id:?})");
        for (a, b) in new.iter().zip(&whole) {
            assert_eq!((&a.decision, &a.feedback), (&b.decision, &b.feedback));
        }
    }
    // Both halves of the rule are exercised: after the middle, pairs made visible by their
    // decision (stored after the feedback) and by their feedback.
    let after = read_new_outcomes(&store, (all[all.len() / 2].visible_us, ""), window)
        .await
        .unwrap();
    assert!(after.iter().any(|r| n(r) % 3 == 0));
    assert!(after.iter().any(|r| n(r) % 3 != 0));
}
