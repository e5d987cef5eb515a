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
        let units: [(&str, u64); 9] = [
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
        for (u, m) in units {
            if let Some(n) = t.strip_suffix(u) {
                let x: f64 = n
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad byte size {s:?}"))?;
                if !(x >= 0.0 && x.is_finite()) {
                    return Err(format!("bad byte size {s:?}"));
                }
                return Ok(CacheSize::Bytes((x * m as f64) as u64));
            }
        }
        Err(format!(
            "cache size {s:?}: expected a ratio of |V| (0.1 or 10%) or bytes (512MiB, 2GB)"
        ))
    }
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
}
