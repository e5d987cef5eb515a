//! The extract stage's interface: turn a mini-batch's input nodes into a feature matrix, and
//! account for where every byte came from. The trainer only ever talks to an [`Extractor`], so
//! caches and Match-Reorder slot in without touching it.

use fanout_graph::{Dataset, Error, Result};
use std::sync::Arc;

/// Where the bytes of one extraction came from. "Bytes" are bytes of stored feature rows (so a
/// cache hit on an f16 dataset counts `2 x dim` bytes). Invariant:
/// `bytes_total == bytes_from_cache + bytes_reused + bytes_from_host`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExtractStats {
    /// Rows extracted (`input_nodes.len()`).
    pub rows: u64,
    /// Bytes of all rows needed.
    pub bytes_total: u64,
    /// Bytes served by a device cache.
    pub bytes_from_cache: u64,
    /// Bytes reused from the previous mini-batch already on the device (Match-Reorder).
    pub bytes_reused: u64,
    /// Bytes gathered from the host feature store (what crosses PCIe on a GPU).
    pub bytes_from_host: u64,
}

impl ExtractStats {
    /// Adds another extraction's counts.
    pub fn add(&mut self, o: &ExtractStats) {
        self.rows += o.rows;
        self.bytes_total += o.bytes_total;
        self.bytes_from_cache += o.bytes_from_cache;
        self.bytes_reused += o.bytes_reused;
        self.bytes_from_host += o.bytes_from_host;
    }

    /// Fraction of bytes served without touching the host store (cache + reuse), 0 when empty.
    pub fn hit_rate(&self) -> f64 {
        if self.bytes_total == 0 {
            0.0
        } else {
            (self.bytes_from_cache + self.bytes_reused) as f64 / self.bytes_total as f64
        }
    }
}

/// A batch's input rows split between what the compute device holds (a cache, and with
/// Match the previous batch's rows) and the host, filled by [`Extractor::extract_split`]. The
/// device assembles the batch's feature matrix by gathering row `slots[i]` of its cache table
/// for every input row `i` (a row the cache does not hold names the table's extra row after
/// the cached ones), then placing the previous batch's rows `reused_from` at
/// `reused_positions` and the misses (uploaded, or read by the device in place from host
/// memory) at `miss_positions`. Every position is in exactly one of: a cache slot,
/// `reused_positions`, `miss_positions`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheSplit {
    /// Per input row, in input order: its cache slot, or the cache's length when the cache
    /// does not hold it.
    pub slots: Vec<u32>,
    /// Positions (in input order, ascending) of the rows the device holds neither in its cache
    /// nor from the previous batch: gathered on the host and uploaded, or read in place.
    pub miss_positions: Vec<u32>,
    /// Positions (ascending) of the rows reused from the previous split's batch (Match).
    pub reused_positions: Vec<u32>,
    /// For each of `reused_positions`, the row's position in the previous split's batch.
    pub reused_from: Vec<u32>,
    /// This split's number in its extractor's sequence (0, 1, ...): reused rows come from the
    /// batch of split `seq - 1`.
    pub seq: u64,
    /// Whether the next split may reuse this batch's rows (Match on): the device keeps them.
    pub keep: bool,
}

/// Gathers feature rows for mini-batches. Guarantee every implementation must keep: `out`
/// receives exactly the rows a plain gather from the dataset gives (converted to f32), bit for
/// bit, whatever is cached or reused. Implementations may keep state between calls (the
/// previous batch for Match-Reorder), hence `&mut self`; one extractor serves one stream of
/// batches.
pub trait Extractor: Send {
    /// Feature dimension.
    fn dim(&self) -> usize;
    /// Resizes `out` to `input_nodes.len() * dim()` and fills it with the rows of
    /// `input_nodes`, in order. Errors, before reading any row and leaving the extractor's
    /// state as it was, if an id is not a vertex of the dataset.
    fn extract(&mut self, input_nodes: &[u32], out: &mut Vec<f32>) -> Result<ExtractStats>;

