//! Extraction for a cache on the device against the plain gather: `cargo run --release -p
//! fanout-cache --example split_speed -- DIR [BATCH] [RATIO]` samples 12 k-hop batches (10,25,
//! BATCH seeds, default 8000) of DIR, builds a degree cache of RATIO of the vertices (default
//! 0.2) with Match on, and times per batch: the plain gather of every input row
//! (`PlainExtractor::extract`), the split with the missed rows gathered on the host
//! (`extract_split` with misses, `--feature-placement device`) and without them (`uva`: the
//! device reads them in place). Prints the medians (set `RAYON_NUM_THREADS` for the threads).
use fanout_cache::policy::degree_ranking;
use fanout_cache::{
    CacheSize, CacheSplit, CachedExtractor, Extractor, FeatureCache, PlainExtractor,
};
use fanout_graph::{Dataset, NoProgress, Residency};
use fanout_sample::{BatchKey, KHopConfig, KHopSampler, Sampler};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    if let Err(e) = run() {
        eprintln!("split_speed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args
        .first()
        .ok_or("usage: split_speed DIR [BATCH] [RATIO]")?;
    let batch: usize = args
        .get(1)
        .map_or(Ok(8000), |s| s.parse())
        .map_err(|e| format!("BATCH must be a positive integer ({e})"))?;
    let ratio: f64 = args
        .get(2)
        .map_or(Ok(0.2), |s| s.parse())
        .map_err(|e| format!("RATIO must be a number ({e})"))?;
    let mut ds = Dataset::open(dir).map_err(|e| e.to_string())?;
    ds.make_features_resident(Residency::Auto, &NoProgress)
        .map_err(|e| e.to_string())?;
    let ds = Arc::new(ds);
    let f = ds.features.as_ref().ok_or("the dataset has no features")?;
    let n = ds.num_nodes() as usize;
    let cfg = KHopConfig {
        fanouts: vec![10, 25],
        replace: false,
        remap: Default::default(),
    };
    let sampler = KHopSampler::new(ds.clone(), cfg).map_err(|e| e.to_string())?;
    let batches: Vec<Vec<u32>> = (0..12u64)
        .map(|step| {
            let seeds: Vec<u32> = (0..batch)
                .map(|i| ((i as u64 * 2_654_435_761 + step * 40_503) % n as u64) as u32)
                .collect();
            let key = BatchKey {
                seed: 1,
                epoch: 0,
                step,
            };
            sampler.sample(&seeds, key).map(|b| b.input_nodes)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let build = || -> Result<CachedExtractor, String> {
        let rows = CacheSize::Ratio(ratio).rows(n, f.row_bytes());
        let ranking = degree_ranking(&ds.topology);
        let cache = FeatureCache::build(f, &ranking[..rows]).map_err(|e| e.to_string())?;
        CachedExtractor::new(ds.clone(), Some(cache), true).map_err(|e| e.to_string())
    };
    let mut plain = PlainExtractor::new(ds.clone()).map_err(|e| e.to_string())?;
    let (mut with, mut without) = (build()?, build()?);
    let (mut out, mut split) = (Vec::new(), CacheSplit::default());
    let (mut tp, mut tw, mut to) = (Vec::new(), Vec::new(), Vec::new());
    let time = |t: &mut Vec<f64>, f: &mut dyn FnMut()| {
        let s = Instant::now();
        f();
        t.push(s.elapsed().as_secs_f64() * 1e3);
    };
    for ids in &batches {
        time(&mut tp, &mut || {
            plain.extract(ids, &mut out).unwrap();
        });
        time(&mut tw, &mut || {
            with.extract_split(ids, &mut split, Some(&mut out));
        });
        time(&mut to, &mut || {
            without.extract_split(ids, &mut split, None);
        });
    }
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let rows = batches.iter().map(Vec::len).sum::<usize>() / batches.len();
    println!(
        "{} threads, {rows} input rows a batch, width {}: plain gather {:.2} ms, split with \
         misses {:.2} ms, split without {:.2} ms (medians of {})",
        rayon::current_num_threads(),
        f.dim,
        median(&mut tp),
        median(&mut tw),
        median(&mut to),
        batches.len()
    );
    Ok(())
}
