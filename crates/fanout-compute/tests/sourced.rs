//! A product whose left factor is made while it is multiplied (`matmul_sourced`) against the
//! plain path it replaces: the factor made whole, then `matmul` and `gemm`, bit for bit.

use fanout_compute::cpu::gemm::{self, makes_rows_in_product};
use fanout_compute::{Backend, CpuBackend, RowSource, Tensor};
use std::mem::MaybeUninit;
use std::ops::Range;

/// Rows made as a first layer's aggregate is: row `r` sums `coeff[e] * stored[src[e]]` over
/// its edges in order, from zero.
struct Aggregate {
    stored: Vec<f32>,
    cols: usize,
    indptr: Vec<usize>,
    src: Vec<usize>,
    coeff: Vec<f32>,
}

impl Aggregate {
    fn new(rows: usize, cols: usize, degree: usize, stored_rows: usize, seed: u64) -> Self {
        let mut state = seed;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let stored = (0..stored_rows * cols)
            .map(|_| (next() % 2001) as f32 / 401.0 - 2.5)
            .collect();
        let mut indptr = vec![0];
        let mut src = Vec::new();
        for _ in 0..rows {
            let d = 1 + next() % (2 * degree);
            src.extend((0..d).map(|_| next() % stored_rows));
            indptr.push(src.len());
        }
        let coeff = (0..src.len())
            .map(|_| (next() % 100) as f32 / 73.0)
            .collect();
        Aggregate {
            stored,
            cols,
            indptr,
            src,
            coeff,
        }
    }

    fn whole(&self) -> Tensor {
        let mut data = Vec::with_capacity(self.rows() * self.cols);
        self.fill(
            0..self.rows(),
            &mut data.spare_capacity_mut()[..self.rows() * self.cols],
        );
        // SAFETY: `fill` wrote every element.
        unsafe { data.set_len(self.rows() * self.cols) };
        Tensor::new(self.rows(), self.cols, data)
    }
}

impl RowSource for Aggregate {
    fn rows(&self) -> usize {
        self.indptr.len() - 1
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn fill(&self, rows: Range<usize>, out: &mut [MaybeUninit<f32>]) {
        assert_eq!(out.len(), rows.len() * self.cols);
        for (r, o) in rows.zip(out.chunks_exact_mut(self.cols.max(1))) {
            let mut sum = vec![0.0f32; self.cols];
            for e in self.indptr[r]..self.indptr[r + 1] {
                let x = &self.stored[self.src[e] * self.cols..][..self.cols];
                for (s, &x) in sum.iter_mut().zip(x) {
                    *s += self.coeff[e] * x;
                }
            }
            for (o, s) in o.iter_mut().zip(sum) {
                o.write(s);
            }
        }
    }
    fn stored_rows(&self, rows: Range<usize>, out: &mut Vec<usize>) {
        let base = self.stored.as_ptr() as usize;
        out.extend(
            self.src[self.indptr[rows.start]..self.indptr[rows.end]]
                .iter()
                .map(|&s| base + 4 * s * self.cols),
        );
    }
    fn stored_row_bytes(&self) -> usize {
        4 * self.cols
    }
    fn stored_reads(&self) -> usize {
        self.src.len()
    }
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && a.data()
            .iter()
            .zip(b.data())
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

fn weights(rows: usize, cols: usize, seed: usize) -> Tensor {
    Tensor::new(
        rows,
        cols,
        (0..rows * cols)
            .map(|i| ((i * 7 + seed) % 23) as f32 / 11.0 - 1.0)
            .collect(),
    )
}

/// The sourced product and the plain one give the same `C` and `A`, with and without a first
/// product, over shapes with partial micro-tiles and panels, and where the rows read too much
/// to be made inside (then `A` is made whole first).
#[test]
fn sourced_products_equal_the_plain_products_bit_for_bit() {
    let mut inside = 0;
    for (i, &(m, k, n, degree)) in [
        (1, 9, 5, 3),
        (13, 64, 47, 4),
        (100, 256, 256, 25),
        (257, 100, 33, 10),
        (700, 256, 64, 25),
        (40, 4096, 16, 25),
    ]
    .iter()
    .enumerate()
    {
        let src = Aggregate::new(m, k, degree, 300, i as u64 + 1);
        inside += usize::from(makes_rows_in_product(&src, n));
        let a = src.whole();
        let w = weights(k, n, i);
        let x = weights(m, 30, i + 3);
        let wx = weights(30, n, i + 5);
        for first in [None, Some((&x, &wx))] {
            let (c, made) = CpuBackend.matmul_sourced(first, &src, &w).unwrap();
            let mut want = match first {
                Some((x, wx)) => gemm::matmul(x, false, wx, false),
                None => Tensor::zeros(m, n),
            };
            let beta = if first.is_some() { 1.0 } else { 0.0 };
            gemm::gemm(1.0, &a, false, &w, false, beta, &mut want);
            assert!(same_bits(&made, &a), "A, shape {m} x {k} x {n}");
            assert!(
                same_bits(&c, &want),
                "C, shape {m} x {k} x {n}, first {}",
                first.is_some()
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        assert!(
            inside >= 3,
            "only {inside} shapes made their rows inside the product"
        );
    }
}
