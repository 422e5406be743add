//! `weft migrate` against the real local ClickHouse: idempotent, recorded, complete.

mod common;

use clickhouse::Client;

fn migrate(db: &str) -> std::process::Output {
    common::weft()
        .args(["migrate", "--clickhouse-database", db])
        .env("WEFT_CLICKHOUSE_URL", common::clickhouse_url())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_is_a_no_op_the_second_time() {
    let db = common::unique("weft_it_migrate");
    let first = migrate(&db);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let n = weft_schemas::migrations::all().len();
    assert!(String::from_utf8_lossy(&first.stdout).contains(&format!("{n} applied now")));

    let second = migrate(&db);
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        String::from_utf8_lossy(&second.stdout)
            .contains(&format!("0 applied now [], {n} already applied")),
        "{}",
        String::from_utf8_lossy(&second.stdout)
    );

    let client = Client::default()
        .with_url(common::clickhouse_url())
        .with_database(&db);
    let rows: Vec<u32> = client
        .query("SELECT version FROM weft_schema_migrations ORDER BY version")
        .fetch_all()
        .await
        .unwrap();
    let want: Vec<u32> = weft_schemas::migrations::all()
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(rows, want, "each migration recorded exactly once");
    let tables: Vec<String> = client
        .query("SELECT name FROM system.tables WHERE database = ? ORDER BY name")
        .bind(&db)
        .fetch_all()
        .await
        .unwrap();
    assert!(tables.contains(&"weft_events".to_owned()), "{tables:?}");
    // Migration 0014: wide merges where ingest writes the most (less CPU per event), the
    // default where a narrative lookup reads a granule per part (docs/BENCHMARKS.md).
    for (table, wide) in [
        ("weft_events", true),
        ("weft_narratives", true),
        ("weft_narrative_nodes", false),
        ("weft_links", false),
    ] {
        let engine: String = client
            .query("SELECT engine_full FROM system.tables WHERE database = ? AND name = ?")
            .bind(&db)
            .bind(table)
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(
            engine.contains("merge_selector_base = 10"),
            wide,
            "{table}: {engine}"
        );
    }
    // Migration 0016: payloads at ZSTD(1), as small as level 3 on these payloads and cheaper
    // to write and to merge (docs/BENCHMARKS.md, "Payload codec").
    for table in ["weft_events", "weft_narratives"] {
        let codec: String = client
            .query(
                "SELECT compression_codec FROM system.columns \
                 WHERE database = ? AND table = ? AND name = 'payload'",
            )
            .bind(&db)
            .bind(table)
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(codec, "CODEC(ZSTD(1))", "{table}");
    }
    client
        .query(&format!("DROP DATABASE `{db}`"))
        .execute()
        .await
        .unwrap();
}

#[test]
fn unreachable_clickhouse_is_a_clear_error() {
    let out = common::weft()
        .args(["migrate", "--clickhouse-url", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("clickhouse at http://127.0.0.1:9"),
        "{stderr}"
    );
}
