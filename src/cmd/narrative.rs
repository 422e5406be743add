//! `weft narrative`: print one per-request narrative.

use clap::Args;
use weft_store::narrative::query;
use weft_store::Store;

use crate::config::Settings;

/// Print the narrative that contains ID: a request id, or the id of any event in it.
///
/// Entries come in timestamp order, with the links between them (decision_id -> frame_id ->
/// handle_id ...) and the ids of related narratives (those linked across requests).
#[derive(Debug, Args)]
pub struct NarrativeArgs {
    /// A request id, or any member's id (event_id, decision_id, frame_id, handle_id, ...).
    pub id: String,
    /// Tenant whose narratives to search.
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

/// Output formats.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Exit status: 0 found, 1 not found (or another failure).
pub async fn run(a: NarrativeArgs, settings: Settings) -> anyhow::Result<bool> {
    let store = Store::new(settings.clickhouse)?;
    let Some(n) = query::lookup(&store, &a.tenant, &a.id).await? else {
        eprintln!("{} `{}` (tenant {})", query::NOT_FOUND, a.id, a.tenant);
        return Ok(false);
    };
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&n)?),
        Format::Text => print!("{}", n.to_text()),
    }
    Ok(true)
}
