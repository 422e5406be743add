//! `weft audit`: what a compliance auditor runs. Every query is scoped to one tenant
//! (`--tenant`, default `default`) and bounded in time (`--from`/`--to`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use weft_audit::check::CheckOptions;
use weft_audit::search::Filter;
use weft_audit::sign::{Key, Keyring};
use weft_audit::{bundle, check, log, search, timeline, Range};
use weft_consumers::store::Store;

use crate::config::Settings;

/// Compliance audit: invariant checks, search, timelines, TraceBundles, the tamper-evident
/// hash chain, retention, and a read-only API.
///
/// An auditor's session, typically:
///   weft audit check --tenant acme --from 2026-11-01T00:00:00Z --to 2026-12-01T00:00:00Z
///   weft audit timeline --tenant acme --request req-42
///   weft audit search --tenant acme --decision deny --format csv > denies.csv
///   weft audit bundle --tenant acme --request req-42 --sign-key auditor.key > req-42.json
///   weft audit bundle-check req-42.json --keyring keyring.json
///   weft audit seal --tenant acme --sign-key sealer.key && weft audit verify --tenant acme
///
/// Times are RFC 3339 or relative to now: `30d`, `12h`, `15m` (ago). Every read is logged
/// in `weft_audit_log` (actor `cli:$USER`). See docs/AUDIT.md.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub action: Action,
}

/// The audit subcommands.
#[derive(Debug, Subcommand)]
pub enum Action {
    Check(CheckArgs),
    Timeline(TimelineArgs),
    Search(SearchArgs),
    Bundle(BundleArgs),
    BundleCheck(BundleCheckArgs),
    Keygen(KeygenArgs),
    Seal(SealArgs),
    Verify(VerifyArgs),
    Checkpoints(CheckpointsArgs),
    #[command(subcommand)]
    Retention(RetentionAction),
    Serve(ServeArgs),
}

/// Extend the tenant's hash chains with every fact stored since the last seal, and write a
/// checkpoint per partition (signed with --sign-key). Run one sealer at a time (or let
/// `weft audit serve --seal-every-secs N` do it).
#[derive(Debug, Args)]
pub struct SealArgs {
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
    /// Checkpoint signing key from `weft audit keygen`.
    #[arg(long, env = "WEFT_AUDIT_SEAL_KEY")]
    pub sign_key: Option<PathBuf>,
}

/// Recompute the tenant's hash chains (from genesis, or from the checkpoint before --from)
/// and compare with the stored facts, the stored links and the checkpoints. Names every
/// altered, deleted or inserted row (the first listed is the first broken link). Exit 0
/// intact, 1 broken.
///
/// Facts stored after the last seal are counted as `unsealed`; each must still agree with its
/// own payload (hash, id, typed columns) and own its offset, or it is named. A forgery made
/// consistent in every column at a free offset cannot be told from a new fact (docs/AUDIT.md).
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
    /// Also check these exported checkpoints (from `weft audit checkpoints`).
    #[arg(long)]
    pub checkpoints: Option<PathBuf>,
    /// Verify checkpoint signatures with this keyring (spec keyring format).
    #[arg(long)]
    pub keyring: Option<PathBuf>,
    /// Only the facts with an event time from here (RFC 3339 or `30d`/`12h`/`15m` ago): each
    /// partition's chain is recomputed from its last checkpoint before the range. Without
    /// --from/--to, every chain from genesis.
    #[arg(long)]
    pub from: Option<String>,
    /// End of the range (exclusive; default `now`).
    #[arg(long, requires = "from")]
    pub to: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: TextJson,
}

impl VerifyArgs {
    fn range(&self) -> anyhow::Result<Option<Range>> {
        let Some(from) = &self.from else {
            return Ok(None);
        };
        Scope {
            tenant: self.tenant.clone(),
            from: from.clone(),
            to: self.to.clone().unwrap_or_else(|| "now".into()),
        }
        .range()
        .map(Some)
    }
}

