//! Whole-file checksums (`CHECKSUM_<FILE> xxh3:<hex>` in meta.txt). XXH3-64 hashes at memory
//! speed, so checksumming never dominates writing or verifying a dataset.

use crate::error::{Error, Result};
use crate::progress::Progress;
use std::fs::File;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

/// The checksum string of the file at `path`, e.g. `xxh3:00ff00ff00ff00ff`. Reports the bytes
/// hashed to `progress`.
pub fn file_checksum(path: &Path, progress: &dyn Progress) -> Result<String> {
    let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let mut h = Xxh3::new();
    if len > 0 {
        // SAFETY: read-only map of a file fanout does not modify while hashing.
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, "memory-map", e))?;
        for chunk in map.chunks(64 << 20) {
            h.update(chunk);
            progress.advance(chunk.len() as u64);
        }
    }
    Ok(format!("xxh3:{:016x}", h.digest()))
}
