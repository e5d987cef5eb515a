//! Opening a dataset directory: topology, features, labels and splits, all memory-mapped.
//!
//! [`Dataset::open`] reads `meta.txt`, checks every file's size against it and maps the files,
//! then checks the contents that would otherwise fail far from their cause (offsets, labels,
//! split ids, and neighbour ids once per content: see [`crate::checks`]). Features are not
//! scanned; `verify` does that, and training stops at the first non-finite loss.

use crate::array::{Array, Pod, Residency};
use crate::checks::{self, IdCheck};
use crate::error::{Error, Result};
use crate::meta::{FeatDtype, Layout, Meta};
use crate::progress::Progress;
use crate::row_ops::RowOps;
use half::f16;
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File names of the native dataset directory (GUIDE section 1).
pub mod files {
    pub const META: &str = "meta.txt";
    pub const INDPTR: &str = "indptr.bin";
    pub const INDPTR64: &str = "indptr64.bin";
    pub const INDICES: &str = "indices.bin";
    pub const INDICES64: &str = "indices64.bin";
    pub const FEAT: &str = "feat.bin";
    pub const LABEL: &str = "label.bin";
    pub const TRAIN: &str = "train_set.bin";
    pub const VALID: &str = "valid_set.bin";
    pub const TEST: &str = "test_set.bin";
    /// Part boundaries of a dataset relabelled by a METIS partition (`G + 1` little-endian
    /// u64: part `p` holds ids `offsets[p]..offsets[p + 1]`).
    pub const PART_OFFSETS: &str = "part_offsets.bin";
}

/// An edge-offset element type (`indptr`): u32 or u64.
pub trait Offset: Pod + Into<u64> + Ord {
    /// The value as an index.
    fn idx(self) -> usize;
}
impl Offset for u32 {
    #[inline]
    fn idx(self) -> usize {
        self as usize
    }
}
impl Offset for u64 {
    #[inline]
    fn idx(self) -> usize {
        self as usize
    }
}

/// A vertex-id element type (`indices`): u32 or u64.
pub trait VertexId: Pod + Into<u64> + Ord + std::hash::Hash + Default + std::fmt::Debug {
    /// Narrows a u64 known to fit.
    fn from_u64(v: u64) -> Self;
    /// The value as an index.
    fn idx(self) -> usize;
}
impl VertexId for u32 {
    #[inline]
    fn from_u64(v: u64) -> Self {
        debug_assert!(v <= u32::MAX as u64);
        v as u32
    }
    #[inline]
    fn idx(self) -> usize {
        self as usize
    }
}
impl VertexId for u64 {
    #[inline]
    fn from_u64(v: u64) -> Self {
        v
    }
    #[inline]
    fn idx(self) -> usize {
        self as usize
    }
}

/// `indptr`, in the width the dataset stores.
#[derive(Debug)]
pub enum Offsets {
    U32(Array<u32>),
    U64(Array<u64>),
}

/// `indices`, in the width the dataset stores.
#[derive(Debug)]
pub enum Ids {
    U32(Array<u32>),
    U64(Array<u64>),
}

/// Code that runs on the compressed topology with its concrete element types, so hot loops are
/// monomorphised once per width instead of branching per edge. See [`Topology::visit`].
pub trait CsrVisitor {
    type Output;
    fn visit<O: Offset, I: VertexId>(self, indptr: &[O], indices: &[I]) -> Self::Output;
}

/// One vertex's neighbour list, borrowed from the topology.
#[derive(Clone, Copy, Debug)]
pub enum Row<'a> {
    U32(&'a [u32]),
    U64(&'a [u64]),
}

impl Row<'_> {
    /// Number of neighbours.
    pub fn len(&self) -> usize {
        match self {
            Row::U32(r) => r.len(),
            Row::U64(r) => r.len(),
        }
    }
    /// True when there are no neighbours.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The `i`-th neighbour.
    pub fn get(&self, i: usize) -> u64 {
        match self {
            Row::U32(r) => r[i] as u64,
            Row::U64(r) => r[i],
        }
    }
    /// The neighbours as u64 ids.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }
}

