//! Where a run's feature rows live ([`FeaturePlacement`] resolved into [`RowsAt`]): gathered
//! on the host and uploaded, all on the compute device, all in page-locked host memory the
//! device reads in place, or a feature cache on the device with its misses uploaded or read
//! in place. Also builds what those need on the device: the mapped table ([`map_rows`]) and
//! the cache's table ([`device_cache_table`]).

use crate::config::{FeaturePlacement, TrainConfig};
use crate::error::{ExecError, Result};
use fanout_cache::{Extractor, PlainExtractor};
use fanout_compute::{Backend, Tensor};
use fanout_graph::Dataset;
use std::sync::Arc;

/// Where a run's batches find their feature rows ([`FeaturePlacement`] resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowsAt {
    /// Gathered on the host, uploaded every step.
    Host,
    /// All of them on the compute device, gathered there.
    Device,
    /// The feature cache (and with Match the previous batch's rows) on the compute device,
    /// the misses uploaded every step.
    DeviceCache,
    /// All of them in host memory the compute device reads in place, gathered by it.
    Mapped,
    /// The feature cache (and with Match the previous batch's rows) on the compute device as
    /// for `DeviceCache`, the misses read in place from host memory as for `Mapped`.
    DeviceCacheMapped,
}

impl RowsAt {
    /// Whether every row is also kept in host memory the device reads in place.
    pub(crate) fn mapped(self) -> bool {
        matches!(self, RowsAt::Mapped | RowsAt::DeviceCacheMapped)
    }
    /// Whether a feature cache (or Match's reuse) lives on the device.
    pub(crate) fn cache_on_device(self) -> bool {
        matches!(self, RowsAt::DeviceCache | RowsAt::DeviceCacheMapped)
    }
}

/// Where this run keeps its feature rows (see [`FeaturePlacement`]); `Err` when `device` is
/// asked for where it cannot be (the CPU backend, rows that do not fit in the device's free
/// memory; a cache's own size is checked once it is built).
pub(crate) fn rows_at<B: Backend>(be: &B, cfg: &TrainConfig, ds: &Dataset) -> Result<RowsAt> {
    // A feature cache, or Match-Reorder's reuse of the previous batch: both live on the
    // device with it.
    let cache = wants_cache(cfg) || cfg.cache.match_reorder;
    let dim = ds.features.as_ref().map_or(0, |f| f.dim) as u64;
    let bytes = ds.num_nodes() * dim * 4;
    let bad = |m: String| Err(ExecError::Invalid(m));
    match cfg.feature_placement {
        FeaturePlacement::Host => Ok(RowsAt::Host),
        FeaturePlacement::Auto => Ok(match be.free_memory() {
            Some(free) if dim > 0 => {
                auto_rows_at(bytes, cache, free, fanout_graph::available_memory())
            }
            _ => RowsAt::Host,
        }),
        p @ (FeaturePlacement::Uva | FeaturePlacement::Device) if be.name() == "cpu" => {
            bad(format!(
                "--feature-placement {} needs a GPU (--device cuda); on the CPU the rows are \
                 already where the model computes",
                p.name()
            ))
        }
        FeaturePlacement::Uva | FeaturePlacement::Device if dim == 0 => Ok(RowsAt::Host),
        FeaturePlacement::Uva if cache => Ok(RowsAt::DeviceCacheMapped),
        FeaturePlacement::Uva => Ok(RowsAt::Mapped),
        FeaturePlacement::Device if cache => Ok(RowsAt::DeviceCache),
        FeaturePlacement::Device => match be.free_memory() {
            Some(free) if bytes > free => bad(format!(
                "--feature-placement device: the features take {:.0} MB as f32 but {} has \
                 {:.0} MB free; cache part of them there (--cache-policy degree --cache-ratio \
                 R) or use --feature-placement host",
                bytes as f64 / 1e6,
                be.name(),
                free as f64 / 1e6
            )),
            _ => Ok(RowsAt::Device),
        },
    }
}

/// `auto`'s placement on a device with `free` bytes of memory of its own, for features of
/// `bytes` as f32, with (`cache`) or without a feature cache or Match, on a host with
/// `host_available` bytes available. The rows are assembled in host memory before an upload
/// and mapped rows stay there page-locked, so the device or the mapped table is taken only
/// when the rows take at most a quarter of the host's memory (larger features stay on the host
/// path, read from the mapped dataset file). Every row on the device when they take at most
/// half its free memory, with or without a cache (a cache would hold part of them). Else,
/// without a cache, every row read in place; with one, the cache on the device, its misses
/// read in place when the rows may be mapped, else uploaded. A cache on the device beat the
/// same cache on the host on a GPU, and every row on the device beat both (docs/cuda.md);
/// the cache's own size is checked once it is built.
pub(crate) fn auto_rows_at(bytes: u64, cache: bool, free: u64, host_available: u64) -> RowsAt {
    let host_room = bytes <= host_available / 4;
    match (cache, host_room) {
        (_, true) if bytes <= free / 2 => RowsAt::Device,
        (true, true) => RowsAt::DeviceCacheMapped,
        (true, false) => RowsAt::DeviceCache,
        (false, true) => RowsAt::Mapped,
        (false, false) => RowsAt::Host,
    }
}

