//! `weft migrate`: create or upgrade weft's ClickHouse schema.

use clap::Args;
use weft_store::Store;

use crate::config::Settings;

/// Apply the ClickHouse migrations under `schemas/clickhouse/` that are not applied yet.
///
/// Idempotent: applied versions are recorded in `weft_schema_migrations` and skipped, so it is
/// safe to run on every deploy. A migration edited after it was applied is refused.
#[derive(Debug, Args)]
pub struct MigrateArgs {}

pub async fn run(_args: MigrateArgs, settings: Settings) -> anyhow::Result<()> {
    let store = Store::new(settings.clickhouse)?;
    let report = store.migrate().await?;
    println!(
        "migrations: {} applied now {:?}, {} already applied",
        report.applied.len(),
        report.applied,
        report.already.len()
    );
    Ok(())
}
