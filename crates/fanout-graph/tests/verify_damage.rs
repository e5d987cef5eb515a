//! `verify` catches each kind of damage and names the file and the first bad entry; a sound
//! dataset (including a GNNLab-style one without fanout's keys) passes.

use fanout_graph::{
    build_topology, files, verify, BuildOptions, Dataset, DatasetWriter, Meta, NoProgress,
    SliceArcs,
};
use fanout_rand::Rng;
use std::path::{Path, PathBuf};

const N: u64 = 200;

/// Writes a small sound dataset (features, labels, splits, checksums) into `dir/ds`.
fn make(dir: &Path) -> PathBuf {
    let out = dir.join("ds");
    let mut r = Rng::new(1);
    let arcs: Vec<(u64, u64)> = (0..2000).map(|_| (r.below(N), r.below(N))).collect();
    let mut w = DatasetWriter::create(&out, false).unwrap();
    let opts = BuildOptions {
        dedup: true,
        num_nodes: Some(N),
        ..Default::default()
    };
    let st = build_topology(&mut SliceArcs(&arcs), &opts, &mut w, &NoProgress).unwrap();
    let feat: Vec<f32> = (0..N * 4).map(|i| i as f32 * 0.5).collect();
    w.write_array(files::FEAT, &feat).unwrap();
    let labels: Vec<i64> = (0..N as i64).map(|v| v % 3).collect();
    w.write_array(files::LABEL, &labels).unwrap();
    w.write_array::<u32>(files::TRAIN, &[0, 1, 2, 3]).unwrap();
    w.write_array::<u32>(files::VALID, &[10, 11]).unwrap();
    w.write_array::<u32>(files::TEST, &[20, 21, 22]).unwrap();
    let meta = Meta {
        num_node: N,
        num_edge: st.num_arcs,
        feat_dim: 4,
        num_class: 3,
        num_train_set: 4,
        num_valid_set: 2,
        num_test_set: 3,
        ..Meta::default()
    };
    w.finish(meta, &NoProgress).unwrap();
    out
}

fn read_u32(p: &Path) -> Vec<u32> {
    std::fs::read(p)
        .unwrap()
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn write_u32(p: &Path, v: &[u32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(p, bytes).unwrap();
}

/// Removes `file`'s checksum from meta.txt, so that the content checks behind it are reached.
fn drop_checksum(ds: &Path, file: &str) {
    let key = format!("CHECKSUM_{}", file.trim_end_matches(".bin").to_uppercase());
    let meta = std::fs::read_to_string(ds.join(files::META)).unwrap();
    let kept: String = meta
        .lines()
        .filter(|l| !l.starts_with(&key))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(ds.join(files::META), kept).unwrap();
}

fn expect_err(ds: &Path, file: &str, needles: &[&str]) {
    let e = verify(ds, &NoProgress)
        .expect_err("damage not detected")
        .to_string();
    assert!(e.contains(file), "error does not name {file}: {e}");
    for n in needles {
        assert!(e.contains(n), "error lacks {n:?}: {e}");
    }
}

#[test]
fn sound_dataset_verifies_with_all_checksums() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let r = verify(&ds, &NoProgress).unwrap();
    assert_eq!(r.checksums_verified.len(), 7, "{r:?}");
    assert!(r.checksums_missing.is_empty());
    // No temporary directory is left beside the output.
    let leftovers: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1);
}

#[test]
fn gnnlab_style_meta_without_our_keys_is_accepted() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let meta = std::fs::read_to_string(ds.join(files::META)).unwrap();
    let seven: String = meta
        .lines()
        .filter(|l| l.starts_with("NUM_") || l.starts_with("FEAT_DIM"))
        .map(|l| format!("{}\n", l.replace('\t', " ")))
        .collect();
    std::fs::write(ds.join(files::META), seven).unwrap();
    let r = verify(&ds, &NoProgress).unwrap();
    assert!(r.checksums_verified.is_empty());
    assert_eq!(r.checksums_missing.len(), 7);
    let d = Dataset::open(&ds).unwrap();
    assert_eq!(d.num_nodes(), N);
}

#[test]
fn truncated_file_is_reported_against_meta() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let p = ds.join(files::INDICES);
    let mut v = read_u32(&p);
    v.pop();
    write_u32(&p, &v);
    expect_err(&ds, "indices.bin", &["expected", "NUM_EDGE", "truncated"]);
}

#[test]
fn flipped_byte_fails_the_checksum() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let p = ds.join(files::FEAT);
    let mut b = std::fs::read(&p).unwrap();
    b[17] ^= 0x40;
    std::fs::write(&p, b).unwrap();
    expect_err(&ds, "feat.bin", &["checksum mismatch"]);
}

#[test]
fn out_of_range_neighbour_names_entry_and_vertex() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let p = ds.join(files::INDICES);
    let mut v = read_u32(&p);
    v[37] = N as u32 + 5;
    write_u32(&p, &v);
    drop_checksum(&ds, files::INDICES);
    let owner = {
        let ip = read_u32(&ds.join(files::INDPTR));
        ip.partition_point(|&x| x <= 37) - 1
    };
    expect_err(
        &ds,
        "indices.bin",
        &[
            "entry 37 = 205",
            &format!("vertex {owner}"),
            "expected a vertex id < NUM_NODE = 200",
        ],
    );
}

