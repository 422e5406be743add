//! Bounded work per request at the gateway, written as the attacks: an 8.4 MB array of tiny
//! items (once answered with 913 MB and a 2.95 GB peak RSS) is refused with 422 at once, an
//! 8.4 MB batch of valid events within the limits is answered with a bounded body, and the
//! gateway process's peak resident memory (`VmHWM`) stays under 1 GiB throughout. Every
//! refusal of a whole request carries the one error body `{"error":{"code","message"}}`.

mod common;
mod publish_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use publish_support::trace_payload;
use serde_json::Value;

const KEY: &str = "limits-key-0123456789abcdef";

struct Gateway {
    child: Child,
    url: String,
    _spool: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    fn start(max_body: usize) -> Self {
        Self::start_with(max_body, &[])
    }

    fn start_with(max_body: usize, extra: &[&str]) -> Self {
        let prefix = common::unique("gwlim") + ".";
        let spool = tempfile::tempdir().unwrap();
        let mut child = common::weft()
            .env("WEFT_KAFKA_BROKERS", common::brokers())
            .env("RUST_LOG", "warn")
            .args(["gateway", "--listen", "127.0.0.1:0"])
            .arg("--keys")
            .arg(format!("{KEY}=acme"))
            .arg("--max-body-bytes")
            .arg(max_body.to_string())
            .arg("--topic-prefix")
            .arg(&prefix)
            .arg("--spool-dir")
            .arg(spool.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Self {
            child,
            url,
            _spool: spool,
        }
    }

    /// Peak resident set size of the gateway process so far, in bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmHWM in /proc/PID/status");
        kb * 1024
    }

    async fn post(&self, key: Option<&str>, body: String) -> (u16, usize, Value) {
        let mut req = reqwest::Client::new()
            .post(format!("{}/v1/events", self.url))
            .header("content-type", "application/json")
            .timeout(Duration::from_secs(120))
            .body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON answer: {text}"));
        (status, text.len(), v)
    }
}

impl Gateway {
    /// A POST whose head declares `len` bytes of body, none of which is sent; the answer.
    async fn post_declared(&self, key: &str, len: usize) -> (u16, Value) {
        let mut s = self.open_declared(key, len).await;
        read_answer(&mut s).await
    }

    /// A connection that has sent the head of a POST declaring `len` bytes of body, and none
    /// of the body.
    async fn open_declared(&self, key: &str, len: usize) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let addr = self.url.trim_start_matches("http://").to_owned();
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/events HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\n\
             content-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s
    }
}

