//! The flags of `weft audit` and its subcommands, and how the time bounds parse.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use weft_audit::Range;
use weft_schemas::ports;

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
/// checkpoint per partition (signed with --sign-key). Let `weft audit serve
/// --seal-every-secs N` do it continuously (two sealers at once are harmless: they write the
/// same links, read once). A new row that disagrees with its own payload (the check `verify`
/// makes of unsealed rows) is not sealed, nor is anything after it in its partition: each is
/// named on stderr and the exit code is 1.
#[derive(Debug, Args)]
pub struct SealArgs {
    #[command(flatten)]
    pub tenant: TenantArg,
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
    #[command(flatten)]
    pub tenant: TenantArg,
    /// Also check these exported checkpoints: the output of `weft audit checkpoints`, or the
    /// pages of `GET /v1/audit/checkpoints` saved one after another.
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
    pub(super) fn range(&self) -> anyhow::Result<Option<Range>> {
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
    #[command(flatten)]
    pub tenant: TenantArg,
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
    Apply(ApplyArgs),
}

/// The tenant every audit command is scoped to (`--tenant`, `WEFT_TENANT`).
#[derive(Debug, Clone, Args)]
pub struct TenantArg {
    /// Tenant to audit (only its rows are ever read).
    #[arg(
        id = "tenant",
        long = "tenant",
        env = "WEFT_TENANT",
        default_value = "default",
        value_name = "TENANT"
    )]
    pub name: String,
}

/// `retention set`.
#[derive(Debug, Args)]
pub struct RetentionSetArgs {
    #[command(flatten)]
    pub tenant: TenantArg,
    /// Days to keep the tenant's facts: 1 to 36500 (100 years); 0 keeps them forever.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=i64::from(weft_audit::retention::MAX_DAYS)))]
    pub days: u32,
}

/// `retention apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub tenant: TenantArg,
    /// Print the cutoff and how many facts would be deleted, and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Sign the recorded `pruned_before` with this key (the sealer's, from `weft audit
    /// keygen`): `weft audit verify --keyring` uses only a signed one.
    #[arg(long, env = "WEFT_AUDIT_SEAL_KEY")]
    pub sign_key: Option<PathBuf>,
}

/// `retention hold`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    #[command(flatten)]
    pub tenant: TenantArg,
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
    #[arg(long, env = "WEFT_AUDIT_LISTEN", default_value_t = ports::loopback(ports::AUDIT))]
    pub listen: std::net::SocketAddr,
    #[arg(long)]
    pub allow_remote: bool,
    /// API keys as key=tenant,key=tenant (prefer the environment variable).
    #[arg(long, env = "WEFT_AUDIT_KEYS", hide_env_values = true)]
    pub keys: Option<String>,
    /// Sign exported bundles and checkpoints with this key.
    #[arg(long, env = "WEFT_AUDIT_SIGN_KEY")]
    pub sign_key: Option<PathBuf>,
    /// Verify checkpoint signatures with this keyring. Without it, `/v1/audit/verify` checks
    /// them with the public key of --sign-key (list earlier keys here after a rotation);
    /// with neither, it cannot tell a forged checkpoint from a real one.
    #[arg(long, env = "WEFT_AUDIT_KEYRING")]
    pub keyring: Option<PathBuf>,
    /// Seal every tenant's new facts this often (0 = never).
    #[arg(long, default_value_t = 0)]
    pub seal_every_secs: u64,
    /// The most stored facts, links and checkpoints one `GET /v1/audit/verify` may read
    /// (and rows its copy lookup of unsealed facts scans); past it the request is refused (422 `too_large`) before the rest is read: ask for
    /// a narrower range, or run `weft audit verify`, which has no limit. Each partition's chain
    /// is recomputed from its last checkpoint before the range, so sealing often (see
    /// --seal-every-secs) keeps a range cheap.
    #[arg(long, env = "WEFT_AUDIT_MAX_VERIFY_ROWS", default_value_t = 1_000_000)]
    pub max_verify_rows: u64,
    /// The most rows any one ClickHouse query of a request may read (ClickHouse's
    /// max_rows_to_read, sent with every query of the API but verify's, which has its own
    /// budget above; 0: no limit): past it ClickHouse stops the query and the request is
    /// refused (422 `too_large`). A request makes a few queries, so its work is bounded by a
    /// small multiple of this, whatever it asks: a check over a long range, a search with a
    /// rare filter. Ask for less, or run the CLI, which has no limit.
    #[arg(long, env = "WEFT_AUDIT_MAX_READ_ROWS", default_value_t = 5_000_000)]
    pub max_read_rows: u64,
    /// The most /v1/audit requests handled at once; one more is answered at once, 503
    /// `busy` with `Retry-After: 1`. With --max-read-rows this bounds what the API can ask of
    /// ClickHouse at any moment.
    #[arg(long, env = "WEFT_AUDIT_MAX_CONCURRENT_REQUESTS",
          default_value_t = weft_audit::serve::DEFAULT_MAX_CONCURRENT_REQUESTS)]
    pub max_concurrent_requests: usize,
}

/// The tenant and time bounds every query takes.
#[derive(Debug, Clone, Args)]
pub struct Scope {
    #[command(flatten)]
    pub tenant: TenantArg,
    /// Start of the range (event time, inclusive): RFC 3339 or `30d`/`12h`/`15m` ago.
    #[arg(long, default_value = "90d")]
    pub from: String,
    /// End of the range (exclusive): RFC 3339, `now`, or `30d`/`12h`/`15m` ago.
    #[arg(long, default_value = "now")]
    pub to: String,
}

impl Scope {
    pub(super) fn range(&self) -> anyhow::Result<Range> {
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
/// no execution follows a deny; every PolicyDecision is named by a TraceEvent's decision_id
/// (once ingested more than --grace-secs ago). I-06: single-use tokens used once, never after expires_at,
/// never outside their scope. I-01: no Frame carries raw_output/raw/raw_result/tool_output.
/// Orphans: trace events whose decision, frame or handle has not arrived within --grace-secs.
/// Id conflicts: one id stored with different contents.
///
/// Exit 0 (or 1 with --fail-on-findings when anything is found).
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub scope: Scope,
    /// Seconds a referenced event may still be in flight before its referrer is an orphan
    /// (and a PolicyDecision's trace events before it is I-02 decision_untraced).
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
    #[command(flatten)]
    pub tenant: TenantArg,
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
    #[command(flatten)]
    pub tenant: TenantArg,
    /// The request id (or any event id of its narrative).
    #[arg(long)]
    pub request: String,
    /// Signing key file from `weft audit keygen`.
    #[arg(long, env = "WEFT_AUDIT_SIGN_KEY")]
    pub sign_key: Option<PathBuf>,
    /// Refuse a narrative of more members than this (0: no limit). The bundle is built in
    /// memory whole (its signature covers the whole document), so this and
    /// --max-payload-bytes bound what the command holds.
    #[arg(long, default_value_t = 1_000_000)]
    pub max_members: u64,
    /// Refuse a narrative whose members hold more payload bytes than this (0: no limit);
    /// the command needs a few times this much memory.
    #[arg(long, default_value_t = 1 << 30)]
    pub max_payload_bytes: u64,
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
