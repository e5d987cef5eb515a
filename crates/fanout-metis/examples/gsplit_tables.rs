//! The shape of GSplit's Tables 2 and 5 on our data:
//!
//! `cargo run --release -p fanout-metis --example gsplit_tables -- DATASET PARTITIONED [FANOUTS] [BATCH] [SPLITS]`
//!
//! DATASET is any dataset; PARTITIONED the same graph written by `fanout dataset partition
//! --method metis --parts SPLITS DATASET PARTITIONED`. Defaults: fanouts 20,20,20, batch 4096,
//! 4 splits (the paper's settings). One epoch of shuffled training seeds in batches of BATCH:
//!
//! - Table 2 (on DATASET): the sampled edges of each batch against those of the same seeds
//!   sampled as SPLITS micro-batches of BATCH / SPLITS (data parallelism), summed over the
//!   epoch; "extra" is how many more edges the micro-batches compute.
//! - Table 5 (on PARTITIONED): each batch's edges given to the split that owns their
//!   destination; the share of edges whose source the same split owns (local edges) and the
//!   edge skew (most - fewest edges of a split) / mean, averaged over the epoch's batches.
//!
//! Prints one JSON object.
use fanout_graph::Dataset;
use fanout_sample::{
    epoch_batches, near_equal_part, parse_fanouts, split_stats, BatchKey, KHopConfig, KHopSampler,
    LoaderConfig, RangeOwners, RemapKind, Sampler,
};
use std::sync::Arc;

fn fail(why: &str) -> ! {
    eprintln!(
        "gsplit_tables: {why}\nusage: gsplit_tables DATASET PARTITIONED [FANOUTS] [BATCH] [SPLITS]"
    );
    std::process::exit(2);
}

fn sampler(ds: &Arc<Dataset>, fanouts: &[u32]) -> KHopSampler {
    let cfg = KHopConfig {
        fanouts: fanouts.to_vec(),
        replace: false,
        remap: RemapKind::Auto,
    };
    KHopSampler::new(ds.clone(), cfg).unwrap_or_else(|e| fail(&e.to_string()))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        fail("two datasets are needed");
    }
    let open = |p: &str| {
        Arc::new(Dataset::open(std::path::Path::new(p)).unwrap_or_else(|e| fail(&e.to_string())))
    };
    let (ds, parted) = (open(&args[0]), open(&args[1]));
    let fanouts =
        parse_fanouts(args.get(2).map_or("20,20,20", |s| s.as_str())).unwrap_or_else(|e| fail(&e));
    let num = |i: usize, d: usize| -> usize {
        args.get(i)
            .map_or(Ok(d), |s| s.parse())
            .unwrap_or_else(|_| fail("BATCH and SPLITS are positive integers"))
    };
    let (batch, splits) = (num(3, 4096), num(4, 4));
    let bytes = std::fs::read(args[1].clone() + "/" + fanout_metis::PART_OFFSETS)
        .unwrap_or_else(|e| fail(&format!("{}: {e}", fanout_metis::PART_OFFSETS)));
    if !bytes.len().is_multiple_of(8) {
        fail(&format!(
            "{}: {} bytes; expected a whole number of u64 offsets (8 bytes each)",
            fanout_metis::PART_OFFSETS,
            bytes.len()
        ));
    }
    let offsets = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let owners = RangeOwners::new(offsets).unwrap_or_else(|e| fail(&e));
    if owners.parts() != splits {
        fail(&format!(
            "PARTITIONED has {} parts, not {splits}",
            owners.parts()
        ));
    }
    let cfg = LoaderConfig {
        batch_size: batch,
        seed: 0,
        ..LoaderConfig::default()
    };

    // Table 2: one batch against its micro-batches, on the source dataset.
    let s = sampler(&ds, &fanouts);
    let (mut mini, mut micro) = (0u64, 0u64);
    for (step, seeds) in epoch_batches(&ds.train, &cfg, 0).iter().enumerate() {
        let key = |i: usize| BatchKey {
            seed: 0,
            epoch: 0,
            step: (step * (splits + 1) + i) as u64,
        };
        let mb = s
            .sample(seeds, key(0))
            .unwrap_or_else(|e| fail(&e.to_string()));
        mini += mb.num_edges() as u64;
        for i in 0..splits {
            let part = near_equal_part(seeds, i, splits);
            let m = s
                .sample(part, key(1 + i))
                .unwrap_or_else(|e| fail(&e.to_string()));
            micro += m.num_edges() as u64;
        }
    }

    // Table 5: the batches of the partitioned dataset split by owner.
    let s = sampler(&parted, &fanouts);
    let (mut local, mut skew, mut n) = (0.0, 0.0, 0usize);
    for (step, seeds) in epoch_batches(&parted.train, &cfg, 0).iter().enumerate() {
        let key = BatchKey {
            seed: 0,
            epoch: 0,
            step: step as u64,
        };
        let mb = s
            .sample(seeds, key)
            .unwrap_or_else(|e| fail(&e.to_string()));
        let st = split_stats(&mb, &owners).unwrap_or_else(|e| fail(&e));
        local += st.local_fraction();
        skew += st.edge_skew();
        n += 1;
    }
    let v = serde_json::json!({
        "dataset": args[0], "partitioned": args[1], "fanouts": fanouts, "batch": batch,
        "splits": splits,
        "table2": {
            "edges_one_batch": mini, "edges_micro_batches": micro,
            "extra_pct": 100.0 * (micro as f64 / mini.max(1) as f64 - 1.0),
        },
        "table5": {
            "batches": n,
            "local_edges_pct": 100.0 * local / n.max(1) as f64,
            "edge_skew": skew / n.max(1) as f64,
        },
    });
    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
}
