//! Reading a request body within a size limit and a deadline.
//!
//! A request holds one of its server's `max_concurrent_requests` slots
//! ([`crate::limit_in_hand`]) while its body arrives, and the connection's idle timeout
//! ([`crate::IDLE_TIMEOUT`]) restarts with every byte: without a deadline on the whole body,
//! a client trickling a byte a minute on as many connections as there are slots keeps every
//! other caller at 503 `busy` for as long as it likes. [`read_body`] is the one reader the
//! gateway and the router use: past its deadline the request is answered 408
//! `body_timeout` and its slot freed.

use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::http::StatusCode;
use tracing::{info_span, Instrument};

use crate::{over_length_limit, ApiError};

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body is over the route's byte limit (declared or streamed).
    #[error("request body is over the {limit}-byte limit; split the request")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The whole body did not arrive within the deadline.
    #[error("the request body did not arrive within {} s", .timeout.as_secs_f64())]
    Timeout {
        /// The deadline.
        timeout: Duration,
    },
    /// The body could not be read for another reason (the client reset the connection, a
    /// bad chunk).
    #[error("the request body could not be read: {0}")]
    Unreadable(String),
}

impl BodyError {
    /// The HTTP status and `error.code` of this error: 413 `body_too_large`, 408
    /// `body_timeout`, 400 `body_unreadable`.
    pub fn status_code(&self) -> (StatusCode, &'static str) {
        match self {
            BodyError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
            BodyError::Timeout { .. } => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            BodyError::Unreadable(_) => (StatusCode::BAD_REQUEST, "body_unreadable"),
        }
    }
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge { limit } => ApiError::too_large(limit),
            other => {
                let (status, code) = other.status_code();
                ApiError::new(status, code, other.to_string())
            }
        }
    }
}

/// The whole body, at most `limit` bytes (a body whose declared length, its size hint, is
/// over it is refused before a byte is read), within `timeout`.
pub async fn read_body(body: Body, limit: usize, timeout: Duration) -> Result<Bytes, BodyError> {
    if axum::body::HttpBody::size_hint(&body)
        .exact()
        .is_some_and(|n| n > limit as u64)
    {
        return Err(BodyError::TooLarge { limit });
    }
    let read = to_bytes(body, limit).instrument(info_span!("read_body"));
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if over_length_limit(&e) => Err(BodyError::TooLarge { limit }),
        Ok(Err(e)) => Err(BodyError::Unreadable(e.to_string())),
        Err(_) => Err(BodyError::Timeout { timeout }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use http_body_util::channel::Channel;

    use super::*;

    #[tokio::test]
    async fn a_body_that_stops_coming_times_out_and_one_over_the_limit_is_too_large() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let sender = tokio::spawn(async move {
            // One byte, then silence: the sender is kept alive past the deadline.
            let _ = tx.send_data(Bytes::from_static(b"{")).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(tx);
        });
        let started = Instant::now();
        let e = read_body(Body::new(rx), 1024, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(e, BodyError::Timeout { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let api = ApiError::from(e);
        assert_eq!(
            (api.status, api.code.as_ref()),
            (StatusCode::REQUEST_TIMEOUT, "body_timeout")
        );
        sender.abort();

        let e = read_body(Body::from(vec![b' '; 17]), 16, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(e, BodyError::TooLarge { limit: 16 }), "{e}");
        let ok = read_body(Body::from("{}"), 16, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(&ok[..], b"{}");
    }
}
