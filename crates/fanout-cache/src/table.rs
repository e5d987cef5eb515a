//! The device feature cache: a byte budget turned into a row count, a vertex -> slot table and
//! the cached rows themselves, kept in the stored element type (f32 or f16) so that the budget
//! counts what a device would hold.
//!
//! On the CPU backend the "device" is host memory: the byte counts are exact, the speed-up is
//! not (a hit is a copy from one host buffer instead of another).

use fanout_graph::{f16, Error, FeatData, Features, Result};
use rayon::prelude::*;

/// Slot value of a vertex that is not cached.
pub const NO_SLOT: u32 = u32::MAX;

/// PaGraph's slack kept free on the device besides the trial batch's peak (1 GiB).
pub const PAGRAPH_SLACK: u64 = 1 << 30;

/// How large a cache is. Guarantee of [`CacheSize::rows`]: never more rows than the graph has.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub enum CacheSize {
    /// alpha = cached rows / |V| of the whole graph (NOTES.md), in [0, 1].
    Ratio(f64),
    /// A byte budget for cached rows (stored bytes: `dim x 4` per f32 row, `dim x 2` per f16).
    Bytes(u64),
    /// An explicit row count.
    Rows(usize),
}

impl CacheSize {
    /// Cached rows for a graph of `num_nodes` vertices with `row_bytes` bytes per stored row:
    /// `floor(alpha x |V|)`, `floor(bytes / row_bytes)` or the row count, clamped to `num_nodes`.
    pub fn rows(&self, num_nodes: usize, row_bytes: usize) -> usize {
        let r = match *self {
            CacheSize::Ratio(a) => (a.clamp(0.0, 1.0) * num_nodes as f64).floor() as usize,
            CacheSize::Bytes(b) => (b / row_bytes.max(1) as u64).min(usize::MAX as u64) as usize,
            CacheSize::Rows(r) => r,
        };
        r.min(num_nodes)
    }

    /// Parses a size from the command line: a ratio (`0.1`, `10%`) or a byte budget with a unit
    /// (`512MiB`, `2GB`, `4096B`; K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti powers of 1024).
    /// Errors on anything else, and on ratios outside [0, 1].
    pub fn parse(s: &str) -> std::result::Result<CacheSize, String> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let a: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("bad percentage {s:?}"))?;
            return ratio(a / 100.0, s);
        }
        if let Ok(a) = t.parse::<f64>() {
            return ratio(a, s);
        }
        match parse_bytes_with_unit(t) {
            Some(Ok(b)) => Ok(CacheSize::Bytes(b)),
            Some(Err(())) => Err(format!("bad byte size {s:?}")),
            None => Err(format!(
                "cache size {s:?}: expected a ratio of |V| (0.1 or 10%) or bytes (512MiB, 2GB)"
            )),
        }
    }
}

/// Byte units: K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti powers of 1024, B is one byte.
const UNITS: [(&str, u64); 9] = [
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("B", 1),
];

/// `None` without a unit suffix; `Some(Err)` with a unit but no valid non-negative number.
fn parse_bytes_with_unit(t: &str) -> Option<Result<u64, ()>> {
    for (u, m) in UNITS {
        if let Some(n) = t.strip_suffix(u) {
            let x: f64 = match n.trim().parse() {
                Ok(x) => x,
                Err(_) => return Some(Err(())),
            };
            if !(x >= 0.0 && x.is_finite()) {
                return Some(Err(()));
            }
            return Some(Ok((x * m as f64) as u64));
        }
    }
    None
}

/// Parses a byte count: a number with a unit as [`CacheSize::parse`] takes them (`64MiB`,
/// `2GB`, `1.5GiB`, `4096B`) or a plain non-negative integer of bytes. Errors on anything else.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    if let Ok(b) = t.parse::<u64>() {
        return Ok(b);
    }
    match parse_bytes_with_unit(t) {
        Some(Ok(b)) => Ok(b),
        _ => Err(format!(
            "{s:?}: expected bytes with a unit (64MiB, 2GiB, 8GB) or a whole number of bytes"
        )),
    }
}

