//! Writing a [`Simulation`] out, as `weft simulate` does: envelopes one JSON object a line to a
//! file or standard output, the held-back tail to its own file, every envelope through a
//! [`Publisher`], paced or as fast as possible, and the ground truth at the end.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weft_producers::{Delivery, PublishError, Publisher, Receipt};
use weft_schemas::Envelope;

use crate::Simulation;

/// Receipts awaited at once when publishing (bounds memory; as `weft publish --window`).
const PUBLISH_WINDOW: usize = 50_000;

/// What a caller's publisher set-up may fail with (its own error, passed through).
pub type ConnectError = Box<dyn std::error::Error + Send + Sync>;

/// Why a simulation could not be written out.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// `rate` is negative or not a number.
    #[error("--rate must be a non-negative number")]
    Rate,
    /// An output file could not be created.
    #[error("cannot create {}", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// Writing or flushing an output failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The envelopes could not be written (the cause is its source).
    #[error("cannot write the envelopes")]
    Envelopes(#[source] Box<StreamError>),
    /// The ground truth could not be serialized to its file.
    #[error("cannot write the ground truth")]
    Truth(#[source] serde_json::Error),
    /// The ground-truth file could not be flushed.
    #[error("cannot write {}", path.display())]
    Flush {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The caller's publisher set-up failed.
    #[error(transparent)]
    Connect(ConnectError),
}

impl StreamError {
    /// A reader that stopped early (`| head`): the run ends quietly, it is not an error.
    fn is_broken_pipe(&self) -> bool {
        match self {
            Self::Io(e) | Self::Create { source: e, .. } => e.kind() == io::ErrorKind::BrokenPipe,
            Self::Envelopes(e) => e.is_broken_pipe(),
            _ => false,
        }
    }
}

/// Where a simulation goes.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// The envelopes, one JSON object a line (`-` = standard output). `None`: standard
    /// output, or nowhere when publishing.
    pub out: Option<PathBuf>,
    /// The held-back envelopes (`--delay`) go here instead of at the end of the stream.
    pub held_back_out: Option<PathBuf>,
    /// The ground truth (JSON), written once the stream is done.
    pub truth: Option<PathBuf>,
    /// Envelopes per second (0 = as fast as possible).
    pub rate: f64,
}

/// How the published envelopes fared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// Acknowledged by Kafka.
    pub kafka: u64,
    /// Written to the spool (Kafka unreachable).
    pub spooled: u64,
    /// Refused by the Publisher.
    pub rejected: u64,
    /// The first refusal, `[code] message`.
    pub first_rejection: Option<String>,
}

fn create(path: &Path) -> Result<Box<dyn Write>, StreamError> {
    Ok(if path.as_os_str() == "-" {
        Box::new(BufWriter::with_capacity(1 << 16, io::stdout().lock()))
    } else {
        let f = File::create(path).map_err(|source| StreamError::Create {
            path: path.to_owned(),
            source,
        })?;
        Box::new(BufWriter::with_capacity(1 << 16, f))
    })
}

fn write_line(w: &mut dyn Write, env: &Envelope) -> io::Result<()> {
    serde_json::to_writer(&mut *w, env)?;
    w.write_all(b"\n")
}

/// Holds output to `rate` envelopes per second by sleeping when ahead of schedule.
struct Pace {
    per_event: Option<Duration>,
    started: Instant,
}

impl Pace {
    fn new(rate: f64) -> Result<Self, StreamError> {
        if !(rate.is_finite() && rate >= 0.0) {
            return Err(StreamError::Rate);
        }
        Ok(Self {
            per_event: (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate)),
            started: Instant::now(),
        })
    }

    /// Wait until envelope number `n` is due, flushing first so readers see what is out.
    fn wait(&self, n: u64, sink: &mut Sink) -> io::Result<()> {
        let Some(step) = self.per_event else {
            return Ok(());
        };
        let due = self.started + step.mul_f64(n as f64);
        let now = Instant::now();
        if due > now {
            sink.flush()?;
            std::thread::sleep(due - now);
        }
        Ok(())
    }
}

