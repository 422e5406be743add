//! `weft simulate` from the outside: byte-identical reruns, the held-back tail in its own
//! file, and a ground-truth file that reads back as the library's type. Needs no stack.

mod common;

use std::path::{Path, PathBuf};

use weft_sim::GroundTruth;

fn simulate(dir: &Path, tag: &str, seed: &str) -> (String, String, GroundTruth) {
    let out = dir.join(format!("{tag}.jsonl"));
    let late = dir.join(format!("{tag}.late.jsonl"));
    let truth = dir.join(format!("{tag}.truth.json"));
    let status = common::weft()
        .args(["simulate", "--flows", "40", "--seed", seed])
        .args([
            "--shuffle",
            "--no-request-id",
            "0.2",
            "--duplicates",
            "0.05",
        ])
        .args(["--delay", "0.1"])
        .arg("--out")
        .arg(&out)
        .arg("--held-back-out")
        .arg(&late)
        .arg("--truth")
        .arg(&truth)
        .status()
        .unwrap();
    assert!(status.success());
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap();
    let truth: GroundTruth = serde_json::from_str(&read(&truth)).unwrap();
    (read(&out), read(&late), truth)
}

#[test]
fn simulate_cli_is_reproducible_and_splits_the_held_back_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let (a, a_late, truth) = simulate(&dir, "a", "5");
    let (b, b_late, _) = simulate(&dir, "b", "5");
    assert_eq!((&a, &a_late), (&b, &b_late), "same flags, same bytes");
    let (c, _, _) = simulate(&dir, "c", "6");
    assert_ne!(a, c);

    let t = &truth.totals;
    assert_eq!(a_late.lines().count() as u64, t.held_back);
    assert_eq!(
        (a.lines().count() + a_late.lines().count()) as u64,
        t.envelopes
    );
    assert_eq!(truth.requests.len(), 40);
    for line in a.lines().chain(a_late.lines()) {
        let env: weft_schemas::Envelope = serde_json::from_str(line).unwrap();
        env.validate().unwrap();
    }
}