/// What `--cache-ratio` asks for: a size set by hand, or PaGraph's automatic size (`auto`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheSizeSpec {
    /// A ratio, bytes or rows set by hand.
    Fixed(CacheSize),
    /// Sized from the device memory left after a trial batch ([`auto_cache_size`]).
    Auto,
}

impl CacheSizeSpec {
    /// `auto` (any case), else [`CacheSize::parse`].
    pub fn parse(s: &str) -> std::result::Result<CacheSizeSpec, String> {
        if s.trim().eq_ignore_ascii_case("auto") {
            Ok(CacheSizeSpec::Auto)
        } else {
            CacheSize::parse(s).map(CacheSizeSpec::Fixed)
        }
    }
}

/// Safety margin of the automatic size: PaGraph's 1 GiB of slack ([`PAGRAPH_SLACK`]), but at
/// most 1/16 of the device memory, so that small budgets (tests, small GPUs) are not swallowed
/// by it: `min(1 GiB, device_memory / 16)`. It covers what the trial batch does not show:
/// allocator fragmentation, batches larger than the trial's, kernels' workspace.
pub fn auto_margin(device_memory: u64) -> u64 {
    (device_memory / 16).min(PAGRAPH_SLACK)
}

/// The figures of an automatic cache size (all bytes except `rows`), for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AutoSize {
    /// Device memory budget.
    pub device_memory: u64,
    /// Peak memory of the trial batch (model state included).
    pub trial_peak: u64,
    /// Batches queued in the pipeline besides the one trained (PaGraph's prefetch buffers).
    pub prefetch_buffers: u64,
    /// Safety margin ([`auto_margin`]).
    pub margin: u64,
    /// Bytes left for the cache: `device_memory - trial_peak - prefetch_buffers - margin`,
    /// at least 0 ([`pagraph_budget`]).
    pub budget: u64,
    /// Cached rows: `floor(budget / row_bytes)`, clamped to `[0, |V|]`.
    pub rows: usize,
}

/// PaGraph's automatic cache size. Guarantees: `rows = min(|V|, floor(budget / row_bytes))`
/// with `budget = max(0, device_memory - trial_peak - prefetch_buffers - auto_margin(device_memory))`;
/// a budget that cannot hold the trial batch itself (`device_memory < trial_peak`) is an
/// error, since training would not fit; one that holds the batch but leaves nothing for the
/// cache gives 0 rows.
pub fn auto_cache_size(
    device_memory: u64,
    trial_peak: u64,
    prefetch_buffers: u64,
    num_nodes: usize,
    row_bytes: usize,
) -> std::result::Result<AutoSize, String> {
    if device_memory < trial_peak {
        return Err(format!(
            "device memory {device_memory} bytes is smaller than the trial batch's peak \
             {trial_peak} bytes: one training step does not fit, so no cache can be sized"
        ));
    }
    let margin = auto_margin(device_memory);
    let budget = pagraph_budget(device_memory, trial_peak, margin, prefetch_buffers);
    Ok(AutoSize {
        device_memory,
        trial_peak,
        prefetch_buffers,
        margin,
        budget,
        rows: CacheSize::Bytes(budget).rows(num_nodes, row_bytes),
    })
}

fn ratio(a: f64, s: &str) -> std::result::Result<CacheSize, String> {
    if (0.0..=1.0).contains(&a) {
        Ok(CacheSize::Ratio(a))
    } else {
        Err(format!("cache ratio {s:?} is not within [0, 1]"))
    }
}

/// PaGraph's cache budget: device memory left after a trial mini-batch's peak use, minus slack
/// and prefetch buffers (saturating at 0). Pass the result as [`CacheSize::Bytes`].
pub fn pagraph_budget(
    device_total: u64,
    trial_peak: u64,
    slack: u64,
    prefetch_buffers: u64,
) -> u64 {
    device_total
        .saturating_sub(trial_peak)
        .saturating_sub(slack)
        .saturating_sub(prefetch_buffers)
}

