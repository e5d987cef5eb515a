//! Prepared blocks and the sparse kernels on them (aggregation, edge softmax, edge sums).
//!
//! Kernels that produce one row per destination loop over destinations in parallel using the
//! block's CSR; kernels that produce one row per source (gradients flowing back to sources)
//! loop over sources in parallel using the transposed CSR, built once per block on first use.
//! Neither side needs atomics, and every output element is summed in a fixed order (edges of a
//! destination in CSR order; edges of a source by increasing destination).

use std::sync::{Arc, OnceLock};

use crate::backend::Aggregation;
use crate::block::{BlockDims, BlockRef, SourceMajor};
use crate::cpu::par::{par_dst_edges, par_rows, par_rows_new, par_rows_new_with_edges};
use crate::cpu::rows::{add_slice, axpy_heads, dot_heads, prefetch_row, PREFETCH_AHEAD};
use crate::error::Result;
use crate::tensor::Tensor;

/// A block prepared for the CPU backend: an owned copy of the CSR (cheap to clone: shared
/// through an `Arc`) plus its transpose, built lazily by the first kernel that needs it.
#[derive(Clone, Debug)]
pub struct CpuBlock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    num_dst: usize,
    num_src: usize,
    indptr: Vec<u32>,
    indices: Vec<u32>,
    weights: Option<Vec<f32>>,
    transposed: OnceLock<Transposed>,
}

/// Source-major view of the same edges: source `s` owns `t_indptr[s]..t_indptr[s+1]` of
/// `dst`/`eid`, ordered by destination then original edge id.
#[derive(Debug)]
struct Transposed {
    indptr: Vec<u32>,
    dst: Vec<u32>,
    eid: Vec<u32>,
    /// Inverse of `eid`: edge `e` is at position `pos[e]` of the source-major order. Built on
    /// first use (only the fused attention backward needs it).
    pos: OnceLock<Vec<u32>>,
}

impl Transposed {
    fn pos(&self) -> &[u32] {
        self.pos.get_or_init(|| {
            let mut pos = vec![0u32; self.eid.len()];
            for (i, &e) in self.eid.iter().enumerate() {
                pos[e as usize] = i as u32;
            }
            pos
        })
    }
}

impl CpuBlock {
    /// Validates `b` and copies it.
    pub fn new(b: &BlockRef<'_>) -> Result<Self> {
        b.validate()?;
        Ok(CpuBlock {
            inner: Arc::new(Inner {
                num_dst: b.num_dst,
                num_src: b.num_src,
                indptr: b.indptr.to_vec(),
                indices: b.indices.to_vec(),
                weights: b.weights.map(<[f32]>::to_vec),
                transposed: OnceLock::new(),
            }),
        })
    }

    /// The sizes of the block.
    pub fn dims(&self) -> BlockDims {
        BlockDims {
            num_dst: self.inner.num_dst,
            num_src: self.inner.num_src,
            num_edges: self.inner.indices.len(),
        }
    }

    /// The destination-major offsets (`num_dst + 1`).
    pub fn indptr(&self) -> &[u32] {
        &self.inner.indptr
    }

    /// The source of every edge.
    pub fn indices(&self) -> &[u32] {
        &self.inner.indices
    }

    /// The edge weights, if the block has them.
    pub fn weights(&self) -> Option<&[f32]> {
        self.inner.weights.as_deref()
    }

    /// Number of block edges leaving each source (`num_src` entries).
    pub fn out_degrees(&self) -> Vec<u32> {
        // Counted from the edges, not taken from the transpose: building that costs several
        // times more, and an input layer's block (GCN's largest) never needs it otherwise,
        // having no gradient to propagate.
        let mut deg = vec![0u32; self.inner.num_src];
        for &s in &self.inner.indices {
            deg[s as usize] += 1;
        }
        deg
    }

    /// The edges into destination `d` (a range of edge ids).
    pub(crate) fn edges(&self, d: usize) -> std::ops::Range<usize> {
        self.inner.indptr[d] as usize..self.inner.indptr[d + 1] as usize
    }

    /// The sources of destination `d`'s edges, in edge order; empty past the last
    /// destination (so a kernel may ask for the next destination's, to prefetch them).
    pub(crate) fn sources(&self, d: usize) -> &[u32] {
        match self.inner.indptr.get(d + 1) {
            Some(_) => &self.inner.indices[self.edges(d)],
            None => &[],
        }
    }