/// Every feature row of `ds`, as f32, in host memory that `be`'s device reads in place
/// ([`Backend::map_host_rows`]), and the line that says so; the inner `Err` says why the
/// backend could not map them (it has no such memory, or the memory could not be had), the
/// outer one is a failure to read the rows.
#[allow(clippy::type_complexity)]
pub(crate) fn map_rows<B: Backend>(
    be: &B,
    ds: &Arc<Dataset>,
    misses_only: bool,
) -> Result<std::result::Result<(fanout_compute::MappedRows, String), String>> {
    let n = ds.num_nodes() as usize;
    let mut plain = PlainExtractor::new(ds.clone())?;
    let dim = plain.dim();
    // Rows are read in chunks into a scratch buffer and copied into the table, so the host
    // never holds the whole table twice.
    let mut failed = None;
    let mut fill = |table: &mut [f32]| {
        let mut scratch = Vec::new();
        for (c, out) in table.chunks_mut(MAP_CHUNK_ROWS * dim.max(1)).enumerate() {
            let first = c * MAP_CHUNK_ROWS;
            let ids: Vec<u32> = (first..first + out.len() / dim.max(1))
                .map(|v| v as u32)
                .collect();
            if let Err(e) = plain.extract(&ids, &mut scratch) {
                failed = Some(e);
                return;
            }
            out.copy_from_slice(&scratch);
        }
    };
    let mapped = be.map_host_rows(n, dim, &mut fill);
    // A row that could not be read is the error, whatever became of the mapping.
    if let Some(e) = failed {
        return Err(e.into());
    }
    let mapped = match mapped {
        None => {
            return Ok(Err(format!(
                "{} cannot read host memory in place",
                be.name()
            )))
        }
        Some(Err(e)) => return Ok(Err(e.to_string())),
        Some(Ok(m)) => m,
    };
    let which = if misses_only {
        "the rows each batch's cache misses"
    } else {
        "each batch's rows"
    };
    let note = format!(
        "features in page-locked host memory: {n} rows x {dim} ({:.0} MB as f32), {which} gathered by {} over the bus",
        (n * dim * 4) as f64 / 1e6,
        be.name()
    );
    Ok(Ok((mapped, note)))
}

/// Rows read per chunk when a mapped table is filled ([`map_rows`]).
const MAP_CHUNK_ROWS: usize = 1 << 16;

/// Copies the cache of `extractor` to `be` as [`crate::Trainer::with_device_cache`]'s table (the
/// cached rows, then one row of negative zeros); `Err` when it does not fit in the device's
/// free memory.
pub(crate) fn device_cache_table<B: Backend>(
    be: &B,
    extractor: &dyn Extractor,
    placement: FeaturePlacement,
) -> Result<(B::Tensor, usize, usize)> {
    let dim = extractor.dim();
    let flag = format!("--feature-placement {}", placement.name());
    let mut rows = extractor.cache_rows().ok_or_else(|| {
        ExecError::Invalid(format!(
            "{flag}: the extractor has neither a cache nor Match"
        ))
    })?;
    let cached = rows.len() / dim.max(1);
    rows.extend(std::iter::repeat_n(-0.0f32, dim));
    let bytes = (rows.len() * 4) as u64;
    if let Some(free) = be.free_memory().filter(|&free| bytes > free / 2) {
        let without = if placement == FeaturePlacement::Uva {
            ", --feature-placement uva without a cache (every row read in place)"
        } else {
            ""
        };
        return Err(ExecError::Invalid(format!(
            "{flag}: the cache takes {:.0} MB as f32 but {} has {:.0} MB free (it may take \
             half); a smaller cache (--cache-ratio, --cache-bytes){without} or \
             --feature-placement host",
            bytes as f64 / 1e6,
            be.name(),
            free as f64 / 1e6
        )));
    }
    Ok((
        be.upload_owned(Tensor::new(cached + 1, dim, rows))?,
        cached,
        dim,
    ))
}

/// Whether `cfg` asks for a feature cache (a policy other than none).
pub(crate) fn wants_cache(cfg: &TrainConfig) -> bool {
    !matches!(cfg.cache.policy.trim(), "none" | "")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Auto's choice at the edges of each budget: half the device's free memory for every
    /// row (cache or not), a quarter of the host's available memory for rows assembled or
    /// mapped there, and otherwise a cache on the device, its misses read in place only where
    /// rows may be mapped.
    #[test]
    fn auto_places_rows_by_the_memory_either_side_has() {
        let gb = 1u64 << 30;
        // (bytes, cache, device free, host available) -> placement
        for (bytes, cache, free, host, want) in [
            (gb, false, 2 * gb, 4 * gb, RowsAt::Device),
            (gb, false, 2 * gb - 1, 4 * gb, RowsAt::Mapped),
            (gb, false, 2 * gb, 4 * gb - 4, RowsAt::Host),
            (gb, false, 100 * gb, 4 * gb - 4, RowsAt::Host),
            (gb, true, 2 * gb, 4 * gb, RowsAt::Device),
            (gb, true, 2 * gb - 1, 4 * gb, RowsAt::DeviceCacheMapped),
            (gb, true, gb, 4 * gb, RowsAt::DeviceCacheMapped),
            (gb, true, 100 * gb, 4 * gb - 4, RowsAt::DeviceCache),
            (gb, true, 0, 0, RowsAt::DeviceCache),
            (0, false, 0, 0, RowsAt::Device),
        ] {
            assert_eq!(
                auto_rows_at(bytes, cache, free, host),
                want,
                "{bytes} bytes, cache {cache}, {free} free, {host} on the host"
            );
        }
    }
}
