//! The random-graph model: power-law vertex weights, planted classes, optional hosts (contiguous
//! id blocks), and O(1) weighted samplers (alias tables) over all vertices, each class and each
//! host. One edge draw picks `u` by weight, then `v` by weight inside `u`'s host, inside `u`'s
//! class, or anywhere. Everything here is a pure function of the configuration and the seed.

use crate::features::uniform_labels;
use crate::preset::PresetConfig;
use fanout_rand::{mix_keys, Rng};
use rayon::prelude::*;

const WEIGHT_STREAM: u64 = 0x3E;
const HOST_STREAM: u64 = 0x40;
/// Pareto shape of host sizes (a few very large hosts, many small ones).
const HOST_SHAPE: f64 = 1.5;
/// Largest host as a multiple of the mean host size.
const HOST_CAP: f64 = 64.0;

/// Where an edge's second end is drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Global,
    Class,
    Local,
}

/// One alias-table slot: keep `id` when the draw's fraction is below `thresh`, else take
/// `alias_id`. Packed so that a draw touches one cache line.
#[derive(Clone, Copy, Default)]
struct Slot {
    thresh: u64,
    id: u32,
    alias_id: u32,
}

/// Weighted samplers over consecutive segments of a list of vertices (all vertices, the members
/// of each class, or each host's id range): `sample(s, rng)` returns a member of segment `s`
/// with probability proportional to its weight, in O(1) with one random number.
pub(crate) struct SegmentedAlias {
    offsets: Vec<usize>,
    slots: Vec<Slot>,
}

impl SegmentedAlias {
    /// Builds the tables (Vose's method, segments in parallel). `members[offsets[s]..offsets[s+1]]`
    /// are segment `s`'s vertices; `weights` is indexed by vertex id.
    fn build(offsets: Vec<usize>, members: &[u32], weights: &[f64]) -> Self {
        let mut slots = vec![Slot::default(); members.len()];
        let mut parts: Vec<(usize, &mut [Slot])> = Vec::with_capacity(offsets.len());
        let mut rest = &mut slots[..];
        for w in offsets.windows(2) {
            let (head, tail) = rest.split_at_mut(w[1] - w[0]);
            parts.push((w[0], head));
            rest = tail;
        }
        parts.into_par_iter().for_each(|(start, seg)| {
            let ids = &members[start..start + seg.len()];
            vose(ids, weights, seg);
        });
        SegmentedAlias { offsets, slots }
    }

    /// A vertex of segment `seg`, drawn proportionally to weight, using the uniform 64-bit
    /// random word `r`: its high part (`r x len / 2^64`) picks the slot, the low word of that
    /// product is a uniform fraction for the slot's coin.
    #[inline]
    pub(crate) fn sample(&self, seg: usize, r: u64) -> u32 {
        let start = self.offsets[seg];
        let len = self.offsets[seg + 1] - start;
        let m = r as u128 * len as u128;
        let slot = &self.slots[start + (m >> 64) as usize];
        if (m as u64) < slot.thresh {
            slot.id
        } else {
            slot.alias_id
        }
    }
}

/// Fills one segment's alias table for vertices `ids`.
fn vose(ids: &[u32], weights: &[f64], out: &mut [Slot]) {
    let n = ids.len();
    let total: f64 = ids.iter().map(|&v| weights[v as usize]).sum();
    let mut q: Vec<f64> = if total > 0.0 {
        ids.iter()
            .map(|&v| weights[v as usize] * n as f64 / total)
            .collect()
    } else {
        vec![1.0; n]
    };
    let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| q[i] < 1.0);
    for (i, s) in out.iter_mut().enumerate() {
        *s = Slot {
            thresh: u64::MAX,
            id: ids[i],
            alias_id: ids[i],
        };
    }
    while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
        small.pop();
        out[s].thresh = (q[s] * 18_446_744_073_709_551_616.0) as u64;
        out[s].alias_id = ids[l];
        q[l] -= 1.0 - q[s];
        if q[l] < 1.0 {
            large.pop();
            small.push(l);
        }
    }
    // Leftovers (either list) have q = 1 up to rounding: they keep their own id.
}