    /// The edges into `d` with their sources' rows of `x`, in edge order: `(e, x[src(e)])`.
    /// Each step first prefetches the row of the source [`PREFETCH_AHEAD`] edges further on
    /// (into the next destinations' edges too), so the rows arrive before they are read.
    #[inline]
    pub(crate) fn source_rows<'a>(
        &'a self,
        d: usize,
        x: &'a Tensor,
    ) -> impl Iterator<Item = (usize, &'a [f32])> + 'a {
        let idx = &self.inner.indices;
        self.edges(d).map(move |e| {
            if let Some(&ahead) = idx.get(e + PREFETCH_AHEAD) {
                prefetch_row(x.row(ahead as usize));
            }
            (e, x.row(idx[e] as usize))
        })
    }

    fn transposed(&self) -> &Transposed {
        self.inner.transposed.get_or_init(|| {
            let inner = &self.inner;
            let SourceMajor { indptr, dst, eid } =
                SourceMajor::of(&inner.indptr, &inner.indices, inner.num_src);
            Transposed {
                indptr,
                dst,
                eid,
                pos: OnceLock::new(),
            }
        })
    }
}

/// See [`crate::Backend::edge_coefficients`].
pub(crate) fn edge_coefficients(b: &CpuBlock, agg: Aggregation) -> Option<Tensor> {
    let e = b.dims().num_edges;
    let mut out = vec![0.0f32; e];
    let indptr = b.indptr();
    match agg {
        Aggregation::Sum => return None,
        Aggregation::Mean => par_dst_edges(indptr, &mut out, 1, |_, c| {
            let v = 1.0 / c.len().max(1) as f32;
            c.fill(v);
        }),
        Aggregation::Weighted => match b.weights() {
            Some(w) => out.copy_from_slice(w),
            None => out.fill(1.0),
        },
        Aggregation::WeightedMean => {
            let w = b.weights();
            par_dst_edges(indptr, &mut out, 1, |d, c| {
                let r = b.edges(d);
                let ws = |i: usize| w.map_or(1.0, |w| w[r.start + i]);
                let total: f32 = (0..c.len()).map(ws).sum();
                let denom = total.max(1.0);
                for (i, x) in c.iter_mut().enumerate() {
                    *x = ws(i) / denom;
                }
            })
        }
        Aggregation::GcnBoth => {
            let out_deg = b.out_degrees();
            let idx = b.indices();
            par_dst_edges(indptr, &mut out, 1, |d, c| {
                let r = b.edges(d);
                let din = c.len().max(1) as f64;
                for (i, x) in c.iter_mut().enumerate() {
                    let dout = out_deg[idx[r.start + i] as usize].max(1) as f64;
                    *x = (1.0 / (dout * din).sqrt()) as f32;
                }
            })
        }
    }
    Some(Tensor::new(e, 1, out))
}

fn heads_of(coeff: Option<&Tensor>, e: usize, cols: usize, what: &str) -> usize {
    let heads = coeff.map_or(1, Tensor::cols);
    if let Some(c) = coeff {
        assert_eq!(
            c.rows(),
            e,
            "{what}: coeff has {} rows for {e} edges",
            c.rows()
        );
    }
    assert!(
        heads > 0 && cols.is_multiple_of(heads),
        "{what}: {cols} columns do not split into {heads} heads"
    );
    heads
}

/// See [`crate::Backend::spmm`].
pub(crate) fn spmm(b: &CpuBlock, coeff: Option<&Tensor>, x: &Tensor) -> Tensor {
    let dims = b.dims();
    assert_eq!(x.rows(), dims.num_src, "spmm: x rows != num_src");
    let cols = x.cols();
    heads_of(coeff, dims.num_edges, cols, "spmm");
    let out = par_rows_new(dims.num_dst, cols, |d, row| {
        for (e, xs) in b.source_rows(d, x) {
            match coeff {
                None => add_slice(xs, row),
                Some(c) => {
                    let w = c.row(e);
                    axpy_heads(w, xs, row);
                }
            }
        }
    });
    Tensor::new(dims.num_dst, cols, out)
}

/// See [`crate::Backend::spmm_backward_x`].
pub(crate) fn spmm_backward_x(b: &CpuBlock, coeff: Option<&Tensor>, grad: &Tensor) -> Tensor {
    let dims = b.dims();
    assert_eq!(grad.rows(), dims.num_dst, "spmm_backward_x: grad rows");
    let cols = grad.cols();
    heads_of(coeff, dims.num_edges, cols, "spmm_backward_x");
    let t = b.transposed();
    let out = par_rows_new(dims.num_src, cols, |s, row| {
        for i in t.indptr[s] as usize..t.indptr[s + 1] as usize {
            if let Some(&ahead) = t.dst.get(i + PREFETCH_AHEAD) {
                prefetch_row(grad.row(ahead as usize));
            }
            let g = grad.row(t.dst[i] as usize);
            match coeff {
                None => add_slice(g, row),
                Some(c) => {
                    let w = c.row(t.eid[i] as usize);
                    axpy_heads(w, g, row);
                }
            }
        }
    });
    Tensor::new(dims.num_src, cols, out)
}

