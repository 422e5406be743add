//! `weft validate`: check payloads or envelopes against weaver-spec 0.9.0.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::Value;
use weft_schemas::{conformance, strict, Validator};

/// Validate JSON or JSONL files against the weaver-spec 0.9.0 schemas and invariants.
///
/// Each file holds one JSON document, or one per line (JSONL). A document is either an
/// envelope (`{"kind": ..., "payload": {...}}`, validated as its kind) or a bare payload,
/// validated as `--kind`, or else as the schema whose required fields it carries.
/// Single-document invariants are checked too: I-01 and I-02 on trace bundles, I-01 on
/// frames, I-06 on capability tokens.
///
/// Prints one line per document, `FILE[:LINE]: ok (SCHEMA)` or the reasons it fails
/// (schema keyword and JSON pointer, or invariant id).
///
/// Exit status: 0 when all are valid, 1 when any is invalid, 2 on unusable input
/// (unreadable file, an empty or whitespace-only file, text that is not JSON, unknown --kind,
/// a kind that cannot be inferred). A document with a key twice in one object is invalid
/// (weft and ClickHouse would read different values).
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Schema for bare payloads: an envelope kind (trace_event, frame, ...) or any spec
    /// schema name (trace_bundle, evaluation_artifact, ...).
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,

    /// Files to check; `-` reads standard input.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

#[derive(Default)]
struct Tally {
    valid: usize,
    invalid: usize,
    unusable: usize,
}

pub fn run(args: ValidateArgs) -> ExitCode {
    let v = Validator::global();
    if let Some(k) = &args.kind {
        if !v.knows(k) {
            eprintln!(
                "error: unknown --kind `{k}`; known: {}",
                v.schema_names().collect::<Vec<_>>().join(", ")
            );
            return ExitCode::from(2);
        }
    }
    let mut tally = Tally::default();
    for path in &args.files {
        let text = if path.as_os_str() == "-" {
            let mut s = String::new();
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                match line {
                    Ok(l) => {
                        s.push_str(&l);
                        s.push('\n');
                    }
                    Err(e) => {
                        eprintln!("-: unreadable: {e}");
                        tally.unusable += 1;
                        break;
                    }
                }
            }
            s
        } else {
            match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    println!("{}: unreadable: {e}", path.display());
                    tally.unusable += 1;
                    continue;
                }
            }
        };
        let name = path.display().to_string();
        if text.trim().is_empty() {
            println!("{name}: no payload (empty or whitespace-only input)");
            tally.unusable += 1;
            continue;
        }
        // A whole-file JSON document (possibly pretty-printed) first; else JSONL.
        let docs: Vec<(String, Result<Value, strict::StrictError>)> = match strict::parse(&text) {
            Err(strict::StrictError::Json(_)) => text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, l)| (format!("{name}:{}", i + 1), strict::parse(l)))
                .collect(),
            whole => vec![(name, whole)],
        };
        for (at, doc) in docs {
            match doc {
                Ok(doc) => check_doc(v, args.kind.as_deref(), &at, &doc, &mut tally),
                // Two readings of one document: invalid, whatever its schema says.
                Err(e @ strict::StrictError::DuplicateKey { .. }) => {
                    println!("{at}: invalid: {e}");
                    tally.invalid += 1;
                }
                Err(e) => {
                    println!("{at}: not JSON: {e}");
                    tally.unusable += 1;
                }
            }
        }
    }
    eprintln!(
        "{} valid, {} invalid, {} unusable",
        tally.valid, tally.invalid, tally.unusable
    );
    if tally.unusable > 0 {
        ExitCode::from(2)
    } else if tally.invalid > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn check_doc(v: &Validator, kind: Option<&str>, at: &str, doc: &Value, tally: &mut Tally) {
    let is_envelope = doc.get("kind").is_some_and(Value::is_string) && doc.get("payload").is_some();
    let (schema, payload) = if is_envelope {
        let k = doc["kind"].as_str().unwrap_or_default();
        match k.parse::<weft_schemas::Kind>() {
            Ok(k) => (k.schema_name().to_owned(), &doc["payload"]),
            Err(e) => {
                println!("{at}: invalid: envelope: {e}");
                tally.invalid += 1;
                return;
            }
        }
    } else {
        match kind.or_else(|| v.infer(doc)) {
            Some(s) => (s.to_owned(), doc),
            None => {
                println!("{at}: cannot tell which schema this follows; pass --kind");
                tally.unusable += 1;
                return;
            }
        }
    };
    let mut reasons: Vec<String> = v
        .check(&schema, payload)
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect();
    if reasons.is_empty() {
        reasons.extend(conformance::check(&schema, payload).into_iter().map(|f| {
            format!(
                "invariant {} at {}: {}",
                f.invariant,
                if f.pointer.is_empty() {
                    "/"
                } else {
                    &f.pointer
                },
                f.message
            )
        }));
    }
    if reasons.is_empty() {
        println!("{at}: ok ({schema})");
        tally.valid += 1;
    } else {
        println!("{at}: invalid ({schema}): {}", reasons.join("; "));
        tally.invalid += 1;
    }
}