/// Export the tenant's checkpoints as JSON, to keep outside ClickHouse for offline checks.
#[derive(Debug, Args)]
pub struct CheckpointsArgs {
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
}

/// Per-tenant retention (no TTL by default) and legal hold.
#[derive(Debug, Subcommand)]
pub enum RetentionAction {
    /// Print the tenant's retention settings.
    Show(TenantArg),
    /// Keep the tenant's facts N days (0 = forever, the default).
    Set(RetentionSetArgs),
    /// Place (--on) or lift (--off) a legal hold: while on, nothing is deleted.
    Hold(HoldArgs),
    /// Delete facts older than the retention, unless on legal hold.
    Apply(TenantArg),
}

/// Just a tenant.
#[derive(Debug, Args)]
pub struct TenantArg {
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
}

/// `retention set`.
#[derive(Debug, Args)]
pub struct RetentionSetArgs {
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
    #[arg(long)]
    pub days: u32,
}

/// `retention hold`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
    #[arg(long, conflicts_with = "off", required_unless_present = "off")]
    pub on: bool,
    #[arg(long)]
    pub off: bool,
}

/// Serve the read-only audit API (see docs/AUDIT.md for the routes).
///
/// Keys: WEFT_AUDIT_KEYS="key=tenant,..." (or --keys); a key only ever reads its own
/// tenant, so another tenant's ids answer 404. Every read is logged in weft_audit_log.
/// Listens on loopback only unless --allow-remote.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[arg(long, env = "WEFT_AUDIT_LISTEN", default_value = "127.0.0.1:8383")]
    pub listen: std::net::SocketAddr,
    #[arg(long)]
    pub allow_remote: bool,
    /// API keys as key=tenant,key=tenant (prefer the environment variable).
    #[arg(long, env = "WEFT_AUDIT_KEYS", hide_env_values = true)]
    pub keys: Option<String>,
    /// Sign exported bundles and checkpoints with this key.
    #[arg(long, env = "WEFT_AUDIT_SIGN_KEY")]
    pub sign_key: Option<PathBuf>,
    /// Verify checkpoint signatures with this keyring.
    #[arg(long)]
    pub keyring: Option<PathBuf>,
    /// Seal every tenant's new facts this often (0 = never).
    #[arg(long, default_value_t = 0)]
    pub seal_every_secs: u64,
}

/// The tenant and time bounds every query takes.
#[derive(Debug, Clone, Args)]
pub struct Scope {
    /// Tenant to audit (only its rows are ever read).
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
    /// Start of the range (event time, inclusive): RFC 3339 or `30d`/`12h`/`15m` ago.
    #[arg(long, default_value = "90d")]
    pub from: String,
    /// End of the range (exclusive): RFC 3339, `now`, or `30d`/`12h`/`15m` ago.
    #[arg(long, default_value = "now")]
    pub to: String,
}

impl Scope {
    fn range(&self) -> anyhow::Result<Range> {
        let now = weft_schemas::time::parse_micros(&weft_schemas::time::now_rfc3339()).unwrap_or(0);
        let from = parse_time(&self.from, now).with_context(|| format!("--from {}", self.from))?;
        // `now` includes events stamped up to a minute ahead (producer clocks drift).
        let to = if self.to == "now" {
            now + 60_000_000
        } else {
            parse_time(&self.to, now).with_context(|| format!("--to {}", self.to))?
        };
        Ok(Range::new(from, to)?)
    }
}

fn parse_time(s: &str, now: i64) -> anyhow::Result<i64> {
    if s == "now" {
        return Ok(now);
    }
    if let Some(t) = weft_schemas::time::parse_micros(s) {
        return Ok(t);
    }
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
    let n: i64 = num.parse().context("not RFC 3339 nor NNd/NNh/NNm")?;
    let secs = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        _ => anyhow::bail!("not RFC 3339 nor NNd/NNh/NNm"),
    };
    Ok(now - n.saturating_mul(secs).saturating_mul(1_000_000))
}

