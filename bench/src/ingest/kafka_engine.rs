//! Step 3: ClickHouse's own Kafka table engine draining the same topics, measured as weft is.

use super::*;

/// Drain the same topics with a Kafka engine table and a materialized view.
#[allow(clippy::too_many_arguments)]
pub(super) async fn kafka_engine(
    store: &Store,
    pids: &Pids,
    brokers: &str,
    topics: &Topics,
    variant: EngineVariant,
    block_size: Option<u64>,
    envelopes: u64,
    timeout: Duration,
) -> anyhow::Result<Phase> {
    let v = match variant {
        EngineVariant::Typed => "typed",
        _ => "raw",
    };
    let (queue, target, mv) = (
        format!("ke_{v}_queue"),
        format!("ke_{v}"),
        format!("ke_{v}_mv"),
    );
    let topic_list = topics.event_topics().join(",");
    let group = format!("weft-bench-ke-{v}-{}", topics.prefix.trim_end_matches('.'));
    let block = block_size
        .map(|b| format!(", kafka_max_block_size = {b}"))
        .unwrap_or_default();
    let (target_ddl, select) = match variant {
        EngineVariant::Typed => (
            // The columns weft_events types, extracted from the payload and headers, with the
            // same sort key and codecs; no validation, dedup, links or narratives.
            format!(
                "CREATE TABLE {target} (
                    tenant LowCardinality(String), kind LowCardinality(String), id String,
                    ts DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)), request_id String,
                    event_type LowCardinality(String), principal String,
                    capability_id LowCardinality(String), decision LowCardinality(String),
                    outcome LowCardinality(String), token_id String, decision_id String,
                    frame_id String, handle_id String, handle_refs Array(String), flow_id String,
                    topic LowCardinality(String), partition UInt32, offset UInt64,
                    payload String CODEC(ZSTD(3))
                 ) ENGINE = MergeTree ORDER BY (tenant, kind, toStartOfHour(ts), id)"
            ),
            {
                // No aliases referenced and no subquery: the view runs in the Kafka engine's
                // own context, whatever the client's alias settings.
                let h = |name: &str| format!("_headers.value[indexOf(_headers.name, '{name}')]");
                let (tenant, kind, request) =
                    (h("weft-tenant"), h("weft-kind"), h("weft-request-id"));
                let s = |key: &str| format!("JSONExtractString(payload, '{key}')");
                let id = format!(
                    "multiIf({kind} = 'trace_event', {}, {kind} = 'policy_decision', {}, \
                     {kind} = 'capability_token', {}, {kind} = 'frame', {}, \
                     {kind} = 'handle', {}, {kind} = 'routing_decision', {}, \
                     {kind} = 'execution_routing_decision', {}, \
                     concat('jcs-sha256:', lower(hex(SHA256(payload)))))",
                    s("event_id"),
                    s("decision_id"),
                    s("token_id"),
                    s("frame_id"),
                    s("handle_id"),
                    s("id"),
                    s("decision_id"),
                );
                let ts = format!(
                    "parseDateTime64BestEffortOrZero(multiIf(JSONHas(payload, 'timestamp'), {}, \
                     JSONHas(payload, 'created_at'), {}, {}), 6, 'UTC')",
                    s("timestamp"),
                    s("created_at"),
                    s("issued_at"),
                );
                let cols: Vec<String> = [
                    "event_type",
                    "principal",
                    "capability_id",
                    "decision",
                    "outcome",
                    "token_id",
                    "decision_id",
                    "frame_id",
                    "handle_id",
                ]
                .iter()
                .map(|c| format!("{} AS {c}", s(c)))
                .collect();
                format!(
                    "SELECT {tenant} AS tenant, {kind} AS kind, {id} AS id, {ts} AS ts, \
                     {request} AS request_id, {}, \
                     JSONExtract(payload, 'handle_refs', 'Array(String)') AS handle_refs, \
                     JSONExtractString(payload, 'metadata', 'flow_id') AS flow_id, \
                     _topic AS topic, _partition AS partition, _offset AS offset, payload \
                     FROM {queue}",
                    cols.join(", ")
                )
            },
        ),
        _ => (
            format!(
                "CREATE TABLE {target} (topic LowCardinality(String), partition UInt32, offset UInt64,
                    payload String CODEC(ZSTD(3))) ENGINE = MergeTree ORDER BY (topic, partition, offset)"
            ),
            format!(
                "SELECT _topic AS topic, _partition AS partition, _offset AS offset, payload FROM {queue}"
            ),
        ),
    };
    exec(store, &target_ddl).await?;
    exec(
        store,
        &format!(
            "CREATE TABLE {queue} (payload String) ENGINE = Kafka SETTINGS \
             kafka_broker_list = '{brokers}', kafka_topic_list = '{topic_list}', \
             kafka_group_name = '{group}', kafka_format = 'JSONAsString', \
             kafka_num_consumers = 1{block}"
        ),
    )
    .await?;
    settle_merges(store, Duration::from_secs(120)).await;
    eprintln!("draining with ClickHouse's Kafka engine ({v}) ...");
    let s0 = Snapshot::take(pids);
    exec(
        store,
        &format!("CREATE MATERIALIZED VIEW {mv} TO {target} AS {select}"),
    )
    .await?;
    let result = drain(
        store,
        &format!("SELECT count() FROM {target}"),
        envelopes,
        timeout,
        &format!("Kafka engine ({v})"),
    )
    .await;
    let s1 = Snapshot::take(pids);
    // Stop consuming before anything else.
    let _ = exec(store, &format!("DROP TABLE IF EXISTS {mv}")).await;
    let _ = exec(store, &format!("DROP TABLE IF EXISTS {queue}")).await;
    let (first, first_n, done) = result?;
    settle_merges(store, Duration::from_secs(120)).await;
    let s2 = Snapshot::take(pids);
    let rows = count(store, &format!("SELECT count() FROM {target}")).await?;
    let p = phase(
        format!("ClickHouse Kafka engine + MV ({v})"),
        rows,
        envelopes,
        (&s0, first, first_n, done, &s1, &s2),
        false,
    );
    eprintln!(
        "  Kafka engine ({v}): {:.1} s, {:.0} events/s, {:.1} ClickHouse CPU-s",
        p.wall_s, p.events_per_s, p.clickhouse_cpu_settled_s
    );
    Ok(p)
}
