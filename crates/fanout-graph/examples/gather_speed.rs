//! Feature gather throughput: `cargo run --release -p fanout-graph --example gather_speed --
//! DIR [ROWS]` gathers ROWS (default 100,000) pseudo-random rows of DIR's features 15 times
//! and prints the median (set `RAYON_NUM_THREADS` to choose the threads).
use fanout_graph::Dataset;
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
    let ds = match Dataset::open(&dir) {
        Ok(ds) => ds,
        Err(e) => {
            eprintln!("gather_speed: {e}");
            std::process::exit(1);
        }
    };
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
}
