//! `weft publish`: send a JSONL file of envelopes (or bare payloads) through the Publisher.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::value::RawValue;
use weft_producers::{Delivery, FsyncPolicy, Publisher, PublisherConfig, Receipt, ValueFormat};
use weft_schemas::{Envelope, Kind, Topics};

use crate::config::Settings;

/// Publisher options shared by `weft publish`, `weft gateway` and `weft bench publish`.
///
/// Each overrides the `[publisher]` section of the config file.
#[derive(Debug, Clone, Args)]
pub struct PublisherArgs {
    /// Directory of the durable spool, where events wait while Kafka is unreachable. Keep it
    /// stable across restarts: a restart replays what it holds. One process per directory.
    #[arg(long, env = "WEFT_SPOOL_DIR", value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,

    /// Topic name prefix (topics are <prefix><kind plural>, e.g. weaver.trace_events).
    #[arg(long, env = "WEFT_TOPIC_PREFIX", value_name = "PREFIX")]
    pub topic_prefix: Option<String>,

    /// Record value encoding: json (payload text as submitted), avro (single-object framing),
    /// avro-confluent (needs [publisher] schema_registry_url).
    #[arg(long, value_name = "json|avro|avro-confluent")]
    pub content_type: Option<ValueFormat>,

    /// When the spool fsyncs: always (each group of appends), interval:<ms>, or never.
    #[arg(long, env = "WEFT_SPOOL_FSYNC", value_name = "POLICY")]
    pub fsync: Option<FsyncPolicy>,

    /// How long a message may wait for Kafka before it is spooled instead (ms).
    #[arg(long, value_name = "MS")]
    pub message_timeout_ms: Option<u64>,

    /// Partitions for topics created at start-up.
    #[arg(long, value_name = "N")]
    pub partitions: Option<i32>,

    /// Do not create missing topics at start-up.
    #[arg(long)]
    pub no_create_topics: bool,
}

impl PublisherArgs {
    /// The `[publisher]` section with these flags applied and brokers defaulted from `[kafka]`.
    pub fn resolve(&self, settings: &Settings) -> PublisherConfig {
        let mut c = settings.publisher.clone();
        if c.brokers.trim().is_empty() {
            c.brokers = settings.kafka.brokers.clone();
        }
        if let Some(d) = &self.spool_dir {
            c.spool_dir = d.clone();
        }
        if let Some(p) = &self.topic_prefix {
            c.topics = Topics {
                prefix: p.clone(),
                ..c.topics
            };
        }
        if let Some(v) = self.content_type {
            c.content_type = v;
        }
        if let Some(v) = self.fsync {
            c.fsync = v;
        }
        if let Some(v) = self.message_timeout_ms {
            c.message_timeout_ms = v;
        }
        if let Some(v) = self.partitions {
            c.partitions = v;
        }
        c
    }

    /// Connect, and create missing topics unless told not to. An unreachable broker is not
    /// fatal: events are spooled and replayed later.
    pub async fn connect(&self, settings: &Settings) -> anyhow::Result<Publisher> {
        let config = self.resolve(settings);
        let spool = config.spool_dir.clone();
        let publisher = Publisher::connect(config)
            .await
            .with_context(|| format!("starting the publisher (spool {})", spool.display()))?;
        if !self.no_create_topics {
            match tokio::time::timeout(Duration::from_secs(15), publisher.ensure_topics()).await {
                Ok(Ok(created)) if !created.is_empty() => {
                    tracing::info!(?created, "created topics")
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "could not create topics"),
                Err(_) => tracing::warn!("topic creation timed out (is the broker up?)"),
            }
        }
        Ok(publisher)
    }
}

