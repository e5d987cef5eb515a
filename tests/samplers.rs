//! End-to-end tests of the sampler flags shared by `train`, `sample-bench` and `cache-sim`:
//! every sampler is reachable from `fanout train`, a checkpoint remembers its sampler, and bad
//! values fail as clap errors.

mod common;

use common::{fails, ok, ok_json, s, tiny};
use serde_json::Value;

fn read_json(p: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn every_sampler_trains_and_a_checkpoint_reevaluates_with_its_sampler() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    ok(&["dataset", "weights", &ds, "--scheme", "random"]);
    let base = [
        "train",
        "--dataset",
        &ds,
        "--epochs",
        "2",
        "--batch-size",
        "256",
        "--hidden",
        "16",
    ];
    for (sampler, fanouts, extra) in [
        ("weighted", "5,5", vec![]),
        ("layerwise", "300,300", vec![]),
        (
            "khop",
            "5,5",
            vec!["--replace", "--remap", "hash", "--residency", "mapped"],
        ),
        (
            "randomwalk",
            "3,3",
            vec!["--walks", "2", "--walk-length", "2", "--stop-prob", "0.3"],
        ),
    ] {
        let m = t.path().join(format!("{sampler}.json"));
        let ckpt = t.path().join(format!("{sampler}.safetensors"));
        let mut args: Vec<&str> = base.to_vec();
        args.extend(["--sampler", sampler, "--fanouts", fanouts]);
        args.extend(extra.iter().copied());
        args.extend(["--metrics-out", s(&m), "--save-model", s(&ckpt)]);
        ok(&args);
        let j = read_json(&m);
        assert_eq!(j["config"]["sampler"]["kind"], sampler);
        let e = ok_json(&["eval", "--model", s(&ckpt), "--dataset", &ds, "--json"]);
        assert_eq!(
            e["accuracy"], j["test_acc"],
            "{sampler}: eval does not reproduce the run's test accuracy"
        );
    }
    let j = read_json(&t.path().join("khop.json"));
    assert_eq!(j["config"]["sampler"]["replace"], true);
    assert_eq!(j["config"]["sampler"]["remap"], "hash");
    assert_eq!(j["config"]["sampler"]["residency"], "mapped");
}

#[test]
fn the_shared_flags_reach_sample_bench_and_cache_sim_and_bad_values_are_clap_errors() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let j = ok_json(&[
        "sample-bench",
        "--dataset",
        &ds,
        "--sampler",
        "layerwise",
        "--fanouts",
        "100,100",
        "--batch-size",
        "128",
        "--batches",
        "3",
        "--json",
    ]);
    assert_eq!(j["sampler"], "layerwise");
    let out = ok(&[
        "cache-sim",
        "--dataset",
        &ds,
        "--sampler",
        "khop",
        "--replace",
        "--fanouts",
        "5,5",
        "--batch-size",
        "256",
        "--epochs",
        "1",
        "--ratios",
        "0.1",
        "--policies",
        "degree",
    ]);
    assert!(out.contains("khop"), "{out}");
    fails(
        &["train", "--dataset", &ds, "--sampler", "bfs"],
        2,
        &["bfs"],
    );
    fails(
        &["sample-bench", "--dataset", &ds, "--remap", "tree"],
        2,
        &["tree"],
    );
    fails(
        &[
            "train",
            "--dataset",
            &ds,
            "--sampler",
            "randomwalk",
            "--stop-prob",
            "1.5",
        ],
        1,
        &["--stop-prob 1.5", "stop probability"],
    );
    // Random-walk settings are not checked (nor used) for another sampler.
    ok(&[
        "sample-bench",
        "--dataset",
        &ds,
        "--sampler",
        "khop",
        "--stop-prob",
        "1",
        "--fanouts",
        "5",
        "--batch-size",
        "100",
        "--epochs",
        "1",
    ]);
}
