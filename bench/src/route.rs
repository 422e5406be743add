//! `weft bench route`: decisions per second of a running router, over loopback HTTP.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

/// Measure a running router over loopback HTTP: decisions/s with --concurrency keep-alive
/// connections, client round-trip percentiles, and the server-side decision time (the
/// `x-weft-decision-us` header: parse, decide, publish hand-off) percentiles.
///
/// Example:
///   WEFT_ROUTER_KEYS="k-0123456789abcdef=acme" weft router --policy thompson &
///   weft bench route --key k-0123456789abcdef --requests 50000 --concurrency 8
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchRouteArgs {
    /// The router's address.
    #[arg(long, default_value_t = weft_schemas::ports::loopback(weft_schemas::ports::ROUTER))]
    pub addr: SocketAddr,

    /// A bearer key of the router.
    #[arg(long, env = "WEFT_BENCH_ROUTER_KEY", hide_env_values = true)]
    pub key: String,

    /// Requests in total.
    #[arg(long, default_value_t = 20_000)]
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

/// One request to send, again and again.
#[derive(Clone)]
struct RouteRequest {
    url: String,
    key: String,
    body: Vec<u8>,
}

/// `n` requests one after the other on one keep-alive connection: (client round trip,
/// server-side decision time) in microseconds, each.
async fn bench_conn(req: RouteRequest, n: usize) -> anyhow::Result<Vec<(u64, u64)>> {
    let client = one_connection()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let resp = client
            .post(&req.url)
            .bearer_auth(&req.key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(req.body.clone())
            .send()
            .await
            .context("sending to the router")?;
        let status = resp.status();
        let server_us = resp
            .headers()
            .get("x-weft-decision-us")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let body = resp.bytes().await.context("reading the router's answer")?;
        anyhow::ensure!(
            status == reqwest::StatusCode::OK,
            "router answered {}: {}",
            status.as_u16(),
            String::from_utf8_lossy(&body)
        );
        out.push((t.elapsed().as_micros() as u64, server_us));
    }
    Ok(out)
}

/// Run `weft bench route` and print its report.
pub async fn run(a: BenchRouteArgs) -> anyhow::Result<()> {
    let cands: Vec<serde_json::Value> = (0..a.candidates)
        .map(|i| serde_json::json!({"candidate_id": format!("cand-{i}"), "candidate_type": "tool"}))
        .collect();
    let body = serde_json::to_vec(&serde_json::json!({
        "context": {"intent": "bench"},
        "candidates": cands,
        "constraints": {"max_latency_ms": 1000},
        "policy": a.policy,
    }))?;
    let request = RouteRequest {
        url: format!("http://{}/v1/route", a.addr),
        key: a.key.clone(),
        body,
    };
    // Warm-up.
    bench_conn(request.clone(), 200).await?;
    let cpu_before = router_cpu_seconds(a.addr).await;
    let per = a.requests.div_ceil(a.concurrency.max(1));
    let started = Instant::now();
    let tasks: Vec<_> = (0..a.concurrency.max(1))
        .map(|_| tokio::spawn(bench_conn(request.clone(), per)))
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
