//! End-to-end tests of `fanout train` and `fanout eval`: a small run with its metrics file, a
//! save/load round trip that reproduces the test accuracy, determinism per seed, and clean
//! failures on bad flags, missing data and damaged datasets.

mod common;

use common::{fails, ok, s, tiny};
use serde_json::Value;
use std::path::Path;

/// Small, fast settings on the tiny preset.
fn small<'a>(ds: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "train",
        "--dataset",
        ds,
        "--fanouts",
        "5,5",
        "--batch-size",
        "256",
        "--hidden",
        "32",
        "--epochs",
        "3",
        "--lr",
        "0.01",
    ];
    v.extend_from_slice(extra);
    v
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn train_writes_metrics_and_saved_model_reproduces_test_accuracy() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let m = t.path().join("m.json");
    let model = t.path().join("sage.safetensors");
    let out = ok(&small(
        &ds,
        &["--metrics-out", s(&m), "--save-model", s(&model)],
    ));
    assert!(out.contains("test accuracy"), "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("epoch")).count(), 3);
    let j = read_json(&m);
    let acc = j["test_acc"].as_f64().unwrap();
    // 4 planted classes: chance is 0.25.
    assert!(acc > 0.4 && acc <= 1.0, "test accuracy {acc}");
    let epochs = j["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 3);
    for (i, e) in epochs.iter().enumerate() {
        assert_eq!(e["epoch"].as_u64(), Some(i as u64));
        for k in [
            "wall_s",
            "sample_s",
            "extract_s",
            "train_s",
            "loss",
            "train_acc",
            "val_acc",
        ] {
            assert!(e[k].as_f64().is_some(), "epoch {i} lacks {k}: {e}");
        }
    }
    let ev = ok(&["eval", "--model", s(&model), "--dataset", &ds, "--json"]);
    let ev: Value = serde_json::from_str(ev.trim()).unwrap();
    assert_eq!(
        ev["accuracy"].as_f64(),
        Some(acc),
        "eval disagrees with train"
    );
}

#[test]
fn every_model_trains_a_step_and_runs_are_deterministic() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    for model in ["gcn", "gat", "gin", "pinsage"] {
        let m = t.path().join(format!("{model}.json"));
        let mut v = small(&ds, &["--model", model, "--metrics-out", s(&m)]);
        v[10] = "1"; // one epoch
        ok(&v);
        assert!(read_json(&m)["epochs"][0]["loss"].as_f64().unwrap() > 0.0);
    }
    let (a, b) = (t.path().join("a.json"), t.path().join("b.json"));
    ok(&small(
        &ds,
        &["--seed", "3", "--threads", "2", "--metrics-out", s(&a)],
    ));
    ok(&small(
        &ds,
        &["--seed", "3", "--threads", "1", "--metrics-out", s(&b)],
    ));
    let (ja, jb) = (read_json(&a), read_json(&b));
    for k in ["loss", "train_acc", "val_acc"] {
        for e in 0..3 {
            assert_eq!(
                ja["epochs"][e][k], jb["epochs"][e][k],
                "{k} differs in epoch {e}"
            );
        }
    }
    assert_eq!(ja["test_acc"], jb["test_acc"]);
}

#[test]
fn cache_and_match_change_bytes_not_results() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let (plain, cached) = (t.path().join("plain.json"), t.path().join("cached.json"));
    ok(&small(&ds, &["--metrics-out", s(&plain)]));
    let out = ok(&small(
        &ds,
        &[
            "--cache-policy",
            "presc",
            "--cache-ratio",
            "0.2",
            "--match-reorder",
            "--metrics-out",
            s(&cached),
        ],
    ));
    assert!(out.contains("feature cache: presc1"), "{out}");
    let (jp, jc) = (read_json(&plain), read_json(&cached));
    for e in 0..3 {
        for k in ["loss", "train_acc", "val_acc"] {
            assert_eq!(
                jp["epochs"][e][k], jc["epochs"][e][k],
                "{k} differs in epoch {e}"
            );
        }
        let (p, c) = (&jp["epochs"][e]["extract"], &jc["epochs"][e]["extract"]);
        assert_eq!(p["bytes_total"], c["bytes_total"]);
        assert_eq!(jp["epochs"][e]["hit_rate"].as_f64(), Some(0.0));
        let hit = jc["epochs"][e]["hit_rate"].as_f64().unwrap();
        assert!(
            hit > 0.2,
            "epoch {e}: hit rate {hit} with a 20% PreSC cache plus Match"
        );
        assert!(c["bytes_from_host"].as_u64() < p["bytes_from_host"].as_u64());
    }
    assert_eq!(jp["test_acc"], jc["test_acc"]);
    fails(
        &small(&ds, &["--cache-policy", "lru"]),
        1,
        &["--cache-policy", "lru"],
    );
    fails(
        &small(&ds, &["--cache-policy", "degree", "--cache-ratio", "lots"]),
        1,
        &["--cache-ratio"],
    );
}

#[test]
fn bad_flags_and_bad_data_fail_cleanly() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    // clap rejects these: exit 2.
    fails(&["train", "--model", "mlp"], 2, &["mlp"]);
    fails(&["train", "--epochs", "many"], 2, &["many"]);
    // Values clap accepts but the run rejects: exit 1 with a message.
    fails(&small(&ds, &["--fanouts", "0,5"]), 1, &["fanout"]);
    fails(&small(&ds, &["--batch-size", "0"]), 1, &["batch"]);
    fails(&small(&ds, &["--dropout", "1.5"]), 1, &["dropout"]);
    fails(&small(&ds, &["--epochs", "0"]), 1, &["epochs"]);
    fails(&["train", "--dataset", s(t.path())], 1, &["meta.txt"]);
    // Topology only: no features, no labels.
    let el = t.path().join("g.txt");
    std::fs::write(&el, "0 1\n1 2\n2 0\n").unwrap();
    let topo = t.path().join("topo");
    ok(&[
        "dataset",
        "import",
        "--format",
        "edgelist",
        s(&el),
        s(&topo),
    ]);
    fails(&["train", "--dataset", s(&topo)], 1, &["features"]);
    // Damaged: truncated topology.
    let p = Path::new(&ds).join("indices.bin");
    let mut b = std::fs::read(&p).unwrap();
    b.truncate(b.len() - 4);
    std::fs::write(&p, b).unwrap();
    fails(&small(&ds, &[]), 1, &["indices.bin"]);
    // Not a checkpoint.
    fails(
        &["eval", "--model", s(&el), "--dataset", &ds],
        1,
        &["g.txt"],
    );
}
