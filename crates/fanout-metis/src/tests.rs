use super::*;
use fanout_graph::build::{build_topology, BuildOptions, SliceArcs};
use fanout_graph::{Meta, NoProgress};
use fanout_synth::{generate, GenOptions, Preset};

/// Two 6-cliques joined by one arc pair, with a training set.
fn two_cliques(dir: &Path) -> Dataset {
    let mut arcs = Vec::new();
    for base in [0u64, 6] {
        for a in 0..6 {
            for b in 0..6 {
                if a != b {
                    arcs.push((base + a, base + b));
                }
            }
        }
    }
    arcs.extend([(5, 6), (6, 5)]);
    let mut w = DatasetWriter::create(&dir.join("cliques"), false).unwrap();
    let opts = BuildOptions {
        num_nodes: Some(12),
        ..BuildOptions::default()
    };
    let st = build_topology(&mut SliceArcs(&arcs), &opts, &mut w, &NoProgress).unwrap();
    w.write_array::<u32>(fanout_graph::files::TRAIN, &[0, 7, 8])
        .unwrap();
    let meta = Meta {
        num_node: 12,
        num_edge: st.num_arcs,
        num_train_set: 3,
        ..Meta::default()
    };
    w.finish(meta, &NoProgress).unwrap()
}

#[test]
fn contiguous_ids_keep_the_order_inside_each_part() {
    let (ids, offsets) = contiguous_ids(&[1, 0, 1, 2, 0], 3);
    assert_eq!(ids, [2, 0, 3, 4, 1]);
    assert_eq!(offsets, [0, 2, 4, 5]);
    let (ids, offsets) = contiguous_ids(&[0, 0], 3);
    assert_eq!((ids, offsets), (vec![0, 1], vec![0, 2, 2, 2]));
}

#[test]
fn metis_cuts_two_cliques_at_their_bridge_and_is_deterministic() {
    let t = tempfile::tempdir().unwrap();
    let ds = two_cliques(t.path());
    let part = metis_parts(&ds, 2, 1).unwrap();
    assert!(part[..6].iter().all(|&p| p == part[0]), "{part:?}");
    assert!(part[6..].iter().all(|&p| p == part[6]), "{part:?}");
    assert_ne!(part[0], part[6]);
    assert_eq!(metis_parts(&ds, 2, 1).unwrap(), part);
    let (_, offsets) = contiguous_ids(&part, 2);
    let s = summary(&ds, &part, &offsets);
    assert_eq!(s.vertices, [6, 6]);
    assert_eq!(s.cut_fraction, 2.0 / 62.0);
    assert_eq!(s.imbalance, 1.0);
    let mut train = s.train.clone();
    train.sort();
    assert_eq!(train, [1, 2]);
    assert_eq!(metis_parts(&ds, 1, 0).unwrap(), vec![0; 12]);
    for (k, want) in [(0, "at least 1"), (13, "more than the 12 vertices")] {
        let e = metis_parts(&ds, k, 0).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn a_partitioned_dataset_has_contiguous_parts_and_cuts_far_fewer_arcs_than_a_random_split() {
    let t = tempfile::tempdir().unwrap();
    let cfg = Preset::Tiny.config(Some(2000));
    let (ds, _) = generate(&cfg, &GenOptions::default(), None, &NoProgress).unwrap();
    let out = t.path().join("parted");
    let s = partition_dataset(&ds, 4, 0, &out, false, &NoProgress, &Cancel::default()).unwrap();
    assert_eq!(s.vertices.iter().sum::<u64>(), 2000);
    assert!(s.imbalance <= 1.05, "{s:?}");
    assert_eq!(s.train.iter().sum::<u64>(), ds.train.len() as u64);
    // A random balanced split cuts about 3/4 of the arcs; METIS on planted communities far fewer.
    let random: Vec<u32> = (0..2000u32)
        .map(|v| v.wrapping_mul(2654435761) % 4)
        .collect();
    let (_, ro) = contiguous_ids(&random, 4);
    let r = summary(&ds, &random, &ro);
    assert!(
        s.cut_fraction < 0.5 * r.cut_fraction,
        "metis {s:?} random {r:?}"
    );
    // The written dataset: sound, the same size, the parts' boundaries and the id map beside it.
    let p = Dataset::open(&out).unwrap();
    fanout_graph::verify(&out, &NoProgress).unwrap();
    assert_eq!(p.meta.num_edge, ds.meta.num_edge);
    let bytes = std::fs::read(out.join(PART_OFFSETS)).unwrap();
    let offsets: Vec<u64> = bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(offsets.len(), 5);
    assert_eq!(
        offsets.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>(),
        s.vertices
    );
    // Cut arcs counted on the relabelled graph with parts as id ranges: the same fraction.
    let owner = |v: u64| offsets.partition_point(|&o| o <= v) - 1;
    let cut = (0..2000u64)
        .map(|v| {
            p.topology
                .row(v)
                .iter()
                .filter(|&u| owner(u) != owner(v))
                .count()
        })
        .sum::<usize>();
    assert_eq!(cut as f64 / p.meta.num_edge as f64, s.cut_fraction);
}
