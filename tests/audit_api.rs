//! `weft audit serve` on the local stack: two tenants' traffic in one database.
//! - every route needs a key, and a key reads only its own tenant: another tenant's request
//!   ids answer 404, an explicit `?tenant=` of another tenant 403, no key or a wrong key 401;
//! - hostile input (quotes, SQL fragments, 10k-character ids, unicode, bad cursors and
//!   times) never gives a 5xx, and the table is intact afterwards;
//! - every read is logged in `weft_audit_log` with the key's id, never the key;
//! - answers are bounded: findings per invariant (`limit`), checkpoints by the page, and a
//!   verify past the server's row budget is refused with 422 `too_large`, and a server
//!   with a signing key and no keyring checks checkpoint signatures with that key;
//! - work is bounded: with a per-query read limit below the data, check, search and
//!   timeline are refused with 422 `too_large` (ClickHouse stops the query).

mod common;

use std::time::Duration;

use common::pipeline::{check, truth_membership, Pipeline, Proc};
use reqwest::StatusCode;
use serde_json::Value;

const ACME: &str = "acme-audit-key-0123456789";
const GLOBEX: &str = "globex-audit-key-0123456789";

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `weft audit serve` with both tenants' keys and `extra` flags: the process and its base URL.
fn serve(p: &Pipeline, log: &str, extra: &[&str]) -> (Proc, String) {
    let (proc, addr) = p.audit_serve(&format!("{ACME}=acme,{GLOBEX}=globex"), log, extra);
    (proc, format!("http://{addr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_isolated_and_hostile_input_is_harmless() {
    let p = Pipeline::new("it_auditapi");
    let acme = p.simulate(&[
        "--flows",
        "8",
        "--seed",
        "901",
        "--tenant",
        "acme",
        "--raw-output",
        "0.3",
    ]);
    std::fs::rename(p.path("events.jsonl"), p.path("acme.jsonl")).unwrap();
    let globex = p.simulate(&["--flows", "8", "--seed", "902", "--tenant", "globex"]);
    let _ingest = p.ingest(None);
    p.publish(&p.path("acme.jsonl"));
    p.publish(&p.path("events.jsonl"));
    p.wait_for_facts(
        acme.totals.distinct_events + globex.totals.distinct_events,
        Duration::from_secs(120),
    )
    .await;
    // Every narrative complete before the reads (a request's events can span two passes,
    // and the first already answers 200).
    let mut want = truth_membership(&acme);
    want.extend(truth_membership(&globex));
    p.wait_for_narratives(&want, Duration::from_secs(120)).await;

    let (_serve, base) = serve(&p, "serve.log", &[]);
    let http = reqwest::Client::new();
    let get = |path: String, key: Option<&'static str>| {
        let mut r = http.get(format!("{base}{path}"));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        async move { r.send().await.unwrap() }
    };
    let json = |path: String, key: Option<&'static str>| {
        let answer = get(path, key);
        async move { answer.await.json::<Value>().await.unwrap() }
    };

    let a_req = acme.requests[0].request_id.clone();
    let g_req = globex.requests[0].request_id.clone();
    // The owner reads its request once the narrative is built (poll, bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = get(format!("/v1/audit/timeline/{a_req}"), Some(ACME)).await;
        if r.status() == StatusCode::OK {
            let n: Value = r.json().await.unwrap();
            assert_eq!(
                n["entries"].as_array().unwrap().len(),
                acme.requests[0].members.len()
            );
            assert_eq!(
                n["members_total"].as_u64(),
                Some(acme.requests[0].members.len() as u64)
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timeline never appeared: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        get(format!("/v1/audit/bundle/{a_req}"), Some(ACME))
            .await
            .status(),
        StatusCode::OK
    );

    // Across tenants: every path denied.
    let range = "from=2026-10-01T00:00:00Z&to=2027-01-01T00:00:00Z";
    for path in [
        format!("/v1/audit/timeline/{a_req}"),
        format!("/v1/audit/bundle/{a_req}"),
    ] {
        assert_eq!(
            get(path.clone(), Some(GLOBEX)).await.status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
        assert_eq!(
            get(path.clone(), None).await.status(),
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
        assert_eq!(
            get(path.clone(), Some("not-a-key-0123456789"))
                .await
                .status(),
            StatusCode::UNAUTHORIZED
        );
    }
    for path in [
        format!("/v1/audit/timeline/{g_req}?tenant=globex"),
        format!("/v1/audit/check?{range}&tenant=globex"),
        format!("/v1/audit/search?{range}&tenant=globex"),
        "/v1/audit/verify?tenant=globex".to_owned(),
        "/v1/audit/checkpoints?tenant=globex".to_owned(),
    ] {
        assert_eq!(
            get(path.clone(), Some(ACME)).await.status(),
            StatusCode::FORBIDDEN,
            "{path}"
        );
        assert_eq!(
            get(path.clone(), None).await.status(),
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    // Search by the other tenant's request or token: nothing leaks.
    let r = json(
        format!("/v1/audit/search?{range}&request={g_req}"),
        Some(ACME),
    )
    .await;
    assert_eq!(r["hits"].as_array().unwrap().len(), 0);
    let r = json(
        format!("/v1/audit/search?{range}&request={a_req}&limit=1000"),
        Some(ACME),
    )
    .await;
    assert!(!r["hits"].as_array().unwrap().is_empty());
    assert!(r["hits"]
        .as_array()
        .unwrap()
        .iter()
        .all(|h| h["request_id"] == a_req.as_str()));
    // Checks see only their tenant's injected violations (ids embed the seed: 901 / 902).
    let a = json(format!("/v1/audit/check?{range}&grace_secs=0"), Some(ACME)).await;
    let g = json(
        format!("/v1/audit/check?{range}&grace_secs=0"),
        Some(GLOBEX),
    )
    .await;
    let want = acme.totals.violations.values().sum::<u64>();
    assert!(want > 0);
    assert_eq!(a["findings"].as_array().unwrap().len() as u64, want, "{a}");
    assert_eq!(
        g["findings"].as_array().unwrap().len() as u64,
        globex.totals.violations.values().sum::<u64>(),
        "{g}"
    );
    for (r, seed) in [(&a, "-901-"), (&g, "-902-")] {
        for f in r["findings"].as_array().unwrap() {
            assert!(
                f["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|e| e["id"].as_str().unwrap().contains(seed)),
                "{f}"
            );
        }
    }

    // Bounded answers. `limit` cuts each invariant's findings; `counts` still counts them all.
    let one = json(
        format!("/v1/audit/check?{range}&grace_secs=0&limit=1"),
        Some(ACME),
    )
    .await;
    let counts = one["counts"].as_object().unwrap();
    assert_eq!(
        counts.values().map(|c| c.as_u64().unwrap()).sum::<u64>(),
        want,
        "{one}"
    );
    assert_eq!(
        one["findings"].as_array().unwrap().len(),
        counts.len(),
        "one finding per invariant found: {one}"
    );
    assert_eq!(one["truncated"], want > counts.len() as u64, "{one}");

    // Checkpoints come in pages, in order, each once, all of them in the end.
    check(
        p.weft()
            .args(["audit", "seal", "--tenant", "acme"])
            .output()
            .unwrap(),
        "weft audit seal",
    );
    let sealed = p
        .scalar("SELECT count() FROM weft_audit_checkpoints WHERE tenant = 'acme'")
        .await;
    assert!(sealed >= 2, "one checkpoint per sealed partition: {sealed}");
    // A second sealer at the same moment writes a second checkpoint of the same offset: a
    // page with room for one must not leave it behind.
    p.client()
        .query(
            "INSERT INTO weft_audit_checkpoints SELECT tenant, topic, partition, offset, head, \
             rows, kid, sig, sealed_at + 1 FROM weft_audit_checkpoints WHERE tenant = 'acme' \
             ORDER BY topic, partition, offset LIMIT 1",
        )
        .execute()
        .await
        .unwrap();
    let stored = sealed + 1;
    let (mut pages, mut seen, mut cursor) = (0, Vec::new(), String::new());
    loop {
        let page = json(
            if cursor.is_empty() {
                "/v1/audit/checkpoints?limit=1".to_owned()
            } else {
                format!("/v1/audit/checkpoints?limit=1&cursor={}", enc(&cursor))
            },
            Some(ACME),
        )
        .await;
        pages += 1;
        for c in page["checkpoints"].as_array().unwrap() {
            assert_eq!(c["tenant"], "acme");
            seen.push((
                c["topic"].to_string(),
                c["partition"].as_u64(),
                c["offset"].as_u64(),
                c["sealed_at"].as_i64(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => break,
        }
        assert!(pages <= stored + 1, "the cursor does not advance: {page}");
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "each once: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "in topic order");
    assert_eq!(seen.len() as u64, stored);
    // One page per offset (the two of one offset together), and the empty one that ends.
    assert_eq!(pages, sealed + 1, "the two of one offset come on one page");

    // Verify over a range: intact, every sealed fact of acme recomputed.
    let v = json(format!("/v1/audit/verify?{range}"), Some(ACME)).await;
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(
        v["report"]["verified"].as_u64().unwrap(),
        acme.totals.distinct_events,
        "{v}"
    );
    // A server that signs checks checkpoint signatures with its own key when given no
    // keyring: the unsigned checkpoints sealed above (what anyone with write access to
    // ClickHouse could forge) no longer pass.
    let key = p.path("api-sign.key");
    let key = key.to_str().unwrap();
    check(
        p.weft()
            .args(["audit", "keygen", "--kid", "k-api", "--out", key])
            .output()
            .unwrap(),
        "weft audit keygen",
    );
    let (_signing, signing) = serve(&p, "serve-signing.log", &["--sign-key", key]);
    let v: Value = http
        .get(format!("{signing}/v1/audit/verify?{range}"))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["report"]["checkpoints_ok"], 0, "{v}");
    // A server whose verify budget is smaller than the range refuses it before reading it
    // all (verify counts what it would read first).
    let (_small, small) = serve(&p, "serve-small.log", &["--max-verify-rows", "10"]);
    let too_large = |base: String, route: String| {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("{base}{route}"))
                .bearer_auth(ACME)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{route}");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "too_large", "{route}: {body}");
        }
    };
    too_large(small, format!("/v1/audit/verify?{range}")).await;
    // A server whose per-query read limit is smaller than the data: ClickHouse stops the
    // query, whichever route asked, and the request is refused, not failed.
    let (_tiny, tiny) = serve(&p, "serve-tiny.log", &["--max-read-rows", "1"]);
    for route in [
        format!("/v1/audit/check?{range}"),
        format!("/v1/audit/search?{range}&kind=trace_event"),
        format!("/v1/audit/timeline/{a_req}"),
        // The queries that find verify's partitions and offsets scan the tenant's history
        // whatever the range: they keep the limit (only its span reads have their budget).
        format!("/v1/audit/verify?{range}"),
    ] {
        too_large(tiny.clone(), route).await;
    }
    // Hostile input: never a 5xx.
    let long = "x".repeat(10_000);
    let hostile = [
        "'",
        "\"",
        "\\",
        "' OR 1=1 --",
        "'; DROP TABLE weft_events; --",
        "{t:String}",
        "?",
        "ü🙂\u{202e}漢字",
        "../../etc/passwd",
        "%00",
        "\u{0}",
        long.as_str(),
        "req-1' UNION SELECT * FROM system.users --",
    ];
    let before = p.scalar("SELECT count() FROM weft_events").await;
    for h in hostile {
        let e = enc(h);
        for path in [
            format!("/v1/audit/timeline/{e}"),
            format!("/v1/audit/bundle/{e}"),
            format!("/v1/audit/search?{range}&principal={e}&capability={e}&token={e}"),
            format!("/v1/audit/search?{range}&event_type={e}&decision={e}&outcome={e}&kind={e}&request={e}"),
            format!("/v1/audit/search?cursor={e}"),
            format!("/v1/audit/search?from={e}&to={e}"),
            format!("/v1/audit/search?{range}&limit={e}"),
            format!("/v1/audit/search?{range}&format={e}"),
            format!("/v1/audit/check?from={e}"),
            format!("/v1/audit/check?{range}&grace_secs={e}"),
            format!("/v1/audit/verify?tenant={e}"),
            format!("/v1/audit/verify?from={e}"),
            format!("/v1/audit/checkpoints?cursor={e}"),
            format!("/v1/audit/checkpoints?limit={e}"),
            format!("/v1/audit/check?{range}&limit={e}"),
        ] {
            for key in [Some(ACME), None] {
                let r = get(path.clone(), key).await;
                assert!(r.status().as_u16() < 500, "{} for {}", r.status(), &path[..path.len().min(120)]);
            }
        }
    }
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, before);

    // Every read was logged, by key id, and the key itself is nowhere in the log.
    let logged = p.scalar("SELECT count() FROM weft_audit_log WHERE tenant = 'acme' AND startsWith(actor, 'key:')").await;
    assert!(logged >= 10, "{logged}");
    let leaked = p
        .scalar(&format!("SELECT count() FROM weft_audit_log WHERE position(actor, '{ACME}') > 0 OR position(query, '{ACME}') > 0"))
        .await;
    assert_eq!(leaked, 0);
    // The five refused reads of another tenant are on the caller's record too.
    let refused = p
        .wait_for_count(
            "SELECT count() FROM weft_audit_log WHERE tenant = 'acme' \
             AND action = 'refused_tenant_forbidden' AND position(query, 'globex') > 0",
            5,
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(refused, 5);
    let addr = base.trim_start_matches("http://");
    let forbidden =
        common::metric(addr, "weft_audit_refused_total{code=\"tenant_forbidden\"}").await;
    assert!(forbidden.is_some_and(|n| n >= 5), "{forbidden:?}");
}
