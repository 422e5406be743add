//! `weft gateway`: the HTTP ingest endpoint in front of the Publisher.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use weft_http::{ApiKeys, KeySources};
use weft_producers::gateway::{self, Gateway};

use crate::cmd::publish::PublisherArgs;
use crate::config::Settings;

/// Run the HTTP ingest gateway: POST /v1/events, GET /healthz, GET /readyz, GET /metrics.
///
/// POST /v1/events takes a JSON array or NDJSON (Content-Type: application/x-ndjson, or
/// sniffed) of envelopes {kind, request_id?, tenant?, payload}. Each item is validated on
/// its own; the answer lists per item {index, status: accepted|rejected, id?, error?:
/// {code, message}}, and comes only once the accepted items are durable (Kafka ack or spool
/// fsync). HTTP 200 = all accepted, 207 = some, 400 = none (403 if all named another
/// tenant, 413 if all were over [publisher] max_message_bytes, 422 if all had a request_id over 1024
/// bytes, 503 if all may be retried: spool_full, spool_failed, closed), 413 = body over --max-body-bytes, 422 = more than --max-items items, 401 = missing
/// or unknown key. Errors of the whole request are {"error": {"code", "message"}}.
/// Limits: body --max-body-bytes (8 MiB), --max-items (10000) items, each payload at most
/// [publisher] max_message_bytes (1000000) encoded, request_id at most 1024 bytes, each answer message
/// at most 512 bytes (so the answer is bounded too). A payload key twice in one object is
/// refused (`duplicate_key`).
///
/// GET /healthz (liveness, with the spool's state), GET /readyz (readiness: 503 spool_full
/// while the spool has less room than one largest request takes in it) and GET /metrics
/// (Prometheus text) need no key.
///
/// API keys (bearer tokens, `Authorization: Bearer <key>`): each key writes exactly one
/// tenant, and is at least 16 characters. Items without a tenant get the key's tenant; items
/// naming another tenant are rejected with `tenant_forbidden`. Configure keys in any of
/// these (they are merged):
///   WEFT_GATEWAY_KEYS="key-tenant-a-7f3c9e21=tenantA,key-tenant-b-0b84d6aa=tenantB"
///                                                      (environment; or --keys)
///   [gateway] keys = { "key-tenant-a-7f3c9e21" = "tenantA" }   (the --config TOML file)
///   --keys-file FILE / [gateway] keys_file = "FILE"    (one key=tenant per line, # comments)
/// With no key configured, every request is refused (401).
///
/// Listens on 127.0.0.1:8787 by default. A non-loopback --listen address is refused unless
/// --allow-remote is given (then put TLS termination in front of it).
///
/// Examples:
///   WEFT_GATEWAY_KEYS="acme-4f9c2a7e1b6d0c35=acme" weft gateway
///   curl -H 'Authorization: Bearer acme-4f9c2a7e1b6d0c35' \
///        -H 'Content-Type: application/x-ndjson' \
///        --data-binary @events.jsonl http://127.0.0.1:8787/v1/events
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct GatewayArgs {
    /// Address to listen on [default: [gateway] listen, else 127.0.0.1:8787].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Allow a --listen address that is not loopback.
    #[arg(long)]
    pub allow_remote: bool,

    /// API keys as key=tenant,key=tenant (prefer the environment variable over the flag).
    #[arg(
        long,
        env = "WEFT_GATEWAY_KEYS",
        hide_env_values = true,
        value_name = "KEY=TENANT,..."
    )]
    pub keys: Option<String>,

    /// File of key=tenant lines.
    #[arg(long, env = "WEFT_GATEWAY_KEYS_FILE", value_name = "FILE")]
    pub keys_file: Option<PathBuf>,

    /// Largest request body in bytes [default: [gateway] max_body_bytes, else 8 MiB].
    #[arg(long, value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,

    /// Most items in one request [default: [gateway] max_items, else 10000].
    #[arg(long, value_name = "N")]
    pub max_items: Option<usize>,

    /// Most requests handled at once; one more is answered 503 `busy` before its body is
    /// read [default: [gateway] max_concurrent_requests, else 16].
    #[arg(long, value_name = "N")]
    pub max_concurrent_requests: Option<usize>,

    /// Seconds a request's whole body may take to arrive; a slower one is answered 408
    /// `body_timeout` and frees its slot [default: [gateway] body_timeout_secs, else 30].
    #[arg(long, value_name = "SECS")]
    pub body_timeout_secs: Option<u64>,

    /// Refuse payload keys neither defined by their kind nor of the x_<org>_<field> shape
    /// (by default they are counted in /metrics and logged) [default: [gateway]
    /// refuse_nonconforming_keys, else false].
    #[arg(long)]
    pub refuse_nonconforming_keys: bool,

    #[command(flatten)]
    pub publisher: PublisherArgs,
}

