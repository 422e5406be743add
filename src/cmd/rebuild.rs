//! `weft rebuild`: recompute narratives from the stored facts.

use clap::Args;
use weft_consumers::narrative::rebuild;
use weft_store::Store;

use crate::config::Settings;

/// Recompute every narrative from `weft_events` with the same rule ingest applies.
///
/// Narratives are a projection of the facts; this empties the narrative tables and derives
/// them again. Stop `weft ingest` (or its narratives role) first.
#[derive(Debug, Args)]
pub struct RebuildArgs {}

pub async fn run(_a: RebuildArgs, settings: Settings) -> anyhow::Result<()> {
    let store = Store::new(settings.clickhouse)?;
    let started = std::time::Instant::now();
    let s = rebuild::rebuild(&store).await?;
    println!(
        "rebuilt {} narratives from {} facts ({} links) in {:.1}s",
        s.narratives,
        s.facts,
        s.links,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
