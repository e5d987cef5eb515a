//! End-to-end tests of the `fanout` binary: the dataset commands on the shared datasets and on
//! every generator preset, and clean failures on bad flags, bad input and damaged datasets.

mod common;

use common::{fails, fanout, ok, ok_json, s, shared, tiny};

#[test]
fn cora_imports_verifies_and_reports_its_sizes() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("cora");
    let cora = shared("cora");
    let v = ok_json(&[
        "dataset",
        "import",
        "--format",
        "npy",
        s(&cora),
        s(&out),
        "--verify",
        "--json",
    ]);
    let info = &v["info"];
    assert_eq!(info["num_nodes"], 2708);
    assert_eq!(info["num_arcs"], 10556);
    assert_eq!(info["feat_dim"], 1433);
    assert_eq!(info["num_classes"], 7);
    assert_eq!(
        (
            info["train"].as_u64(),
            info["valid"].as_u64(),
            info["test"].as_u64()
        ),
        (Some(140), Some(500), Some(1000))
    );
    assert!(v["verify"]["checksums_verified"].as_array().unwrap().len() >= 7);

    let o = fanout(&["dataset", "verify", s(&out)]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("sound"));
    let o = fanout(&["dataset", "info", s(&out)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("2708")
            && text.contains("10556")
            && text.contains("train 140 / valid 500 / test 1000"),
        "{text}"
    );

    // The output exists now: a second import is refused and leaves it intact; --overwrite works.
    fails(
        &["dataset", "import", "--format", "npy", s(&cora), s(&out)],
        1,
        &["already exists", "--overwrite"],
    );
    assert!(fanout(&["dataset", "verify", s(&out)]).status.success());
    let v = ok_json(&[
        "dataset",
        "import",
        "--format",
        "npy",
        "--f16",
        "--overwrite",
        s(&cora),
        s(&out),
        "--json",
    ]);
    assert_eq!(v["info"]["feat_dtype"], "f16");
}

#[test]
fn cnr2000_imports_with_random_features() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("cnr");
    let v = ok_json(&[
        "dataset",
        "import",
        "--format",
        "npy",
        s(&shared("cnr2000")),
        s(&out),
        "--random-features",
        "16",
        "--classes",
        "8",
        "--train-frac",
        "0.01",
        "--verify",
        "--json",
    ]);
    let info = &v["info"];
    assert_eq!(info["num_nodes"], 325557);
    assert_eq!(info["num_arcs"], 3216152);
    assert_eq!(info["feat_dim"], 16);
    assert_eq!(info["num_classes"], 8);
    assert_eq!(info["train"], 3256);
}

#[test]
fn every_preset_generates_and_verifies() {
    let t = tempfile::tempdir().unwrap();
    for preset in ["tiny", "products", "papers", "twitter", "uk"] {
        let out = t.path().join(preset);
        let v = ok_json(&[
            "dataset",
            "gen",
            "--preset",
            preset,
            "--nodes",
            "3000",
            "--seed",
            "3",
            s(&out),
            "--verify",
            "--json",
        ]);
        assert_eq!(v["info"]["num_nodes"], 3000, "{preset}");
        assert!(v["info"]["num_arcs"].as_u64().unwrap() > 3000, "{preset}");
        assert!(v["info"]["train"].as_u64().unwrap() > 0, "{preset}");
        assert!(v["verify"].is_object(), "{preset}");
    }
}

#[test]
fn bad_flags_and_bad_input_fail_cleanly() {
    let t = tempfile::tempdir().unwrap();
    // Usage errors: clap's exit code 2 and a message naming the problem.
    fails(
        &["dataset", "gen", "--preset", "nope", s(&t.path().join("x"))],
        2,
        &["nope"],
    );
    fails(
        &["dataset", "import", "--format", "parquet", "a", "b"],
        2,
        &["parquet"],
    );
    fails(&["dataset", "info"], 2, &["DIR"]);
    // A malformed edge list names the file and the line; nothing is written.
    let el = t.path().join("edges.txt");
    std::fs::write(&el, "# comment\n0 1\n1 two\n").unwrap();
    let out = t.path().join("el");
    fails(
        &["dataset", "import", "--format", "edgelist", s(&el), s(&out)],
        1,
        &["edges.txt", "line 3"],
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(t.path()).unwrap().count(),
        1,
        "temporary files left behind"
    );
    // Sizes that would overflow or exhaust memory are refused before any work.
    for (flags, want) in [
        (
            ["--random-features", "100000000000", "--classes", "16"],
            "must fit in 1 GiB",
        ),
        (
            ["--random-features", "16", "--classes", "100000000000"],
            "expected 1 to 16777216",
        ),
    ] {
        let mut args = vec!["dataset", "import", "--format", "edgelist"];
        args.extend(flags);
        args.extend([s(&el), s(&out)]);
        fails(&args, 1, &[want]);
        assert!(!out.exists());
    }
    // Not a dataset.
    fails(&["dataset", "info", s(t.path())], 1, &["meta.txt"]);
}

