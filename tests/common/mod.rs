//! Helpers shared by the end-to-end tests: run the `fanout` binary and check how it ended.
#![allow(dead_code)] // each test binary uses its own subset

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A dataset folder under `../shared/datasets` (the tests need `../shared` beside the repo).
pub fn shared(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/datasets")
        .join(name);
    assert!(
        p.is_dir(),
        "{} is missing: the tests need ../shared beside the repository",
        p.display()
    );
    p
}

/// Runs `fanout --quiet ARGS...`.
pub fn fanout(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("--quiet")
        .args(args)
        .output()
        .expect("run fanout")
}

/// Runs fanout, asserts success and returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = fanout(args);
    assert!(
        o.status.success(),
        "fanout {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs fanout, asserts success and parses stdout as one JSON value.
pub fn ok_json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).expect("stdout is one JSON object")
}

/// Asserts that fanout exits with `code`, without a panic, and that stderr contains every
/// needle.
pub fn fails(args: &[&str], code: i32, needles: &[&str]) {
    let o = fanout(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "fanout {args:?}: {err}");
    assert!(!err.contains("panicked"), "fanout {args:?} panicked: {err}");
    for n in needles {
        assert!(
            err.contains(n),
            "stderr of fanout {args:?} lacks {n:?}: {err}"
        );
    }
}

/// A path as &str (test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Generates the `tiny` preset into `dir/tiny` and returns its path.
pub fn tiny(dir: &Path) -> String {
    let out = dir.join("tiny");
    ok(&["dataset", "gen", "--preset", "tiny", s(&out)]);
    s(&out).to_string()
}