/// Power-law weights with mean 1: the vertex of rank `r` (0 = heaviest) gets a weight
/// proportional to `(r + r0)^(-1/(exponent - 1))`, with `r0` chosen so that the largest weight is
/// `max_ratio` times the mean (or as close as `r0 >= 1` allows); ranks go to ids through a seeded
/// random permutation.
pub(crate) fn powerlaw_weights(n: usize, exponent: f64, max_ratio: f64, seed: u64) -> Vec<f64> {
    let alpha = 1.0 / (exponent - 1.0);
    if max_ratio <= 1.0 {
        return vec![1.0; n];
    }
    // Sum of (r + r0)^-alpha over 0..n: exact for the head, midpoint integral for the tail.
    let sum = |r0: f64| -> f64 {
        let head = n.min(1024);
        let mut s: f64 = (0..head).map(|r| (r as f64 + r0).powf(-alpha)).sum();
        if n > head {
            let (a, b) = (head as f64 + r0 - 0.5, n as f64 + r0 - 0.5);
            s += if (alpha - 1.0).abs() < 1e-12 {
                (b / a).ln()
            } else {
                (b.powf(1.0 - alpha) - a.powf(1.0 - alpha)) / (1.0 - alpha)
            };
        }
        s
    };
    let ratio = |r0: f64| r0.powf(-alpha) * n as f64 / sum(r0);
    // ratio decreases from ratio(1) towards 1 as r0 grows: bisect on log r0.
    let (mut lo, mut hi) = (0.0f64, (n as f64 * 1e6).ln());
    if ratio(1.0) > max_ratio {
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if ratio(mid.exp()) > max_ratio {
                lo = mid;
            } else {
                hi = mid;
            }
        }
    }
    let r0 = lo.exp();
    let mean = sum(r0) / n as f64;
    let mut ids: Vec<u32> = (0..n as u32).collect();
    Rng::keyed(&[seed, WEIGHT_STREAM]).shuffle(&mut ids);
    let mut w = vec![0.0; n];
    for (rank, &v) in ids.iter().enumerate() {
        w[v as usize] = (rank as f64 + r0).powf(-alpha) / mean;
    }
    w
}

/// Host boundaries: contiguous id blocks with Pareto sizes of mean about `mean` (capped at
/// `HOST_CAP` x `mean` and at `n / 16`), covering `0..n`. Returns `hosts + 1` offsets.
fn host_offsets(n: usize, mean: u64, seed: u64) -> Vec<usize> {
    let mut rng = Rng::keyed(&[seed, HOST_STREAM]);
    let xmin = mean as f64 * (HOST_SHAPE - 1.0) / HOST_SHAPE;
    // At small scales, also keep any one host (hence class) below 1/16 of the graph.
    let cap = (mean as f64 * HOST_CAP)
        .min(n as f64 / 16.0)
        .max(mean as f64);
    let mut offsets = vec![0usize];
    let mut at = 0usize;
    while at < n {
        let u = 1.0 - rng.next_f64();
        let size = (xmin * u.powf(-1.0 / HOST_SHAPE)).min(cap).ceil().max(1.0) as usize;
        at = (at + size).min(n);
        offsets.push(at);
    }
    offsets
}

/// Vertex ids sorted by class, with per-class offsets (a counting sort).
fn group_by_class(labels: &[u32], classes: usize) -> (Vec<usize>, Vec<u32>) {
    let mut offsets = vec![0usize; classes + 1];
    for &l in labels {
        offsets[l as usize + 1] += 1;
    }
    for c in 0..classes {
        offsets[c + 1] += offsets[c];
    }
    let mut cursor = offsets.clone();
    let mut members = vec![0u32; labels.len()];
    for (v, &l) in labels.iter().enumerate() {
        members[cursor[l as usize]] = v as u32;
        cursor[l as usize] += 1;
    }
    (offsets, members)
}

/// Hosts: each vertex's host and the per-host samplers.
pub(crate) struct Hosts {
    pub(crate) host_of: Vec<u32>,
    /// Total weight of each host.
    pub(crate) weight: Vec<f64>,
    alias: SegmentedAlias,
}

/// The sampled-but-not-yet-drawn graph: weights, labels, hosts and samplers.
pub(crate) struct Model {
    /// Vertex weights (mean 1); a vertex's expected degree is proportional to its weight.
    pub(crate) weights: Vec<f64>,
    /// Sum of `weights` (= number of vertices up to rounding).
    pub(crate) total: f64,
    pub(crate) labels: Vec<u32>,
    /// Total weight of each class.
    pub(crate) class_weight: Vec<f64>,
    pub(crate) hosts: Option<Hosts>,
    global: SegmentedAlias,
    by_class: SegmentedAlias,
    /// Probability of a local (same-host) second end.
    pub(crate) p_local: f64,
    /// Probability of a same-class second end (set by calibration).
    pub(crate) p_class: f64,
}

impl Model {
    /// Draws weights, labels and hosts for `cfg` and builds the samplers. `p_class` starts at 0.
    pub(crate) fn new(cfg: &PresetConfig, seed: u64) -> Model {
        let n = cfg.nodes as usize;
        let classes = cfg.classes as usize;
        let max_ratio = cfg.max_degree / cfg.avg_degree.max(1e-9);
        let weights = powerlaw_weights(n, cfg.degree_exponent, max_ratio, seed);
        let total: f64 = weights.iter().sum();
        let label_seed = mix_keys(&[seed, 0x1AB]);
        let (labels, hosts) = if cfg.locality > 0.0 {
            // Each host lies entirely inside one class, so local edges are same-class edges.
            let offsets = host_offsets(n, cfg.host_size, seed);
            let host_class = uniform_labels((offsets.len() - 1) as u64, cfg.classes, label_seed);
            let mut host_of = vec![0u32; n];
            let mut labels = vec![0u32; n];
            let mut weight = vec![0.0; offsets.len() - 1];
            for h in 0..offsets.len() - 1 {
                for v in offsets[h]..offsets[h + 1] {
                    host_of[v] = h as u32;
                    labels[v] = host_class[h] as u32;
                    weight[h] += weights[v];
                }
            }
            let ids: Vec<u32> = (0..n as u32).collect();
            let alias = SegmentedAlias::build(offsets, &ids, &weights);
            let hosts = Hosts {
                host_of,
                weight,
                alias,
            };
            (labels, Some(hosts))
        } else {
            let labels = uniform_labels(n as u64, cfg.classes, label_seed);
            (labels.into_iter().map(|l| l as u32).collect(), None)
        };
        let mut class_weight = vec![0.0; classes];
        for (v, &l) in labels.iter().enumerate() {
            class_weight[l as usize] += weights[v];
        }
        let all: Vec<u32> = (0..n as u32).collect();
        let global = SegmentedAlias::build(vec![0, n], &all, &weights);
        drop(all);
        let (offsets, members) = group_by_class(&labels, classes);
        let by_class = SegmentedAlias::build(offsets, &members, &weights);
        Model {
            weights,
            total,
            labels,
            class_weight,
            hosts,
            global,
            by_class,
            p_local: cfg.locality,
            p_class: 0.0,
        }
    }

