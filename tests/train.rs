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
    // The device the run computed on, and the backend.
    assert_eq!(j["device"]["device"], "cpu", "{}", j["device"]);
    assert_eq!(j["device"]["kind"], "cpu");
    assert!(!j["device"]["name"].as_str().unwrap().is_empty());
    assert_eq!(j["backend"], "cpu");
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
    // Without --dataset the embedded graph would be used: a model trained on a directory
    // says where it was trained instead of failing on the embedded graph's sizes.
    fails(
        &["eval", "--model", s(&model)],
        1,
        &["sage.safetensors: the model was trained on", "--dataset"],
    );
    for residency in ["auto", "mapped"] {
        let ev = ok(&[
            "eval",
            "--model",
            s(&model),
            "--dataset",
            &ds,
            "--json",
            "--feature-residency",
            residency,
        ]);
        let ev: Value = serde_json::from_str(ev.trim()).unwrap();
        assert_eq!(
            ev["accuracy"].as_f64(),
            Some(acc),
            "eval ({residency} features) disagrees with train"
        );
    }
}

#[test]
fn every_model_trains_a_step_and_runs_are_deterministic_whatever_threads_and_residency() {
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
    // Other thread count, and features read from the map instead of a huge-page copy.
    ok(&small(
        &ds,
        &[
            "--seed",
            "3",
            "--threads",
            "1",
            "--feature-residency",
            "mapped",
            "--metrics-out",
            s(&b),
        ],
    ));
    let (ja, jb) = (read_json(&a), read_json(&b));
    // The tiny dataset's features fit the auto rule on any machine.
    assert_eq!(ja["features_resident"], Value::Bool(true));
    assert_eq!(jb["features_resident"], Value::Bool(false));
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
    // Rows gathered one per input node in both runs (the fused input would read one per
    // edge instead, and a cache turns it off), so the byte counts compare.
    ok(&small(
        &ds,
        &["--no-fuse-input", "--metrics-out", s(&plain)],
    ));
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
    // Sizes that would abort on allocation or start a hundred thousand threads are refused.
    fails(
        &small(&ds, &["--prefetch", "1099511627776"]),
        1,
        &["--prefetch 1099511627776: at most 1024 batches"],
    );
    fails(
        &small(&ds, &["--match-reorder", "--reorder-window", "100000000"]),
        1,
        &["--reorder-window 100000000: at most 1024"],
    );
    fails(
        &small(&ds, &["--hidden", "10000000000"]),
        1,
        &["--hidden 10000000000: at most 65536"],
    );
    fails(
        &small(&ds, &["--threads", "100000"]),
        1,
        &["--threads 100000: at most 4096"],
    );
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

/// The tensors of a safetensors file by name (the header's key order is not fixed, so files
/// are compared tensor by tensor).
fn tensors(file: &[u8]) -> std::collections::BTreeMap<String, Vec<u8>> {
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

/// Bytes per row and vertex count of a dataset, from `dataset info --json`.
fn shape(ds: &str) -> (u64, u64) {
    let v: Value = serde_json::from_str(ok(&["dataset", "info", ds, "--json"]).trim()).unwrap();
    let v = if v["info"].is_object() {
        &v["info"]
    } else {
        &v
    };
    let dim = v["feat_dim"].as_u64().unwrap();
    (dim * 4, v["num_nodes"].as_u64().unwrap())
}

#[test]
fn auto_cache_size_follows_the_trial_batch_and_leaves_training_unchanged() {
    let t = tempfile::tempdir().unwrap();
    // 82k vertices with 1 KiB feature rows (84 MB): a 64 MiB budget caches part of them.
    let ds = t.path().join("slashdot");
    ok(&[
        "dataset",
        "import",
        "--format",
        "npy",
        s(&common::shared("slashdot")),
        s(&ds),
        "--random-features",
        "256",
        "--classes",
        "4",
        "--train-frac",
        "0.01",
    ]);
    let ds = s(&ds).to_string();
    let (row_bytes, num_nodes) = shape(&ds);
    assert_eq!(row_bytes, 1024);
    let run = |size: &str, extra: &[&str], name: &str| {
        let (m, model) = (
            t.path().join(format!("{name}.json")),
            t.path().join(format!("{name}.safetensors")),
        );
        let mut args = vec!["--cache-policy", "degree", "--cache-ratio", size];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--metrics-out", s(&m), "--save-model", s(&model)]);
        let mut v = small(&ds, &args);
        v[6] = "128"; // batch size
        let out = ok(&v);
        (out, read_json(&m), tensors(&std::fs::read(&model).unwrap()))
    };
    let (out, j, weights) = run("auto", &["--device-memory", "64MiB"], "auto");
    let a = &j["cache"]["auto"];
    let get = |k: &str| a[k].as_u64().unwrap_or_else(|| panic!("no {k} in {a}"));
    let dm = get("device_memory");
    assert_eq!(dm, 64 << 20);
    assert_eq!(get("margin"), (dm / 16).min(1 << 30));
    assert_eq!(
        get("trial_peak"),
        get("trial_step_peak") + get("model_state")
    );
    // The step holds the batch's feature matrix, so the measured peak cannot be below it.
    assert!(get("trial_feature_bytes") > 0);
    assert!(get("trial_step_peak") >= get("trial_feature_bytes"), "{a}");
    assert!(get("prefetch_buffers") >= get("trial_feature_bytes"), "{a}");
    let budget = dm - get("trial_peak") - get("prefetch_buffers") - get("margin");
    assert_eq!(get("budget"), budget);
    let rows = (budget / row_bytes).min(num_nodes);
    assert_eq!(get("rows"), rows);
    assert_eq!(j["cache"]["rows"].as_u64(), Some(rows));
    assert_eq!(j["cache"]["size_chosen"], "auto");
    assert!(rows > 0 && rows < num_nodes, "{rows} of {num_nodes} rows");
    assert!(
        out.contains(&format!("feature cache: degree holding {rows} rows"))
            && out.contains("size auto: device memory 64.0 MiB, trial-batch peak")
            && out.contains(&format!("= {rows} rows")),
        "{out}"
    );

    // The same rows set by hand: the trial step changed nothing, the weights are identical.
    let bytes = format!("{}B", rows * row_bytes);
    let (out_h, jh, weights_h) = run(&bytes, &[], "hand");
    assert!(out_h.contains(&format!("holding {rows} rows")), "{out_h}");
    assert!(out_h.contains("size set by hand"), "{out_h}");
    assert_eq!(jh["cache"]["size_chosen"], "by hand");
    assert!(jh["cache"]["auto"].is_null());
    assert!(!weights.is_empty());
    assert!(
        weights == weights_h,
        "the trial batch changed the trained model"
    );
    for e in 0..3 {
        assert_eq!(j["epochs"][e]["loss"], jh["epochs"][e]["loss"]);
        assert_eq!(j["epochs"][e]["extract"], jh["epochs"][e]["extract"]);
    }

    // Errors name the flag and what is expected.
    let with = |extra: &[&'static str]| {
        let mut v = small(&ds, extra);
        v[10] = "1";
        v
    };
    fails(
        &with(&["--cache-ratio", "auto", "--device-memory", "64MiB"]),
        1,
        &["--cache-ratio auto", "--cache-policy"],
    );
    fails(
        &with(&[
            "--cache-policy",
            "degree",
            "--cache-ratio",
            "auto",
            "--device-memory",
            "1MiB",
        ]),
        1,
        &["--device-memory", "trial batch", "peak"],
    );
    fails(
        &with(&[
            "--cache-policy",
            "degree",
            "--cache-ratio",
            "auto",
            "--device-memory",
            "lots",
        ]),
        1,
        &["--device-memory", "lots", "64MiB"],
    );
    fails(
        &with(&["--cache-policy", "degree", "--device-memory", "64MiB"]),
        1,
        &["--device-memory", "--cache-ratio auto"],
    );
    fails(
        &with(&["--cache-policy", "degree", "--cache-ratio", "automatic"]),
        1,
        &["--cache-ratio", "auto"],
    );
}

#[test]
fn reorder_window_permutes_batches_and_reuses_at_least_as_much() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let (plain, reord) = (t.path().join("plain.json"), t.path().join("reord.json"));
    let one_epoch = |extra: &[&'static str], m: &std::path::Path| {
        let mut v = small(&ds, extra);
        v[10] = "1";
        v.extend_from_slice(&["--metrics-out", s(m)]);
        ok(&v)
    };
    // No static cache, so every shared row is reused; a window larger than the epoch (4
    // batches) reorders it whole, and one epoch has no previous epoch's batch to reuse.
    let out_p = one_epoch(&["--match-reorder"], &plain);
    let out_r = one_epoch(&["--match-reorder", "--reorder-window", "16"], &reord);
    assert!(!out_p.contains("Greedy Reorder"), "{out_p}");
    assert!(
        out_r.contains("Greedy Reorder in windows of 16 batches"),
        "{out_r}"
    );
    let (jp, jr) = (read_json(&plain), read_json(&reord));
    assert_eq!(jp["reorder_window"].as_u64(), Some(1));
    assert_eq!(jr["reorder_window"].as_u64(), Some(16));
    let (ep, er) = (&jp["epochs"][0], &jr["epochs"][0]);
    // The same batches: counts, edges, input nodes and bytes needed agree.
    for k in ["batches", "edges", "input_nodes"] {
        assert_eq!(ep[k], er[k], "{k}");
    }
    assert_eq!(ep["extract"]["bytes_total"], er["extract"]["bytes_total"]);
    let reused = |e: &Value| e["extract"]["bytes_reused"].as_u64().unwrap();
    assert!(reused(ep) > 0);
    assert!(reused(er) >= reused(ep), "{} < {}", reused(er), reused(ep));
    // Reordering without Match is refused; evaluation is unaffected by the flag's parsing.
    fails(
        &small(&ds, &["--reorder-window", "4"]),
        1,
        &["--reorder-window", "--match-reorder"],
    );
}

#[test]
fn epochs_report_their_gemm_flops_and_floors_at_the_measured_rates() {
    // Every product of a two-layer GraphSAGE has the hidden width as one dimension (in x hidden,
    // hidden x classes), and the batches do not depend on it: doubling it doubles the flops
    // exactly. The floors are the flops and bytes at the rates the run reports.
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let cache = t.path().join("cache");
    let run = |hidden: &str| {
        let m = t.path().join(format!("m{hidden}.json"));
        let mut args = small(&ds, &["--metrics-out", s(&m), "--eval-every", "0"]);
        let h = args.iter().position(|a| *a == "--hidden").unwrap();
        args[h + 1] = hidden;
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
            .arg("--quiet")
            .args(&args)
            .env("FANOUT_CACHE_DIR", &cache)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(out.contains("x floor (compute "), "{out}");
        assert!(out.contains("x its floor ("), "{out}");
        read_json(&m)
    };
    // The first run measures the rates and stores them. Each run times a small product first
    // and measures again when it beats the stored GEMM rate by far (a rate stored while the
    // machine was busy heals), as it may in a loaded test run; with the stored rate made a
    // thousand times faster no probe beats it, so the next two runs must report exactly the
    // file's rates, read and not measured.
    run("32");
    let file = cache.join("machine-rates.json");
    let mut stored = read_json(&file);
    let per_threads = stored["rates"]
        .as_object_mut()
        .expect("rates by thread count");
    assert!(!per_threads.is_empty(), "{per_threads:?}");
    for r in per_threads.values_mut() {
        let g = r["gemm_flops_per_s"].as_f64().unwrap();
        r["gemm_flops_per_s"] = serde_json::json!(g * 1000.0);
    }
    std::fs::write(&file, serde_json::to_vec(&stored).unwrap()).unwrap();
    let (a, b) = (run("32"), run("64"));
    assert_eq!(
        a["machine_rates"], b["machine_rates"],
        "two runs after the first must both read the stored rates, not measure them"
    );
    let threads = a["machine_rates"]["threads"].to_string();
    let want = &stored["rates"][threads.as_str()]["gemm_flops_per_s"];
    assert_eq!(
        &a["machine_rates"]["gemm_flops_per_s"], want,
        "the run reports the GEMM rate the cache file holds (it measured instead of reading it)"
    );
    let gemm = a["machine_rates"]["gemm_flops_per_s"].as_f64().unwrap();
    let copy = a["machine_rates"]["copy_bytes_per_s"].as_f64().unwrap();
    for (ea, eb) in a["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(b["epochs"].as_array().unwrap())
    {
        let fa = ea["gemm_flops"].as_u64().unwrap();
        assert!(fa > 0);
        assert_eq!(eb["gemm_flops"].as_u64().unwrap(), 2 * fa);
        let floor = ea["compute_floor_s"].as_f64().unwrap();
        assert!(
            (floor - fa as f64 / gemm).abs() <= 1e-9 * floor.max(1e-9),
            "{ea}"
        );
        // The floor of the arithmetic done leaves out what zero-skipping products skipped.
        let skipped = ea["gemm_flops_skipped"].as_u64().unwrap();
        assert!(skipped <= fa, "{ea}");
        let done = ea["performed_floor_s"].as_f64().unwrap();
        assert!(
            (done - (fa - skipped) as f64 / gemm).abs() <= 1e-9 * done.max(1e-9),
            "{ea}"
        );
        let bytes = ea["extract"]["bytes_from_host"].as_u64().unwrap();
        let mem = ea["memory_floor_s"].as_f64().unwrap();
        assert!(
            (mem - bytes as f64 / copy).abs() <= 1e-9 * mem.max(1e-9),
            "{ea}"
        );
        assert_eq!(
            ea["extract"]["bytes_from_host"],
            eb["extract"]["bytes_from_host"]
        );
    }
}

#[test]
fn outputs_are_checked_before_the_run_and_written_through_links() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let p = |n: &str| t.path().join(n);
    let ck = p("ck.st");
    ok(&small(&ds, &["--epochs", "1", "--save-model", s(&ck)]));
    let before = std::fs::read(&ck).unwrap();
    // Refused before training, naming the flags; nothing the user had is touched.
    fails(
        &small(&ds, &["--resume", s(&ck), "--metrics-out", s(&ck)]),
        1,
        &["--metrics-out", "would write over --resume"],
    );
    let cfg = p("run.json");
    std::fs::write(&cfg, "{\"epochs\": 1}").unwrap();
    fails(
        &small(&ds, &["--config", s(&cfg), "--save-model", s(&cfg)]),
        1,
        &["--save-model", "would write over --config"],
    );
    let m = p("m.json");
    fails(
        &small(&ds, &["--metrics-out", s(&m), "--save-model", s(&m)]),
        1,
        &["is also --metrics-out"],
    );
    fails(
        &small(&ds, &["--metrics-out", s(&p("nowhere/m.json"))]),
        1,
        &["the folder", "does not exist"],
    );
    fails(
        &small(&ds, &["--save-model", s(t.path())]),
        1,
        &["is a folder"],
    );
    assert_eq!(std::fs::read(&ck).unwrap(), before);
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), "{\"epochs\": 1}");
    assert!(!m.exists());
    // A checkpoint resumed and updated in place is allowed (README: --resume M --save-model M).
    ok(&small(
        &ds,
        &["--epochs", "2", "--resume", s(&ck), "--save-model", s(&ck)],
    ));
    assert_ne!(std::fs::read(&ck).unwrap(), before);
    #[cfg(unix)]
    {
        // A link is written through: its target gets the metrics, the link stays a link;
        // an existing target is replaced and keeps its permissions.
        use std::os::unix::fs::PermissionsExt;
        let target = p("real.json");
        let link = p("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        ok(&small(&ds, &["--epochs", "1", "--metrics-out", s(&link)]));
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert!(read_json(&target)["epochs"].is_array());
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        ok(&small(&ds, &["--epochs", "2", "--metrics-out", s(&link)]));
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(read_json(&target)["epochs"].as_array().unwrap().len(), 2);
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A link to a file in a folder that does not exist is refused before the run.
        let dangling = p("dangling.json");
        std::os::unix::fs::symlink("nothere/x.json", &dangling).unwrap();
        fails(
            &small(&ds, &["--metrics-out", s(&dangling)]),
            1,
            &["the folder", "nothere", "does not exist"],
        );
        // /dev/stdout redirected to a file gets the metrics after what was already written,
        // through the open handle, not a new file over it.
        let captured = p("captured.txt");
        std::fs::write(&captured, "KEEP ME\n").unwrap();
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(&captured)
            .unwrap();
        let st = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(small(
                &ds,
                &["--epochs", "1", "--metrics-out", "/dev/stdout"],
            ))
            .stdout(out)
            .status()
            .unwrap();
        assert!(st.success());
        let text = std::fs::read_to_string(&captured).unwrap();
        assert!(text.starts_with("KEEP ME\n"), "{text}");
        assert!(
            text.contains("test accuracy") && text.contains("\"epochs\""),
            "{text}"
        );
        // A destination that is not a regular file (here /dev/null, behind a link) is
        // written in place, not replaced by a file.
        let null = p("null.json");
        std::os::unix::fs::symlink("/dev/null", &null).unwrap();
        ok(&small(&ds, &["--epochs", "1", "--metrics-out", s(&null)]));
        assert!(std::fs::symlink_metadata(&null).unwrap().is_symlink());
        // No temporary file is left behind in the folder.
        let left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