#[test]
fn decreasing_offsets_are_reported() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let p = ds.join(files::INDPTR);
    let mut v = read_u32(&p);
    v[50] = v[49].saturating_sub(1).min(v[51]);
    v[49] = v[50] + 1;
    write_u32(&p, &v);
    drop_checksum(&ds, files::INDPTR);
    expect_err(&ds, "indptr.bin", &["must not decrease"]);
}

#[test]
fn last_offset_must_equal_num_edge() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let p = ds.join(files::INDPTR);
    let mut v = read_u32(&p);
    let last = v.len() - 1;
    v[last] -= 1;
    assert!(
        v[last] >= v[last - 1],
        "test graph needs arcs into the last vertex"
    );
    write_u32(&p, &v);
    drop_checksum(&ds, files::INDPTR);
    expect_err(&ds, "indptr.bin", &["last entry", "expected NUM_EDGE"]);
}

#[test]
fn label_out_of_range_is_reported() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let p = ds.join(files::LABEL);
    let mut b = std::fs::read(&p).unwrap();
    b[8 * 9..8 * 10].copy_from_slice(&7i64.to_le_bytes());
    std::fs::write(&p, b).unwrap();
    drop_checksum(&ds, files::LABEL);
    expect_err(
        &ds,
        "label.bin",
        &["entry 9 (vertex 9) = 7", "NUM_CLASS = 3"],
    );
}

#[test]
fn nan_feature_is_reported() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let p = ds.join(files::FEAT);
    let mut b = std::fs::read(&p).unwrap();
    let at = (5 * 4 + 2) * 4;
    b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&p, b).unwrap();
    drop_checksum(&ds, files::FEAT);
    expect_err(&ds, "feat.bin", &["vertex 5, feature 2", "NaN"]);
}

#[test]
fn split_out_of_range_and_duplicates_are_reported() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    write_u32(&ds.join(files::TRAIN), &[0, 1, 999, 3]);
    drop_checksum(&ds, files::TRAIN);
    expect_err(&ds, "train_set.bin", &["entry 2 = 999", "NUM_NODE = 200"]);
    write_u32(&ds.join(files::TRAIN), &[0, 1, 2, 1]);
    expect_err(
        &ds,
        "train_set.bin",
        &["vertex 1 appears twice (entries 1 and 3)"],
    );
    // Opening refuses it too, with the same message: a repeat otherwise surfaces only when
    // both copies meet in one mini-batch.
    let Err(e) = Dataset::open(&ds) else {
        panic!("repeat not refused on open")
    };
    let e = e.to_string();
    assert!(e.contains("train_set.bin"), "{e}");
    assert!(
        e.contains("vertex 1 appears twice (entries 1 and 3)"),
        "{e}"
    );
    write_u32(&ds.join(files::TRAIN), &[7, 3, 7, 3]);
    let Err(e) = Dataset::open(&ds) else {
        panic!("repeat not refused on open")
    };
    let e = e.to_string();
    assert!(
        e.contains("vertex 7 appears twice (entries 0 and 2)"),
        "{e}"
    );
    write_u32(&ds.join(files::TRAIN), &[199, 0, 63, 64]);
    Dataset::open(&ds).expect("distinct ids across bit words are accepted");
}

#[test]
fn missing_checksummed_file_and_unknown_key_are_reported() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    std::fs::remove_file(ds.join(files::LABEL)).unwrap();
    expect_err(&ds, "label.bin", &["missing"]);
    let ds2 = make(&t.path().join("b"));
    let mut meta = std::fs::read_to_string(ds2.join(files::META)).unwrap();
    meta.push_str("NUM_EDGES\t3\n");
    std::fs::write(ds2.join(files::META), meta).unwrap();
    expect_err(&ds2, "meta.txt", &["unknown key \"NUM_EDGES\""]);
}

#[test]
fn failed_write_leaves_no_trace_and_existing_output_is_kept() {
    let t = tempfile::tempdir().unwrap();
    let ds = make(t.path());
    let before = std::fs::read(ds.join(files::META)).unwrap();
    // Refused without --overwrite.
    let e = DatasetWriter::create(&ds, false).err().unwrap().to_string();
    assert!(e.contains("already exists"), "{e}");
    // A writer dropped before finish removes its temporary directory and leaves `ds` intact.
    {
        let mut w = DatasetWriter::create(&ds, true).unwrap();
        w.write_array::<u32>(files::INDPTR, &[0]).unwrap();
    }
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
    assert_eq!(std::fs::read(ds.join(files::META)).unwrap(), before);
    // A folder that is not a dataset is never replaced, even with overwrite.
    let other = t.path().join("photos");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("a.jpg"), b"x").unwrap();
    let e = DatasetWriter::create(&other, true)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a fanout dataset"), "{e}");
}