/// Publish a JSONL file of envelopes, or of bare payloads with --kind.
///
/// Each line is one envelope {kind, request_id?, tenant?, payload} (or, with --kind, one bare
/// payload of that kind). Every line is validated; invalid lines are reported with their line
/// number and reason, and never published. The command returns once every accepted event is
/// durable: acknowledged by Kafka (acks=all), or written to the spool when Kafka is
/// unreachable. Spooled events are replayed by the next run, or by `weft publish
/// --drain-spool`. A spooled event Kafka refused for good on replay is set aside in the
/// spool folder's refused.jsonl; once the cause is fixed, `--republish-refused` sends those
/// again (stop the process that owns the spool first: one process per spool).
///
/// Exit status: 0 when every line was accepted and made durable, 1 otherwise.
///
/// Examples:
///   weft publish events.jsonl
///   weft simulate --flows 10 --out - | weft publish -
///   weft publish --kind trace_event payloads.jsonl
///   weft publish --drain-spool --drain-timeout 120
///   weft publish --republish-refused
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct PublishArgs {
    /// JSONL file to publish; `-` reads standard input.
    #[arg(
        value_name = "FILE",
        required_unless_present_any = ["drain_spool", "republish_refused"]
    )]
    pub file: Option<PathBuf>,

    /// Lines are bare payloads of this kind, not envelopes.
    #[arg(long, value_name = "KIND")]
    pub kind: Option<Kind>,

    /// Request id for bare payloads (--kind); envelopes carry their own.
    #[arg(long, value_name = "ID", requires = "kind")]
    pub request_id: Option<String>,

    /// Tenant for bare payloads (--kind).
    #[arg(long, value_name = "TENANT", requires = "kind")]
    pub tenant: Option<String>,

    /// Only deliver what the spool holds from earlier runs, then exit (with FILE: after it).
    #[arg(long)]
    pub drain_spool: bool,

    /// Send the records set aside in the spool's refused.jsonl (Kafka refused them for good
    /// on replay) again, as they were spooled; the ones Kafka refuses again stay in the file
    /// with the new error. Exit status 1 if any stays.
    #[arg(long)]
    pub republish_refused: bool,

    /// How long --drain-spool waits for the spool to empty (seconds).
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub drain_timeout: u64,

    /// Events awaiting durability at once (bounds memory on big files).
    #[arg(long, default_value_t = 50_000, value_name = "N")]
    pub window: usize,

    /// Refuse payloads with top-level keys neither defined by their kind nor of the
    /// x_<org>_<field> shape (`nonconforming_key`); by default such keys are counted and
    /// logged (info) [config: [publisher] refuse_nonconforming_keys].
    #[arg(long)]
    pub refuse_nonconforming_keys: bool,

    #[command(flatten)]
    pub publisher: PublisherArgs,
}

/// Counts for the summary line.
#[derive(Debug, Default)]
struct Tally {
    kafka: u64,
    spooled: u64,
    rejected: Vec<(u64, String)>,
}

impl Tally {
    fn settle(&mut self, line: u64, r: Result<Delivery, weft_producers::PublishError>) {
        match r {
            Ok(Delivery::Kafka { .. }) => self.kafka += 1,
            Ok(Delivery::Spooled) => self.spooled += 1,
            Err(e) => self.rejected.push((line, format!("[{}] {e}", e.code()))),
        }
    }
}

fn parse_line(args: &PublishArgs, line: &str) -> Result<Envelope, String> {
    match args.kind {
        Some(kind) => {
            let payload = RawValue::from_string(line.trim().to_owned())
                .map_err(|e| format!("[malformed_json] {e}"))?;
            let mut env = Envelope {
                kind,
                request_id: args.request_id.clone(),
                tenant: weft_schemas::DEFAULT_TENANT.into(),
                producer_id: None,
                seq: None,
                emitted_at: None,
                payload,
            };
            if let Some(t) = &args.tenant {
                env.tenant = t.clone();
            }
            Ok(env)
        }
        None => serde_json::from_str::<Envelope>(line).map_err(|e| {
            let code = if e.is_syntax() || e.is_eof() {
                "malformed_json"
            } else if e.to_string().contains("unknown variant") {
                "unknown_kind"
            } else {
                "invalid_envelope"
            };
            format!("[{code}] {e}")
        }),
    }
}

/// How long `--republish-refused` waits for each record: the message timeout the publisher
/// was built with (the flag's, over the file's), and 5 s for the broker's answer.
fn republish_timeout(flags: &PublisherArgs, settings: &Settings) -> Duration {
    let resolved = flags.resolve(settings).message_timeout_ms;
    Duration::from_millis(resolved.saturating_add(5_000))
}