/// Read one whole answer (head, and the body by its content-length) from `s`.
async fn read_answer(s: &mut tokio::net::TcpStream) -> (u16, Value) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((h, body)) = text.split_once("\r\n\r\n") {
            let want = h
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if want.is_some_and(|n| body.len() >= n) {
                let status = h.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
                return (status, serde_json::from_str(body).unwrap_or(Value::Null));
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("no whole answer in 30 s: {text}"))
            .unwrap();
        assert!(n > 0, "connection closed before a whole answer: {text}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Past `--max-concurrent-requests`, a request is answered 503 `busy` before its body is
/// read, so many slow or large requests cannot take the gateway's memory;
/// a slot freed is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_concurrency_limit_is_refused_busy_before_its_body() {
    let gw = Gateway::start_with(8 << 20, &["--max-concurrent-requests", "1"]);
    // Two requests whose heads declare 1 MB of body that never comes: whichever reaches the
    // handler first holds the only slot (waiting for its body), the other is refused at once.
    let mut a = gw.open_declared(KEY, 1_000_000).await;
    let mut b = gw.open_declared(KEY, 1_000_000).await;
    let ((status, v), holder) = tokio::select! {
        r = read_answer(&mut a) => (r, b),
        r = read_answer(&mut b) => (r, a),
    };
    assert_eq!(status, 503, "{v}");
    assert!(is_error_body(&v, "busy"), "{v}");
    // The slot comes back when the held request ends.
    drop(holder);
    let item = || {
        format!(
            r#"{{"kind":"trace_event","payload":{}}}"#,
            trace_payload("busy", 1)
        )
    };
    let ok = common::wait_for_async(Duration::from_secs(30), || async {
        let (status, _, _) = gw.post(Some(KEY), item()).await;
        (status == 200).then_some(())
    })
    .await;
    assert!(ok.is_some(), "the slot was not freed");
}

/// A request whose body stops coming is answered 408 `body_timeout` after
/// `--body-timeout-secs`, and its slot is free again: a client that stalls halfway through a
/// body cannot hold the gateway's request slots (before, it held one for as long as it kept
/// the connection open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_coming_is_answered_408_and_frees_its_slot() {
    let gw = Gateway::start_with(
        8 << 20,
        &["--max-concurrent-requests", "1", "--body-timeout-secs", "1"],
    );
    let mut stalled = gw.open_declared(KEY, 1_000_000).await;
    let (status, v) = read_answer(&mut stalled).await;
    assert_eq!(status, 408, "{v}");
    assert!(is_error_body(&v, "body_timeout"), "{v}");
    let item = format!(
        r#"{{"kind":"trace_event","payload":{}}}"#,
        trace_payload("stall", 1)
    );
    let (status, _, v) = gw.post(Some(KEY), item).await;
    assert_eq!(status, 200, "the only slot was not freed: {v}");
}

fn is_error_body(v: &Value, code: &str) -> bool {
    v["error"]["code"] == code
        && v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
        && v.as_object().is_some_and(|o| o.len() == 1)
}

