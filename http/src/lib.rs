//! `weft-http`: the pieces every weft HTTP service shares, so the gateway, the ingest
//! status server, the router and the audit API authenticate and listen the same way.
//!
//! - [`ApiKeys`]: bearer API keys, each scoped to exactly one tenant, kept as digests and
//!   compared in constant time, loaded by one loader ([`ApiKeys::load`]);
//! - [`Caller`]: the one auth extractor (tenant and key id of the bearer key);
//! - [`ApiError`]: the one error body, `{"error": {"code": "...", "message": "..."}}`;
//! - [`limit_in_hand`]: at most N requests in hand, one more answered 503 `busy`;
//! - [`read_body`]: a request body within a size limit and a deadline (408 `body_timeout`),
//!   so a slow body cannot hold a request slot for ever;
//! - [`MetricsRegistry`]: the one `prometheus` registry helper behind `GET /metrics`;
//! - [`cpu`]: CPU seconds from procfs (`process_cpu_seconds_total`, the benchmarks);
//! - [`bind`]: listen on an address, refusing non-loopback addresses unless asked, because
//!   nothing of weft's should be reachable from the network by accident; a connection that
//!   sends nothing for [`IDLE_TIMEOUT`] is closed.

#![warn(missing_docs)]

use std::net::SocketAddr;

mod auth;
mod body;
pub mod cpu;
mod error;
mod keys;
mod limit;
mod listen;
mod metrics;

pub use auth::{Caller, HasApiKeys};
pub use body::{read_body, BodyError};
pub use error::{check_len, error_response, over_length_limit, ApiError, ErrorDetail};
pub use keys::{ApiKeys, AuthError, KeySources, Unauthorized};
pub use limit::{busy, limit_in_hand};
pub use listen::{bind, Listener, IDLE_TIMEOUT};
pub use metrics::{metrics_response, MetricsRegistry};
pub use prometheus;

/// Resolves on SIGINT or SIGTERM: every weft server stops gracefully on either.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Errors binding a listener.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A non-loopback address without `allow_remote`.
    #[error(
        "refusing to listen on {0}: not a loopback address (pass --allow-remote to expose it)"
    )]
    NotLoopback(SocketAddr),
    /// The OS refused the bind (address in use, no permission, ...).
    #[error("cannot listen on {addr}: {source}")]
    Io {
        /// The address we tried to listen on.
        addr: SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
}
