//! The host tensor: a dense row-major `f32` matrix.

use fanout_rand::Rng;

/// A dense, row-major `f32` matrix held in host memory.
///
/// Guarantees: `data().len() == rows() * cols()` at all times; element `(r, c)` is
/// `data()[r * cols() + c]`. It is the CPU backend's tensor and the exchange format of every
/// backend ([`crate::Backend::upload`], [`crate::Backend::download`]). Vectors are `1 x n`
/// (biases) or `n x 1` (per-row or per-edge scalars); a scalar parameter is `1 x 1`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Tensor {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Tensor {
    /// A `rows x cols` tensor over `data`. Panics if `data.len() != rows * cols`.
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "Tensor::new: {} values for a {rows} x {cols} tensor",
            data.len()
        );
        Tensor { rows, cols, data }
    }

    /// A `rows x cols` tensor of zeros (zero-filled in parallel on the current rayon pool when
    /// large).
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Tensor::new(rows, cols, crate::cpu::par::zeros(rows * cols))
    }

    /// A `rows x cols` tensor filled with `value`.
    pub fn full(rows: usize, cols: usize, value: f32) -> Self {
        Tensor::new(rows, cols, vec![value; rows * cols])
    }

    /// A `rows x cols` tensor whose element `(r, c)` is `f(r, c)`.
    pub fn from_fn(rows: usize, cols: usize, mut f: impl FnMut(usize, usize) -> f32) -> Self {
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                data.push(f(r, c));
            }
        }
        Tensor::new(rows, cols, data)
    }

    /// A `1 x 1` tensor holding `value`.
    pub fn scalar(value: f32) -> Self {
        Tensor::new(1, 1, vec![value])
    }

    /// Values drawn uniformly from `[-a, a]` with `a = sqrt(6 / (fan_in + fan_out))`
    /// (Glorot & Bengio 2010, "Xavier uniform", gain 1), from a stream that is a pure function
    /// of `rng`'s state. This is PyTorch's `xavier_uniform_` for a weight with those fans.
    pub fn glorot(rows: usize, cols: usize, fan_in: usize, fan_out: usize, rng: &mut Rng) -> Self {
        let a = (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
        Tensor::from_fn(rows, cols, |_, _| ((rng.next_f64() * 2.0 - 1.0) * a) as f32)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Number of elements (`rows * cols`).
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor has no element.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// All elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// All elements, row-major, mutable (the shape cannot change through this).
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The element buffer, row-major.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Row `r`. Panics if `r >= rows`.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Row `r`, mutable. Panics if `r >= rows`.
    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Element `(r, c)`. Panics when out of range.
    pub fn get(&self, r: usize, c: usize) -> f32 {
        assert!(r < self.rows && c < self.cols, "Tensor::get out of range");
        self.data[r * self.cols + c]
    }

    /// The largest absolute elementwise difference to `other`: `f32::INFINITY` if the shapes
    /// differ or an element is NaN on one side only (two NaNs count as equal, as do two
    /// infinities of the same sign). Meant for tests and sanity checks.
    pub fn max_abs_diff(&self, other: &Tensor) -> f32 {
        if self.shape() != other.shape() {
            return f32::INFINITY;
        }
        self.data
            .iter()
            .zip(&other.data)
            .map(|(a, b)| match (a.is_nan(), b.is_nan()) {
                (true, true) => 0.0,
                (false, false) if a == b => 0.0,
                (false, false) => (a - b).abs(),
                _ => f32::INFINITY,
            })
            .fold(0.0, f32::max)
    }
}

#[cfg(test)]
mod tests {
    use super::Tensor;

    #[test]
    fn max_abs_diff_sees_nans_and_infinities() {
        let t = |v: &[f32]| Tensor::new(1, v.len(), v.to_vec());
        assert_eq!(t(&[1.0, 2.0]).max_abs_diff(&t(&[1.5, 2.0])), 0.5);
        // A NaN on one side is as far as can be; on both sides, equal.
        assert_eq!(
            t(&[f32::NAN, 2.0]).max_abs_diff(&t(&[1.0, 2.0])),
            f32::INFINITY
        );
        assert_eq!(
            t(&[1.0, 2.0]).max_abs_diff(&t(&[1.0, f32::NAN])),
            f32::INFINITY
        );
        assert_eq!(t(&[f32::NAN, 2.0]).max_abs_diff(&t(&[f32::NAN, 2.0])), 0.0);
        assert_eq!(t(&[f32::INFINITY]).max_abs_diff(&t(&[f32::INFINITY])), 0.0);
        assert_eq!(
            t(&[f32::INFINITY]).max_abs_diff(&t(&[f32::NEG_INFINITY])),
            f32::INFINITY
        );
        assert_eq!(t(&[1.0]).max_abs_diff(&t(&[1.0, 1.0])), f32::INFINITY);
    }
}