    /// For a model whose first layer needs only its destinations' rows and their aggregate:
    /// fills `dst` with the rows of `input_nodes[..num_dst]` and `agg` with
    /// [`fanout_graph::Features::aggregate_into`] of the input block (`indptr`, `indices` over
    /// positions in `input_nodes`, per-edge `coeff`), without materialising the other rows.
    /// `None` where the extractor cannot (a cache or reuse serves rows from
    /// elsewhere): the caller then calls [`Extractor::extract`]. The default is `None`.
    /// Errors as [`Extractor::extract`].
    #[allow(clippy::too_many_arguments)]
    fn extract_aggregated(
        &mut self,
        _input_nodes: &[u32],
        _num_dst: usize,
        _indptr: &[u32],
        _indices: &[u32],
        _coeff: Option<&[f32]>,
        _dst: &mut Vec<f32>,
        _agg: &mut Vec<f32>,
    ) -> Option<Result<ExtractStats>> {
        None
    }

    /// For a trainer that aggregates block 0 where the rows are stored, inside its first
    /// product (`fanout_graph::Features::aggregate_rows`): gathers only the destinations' rows
    /// (the first `num_dst` input nodes) into `dst`, or none where `dst` is `None` (a layer
    /// that reads only the aggregate), checks the block as [`Extractor::extract_aggregated`]
    /// does, and returns the stats of the rows the trainer will read (the destinations' if
    /// gathered, and one per edge) and the dataset to read them from. `None` where the
    /// extractor cannot (the default). Errors as [`Extractor::extract`].
    fn extract_sourced(
        &mut self,
        _input_nodes: &[u32],
        _num_dst: usize,
        _indptr: &[u32],
        _indices: &[u32],
        _dst: Option<&mut Vec<f32>>,
    ) -> Option<Result<(ExtractStats, Arc<Dataset>)>> {
        None
    }

    /// For a trainer that keeps this extractor's cache (and, with Match, the previous batch's
    /// rows) on its device: fills `split` (see [`CacheSplit`]) and, when `misses` is given,
    /// `misses` with the rows of `miss_positions`, in order, each exactly as
    /// [`Extractor::extract`] would write it. With `misses` `None` no row is read: the device
    /// reads the missed rows itself (in place from host memory); the split is the same. The
    /// stats count cache, reused and host bytes as [`Extractor::extract`] does for the same
    /// sequence of batches, either way. `None` where the extractor has neither a cache nor
    /// Match (the default). Errors as [`Extractor::extract`]. Splits of one extractor must be
    /// assembled in the order they were made (each may reuse the one before).
    fn extract_split(
        &mut self,
        _input_nodes: &[u32],
        _split: &mut CacheSplit,
        _misses: Option<&mut Vec<f32>>,
    ) -> Option<Result<ExtractStats>> {
        None
    }

    /// The cached rows as f32, in slot order (`len x dim`; empty with Match alone), with room
    /// for one more row: the table a device keeps for [`Extractor::extract_split`]. `None`
    /// where that returns `None`.
    fn cache_rows(&self) -> Option<Vec<f32>> {
        None
    }
}

/// Checks that every id of `input_nodes` is a vertex of `ds` (one vectorised pass; the rows
/// are then read without a panic path).
pub(crate) fn check_input_nodes(ds: &Dataset, input_nodes: &[u32]) -> Result<()> {
    let n = ds.num_nodes();
    match fanout_graph::checks::first_at_least(input_nodes, n) {
        None => Ok(()),
        Some((i, v)) => Err(Error::Invalid(format!(
            "feature extraction of {}: input vertex {i} of the batch is {v}; expected a vertex id < NUM_NODE = {n}",
            ds.dir.display()
        ))),
    }
}

