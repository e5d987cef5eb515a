//! End-to-end tests of `fanout cache-sim` on the tiny generator preset: one JSON line per
//! (policy, ratio) with the documented keys, the oracle bounding every policy, the table with
//! Match-Reorder and similarity sections, and bad flags failing with a message.

mod common;

use common::{fanout, tiny};
use serde_json::Value;

#[test]
fn json_lines_per_policy_and_ratio() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    let o = fanout(&[
        "cache-sim",
        "--dataset",
        &ds,
        "--fanouts",
        "5,3",
        "--batch-size",
        "64",
        "--ratios",
        "0.05,0.2",
        "--match-reorder",
        "--similarity",
        "--threads",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(rows.len(), 5 * 2);
    for r in &rows {
        for k in [
            "policy",
            "ratio",
            "hit_rate",
            "bytes_per_epoch",
            "share_of_optimal",
        ] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
        let h = r["hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&h));
        assert!(h <= r["optimal_hit_rate"].as_f64().unwrap() + 1e-12);
        assert!(r["mr_saved_bytes_per_epoch"].as_f64().is_some());
        assert!(r["similarity"]["footprint_similarity"].as_f64().is_some());
    }
    let table = fanout(&[
        "cache-sim",
        "--dataset",
        &ds,
        "--fanouts",
        "5,3",
        "--batch-size",
        "64",
        "--ratios",
        "0.1",
        "--match-reorder",
        "--similarity",
    ]);
    let s = String::from_utf8(table.stdout).unwrap();
    assert!(
        s.contains("| presc1 | 0.1 |") && s.contains("MR saved"),
        "{s}"
    );
    assert!(
        s.contains("footprint similarity") && s.contains("avg M_ij"),
        "{s}"
    );
}

#[test]
fn bad_flags_fail_with_a_message() {
    let t = tempfile::tempdir().unwrap();
    let ds = tiny(t.path());
    for (flag, value, want) in [
        ("--policies", "lru", "unknown cache policy"),
        ("--ratios", "1.5", "not within [0, 1]"),
    ] {
        let o = fanout(&["cache-sim", "--dataset", &ds, flag, value]);
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(want), "{flag} {value}: {e}");
    }
}
