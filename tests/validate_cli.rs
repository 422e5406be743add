//! `weft validate` against the spec corpus, through the real binary: exit codes and output.

mod common;

use std::process::Output;

fn spec(path: &str) -> String {
    common::repo_root()
        .join("schemas/spec")
        .join(path)
        .display()
        .to_string()
}

fn run(args: &[&str]) -> Output {
    common::weft().arg("validate").args(args).output().unwrap()
}

fn corpus() -> serde_yaml::Value {
    let text = std::fs::read_to_string(spec("conformance/corpus.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

#[test]
fn accepts_every_sample_payload_and_positive_corpus_entry() {
    // Samples, with the schema inferred from their required fields or named explicitly
    // for the extended artifacts whose required sets overlap.
    let dir = common::repo_root().join("schemas/spec/examples/sample_payloads");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    files.sort();
    let mut ok = 0;
    for f in &files {
        let stem = std::path::Path::new(f)
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap();
        let kind = match stem {
            "frame_with_handles" => "frame",
            "trace_bundle_signed" => "trace_bundle",
            "capability_token_signed" => "capability_token",
            s if s.starts_with("failure_case_") => "failure_case_artifact",
            s => s,
        };
        let out = run(&["--kind", kind, f]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{f}: {stdout}");
        assert!(stdout.contains(": ok ("), "{stdout}");
        ok += 1;
    }
    assert!(ok >= 35);
    for p in corpus()["positive"].as_sequence().unwrap() {
        let f = spec(p["payload"].as_str().unwrap());
        let out = run(&["--kind", p["schema"].as_str().unwrap(), &f]);
        assert_eq!(out.status.code(), Some(0), "{f}");
    }
}

#[test]
fn rejects_every_negative_with_its_reason_and_exit_1() {
    for n in corpus()["negative"].as_sequence().unwrap() {
        let f = spec(n["payload"].as_str().unwrap());
        let violates = n["violates"].as_str().unwrap();
        let out = run(&["--kind", n["schema"].as_str().unwrap(), &f]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{f}: {stdout}");
        let expect = match n["by"].as_str().unwrap() {
            "invariant" => format!("invariant {violates}"),
            _ => violates.split(':').next().unwrap().to_owned(),
        };
        assert!(
            stdout.contains(&expect),
            "{f}: expected `{expect}` in {stdout}"
        );
    }
}

#[test]
fn jsonl_envelopes_and_unusable_input() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let good = dir.join("mixed.jsonl");
    std::fs::write(
        &good,
        concat!(
            r#"{"kind":"trace_event","payload":{"event_id":"e1","event_type":"flow_started","timestamp":"2026-01-01T00:00:00Z","x_acme_extra":{"a":1}}}"#,
            "\n\n",
            r#"{"kind":"frame","payload":{"frame_id":"f","capability_id":"c","summary":"s","created_at":"2026-01-01T00:00:00Z"}}"#,
            "\n",
        ),
    )
    .unwrap();
    let out = run(&[good.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);

    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"kind\":\"frame\",\"payload\":{}}\n{oops\n").unwrap();
    let out = run(&[bad.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains("bad.jsonl:1: invalid (frame): required"),
        "{stdout}"
    );
    assert!(stdout.contains("bad.jsonl:2: not JSON"), "{stdout}");

    let out = run(&[dir.join("missing.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["--kind", "no_such_schema", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn an_input_with_no_payload_is_unusable_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [("empty.json", ""), ("blank.jsonl", "  \n\t\n \n")] {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        let out = run(&[f.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("no payload"), "{name}: {stdout}");
    }
}

#[test]
fn a_payload_with_a_key_twice_is_invalid_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("dup.json");
    // The attack shape: a capability token whose `scope` appears twice.
    std::fs::write(
        &f,
        r#"{"token_id":"t1","principal":"p","scope":["a.read"],"scope":["a.admin"],"issued_at":"2026-03-08T06:00:00Z","expires_at":"2026-03-08T07:00:00Z","single_use":false,"issuer":"k"}"#,
    )
    .unwrap();
    let out = run(&["--kind", "capability_token", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("duplicate key at /scope"), "{stdout}");
}