#[test]
fn damaged_dataset_fails_verify_naming_the_file() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("tiny");
    ok_json(&["dataset", "gen", "--preset", "tiny", s(&out), "--json"]);
    let p = out.join("indices.bin");
    let mut b = std::fs::read(&p).unwrap();
    b.truncate(b.len() - 4);
    std::fs::write(&p, b).unwrap();
    fails(
        &["dataset", "verify", s(&out)],
        1,
        &["verify failed", "indices.bin", "truncated"],
    );
}

#[test]
fn damaged_offsets_are_one_line_errors_for_every_command() {
    // A decreasing indptr used to reach the samplers and panic with a backtrace.
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("tiny");
    ok_json(&["dataset", "gen", "--preset", "tiny", s(&out), "--json"]);
    let p = out.join("indptr.bin");
    let mut b = std::fs::read(&p).unwrap();
    // Entry 10 far above entry 11.
    b[40..44].copy_from_slice(&40_000u32.to_le_bytes());
    std::fs::write(&p, b).unwrap();
    let d = s(&out);
    for args in [
        vec!["train", "--dataset", d, "--epochs", "1"],
        vec!["sample-bench", "--dataset", d, "--batches", "2"],
        vec!["cache-sim", "--dataset", d, "--epochs", "1"],
        vec!["dataset", "info", d],
        vec!["dataset", "partition", "--parts", "2", d],
    ] {
        fails(&args, 1, &["indptr.bin", "entry 11", "must not decrease"]);
    }
}

#[test]
fn a_closed_stdout_ends_the_run_without_a_backtrace() {
    // `fanout train | head -1`: the reader goes away while fanout still prints.
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("tiny");
    ok_json(&["dataset", "gen", "--preset", "tiny", s(&out), "--json"]);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args([
            "--quiet",
            "train",
            "--dataset",
            s(&out),
            "--epochs",
            "30",
            "--batch-size",
            "64",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!o.status.success(), "it cannot have printed everything");
}

#[test]
fn device_flag_runs_cpu_and_refuses_cuda_it_cannot_use() {
    let t = tempfile::tempdir().unwrap();
    // Values that are not devices: clap's exit code 2, naming the value and the accepted forms.
    for (cmd, bad) in [("train", "gpu"), ("eval", "cuda:x"), ("train", "CUDA")] {
        let mut args = vec![cmd, "--device", bad];
        if cmd == "eval" {
            args.extend(["--model", "m.safetensors"]);
        }
        fails(
            &args,
            2,
            &["--device", &format!("\"{bad}\" is not a device"), "cuda:"],
        );
    }
    fails(
        &["train", "--device", "gpu"],
        2,
        &["expected cpu, cuda or cuda:N"],
    );

    // cpu runs as without the flag.
    let ds = tiny(t.path());
    let model = t.path().join("m.safetensors");
    let train = |device: &'static str| {
        vec![
            "train",
            "--dataset",
            &ds,
            "--fanouts",
            "3,3",
            "--batch-size",
            "256",
            "--hidden",
            "8",
            "--epochs",
            "1",
            "--device",
            device,
        ]
    };
    let mut args = train("cpu");
    args.extend(["--save-model", s(&model)]);
    ok(&args);
    let eval = |device: &'static str| {
        vec![
            "eval",
            "--model",
            s(&model),
            "--dataset",
            &ds,
            "--device",
            device,
        ]
    };
    assert!(ok(&eval("cpu")).contains("test accuracy"));

    // cuda never silently falls back to the CPU: without the feature, the error says how to
    // rebuild; with it, there is no driver here, or (on a GPU) training runs there and
    // evaluation too (cuda:1 exists only on a machine with two GPUs).
    for args in [train("cuda"), eval("cuda:1")] {
        let device = if args[0] == "train" {
            "cuda:0"
        } else {
            "cuda:1"
        };
        if cfg!(feature = "cuda") {
            let o = fanout(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            if o.status.success() {
                continue;
            }
            assert_eq!(o.status.code(), Some(1), "{err}");
            assert!(err.contains(&format!("--device {device}: ")), "{err}");
            assert!(
                err.contains("no CUDA driver found (libcuda.so)")
                    || err.contains("there is no cuda:1")
                    || err.contains("CUDA driver"),
                "{err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        } else {
            fails(
                &args,
                1,
                &[
                    &format!("--device {device}: "),
                    "built without CUDA support",
                    "cargo build --release --features cuda",
                ],
            );
        }
    }
}

#[test]
fn report_draws_a_training_run_and_cache_sim_rows_and_refuses_bad_input_in_one_line() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let m = t.path().join("run.json");
    ok(&[
        "train",
        "--dataset",
        &ds,
        "--epochs",
        "2",
        "--fanouts",
        "5,5",
        "--hidden",
        "16",
        "--metrics-out",
        s(&m),
    ]);
    for pic in ["run.svg", "run.png"] {
        let out = t.path().join(pic);
        let o = ok(&["report", s(&m), "-o", s(&out)]);
        assert!(o.contains("2 epochs"), "{o}");
        assert!(std::fs::metadata(&out).unwrap().len() > 1000, "{pic}");
    }
    let svg = std::fs::read_to_string(t.path().join("run.svg")).unwrap();
    assert!(
        svg.contains("sage on") && svg.contains("Training loss"),
        "title and panels"
    );
    let sim = t.path().join("sim.json");
    let rows = ok(&[
        "cache-sim",
        "--dataset",
        &ds,
        "--json",
        "--ratios",
        "0.1,0.2",
    ]);
    std::fs::write(&sim, rows).unwrap();
    // Without -o, the picture is INPUT with .svg.
    let o = ok(&["report", s(&sim)]);
    assert!(o.contains("sim.svg: hit rate against cache ratio"), "{o}");
    // Bad input: one line, exit 1, nothing written.
    std::fs::write(&sim, "{\"policy\": 3}\n").unwrap();
    fails(
        &["report", s(&sim), "-o", s(&t.path().join("bad.svg"))],
        1,
        &["sim.json: line 1"],
    );
    fails(
        &["report", s(&m), "-o", s(&t.path().join("bad.gif"))],
        1,
        &["expected a name ending in .svg or .png"],
    );
    assert!(!t.path().join("bad.svg").exists() && !t.path().join("bad.gif").exists());
    // Metrics saved under a picture's name are not drawn over (by default or by -o).
    let odd = t.path().join("metrics.svg");
    std::fs::copy(&m, &odd).unwrap();
    fails(&["report", s(&odd)], 1, &["would replace the metrics"]);
    let same = t.path().join(".").join("metrics.svg");
    fails(
        &["report", s(&odd), "-o", s(&same)],
        1,
        &["would replace the metrics"],
    );
    #[cfg(unix)]
    {
        let linked = t.path().join("linked.svg");
        std::fs::hard_link(&odd, &linked).unwrap();
        fails(
            &["report", s(&odd), "-o", s(&linked)],
            1,
            &["would replace the metrics"],
        );
    }
    assert_eq!(std::fs::read(&odd).unwrap(), std::fs::read(&m).unwrap());
}

