//! `weft audit`: what a compliance auditor runs. Every query is scoped to one tenant
//! (`--tenant`, default `default`) and bounded in time (`--from`/`--to`).

use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;
use weft_audit::check::CheckOptions;
use weft_audit::search::Filter;
use weft_audit::sign::{Key, Keyring};
use weft_audit::{bundle, check, log, search, timeline};
use weft_store::Store;

use crate::config::Settings;

mod args;

pub use args::*;

/// A signing key file, refused when others may read it (it is the seal's secret).
fn read_key(path: &std::path::Path) -> anyhow::Result<Key> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading key {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "key {} may be read by others (mode {:o}): `chmod 600` it (weft audit keygen writes 0600)",
            path.display(),
            mode & 0o777
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading key {}", path.display()))?;
    Key::from_json(&text).with_context(|| format!("key {}", path.display()))
}

async fn logged(store: &Store, tenant: &str, action: &str, q: serde_json::Value, n: u64) {
    if let Err(e) = log::record(store, tenant, &log::cli_actor(), action, &q, n).await {
        tracing::warn!(error = %e, "could not write weft_audit_log");
    }
}

pub async fn run(a: AuditArgs, settings: Settings) -> anyhow::Result<ExitCode> {
    let action = match a.action {
        Action::BundleCheck(b) => return bundle_check(b),
        Action::Keygen(k) => return keygen(k),
        other => other,
    };
    let copy_window = weft_audit::chain::copy_window_secs(settings.ingest.dedup_window_secs);
    let store = Store::new(settings.clickhouse)?;
    match action {
        Action::Check(c) => run_check(&store, c).await,
        Action::Timeline(t) => run_timeline(&store, t).await,
        Action::Search(s) => run_search(&store, s).await,
        Action::Bundle(b) => run_bundle(&store, b).await,
        Action::Seal(a) => run_seal(&store, a, copy_window).await,
        Action::Verify(a) => run_verify(&store, a, copy_window).await,
        Action::Checkpoints(a) => {
            let tenant = &a.tenant.name;
            let c = weft_audit::chain::checkpoints(&store, tenant).await?;
            logged(&store, tenant, "checkpoints", json!({}), c.len() as u64).await;
            println!("{}", serde_json::to_string_pretty(&c)?);
            Ok(ExitCode::SUCCESS)
        }
        Action::Retention(r) => run_retention(&store, r).await,
        Action::Serve(a) => serve(a, store, copy_window)
            .await
            .map(|()| ExitCode::SUCCESS),
        Action::BundleCheck(_) | Action::Keygen(_) => unreachable!("handled above"),
    }
}

/// `weft audit keygen`.
fn keygen(k: KeygenArgs) -> anyhow::Result<ExitCode> {
    let key = Key::generate(&k.kid)?;
    write_secret(&k.out, &key.to_json())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&Keyring {
            keys: vec![key.public()]
        })?
    );
    Ok(ExitCode::SUCCESS)
}