pub async fn run(args: GatewayArgs, settings: Settings) -> anyhow::Result<()> {
    let cfg = &settings.gateway;
    let keys = ApiKeys::load(&KeySources {
        list: args.keys.as_deref(),
        list_origin: "WEFT_GATEWAY_KEYS / --keys",
        map: Some((&cfg.keys, "[gateway] keys")),
        file: args.keys_file.as_deref().or(cfg.keys_file.as_deref()),
    })?;
    if keys.is_empty() {
        tracing::warn!("no API keys configured: every request will get 401 (see --help)");
    }
    let listen = args.listen.unwrap_or(cfg.listen);
    let max_body = args.max_body_bytes.unwrap_or(cfg.max_body_bytes);
    let publisher = args.publisher.connect(&settings).await?;
    let listener = weft_http::bind(listen, args.allow_remote).await?;
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, keys = keys.len(), max_body, "gateway listening");
    // A line on stdout that scripts and tests can wait for (the port may be 0 = any).
    println!("listening on http://{local}");
    let gw = Gateway::new(publisher.clone(), keys, max_body)
        .with_max_items(args.max_items.unwrap_or(cfg.max_items))
        .with_max_concurrent_requests(
            args.max_concurrent_requests
                .unwrap_or(cfg.max_concurrent_requests),
        )
        .with_body_timeout(Duration::from_secs(
            args.body_timeout_secs.unwrap_or(cfg.body_timeout_secs),
        ))
        .refusing_nonconforming_keys(
            args.refuse_nonconforming_keys || cfg.refuse_nonconforming_keys,
        );
    gateway::serve(listener, gw, weft_http::shutdown_signal()).await?;
    tracing::info!("shutting down: flushing in-flight events");
    tokio::task::spawn_blocking(move || publisher.close(Duration::from_secs(30))).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use weft_http::ApiKeys;

    fn long_help() -> String {
        let mut cmd = <crate::Cli as clap::CommandFactory>::command();
        let gateway = cmd.find_subcommand_mut("gateway");
        gateway
            .map(|c| c.render_long_help().to_string())
            .unwrap_or_default()
    }

    /// Every KEY=TENANT example of `weft gateway --help` is one the gateway's real key
    /// loader takes (keys are at least 16 characters), the curl example presents one of
    /// them, and every route is listed. Before, the example key `s3cret` was refused at
    /// start-up and `/readyz` was missing.
    #[test]
    fn the_help_examples_are_keys_the_gateway_takes() {
        let help = long_help();
        let mut examples = ApiKeys::default();
        let mut lists = 0;
        for part in help.split("WEFT_GATEWAY_KEYS=\"").skip(1) {
            let list = part.split('"').next().unwrap_or_default();
            examples
                .add_list(list)
                .unwrap_or_else(|e| panic!("`{list}` in --help: {e}"));
            lists += 1;
        }
        assert!(lists >= 2, "the keys list and the example: {help}");
        let table = help
            .lines()
            .find_map(|l| l.trim().strip_prefix("[gateway] "))
            .and_then(|l| l.split_once('}').map(|(t, _)| format!("{t}}}")))
            .expect("a [gateway] keys example");
        #[derive(serde::Deserialize)]
        struct Section {
            keys: BTreeMap<String, String>,
        }
        let section: Section = toml::from_str(&table).unwrap();
        examples
            .add_map(&section.keys)
            .unwrap_or_else(|e| panic!("`{table}` in --help: {e}"));
        let bearer = help
            .split("Bearer ")
            .skip(1)
            .filter_map(|p| p.split('\'').next())
            .find(|k| !k.starts_with('<'))
            .expect("a curl example with a key");
        assert!(
            examples.tenant_for(bearer).is_some(),
            "the curl example's key `{bearer}` is one of the examples"
        );
        for route in ["/v1/events", "/healthz", "/readyz", "/metrics"] {
            assert!(help.contains(route), "{route} in --help");
        }
    }
}