/// Cached rows in the stored element type.
enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// A static feature cache. Guarantees: a vertex has a slot iff it was in the list it was built
/// from; [`FeatureCache::copy_row`] writes exactly what `Features::copy_row` writes for that
/// vertex (same stored values, same f16 -> f32 conversion); [`FeatureCache::bytes`] is the
/// memory of the cached rows (`len x row_bytes`).
pub struct FeatureCache {
    slot: Vec<u32>,
    rows: Rows,
    vertices: Vec<u32>,
    dim: usize,
    row_bytes: usize,
}

impl FeatureCache {
    /// Loads the rows of `vertices` (distinct, in range; slot `i` holds `vertices[i]`).
    /// Errors on a repeated or out-of-range vertex.
    pub fn build(features: &Features, vertices: &[u32]) -> Result<FeatureCache> {
        let n = features.num_rows();
        let mut slot = vec![NO_SLOT; n];
        for (i, &v) in vertices.iter().enumerate() {
            let s = slot.get_mut(v as usize).ok_or_else(|| {
                Error::Invalid(format!("cache: vertex {v} out of range ({n} rows)"))
            })?;
            if *s != NO_SLOT {
                return Err(Error::Invalid(format!("cache: vertex {v} listed twice")));
            }
            *s = i as u32;
        }
        let d = features.dim;
        let rows = match &features.data {
            FeatData::F32(a) => Rows::F32(load(a, vertices, d)),
            FeatData::F16(a) => Rows::F16(load(a, vertices, d)),
        };
        Ok(FeatureCache {
            slot,
            rows,
            vertices: vertices.to_vec(),
            dim: d,
            row_bytes: features.row_bytes(),
        })
    }

    /// The slot of `v`, or `None` when `v` is not cached (or out of range).
    #[inline]
    pub fn slot(&self, v: u32) -> Option<u32> {
        self.slot.get(v as usize).copied().filter(|&s| s != NO_SLOT)
    }

    /// Whether `v` is cached.
    #[inline]
    pub fn contains(&self, v: u32) -> bool {
        self.slot(v).is_some()
    }

    /// Writes cached row `slot` (from [`FeatureCache::slot`]) into `out` (length `dim`), as f32.
    #[inline]
    pub fn copy_row(&self, slot: u32, out: &mut [f32]) {
        let (d, s) = (self.dim, slot as usize);
        match &self.rows {
            Rows::F32(r) => out.copy_from_slice(&r[s * d..(s + 1) * d]),
            Rows::F16(r) => {
                for (o, x) in out.iter_mut().zip(&r[s * d..(s + 1) * d]) {
                    *o = x.to_f32();
                }
            }
        }
    }

    /// Every cached row as f32 (converted as [`FeatureCache::copy_row`] converts), in slot
    /// order: `len() x dim()` values, with room for one more row (a device's table appends
    /// one without moving them).
    pub fn rows_f32(&self) -> Vec<f32> {
        let d = self.dim;
        let mut out = Vec::with_capacity((self.len() + 1) * d);
        out.resize(self.len() * d, 0f32);
        if d > 0 {
            out.par_chunks_mut(d)
                .enumerate()
                .for_each(|(s, o)| self.copy_row(s as u32, o));
        }
        out
    }

    /// Cached vertices, in slot order.
    pub fn vertices(&self) -> &[u32] {
        &self.vertices
    }

    /// Number of cached rows.
    pub fn len(&self) -> usize {
        self.vertices.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.vertices.is_empty()
    }

    /// Feature dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Bytes of the cached rows (the device memory the cache takes, table excluded).
    pub fn bytes(&self) -> u64 {
        (self.len() * self.row_bytes) as u64
    }
}

