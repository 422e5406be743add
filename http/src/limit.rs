//! A bound on the requests a server holds at once.
//!
//! Each request is bounded (body size, rows read), but their number is not: without a cap a
//! burst of expensive requests holds memory and ClickHouse without limit. One request past
//! the cap is answered at once, 503 `busy` with `Retry-After: 1`, before its body is read.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Semaphore;

use crate::error_response;

/// The answer to a request over the cap: 503 `busy`, `Retry-After: 1`.
pub fn busy() -> Response {
    let mut r = error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        "too many requests in hand; retry shortly",
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Middleware (`axum::middleware::from_fn_with_state`): run the request while `in_hand` has
/// a permit for it, else answer [`busy`].
pub async fn limit_in_hand(
    State(in_hand): State<Arc<Semaphore>>,
    req: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = in_hand.try_acquire_owned() else {
        return busy();
    };
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::routing::get;
    use axum::Router;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::Notify;

    use super::*;

    /// The status line and the headers of a plain GET to `addr`.
    async fn get_head(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_past_the_cap_is_answered_busy_and_the_next_one_served() {
        let entered = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let (e, r) = (entered.clone(), release.clone());
        let app = Router::new()
            .route(
                "/hold",
                get(move || async move {
                    e.notify_one();
                    r.notified().await;
                    "held"
                }),
            )
            .route("/quick", get(|| async { "quick" }))
            .route_layer(axum::middleware::from_fn_with_state(
                Arc::new(Semaphore::new(1)),
                limit_in_hand,
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });

        let held = tokio::spawn(get_head(addr, "/hold"));
        entered.notified().await;
        let refused = get_head(addr, "/quick").await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(
            refused.to_ascii_lowercase().contains("retry-after: 1"),
            "{refused}"
        );
        assert!(refused.contains("\"busy\""), "{refused}");

        release.notify_one();
        let done = tokio::time::timeout(Duration::from_secs(10), held)
            .await
            .unwrap()
            .unwrap();
        assert!(
            done.starts_with("HTTP/1.1 200") && done.ends_with("held"),
            "{done}"
        );
        let served = get_head(addr, "/quick").await;
        assert!(
            served.starts_with("HTTP/1.1 200"),
            "the permit came back: {served}"
        );
    }
}