/// See [`crate::Backend::spmm_backward_coeff`].
pub(crate) fn spmm_backward_coeff(b: &CpuBlock, grad: &Tensor, x: &Tensor, heads: usize) -> Tensor {
    let dims = b.dims();
    assert_eq!(grad.rows(), dims.num_dst, "spmm_backward_coeff: grad rows");
    assert_eq!(x.rows(), dims.num_src, "spmm_backward_coeff: x rows");
    assert_eq!(grad.cols(), x.cols(), "spmm_backward_coeff: widths differ");
    assert!(
        heads > 0 && x.cols().is_multiple_of(heads),
        "spmm_backward_coeff: heads"
    );
    let mut out = Tensor::zeros(dims.num_edges, heads);
    par_dst_edges(b.indptr(), out.data_mut(), heads, |d, o| {
        let g = grad.row(d);
        for (i, (_, xs)) in b.source_rows(d, x).enumerate() {
            dot_heads(g, xs, &mut o[i * heads..(i + 1) * heads]);
        }
    });
    out
}

/// See [`crate::Backend::spmm_backward`]. One source-major pass: each source's row of `x` is
/// read once, while its gradient row is summed, instead of once per edge (a GAT layer's `x` is
/// its projected sources, far larger than the caches); the coefficient gradients come out in
/// source-major order and are then put in edge order. Each value is computed by the same
/// operations, in the same order, as in [`spmm_backward_x`] and [`spmm_backward_coeff`].
pub(crate) fn spmm_backward(
    b: &CpuBlock,
    coeff: &Tensor,
    grad: &Tensor,
    x: &Tensor,
) -> (Tensor, Tensor) {
    let dims = b.dims();
    let cols = grad.cols();
    assert_eq!(grad.rows(), dims.num_dst, "spmm_backward: grad rows");
    assert_eq!(x.shape(), (dims.num_src, cols), "spmm_backward: x shape");
    let heads = heads_of(Some(coeff), dims.num_edges, cols, "spmm_backward");
    let t = b.transposed();
    let mut by_src = vec![0.0f32; dims.num_edges * heads];
    let gx = par_rows_new_with_edges(&t.indptr, cols, &mut by_src, heads, |s, row, ga| {
        let xs = x.row(s);
        let (lo, hi) = (t.indptr[s] as usize, t.indptr[s + 1] as usize);
        for (i, o) in (lo..hi).zip(ga.chunks_exact_mut(heads)) {
            if let Some(&ahead) = t.dst.get(i + PREFETCH_AHEAD) {
                prefetch_row(grad.row(ahead as usize));
            }
            let g = grad.row(t.dst[i] as usize);
            axpy_heads(coeff.row(t.eid[i] as usize), g, row);
            dot_heads(g, xs, o);
        }
    });
    let pos = t.pos();
    let g_coeff = par_rows_new(dims.num_edges, heads, |e, o| {
        let at = pos[e] as usize * heads;
        o.copy_from_slice(&by_src[at..at + heads]);
    });
    (
        Tensor::new(dims.num_src, cols, gx),
        Tensor::new(dims.num_edges, heads, g_coeff),
    )
}

/// See [`crate::Backend::u_add_v`].
pub(crate) fn u_add_v(b: &CpuBlock, el: &Tensor, er: &Tensor) -> Tensor {
    let dims = b.dims();
    let h = el.cols();
    assert_eq!(el.rows(), dims.num_src, "u_add_v: el rows != num_src");
    assert_eq!(er.shape(), (dims.num_dst, h), "u_add_v: er shape");
    let idx = b.indices();
    let mut out = Tensor::zeros(dims.num_edges, h);
    par_dst_edges(b.indptr(), out.data_mut(), h, |d, o| {
        let r = er.row(d);
        for (i, e) in b.edges(d).enumerate() {
            let l = el.row(idx[e] as usize);
            for k in 0..h {
                o[i * h + k] = l[k] + r[k];
            }
        }
    });
    out
}

/// See [`crate::Backend::edge_sum_to_src`].
pub(crate) fn edge_sum_to_src(b: &CpuBlock, e: &Tensor) -> Tensor {
    let dims = b.dims();
    assert_eq!(
        e.rows(),
        dims.num_edges,
        "edge_sum_to_src: rows != num_edges"
    );
    let t = b.transposed();
    let out = par_rows_new(dims.num_src, e.cols(), |s, row| {
        for i in t.indptr[s] as usize..t.indptr[s + 1] as usize {
            add_slice(e.row(t.eid[i] as usize), row);
        }
    });
    Tensor::new(dims.num_src, e.cols(), out)
}

