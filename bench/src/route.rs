//! `weft bench route`: decisions per second of a running router, over loopback HTTP.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use weft_schemas::ports::{self, loopback};

/// Measure a running router over loopback HTTP: decisions/s with --concurrency keep-alive
/// connections, client round-trip percentiles, and the server-side decision time (the
/// `x-weft-decision-us` header: parse, decide, publish hand-off) percentiles.
///
/// Example:
///   WEFT_ROUTER_KEYS="k-0123456789abcdef=acme" weft router --policy thompson &
///   weft bench route --key k-0123456789abcdef --requests 50000 --concurrency 8
///
/// The contextual default, with a model trained first (route + feedback cycles) and a
/// different context on every request:
///   weft bench route --key k-0123456789abcdef --policy squarecb --contexts 240 --train 3000
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchRouteArgs {
    /// The router's address.
    #[arg(long, default_value_t = loopback(ports::ROUTER))]
    pub addr: SocketAddr,

    /// A bearer key of the router.
    #[arg(long, env = "WEFT_BENCH_ROUTER_KEY", hide_env_values = true)]
    pub key: String,

    /// Requests in total (at least 1).
    #[arg(
        long,
        default_value_t = 20_000,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub requests: usize,

    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,

    /// Candidates per request.
    #[arg(long, default_value_t = 3)]
    pub candidates: usize,

    /// Policy named in each request.
    #[arg(long, default_value = "thompson")]
    pub policy: String,

    /// Distinct request contexts, cycled through (tier, language, task, document size,
    /// urgency: the contextual policy's features); 0 = one context, `{"intent": "bench"}`.
    #[arg(long, default_value_t = 0)]
    pub contexts: usize,

    /// Route + feedback cycles before measuring, so the policy decides from a trained model
    /// (its feedback goes through Kafka like any other).
    #[arg(long, default_value_t = 0)]
    pub train: usize,
}

/// An HTTP/1.1 client that keeps exactly one connection open (one per benchmark connection).
fn one_connection() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .http1_only()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1)
        .build()
        .context("building the HTTP client")
}

/// The router's `process_cpu_seconds_total`, read from its `/metrics` (no auth needed).
async fn router_cpu_seconds(addr: SocketAddr) -> Option<f64> {
    let text = one_connection()
        .ok()?
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
        .and_then(|v| v.trim().parse().ok())
}

/// The requests to send, again and again (cycling through the bodies).
#[derive(Clone)]
struct RouteRequest {
    url: String,
    key: String,
    bodies: Vec<Vec<u8>>,
}

/// The header in which the router says how long its decision took (µs).
const DECISION_US: &str = "x-weft-decision-us";

/// `n` requests one after the other on one keep-alive connection: (client round trip,
/// server-side decision time) in microseconds, each. An answer without a readable
/// decision time is an error: it is not a router's, and no time is made up for it.
async fn bench_conn(req: RouteRequest, n: usize, first: usize) -> anyhow::Result<Vec<(u64, u64)>> {
    let client = one_connection()?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let body = req.bodies[(first + i) % req.bodies.len()].clone();
        let t = Instant::now();
        let resp = client
            .post(&req.url)
            .bearer_auth(&req.key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .context("sending to the router")?;
        let status = resp.status();
        let server_us = resp
            .headers()
            .get(DECISION_US)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = resp.bytes().await.context("reading the router's answer")?;
        anyhow::ensure!(
            status == reqwest::StatusCode::OK,
            "router answered {}: {}",
            status.as_u16(),
            String::from_utf8_lossy(&body)
        );
        let server_us = server_us.with_context(|| {
            format!(
                "{} answered 200 without a whole number of microseconds in {DECISION_US} \
                 (is it a weft router?)",
                req.url
            )
        })?;
        out.push((t.elapsed().as_micros() as u64, server_us));
    }
    Ok(out)
}

/// Context `i` of `--contexts`: every field varies on its own period, so the contexts are
/// distinct combinations of the categorical and numeric features.
fn context(i: usize) -> serde_json::Value {
    const TIERS: [&str; 3] = ["free", "pro", "enterprise"];
    const LANGS: [&str; 5] = ["en", "de", "fr", "ja", "es"];
    const TASKS: [&str; 8] = [
        "summarize",
        "extract",
        "classify",
        "translate",
        "code",
        "qa",
        "chat",
        "search",
    ];
    serde_json::json!({
        "tier": TIERS[i % 3],
        "lang": LANGS[i % 5],
        "task": TASKS[i % 8],
        "doc_tokens": 200 + (i * 7919) % 60_000,
        "urgent": i.is_multiple_of(7),
    })
}

