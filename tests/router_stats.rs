//! The router's aggregates (`weft_router_stats`, fed by a view of `weft_events`) on the real
//! ClickHouse: what the view counts whatever the feedback's own timestamp says, and what
//! `read_stats` keeps of them.

mod common;

use common::pipeline::Pipeline;

/// One insert of feedback dated in 101 different months (a producer sets the timestamp) is
/// stored, and the view counts what is recent: before migration 0018 the view's block
/// spanned 101 monthly partitions, ClickHouse refused it (TOO_MANY_PARTS) after the facts
/// had landed, and the whole insert's feedback went missing from the aggregates. A feedback
/// dated a year ahead is counted at its ingest time, not in the future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_dated_anywhere_is_stored_and_only_recent_feedback_is_counted() {
    let p = Pipeline::new("it_routerstatsdates");
    let rows = |prefix: &str, count: u64, ts: &str| {
        format!(
            "SELECT 'acme', 'execution_feedback', concat('{prefix}', toString(number)), {ts}, \
             now64(6), 0, 't', 0, number, concat('{{\"decision_id\":\"d', toString(number), \
             '\",\"candidate_id\":\"c\",\"success\":true}}') FROM numbers({count})"
        )
    };
    let ch = p.client();
    let one_insert = format!(
        "INSERT INTO weft_events (tenant, kind, id, ts, ingested_at, conflict, topic, \
         partition, offset, payload) {} UNION ALL {} UNION ALL {}",
        // 101 months from 2010 on: long before their ingest, not counted.
        rows(
            "old",
            101,
            "toDateTime64('2010-01-15', 6) + toIntervalMonth(number)"
        ),
        // Ten from the last ten days, and one a year ahead.
        rows("recent", 10, "now64(6) - toIntervalDay(number)"),
        rows("ahead", 1, "now64(6) + toIntervalDay(365)"),
    );
    ch.query(&one_insert).execute().await.unwrap();
    let count = |sql: &'static str| {
        let ch = ch.clone();
        async move { ch.query(sql).fetch_one::<u64>().await.unwrap() }
    };
    assert_eq!(count("SELECT count() FROM weft_events").await, 112);
    assert_eq!(
        count("SELECT toUInt64(sum(n)) FROM weft_router_stats").await,
        11,
        "the ten recent and the one dated ahead"
    );
    assert_eq!(
        count("SELECT toUInt64(count()) FROM weft_router_stats WHERE bucket > now()").await,
        0,
        "nothing counted in the future"
    );
}

/// `read_stats` keeps, per tenant, the `max_cells` cells with the most decayed evidence:
/// a cell with the most outcomes, all of them two hours old under a half-life of 30 minutes,
/// ranks below fresh cells with fewer; each tenant keeps its own best cells, not the best of
/// all tenants together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stats_read_keeps_each_tenants_most_evidenced_cells() {
    let p = Pipeline::new("it_routerstats");
    let cell = |tenant: &str, candidate: &str, n: u64, age_s: u64| {
        format!(
            "('{tenant}', 'ctx', '{candidate}', toStartOfMinute(now() - toIntervalSecond({age_s})), \
             {n}, {n}, 0, 0, quantilesState(0.5, 0.9, 0.99)(toUInt64(1)), 0, 0, 0)"
        )
    };
    let rows = [
        cell("acme", "old", 48, 7_200),
        cell("acme", "a1", 1, 0),
        cell("acme", "a4", 4, 0),
        cell("acme", "a5", 5, 0),
        cell("globex", "g10", 10, 0),
        cell("globex", "g20", 20, 0),
        cell("globex", "g30", 30, 0),
    ];
    // A VALUES list cannot hold an aggregate state, so each row is one SELECT.
    let insert = format!(
        "INSERT INTO weft_router_stats SELECT * FROM ({})",
        rows.iter()
            .map(|r| format!("SELECT {}", r.trim_start_matches('(').trim_end_matches(')')))
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    );
    p.client().query(&insert).execute().await.unwrap();

    let store = p.store();
    let kept = |half_life_s: f64, max_cells: u64| {
        let store = store.clone();
        async move {
            let rows = weft_store::router::read_stats(&store, 3 * 3_600, half_life_s, max_cells)
                .await
                .unwrap();
            rows.into_iter()
                .map(|r| format!("{}/{}", r.tenant, r.candidate_id))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        kept(1_800.0, 2).await,
        ["acme/a5", "acme/a4", "globex/g30", "globex/g20"],
        "decayed, 48 outcomes two hours old weigh at most 48/16 = 3, less than a fresh 4"
    );
    assert_eq!(
        kept(0.0, 2).await,
        ["acme/old", "acme/a5", "globex/g30", "globex/g20"],
        "undecayed, the old cell's 48 outcomes lead"
    );
    assert_eq!(kept(0.0, 10).await.len(), 7, "under the bound, every cell");
}