/// See [`crate::Backend::edge_sum_to_dst`].
pub(crate) fn edge_sum_to_dst(b: &CpuBlock, e: &Tensor) -> Tensor {
    let dims = b.dims();
    assert_eq!(
        e.rows(),
        dims.num_edges,
        "edge_sum_to_dst: rows != num_edges"
    );
    let out = par_rows_new(dims.num_dst, e.cols(), |d, row| {
        for i in b.edges(d) {
            add_slice(e.row(i), row);
        }
    });
    Tensor::new(dims.num_dst, e.cols(), out)
}

/// See [`crate::Backend::edge_softmax`].
pub(crate) fn edge_softmax(b: &CpuBlock, scores: &Tensor) -> Tensor {
    let dims = b.dims();
    assert_eq!(
        scores.rows(),
        dims.num_edges,
        "edge_softmax: rows != num_edges"
    );
    let h = scores.cols();
    let mut out = Tensor::zeros(dims.num_edges, h);
    par_dst_edges(b.indptr(), out.data_mut(), h, |d, o| {
        let r = b.edges(d);
        let s = &scores.data()[r.start * h..r.end * h];
        let n = r.len();
        for k in 0..h {
            let max = (0..n)
                .map(|i| s[i * h + k])
                .fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0.0f32;
            for i in 0..n {
                let v = (s[i * h + k] - max).exp();
                o[i * h + k] = v;
                total += v;
            }
            for i in 0..n {
                o[i * h + k] /= total;
            }
        }
    });
    out
}

/// See [`crate::Backend::edge_softmax_backward`].
pub(crate) fn edge_softmax_backward(b: &CpuBlock, a: &Tensor, grad: &Tensor) -> Tensor {
    let dims = b.dims();
    assert_eq!(a.rows(), dims.num_edges, "edge_softmax_backward: a rows");
    assert_eq!(a.shape(), grad.shape(), "edge_softmax_backward: grad shape");
    let h = a.cols();
    let mut out = Tensor::zeros(dims.num_edges, h);
    par_dst_edges(b.indptr(), out.data_mut(), h, |d, o| {
        let r = b.edges(d);
        let av = &a.data()[r.start * h..r.end * h];
        let gv = &grad.data()[r.start * h..r.end * h];
        for k in 0..h {
            let s: f32 = (0..r.len()).map(|i| av[i * h + k] * gv[i * h + k]).sum();
            for i in 0..r.len() {
                o[i * h + k] = av[i * h + k] * (gv[i * h + k] - s);
            }
        }
    });
    out
}

/// See [`crate::Backend::gather_rows`].
pub(crate) fn gather_rows(x: &Tensor, idx: &[u32]) -> Tensor {
    if let Some(&bad) = idx.iter().find(|&&i| i as usize >= x.rows()) {
        panic!(
            "gather_rows: index {bad} out of range for {} rows",
            x.rows()
        );
    }
    let mut out = Tensor::zeros(idx.len(), x.cols());
    par_rows(out.data_mut(), x.cols(), |i, row| {
        row.copy_from_slice(x.row(idx[i] as usize))
    });
    out
}

/// See [`crate::Backend::scatter_add_rows`]. Positions are grouped by target row first
/// (counting sort), so each target row is written by one task, in increasing position order.
pub(crate) fn scatter_add_rows(y: &mut Tensor, idx: &[u32], x: &Tensor) {
    assert_eq!(
        x.rows(),
        idx.len(),
        "scatter_add_rows: x rows != index count"
    );
    assert_eq!(x.cols(), y.cols(), "scatter_add_rows: widths differ");
    let rows = y.rows();
    let mut start = vec![0u32; rows + 1];
    for &i in idx {
        assert!((i as usize) < rows, "scatter_add_rows: index {i} >= {rows}");
        start[i as usize + 1] += 1;
    }
    for r in 0..rows {
        start[r + 1] += start[r];
    }
    let mut next = start.clone();
    let mut pos = vec![0u32; idx.len()];
    for (p, &i) in idx.iter().enumerate() {
        pos[next[i as usize] as usize] = p as u32;
        next[i as usize] += 1;
    }
    let cols = y.cols();
    par_rows(y.data_mut(), cols, |r, row| {
        for &p in &pos[start[r] as usize..start[r + 1] as usize] {
            add_slice(x.row(p as usize), row);
        }
    });
}
