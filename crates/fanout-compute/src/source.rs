//! Rows of a product's left factor, made while the product consumes them.
//!
//! A first layer that aggregates before it projects multiplies the aggregate of its sources'
//! stored rows by a weight. Made whole first, that aggregate is a pass bound by memory latency
//! (stored rows read in random order) and the product after it a pass bound by arithmetic: on
//! one core their times add up. Made a few rows at a time inside the product, with the stored
//! rows of the next few fetched into cache while the current ones are multiplied, the fetching
//! overlaps the arithmetic ([`crate::Backend::gemm_sourced`]).

use std::mem::MaybeUninit;
use std::ops::Range;

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
