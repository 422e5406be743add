//! What `publish` hands back: a [`Receipt`] that resolves to where the event is durable.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::PublishError;

/// Where a durable event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Acknowledged by Kafka at this partition and offset.
    Kafka {
        /// Partition the event was written to.
        partition: i32,
        /// Offset of the event in that partition.
        offset: i64,
    },
    /// In the spool, fsynced per policy; the replayer will deliver it.
    Spooled,
}

pub(super) type Reply = oneshot::Sender<Result<Delivery, PublishError>>;

/// A promise of durability for one published event. Await it (or call
/// [`Receipt::wait_blocking`] outside an async runtime); it resolves when the event is
/// durable, or with the reason it could not be made so.
#[derive(Debug)]
pub struct Receipt {
    /// The event's natural identity (event_id, decision_id, ... or the feedback's hash).
    pub id: String,
    pub(super) rx: oneshot::Receiver<Result<Delivery, PublishError>>,
}

impl Receipt {
    /// Block the current thread until the event is durable. Not for use inside a runtime.
    pub fn wait_blocking(self) -> Result<Delivery, PublishError> {
        self.rx.blocking_recv().unwrap_or(Err(PublishError::Closed))
    }
}

impl Future for Receipt {
    type Output = Result<Delivery, PublishError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(PublishError::Closed)))
    }
}
