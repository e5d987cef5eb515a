//! Damaged datasets: every field of every file of an imported cora, damaged one at a time, is one
//! clear line on stderr (naming the file and what was expected) and exit code 1 under every
//! command that reads a dataset, never a panic or a backtrace; and the damaged copy is left as
//! it was (nothing the user had is rewritten).

mod common;

use common::{fanout, ok, s, shared};
use std::path::{Path, PathBuf};

/// Imports cora into `dir/cora` and trains a one-epoch model on it (saved to `dir/model`).
fn sound(dir: &Path) -> (PathBuf, PathBuf) {
    let out = dir.join("cora");
    ok(&[
        "dataset",
        "import",
        "--format",
        "npy",
        s(&shared("cora")),
        s(&out),
    ]);
    let model = dir.join("model.safetensors");
    ok(&[
        "train",
        "--dataset",
        s(&out),
        "--epochs",
        "1",
        "--hidden",
        "16",
        "--save-model",
        s(&model),
    ]);
    (out, model)
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn write(p: &Path, b: &[u8]) {
    std::fs::write(p, b).unwrap();
}

/// Replaces the 4-byte (or 8-byte) little-endian entry `i` of `file` by `v`.
fn set_u32(ds: &Path, file: &str, i: usize, v: u32) {
    let p = ds.join(file);
    let mut b = read(&p);
    b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    write(&p, &b);
}

fn set_i64(ds: &Path, file: &str, i: usize, v: i64) {
    let p = ds.join(file);
    let mut b = read(&p);
    b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
    write(&p, &b);
}

fn truncate(ds: &Path, file: &str, by: usize) {
    let p = ds.join(file);
    let mut b = read(&p);
    b.truncate(b.len() - by);
    write(&p, &b);
}

/// Rewrites meta.txt with `from` replaced by `to` (which must change it).
fn meta(ds: &Path, from: &str, to: &str) {
    let p = ds.join("meta.txt");
    let text = String::from_utf8(read(&p)).unwrap();
    assert!(text.contains(from), "meta.txt lacks {from:?}");
    write(&p, text.replacen(from, to, 1).as_bytes());
}

type Damage = (&'static str, fn(&Path), &'static [&'static str]);

/// Each damage: what it is, how to make it, and what every command's error must say.
const DAMAGES: &[Damage] = &[
    // meta.txt, field by field.
    (
        "NUM_NODE = 2^64-1",
        |d| meta(d, "NUM_NODE\t2708", "NUM_NODE\t18446744073709551615"),
        &["meta.txt", "NUM_NODE = 18446744073709551615 is too large"],
    ),
    (
        "NUM_NODE off by one",
        |d| meta(d, "NUM_NODE\t2708", "NUM_NODE\t2709"),
        &["indptr.bin", "NUM_NODE + 1"],
    ),
    (
        "NUM_NODE not a number",
        |d| meta(d, "NUM_NODE\t2708", "NUM_NODE\t2.7e3"),
        &[
            "meta.txt",
            "line 1: NUM_NODE = \"2.7e3\", expected a non-negative integer",
        ],
    ),
    (
        "NUM_EDGE off by one",
        |d| meta(d, "NUM_EDGE\t10556", "NUM_EDGE\t10557"),
        &["indptr.bin", "expected NUM_EDGE = 10557"],
    ),
    (
        "NUM_EDGE negative",
        |d| meta(d, "NUM_EDGE\t10556", "NUM_EDGE\t-1"),
        &["meta.txt", "NUM_EDGE = \"-1\""],
    ),
    (
        "FEAT_DIM off by one",
        |d| meta(d, "FEAT_DIM\t1433", "FEAT_DIM\t1432"),
        &["feat.bin", "NUM_NODE x FEAT_DIM"],
    ),
    (
        "FEAT_DIM huge",
        |d| meta(d, "FEAT_DIM\t1433", "FEAT_DIM\t9223372036854775807"),
        &["meta.txt", "FEAT_DIM = 9223372036854775807 is too large"],
    ),
    (
        "NUM_CLASS below the labels",
        |d| meta(d, "NUM_CLASS\t7", "NUM_CLASS\t3"),
        &["label.bin", "(NUM_CLASS = 3)"],
    ),
    (
        "NUM_CLASS huge",
        |d| meta(d, "NUM_CLASS\t7", "NUM_CLASS\t4294967296"),
        &["meta.txt", "NUM_CLASS = 4294967296 is too large"],
    ),
    (
        "NUM_TRAIN_SET off by one",
        |d| meta(d, "NUM_TRAIN_SET\t140", "NUM_TRAIN_SET\t141"),
        &["train_set.bin", "NUM_TRAIN_SET"],
    ),
    (
        "NUM_VALID_SET beyond NUM_NODE",
        |d| meta(d, "NUM_VALID_SET\t500", "NUM_VALID_SET\t5000"),
        &["meta.txt", "NUM_VALID_SET = 5000 is too large"],
    ),
    (
        "NUM_TEST_SET missing",
        |d| meta(d, "NUM_TEST_SET\t1000\n", ""),
        &["meta.txt", "missing required key(s) NUM_TEST_SET"],
    ),
    (
        "LAYOUT unknown",
        |d| meta(d, "LAYOUT\tcsc", "LAYOUT\tcoo"),
        &["meta.txt", "LAYOUT"],
    ),
    (
        "FEAT_DTYPE unknown",
        |d| meta(d, "FEAT_DTYPE\tf32", "FEAT_DTYPE\tf64"),
        &["meta.txt", "FEAT_DTYPE"],
    ),
    (
        "checksum malformed",
        |d| meta(d, "CHECKSUM_FEAT\txxh3:", "CHECKSUM_FEAT\tmd5:"),
        &["meta.txt", "expected xxh3:"],
    ),
    (
        "key repeated",
        |d| meta(d, "NUM_EDGE\t10556\n", "NUM_EDGE\t10556\nNUM_EDGE\t10556\n"),
        &["meta.txt", "repeats line 2"],
    ),
    (
        "unknown key",
        |d| {
            meta(
                d,
                "NUM_EDGE\t10556\n",
                "NUM_EDGE\t10556\nNUM_EDGES\t10556\n",
            )
        },
        &["meta.txt", "unknown key \"NUM_EDGES\""],
    ),
    (
        "meta.txt not UTF-8",
        |d| write(&d.join("meta.txt"), b"NUM_NODE\t\xff\xfe\n"),
        &["meta.txt", "not UTF-8"],
    ),
    (
        "meta.txt missing",
        |d| std::fs::remove_file(d.join("meta.txt")).unwrap(),
        &["meta.txt"],
    ),
    // indptr.bin.
    (
        "indptr decreasing",
        |d| set_u32(d, "indptr.bin", 11, 40_000),
        &["indptr.bin", "must not decrease"],
    ),
    (
        "indptr not starting at 0",
        |d| set_u32(d, "indptr.bin", 0, 3),
        &["indptr.bin", "entry 0 is 3, expected 0"],
    ),
    (
        "indptr ending short",
        |d| set_u32(d, "indptr.bin", 2708, 10_555),
        &["indptr.bin", "expected NUM_EDGE = 10556"],
    ),
    (
        "indptr truncated",
        |d| truncate(d, "indptr.bin", 4),
        &["indptr.bin", "truncated or does not match meta.txt"],
    ),
    (
        "indptr missing",
        |d| std::fs::remove_file(d.join("indptr.bin")).unwrap(),
        &["indptr.bin"],
    ),
    // indices.bin.
    (
        "neighbour id = NUM_NODE",
        |d| set_u32(d, "indices.bin", 100, 2708),
        &[
            "indices.bin",
            "entry 100 = 2708",
            "expected a vertex id < NUM_NODE = 2708",
        ],
    ),
    (
        "neighbour id = 2^32-1",
        |d| set_u32(d, "indices.bin", 10_555, u32::MAX),
        &["indices.bin", "entry 10555 = 4294967295", "out of range"],
    ),
    (
        "indices half an entry short",
        |d| truncate(d, "indices.bin", 2),
        &["indices.bin", "not a whole number of u32"],
    ),
    // feat.bin.
    (
        "features truncated",
        |d| truncate(d, "feat.bin", 4 * 1433),
        &["feat.bin", "NUM_NODE x FEAT_DIM"],
    ),
    // label.bin.
    (
        "label = NUM_CLASS",
        |d| set_i64(d, "label.bin", 5, 7),
        &["label.bin", "entry 5 (vertex 5) = 7", "0..=6"],
    ),
    (
        "label below -1",
        |d| set_i64(d, "label.bin", 9, -2),
        &["label.bin", "entry 9 (vertex 9) = -2"],
    ),
    (
        "labels truncated",
        |d| truncate(d, "label.bin", 8),
        &["label.bin", "NUM_NODE"],
    ),
    // Splits.
    (
        "training id = NUM_NODE",
        |d| set_u32(d, "train_set.bin", 3, 2708),
        &["train_set.bin", "entry 3 = 2708 is out of range"],
    ),
    (
        "validation id huge",
        |d| set_u32(d, "valid_set.bin", 0, u32::MAX),
        &["valid_set.bin", "entry 0 = 4294967295 is out of range"],
    ),
    (
        "test set truncated",
        |d| truncate(d, "test_set.bin", 4),
        &["test_set.bin", "NUM_TEST_SET"],
    ),
];

/// Copies the files of `from` into a new folder `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The file names and contents of a folder, sorted.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                read(&e.path()),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_damaged_field_is_one_line_under_every_command() {
    let t = tempfile::tempdir().unwrap();
    let (good, model) = sound(t.path());
    for (i, (what, damage, needles)) in DAMAGES.iter().enumerate() {
        let d = t.path().join(format!("damage{i}"));
        copy_dir(&good, &d);
        damage(&d);
        let before = snapshot(&d);
        let ds = s(&d);
        for args in [
            vec!["train", "--dataset", ds, "--epochs", "1", "--hidden", "16"],
            vec!["eval", "--model", s(&model), "--dataset", ds],
            vec!["sample-bench", "--dataset", ds, "--batches", "2"],
            vec!["cache-sim", "--dataset", ds, "--epochs", "1"],
            vec!["dataset", "info", ds],
        ] {
            let o = fanout(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            let ctx = format!("{what}: fanout {}: stderr {err:?}", args.join(" "));
            assert_eq!(o.status.code(), Some(1), "{ctx}");
            assert!(
                !err.contains("panicked") && !err.contains("backtrace"),
                "{ctx}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "not one line: {ctx}");
            for n in *needles {
                assert!(err.contains(n), "lacks {n:?}: {ctx}");
            }
        }
        assert!(
            snapshot(&d) == before,
            "{what}: a command changed the damaged dataset"
        );
    }
}

#[test]
fn a_damaged_scan_is_not_remembered_and_a_repaired_one_is() {
    // The O(NUM_EDGE) id scan is remembered only after it passes, and only for the files it saw.
    let t = tempfile::tempdir().unwrap();
    let (good, _) = sound(t.path());
    // Files written in the last two seconds are never remembered (racy mtimes).
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["dataset", "info", s(&good), "--json"])).unwrap();
    let first = v["id_check"]["how"].as_str().unwrap().to_string();
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["dataset", "info", s(&good), "--json"])).unwrap();
    assert_eq!(v["id_check"]["how"], "remembered", "first open: {first}");
    assert!(good.join(".fanout-checked").is_file());
    let sound_ids = read(&good.join("indices.bin"));
    set_u32(&good, "indices.bin", 7, 9999);
    let o = fanout(&["sample-bench", "--dataset", s(&good), "--batches", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("entry 7 = 9999"));
    write(&good.join("indices.bin"), &sound_ids);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["dataset", "info", s(&good), "--json"])).unwrap();
    assert_eq!(v["id_check"]["how"], "scanned");
}

#[test]
fn a_training_set_without_a_label_is_refused_and_one_label_is_enough() {
    let t = tempfile::tempdir().unwrap();
    let (ds, _) = sound(t.path());
    let train: Vec<usize> = read(&ds.join("train_set.bin"))
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect();
    for &v in &train {
        set_i64(&ds, "label.bin", v, -1);
    }
    let args = [
        "train",
        "--dataset",
        s(&ds),
        "--epochs",
        "1",
        "--hidden",
        "16",
    ];
    let o = fanout(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let want = format!(
        "none of the {} training vertices has a label (all are -1 in label.bin)",
        train.len()
    );
    assert!(err.contains(&want) && !err.contains("panicked"), "{err}");
    set_i64(&ds, "label.bin", train[train.len() / 2], 3);
    ok(&args);
}