pub async fn run(args: PublishArgs, mut settings: Settings) -> anyhow::Result<bool> {
    settings.publisher.refuse_nonconforming_keys |= args.refuse_nonconforming_keys;
    let publisher = args.publisher.connect(&settings).await?;
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut lines = 0u64;
    if let Some(file) = &args.file {
        let input: Box<dyn BufRead> = if file.as_os_str() == "-" {
            Box::new(BufReader::new(std::io::stdin()))
        } else {
            Box::new(BufReader::new(
                std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?,
            ))
        };
        let mut window: VecDeque<(u64, Receipt)> = VecDeque::new();
        for (i, line) in input.lines().enumerate() {
            let n = i as u64 + 1;
            let line = line.with_context(|| format!("reading line {n}"))?;
            if line.trim().is_empty() {
                continue;
            }
            lines += 1;
            let env = match parse_line(&args, &line) {
                Ok(env) => env,
                Err(reason) => {
                    tally.rejected.push((n, reason));
                    continue;
                }
            };
            match publisher.publish(env) {
                Ok(r) => window.push_back((n, r)),
                Err(e) => tally.rejected.push((n, format!("[{}] {e}", e.code()))),
            }
            while window.len() > args.window.max(1) {
                if let Some((n, r)) = window.pop_front() {
                    tally.settle(n, r.await);
                }
            }
        }
        for (n, r) in window {
            tally.settle(n, r.await);
        }
    }
    let mut drained = true;
    if args.drain_spool {
        let p = publisher.clone();
        let timeout = Duration::from_secs(args.drain_timeout);
        drained = tokio::task::spawn_blocking(move || p.wait_drained(timeout)).await?;
    }
    let mut republished_all = true;
    if args.republish_refused {
        let p = publisher.clone();
        let timeout = republish_timeout(&args.publisher, &settings);
        let r = tokio::task::spawn_blocking(move || p.republish_refused(timeout)).await??;
        for (line, why) in &r.unreadable {
            eprintln!("{}:{line}: unreadable, kept: {why}", r.path.display());
        }
        println!(
            "{}: {} republished to Kafka, {} refused again and kept, {} unreadable and kept",
            r.path.display(),
            r.delivered,
            r.kept,
            r.unreadable.len()
        );
        republished_all = r.kept == 0 && r.unreadable.is_empty();
    }
    let pending = publisher.spool_pending();
    let p = publisher.clone();
    tokio::task::spawn_blocking(move || p.close(Duration::from_secs(30))).await?;

    tally.rejected.sort();
    for (line, reason) in &tally.rejected {
        eprintln!("line {line}: rejected: {reason}");
    }
    let replayed = publisher.metrics().replayed.get();
    println!(
        "{lines} lines: {} published to Kafka, {} spooled, {} rejected; {replayed} replayed from the spool; {:.1}s",
        tally.kafka,
        tally.spooled,
        tally.rejected.len(),
        started.elapsed().as_secs_f64()
    );
    // Logged (info), not printed: the summary line stays as it was.
    let odd = publisher.metrics().publisher_nonconforming_keys.get();
    if odd > 0 {
        tracing::info!(
            keys = odd,
            "payload keys neither defined by their kind nor of the x_<org>_<field> shape \
             (counted; --refuse-nonconforming-keys refuses them)"
        );
    }
    if pending > 0 {
        println!(
            "{pending} events wait in the spool; the next run (or `weft publish --drain-spool`) delivers them"
        );
    }
    if !drained {
        eprintln!("the spool did not drain within {}s", args.drain_timeout);
    }
    Ok(tally.rejected.is_empty() && drained && republished_all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn republish_waits_the_message_timeout_of_the_flag_not_of_the_file() {
        let mut settings = Settings::default();
        settings.publisher.message_timeout_ms = 1_000;
        let flag = PublisherArgs {
            spool_dir: None,
            topic_prefix: None,
            content_type: None,
            fsync: None,
            message_timeout_ms: Some(60_000),
            partitions: None,
            no_create_topics: false,
        };
        assert_eq!(
            republish_timeout(&flag, &settings),
            Duration::from_millis(65_000)
        );
        let no_flag = PublisherArgs {
            message_timeout_ms: None,
            ..flag
        };
        assert_eq!(
            republish_timeout(&no_flag, &settings),
            Duration::from_millis(6_000)
        );
    }
}
