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
pub struct RebuildArgs {
    /// Write progress rows for this many narrative shards (`--narrative-shard i/N` of
    /// `weft ingest`), so that N shard processes resume where the rebuild ended (default 1:
    /// one unsharded process).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub narrative_shards: u32,
}

pub async fn run(a: RebuildArgs, settings: Settings) -> anyhow::Result<()> {
    let store = Store::new(settings.clickhouse)?;
    let started = std::time::Instant::now();
    let s = rebuild::rebuild(&store, a.narrative_shards).await?;
    println!(
        "rebuilt {} narratives from {} facts ({} links) in {:.1}s",
        s.narratives,
        s.facts,
        s.links,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
