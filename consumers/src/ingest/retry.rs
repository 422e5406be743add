//! Retrying with backoff: the one schedule and the one stop-aware wait behind every retry of
//! ingest (ClickHouse reads at start and at rebalances, Kafka's watermarks, the flush's
//! inserts and dead letters). What counts as worth another attempt, what is logged and which
//! metric counts it stay with each caller, in the `failed` closure of [`Backoff::retry`], or
//! around [`Backoff::pause`] for the loops with more than one step.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

pub(crate) use weft_store::{unless_stopped, Stopped};

/// The pause before retry `attempt`: 100 ms doubled per attempt (200 ms before the first
/// retry), at most `max_ms`.
pub(crate) fn backoff(attempt: u32, max_ms: u64) -> Duration {
    Duration::from_millis((100u64 << attempt.min(10)).min(max_ms))
}

/// Whether the failure of `attempt` is logged by a loop that may fail for as long as a
/// service is down: the first, then every tenth.
pub(crate) fn sparse(attempt: u32) -> bool {
    attempt == 1 || attempt.is_multiple_of(10)
}

/// How ingest waits between attempts: [`backoff`] up to `max_ms`, cut short as soon as the
/// process is asked to stop (`stop` turns true): a stop must not wait out a backoff.
#[derive(Clone)]
pub(crate) struct Backoff {
    max_ms: u64,
    stop: watch::Receiver<bool>,
}

impl Backoff {
    /// Pauses of at most `max_ms` (`[ingest] max_backoff_ms`), ended by `stop`.
    pub(crate) fn new(max_ms: u64, stop: watch::Receiver<bool>) -> Self {
        Self { max_ms, stop }
    }

    /// The stop signal this backoff gives way to.
    pub(crate) fn stop(&self) -> &watch::Receiver<bool> {
        &self.stop
    }

    /// Whether the process has been asked to stop.
    pub(crate) fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Wait before retry `attempt` (counted from 1), or `Err(Stopped)` as soon as the process
    /// is asked to stop (at once if it was already).
    pub(crate) async fn pause(&self, attempt: u32) -> Result<(), Stopped> {
        let pause = tokio::time::sleep(backoff(attempt, self.max_ms));
        unless_stopped(&self.stop, pause).await
    }

    /// Run `op` until it succeeds. After failed attempt `n` (counted from 1), `failed(e, n)`
    /// logs and counts the failure and says what follows: `Ok` to try again after
    /// [`Backoff::pause`], `Err` to give up with that error. A stop during a pause ends it with
    /// `Stopped` (converted into the caller's error); an attempt under way is not cut short.
    pub(crate) async fn retry<T, E, G, F, Fut>(
        &self,
        mut op: F,
        mut failed: impl FnMut(E, u32) -> Result<(), G>,
    ) -> Result<T, G>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        G: From<Stopped>,
    {
        let mut attempt = 0;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    attempt += 1;
                    failed(e, attempt)?;
                    self.pause(attempt).await?;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let ms = |attempt| backoff(attempt, 10_000).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(6), ms(7), ms(30)],
            [100, 200, 400, 6400, 10_000, 10_000]
        );
        assert_eq!(backoff(3, 0), Duration::ZERO);
    }

    #[test]
    fn a_long_outage_is_logged_sparsely() {
        let logged: Vec<u32> = (1..=30).filter(|a| sparse(*a)).collect();
        assert_eq!(logged, [1, 10, 20, 30]);
    }

    /// Failures are counted from 1 and retried until the operation succeeds.
    #[tokio::test]
    async fn a_failure_is_retried_until_the_operation_succeeds() {
        let (_tx, stop) = watch::channel(false);
        let mut calls = 0;
        let mut seen = Vec::new();
        let r: Result<u32, Stopped> = Backoff::new(0, stop)
            .retry(
                || {
                    calls += 1;
                    std::future::ready(if calls < 3 { Err(calls) } else { Ok(calls) })
                },
                |e, attempt| {
                    seen.push((e, attempt));
                    Ok(())
                },
            )
            .await;
        assert_eq!(r, Ok(3));
        assert_eq!(seen, [(1, 1), (2, 2)]);
    }

    /// `failed` giving up ends the retries with its error, without a pause.
    #[tokio::test]
    async fn giving_up_returns_the_callers_error() {
        #[derive(Debug, PartialEq)]
        enum Gave {
            Up(&'static str),
            Stopped,
        }
        impl From<Stopped> for Gave {
            fn from(_: Stopped) -> Self {
                Gave::Stopped
            }
        }
        let (_tx, stop) = watch::channel(false);
        let r: Result<(), Gave> = Backoff::new(60_000, stop)
            .retry(
                || std::future::ready(Err("rejected")),
                |e, _| Err(Gave::Up(e)),
            )
            .await;
        assert_eq!(r, Err(Gave::Up("rejected")));
    }

    /// A stop ends the retries at the next pause, even a long one.
    #[tokio::test]
    async fn retrying_gives_way_to_a_stop() {
        let (tx, stop) = watch::channel(false);
        let mut calls = 0;
        let r: Result<(), Stopped> = Backoff::new(60_000, stop)
            .retry(
                || {
                    calls += 1;
                    if calls == 3 {
                        let _ = tx.send(true);
                    }
                    std::future::ready(Err(()))
                },
                |_, _| Ok(()),
            )
            .await;
        assert_eq!(r, Err(Stopped));
        assert_eq!(calls, 3);
    }
}
