//! End-to-end tests of `fanout sample-bench` on the tiny generator preset: every sampler runs and
//! reports the documented JSON keys; weighted sampling asks for weight.bin and then builds and
//! saves its alias tables; bad flags fail with a message.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn fanout(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("--quiet")
        .args(args)
        .output()
        .expect("run fanout")
}

fn tiny(dir: &Path) -> String {
    let out = dir.join("tiny");
    let o = fanout(&["dataset", "gen", "--preset", "tiny", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.to_str().unwrap().to_string()
}

fn bench(ds: &str, extra: &[&str]) -> Result<Value, String> {
    let mut args = vec![
        "sample-bench",
        "--dataset",
        ds,
        "--batch-size",
        "64",
        "--batches",
        "3",
        "--threads",
        "2",
        "--json",
    ];
    args.extend(extra);
    let o = fanout(&args);
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&o.stdout).expect("stdout is one JSON object"))
}

#[test]
fn every_sampler_reports_throughput_keys() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    for extra in [
        &["--fanouts", "5,3"][..],
        &["--fanouts", "5,3", "--replace", "--remap", "hash"],
        &["--sampler", "randomwalk", "--fanouts", "5,5,5"],
        &["--sampler", "layerwise", "--fanouts", "100,200"],
    ] {
        let v = bench(&ds, extra).unwrap();
        for key in ["seps", "batches_per_s", "mean_input_nodes"] {
            assert!(v[key].as_f64().unwrap() > 0.0, "{extra:?}: {key} in {v}");
        }
        assert_eq!(v["threads"], 2);
        assert_eq!(v["batches"], 3);
    }
}

#[test]
fn weighted_needs_weights_then_saves_alias_tables() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let err = bench(&ds, &["--sampler", "weighted", "--fanouts", "4,4"]).unwrap_err();
    assert!(err.contains("needs weight.bin"), "{err}");
    let arcs = fanout_graph::Dataset::open(&ds).unwrap().num_arcs() as usize;
    let w: Vec<f32> = (0..arcs).map(|i| (i % 5) as f32).collect();
    fanout_sample::alias::write_weights(Path::new(&ds), &w).unwrap();
    let v = bench(&ds, &["--sampler", "weighted", "--fanouts", "4,4"]).unwrap();
    assert!(v["seps"].as_f64().unwrap() > 0.0);
    assert!(Path::new(&ds).join("alias_prob.bin").is_file());
    assert!(Path::new(&ds).join("alias_idx.bin").is_file());
}

#[test]
fn bad_flags_fail_with_a_message() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let err = bench(&ds, &["--fanouts", "5,0"]).unwrap_err();
    assert!(
        err.contains("--fanouts") && err.contains("at least one"),
        "{err}"
    );
    let o = fanout(&["sample-bench", "--dataset", &ds, "--batch-size", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("batch size"), "{err}");
    let err = bench("/nonexistent/dataset", &[]).unwrap_err();
    assert!(err.contains("not a dataset directory"), "{err}");
    // Zero threads or epochs are refused (they once ran on every core, or one epoch).
    for (cmd, flag) in [("sample-bench", "--threads"), ("cache-sim", "--epochs")] {
        let o = fanout(&[cmd, "--dataset", &ds, "--batch-size", "8", flag, "0"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd} {flag} 0: {err}");
        assert!(err.contains(flag) && !err.contains("panicked"), "{err}");
    }
}
