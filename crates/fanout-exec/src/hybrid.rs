//! MorphGL's routed batch preparation: how many of an epoch's batches each route prepares.
//!
//! MorphGL prepares a mini-batch by one of two routes, route 0 on the CPU (sample and gather
//! there, then a DMA copy to the device) and route 1 on the GPU (sample and gather over UVA
//! from pinned host memory, on the same GPU that trains), profiles each phase's mean seconds
//! per batch (`T_CBT`, `T_UVA`, `T_DMA`, `T_Model`), and splits the batches CPU:GPU = 1:x.
//!
//! - [`epoch_cost`] is the paper's Eq. 6, the epoch time of the relaxed schedule (unlimited
//!   buffers, divisible work): `C(x) = n (x T_UVA / (1+x) + max{T_DMA / (1+x), T_Model,
//!   (T_CBT - x T_UVA) / (1+x)})`. [`best_split`] minimises it: within each region of the max
//!   the expression is monotone in `x`, so the optimum sits at `x = 0`, `x -> infinity` or a
//!   breakpoint where two terms of the max meet (e.g. `T_CBT = x T_UVA + (1+x) T_Model`).
//! - [`simulate`] runs MorphGL's Dual-Buffer Scheduling (Algorithms 1-4: fill both buffers,
//!   block the side that finished first, flush by training the GPU buffer while the CPU
//!   buffer's batches are copied in) as a discrete-event model of one epoch, and records which
//!   side waited; [`tune`] moves one batch at a time between the routes by that feedback,
//!   starting from [`best_split`], as the paper's Partitioner and Scheduler negotiate.
//!
//! Buffer sizes: `gbs = 10` GPU batches and `cbs = round(gbs * n_cpu / n_gpu)` CPU batches
//! (the paper's formula is inverted; `../shared/seeds/NOTES.md`).
//!
//! In fanout the routes of a trainer are its own threads (the CPU route: it samples and
//! extracts a slice itself) and the sampler workers (the remote route, in the UVA route's
//! place: the slice arrives sampled and the trainer only extracts it); a CUDA backend would add
//! the UVA route itself. [`crate::factored`] executes the split.

use serde::Serialize;

/// Mean seconds per batch of each phase (MorphGL's profile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RouteCosts {
    /// Route 0's batch preparation on the CPU (the pool's throughput time per batch).
    pub t_cbt: f64,
    /// Route 1's preparation, occupying the device that trains.
    pub t_uva: f64,
    /// Copying a route-0 batch to the device.
    pub t_dma: f64,
    /// Training one batch.
    pub t_model: f64,
}

/// Eq. 6: the relaxed epoch time of `n` batches split CPU:GPU = 1:`x` (`x = inf`: all on the
/// GPU route).
pub fn epoch_cost(c: &RouteCosts, x: f64, n: f64) -> f64 {
    if x.is_infinite() {
        return n * (c.t_uva + c.t_model.max(0.0));
    }
    let m = (c.t_dma / (1.0 + x))
        .max(c.t_model)
        .max((c.t_cbt - x * c.t_uva) / (1.0 + x));
    n * (x * c.t_uva / (1.0 + x) + m)
}

/// The split minimising [`epoch_cost`]: `(x, seconds per batch)`. Ties go to the smaller `x`
/// (less work on the device).
pub fn best_split(c: &RouteCosts) -> (f64, f64) {
    let mut candidates = vec![0.0, f64::INFINITY];
    if c.t_model > 0.0 {
        candidates.push(c.t_dma / c.t_model - 1.0);
    }
    if c.t_uva + c.t_model > 0.0 {
        candidates.push((c.t_cbt - c.t_model) / (c.t_uva + c.t_model));
    }
    if c.t_uva > 0.0 {
        candidates.push((c.t_cbt - c.t_dma) / c.t_uva);
    }
    candidates
        .into_iter()
        .filter(|x| *x >= 0.0 && !x.is_nan())
        .map(|x| (x, epoch_cost(c, x, 1.0)))
        .fold((0.0, f64::INFINITY), |best, (x, v)| {
            if v < best.1 - 1e-12 || (v <= best.1 + 1e-12 && x < best.0) {
                (x, v)
            } else {
                best
            }
        })
}