/// The plain path: every row gathered from the host store (no cache). The reference every
/// cached extractor is tested against.
pub struct PlainExtractor {
    ds: Arc<Dataset>,
}

impl PlainExtractor {
    /// An extractor over `ds`'s features; errors if the dataset has none.
    pub fn new(ds: Arc<Dataset>) -> Result<Self> {
        if ds.features.is_none() {
            return Err(Error::Invalid(format!(
                "{}: the dataset has no features (feat.bin absent or FEAT_DIM 0); import it with --random-features DIM",
                ds.dir.display()
            )));
        }
        Ok(PlainExtractor { ds })
    }
}

impl Extractor for PlainExtractor {
    fn dim(&self) -> usize {
        self.ds.features.as_ref().map_or(0, |f| f.dim)
    }

    fn extract(&mut self, input_nodes: &[u32], out: &mut Vec<f32>) -> Result<ExtractStats> {
        check_input_nodes(&self.ds, input_nodes)?;
        let f = self.ds.features.as_ref().expect("checked in new");
        f.gather_into(input_nodes, out);
        let bytes = (input_nodes.len() * f.row_bytes()) as u64;
        Ok(ExtractStats {
            rows: input_nodes.len() as u64,
            bytes_total: bytes,
            bytes_from_host: bytes,
            ..ExtractStats::default()
        })
    }

    fn extract_aggregated(
        &mut self,
        input_nodes: &[u32],
        num_dst: usize,
        indptr: &[u32],
        indices: &[u32],
        coeff: Option<&[f32]>,
        dst: &mut Vec<f32>,
        agg: &mut Vec<f32>,
    ) -> Option<Result<ExtractStats>> {
        let stats = match self.extract_sourced(input_nodes, num_dst, indptr, indices, Some(dst))? {
            Ok((stats, _)) => stats,
            // The block is not aggregated: its ids or offsets are out of range.
            Err(e) => return Some(Err(e)),
        };
        if coeff.is_some_and(|c| c.len() != indices.len()) {
            return Some(Err(Error::Invalid(format!(
                "feature aggregation: {} coefficients for {} edges",
                coeff.map_or(0, <[f32]>::len),
                indices.len()
            ))));
        }
        let f = self.ds.features.as_ref().expect("checked in new");
        f.aggregate_into(input_nodes, indptr, indices, coeff, agg);
        Some(Ok(stats))
    }

    fn extract_sourced(
        &mut self,
        input_nodes: &[u32],
        num_dst: usize,
        indptr: &[u32],
        indices: &[u32],
        dst: Option<&mut Vec<f32>>,
    ) -> Option<Result<(ExtractStats, Arc<Dataset>)>> {
        let f = self.ds.features.as_ref().expect("checked in new");
        if num_dst > input_nodes.len() {
            return None;
        }
        if let Err(e) = check_input_nodes(&self.ds, input_nodes) {
            return Some(Err(e));
        }
        if indices.iter().any(|&i| i as usize >= input_nodes.len())
            || indptr.len() != num_dst + 1
            || indptr.windows(2).any(|w| w[0] > w[1])
            || indptr.last().is_some_and(|&e| e as usize != indices.len())
        {
            return Some(Err(Error::Invalid(format!(
                "feature aggregation: a block of {num_dst} destinations over {} input nodes \
                 has an edge to no input node, or offsets of the wrong length or order",
                input_nodes.len()
            ))));
        }
        // Rows read from the store: the destinations' (where gathered) and one per edge.
        let mut rows = indices.len() as u64;
        if let Some(dst) = dst {
            f.gather_into(&input_nodes[..num_dst], dst);
            rows += num_dst as u64;
        }
        let bytes = rows * f.row_bytes() as u64;
        let stats = ExtractStats {
            rows,
            bytes_total: bytes,
            bytes_from_host: bytes,
            ..ExtractStats::default()
        };
        Some(Ok((stats, self.ds.clone())))
    }
}
