//! Ctrl-C (SIGINT) and SIGTERM during `train`, `dataset gen` and `dataset import`: the run
//! stops at a safe point, says so in one line, exits with 128 + the signal, and leaves no
//! half-written output (an existing destination is untouched).
#![cfg(unix)]

mod common;

use common::{ok, s, tiny};
use std::io::Read;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Starts `fanout --quiet ARGS...` with its output captured.
fn start(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("--quiet")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fanout")
}

/// Waits (at most a minute) until `ready` holds, failing if the child ended first.
fn wait_for(child: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let t = Instant::now();
    while !ready() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("fanout ended ({st}) before {what}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How an interrupted child ended.
struct Ended {
    status: ExitStatus,
    stderr: Vec<u8>,
}

/// Sends `sig` ("INT", "TERM") to the child and waits (at most a minute: a child that does
/// not stop is killed and the test fails) for it to end.
fn signal(mut child: Child, sig: &str) -> Ended {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} failed");
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fanout did not stop within a minute of SIG{sig}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = Vec::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Ended { status, stderr }
}

/// Asserts the interrupted ending: exit `code`, one line naming the interruption, no panic.
fn assert_interrupted(o: &Ended, code: i32, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

/// Names in `dir` starting with `prefix` (temporary directories of writers).
fn leftovers(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

fn train_args<'a>(ds: &'a str, ck: &'a str, metrics: &'a str) -> Vec<&'a str> {
    vec![
        "train",
        "--dataset",
        ds,
        "--fanouts",
        "5,5",
        "--batch-size",
        "64",
        "--hidden",
        "32",
        "--epochs",
        "100000",
        "--threads",
        "1",
        "--save-model",
        ck,
        "--metrics-out",
        metrics,
    ]
}

#[test]
fn train_stops_between_steps_on_sigint_and_sigterm_keeping_its_checkpoint() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    for (sig, code) in [("INT", 130), ("TERM", 143)] {
        let ck = t.path().join(format!("m-{sig}.st"));
        let metrics = t.path().join(format!("m-{sig}.json"));
        let mut child = start(&train_args(&ds, s(&ck), s(&metrics)));
        // After the first epoch's checkpoint, so the run is between steps of a later epoch.
        wait_for(&mut child, "the first checkpoint", || ck.exists());
        std::thread::sleep(Duration::from_millis(100));
        let o = signal(child, sig);
        assert_interrupted(
            &o,
            code,
            &[
                "interrupted at epoch",
                "the last good checkpoint is",
                s(&ck),
                "--resume",
            ],
        );
        assert!(leftovers(t.path(), &format!(".m-{sig}.")).is_empty());
        // The checkpoint is whole: a model for eval, and a run to resume.
        ok(&["eval", "--model", s(&ck), "--dataset", &ds]);
        let err = String::from_utf8_lossy(&o.stderr);
        let done: u64 = err
            .split("(after ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no epoch count in {err}"));
        // The figures of the epochs done are written, marked as a run that stopped, and
        // drawn by `fanout report`.
        assert!(
            err.contains("the figures of the") && err.contains(s(&metrics)),
            "{err}"
        );
        let j: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
        assert!(
            j["stopped"]
                .as_str()
                .unwrap()
                .contains("interrupted at epoch"),
            "{j}"
        );
        assert!(j["test_acc"].is_null());
        assert_eq!(j["epochs"].as_array().unwrap().len() as u64, done);
        let pic = t.path().join(format!("m-{sig}.svg"));
        ok(&["report", s(&metrics), "-o", s(&pic)]);
        assert!(std::fs::read_to_string(&pic)
            .unwrap()
            .contains("stopped after"));
        let more = (done + 1).to_string();
        let mut args = train_args(&ds, s(&ck), s(&metrics));
        args.extend(["--epochs", &more, "--resume", s(&ck)]);
        ok(&args);
    }
}

#[test]
fn dataset_gen_interrupted_leaves_the_existing_destination_untouched() {
    let t = tempfile::tempdir().unwrap();
    let out = Path::new(&tiny(t.path())).to_path_buf();
    let before = std::fs::read(out.join("meta.txt")).unwrap();
    let mut child = start(&[
        "dataset",
        "gen",
        "--preset",
        "products",
        "--nodes",
        "1000000",
        "--overwrite",
        s(&out),
    ]);
    wait_for(&mut child, "the temporary directory", || {
        !leftovers(t.path(), ".tiny.tmp-").is_empty()
    });
    std::thread::sleep(Duration::from_millis(200));
    let o = signal(child, "INT");
    assert_interrupted(&o, 130, &["interrupted", "nothing was written to", s(&out)]);
    assert_eq!(std::fs::read(out.join("meta.txt")).unwrap(), before);
    assert!(
        leftovers(t.path(), ".tiny.tmp-").is_empty(),
        "temporary left behind"
    );
    ok(&["dataset", "verify", s(&out)]);
}

#[test]
fn dataset_partition_stops_on_sigint_and_writes_no_partition() {
    let t = tempfile::tempdir().unwrap();
    let ds = t.path().join("products");
    ok(&[
        "dataset",
        "gen",
        "--preset",
        "products",
        "--nodes",
        "40000",
        s(&ds),
    ]);
    // Three hops of a products-like graph: seconds of work, checked for the signal often.
    let mut child = start(&[
        "dataset",
        "partition",
        "--parts",
        "8",
        "--hops",
        "3",
        s(&ds),
    ]);
    wait_for(&mut child, "a moment of partitioning", || {
        std::thread::sleep(Duration::from_millis(500));
        true
    });
    let t0 = Instant::now();
    let o = signal(child, "INT");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?} to stop",
        t0.elapsed()
    );
    assert_interrupted(
        &o,
        130,
        &["interrupted", "nothing was written to", "pagraph-8"],
    );
    assert!(!ds.join("partitions").join("pagraph-8").exists());
}

#[test]
fn dataset_import_interrupted_by_sigterm_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("edges.txt");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&src).unwrap());
        let mut x: u64 = 1;
        for _ in 0..8_000_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            writeln!(w, "{} {}", (x >> 33) % 1_000_000, (x >> 13) % 1_000_000).unwrap();
        }
    }
    let out = t.path().join("ds");
    let mut child = start(&[
        "dataset",
        "import",
        "--format",
        "edgelist",
        s(&src),
        s(&out),
    ]);
    wait_for(&mut child, "the temporary directory", || {
        !leftovers(t.path(), ".ds.tmp-").is_empty()
    });
    let o = signal(child, "TERM");
    assert_interrupted(&o, 143, &["interrupted", "nothing was written to"]);
    assert!(
        !out.exists(),
        "a partial dataset was left at the destination"
    );
    assert!(
        leftovers(t.path(), ".ds.tmp-").is_empty(),
        "temporary left behind"
    );
}
