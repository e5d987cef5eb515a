//! Feature gather throughput: `cargo run --release -p fanout-graph --example gather_speed --
//! DIR [ROWS]` gathers ROWS (default 100,000) pseudo-random rows of DIR's features 15 times,
//! then aggregates a first-layer block of ROWS edges straight from the store
//! (`Features::aggregate_into`, as a fused `fanout train` input does) 15 times, and prints the
//! medians (set `RAYON_NUM_THREADS` to choose the threads; `FANOUT_MAPPED=1` reads the
//! memory-mapped file instead of the huge-page copy `fanout train` makes where it fits).
use fanout_graph::{Dataset, NoProgress, Residency};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(dir), rows) = (args.next(), args.next()) else {
        eprintln!("usage: gather_speed DIR [ROWS]");
        std::process::exit(2);
    };
    let rows: usize = match rows.map(|s| s.parse()) {
        None => 100_000,
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            eprintln!("gather_speed: ROWS must be a positive integer ({e})");
            std::process::exit(2);
        }
    };
    let mut ds = match Dataset::open(&dir) {
        Ok(ds) => ds,
        Err(e) => {
            eprintln!("gather_speed: {e}");
            std::process::exit(1);
        }
    };
    // As `fanout train` reads them: a huge-page copy where they fit (FANOUT_MAPPED=1: the map).
    let policy = if std::env::var_os("FANOUT_MAPPED").is_some() {
        Residency::Mapped
    } else {
        Residency::Auto
    };
    if let Err(e) = ds.make_features_resident(policy, &NoProgress) {
        eprintln!("gather_speed: {e}");
        std::process::exit(1);
    }
    let Some(f) = ds.features.as_ref() else {
        eprintln!("gather_speed: {dir} has no features");
        std::process::exit(1);
    };
    let n = ds.num_nodes();
    let mut state = 12345u64;
    let ids: Vec<u32> = (0..rows)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % n) as u32
        })
        .collect();
    let mut out = Vec::new();
    let mut t: Vec<f64> = (0..15)
        .map(|_| {
            let s = Instant::now();
            f.gather_into(&ids, &mut out);
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    println!(
        "gather {rows} rows x {}: median {:.2} ms ({:.1} ns/row)",
        f.dim,
        t[7] * 1e3,
        t[7] * 1e9 / rows as f64
    );
    // A first-layer mean aggregation read straight from the store, shaped like a products
    // batch's input block: ROWS edges, 25 per destination, into 31% as many distinct sources
    // as edges (each source read about 3.2 times).
    let fan = 25;
    let dsts = (rows / fan).max(1);
    let sources = &ids[..(rows * 31 / 100).max(1)];
    let indptr: Vec<u32> = (0..=dsts).map(|d| (d * fan) as u32).collect();
    let indices: Vec<u32> = (0..dsts * fan)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % sources.len() as u64) as u32
        })
        .collect();
    let coeff = vec![1.0 / fan as f32; indices.len()];
    let mut t: Vec<f64> = (0..15)
        .map(|_| {
            let s = Instant::now();
            f.aggregate_into(sources, &indptr, &indices, Some(&coeff), &mut out);
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    println!(
        "aggregate {} edges into {dsts} rows from {} sources: median {:.2} ms ({:.1} ns/edge)",
        indices.len(),
        sources.len(),
        t[7] * 1e3,
        t[7] * 1e9 / indices.len() as f64
    );
}
