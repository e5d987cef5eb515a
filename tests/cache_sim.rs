//! End-to-end tests of `fanout cache-sim` on the tiny generator preset: one JSON line per
//! (policy, ratio) with the documented keys, the oracle bounding every policy, the table with
//! Match-Reorder and similarity sections, and bad flags failing with a message.

mod common;

use common::{fails, fanout, ok, tiny};
use serde_json::Value;

#[test]
fn json_lines_per_policy_and_ratio() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let o = fanout(&[
        "cache-sim",
        "--dataset",
        &ds,
        "--fanouts",
        "5,3",
        "--batch-size",
        "64",
        "--ratios",
        "0.05,0.2",
        "--match-reorder",
        "--similarity",
        "--threads",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(rows.len(), 5 * 2);
    for r in &rows {
        for k in [
            "policy",
            "ratio",
            "hit_rate",
            "bytes_per_epoch",
            "share_of_optimal",
        ] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
        let h = r["hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&h));
        assert!(h <= r["optimal_hit_rate"].as_f64().unwrap() + 1e-12);
        assert!(r["mr_saved_bytes_per_epoch"].as_f64().is_some());
        assert!(r["similarity"]["footprint_similarity"].as_f64().is_some());
    }
    let table = fanout(&[
        "cache-sim",
        "--dataset",
        &ds,
        "--fanouts",
        "5,3",
        "--batch-size",
        "64",
        "--ratios",
        "0.1",
        "--match-reorder",
        "--similarity",
    ]);
    let s = String::from_utf8(table.stdout).unwrap();
    assert!(
        s.contains("| presc1 | 0.1 |") && s.contains("MR saved"),
        "{s}"
    );
    assert!(
        s.contains("footprint similarity") && s.contains("avg M_ij"),
        "{s}"
    );
}

#[test]
fn bad_flags_fail_with_a_message() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    for (flag, value, want) in [
        ("--policies", "lru", "unknown cache policy"),
        ("--ratios", "1.5", "not within [0, 1]"),
        ("--ratios", "", "no ratio"),
    ] {
        let o = fanout(&["cache-sim", "--dataset", &ds, flag, value]);
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(want), "{flag} {value}: {e}");
    }
}

#[test]
fn weighted_sampling_runs_after_dataset_weights_writes_them() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let sim = |scheme_note: &str| {
        let o = fanout(&[
            "cache-sim",
            "--dataset",
            &ds,
            "--sampler",
            "weighted",
            "--fanouts",
            "5,3",
            "--batch-size",
            "64",
            "--ratios",
            "0.1",
            "--policies",
            "degree,presc1,optimal",
            "--json",
        ]);
        assert!(
            o.status.success(),
            "{scheme_note}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    // Without weight.bin the weighted sampler refuses, naming the file.
    fails(
        &["cache-sim", "--dataset", &ds, "--sampler", "weighted"],
        1,
        &["weight.bin"],
    );
    let out = ok(&["dataset", "weights", &ds, "--scheme", "newer"]);
    assert!(out.contains("weight.bin") && out.contains("newer"), "{out}");
    let weights = std::fs::read(std::path::Path::new(&ds).join("weight.bin")).unwrap();
    let newer = sim("newer");
    // An existing file is kept unless --force.
    fails(
        &["dataset", "weights", &ds],
        1,
        &["weight.bin exists", "--force"],
    );
    assert_eq!(
        std::fs::read(std::path::Path::new(&ds).join("weight.bin")).unwrap(),
        weights
    );
    let j: Value = serde_json::from_str(&ok(&[
        "dataset", "weights", &ds, "--scheme", "random", "--seed", "3", "--force", "--json",
    ]))
    .expect("one JSON object");
    assert_eq!(j["scheme"], "random");
    assert_eq!(j["seed"], 3);
    assert_eq!(j["weights"].as_u64().unwrap() as usize * 4, weights.len());
    assert_ne!(
        std::fs::read(std::path::Path::new(&ds).join("weight.bin")).unwrap(),
        weights
    );
    // Other weights, other samples: the simulated hit rates change (the alias tables are
    // rebuilt from the new file).
    let random = sim("random");
    assert_ne!(newer, random);
    for l in random.lines() {
        let r: Value = serde_json::from_str(l).unwrap();
        assert_eq!(r["sampler"], "weighted");
    }
}

#[test]
fn one_thread_simulates_without_waiting_on_itself() {
    // The simulation waits for batches the loader samples on the thread pool: with one thread
    // it once waited on itself for ever. Watched, so a regression fails instead of hanging.
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args([
            "--quiet",
            "cache-sim",
            "--dataset",
            &ds,
            "--fanouts",
            "5,5",
            "--batch-size",
            "100",
            "--policies",
            "degree,presc1",
            "--ratios",
            "0.1",
            "--epochs",
            "1",
            "--json",
            "--threads",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("cache-sim --threads 1 did not finish within two minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    let lines = String::from_utf8(o.stdout).unwrap();
    assert_eq!(lines.lines().count(), 2, "{lines}");
}