/// The compressed topology: `indptr` (N+1 offsets) and `indices` (one id per arc). In CSC layout
/// row `v` lists the sources of arcs into `v`; in CSR layout the targets of arcs out of `v`.
/// Guarantees after `Dataset::open`: lengths match meta (N+1 and NUM_EDGE). Monotonicity and id
/// bounds are checked by `verify`, not on open.
#[derive(Debug)]
pub struct Topology {
    pub layout: Layout,
    pub indptr: Offsets,
    pub indices: Ids,
}

impl Topology {
    /// Number of vertices.
    pub fn num_nodes(&self) -> u64 {
        (match &self.indptr {
            Offsets::U32(a) => a.len(),
            Offsets::U64(a) => a.len(),
        } as u64)
            .saturating_sub(1)
    }

    /// Number of stored arcs.
    pub fn num_arcs(&self) -> u64 {
        match &self.indices {
            Ids::U32(a) => a.len() as u64,
            Ids::U64(a) => a.len() as u64,
        }
    }

    /// Runs `v` on the concrete arrays.
    pub fn visit<V: CsrVisitor>(&self, v: V) -> V::Output {
        match (&self.indptr, &self.indices) {
            (Offsets::U32(p), Ids::U32(i)) => v.visit(&p[..], &i[..]),
            (Offsets::U32(p), Ids::U64(i)) => v.visit(&p[..], &i[..]),
            (Offsets::U64(p), Ids::U32(i)) => v.visit(&p[..], &i[..]),
            (Offsets::U64(p), Ids::U64(i)) => v.visit(&p[..], &i[..]),
        }
    }

    /// Start and end offsets of row `v`.
    pub fn row_range(&self, v: u64) -> (u64, u64) {
        let v = v as usize;
        match &self.indptr {
            Offsets::U32(p) => (p[v] as u64, p[v + 1] as u64),
            Offsets::U64(p) => (p[v], p[v + 1]),
        }
    }

    /// The stored neighbour list of `v` (in-neighbours for CSC, out-neighbours for CSR).
    /// Panics if `v` is out of range or the offsets are damaged (run `verify` first on untrusted
    /// data).
    pub fn row(&self, v: u64) -> Row<'_> {
        let (a, b) = self.row_range(v);
        let (a, b) = (a as usize, b as usize);
        match &self.indices {
            Ids::U32(i) => Row::U32(&i[a..b]),
            Ids::U64(i) => Row::U64(&i[a..b]),
        }
    }

    /// Length of every stored row (in-degree for CSC, out-degree for CSR).
    pub fn row_lengths(&self) -> Vec<u64> {
        struct V;
        impl CsrVisitor for V {
            type Output = Vec<u64>;
            fn visit<O: Offset, I: VertexId>(self, p: &[O], _: &[I]) -> Vec<u64> {
                p.par_windows(2)
                    .map(|w| w[1].into() - w[0].into())
                    .collect()
            }
        }
        self.visit(V)
    }

    /// The longest stored row's length (0 without vertices), in one pass over the offsets
    /// that allocates nothing.
    pub fn max_row_length(&self) -> u64 {
        struct V;
        impl CsrVisitor for V {
            type Output = u64;
            fn visit<O: Offset, I: VertexId>(self, p: &[O], _: &[I]) -> u64 {
                p.par_windows(2)
                    .map(|w| w[1].into() - w[0].into())
                    .max()
                    .unwrap_or(0)
            }
        }
        self.visit(V)
    }

    /// How often each vertex appears in `indices` (out-degree for CSC, in-degree for CSR).
    /// Ids out of range are ignored (verify reports them).
    pub fn column_counts(&self) -> Vec<u64> {
        struct V(usize);
        impl CsrVisitor for V {
            type Output = Vec<u64>;
            fn visit<O: Offset, I: VertexId>(self, _: &[O], idx: &[I]) -> Vec<u64> {
                let n = self.0;
                idx.par_chunks(1 << 22)
                    .fold(
                        || vec![0u64; n],
                        |mut acc, chunk| {
                            for &v in chunk {
                                if let Some(c) = acc.get_mut(v.idx()) {
                                    *c += 1;
                                }
                            }
                            acc
                        },
                    )
                    .reduce_with(|mut a, b| {
                        a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                        a
                    })
                    .unwrap_or_else(|| vec![0u64; n])
            }
        }
        self.visit(V(self.num_nodes() as usize))
    }

    /// In-degree of every vertex (number of arcs into it), whatever the layout.
    pub fn in_degrees(&self) -> Vec<u64> {
        match self.layout {
            Layout::Csc => self.row_lengths(),
            Layout::Csr => self.column_counts(),
        }
    }

    /// Out-degree of every vertex (number of arcs out of it), whatever the layout.
    pub fn out_degrees(&self) -> Vec<u64> {
        match self.layout {
            Layout::Csc => self.column_counts(),
            Layout::Csr => self.row_lengths(),
        }
    }
}