/// What [`simulate`] predicts for one epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Simulated {
    /// Epoch seconds.
    pub epoch_s: f64,
    /// Seconds the CPU route waited for the device side (too much work on the device).
    pub cpu_waited_s: f64,
    /// Seconds the device waited for the CPU route (too much work on the CPU).
    pub device_waited_s: f64,
    /// Overlaps (fill, block, flush) run.
    pub overlaps: usize,
}

/// Dual-Buffer Scheduling of `n_cpu` route-0 and `n_gpu` route-1 batches with buffers of
/// `cbs` and `gbs` batches, as a discrete-event model: each overlap fills both buffers at
/// once (CPU batching and device batching run in parallel), the side that finishes first
/// waits (the device keeps training and refilling meanwhile, the paper's footnote 3), then
/// the device trains its buffer while the CPU buffer is copied in behind it and the CPU
/// already batches for the next overlap.
pub fn simulate(c: &RouteCosts, n_cpu: usize, n_gpu: usize, cbs: usize, gbs: usize) -> Simulated {
    let (cbs, gbs) = (cbs.max(1), gbs.max(1));
    let (mut left_c, mut left_g) = (n_cpu, n_gpu);
    let mut out = Simulated::default();
    // When the CPU and the device are next free.
    let (mut cpu, mut dev) = (0.0f64, 0.0f64);
    while left_c + left_g > 0 {
        out.overlaps += 1;
        // Fill: the CPU batches up to cbs, the device up to gbs.
        let kc = cbs.min(left_c);
        let kg = gbs.min(left_g);
        left_c -= kc;
        left_g -= kg;
        let cpu_done = cpu + kc as f64 * c.t_cbt;
        let mut dev_done = dev + kg as f64 * c.t_uva;
        // Block: the side that finished first waits for the other.
        if kc > 0 && dev_done < cpu_done {
            // Footnote 3: train one buffered batch and batch another while waiting.
            while kg > 0 && left_g > 0 && dev_done + c.t_model + c.t_uva <= cpu_done {
                dev_done += c.t_model + c.t_uva;
                left_g -= 1;
            }
            out.device_waited_s += cpu_done - dev_done;
        } else if kc > 0 && kg > 0 && cpu_done < dev_done {
            out.cpu_waited_s += dev_done - cpu_done;
        }
        let start = if kc > 0 && kg > 0 {
            cpu_done.max(dev_done)
        } else if kc > 0 {
            cpu_done.max(dev)
        } else {
            dev_done
        };
        // Flush: train the device buffer; each step copies one CPU batch in behind it.
        let mut t = start;
        let mut link = start;
        let mut ready = Vec::with_capacity(kc);
        for _ in 0..kc {
            link = link.max(start) + c.t_dma;
            ready.push(link);
        }
        for _ in 0..kg {
            t += c.t_model;
        }
        for r in ready {
            t = t.max(r) + c.t_model;
        }
        dev = t;
        // The CPU starts the next overlap's batches as soon as its buffer empties.
        cpu = if kc > 0 { start } else { cpu };
    }
    out.epoch_s = dev.max(cpu);
    out
}

/// A split of an epoch between the routes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RouteSplit {
    /// Batches prepared by route 0 (the CPU; a fanout trainer's own threads).
    pub n_cpu: usize,
    /// Batches prepared by route 1 (the device; fanout's remote route).
    pub n_gpu: usize,
    /// CPU buffer size in batches.
    pub cbs: usize,
    /// Device buffer size in batches.
    pub gbs: usize,
    /// Eq. 6's optimum `x` before tuning.
    pub x_initial: f64,
    /// Eq. 6's epoch seconds at that optimum.
    pub relaxed_s: f64,
    /// The simulator's epoch seconds for this split.
    pub simulated: Simulated,
    /// Feedback rounds the tuning took.
    pub rounds: usize,
}

/// The device buffer size MorphGL uses.
pub const GPU_BUFFER: usize = 10;

