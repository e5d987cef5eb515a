//! Choosing the number of edge draws and the same-class probability so that the *stored* graph
//! (after deduplication and loop removal) has the requested average degree and homophily.
//!
//! Repeated draws of one vertex pair collapse into one edge, and they are frequent between hubs,
//! inside small classes and inside hosts, so the draw count cannot simply be `n x degree / 2`.
//! If one draw yields the unordered pair `e` with probability `p_e`, then `M` draws leave
//! `D(M) = sum_e (1 - exp(-M p_e))` distinct pairs in expectation (Poisson approximation), which
//! equals `E_{e ~ draw}[(1 - exp(-M p_e)) / p_e]`: a Monte Carlo estimate over a few thousand
//! draws of the model itself, since `p_e` has a closed form. Likewise the same-class share.

use crate::model::{Mode, Model};
use fanout_rand::Rng;

const CALIB_STREAM: u64 = 0xCA1;
/// Draws per mode for the estimate (relative error well under 1%).
const SAMPLES: usize = 16_384;

/// The calibrated plan.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// Edge draws to make.
    pub(crate) draws: u64,
    /// Probability that a draw's second end is chosen inside the first end's class.
    pub(crate) p_class: f64,
}

/// One sampled draw, reduced to what `p_e` needs.
struct Pair {
    /// `2 w_u w_v`; 0 for a self-loop (which is never stored).
    ww: f64,
    /// `1 / W_class` when both ends share a class, else 0.
    inv_class: f64,
    /// `1 / W_host` when both ends share a host, else 0.
    inv_host: f64,
    same_class: bool,
}

struct Estimator<'a> {
    model: &'a Model,
    /// Draws per mode: global, class, local.
    pairs: [Vec<Pair>; 3],
}

impl Estimator<'_> {
    /// Probabilities of the three modes for a given same-class probability.
    fn mix(&self, p_class: f64) -> [f64; 3] {
        let p_local = self.model.p_local;
        [1.0 - p_local - p_class, p_class, p_local]
    }

    /// (D(M), D'(M), same-class part of D(M)).
    fn eval(&self, draws: f64, p_class: f64) -> (f64, f64, f64) {
        let mix = self.mix(p_class);
        let inv_total = 1.0 / self.model.total;
        let (mut d, mut dd, mut h) = (0.0, 0.0, 0.0);
        for (pairs, &pi) in self.pairs.iter().zip(&mix) {
            if pi <= 0.0 || pairs.is_empty() {
                continue;
            }
            let (mut sd, mut sdd, mut sh) = (0.0, 0.0, 0.0);
            for e in pairs {
                if e.ww == 0.0 {
                    continue;
                }
                let p = e.ww
                    * inv_total
                    * (mix[0] * inv_total + mix[1] * e.inv_class + mix[2] * e.inv_host);
                let x = draws * p;
                // (1 - e^-x) / p, written to stay exact for tiny x.
                let c = if x < 1e-12 { draws } else { -(-x).exp_m1() / p };
                sd += c;
                sdd += (-x).exp();
                if e.same_class {
                    sh += c;
                }
            }
            let k = pi / pairs.len() as f64;
            d += k * sd;
            dd += k * sdd;
            h += k * sh;
        }
        (d, dd, h)
    }

    /// The draw count whose expected distinct pairs reach `target` (capped at 16 x target when
    /// repeats make it unreachable), and the resulting (pairs, same-class pairs).
    fn draws_for(&self, target: f64, p_class: f64) -> (f64, f64, f64) {
        let cap = 16.0 * target;
        // D is concave and increasing with D(M) <= M, so Newton's method from M = target climbs
        // monotonically to the root.
        let mut m = target;
        for _ in 0..100 {
            let (d, dd, _) = self.eval(m, p_class);
            if d >= target * (1.0 - 1e-9) || dd <= 0.0 {
                break;
            }
            let next = (m + (target - d) / dd).min(cap);
            if next <= m * (1.0 + 1e-9) {
                break;
            }
            m = next;
        }
        let (d, _, h) = self.eval(m, p_class);
        (m, d, h)
    }
}

/// Finds the draw count and same-class probability for `model` so that the stored graph has
/// about `target_arcs` arcs and a same-class share of about `homophily` (clamped to what the
/// model can reach: locality alone already puts `p_local` of the edges inside a class).
pub(crate) fn calibrate(model: &Model, target_arcs: f64, homophily: f64, seed: u64) -> Plan {
    let target = target_arcs / 2.0;
    if target <= 0.0 {
        return Plan {
            draws: 0,
            p_class: 0.0,
        };
    }
    let mut rng = Rng::keyed(&[seed, CALIB_STREAM]);
    let mut sample = |mode: Mode| -> Vec<Pair> {
        if mode == Mode::Local && model.hosts.is_none() {
            return Vec::new();
        }
        (0..SAMPLES)
            .map(|_| {
                let (u, v) = model.draw_in(mode, &mut rng);
                let (u, v) = (u as usize, v as usize);
                let same_class = model.labels[u] == model.labels[v];
                let inv_host = match &model.hosts {
                    Some(h) if h.host_of[u] == h.host_of[v] => {
                        1.0 / h.weight[h.host_of[u] as usize]
                    }
                    _ => 0.0,
                };
                Pair {
                    ww: if u == v {
                        0.0
                    } else {
                        2.0 * model.weights[u] * model.weights[v]
                    },
                    inv_class: if same_class {
                        1.0 / model.class_weight[model.labels[u] as usize]
                    } else {
                        0.0
                    },
                    inv_host,
                    same_class,
                }
            })
            .collect()
    };
    let est = Estimator {
        model,
        pairs: [
            sample(Mode::Global),
            sample(Mode::Class),
            sample(Mode::Local),
        ],
    };
    let share = |p_class: f64| {
        let (m, d, h) = est.draws_for(target, p_class);
        (m, d, if d > 0.0 { h / d } else { 0.0 })
    };
    // The same-class share grows with p_class: bisect.
    let (mut lo, mut hi) = (0.0, 1.0 - model.p_local);
    let mut p_class = 0.0;
    let mut best = share(lo);
    if best.2 < homophily {
        let top = share(hi);
        if top.2 <= homophily {
            (p_class, best) = (hi, top);
        } else {
            for _ in 0..30 {
                let mid = 0.5 * (lo + hi);
                (p_class, best) = (mid, share(mid));
                if (best.2 - homophily).abs() < 1e-4 {
                    break;
                }
                if best.2 < homophily {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
        }
    }
    Plan {
        draws: best.0.round() as u64,
        p_class,
    }
}
