//! Producers of `weight.bin` (one f32 per stored arc, in stored order) for the weighted
//! sampler, so that weighted sampling runs on any dataset without a hand-written file.
//!
//! - [`WeightScheme::Random`]: independent uniform weights in (0, 1], keyed by a seed.
//! - [`WeightScheme::Newer`]: GNNLab's weighted setting (section 2, Figure 5b: "the weight of a
//!   vertex represents the year registered, and the sampling algorithm prefers to select the
//!   newer neighbors"), with the vertex id as the registration order: the arc in `v`'s row
//!   that lists `u` weighs `(u + 1) / N`.

use fanout_graph::{Dataset, Row};
use fanout_rand::Rng;
use rayon::prelude::*;

/// How arc weights are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightScheme {
    /// Uniform in (0, 1], independent per arc.
    Random,
    /// `(u + 1) / N` for the arc listing neighbour `u` (newer = larger id = likelier).
    Newer,
}

/// Stream tag of the random scheme (keeps its numbers apart from every sampler's).
const WEIGHTS_TAG: u64 = 0x5745_4947_4854_5331;

/// One weight per stored arc of `ds` under `scheme`, in stored order. Guarantees: length
/// NUM_EDGE; every weight finite and in (0, 1]; a pure function of the topology, the scheme
/// and `seed` (the random scheme draws row `v`'s weights from `Rng::keyed(&[seed, tag, v])`,
/// whatever the thread count; `Newer` ignores the seed).
pub fn make_weights(ds: &Dataset, scheme: WeightScheme, seed: u64) -> Vec<f32> {
    let t = &ds.topology;
    let n = t.num_nodes();
    let mut out = vec![0.0f32; t.num_arcs() as usize];
    // Split `out` into one slice per row (rows are contiguous in stored order).
    let mut rows: Vec<(u64, &mut [f32])> = Vec::with_capacity(n as usize);
    let mut rest = out.as_mut_slice();
    for v in 0..n {
        let (a, b) = t.row_range(v);
        let (head, tail) = rest.split_at_mut((b - a) as usize);
        rows.push((v, head));
        rest = tail;
    }
    rows.into_par_iter()
        .with_min_len(1024)
        .for_each(|(v, w)| match scheme {
            WeightScheme::Random => {
                let mut rng = Rng::keyed(&[seed, WEIGHTS_TAG, v]);
                // next_f32 is in [0, 1); 1 - x is in (0, 1], so no arc is impossible.
                w.iter_mut().for_each(|x| *x = 1.0 - rng.next_f32());
            }
            WeightScheme::Newer => {
                let row: Row<'_> = t.row(v);
                for (i, x) in w.iter_mut().enumerate() {
                    *x = ((row.get(i) + 1) as f64 / n as f64) as f32;
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::random_graph;

    #[test]
    fn schemes_give_one_valid_weight_per_arc() {
        let ds = random_graph(500, 60, 4);
        let t = &ds.topology;
        let n = t.num_nodes();
        let a = make_weights(&ds, WeightScheme::Random, 1);
        assert_eq!(a.len() as u64, t.num_arcs());
        assert!(a.iter().all(|&w| w > 0.0 && w <= 1.0));
        assert_eq!(a, make_weights(&ds, WeightScheme::Random, 1));
        assert_ne!(a, make_weights(&ds, WeightScheme::Random, 2));
        // Uniform: the mean of many draws is near 1/2.
        let mean = a.iter().map(|&w| w as f64).sum::<f64>() / a.len() as f64;
        let sd = (1.0 / 12.0 / a.len() as f64).sqrt();
        assert!((mean - 0.5).abs() < 5.0 * sd, "mean {mean}");

        let b = make_weights(&ds, WeightScheme::Newer, 0);
        for v in 0..n {
            let (lo, hi) = t.row_range(v);
            let row = t.row(v);
            for (i, arc) in (lo..hi).enumerate() {
                let want = ((row.get(i) + 1) as f64 / n as f64) as f32;
                assert_eq!(b[arc as usize], want, "vertex {v} arc {i}");
            }
        }
    }
}
