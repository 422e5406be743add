//! The local stack's own guarantees: `stack.sh status` checks that the broker answers a real
//! Kafka request (not just that a port accepts), and topic deletion is refused by weft's
//! scripts and tests, with the reason (on tansu 0.6 deleting one topic deletes every topic).

mod common;

use std::io::Read;
use std::path::Path;
use std::process::Command;

fn stack() -> Command {
    let mut c = Command::new("bash");
    c.arg(common::repo_root().join("deploy/local/stack.sh"));
    c
}

fn probe(port: u16) -> std::process::Output {
    Command::new("python3")
        .arg(common::repo_root().join("deploy/local/kafka_probe.py"))
        .arg(port.to_string())
        .arg("3")
        .output()
        .unwrap()
}

#[test]
fn the_probe_needs_a_metadata_answer_not_just_a_listening_port() {
    // The real broker answers.
    let brokers = common::brokers();
    let port: u16 = brokers.rsplit(':').next().unwrap().parse().unwrap();
    let out = probe(port);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 brokers"));

    // A process that listens and accepts but answers nothing sensible (as tansu does once its
    // storage task died) is not "answering".
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        for stream in listener.incoming().take(1) {
            let mut s = stream.unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            // Close without answering.
        }
    });
    let out = probe(port);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not answer a metadata request"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.join().unwrap();
}

#[test]
fn stack_sh_refuses_topic_deletion_with_the_reason() {
    let out = stack()
        .args(["delete-topic", "weaver.trace_events"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused") && err.contains("deleting one topic deletes every topic"),
        "{err}"
    );
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" {
                walk(&p, out);
            }
        } else if name.ends_with(".rs") || name.ends_with(".sh") || name.ends_with(".py") {
            out.push(p);
        }
    }
}

#[test]
fn no_script_or_test_of_weft_deletes_a_topic() {
    // Spelled in two halves so this file does not match itself.
    let calls = [
        format!("delete_{}(", "topics"),
        format!("DeleteTopics{}", "Request"),
        format!("kafka-topics{}--delete", ".sh "),
        format!("kafka-topics {}", "--delete"),
    ];
    let mut files = Vec::new();
    let root = common::repo_root();
    for d in [
        "tests",
        "deploy",
        "src",
        "producers",
        "consumers",
        "router",
        "audit",
        "schemas",
    ] {
        if root.join(d).is_dir() {
            walk(&root.join(d), &mut files);
        }
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    let mut offenders = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for c in &calls {
            if text.contains(c.as_str()) {
                offenders.push(format!("{}: {c}", f.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "topic deletion on the local broker is refused: on tansu 0.6 deleting one topic \
         deletes every topic (and has wiped the sqlite store under a fetching consumer). \
         Use a fresh topic prefix instead. Found: {offenders:#?}"
    );
}
