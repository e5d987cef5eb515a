//! Rows of a product's left factor, made while the product consumes them.
//!
//! A first layer that aggregates before it projects multiplies the aggregate of its sources'
//! stored rows by a weight. Made whole first, that aggregate is a pass bound by memory latency
//! (stored rows read in random order) and the product after it a pass bound by arithmetic: on
//! one core their times add up. Made a few rows at a time inside the product, with the stored
//! rows of the next few fetched into cache while the current ones are multiplied, the fetching
//! overlaps the arithmetic ([`crate::Backend::matmul_sourced`]).

use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::ops::Range;

use crate::tensor::Tensor;

/// The `rows() x cols()` rows of a left factor, made on request from stored rows whose
/// addresses it can name in advance.
pub trait RowSource: Sync {
    /// Rows of the factor.
    fn rows(&self) -> usize;
    /// Columns of each row.
    fn cols(&self) -> usize;
    /// Writes every element of rows `rows` into `out` (`rows.len() * cols()` floats,
    /// row-major, possibly uninitialised on entry). Each row gets the same bits whatever range
    /// it is asked in. May be called from several threads at once, on disjoint ranges. Panics
    /// if `rows` ends past [`RowSource::rows`] or `out` has the wrong length.
    fn fill(&self, rows: Range<usize>, out: &mut [MaybeUninit<f32>]);
    /// Appends to `out` the address of each stored row that `fill(rows)` reads, in the order
    /// it reads them: hints for prefetching, never read through.
    fn stored_rows(&self, rows: Range<usize>, out: &mut Vec<usize>);
    /// Bytes of each stored row [`RowSource::stored_rows`] names.
    fn stored_row_bytes(&self) -> usize;
    /// Stored rows read to make all rows (with repeats): with [`RowSource::rows`], how many
    /// bytes a few rows read on average.
    fn stored_reads(&self) -> usize;
}

/// Every row `src` makes, as a `rows() x cols()` tensor, made in parallel on the current
/// rayon pool (`MADE_WHOLE_ROWS` rows a task): the factor where it is not made inside a
/// product.
pub fn made_whole(src: &dyn RowSource) -> Tensor {
    let (m, k) = (src.rows(), src.cols());
    let mut a: Vec<f32> = Vec::with_capacity(m * k);
    if k > 0 {
        a.spare_capacity_mut()[..m * k]
            .par_chunks_mut(MADE_WHOLE_ROWS * k)
            .enumerate()
            .for_each(|(i, out)| {
                let r0 = i * MADE_WHOLE_ROWS;
                src.fill(r0..r0 + out.len() / k, out);
            });
    }
    // SAFETY: the chunks cover all m * k elements and `fill` wrote every one (its contract).
    unsafe { a.set_len(m * k) };
    Tensor::new(m, k, a)
}

/// Rows per task of [`made_whole`].
const MADE_WHOLE_ROWS: usize = 64;