/// Publishing: the Publisher, and the receipts not yet settled.
pub struct Publishing {
    /// Kept for the Publisher's async parts (connect, registry); publishing itself is sync.
    _runtime: tokio::runtime::Runtime,
    publisher: Publisher,
    window: VecDeque<Receipt>,
    counts: Published,
}

impl Publishing {
    /// Publish through `publisher`, whose background tasks run on `runtime`.
    pub fn new(runtime: tokio::runtime::Runtime, publisher: Publisher) -> Self {
        Self {
            _runtime: runtime,
            publisher,
            window: VecDeque::new(),
            counts: Published::default(),
        }
    }

    fn settle(&mut self, r: Result<Delivery, PublishError>) {
        let c = &mut self.counts;
        match r {
            Ok(Delivery::Kafka { .. }) => c.kafka += 1,
            Ok(Delivery::Spooled) => c.spooled += 1,
            Err(e) => {
                c.rejected += 1;
                c.first_rejection
                    .get_or_insert_with(|| format!("[{}] {e}", e.code()));
            }
        }
    }

    fn publish(&mut self, env: Envelope) {
        match self.publisher.publish(env) {
            Ok(r) => self.window.push_back(r),
            Err(e) => self.settle(Err(e)),
        }
        while self.window.len() > PUBLISH_WINDOW {
            if let Some(r) = self.window.pop_front() {
                self.settle(r.wait_blocking());
            }
        }
    }

    /// Wait until every event is durable, then close the publisher.
    fn finish(&mut self) {
        while let Some(r) = self.window.pop_front() {
            self.settle(r.wait_blocking());
        }
        self.publisher.close(Duration::from_secs(30));
    }
}

/// Where envelopes go: the out file, the held-back file, the Publisher.
struct Sink {
    out: Option<Box<dyn Write>>,
    held_back_path: Option<PathBuf>,
    held_back: Option<Box<dyn Write>>,
    publishing: Option<Publishing>,
}