const GIB: u64 = 1 << 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_4_mb_request_is_answered_within_bounds() {
    let gw = Gateway::start(9_000_000);

    // The attack: 8.4 MB of tiny items, each of which used to get its own answer.
    let n = 8_400_000 / 3;
    let mut tiny = String::with_capacity(8_400_100);
    tiny.push('[');
    for i in 0..n {
        if i > 0 {
            tiny.push(',');
        }
        tiny.push_str("{}");
    }
    tiny.push(']');
    assert!(tiny.len() >= 8_400_000, "{}", tiny.len());
    let t0 = std::time::Instant::now();
    let (status, len, v) = gw.post(Some(KEY), tiny).await;
    assert_eq!(status, 422, "{v}");
    assert!(is_error_body(&v, "too_many_items"), "{v}");
    assert!(len < 1024, "answer of {len} bytes");
    eprintln!(
        "8.4 MB of {n} tiny items: {status} in {:?}, peak RSS {} MiB",
        t0.elapsed(),
        gw.peak_rss() >> 20
    );

    // Within the limits: 10,000 valid events (the default max_items) of ~840 bytes each.
    let item = |i: usize, pad: &str| {
        let payload = trace_payload(&format!("lim{pad}"), i);
        format!(
            r#"{{"kind":"trace_event","request_id":"r-{}","payload":{payload}}}"#,
            i % 97
        )
    };
    // The tag appears three times in a payload: pad it so an item is ~845 bytes.
    let pad = "p".repeat((845 - item(5000, "").len()) / 3);
    let items: Vec<String> = (0..10_000).map(|i| item(i, &pad)).collect();
    let body = format!("[{}]", items.join(","));
    assert!(
        body.len() >= 8_400_000 && body.len() < 9_000_000,
        "{}",
        body.len()
    );
    let t0 = std::time::Instant::now();
    let (status, len, v) = gw.post(Some(KEY), body).await;
    assert_eq!(
        status,
        200,
        "{}",
        &v.to_string()[..2000.min(v.to_string().len())]
    );
    assert_eq!(v["accepted"], 10_000);
    // Bounded answer: one entry per item (its index, status and id), at most max_items.
    let id_len = format!("te-lim{pad}-9999").len();
    assert!(len < 10_000 * (id_len + 60), "answer of {len} bytes");
    let peak = gw.peak_rss();
    eprintln!(
        "8.4 MB of 10000 valid events: {status} in {:?}, answer {len} bytes, peak RSS {} MiB",
        t0.elapsed(),
        peak >> 20
    );
    assert!(peak < GIB, "gateway peak RSS {} MiB", peak >> 20);

    // Over the body limit: 413 with the one error body, before the body is read. The request
    // declares its length and sends only its head: the gateway answers without waiting for
    // the body (a client still writing 9 MB would race the gateway closing the connection).
    let (status, v) = gw.post_declared(KEY, 9_000_001).await;
    assert_eq!(status, 413, "{v}");
    assert!(is_error_body(&v, "body_too_large"), "{v}");
    assert!(gw.peak_rss() < GIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_fields_duplicate_keys_and_bad_keys_get_clear_4xx() {
    let gw = Gateway::start(8 << 20);
    let (status, _, v) = gw.post(None, "[]".into()).await;
    assert_eq!(status, 401);
    assert!(is_error_body(&v, "missing_api_key"), "{v}");
    let (status, _, v) = gw
        .post(Some("wrong-key-0123456789abcdef"), "[]".into())
        .await;
    assert_eq!(status, 401);
    assert!(is_error_body(&v, "invalid_api_key"), "{v}");

    // A request id over 1024 bytes: 422, with a bounded message.
    let long_id = "r".repeat(100_000);
    let item = format!(
        r#"{{"kind":"trace_event","request_id":"{long_id}","payload":{}}}"#,
        trace_payload("lim", 1)
    );
    let (status, len, v) = gw.post(Some(KEY), item).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["results"][0]["error"]["code"], "string_too_long");
    assert!(len < 2048, "answer of {len} bytes");

    // A payload over max_message_bytes (1,000,000): 413, bounded message.
    let big = format!(
        r#"{{"event_id":"big","event_type":"flow_started","timestamp":"2026-03-08T06:00:05Z","error_message":"{}"}}"#,
        "e".repeat(1_100_000)
    );
    let (status, len, v) = gw
        .post(
            Some(KEY),
            format!(r#"{{"kind":"trace_event","payload":{big}}}"#),
        )
        .await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["results"][0]["error"]["code"], "too_large");
    assert!(len < 2048, "answer of {len} bytes");

    // The duplicate-key attack through the gateway, next to a good item.
    let dup = r#"{"token_id":"tok-gw","principal":"agent-7","scope":["org.myapp.search_docs"],"scope":["org.myapp.delete_everything"],"issued_at":"2026-03-08T06:00:00Z","expires_at":"2026-03-08T07:00:00Z","single_use":false,"issuer":"kernel-1"}"#;
    let body = format!(
        r#"[{{"kind":"capability_token","payload":{dup}}},{{"kind":"trace_event","payload":{}}}]"#,
        trace_payload("lim", 2)
    );
    let (status, _, v) = gw.post(Some(KEY), body).await;
    assert_eq!(status, 207, "{v}");
    assert_eq!(v["results"][0]["error"]["code"], "duplicate_key", "{v}");
    assert!(v["results"][0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/scope"));
    assert_eq!(v["results"][1]["status"], "accepted");

    // Nonconforming extension keys are counted, not refused, by default.
    let odd = r#"{"event_id":"odd-1","event_type":"flow_started","timestamp":"2026-03-08T06:00:05Z","weaver_reserved":1,"x_acme_ok":2}"#;
    let (status, _, v) = gw
        .post(
            Some(KEY),
            format!(r#"{{"kind":"trace_event","payload":{odd}}}"#),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let metrics = reqwest::get(format!("{}/metrics", gw.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("weft_gateway_nonconforming_keys_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weft_publisher_nonconforming_keys_total 0"),
        "the gateway's items are counted once, by the gateway: {metrics}"
    );
}