/// `weft audit check`.
async fn run_check(store: &Store, c: CheckArgs) -> anyhow::Result<ExitCode> {
    let range = c.scope.range()?;
    let tenant = &c.scope.tenant.name;
    let opt = CheckOptions {
        grace_secs: c.grace_secs,
        lookaround_secs: c.lookaround_secs,
    };
    let r = check::run(store, tenant, range, opt).await?;
    logged(
        store,
        tenant,
        "check",
        json!({"range": range, "grace_secs": c.grace_secs}),
        r.findings.len() as u64,
    )
    .await;
    match c.format {
        TextJson::Json => {
            // Streamed: a 10M-event check can report 200k findings (about 100 MB).
            use std::io::Write;
            let mut w = std::io::BufWriter::new(std::io::stdout().lock());
            serde_json::to_writer_pretty(&mut w, &r)?;
            writeln!(w)?;
            w.flush()?;
        }
        TextJson::Text => {
            let mut out = format!(
                "audit check, tenant {}, {} .. {}: {} findings {:?} ({} ms)\n",
                r.tenant,
                weft_schemas::time::micros_to_rfc3339(range.from),
                weft_schemas::time::micros_to_rfc3339(range.to),
                r.findings.len(),
                r.counts,
                r.elapsed_ms
            );
            for f in r.findings.iter().filter(|_| !c.summary) {
                out.push_str(&format!(
                    "  {:<11} {:<26} {}\n",
                    f.invariant, f.rule, f.detail
                ));
                let ev: Vec<String> = f.events.iter().map(|e| e.to_string()).collect();
                out.push_str(&format!("              proof: {}\n", ev.join(", ")));
            }
            print_text(&out)?;
        }
    }
    Ok(if c.fail_on_findings && !r.findings.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `weft audit timeline`.
async fn run_timeline(store: &Store, t: TimelineArgs) -> anyhow::Result<ExitCode> {
    let tenant = &t.tenant.name;
    let n = match timeline::get(store, tenant, &t.request, u64::MAX).await {
        Ok(n) => n,
        Err(weft_audit::AuditError::NotFound(m)) => {
            logged(store, tenant, "timeline", json!({"id": t.request}), 0).await;
            eprintln!("{m} (tenant {tenant})");
            return Ok(ExitCode::FAILURE);
        }
        Err(e) => return Err(e.into()),
    };
    logged(
        store,
        tenant,
        "timeline",
        json!({"id": t.request}),
        n.entries.len() as u64,
    )
    .await;
    match t.format {
        TextJson::Json => println!("{}", serde_json::to_string_pretty(&n)?),
        TextJson::Text => print_text(&timeline::render_text(&n))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `weft audit search`: every page when --all, else one; the next cursor on stderr.
async fn run_search(store: &Store, s: SearchArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let range = s.scope.range()?;
    let tenant = &s.scope.tenant.name;
    let filter = Filter {
        kind: s.kind.clone(),
        principal: s.principal.clone(),
        capability: s.capability.clone(),
        event_type: s.event_type.clone(),
        decision: s.decision.clone(),
        outcome: s.outcome.clone(),
        token: s.token.clone(),
        request: s.request.clone(),
    };
    let mut cursor = s.cursor.clone();
    let mut total = 0u64;
    // The read is logged however it ends: a page that fails after others were printed, or
    // a reader that closes the pipe (`| head`, the reader's end of the output, no error).
    let res: anyhow::Result<()> = async {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        match s.format {
            SearchFormat::Csv => writeln!(out, "{}", search::CSV_HEADER)?,
            SearchFormat::Table => writeln!(
                out,
                "{:<27} {:<26} {:<36} {:<28} {:<30} {:<6} {:<8}",
                "ts", "kind", "id", "event_type", "capability", "verdict", "outcome"
            )?,
            SearchFormat::Jsonl => {}
        }
        loop {
            let page =
                search::page(store, tenant, range, &filter, cursor.as_deref(), s.limit).await?;
            total += page.hits.len() as u64;
            for h in &page.hits {
                match s.format {
                    SearchFormat::Csv => writeln!(out, "{}", search::csv_line(h))?,
                    SearchFormat::Jsonl => writeln!(out, "{}", search::json_line(h))?,
                    SearchFormat::Table => h.typed(|_, t| {
                        writeln!(
                            out,
                            "{:<27} {:<26} {:<36} {:<28} {:<30} {:<6} {:<8}",
                            weft_schemas::time::micros_to_rfc3339(h.ts),
                            h.kind,
                            h.id,
                            t.event_type,
                            t.capability_id,
                            t.decision,
                            t.outcome
                        )
                    })?,
                }
            }
            cursor = page.next_cursor;
            if !s.all || cursor.is_none() {
                break;
            }
        }
        out.flush()?;
        Ok(())
    }
    .await;
    let res = match res {
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            cursor = None;
            Ok(())
        }
        r => r,
    };
    let error = res.as_ref().err().map(|e| format!("{e:#}"));
    logged(
        store,
        tenant,
        "search",
        json!({"range": range, "filter": filter, "cursor": s.cursor, "error": error}),
        total,
    )
    .await;
    res?;
    if let Some(c) = &cursor {
        eprintln!("next cursor: {c}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `weft audit bundle`.
async fn run_bundle(store: &Store, b: BundleArgs) -> anyhow::Result<ExitCode> {
    let tenant = &b.tenant.name;
    let key = b.sign_key.as_deref().map(read_key).transpose()?;
    let limit = |n: u64| if n == 0 { u64::MAX } else { n };
    let (members, bytes) = (limit(b.max_members), limit(b.max_payload_bytes));
    let doc = bundle::export(store, tenant, &b.request, key.as_ref(), members, bytes).await?;
    logged(store, tenant, "bundle", json!({"id": b.request}), 1).await;
    let ring = key.as_ref().map(|k| Keyring {
        keys: vec![k.public()],
    });
    let c = bundle::check_document(&doc, ring.as_ref());
    println!("{}", serde_json::to_string_pretty(&doc)?);
    report_bundle_check(&c);
    Ok(if c.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `weft audit seal`.
async fn run_seal(store: &Store, a: SealArgs, copy_window: u64) -> anyhow::Result<ExitCode> {
    let key = a.sign_key.as_deref().map(read_key).transpose()?;
    let r = weft_audit::chain::seal(store, &a.tenant.name, key.as_ref(), copy_window).await?;
    println!(
        "sealed {} new facts of tenant {} in {} partitions{}",
        r.sealed,
        a.tenant.name,
        r.checkpoints.len(),
        if key.is_some() {
            " (checkpoints signed)"
        } else {
            " (checkpoints unsigned: pass --sign-key)"
        }
    );
    for h in &r.held {
        eprintln!(
            "not sealed: {} {}:{} at {}/{} offset {}: {}",
            h.what, h.kind, h.id, h.topic, h.partition, h.offset, h.detail
        );
    }
    Ok(if r.held.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A keyring file (spec keyring format), when given.
fn read_keyring(path: Option<&std::path::Path>) -> anyhow::Result<Option<Keyring>> {
    let Some(p) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    Ok(Some(Keyring::from_json(&text)?))
}

/// The checkpoints of an export file: what `weft audit checkpoints` prints (an array), or
/// the pages of `GET /v1/audit/checkpoints` (`{"checkpoints": [..], ..}`) one after another.
fn read_checkpoints(p: &std::path::Path) -> anyhow::Result<Vec<weft_audit::chain::Checkpoint>> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Export {
        List(Vec<weft_audit::chain::Checkpoint>),
        Page {
            checkpoints: Vec<weft_audit::chain::Checkpoint>,
        },
    }
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let mut all = Vec::new();
    for part in serde_json::Deserializer::from_str(&text).into_iter::<Export>() {
        match part.with_context(|| format!("parsing {}", p.display()))? {
            Export::List(c) | Export::Page { checkpoints: c } => all.extend(c),
        }
    }
    Ok(all)
}

/// `weft audit verify`.
async fn run_verify(store: &Store, a: VerifyArgs, copy_window: u64) -> anyhow::Result<ExitCode> {
    let tenant = &a.tenant.name;
    let extra = match &a.checkpoints {
        Some(p) => read_checkpoints(p)?,
        None => Vec::new(),
    };
    let ring = read_keyring(a.keyring.as_deref())?;
    let range = a.range()?;
    let opt = weft_audit::chain::VerifyOptions {
        range,
        copy_window_secs: copy_window,
        max_rows: None,
    };
    let r = weft_audit::chain::verify(store, tenant, &extra, ring.as_ref(), opt).await?;
    logged(
        store,
        tenant,
        "verify",
        json!({ "range": range }),
        r.problems.len() as u64,
    )
    .await;
    match a.format {
        TextJson::Json => println!("{}", serde_json::to_string_pretty(&r)?),
        TextJson::Text => {
            println!(
                "chain of tenant {}: {} — {} rows verified, {} checkpoints ok, {} unsealed, {} pruned by retention, {} problems",
                tenant,
                if r.ok() { "INTACT" } else { "BROKEN" },
                r.verified,
                r.checkpoints_ok,
                r.unsealed,
                r.pruned,
                r.problems.len()
            );
            if r.pruned_before_signature == weft_audit::chain::PrunedSignature::NotChecked {
                println!(
                    "  note: facts missing from before {} count as pruned by retention, a value \
                     taken unchecked: pass --keyring to trust only one the sealer signed",
                    weft_schemas::time::micros_to_rfc3339(r.pruned_before)
                );
            }
            for (i, p) in r.problems.iter().enumerate() {
                println!(
                    "  {}{:<19} {}/{}@{} {}",
                    if i == 0 { "first: " } else { "       " },
                    p.what,
                    p.topic,
                    p.partition,
                    p.offset,
                    p.detail
                );
            }
        }
    }
    Ok(if r.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `weft audit retention ...`.
async fn run_retention(store: &Store, r: RetentionAction) -> anyhow::Result<ExitCode> {
    use weft_audit::retention;
    let (tenant, out) = match r {
        RetentionAction::Show(t) => {
            let v = retention::get(store, &t.name).await?;
            (t.name, serde_json::to_value(v)?)
        }
        RetentionAction::Set(s) => {
            let v = retention::set_days(store, &s.tenant.name, s.days).await?;
            (s.tenant.name, serde_json::to_value(v)?)
        }
        RetentionAction::Hold(h) => {
            let v = retention::set_hold(store, &h.tenant.name, h.on).await?;
            (h.tenant.name, serde_json::to_value(v)?)
        }
        RetentionAction::Apply(a) => {
            let done = if a.dry_run {
                retention::plan(store, &a.tenant.name).await.map(|plan| {
                    plan.map(
                        |p| json!({"dry_run": true, "cutoff": p.cutoff, "would_delete": p.facts}),
                    )
                })
            } else {
                let key = a.sign_key.as_deref().map(read_key).transpose()?;
                let applied = retention::apply(store, &a.tenant.name, key.as_ref()).await;
                if key.is_none() && matches!(applied, Ok(Some(_))) {
                    eprintln!(
                        "pruned_before recorded unsigned (pass --sign-key): `weft audit verify \
                         --keyring` reports it and counts every pruned fact as deleted"
                    );
                }
                applied.map(|applied| applied.map(|a| json!(a)))
            };
            match done {
                Ok(v) => (a.tenant.name, json!(v)),
                Err(weft_audit::AuditError::Refused(m)) => {
                    eprintln!("refused: {m}");
                    return Ok(ExitCode::FAILURE);
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    println!("{}", json!({"tenant": tenant, "retention": out}));
    Ok(ExitCode::SUCCESS)
}

fn report_bundle_check(c: &bundle::BundleCheck) {
    for s in &c.schema {
        eprintln!("schema: {s}");
    }
    for f in &c.invariants {
        eprintln!("{}: {} at {}", f.invariant, f.message, f.pointer);
    }
    match &c.signature {
        None => eprintln!("signature: none"),
        Some(Ok(m)) => eprintln!("signature: {m}"),
        Some(Err(m)) => eprintln!("signature: FAILED: {m}"),
    }
    eprintln!("bundle: {}", if c.passed() { "PASS" } else { "FAIL" });
}

fn bundle_check(b: BundleCheckArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&b.file)
        .with_context(|| format!("reading {}", b.file.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", b.file.display()))?;
    let ring = read_keyring(b.keyring.as_deref())?;
    let c = bundle::check_document(&doc, ring.as_ref());
    report_bundle_check(&c);
    Ok(if c.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn write_secret(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {} (it must not exist yet)", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

async fn serve(a: ServeArgs, store: Store, copy_window_secs: u64) -> anyhow::Result<()> {
    use std::sync::Arc;
    let keys = weft_http::ApiKeys::load(&weft_http::KeySources {
        list: a.keys.as_deref(),
        list_origin: "WEFT_AUDIT_KEYS / --keys",
        ..Default::default()
    })?;
    if keys.is_empty() {
        tracing::warn!("no API keys configured: every request will get 401 (see --help)");
    }
    let sign_key = a
        .sign_key
        .as_deref()
        .map(read_key)
        .transpose()?
        .map(Arc::new);
    // A verify that checks no signature trusts any checkpoint ClickHouse holds: without a
    // keyring, this server's own key is the one its checkpoints carry.
    let keyring = match read_keyring(a.keyring.as_deref())? {
        Some(ring) => Some(ring),
        None => sign_key.as_deref().map(|k| {
            tracing::info!("checking checkpoint signatures with --sign-key's public key (--keyring adds earlier keys)");
            Keyring {
                keys: vec![k.public()],
            }
        }),
    };
    if keyring.is_none() {
        tracing::warn!(
            "neither --keyring nor --sign-key: /v1/audit/verify checks no checkpoint signature"
        );
    }
    let keyring = keyring.map(Arc::new);
    let metrics = Arc::new(weft_audit::metrics::AuditMetrics::default());
    if a.seal_every_secs > 0 {
        tokio::spawn(weft_audit::serve::seal_loop(
            store.clone(),
            sign_key.clone(),
            std::time::Duration::from_secs(a.seal_every_secs),
            copy_window_secs,
            metrics.clone(),
        ));
    }
    // Every read's log row goes through one writer: a bounded queue, batched inserts.
    let (audit_log, log_flusher) = weft_audit::log::writer::AuditLog::spawn(
        store.clone(),
        metrics.clone(),
        weft_audit::log::writer::WriterOptions::default(),
    );
    let state = weft_audit::serve::AppState {
        // Every query a request makes reads at most --max-read-rows rows; the sealer above
        // keeps the unbounded handle.
        store: store.with_read_limit(a.max_read_rows),
        keys: Arc::new(keys),
        sign_key,
        keyring,
        copy_window_secs,
        max_verify_rows: a.max_verify_rows,
        max_concurrent_requests: a.max_concurrent_requests,
        metrics,
        audit_log,
    };
    let listener = weft_http::bind(a.listen, a.allow_remote).await?;
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, "audit API listening");
    println!("listening on http://{local}");
    let served = axum::serve(listener, weft_audit::serve::router(state))
        .with_graceful_shutdown(weft_http::shutdown_signal())
        .await;
    // The requests answered (or the server failed): write the log rows still queued.
    log_flusher.shutdown().await;
    Ok(served?)
}

/// Write text to stdout; a closed pipe (`| head`) is not an error.
fn print_text(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seal's secret is refused when others may read its file; 0600 (what keygen
    /// writes) and 0400 are taken.
    #[test]
    fn a_key_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seal.key");
        std::fs::write(&file, Key::generate("k").unwrap().to_json()).unwrap();
        for (mode, ok) in [(0o644, false), (0o640, false), (0o600, true), (0o400, true)] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let got = read_key(&file);
            assert_eq!(got.is_ok(), ok, "mode {mode:o}: {:?}", got.err());
        }
    }

    #[test]
    fn a_checkpoint_export_is_an_array_or_the_api_pages_one_after_another() {
        let cp = |offset: u64| {
            json!({"tenant": "acme", "topic": "t", "partition": 0, "offset": offset,
                   "head": "00", "rows": offset, "kid": "", "sig": "", "sealed_at": 1})
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("checkpoints.json");
        let pages = format!(
            "{}\n{}\n",
            json!({"checkpoints": [cp(1), cp(2)], "next_cursor": "t/0/2"}),
            json!({"checkpoints": [cp(3)], "next_cursor": null})
        );
        std::fs::write(&file, pages).unwrap();
        let offsets: Vec<u64> = read_checkpoints(&file)
            .unwrap()
            .iter()
            .map(|c| c.offset)
            .collect();
        assert_eq!(offsets, [1, 2, 3]);
        std::fs::write(&file, json!([cp(4)]).to_string()).unwrap();
        assert_eq!(read_checkpoints(&file).unwrap()[0].offset, 4);
        std::fs::write(&file, "{\"checkpoints\": 3}").unwrap();
        assert!(
            read_checkpoints(&file).is_err(),
            "a malformed file is an error"
        );
    }
}