impl Sink {
    fn put(&mut self, env: Envelope, held_back: bool) -> Result<(), StreamError> {
        if let (true, Some(path)) = (held_back, self.held_back_path.clone()) {
            if self.held_back.is_none() {
                self.flush()?;
                self.held_back = Some(create(&path)?);
            }
            if let Some(w) = self.held_back.as_deref_mut() {
                write_line(w, &env)?;
            }
            return Ok(());
        }
        if let Some(w) = self.out.as_deref_mut() {
            write_line(w, &env)?;
        }
        if let Some(p) = self.publishing.as_mut() {
            p.publish(env);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        for w in [self.out.as_deref_mut(), self.held_back.as_deref_mut()]
            .into_iter()
            .flatten()
        {
            w.flush()?;
        }
        Ok(())
    }
}

/// Every envelope of `sim` into the sink, paced.
fn pump(
    sim: &mut Simulation,
    pace: &Pace,
    sink: &mut Sink,
    n: &mut u64,
) -> Result<(), StreamError> {
    while let Some(env) = sim.next() {
        pace.wait(*n, sink)?;
        sink.put(env, sim.emitting_held_back())?;
        *n += 1;
    }
    sink.flush()?;
    Ok(())
}

/// Write `sim` out as `output` says, publishing every envelope too when `connect` is given
/// (it is called once the output files are open, so plain generation never needs a
/// publisher's configuration). Returns how the published envelopes fared (`None` without
/// `connect`).
///
/// A reader that closes the output early (`| head`) ends the run quietly, there: the
/// envelopes published so far are still made durable and counted, and the publisher closed,
/// as at the end of a whole run; the ground truth, which would describe envelopes never sent,
/// is not written.
pub fn run<C>(
    sim: Simulation,
    output: &Output,
    connect: Option<C>,
) -> Result<Option<Published>, StreamError>
where
    C: FnOnce() -> Result<Publishing, ConnectError>,
{
    let pace = Pace::new(output.rate)?;
    let out = match (&output.out, connect.is_some()) {
        (Some(path), _) => Some(create(path)?),
        (None, false) => Some(create(Path::new("-"))?),
        (None, true) => None,
    };
    stream(sim, output, &pace, out, connect)
}

/// [`run`], with the output already open.
fn stream<C>(
    mut sim: Simulation,
    output: &Output,
    pace: &Pace,
    out: Option<Box<dyn Write>>,
    connect: Option<C>,
) -> Result<Option<Published>, StreamError>
where
    C: FnOnce() -> Result<Publishing, ConnectError>,
{
    let publishing = match connect {
        Some(c) => Some(c().map_err(StreamError::Connect)?),
        None => None,
    };
    let mut sink = Sink {
        out,
        held_back_path: output.held_back_out.clone(),
        held_back: None,
        publishing,
    };
    let started = Instant::now();
    let mut n = 0u64;
    match pump(&mut sim, pace, &mut sink, &mut n) {
        Err(e) if e.is_broken_pipe() => {
            tracing::info!(written = n, "output closed by the reader; stopping");
            let Some(mut p) = sink.publishing.take() else {
                return Ok(None);
            };
            p.finish();
            if let Some(path) = &output.truth {
                tracing::warn!(
                    truth = %path.display(),
                    "the stream was cut short: no ground truth written"
                );
            }
            return Ok(Some(p.counts));
        }
        other => other.map_err(|e| StreamError::Envelopes(Box::new(e)))?,
    }
    if let Some(p) = sink.publishing.as_mut() {
        p.finish();
    }
    log_totals(&sim, started.elapsed());
    if let Some(path) = &output.truth {
        let mut w = create(path)?;
        serde_json::to_writer(&mut w, sim.truth()).map_err(StreamError::Truth)?;
        w.write_all(b"\n")?;
        w.flush().map_err(|source| StreamError::Flush {
            path: path.clone(),
            source,
        })?;
    }
    Ok(sink.publishing.map(|p| p.counts))
}

fn log_totals(sim: &Simulation, elapsed: Duration) {
    let t = &sim.truth().totals;
    tracing::info!(
        flows = t.flows,
        envelopes = t.envelopes,
        distinct_events = t.distinct_events,
        duplicates = t.duplicates,
        held_back = t.held_back,
        without_request_id = t.without_request_id,
        violations = t.violations.values().sum::<u64>(),
        seconds = elapsed.as_secs_f64(),
        events_per_second = (t.envelopes as f64 / elapsed.as_secs_f64().max(1e-9)).round(),
        "simulation done"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GroundTruth, SimConfig};

    fn no_publisher() -> Option<fn() -> Result<Publishing, ConnectError>> {
        None
    }

    #[test]
    fn a_closed_reader_is_recognised_through_the_wrapping() {
        let pipe = || StreamError::Io(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(pipe().is_broken_pipe());
        assert!(StreamError::Envelopes(Box::new(pipe())).is_broken_pipe());
        let create = StreamError::Create {
            path: "x".into(),
            source: io::Error::from(io::ErrorKind::BrokenPipe),
        };
        assert!(create.is_broken_pipe());
        assert!(
            !StreamError::Io(io::Error::from(io::ErrorKind::PermissionDenied)).is_broken_pipe()
        );
    }

    /// Takes `budget` bytes, then answers every write as a closed pipe; counts the whole
    /// lines it took.
    struct ClosesAfter {
        budget: usize,
        lines: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Write for ClosesAfter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.budget == 0 {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            let n = buf.len().min(self.budget);
            self.budget -= n;
            let nl = buf[..n].iter().filter(|b| **b == b'\n').count();
            self.lines
                .fetch_add(nl, std::sync::atomic::Ordering::SeqCst);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_reader_closing_early_still_gets_the_published_envelopes_made_durable_and_counted() {
        let dir = std::env::temp_dir().join(format!("weft-sim-pipe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let truth = dir.join("t.json");
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let publisher = runtime
            .block_on(Publisher::connect(weft_producers::PublisherConfig {
                // Nothing listens on the discard port: every event ends in the spool.
                brokers: "127.0.0.1:9".into(),
                spool_dir: dir.join("spool"),
                message_timeout_ms: 300,
                ..weft_producers::PublisherConfig::default()
            }))
            .unwrap();
        let handle = publisher.clone();
        let connect =
            move || -> Result<Publishing, ConnectError> { Ok(Publishing::new(runtime, publisher)) };
        let lines = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let out: Box<dyn Write> = Box::new(ClosesAfter {
            budget: 8_000,
            lines: lines.clone(),
        });
        let cfg = SimConfig {
            flows: 30,
            record_truth: true,
            ..SimConfig::default()
        };
        let output = Output {
            truth: Some(truth.clone()),
            ..Output::default()
        };
        let published = stream(
            Simulation::new(cfg).unwrap(),
            &output,
            &Pace::new(0.0).unwrap(),
            Some(out),
            Some(connect),
        )
        .unwrap()
        .expect("what was published is counted");
        let written = lines.load(std::sync::atomic::Ordering::SeqCst) as u64;
        assert!(written > 0, "the writer took some whole lines");
        // Every envelope written was published, and its receipt awaited: each is counted.
        assert_eq!(
            published.kafka + published.spooled,
            written,
            "{published:?}"
        );
        assert_eq!(published.rejected, 0, "{published:?}");
        assert_eq!(handle.spool_pending(), published.spooled);
        // The publisher was closed, not just dropped.
        let env: Envelope = serde_json::from_str(
            r#"{"kind":"trace_event","request_id":"r","payload":{"event_id":"e","event_type":"flow_started","timestamp":"2026-03-08T06:00:05Z"}}"#,
        )
        .unwrap();
        assert!(matches!(handle.publish(env), Err(PublishError::Closed)));
        assert!(!truth.exists(), "no ground truth for a stream cut short");
        drop(handle);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_negative_rate_is_refused_before_any_file_is_made() {
        let dir = std::env::temp_dir().join(format!("weft-sim-rate-{}", std::process::id()));
        let out = dir.join("never.jsonl");
        let sim = Simulation::new(SimConfig::default()).unwrap();
        let output = Output {
            out: Some(out.clone()),
            rate: -1.0,
            ..Output::default()
        };
        let r = run(sim, &output, no_publisher());
        assert!(matches!(r, Err(StreamError::Rate)), "{r:?}");
        assert!(!out.exists());
    }

    #[test]
    fn the_held_back_tail_and_the_truth_go_to_their_own_files() {
        let dir = std::env::temp_dir().join(format!("weft-sim-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (out, late, truth) = (
            dir.join("a.jsonl"),
            dir.join("late.jsonl"),
            dir.join("t.json"),
        );
        let cfg = SimConfig {
            flows: 30,
            delay: 0.2,
            record_truth: true,
            ..SimConfig::default()
        };
        let output = Output {
            out: Some(out.clone()),
            held_back_out: Some(late.clone()),
            truth: Some(truth.clone()),
            rate: 0.0,
        };
        let published = run(Simulation::new(cfg).unwrap(), &output, no_publisher()).unwrap();
        assert_eq!(published, None, "nothing published without a publisher");
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        let t: GroundTruth = serde_json::from_str(&read(&truth)).unwrap();
        let (main, tail) = (read(&out).lines().count(), read(&late).lines().count());
        assert!(t.totals.held_back > 0);
        assert_eq!(tail as u64, t.totals.held_back);
        assert_eq!((main + tail) as u64, t.totals.envelopes);
        assert_eq!(t.requests.len(), 30);
        std::fs::remove_dir_all(&dir).ok();
    }
}