/// `n` route + feedback cycles (the outcome a fixed function of the cycle), so the
/// measured decisions come from a trained model.
async fn train(req: &RouteRequest, n: usize) -> anyhow::Result<()> {
    let client = one_connection()?;
    let fb_url = req.url.replace("/v1/route", "/v1/feedback");
    for i in 0..n {
        let d: serde_json::Value = client
            .post(&req.url)
            .bearer_auth(&req.key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(req.bodies[i % req.bodies.len()].clone())
            .send()
            .await
            .context("routing (training)")?
            .json()
            .await
            .context("reading a decision (training)")?;
        let cand = d["candidate"]["candidate_id"].as_str().unwrap_or_default();
        let fb = serde_json::json!({
            "decision_id": d["decision_id"],
            "candidate_id": cand,
            "success": !(i + cand.len()).is_multiple_of(3),
            "latency_ms": 100 + (i * 31) % 400,
            "timestamp": weft_schemas::time::now_rfc3339(),
        });
        let resp = client
            .post(&fb_url)
            .bearer_auth(&req.key)
            .json(&fb)
            .send()
            .await
            .context("posting feedback (training)")?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        anyhow::ensure!(status.as_u16() == 202, "feedback answered {status}: {text}");
    }
    Ok(())
}

/// Run `weft bench route` and print its report.
pub async fn run(a: BenchRouteArgs) -> anyhow::Result<()> {
    let cands: Vec<serde_json::Value> = (0..a.candidates)
        .map(|i| serde_json::json!({"candidate_id": format!("cand-{i}"), "candidate_type": "tool"}))
        .collect();
    let contexts: Vec<serde_json::Value> = if a.contexts == 0 {
        vec![serde_json::json!({"intent": "bench"})]
    } else {
        (0..a.contexts).map(context).collect()
    };
    let bodies = contexts
        .into_iter()
        .map(|ctx| {
            serde_json::to_vec(&serde_json::json!({
                "context": ctx,
                "candidates": cands,
                "constraints": {"max_latency_ms": 1000},
                "policy": a.policy,
            }))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let request = RouteRequest {
        url: format!("http://{}/v1/route", a.addr),
        key: a.key.clone(),
        bodies,
    };
    train(&request, a.train).await?;
    // Warm-up.
    bench_conn(request.clone(), 200, 0).await?;
    let cpu_before = router_cpu_seconds(a.addr).await;
    let per = a.requests.div_ceil(a.concurrency.max(1));
    let started = Instant::now();
    let tasks: Vec<_> = (0..a.concurrency.max(1))
        .map(|c| tokio::spawn(bench_conn(request.clone(), per, c * 31)))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu_after = router_cpu_seconds(a.addr).await;
    let pct = |mut v: Vec<u64>, q: f64| {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * q).round() as usize]
    };
    let client: Vec<u64> = all.iter().map(|x| x.0).collect();
    let server: Vec<u64> = all.iter().map(|x| x.1).collect();
    println!(
        "route bench: {} decisions in {wall:.2} s = {:.0} decisions/s ({} connections, {} candidates, policy {})",
        all.len(),
        all.len() as f64 / wall,
        a.concurrency,
        a.candidates,
        a.policy
    );
    if let (Some(b), Some(e)) = (cpu_before, cpu_after) {
        let cpu = (e - b).max(1e-3);
        println!(
            "router CPU: {cpu:.2} s = {:.0} decisions per router CPU-second (one core's capacity)",
            all.len() as f64 / cpu
        );
    }
    println!(
        "server-side decision time: p50 {} us, p99 {} us, max {} us",
        pct(server.clone(), 0.5),
        pct(server.clone(), 0.99),
        server.iter().max().copied().unwrap_or(0)
    );
    println!(
        "client round trip: p50 {} us, p99 {} us",
        pct(client.clone(), 0.5),
        pct(client, 0.99)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchRouteArgs,
    }

    #[test]
    fn zero_requests_are_refused() {
        let parse = |n: &str| Cli::try_parse_from(["t", "--key", "k", "--requests", n]);
        let err = parse("0").unwrap_err();
        assert!(err.to_string().contains("--requests"), "{err}");
        assert_eq!(parse("1").unwrap().bench.requests, 1);
    }

    /// A server on loopback answering every route request 200 with `header`, if any.
    async fn server(header: Option<&'static str>) -> RouteRequest {
        let app = axum::Router::new().route(
            "/v1/route",
            axum::routing::post(move || async move {
                let mut resp = axum::response::Response::new(axum::body::Body::from("{}"));
                if let Some(v) = header {
                    resp.headers_mut()
                        .insert(DECISION_US, axum::http::HeaderValue::from_static(v));
                }
                resp
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        RouteRequest {
            url: format!("http://{addr}/v1/route"),
            key: "k".into(),
            bodies: vec![b"{}".to_vec()],
        }
    }

    #[tokio::test]
    async fn an_answer_without_the_decision_time_is_an_error_not_zero() {
        let err = bench_conn(server(None).await, 2, 0).await.unwrap_err();
        assert!(err.to_string().contains(DECISION_US), "{err:#}");
        let err = bench_conn(server(Some("soon")).await, 2, 0)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(DECISION_US), "{err:#}");
        let times = bench_conn(server(Some("17")).await, 2, 0).await.unwrap();
        assert_eq!(times.iter().map(|t| t.1).collect::<Vec<_>>(), [17, 17]);
    }
}
