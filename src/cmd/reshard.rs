//! `weft reshard`: change how many narrative shards run, keeping their progress.

use clap::Args;
use weft_consumers::narrative::reshard;
use weft_store::Store;

use crate::config::Settings;

/// Change the number of narrative shards (`weft ingest --role narratives --narrative-shard
/// i/N`) without projecting everything again.
///
/// Stop every `weft ingest` that projects narratives first (the facts may go on). Each new
/// shard's progress then starts, per source partition, where the slowest old shard stopped:
/// the new processes replay a little and resume, instead of starting over. Start the N new
/// processes afterwards. Safe to run again after an interruption. `weft rebuild
/// --narrative-shards N` is the other way: it recomputes every narrative from the facts.
#[derive(Debug, Args)]
pub struct ReshardArgs {
    /// The new number of narrative shards (1: one unsharded process).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub narrative_shards: u32,
    /// Say what would change, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub async fn run(a: ReshardArgs, settings: Settings) -> anyhow::Result<()> {
    let store = Store::new(settings.clickhouse)?;
    let r = reshard::reshard(&store, a.narrative_shards, a.dry_run).await?;
    let names = |labels: &[String]| -> String {
        labels
            .iter()
            .map(|l| if l.is_empty() { "0/1" } else { l.as_str() })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if r.from.is_empty() {
        println!(
            "nothing to move: the narrative progress is already that of {} shard(s), or empty",
            r.to.len()
        );
        return Ok(());
    }
    println!(
        "{} narrative progress from shards {} to {} ({} source partitions carried over)",
        if a.dry_run { "would move" } else { "moved" },
        names(&r.from),
        names(&r.to),
        r.partitions
    );
    if !a.dry_run {
        println!(
            "now start {} process(es): weft ingest --role narratives --narrative-shard i/{}",
            r.to.len(),
            a.narrative_shards
        );
    }
    Ok(())
}
