//! This machine's peak rates on the current rayon pool, measured: the GEMM rate (flops per
//! second of large products through [`super::gemm`], the kernels the models use) and the
//! copy bandwidth (bytes per second of a parallel copy far larger than the caches). An epoch
//! cannot take less than its GEMM flops at the first, nor less than its gathered bytes at the
//! second: these are the denominators of the floors `fanout train` reports.

use super::gemm;
use crate::tensor::Tensor;
use rayon::prelude::*;
use std::time::Instant;

/// Peak rates measured on a pool of `threads` threads.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MachineRates {
    /// Threads of the pool the rates were measured on.
    pub threads: usize,
    /// Best GEMM rate seen, flops per second (`2 m n k / time`).
    pub gemm_flops_per_s: f64,
    /// Best copy bandwidth seen, bytes per second (bytes read; as many are written).
    pub copy_bytes_per_s: f64,
}

/// Revision of the GEMM kernels and shapes [`MachineRates::measure`] times. Raise it with
/// every change to them that moves the measured rate, so that rates cached by an older build
/// are measured again instead of giving floors for kernels no longer run. 2: the AVX-512
/// kernel that reads a row-major `A` in place (`rowmajor`), timed on a layer's shape too.
pub const GEMM_KERNELS_REVISION: u32 = 2;

/// The `m x k x n` products timed for the GEMM rate, about 2 GFLOP each: large enough that
/// packing and the split into blocks cost a few percent, small enough to take well under a
/// second. A square one, and a layer's shape (thousands of rows times a 256 x 256 weight),
/// where a kernel that reads `A` in place runs faster than on the square one (which packs a
/// 4 MiB `B` for 1,024 rows): the rate is the faster of the two.
const GEMM_SHAPES: [(usize, usize, usize); 2] = [(1024, 1024, 1024), (16384, 256, 256)];

/// Bytes copied for the bandwidth: far beyond any last-level cache.
const COPY_BYTES: usize = 256 << 20;

/// Timed repetitions of each measurement; the best counts (the least disturbed).
const REPEATS: usize = 3;

impl MachineRates {
    /// Measures both rates on the current rayon pool (about half a second on two cores).
    pub fn measure() -> MachineRates {
        MachineRates {
            threads: rayon::current_num_threads(),
            gemm_flops_per_s: GEMM_SHAPES
                .iter()
                .map(|&(m, k, n)| measure_gemm(m, k, n, REPEATS))
                .fold(0.0, f64::max),
            copy_bytes_per_s: measure_copy(COPY_BYTES, REPEATS),
        }
    }

    /// Seconds that `flops` GEMM flops take at the measured rate.
    pub fn compute_floor_s(&self, flops: u64) -> f64 {
        flops as f64 / self.gemm_flops_per_s
    }

    /// Seconds that copying `bytes` takes at the measured bandwidth.
    pub fn memory_floor_s(&self, bytes: u64) -> f64 {
        bytes as f64 / self.copy_bytes_per_s
    }
}

/// Best flops per second of `m x k x n` products (a row-major `A`, as in the layers' forward
/// products) over `repeats` timed runs (after one warm-up run).
pub fn measure_gemm(m: usize, k: usize, n: usize, repeats: usize) -> f64 {
    let a = Tensor::new(m, k, (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect());
    let b = Tensor::new(k, n, (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect());
    let mut c = Tensor::zeros(m, n);
    let flops = 2.0 * (m * k * n) as f64;
    let mut best = f64::INFINITY;
    for i in 0..=repeats {
        let t = Instant::now();
        gemm::gemm_dense(1.0, &a, false, &b, false, 0.0, &mut c);
        let s = t.elapsed().as_secs_f64();
        if i > 0 {
            best = best.min(s);
        }
    }
    flops / best.max(1e-9)
}

/// Best bytes per second of a parallel copy of `bytes` bytes over `repeats` timed runs (after
/// one warm-up run that also faults the pages in).
pub fn measure_copy(bytes: usize, repeats: usize) -> f64 {
    let n = bytes / 4;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    let chunk = (n / (4 * rayon::current_num_threads().max(1))).max(1 << 16);
    let mut best = f64::INFINITY;
    for i in 0..=repeats {
        let t = Instant::now();
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        let s = t.elapsed().as_secs_f64();
        if i > 0 {
            best = best.min(s);
        }
    }
    std::hint::black_box(&dst);
    (n * 4) as f64 / best.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_positive_and_floors_scale_with_the_work() {
        let r = MachineRates {
            threads: 1,
            gemm_flops_per_s: measure_gemm(128, 64, 32, 1),
            copy_bytes_per_s: measure_copy(4 << 20, 1),
        };
        assert!(r.gemm_flops_per_s > 1e6, "{r:?}");
        assert!(r.copy_bytes_per_s > 1e6, "{r:?}");
        assert_eq!(r.compute_floor_s(0), 0.0);
        let one = r.compute_floor_s(1_000_000_000);
        assert!((r.compute_floor_s(2_000_000_000) - 2.0 * one).abs() < 1e-12 * one.max(1.0));
        assert!((r.memory_floor_s(1 << 30) * r.copy_bytes_per_s - (1u64 << 30) as f64).abs() < 1.0);
    }
}
