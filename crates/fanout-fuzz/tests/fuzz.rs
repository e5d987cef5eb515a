//! What `.ci/run` fuzzes: every committed input (seeds and regressions) replayed, then a bounded
//! pass over every target (`FANOUT_FUZZ_SECONDS` per target, default 12; 6 targets, so at most
//! a minute and a quarter, inside the two-minute budget). Any crash fails the test with its message.

use fanout_fuzz::{committed_inputs, fuzz, seeds, targets, Bundle, Outcome, Target};
use std::time::Duration;

#[test]
fn committed_seeds_match_the_generators() {
    // The corpus is what `fanout-fuzz seed` writes; a format change regenerates it.
    for t in Target::ALL {
        let committed: Vec<Bundle> = committed_inputs(t)
            .unwrap()
            .into_iter()
            .filter(|(p, _)| p.to_string_lossy().contains("/corpus/"))
            .map(|(_, b)| b)
            .collect();
        assert!(!committed.is_empty(), "{}: no committed seeds", t.name());
        for (name, b) in seeds::seeds(t).unwrap() {
            // Checkpoints and generated datasets are deterministic; compare file names and
            // sizes (a stored float may differ in its last bits across CPUs).
            let shape = |b: &Bundle| -> Vec<(String, usize)> {
                b.files.iter().map(|(n, d)| (n.clone(), d.len())).collect()
            };
            assert!(
                committed.iter().any(|c| shape(c) == shape(&b)),
                "{}: seed {name} is not in corpus/ (run `cargo run -p fanout-fuzz -- seed`)",
                t.name()
            );
        }
    }
}

#[test]
fn committed_inputs_replay_without_a_crash_and_seeds_are_accepted() {
    targets::with_quiet_panics(|| {
        for t in Target::ALL {
            for (path, b) in committed_inputs(t).unwrap() {
                let out = targets::run(t, &b);
                assert!(
                    !matches!(out, Outcome::Crash(_)),
                    "{}: {out:?}",
                    path.display()
                );
                // Seeds are sound inputs: they must be accepted, so that mutants start from
                // the accepting path.
                if path.to_string_lossy().contains("/corpus/") {
                    assert_eq!(out, Outcome::Ok, "{}", path.display());
                }
            }
        }
    });
}

#[test]
fn a_bounded_pass_over_every_target_finds_no_crash() {
    let secs: u64 = std::env::var("FANOUT_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let mut report = Vec::new();
    for t in Target::ALL {
        let seeds: Vec<Bundle> = committed_inputs(t)
            .unwrap()
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        let mut crashes = Vec::new();
        let s = fuzz(t, &seeds, Duration::from_secs(secs), 0xf022, |c| {
            crashes.push(c.message.clone());
        });
        assert!(crashes.is_empty(), "{}: {crashes:?}", t.name());
        // The mutants must reach both outcomes, or the pass tests nothing.
        assert!(s.ok > 0 && s.errors > 0, "{}: {s:?}", t.name());
        report.push(format!(
            "{} {} runs ({} ok, {} errors)",
            t.name(),
            s.runs,
            s.ok,
            s.errors
        ));
    }
    eprintln!("{}", report.join("; "));
}