/// Run the invariant checks (I-01, I-02, I-06, orphans, id conflicts) over a time range.
///
/// Each finding names the events that prove it (kind:id). I-02: every capability_executed
/// has an allow PolicyDecision (its decision_id) and a capability_authorized before it, and
/// no execution follows a deny. I-06: single-use tokens used once, never after expires_at,
/// never outside their scope. I-01: no Frame carries raw_output/raw/raw_result/tool_output.
/// Orphans: trace events whose decision, frame or handle has not arrived within --grace-secs.
/// Id conflicts: one id stored with different contents.
///
/// Exit 0 (or 1 with --fail-on-findings when anything is found).
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub scope: Scope,
    /// Seconds a referenced event may still be in flight before its referrer is an orphan.
    #[arg(long, default_value_t = 300)]
    pub grace_secs: u64,
    /// How far outside the range referenced events (tokens, decisions) are looked up.
    #[arg(long, default_value_t = 86_400)]
    pub lookaround_secs: u64,
    #[arg(long, value_enum, default_value = "text")]
    pub format: TextJson,
    /// Exit with status 1 when anything is found.
    #[arg(long)]
    pub fail_on_findings: bool,
    /// Text format: print only the one-line summary (counts per invariant).
    #[arg(long)]
    pub summary: bool,
}

/// Text for people, JSON for tools.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TextJson {
    Text,
    Json,
}

/// Print the narrative timeline of one request (or of the narrative holding any event id).
#[derive(Debug, Args)]
pub struct TimelineArgs {
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
    /// A request id, or any event id (event_id, decision_id, frame_id, ...).
    #[arg(long)]
    pub request: String,
    #[arg(long, value_enum, default_value = "text")]
    pub format: TextJson,
}

/// Search events by principal, capability, event type, decision, outcome, token, kind or
/// request, in a time range; pages follow a cursor (printed on stderr as `next cursor: ...`;
/// pass it back with --cursor, or use --all to stream every page).
#[derive(Debug, Args)]
pub struct SearchArgs {
    #[command(flatten)]
    pub scope: Scope,
    #[arg(long, default_value = "")]
    pub kind: String,
    #[arg(long, default_value = "")]
    pub principal: String,
    #[arg(long, default_value = "")]
    pub capability: String,
    #[arg(long, default_value = "")]
    pub event_type: String,
    /// allow or deny.
    #[arg(long, default_value = "")]
    pub decision: String,
    #[arg(long, default_value = "")]
    pub outcome: String,
    #[arg(long, default_value = "")]
    pub token: String,
    #[arg(long, default_value = "")]
    pub request: String,
    /// Rows per page (1..=10000).
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// Continue after this cursor.
    #[arg(long)]
    pub cursor: Option<String>,
    /// Follow the cursor to the end.
    #[arg(long)]
    pub all: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub format: SearchFormat,
}

/// Search output formats (CSV leaves the payload out; JSONL carries it).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SearchFormat {
    Table,
    Csv,
    Jsonl,
}

/// Export one request's TraceBundle (weaver-spec extended contract) as JSON on stdout,
/// checked against the schema and the conformance invariants (I-01, I-02) first; optionally
/// signed (JCS + ed25519). Exit 1 when the bundle does not pass (it is still printed).
#[derive(Debug, Args)]
pub struct BundleArgs {
    #[arg(long, env = "WEFT_TENANT", default_value = "default")]
    pub tenant: String,
    /// The request id (or any event id of its narrative).
    #[arg(long)]
    pub request: String,
    /// Signing key file from `weft audit keygen`.
    #[arg(long, env = "WEFT_AUDIT_SIGN_KEY")]
    pub sign_key: Option<PathBuf>,
}

/// Check a TraceBundle file offline: schema, I-01/I-02 and, if signed, its signature
/// against --keyring (the spec's keyring format). Exit 0 pass, 1 fail.
#[derive(Debug, Args)]
pub struct BundleCheckArgs {
    pub file: PathBuf,
    #[arg(long)]
    pub keyring: Option<PathBuf>,
}