    /// The segment a second end is drawn from for first end `u`, and the sampler holding it.
    #[inline]
    fn segment(&self, mode: Mode, u: u32) -> (&SegmentedAlias, usize) {
        match (mode, &self.hosts) {
            (Mode::Local, Some(h)) => (&h.alias, h.host_of[u as usize] as usize),
            (Mode::Class, _) => (&self.by_class, self.labels[u as usize] as usize),
            _ => (&self.global, 0),
        }
    }

    /// One edge `(u, v)` with the second end drawn in `mode`.
    pub(crate) fn draw_in(&self, mode: Mode, rng: &mut Rng) -> (u32, u32) {
        let u = self.global.sample(0, rng.next_u64());
        let (table, seg) = self.segment(mode, u);
        (u, table.sample(seg, rng.next_u64()))
    }

    /// Appends `count` edges of the model to `out`: each picks its mode (local with probability
    /// `p_local`, class with `p_class`, else global), its first end and its second end from three
    /// words of `rng`. Works in blocks, one stage at a time, so that the table lookups of many
    /// edges (each a likely cache miss) are in flight together.
    pub(crate) fn draw_many(&self, rng: &mut Rng, count: usize, out: &mut Vec<(u64, u64)>) {
        const BLOCK: usize = 256;
        let mut mode = [Mode::Global; BLOCK];
        let mut first = [0u32; BLOCK];
        let mut word = [0u64; BLOCK];
        let mut done = 0;
        while done < count {
            let b = BLOCK.min(count - done);
            for i in 0..b {
                let x = rng.next_f64();
                mode[i] = if x < self.p_local {
                    Mode::Local
                } else if x < self.p_local + self.p_class {
                    Mode::Class
                } else {
                    Mode::Global
                };
                first[i] = self.global.sample(0, rng.next_u64());
                word[i] = rng.next_u64();
            }
            out.extend((0..b).map(|i| {
                let (table, seg) = self.segment(mode[i], first[i]);
                (first[i] as u64, table.sample(seg, word[i]) as u64)
            }));
            done += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_samples_follow_weights() {
        let weights = [1.0, 2.0, 3.0, 0.0, 4.0, 10.0];
        let members = [0u32, 1, 2, 3, 4, 5];
        let t = SegmentedAlias::build(vec![0, 4, 6], &members, &weights);
        let mut rng = Rng::new(1);
        let mut counts = [0u64; 6];
        let draws = 200_000;
        for _ in 0..draws {
            counts[t.sample(0, rng.next_u64()) as usize] += 1;
            counts[t.sample(1, rng.next_u64()) as usize] += 1;
        }
        assert_eq!(counts[3], 0);
        for (v, seg_total) in [(0, 6.0), (1, 6.0), (2, 6.0), (4, 14.0), (5, 14.0)] {
            let p = counts[v] as f64 / draws as f64;
            let want = weights[v] / seg_total;
            assert!((p - want).abs() < 0.005, "vertex {v}: {p} vs {want}");
        }
    }

    #[test]
    fn powerlaw_weights_hit_the_requested_head() {
        let w = powerlaw_weights(100_000, 2.2, 300.0, 5);
        let mean = w.iter().sum::<f64>() / w.len() as f64;
        let max = w.iter().cloned().fold(0.0, f64::max);
        assert!((mean - 1.0).abs() < 1e-3, "mean {mean}");
        assert!((max / 300.0 - 1.0).abs() < 0.01, "max {max}");
        // Uniform when no head is asked for.
        assert!(powerlaw_weights(10, 2.0, 0.5, 1).iter().all(|&x| x == 1.0));
    }

    #[test]
    fn hosts_tile_the_ids() {
        let o = host_offsets(100_000, 100, 3);
        assert_eq!((o[0], *o.last().unwrap()), (0, 100_000));
        assert!(o.windows(2).all(|w| w[1] > w[0] && w[1] - w[0] <= 6400));
        let mean = 100_000.0 / (o.len() - 1) as f64;
        assert!((60.0..140.0).contains(&mean), "mean host size {mean}");
    }
}