#[test]
fn metis_partition_writes_a_relabelled_dataset_and_refuses_a_missing_or_stray_out() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let out = t.path().join("metis4");
    let o = ok(&[
        "dataset",
        "partition",
        "--method",
        "metis",
        "--parts",
        "4",
        &ds,
        s(&out),
    ]);
    assert!(o.contains("4 METIS parts as contiguous id ranges"), "{o}");
    assert_eq!(
        o.lines().filter(|l| l.starts_with("  part ")).count(),
        4,
        "{o}"
    );
    ok(&["dataset", "verify", s(&out)]);
    // The relabelled dataset trains like any other.
    ok(&[
        "train",
        "--dataset",
        s(&out),
        "--epochs",
        "1",
        "--fanouts",
        "5,5",
        "--hidden",
        "16",
    ]);
    // Writing over it needs --overwrite; a missing OUT or an OUT for another method is refused.
    fails(
        &[
            "dataset",
            "partition",
            "--method",
            "metis",
            "--parts",
            "4",
            &ds,
            s(&out),
        ],
        1,
        &["exists"],
    );
    fails(
        &[
            "dataset",
            "partition",
            "--method",
            "metis",
            "--parts",
            "4",
            &ds,
        ],
        1,
        &["give its directory after DIR"],
    );
    fails(
        &["dataset", "partition", "--parts", "2", &ds, s(&out)],
        1,
        &["only --method metis writes a new dataset"],
    );
    fails(
        &[
            "dataset",
            "partition",
            "--method",
            "metis",
            "--parts",
            "2",
            "--name",
            "m2",
            &ds,
            s(&t.path().join("named")),
        ],
        1,
        &["leave --name out"],
    );
    assert!(!t.path().join("named").exists());
    fails(
        &[
            "dataset",
            "partition",
            "--method",
            "metis",
            "--parts",
            "0",
            &ds,
            s(&t.path().join("z")),
        ],
        1,
        &["at least 1"],
    );
}