/// Make an ed25519 signing key: writes the secret key file (mode 0600) and prints its
/// keyring entry (the public half) for verifiers.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Key id written into every signature.
    #[arg(long)]
    pub kid: String,
    #[arg(long)]
    pub out: PathBuf,
}

fn read_key(path: &std::path::Path) -> anyhow::Result<Key> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading key {}", path.display()))?;
    Ok(Key::from_json(&text)?)
}

async fn logged(store: &Store, tenant: &str, action: &str, q: serde_json::Value, n: u64) {
    if let Err(e) = log::record(store, tenant, &log::cli_actor(), action, &q, n).await {
        tracing::warn!(error = %e, "could not write weft_audit_log");
    }
}

pub async fn run(a: AuditArgs, settings: Settings) -> anyhow::Result<ExitCode> {
    match a.action {
        Action::BundleCheck(b) => return bundle_check(b),
        Action::Keygen(k) => {
            let key = Key::generate(&k.kid)?;
            write_secret(&k.out, &key.to_json())?;
            println!(
                "{}",
                serde_json::to_string_pretty(&Keyring {
                    keys: vec![key.public()]
                })?
            );
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let copy_window = weft_audit::chain::copy_window_secs(settings.ingest.dedup_window_secs);
    let store = Store::new(settings.clickhouse)?;
    match a.action {
        Action::Check(c) => {
            let range = c.scope.range()?;
            let opt = CheckOptions {
                grace_secs: c.grace_secs,
                lookaround_secs: c.lookaround_secs,
            };
            let r = check::run(&store, &c.scope.tenant, range, opt).await?;
            logged(
                &store,
                &c.scope.tenant,
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
        Action::Timeline(t) => {
            let n = match timeline::get(&store, &t.tenant, &t.request).await {
                Ok(n) => n,
                Err(weft_audit::AuditError::NotFound(m)) => {
                    logged(&store, &t.tenant, "timeline", json!({"id": t.request}), 0).await;
                    eprintln!("{m} (tenant {})", t.tenant);
                    return Ok(ExitCode::FAILURE);
                }
                Err(e) => return Err(e.into()),
            };
            logged(
                &store,
                &t.tenant,
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
        Action::Search(s) => {
            let range = s.scope.range()?;
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
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            use std::io::Write;
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
                let page = search::page(
                    &store,
                    &s.scope.tenant,
                    range,
                    &filter,
                    cursor.as_deref(),
                    s.limit,
                )
                .await?;
                total += page.hits.len() as u64;
                for h in &page.hits {
                    match s.format {
                        SearchFormat::Csv => writeln!(out, "{}", search::csv_line(h))?,
                        SearchFormat::Jsonl => writeln!(out, "{}", search::json_line(h))?,
                        SearchFormat::Table => writeln!(
                            out,
                            "{:<27} {:<26} {:<36} {:<28} {:<30} {:<6} {:<8}",
                            weft_schemas::time::micros_to_rfc3339(h.ts),
                            h.kind,
                            h.id,
                            h.event_type,
                            h.capability_id,
                            h.decision,
                            h.outcome
                        )?,
                    }
                }
                cursor = page.next_cursor;
                if !s.all || cursor.is_none() {
                    break;
                }
            }
            out.flush()?;
            if let Some(c) = &cursor {
                eprintln!("next cursor: {c}");
            }
            logged(
                &store,
                &s.scope.tenant,
                "search",
                json!({"range": range, "filter": filter, "cursor": s.cursor}),
                total,
            )
            .await;
            Ok(ExitCode::SUCCESS)
        }
        Action::Bundle(b) => {
            let key = b.sign_key.as_deref().map(read_key).transpose()?;
            let doc = bundle::export(&store, &b.tenant, &b.request, key.as_ref()).await?;
            logged(&store, &b.tenant, "bundle", json!({"id": b.request}), 1).await;
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
        Action::Seal(a) => {
            let key = a.sign_key.as_deref().map(read_key).transpose()?;
            let r = weft_audit::chain::seal(&store, &a.tenant, key.as_ref()).await?;
            println!(
                "sealed {} new facts of tenant {} in {} partitions{}",
                r.sealed,
                a.tenant,
                r.checkpoints.len(),
                if key.is_some() {
                    " (checkpoints signed)"
                } else {
                    " (checkpoints unsigned: pass --sign-key)"
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        Action::Verify(a) => {
            let extra: Vec<weft_audit::chain::Checkpoint> = match &a.checkpoints {
                Some(p) => serde_json::from_str(
                    &std::fs::read_to_string(p)
                        .with_context(|| format!("reading {}", p.display()))?,
                )
                .with_context(|| format!("parsing {}", p.display()))?,
                None => Vec::new(),
            };
            let ring = match &a.keyring {
                Some(p) => Some(Keyring::from_json(
                    &std::fs::read_to_string(p)
                        .with_context(|| format!("reading {}", p.display()))?,
                )?),
                None => None,
            };
            let range = a.range()?;
            let r = weft_audit::chain::verify(
                &store,
                &a.tenant,
                &extra,
                ring.as_ref(),
                range,
                copy_window,
            )
            .await?;
            logged(
                &store,
                &a.tenant,
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
                        a.tenant,
                        if r.ok() { "INTACT" } else { "BROKEN" },
                        r.verified,
                        r.checkpoints_ok,
                        r.unsealed,
                        r.pruned,
                        r.problems.len()
                    );
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
        Action::Checkpoints(a) => {
            let c = weft_audit::chain::checkpoints(&store, &a.tenant).await?;
            logged(&store, &a.tenant, "checkpoints", json!({}), c.len() as u64).await;
            println!("{}", serde_json::to_string_pretty(&c)?);
            Ok(ExitCode::SUCCESS)
        }
        Action::Retention(r) => {
            use weft_audit::retention;
            let (tenant, out) = match r {
                RetentionAction::Show(t) => {
                    let v = retention::get(&store, &t.tenant).await?;
                    (t.tenant, serde_json::to_value(v)?)
                }
                RetentionAction::Set(s) => {
                    let v = retention::set_days(&store, &s.tenant, s.days).await?;
                    (s.tenant, serde_json::to_value(v)?)
                }
                RetentionAction::Hold(h) => {
                    let v = retention::set_hold(&store, &h.tenant, h.on).await?;
                    (h.tenant, serde_json::to_value(v)?)
                }
                RetentionAction::Apply(t) => match retention::apply(&store, &t.tenant).await {
                    Ok(v) => (t.tenant, serde_json::to_value(v)?),
                    Err(weft_audit::AuditError::Refused(m)) => {
                        eprintln!("refused: {m}");
                        return Ok(ExitCode::FAILURE);
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            println!("{}", json!({"tenant": tenant, "retention": out}));
            Ok(ExitCode::SUCCESS)
        }
        Action::Serve(a) => serve(a, store, copy_window)
            .await
            .map(|()| ExitCode::SUCCESS),
        Action::BundleCheck(_) | Action::Keygen(_) => unreachable!("handled above"),
    }
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
    let ring = match &b.keyring {
        Some(p) => Some(Keyring::from_json(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )?),
        None => None,
    };
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
    let keyring = match &a.keyring {
        Some(p) => Some(Arc::new(Keyring::from_json(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )?)),
        None => None,
    };
    if a.seal_every_secs > 0 {
        tokio::spawn(weft_audit::serve::seal_loop(
            store.clone(),
            sign_key.clone(),
            std::time::Duration::from_secs(a.seal_every_secs),
        ));
    }
    let state = weft_audit::serve::AppState {
        store,
        keys: Arc::new(keys),
        sign_key,
        keyring,
        copy_window_secs,
    };
    let listener = weft_http::bind(a.listen, a.allow_remote).await?;
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, "audit API listening");
    println!("listening on http://{local}");
    axum::serve(listener, weft_audit::serve::router(state))
        .with_graceful_shutdown(weft_http::shutdown_signal())
        .await?;
    Ok(())
}

/// Write text to stdout; a closed pipe (`| head`) is not an error.
fn print_text(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
