//! `fanout train --resume`, per-epoch checkpoints and the non-finite stop, end to end.

mod common;

use common::{fails, ok, s, tiny};
use serde_json::Value;
use std::collections::BTreeMap;

/// Small, fast settings on the tiny preset, one worker.
fn small<'a>(ds: &'a str, epochs: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
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
        "--lr",
        "0.01",
        "--seed",
        "3",
        "--epochs",
        epochs,
    ];
    v.extend_from_slice(extra);
    v
}

/// The tensors of a safetensors file by name (header order is not fixed).
fn tensors(file: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let data = &file[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .map(|(k, v)| {
            let o = &v["data_offsets"];
            let (a, b) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            );
            (k.clone(), data[a..b].to_vec())
        })
        .collect()
}

#[test]
fn a_resumed_run_ends_with_the_uninterrupted_runs_model_bit_for_bit() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let full = t.path().join("full.st");
    let part = t.path().join("part.st");
    let out_full = ok(&small(&ds, "4", &["--save-model", s(&full)]));
    ok(&small(&ds, "2", &["--save-model", s(&part)]));
    let after2 = std::fs::read(&part).unwrap();
    let out_res = ok(&small(
        &ds,
        "4",
        &["--resume", s(&part), "--save-model", s(&part)],
    ));
    let (a, b) = (
        tensors(&std::fs::read(&full).unwrap()),
        tensors(&std::fs::read(&part).unwrap()),
    );
    // The same dataset under another spelling resumes too (a copy of the checkpoint, not
    // updated: the run above is the one compared).
    let again = t.path().join("again.st");
    std::fs::write(&again, &after2).unwrap();
    let spelled = format!("{}/./", ds);
    ok(&small(&spelled, "3", &["--resume", s(&again)]));
    // The best model, the current parameters and the optimiser state all agree.
    assert!(a.keys().any(|k| k.starts_with("train.optim.")));
    assert!(a.keys().any(|k| k.starts_with("train.params.")));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, v) in &a {
        assert!(b[k] == *v, "tensor {k} differs after resuming");
    }
    let last = |o: &str| {
        o.lines()
            .last()
            .unwrap()
            .split("; median")
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(last(&out_full), last(&out_res));
    // The resumed run trained epochs 2 and 3 only.
    assert!(!out_res.contains("epoch   0") && out_res.contains("epoch   3"));
    // The checkpoint after 2 epochs differs from the final one (the test compares something).
    assert_ne!(tensors(&after2), b);
    // A checkpoint is also a model for `fanout eval`.
    ok(&["eval", "--model", s(&full), "--dataset", &ds]);
}

#[test]
fn a_resume_that_does_not_match_the_run_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let ck = t.path().join("m.st");
    ok(&small(&ds, "1", &["--save-model", s(&ck)]));
    let before = std::fs::read(&ck).unwrap();
    let r = s(&ck);
    fails(
        &small(&ds, "3", &["--resume", r, "--hidden", "16"]),
        1,
        &["--resume", "hidden 32", "hidden 16", "differs"],
    );
    fails(
        &small(&ds, "3", &["--resume", r, "--lr", "0.02"]),
        1,
        &["other settings", "lr"],
    );
    fails(
        &small(&ds, "3", &["--resume", r, "--model", "gcn"]),
        1,
        &["gcn", "differs"],
    );
    fails(
        &small(&ds, "1", &["--resume", r]),
        1,
        &["already trained 1 epochs", "--epochs greater than 1"],
    );
    // Another dataset (another vertex count, same shape of features and classes).
    let other = t.path().join("other");
    ok(&[
        "dataset",
        "gen",
        "--preset",
        "tiny",
        "--nodes",
        "3000",
        s(&other),
    ]);
    let o = s(&other);
    fails(
        &small(o, "3", &["--resume", r]),
        1,
        &["--resume", "other settings", "dataset"],
    );
    // Damaged checkpoints: truncated, or a model without training state.
    let cut = t.path().join("cut.st");
    std::fs::write(&cut, &before[..before.len() / 2]).unwrap();
    fails(
        &small(&ds, "3", &["--resume", s(&cut)]),
        1,
        &["--resume", "cut.st", "truncated"],
    );
    fails(
        &["eval", "--model", s(&cut), "--dataset", &ds],
        1,
        &["cut.st", "truncated"],
    );
    fails(
        &small(&ds, "3", &["--resume", s(&t.path().join("absent.st"))]),
        1,
        &["--resume", "absent.st", "cannot read"],
    );
    assert_eq!(
        std::fs::read(&ck).unwrap(),
        before,
        "a refused resume wrote"
    );
    fails(
        &small(&ds, "3", &["--resume", r, "--strategy", "factored"]),
        1,
        &["--resume", "factored"],
    );
}

#[test]
fn a_non_finite_step_stops_training_and_keeps_the_last_good_checkpoint() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let ck = t.path().join("m.st");
    ok(&small(&ds, "1", &["--save-model", s(&ck)]));
    let before = std::fs::read(&ck).unwrap();
    // A learning rate this high makes the parameters overflow after the first step.
    let mut args = small(&ds, "3", &["--save-model", s(&ck)]);
    args.extend(["--lr", "1e38"]);
    fails(
        &args,
        1,
        &[
            "training stopped at epoch 0, step 1",
            "is not finite",
            "learning rate too high",
            "NaN or Inf values in the features",
            "m.st",
            "left as it was",
        ],
    );
    assert_eq!(
        std::fs::read(&ck).unwrap(),
        before,
        "the checkpoint was replaced"
    );
    // Resuming a good checkpoint with a run that then diverges keeps that checkpoint too.
    let mut args = small(&ds, "3", &["--resume", s(&ck), "--save-model", s(&ck)]);
    args.extend(["--lr", "0.01"]);
    ok(&args);
}

#[test]
fn nan_features_stop_training_at_the_first_step_naming_the_likely_cause() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    // A copy of the dataset whose features are all NaN (0xFFFFFFFF is a NaN as f32).
    let bad = t.path().join("nan");
    std::fs::create_dir(&bad).unwrap();
    for e in std::fs::read_dir(&ds).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bad.join(e.file_name())).unwrap();
    }
    let feat = bad.join("feat.bin");
    let n = std::fs::metadata(&feat).unwrap().len() as usize;
    std::fs::write(&feat, vec![0xFF; n]).unwrap();
    let ck = t.path().join("nan.st");
    fails(
        &small(s(&bad), "2", &["--save-model", s(&ck)]),
        1,
        &[
            "training stopped at epoch 0, step 0",
            "NaN",
            "NaN or Inf values in the features",
        ],
    );
    assert!(!ck.exists(), "a checkpoint of a NaN model was written");
}

#[test]
fn data_parallel_runs_resume_to_the_same_model() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let full = t.path().join("full.st");
    let part = t.path().join("part.st");
    let w = ["--workers", "2"];
    ok(&small(
        &ds,
        "3",
        &[&w[..], &["--save-model", s(&full)]].concat(),
    ));
    ok(&small(
        &ds,
        "1",
        &[&w[..], &["--save-model", s(&part)]].concat(),
    ));
    let resume = ["--resume", s(&part), "--save-model", s(&part)];
    ok(&small(&ds, "3", &[&w[..], &resume[..]].concat()));
    assert_eq!(
        tensors(&std::fs::read(&full).unwrap()),
        tensors(&std::fs::read(&part).unwrap())
    );
    // Another worker count is another run.
    fails(
        &small(&ds, "3", &["--resume", s(&part)]),
        1,
        &["other settings", "strategy"],
    );
}