/// `feat.bin`, in the stored element type.
#[derive(Debug)]
pub enum FeatData {
    F32(Array<f32>),
    F16(Array<f16>),
}

/// Vertex features: `num_rows` rows of `dim` values, row-major.
#[derive(Debug)]
pub struct Features {
    pub dim: usize,
    pub data: FeatData,
}

impl Features {
    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        if self.dim == 0 {
            return 0;
        }
        match &self.data {
            FeatData::F32(a) => a.len() / self.dim,
            FeatData::F16(a) => a.len() / self.dim,
        }
    }

    /// Stored element type.
    pub fn dtype(&self) -> FeatDtype {
        match self.data {
            FeatData::F32(_) => FeatDtype::F32,
            FeatData::F16(_) => FeatDtype::F16,
        }
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        self.dim * self.dtype().size()
    }

    /// Whether the rows are read from a huge-page copy ([`Dataset::make_features_resident`]).
    pub fn is_resident(&self) -> bool {
        match &self.data {
            FeatData::F32(a) => a.is_resident(),
            FeatData::F16(a) => a.is_resident(),
        }
    }

    /// Copies row `v` into `out` (length `dim`), converting to f32.
    pub fn copy_row(&self, v: usize, out: &mut [f32]) {
        let d = self.dim;
        match &self.data {
            FeatData::F32(a) => out.copy_from_slice(&a[v * d..(v + 1) * d]),
            FeatData::F16(a) => {
                // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and the conversion only
                // writes (initialised values) through the view.
                let out = unsafe { &mut *(out as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) };
                RowOps::new().convert_f16(&a[v * d..(v + 1) * d], out)
            }
        }
    }

    /// Replaces `out`'s contents with the rows `ids` (`ids.len() * dim` values, converted to
    /// f32, each row as [`Features::copy_row`] writes it), gathered in parallel straight into
    /// `out`'s memory (no zero-fill first), prefetching the rows a few ids ahead.
    pub fn gather_into(&self, ids: &[u32], out: &mut Vec<f32>) {
        let d = self.dim;
        let len = ids.len() * d;
        out.clear();
        out.reserve(len);
        if d == 0 {
            return;
        }
        let ops = RowOps::new();
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(d)
            .zip(ids.par_iter())
            .enumerate()
            .for_each(|(i, (o, &v))| {
                if let Some(&ahead) = ids.get(i + GATHER_PREFETCH_AHEAD) {
                    self.prefetch_row(ahead as usize);
                }
                let v = v as usize;
                match &self.data {
                    FeatData::F32(a) => {
                        for (o, &x) in o.iter_mut().zip(&a[v * d..(v + 1) * d]) {
                            o.write(x);
                        }
                    }
                    FeatData::F16(a) => ops.convert_f16(&a[v * d..(v + 1) * d], o),
                }
            });
        // SAFETY: the `ids.len()` chunks of `d` elements cover all `len` elements, and each
        // chunk was zipped with a stored row of exactly `d` values (the slice index panics
        // otherwise, before `set_len`), so every element was written.
        unsafe { out.set_len(len) };
    }

    /// Replaces `out`'s contents with the aggregated rows of a block read straight from the
    /// store: row `d` (for each of the `indptr.len() - 1` destinations) is the sum over the
    /// block's edges `e` into `d` of `coeff[e] * row(ids[indices[e]])` (plain sum without
    /// `coeff`), added edge by edge in order from zero, which is how the compute layer's
    /// aggregation adds the rows of a gathered matrix, so the result is bit-identical to
    /// gathering `ids` and aggregating them. Saves writing and reading back the block's whole
    /// source matrix when only the aggregate is needed. f16 rows are converted to f32 (exactly)
    /// as they are added, with the same roundings as f32 rows, so the result is also that of
    /// [`Features::gather_into`] followed by the aggregation, from half the bytes read.
    /// Panics if an index or id is out of range (callers check ids first).
    pub fn aggregate_into(
        &self,
        ids: &[u32],
        indptr: &[u32],
        indices: &[u32],
        coeff: Option<&[f32]>,
        out: &mut Vec<f32>,
    ) {
        let d = self.dim;
        out.clear();
        if d == 0 {
            return;
        }
        // One loop per storage type (the type is not tested per edge).
        let ops = RowOps::new();
        match &self.data {
            FeatData::F32(a) => self.add_rows(ids, indptr, indices, coeff, out, |o, v, w| {
                ops.add_f32(o, &a[v * d..(v + 1) * d], w)
            }),
            FeatData::F16(a) => self.add_rows(ids, indptr, indices, coeff, out, |o, v, w| {
                ops.add_f16(o, &a[v * d..(v + 1) * d], w)
            }),
        }
    }

    /// The loop of [`Features::aggregate_into`] into the empty `out` (`dim > 0`): every output
    /// row made by [`Features::add_row`], in parallel.
    fn add_rows<A>(
        &self,
        ids: &[u32],
        indptr: &[u32],
        indices: &[u32],
        coeff: Option<&[f32]>,
        out: &mut Vec<f32>,
        add: A,
    ) where
        A: Fn(&mut [f32], usize, Option<f32>) + Sync,
    {
        let d = self.dim;
        let len = indptr.len().saturating_sub(1) * d;
        let ops = RowOps::new();
        out.reserve(len);
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(d)
            .enumerate()
            .with_min_len((2048 / d).max(1))
            .for_each(|(r, o)| self.add_row(ids, indptr, indices, coeff, r, o, ops, &add));
        // SAFETY: the `rows` chunks of `d` elements cover all `len` elements and `add_row`
        // initialised each (a panic on a bad index unwinds before this line).
        unsafe { out.set_len(len) };
    }

    /// Output row `r` of [`Features::aggregate_into`] into `o` (`dim` floats, possibly
    /// uninitialised): zeroed, then `add(row, v, coeff)` for each of its edges in order, `v`
    /// the stored row, fetching later edges' rows ahead.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn add_row<A>(
        &self,
        ids: &[u32],
        indptr: &[u32],
        indices: &[u32],
        coeff: Option<&[f32]>,
        r: usize,
        o: &mut [std::mem::MaybeUninit<f32>],
        ops: RowOps,
        add: &A,
    ) where
        A: Fn(&mut [f32], usize, Option<f32>),
    {
        let (lo, hi) = (indptr[r] as usize, indptr[r + 1] as usize);
        if let (FeatData::F32(a), true) = (&self.data, ops.sums_in_registers()) {
            // The same sums, kept in registers across the edges (`add` is `add_f32` here).
            return ops.sum_f32(o, a, ids, indices, coeff, lo..hi);
        }
        // Zeroed here, in cache, rather than in a separate pass over the output.
        o.fill(std::mem::MaybeUninit::new(0.0));
        // SAFETY: every element was just initialised; `MaybeUninit<f32>` has the layout of
        // `f32`.
        let o = unsafe { &mut *(o as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) };
        for e in lo..hi {
            self.fetch_ahead(ids, indices, e);
            add(o, ids[indices[e] as usize] as usize, coeff.map(|c| c[e]));
        }
    }

    /// Before edge `e`'s row is read: fetches the row of the edge [`GATHER_PREFETCH_AHEAD`]
    /// later, and, two levels ahead, the id of a later edge's source (a random read of
    /// `ids`) first, so the row prefetch that needs it does not wait.
    #[inline(always)]
    fn fetch_ahead(&self, ids: &[u32], indices: &[u32], e: usize) {
        if let Some(&later) = indices.get(e + 2 * GATHER_PREFETCH_AHEAD) {
            prefetch_line(ids.as_ptr().wrapping_add(later as usize).cast());
        }
        if let Some(&ahead) = indices.get(e + GATHER_PREFETCH_AHEAD) {
            self.prefetch_row(ids[ahead as usize] as usize);
        }
    }

    /// The fraction of non-zero values in `rows` stored rows spread evenly over the store (all
    /// rows when there are fewer): how dense the features are, for choosing a dense kernel or
    /// one that skips zeros. 1 for a store without values.
    pub fn nonzero_fraction(&self, rows: usize) -> f64 {
        let (n, d) = (self.num_rows(), self.dim);
        let take = rows.min(n);
        if take == 0 || d == 0 {
            return 1.0;
        }
        let nonzero: usize = (0..take)
            .map(|i| {
                let v = i * n / take;
                match &self.data {
                    FeatData::F32(a) => a[v * d..(v + 1) * d].iter().filter(|x| **x != 0.0).count(),
                    FeatData::F16(a) => a[v * d..(v + 1) * d]
                        .iter()
                        .filter(|x| x.to_f32() != 0.0)
                        .count(),
                }
            })
            .sum();
        nonzero as f64 / (take * d) as f64
    }

    /// Output rows `rows` of [`Features::aggregate_into`] (same arguments), written into
    /// `out` (`rows.len() * dim` floats, possibly uninitialised) on the calling thread: the
    /// same bits as those rows there. For a consumer that makes the aggregate a few rows at a
    /// time (the first layer's product, fetching the rows [`Features::stored_rows`] names
    /// meanwhile). Panics if `out` has the wrong length or an index or id is out of range.
    pub fn aggregate_rows(
        &self,
        ids: &[u32],
        indptr: &[u32],
        indices: &[u32],
        coeff: Option<&[f32]>,
        rows: std::ops::Range<usize>,
        out: &mut [std::mem::MaybeUninit<f32>],
    ) {
        let d = self.dim;
        assert_eq!(
            out.len(),
            rows.len() * d,
            "aggregate_rows: wrong output length"
        );
        if d == 0 {
            return;
        }
        let ops = RowOps::new();
        for (r, o) in rows.zip(out.chunks_exact_mut(d)) {
            match &self.data {
                FeatData::F32(a) => {
                    self.add_row(ids, indptr, indices, coeff, r, o, ops, &|o, v, w| {
                        ops.add_f32(o, &a[v * d..(v + 1) * d], w)
                    })
                }
                FeatData::F16(a) => {
                    self.add_row(ids, indptr, indices, coeff, r, o, ops, &|o, v, w| {
                        ops.add_f16(o, &a[v * d..(v + 1) * d], w)
                    })
                }
            }
        }
    }

    /// Appends to `out` the address of each stored row that output rows `rows` of
    /// [`Features::aggregate_into`] read, in order (for prefetching; [`Features::row_bytes`]
    /// long each). Ids out of range are skipped. Panics if an index is out of range.
    pub fn stored_rows(
        &self,
        ids: &[u32],
        indptr: &[u32],
        indices: &[u32],
        rows: std::ops::Range<usize>,
        out: &mut Vec<usize>,
    ) {
        let (lo, hi) = (indptr[rows.start] as usize, indptr[rows.end] as usize);
        let (base, bytes) = match &self.data {
            FeatData::F32(a) => (a.as_ptr() as usize, std::mem::size_of_val(&a[..])),
            FeatData::F16(a) => (a.as_ptr() as usize, std::mem::size_of_val(&a[..])),
        };
        let row = self.row_bytes();
        out.extend(indices[lo..hi].iter().filter_map(|&i| {
            let at = ids[i as usize] as usize * row;
            (at < bytes).then_some(base + at)
        }));
    }

    /// Hints the CPU to load stored row `v` (each 64-byte line) without waiting: rows are read
    /// in random order, so a gather is bound by memory latency (about 170 ns per 400-byte row
    /// on one core) unless the next rows' misses overlap the current copy. Fanout-compute's
    /// sparse kernels do the same on their source rows (`cpu::rows::prefetch_row`); each crate
    /// keeps its own few lines rather than depending on the other. The lines go to L2
    /// (`PREFETCHT1`), not L1: a core tracks only a few dozen misses into L1 at once, and
    /// prefetching 8 rows of 16 lines into it stalled on that limit (`PREFETCHT0` made a
    /// first-layer aggregation from the store half as fast on one core of the 2-core VM's
    /// EPYC). No-op off x86-64 and for ids out of range.
    #[inline(always)]
    fn prefetch_row(&self, v: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            let d = self.dim;
            let (p, bytes): (*const i8, usize) = match &self.data {
                FeatData::F32(a) => match a.get(v * d..(v + 1) * d) {
                    Some(r) => (r.as_ptr().cast(), std::mem::size_of_val(r)),
                    None => return,
                },
                FeatData::F16(a) => match a.get(v * d..(v + 1) * d) {
                    Some(r) => (r.as_ptr().cast(), std::mem::size_of_val(r)),
                    None => return,
                },
            };
            let mut off = 0;
            while off < bytes {
                // SAFETY: a prefetch never faults and reads nothing architecturally; the
                // address is inside the row.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(off)) };
                off += 64;
            }
            if bytes > 0 {
                // The last line, when the row does not start on a line boundary.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(bytes - 1)) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = v;
    }
}