fn load<T: Copy + Default + Send + Sync>(src: &[T], vertices: &[u32], d: usize) -> Vec<T> {
    let mut out = vec![T::default(); vertices.len() * d];
    if d > 0 {
        out.par_chunks_mut(d)
            .zip(vertices.par_iter())
            .for_each(|(o, &v)| o.copy_from_slice(&src[v as usize * d..(v as usize + 1) * d]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_clamp() {
        assert_eq!(CacheSize::parse("0.1"), Ok(CacheSize::Ratio(0.1)));
        assert_eq!(CacheSize::parse("5%"), Ok(CacheSize::Ratio(0.05)));
        assert_eq!(CacheSize::parse("2MiB"), Ok(CacheSize::Bytes(2 << 20)));
        assert_eq!(CacheSize::parse("1GB"), Ok(CacheSize::Bytes(1_000_000_000)));
        assert!(CacheSize::parse("1.5").is_err());
        assert!(CacheSize::parse("lots").is_err());
        assert_eq!(CacheSize::Ratio(0.1).rows(1005, 8), 100);
        assert_eq!(CacheSize::Bytes(1000).rows(1005, 512), 1);
        assert_eq!(CacheSize::Rows(5000).rows(1005, 8), 1005);
        assert_eq!(
            pagraph_budget(16 << 30, 4 << 30, PAGRAPH_SLACK, 0),
            11 << 30
        );
        assert_eq!(pagraph_budget(1, 4, 0, 0), 0);
    }

    #[test]
    fn byte_counts_and_auto_parse() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes(" 2GiB "), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5KB"), Ok(1500));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in ["", "-1MiB", "0.5", "lots", "MiB", "1e400GB", "auto"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(CacheSizeSpec::parse("auto"), Ok(CacheSizeSpec::Auto));
        assert_eq!(CacheSizeSpec::parse(" AUTO"), Ok(CacheSizeSpec::Auto));
        assert_eq!(
            CacheSizeSpec::parse("10%"),
            Ok(CacheSizeSpec::Fixed(CacheSize::Ratio(0.1)))
        );
        assert_eq!(
            CacheSizeSpec::parse("3MB"),
            Ok(CacheSizeSpec::Fixed(CacheSize::Bytes(3_000_000)))
        );
        assert!(CacheSizeSpec::parse("automatic").is_err());
    }

    #[test]
    fn auto_size_is_device_memory_less_peak_queue_and_margin() {
        // The margin is 1/16 of the budget below 16 GiB, PaGraph's 1 GiB above.
        assert_eq!(auto_margin(64 << 20), 4 << 20);
        assert_eq!(auto_margin(16 << 30), 1 << 30);
        assert_eq!(auto_margin(80 << 30), PAGRAPH_SLACK);
        // 64 MiB - 10 MiB peak - 6 MiB queued - 4 MiB margin = 44 MiB of 400-byte rows.
        let a = auto_cache_size(64 << 20, 10 << 20, 6 << 20, 1_000_000, 400).unwrap();
        assert_eq!(a.margin, 4 << 20);
        assert_eq!(a.budget, 44 << 20);
        assert_eq!(a.rows, (44 << 20) / 400);
        assert_eq!(
            (a.device_memory, a.trial_peak, a.prefetch_buffers),
            (64 << 20, 10 << 20, 6 << 20)
        );
        // Clamped to |V|.
        assert_eq!(
            auto_cache_size(64 << 20, 0, 0, 1000, 400).unwrap().rows,
            1000
        );
        // Fits the step but leaves nothing: 0 rows, not an error.
        let z = auto_cache_size(64 << 20, 60 << 20, 1 << 20, 1000, 400).unwrap();
        assert_eq!((z.budget, z.rows), (0, 0));
        // Cannot hold the step: an error naming both figures.
        let e = auto_cache_size(1 << 20, 2 << 20, 0, 1000, 400).unwrap_err();
        assert!(e.contains("1048576") && e.contains("2097152"), "{e}");
    }
}