/// MorphGL's Partitioner and Scheduler for `n` batches: the Eq. 6 optimum, rounded to whole
/// batches, then moved one batch at a time toward the side the simulated schedule left idle
/// until the mismatch is below one device batch (or it stops improving). Returns the best
/// simulated split seen.
pub fn tune(c: &RouteCosts, n: usize) -> RouteSplit {
    let (x, per_batch) = best_split(c);
    let mut n_gpu = if x.is_infinite() {
        n
    } else {
        ((n as f64) * x / (1.0 + x)).round() as usize
    }
    .min(n);
    let plan = |n_gpu: usize| -> (usize, usize, Simulated) {
        let n_cpu = n - n_gpu;
        let gbs = GPU_BUFFER;
        let cbs = if n_gpu == 0 {
            n_cpu.max(1)
        } else {
            ((gbs * n_cpu) as f64 / n_gpu as f64).round().max(1.0) as usize
        };
        (cbs, gbs, simulate(c, n_cpu, n_gpu, cbs, gbs))
    };
    let (mut cbs, mut gbs, mut sim) = plan(n_gpu);
    let mut best = (n_gpu, cbs, gbs, sim);
    let mut rounds = 0;
    let mut last_dir = 0i32;
    while rounds < 2 * n + 2 {
        let mismatch = sim.cpu_waited_s - sim.device_waited_s;
        if mismatch.abs() < c.t_uva.max(1e-12) {
            break;
        }
        // The CPU waited: the device side has too much; else the CPU side has.
        let dir = if mismatch > 0.0 { -1 } else { 1 };
        if last_dir != 0 && dir != last_dir {
            break;
        }
        let next = n_gpu as i64 + dir as i64;
        if next < 0 || next > n as i64 {
            break;
        }
        n_gpu = next as usize;
        last_dir = dir;
        rounds += 1;
        (cbs, gbs, sim) = plan(n_gpu);
        if sim.epoch_s < best.3.epoch_s {
            best = (n_gpu, cbs, gbs, sim);
        }
    }
    RouteSplit {
        n_cpu: n - best.0,
        n_gpu: best.0,
        cbs: best.1,
        gbs: best.2,
        x_initial: x,
        relaxed_s: per_batch * n as f64,
        simulated: best.3,
        rounds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(b: f64, u: f64, m: f64) -> RouteCosts {
        RouteCosts {
            t_cbt: b,
            t_uva: u,
            t_dma: 0.0,
            t_model: m,
        }
    }

    #[test]
    fn the_optimum_is_the_breakpoint_and_beats_a_fine_grid() {
        // CPU batching 4, device batching 1, training 0.5 (per batch): the CPU bound and the
        // device bound meet at T_CBT = x T_UVA + (1 + x) T_Model, x = 3.5 / 1.5.
        let c = costs(4.0, 1.0, 0.5);
        let (x, v) = best_split(&c);
        assert!((x - 3.5 / 1.5).abs() < 1e-12, "{x}");
        let grid_min = (0..=100_000)
            .map(|i| epoch_cost(&c, i as f64 * 1e-4, 1.0))
            .fold(f64::INFINITY, f64::min);
        assert!(
            v <= grid_min + 1e-9 && v > grid_min - 1e-3,
            "{v} vs {grid_min}"
        );
        // Pure routes are the ends: all CPU costs T_CBT, all device T_UVA + T_Model.
        assert_eq!(epoch_cost(&c, 0.0, 10.0), 40.0);
        assert_eq!(epoch_cost(&c, f64::INFINITY, 10.0), 15.0);
        // A fast CPU keeps everything there; a transfer-bound CPU route moves work away.
        assert_eq!(best_split(&costs(0.4, 1.0, 0.5)).0, 0.0);
        let dma = RouteCosts {
            t_dma: 3.0,
            ..costs(1.0, 1.0, 0.5)
        };
        assert!(best_split(&dma).0 > 0.0);
    }

    /// Table V back-solved: for each machine and dataset (GraphSAGE), SALIENT's epoch (all
    /// CPU, `n T_CBT`) and DUCATI's (all GPU, `n (T_UVA + T_Model)`) fix two costs; the
    /// training time is solved so that Eq. 6's optimum equals MorphGL's measured epoch. The
    /// CPU share of batches it implies is compared with Table VII's buffers (cbs : gbs).
    fn back_solve(salient: f64, ducati: f64, morphgl: f64) -> (RouteCosts, f64) {
        let (mut lo, mut hi) = (0.0, ducati);
        for _ in 0..200 {
            let m = 0.5 * (lo + hi);
            if best_split(&costs(salient, ducati - m, m)).1 < morphgl {
                lo = m;
            } else {
                hi = m;
            }
        }
        let c = costs(salient, ducati - lo, lo);
        let (x, v) = best_split(&c);
        assert!((v - morphgl).abs() < 1e-6 * morphgl);
        (c, 1.0 / (1.0 + x))
    }

    #[test]
    fn table_v_back_solved_costs_reproduce_table_vii_shape() {
        // (SALIENT, DUCATI, MorphGL) seconds per epoch, Table V GraphSAGE, machines A, B, C;
        // Table VII (CPU buffer, GPU buffer).
        let pa = [
            (29.12, 22.75, 17.02, 15),
            (53.63, 20.44, 19.40, 5),
            (56.58, 38.30, 31.57, 11),
        ];
        let tw = [
            (10.89, 16.69, 10.33, 20),
            (19.34, 14.11, 10.14, 8),
            (22.27, 26.04, 19.22, 24),
        ];
        let uk = [
            (18.62, 35.59, 16.62, 30),
            (33.40, 30.49, 21.24, 12),
            (38.33, 51.47, 34.65, 28),
        ];
        for (name, rows) in [("PA", pa), ("TW", tw), ("UK", uk)] {
            let mut shares = Vec::new();
            for (s, d, m, cbs) in rows {
                let (c, share) = back_solve(s, d, m);
                assert!(c.t_model > 0.0 && c.t_uva > 0.0, "{name}: {c:?}");
                let paper = cbs as f64 / (cbs + GPU_BUFFER) as f64;
                shares.push((share, paper));
            }
            // On every dataset machine B (the most GPU for its CPUs) gets the smallest CPU
            // share, in the model as in the paper.
            let min_model = (0..3).min_by(|&a, &b| shares[a].0.total_cmp(&shares[b].0));
            let min_paper = (0..3).min_by(|&a, &b| shares[a].1.total_cmp(&shares[b].1));
            assert_eq!(min_model, Some(1), "{name}: {shares:?}");
            assert_eq!(min_paper, Some(1));
            if name == "PA" {
                // PA's plans are reproduced within 5 points of CPU share.
                for (model, paper) in &shares {
                    assert!((model - paper).abs() < 0.05, "PA: {shares:?}");
                }
            }
        }
    }

    #[test]
    fn the_simulator_is_exact_for_pure_routes_and_tuning_balances_the_sides() {
        let c = costs(4.0, 1.0, 0.5);
        // All CPU with one buffer per overlap: batching and training pipeline across
        // overlaps, so the epoch is n T_CBT plus the last flush.
        let s = simulate(&c, 20, 0, 10, GPU_BUFFER);
        assert!((s.epoch_s - (80.0 + 10.0 * 0.5)).abs() < 1e-9, "{s:?}");
        // All device: n (T_UVA + T_Model), no waiting on either side.
        let s = simulate(&c, 0, 20, 1, GPU_BUFFER);
        assert!((s.epoch_s - 30.0).abs() < 1e-9, "{s:?}");
        assert_eq!((s.cpu_waited_s, s.device_waited_s), (0.0, 0.0));
        // Tuning beats both pure routes and lands near the relaxed optimum.
        let t = tune(&c, 200);
        assert_eq!(t.n_cpu + t.n_gpu, 200);
        let pure_cpu = simulate(&c, 200, 0, 200, GPU_BUFFER).epoch_s;
        let pure_dev = simulate(&c, 0, 200, 1, GPU_BUFFER).epoch_s;
        assert!(t.simulated.epoch_s < pure_cpu.min(pure_dev), "{t:?}");
        assert!(t.simulated.epoch_s < 1.25 * t.relaxed_s, "{t:?}");
        let x = t.n_gpu as f64 / t.n_cpu.max(1) as f64;
        assert!((x / t.x_initial - 1.0).abs() < 0.35, "{t:?}");
    }
}
