//! Listening: loopback unless asked, and no connection kept by a client that sends nothing.
//!
//! Every weft server takes its listener from [`bind`]. Each accepted connection is closed
//! when it has been silent for [`IDLE_TIMEOUT`]: while its request head or body is awaited,
//! and between requests on a kept-alive connection. Without that, a client that opens
//! connections and sends nothing (or stops halfway through a body) holds sockets and tasks
//! for ever; a handler that waits on a body also holds a request slot
//! ([`crate::limit_in_hand`]), which the gateway bounds again with its own body deadline.
//!
//! The timeout is on reads only, and hyper reads while a handler runs (to notice a client
//! that hangs up), so it must be longer than any handler: 120 s, against handlers bounded by
//! their read limits and delivery timeouts to seconds.

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_io_timeout::TimeoutStream;

use crate::BindError;

/// How long a connection may send nothing before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// A TCP listener whose connections close after [`IDLE_TIMEOUT`] (or the given timeout) of
/// silence. Serve it with `axum::serve`.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
    idle: Duration,
}

impl Listener {
    /// The address it listens on (the port the OS chose, for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The same listener, closing connections after `idle` of silence instead.
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }
}

impl axum::serve::Listener for Listener {
    type Io = Pin<Box<TimeoutStream<TcpStream>>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // `TcpListener`'s own `accept` in axum logs and retries an accept error (the process
        // out of file descriptors, say) after a pause, so that case is handled there.
        let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        let mut io = TimeoutStream::new(io);
        io.set_read_timeout(Some(self.idle));
        (Box::pin(io), addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Bind a TCP listener; non-loopback addresses need `allow_remote`.
pub async fn bind(addr: SocketAddr, allow_remote: bool) -> Result<Listener, BindError> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(BindError::NotLoopback(addr));
    }
    let inner = TcpListener::bind(addr)
        .await
        .map_err(|source| BindError::Io { addr, source })?;
    Ok(Listener {
        inner,
        idle: IDLE_TIMEOUT,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn non_loopback_needs_consent() {
        let err = bind("0.0.0.0:0".parse().unwrap(), false).await.unwrap_err();
        assert!(matches!(err, BindError::NotLoopback(_)));
        assert!(bind("127.0.0.1:0".parse().unwrap(), false).await.is_ok());
    }

    /// A connection that sends nothing, and one that stops halfway through its head, are
    /// closed by the server after the idle timeout; a client that talks is answered.
    #[tokio::test]
    async fn a_silent_connection_is_closed_and_a_talking_one_answered() {
        let idle = Duration::from_millis(300);
        let listener = bind("127.0.0.1:0".parse().unwrap(), false)
            .await
            .unwrap()
            .with_idle_timeout(idle);
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "hi" }));
        tokio::spawn(async move { axum::serve(listener, app).await });

        let closed_after = |partial: &'static [u8]| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(partial).await.unwrap();
            let t0 = Instant::now();
            let mut buf = [0u8; 64];
            // The server hangs up: EOF (or a reset). A bound on the wait, not a sleep.
            let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
                .await
                .expect("the server kept a silent connection open for 30 s");
            assert!(
                !matches!(n, Ok(k) if k > 0),
                "no answer to an unfinished head"
            );
            t0.elapsed()
        };
        assert!(closed_after(b"").await >= idle);
        assert!(closed_after(b"GET / HTTP/1.1\r\nhost: x\r\n").await >= idle);

        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("hi"),
            "{answer}"
        );
    }
}