/// Rows ahead of the current one that [`Features::gather_into`] prefetches.
const GATHER_PREFETCH_AHEAD: usize = 8;

/// Hints the CPU to load the line at `p` into L1 (`PREFETCHT0`); no-op off x86-64. A prefetch
/// never faults, so `p` may point anywhere.
#[inline(always)]
fn prefetch_line(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// An opened dataset. Fields are public for read access; the struct is immutable after open.
#[derive(Debug)]
pub struct Dataset {
    /// Where it was opened from.
    pub dir: PathBuf,
    pub meta: Meta,
    pub topology: Topology,
    /// `None` when `feat.bin` is absent (GNNLab datasets without features) or FEAT_DIM is 0.
    pub features: Option<Features>,
    /// `None` when `label.bin` is absent. -1 marks an unlabelled vertex.
    pub labels: Option<Array<i64>>,
    pub train: Array<u32>,
    pub valid: Array<u32>,
    pub test: Array<u32>,
    /// How open established that every neighbour id is in range (scanned now, or remembered
    /// from an earlier scan of the same files).
    pub id_check: IdCheck,
    /// Keeps a temporary directory alive for datasets created with `DatasetWriter::temporary`.
    pub(crate) _keep: Option<Arc<tempfile::TempDir>>,
}

fn exists(p: &Path) -> bool {
    p.try_exists().unwrap_or(false)
}

/// Checks that `indptr` starts at 0, never decreases and ends at NUM_EDGE (`e`); the error
/// names `path`, the first bad entry and what was expected.
fn check_offsets<O: Offset>(path: &Path, p: &[O], e: u64) -> Result<()> {
    let first = p.first().map_or(0, |&x| x.into());
    if first != 0 {
        return Err(Error::format(
            path,
            format!("entry 0 is {first}, expected 0 (offsets start at 0)"),
        ));
    }
    if let Some(i) = p
        .par_windows(2)
        .position_first(|w| w[1].into() < w[0].into())
    {
        let (a, b): (u64, u64) = (p[i].into(), p[i + 1].into());
        return Err(Error::format(
            path,
            format!(
                "entry {}: {b} after {a}; offsets must not decrease (row {i} would have a \
                 negative length)",
                i + 1
            ),
        ));
    }
    let last = p.last().map_or(0, |&x| x.into());
    if last != e {
        return Err(Error::format(
            path,
            format!(
                "last entry ({}) is {last}, expected NUM_EDGE = {e}",
                p.len().saturating_sub(1)
            ),
        ));
    }
    Ok(())
}

impl Dataset {
    /// Opens the dataset in `dir`. Errors name the file, the entry and what was expected.
    /// Guarantees on success: every file has the size meta.txt implies; the offsets start at 0,
    /// never decrease and end at NUM_EDGE; every neighbour id and split id is below NUM_NODE,
    /// and no split lists a vertex twice; every label is -1 or below NUM_CLASS. Feature values
    /// are not scanned.
    pub fn open(dir: impl AsRef<Path>) -> Result<Dataset> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(Error::Invalid(format!(
                "{}: not a dataset directory (expected a folder holding meta.txt, indptr.bin, indices.bin, ...)",
                dir.display()
            )));
        }
        let meta = Meta::read(&dir.join(files::META))?;
        let n = meta.num_node;
        let e = meta.num_edge;

        let p64 = dir.join(files::INDPTR64);
        let indptr = if exists(&p64) {
            Offsets::U64(Array::map(&p64, n + 1, "NUM_NODE + 1")?)
        } else if meta.wide_offsets() {
            return Err(Error::format(
                &p64,
                format!("missing: NUM_EDGE = {e} >= 2^32 needs 64-bit offsets"),
            ));
        } else {
            Offsets::U32(Array::map(&dir.join(files::INDPTR), n + 1, "NUM_NODE + 1")?)
        };
        // O(NUM_NODE) and cheap: a damaged offset array would otherwise surface as an
        // out-of-bounds row deep inside a sampler.
        match &indptr {
            Offsets::U32(p) => check_offsets(&dir.join(files::INDPTR), p, e)?,
            Offsets::U64(p) => check_offsets(&p64, p, e)?,
        }
        let i64p = dir.join(files::INDICES64);
        let indices = if exists(&i64p) {
            Ids::U64(Array::map(&i64p, e, "NUM_EDGE")?)
        } else if meta.wide_ids() {
            return Err(Error::format(
                &i64p,
                format!("missing: NUM_NODE = {n} >= 2^32 needs 64-bit ids"),
            ));
        } else {
            Ids::U32(Array::map(&dir.join(files::INDICES), e, "NUM_EDGE")?)
        };

        let fp = dir.join(files::FEAT);
        let features = if meta.feat_dim > 0 && exists(&fp) {
            let len = n.checked_mul(meta.feat_dim).ok_or_else(|| {
                Error::format(dir.join(files::META), "NUM_NODE x FEAT_DIM overflows")
            })?;
            let what = "NUM_NODE x FEAT_DIM";
            let data = match meta.feat_dtype {
                FeatDtype::F32 => FeatData::F32(Array::map(&fp, len, what)?),
                FeatDtype::F16 => FeatData::F16(Array::map(&fp, len, what)?),
            };
            Some(Features {
                dim: meta.feat_dim as usize,
                data,
            })
        } else {
            None
        };

        let lp = dir.join(files::LABEL);
        let labels = if exists(&lp) {
            Some(Array::map(&lp, n, "NUM_NODE")?)
        } else {
            None
        };

        let split = |file: &str, count: u64, key: &str| -> Result<Array<u32>> {
            let p = dir.join(file);
            if count == 0 && !exists(&p) {
                return Ok(Array::from_vec(Vec::new()));
            }
            Array::map(&p, count, key)
        };
        let train = split(files::TRAIN, meta.num_train_set, "NUM_TRAIN_SET")?;
        let valid = split(files::VALID, meta.num_valid_set, "NUM_VALID_SET")?;
        let test = split(files::TEST, meta.num_test_set, "NUM_TEST_SET")?;

        // Contents that would otherwise fail far from their cause: O(NUM_NODE) ones always,
        // the O(NUM_EDGE) id scan once per content of indices.bin and meta.txt.
        if let Some(l) = &labels {
            checks::check_labels(&lp, l, meta.num_class)?;
        }
        for (file, a) in [
            (files::TRAIN, &train),
            (files::VALID, &valid),
            (files::TEST, &test),
        ] {
            checks::check_split(&dir.join(file), a, n)?;
        }
        let id_check = checks::check_ids_remembered(dir, &indptr, &indices, n)?;

        Ok(Dataset {
            dir: dir.to_path_buf(),
            topology: Topology {
                layout: meta.layout,
                indptr,
                indices,
            },
            features,
            labels,
            train,
            valid,
            test,
            id_check,
            meta,
            _keep: None,
        })
    }

    /// The part boundaries in [`files::PART_OFFSETS`], or `None` when the dataset has none
    /// (it was not written by a METIS partition). Errors name the file and what is wrong: not
    /// a whole number of u64, fewer than two, not starting at 0, decreasing, or not ending at
    /// `NUM_NODE`.
    pub fn part_offsets(&self) -> Result<Option<Vec<u64>>> {
        let path = self.dir.join(files::PART_OFFSETS);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, "read", e)),
        };
        let bad = |what: String| Err(Error::Invalid(format!("{}: {what}", path.display())));
        if !bytes.len().is_multiple_of(8) || bytes.len() < 16 {
            return bad(format!(
                "{} bytes; expected at least two u64 boundaries (8 bytes each)",
                bytes.len()
            ));
        }
        let offsets: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let n = self.num_nodes();
        if offsets[0] != 0 || offsets.windows(2).any(|w| w[0] > w[1]) {
            return bad(format!(
                "boundaries {offsets:?}; expected non-decreasing values starting at 0"
            ));
        }
        if offsets[offsets.len() - 1] != n {
            return bad(format!(
                "the last boundary is {}; expected NUM_NODE = {n}",
                offsets[offsets.len() - 1]
            ));
        }
        Ok(Some(offsets))
    }

    /// Number of vertices.
    pub fn num_nodes(&self) -> u64 {
        self.meta.num_node
    }

    /// Replaces memory-mapped features by a private copy in huge-page memory
    /// ([`Array::resident_from`]) when `policy` wants one: [`Residency::Auto`] copies when
    /// they take at most a quarter of the available memory (and at most 16 GiB), the rule
    /// samplers use for the topology; [`Residency::Resident`] always; [`Residency::Mapped`]
    /// never. Returns whether it copied; features already in memory (generated datasets, an
    /// earlier call) stay as they are. Rows read afterwards are the same values, bit for bit.
    /// The copy reports a "copying features" phase in bytes to `progress`.
    ///
    /// Measured on the 2-core VM: a gather of 16,000 random 512-byte rows (cnr2000's
    /// features) took 1.48 ms from huge pages against 2.05 ms from the map (1.38x). In
    /// `fanout train` (GraphSAGE 10,25, batch 1024, 2 threads, 7 alternating runs) the
    /// products preset's median epoch went from 1.13 s to 1.06 s (per-run ratios 0.89-1.14,
    /// median 1.04x) and cnr2000's did not change measurably (median 1.05x, 0.87-1.23): the
    /// extract stage is off the critical path there, and the VM's run-to-run spread is 10%.
    ///
    /// # Errors
    /// When the anonymous memory cannot be mapped (the mapped features are kept).
    pub fn make_features_resident(
        &mut self,
        policy: Residency,
        progress: &dyn Progress,
    ) -> Result<bool> {
        let Some(f) = self.features.as_mut() else {
            return Ok(false);
        };
        let mapped = match &f.data {
            FeatData::F32(a) => a.is_mapped(),
            FeatData::F16(a) => a.is_mapped(),
        };
        let bytes = f.num_rows() as u64 * f.row_bytes() as u64;
        if !mapped || !policy.wants_copy(bytes) {
            return Ok(false);
        }
        let path = self.dir.join(files::FEAT);
        let copy_err = |e| Error::io(&path, "copy into huge-page memory", e);
        progress.phase("copying features", bytes, "bytes");
        let copied = match &f.data {
            FeatData::F32(a) => Array::resident_from(a, progress).map(FeatData::F32),
            FeatData::F16(a) => Array::resident_from(a, progress).map(FeatData::F16),
        };
        progress.finish_phase();
        f.data = copied.map_err(copy_err)?;
        Ok(true)
    }

    /// Number of stored arcs.
    pub fn num_arcs(&self) -> u64 {
        self.meta.num_edge
    }
}
