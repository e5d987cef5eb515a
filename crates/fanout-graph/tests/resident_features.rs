//! `Dataset::make_features_resident` swaps memory-mapped features for a huge-page copy that
//! reads back the same rows, and leaves features already in memory alone.

use fanout_graph::{
    build_topology, BuildOptions, Dataset, DatasetWriter, FeatDtype, Meta, NoProgress, Progress,
    Residency, SliceArcs,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

mod common;

/// Records phases and the units reported in them.
#[derive(Default)]
struct Recorder {
    phases: Mutex<Vec<(String, u64, &'static str)>>,
    done: AtomicU64,
}

impl Progress for Recorder {
    fn phase(&self, name: &str, total: u64, unit: &'static str) {
        self.phases
            .lock()
            .unwrap()
            .push((name.to_string(), total, unit));
    }
    fn advance(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }
}

const N: u64 = 300;
const DIM: usize = 5;

fn write_dataset(out: &std::path::Path) {
    let feat: Vec<f32> = (0..N as usize * DIM).map(|i| (i as f32).sin()).collect();
    common::write_dataset(out, N, DIM, &feat, FeatDtype::F32);
}

#[test]
fn resident_features_gather_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    write_dataset(&out);
    let mut ds = Dataset::open(&out).unwrap();
    let ids: Vec<u32> = (0..N as u32).rev().step_by(3).chain([0, 0, 299]).collect();
    let mut before = Vec::new();
    ds.features.as_ref().unwrap().gather_into(&ids, &mut before);
    assert!(!ds.features.as_ref().unwrap().is_resident());

    // Mapped: never copied.
    assert!(!ds
        .make_features_resident(Residency::Mapped, &NoProgress)
        .unwrap());
    assert!(!ds.features.as_ref().unwrap().is_resident());
    // 6 KB of features fit in any machine's quarter of available memory; the copy reports
    // every byte in one phase.
    let rec = Recorder::default();
    assert!(ds.make_features_resident(Residency::Auto, &rec).unwrap());
    let bytes = N * DIM as u64 * 4;
    assert_eq!(
        *rec.phases.lock().unwrap(),
        vec![("copying features".to_string(), bytes, "bytes")]
    );
    assert_eq!(rec.done.load(Ordering::Relaxed), bytes);
    let f = ds.features.as_ref().unwrap();
    assert!(f.is_resident());
    assert_eq!(f.num_rows(), N as usize);
    let mut after = Vec::new();
    f.gather_into(&ids, &mut after);
    assert_eq!(before, after);
    // Already in memory: nothing more to copy, whatever the policy.
    assert!(!ds
        .make_features_resident(Residency::Resident, &NoProgress)
        .unwrap());

    // Resident copies whatever the size.
    let mut again = Dataset::open(&out).unwrap();
    assert!(again
        .make_features_resident(Residency::Resident, &NoProgress)
        .unwrap());
    let mut copied = Vec::new();
    again
        .features
        .as_ref()
        .unwrap()
        .gather_into(&ids, &mut copied);
    assert_eq!(before, copied);
}

#[test]
fn a_large_copy_is_reported_in_pieces_that_add_up() {
    // 40 MB: copied by several threads in 8 MiB pieces.
    let src: Vec<u32> = (0..10_000_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let rec = Recorder::default();
    let a = fanout_graph::Array::resident_from(&src, &rec).unwrap();
    assert!(a.is_resident());
    assert_eq!(&a[..], &src[..]);
    assert_eq!(rec.done.load(Ordering::Relaxed), 40_000_000);
}

#[test]
fn a_dataset_without_features_has_nothing_to_copy() {
    let mut w = DatasetWriter::temporary().unwrap();
    let arcs = [(0u64, 1u64), (1, 2)];
    let opts = BuildOptions {
        num_nodes: Some(3),
        ..Default::default()
    };
    let st = build_topology(&mut SliceArcs(&arcs), &opts, &mut w, &NoProgress).unwrap();
    let meta = Meta {
        num_node: 3,
        num_edge: st.num_arcs,
        ..Meta::default()
    };
    let mut ds = w.finish(meta, &NoProgress).unwrap();
    assert!(ds.features.is_none());
    assert!(!ds
        .make_features_resident(Residency::Resident, &NoProgress)
        .unwrap());
}
