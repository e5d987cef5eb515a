//! Typed views of flat little-endian binary files, memory-mapped or owned.
//!
//! A hand-written [`Pod`] marker instead of `bytemuck`: fanout only ever reinterprets five
//! primitive element types, and keeping the list closed makes the one `unsafe` cast auditable.

use crate::error::{Error, Result};
use crate::progress::{NoProgress, Progress};
use memmap2::{Mmap, MmapMut};
use std::fs::{File, OpenOptions};
use std::marker::PhantomData;
use std::path::Path;

#[cfg(target_endian = "big")]
compile_error!("fanout's dataset files are little-endian; big-endian hosts are not supported");

/// Element types that may be reinterpreted from raw little-endian bytes.
///
/// # Safety
/// Implementors must be plain data: every bit pattern valid, no padding, no pointers.
pub unsafe trait Pod: Copy + Send + Sync + 'static {
    /// Name used in messages ("u32", "f16", ...).
    const NAME: &'static str;
}
unsafe impl Pod for u8 {
    const NAME: &'static str = "u8";
}
unsafe impl Pod for u32 {
    const NAME: &'static str = "u32";
}
unsafe impl Pod for u64 {
    const NAME: &'static str = "u64";
}
unsafe impl Pod for i64 {
    const NAME: &'static str = "i64";
}
unsafe impl Pod for f32 {
    const NAME: &'static str = "f32";
}
unsafe impl Pod for half::f16 {
    const NAME: &'static str = "f16";
}

/// Memory available for new allocations in bytes (Linux: `MemAvailable` of `/proc/meminfo`),
/// or 4 GiB when it cannot be read. Decides whether resident copies
/// ([`Array::resident_copy`]) fit.
pub fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(4 << 30, |kib| kib * 1024)
}

/// Whether a large array that hot loops read at random (a sampler's topology, the features)
/// is copied into huge-page memory ([`Array::resident_from`]) or read from the memory-mapped
/// dataset files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Residency {
    /// Copied when it takes at most a quarter of the memory available and at most 16 GiB
    /// ([`Residency::wants_copy`]); mapped otherwise.
    #[default]
    Auto,
    /// Always read the memory-mapped files (no copy).
    Mapped,
    /// Always copied, whatever its size.
    Resident,
}

impl Residency {
    /// Whether an array of `bytes` bytes is to be copied under this policy. `Auto` reads
    /// [`available_memory`] on every call.
    pub fn wants_copy(self, bytes: u64) -> bool {
        match self {
            Residency::Mapped => false,
            Residency::Resident => true,
            Residency::Auto => bytes <= (available_memory() / 4).min(16 << 30),
        }
    }
}

/// Reinterprets a byte slice as a slice of `T`. The caller guarantees alignment and length.
fn cast<T: Pod>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(
        bytes.len().is_multiple_of(size)
            && (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
    );
    // SAFETY: T is Pod (any bit pattern valid), the pointer is aligned and the length exact.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) }
}

fn cast_mut<T: Pod>(bytes: &mut [u8]) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(
        bytes.len().is_multiple_of(size)
            && (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
    );
    // SAFETY: as in `cast`, and the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, bytes.len() / size) }
}

/// The raw bytes of a slice of `T`.
pub fn as_bytes<T: Pod>(items: &[T]) -> &[u8] {
    // SAFETY: T is Pod; a byte view of initialised plain data is always valid.
    unsafe { std::slice::from_raw_parts(items.as_ptr() as *const u8, std::mem::size_of_val(items)) }
}

enum Backing<T> {
    Mapped(Mmap),
    Owned(Vec<T>),
    /// Anonymous memory advised for transparent huge pages, holding `.1` elements.
    Resident(MmapMut, usize),
}

/// A read-only array of `T`: a memory-mapped file (opened in O(1) time and memory), an owned
/// vector (datasets generated in memory), or a private copy in huge-page memory
/// ([`Array::resident_copy`]). Dereferences to `&[T]`.
pub struct Array<T: Pod> {
    backing: Backing<T>,
    _t: PhantomData<T>,
}

impl<T: Pod> Array<T> {
    /// Maps `path`, which must hold exactly `expected_len` elements. `what` names the meta
    /// field the length came from, for the error message.
    pub fn map(path: &Path, expected_len: u64, what: &str) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let actual = file
            .metadata()
            .map_err(|e| Error::io(path, "stat", e))?
            .len();
        let size = std::mem::size_of::<T>() as u64;
        let expected = expected_len.checked_mul(size).ok_or_else(|| {
            Error::format(
                path,
                format!("{what} = {expected_len} overflows a file size"),
            )
        })?;
        if actual != expected {
            let whole = if actual % size == 0 {
                format!("{} {}", actual / size, T::NAME)
            } else {
                format!("not a whole number of {} elements", T::NAME)
            };
            return Err(Error::format(
                path,
                format!(
                    "file has {actual} bytes ({whole}), expected {expected} bytes = {what} ({expected_len}) x {size}; the file is truncated or does not match meta.txt"
                ),
            ));
        }
        if actual == 0 {
            return Ok(Array::from_vec(Vec::new()));
        }
        // SAFETY: the dataset files are treated as immutable while mapped (documented contract:
        // fanout never writes into a dataset it has opened, and datasets are replaced by rename).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, "memory-map", e))?;
        Ok(Array {
            backing: Backing::Mapped(map),
            _t: PhantomData,
        })
    }

    /// An array that owns its elements.
    pub fn from_vec(v: Vec<T>) -> Self {
        Array {
            backing: Backing::Owned(v),
            _t: PhantomData,
        }
    }

    /// Whether the array is memory-mapped from a file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mapped(_))
    }

    /// A copy of the elements in anonymous memory advised for transparent huge pages
    /// ([`Array::resident_from`]).
    ///
    /// # Errors
    /// When the anonymous memory cannot be mapped.
    pub fn resident_copy(&self) -> std::io::Result<Array<T>> {
        Self::resident_from(self, &NoProgress)
    }

    /// An array holding a copy of `src` in anonymous memory advised for transparent huge pages
    /// (Linux; plain anonymous memory elsewhere), filled in parallel, reporting copied bytes to
    /// `progress` (within a phase the caller opens). Random reads of rows (feature gathers,
    /// neighbour lists) then mostly hit the TLB: with 4 KiB pages almost every row read of an
    /// array of more than a few MiB misses it, and in a virtual machine each miss is a nested
    /// page walk. Costs one pass over `src` and its size in memory.
    ///
    /// Safe to call while holding a lock or inside a `OnceLock` initialiser, from any thread:
    /// the parallel fill uses scoped OS threads (as many as the current rayon pool has), not
    /// rayon jobs. A rayon worker waiting for its jobs runs other queued jobs meanwhile, and
    /// one of those re-entering the same lock or initialiser would deadlock (samplers copy
    /// their topology lazily, on the first batch, from pool workers).
    ///
    /// # Errors
    /// When the anonymous memory cannot be mapped.
    pub fn resident_from(src: &[T], progress: &dyn Progress) -> std::io::Result<Array<T>> {
        const CHUNK_BYTES: usize = 8 << 20;
        let bytes = std::mem::size_of_val(src);
        let mut map = MmapMut::map_anon(bytes.max(1))?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let dst: &mut [T] = cast_mut(&mut map[..bytes]);
        let threads = rayon::current_num_threads()
            .min(bytes.div_ceil(CHUNK_BYTES))
            .max(1);
        let per = src.len().div_ceil(threads).max(1);
        // Each thread copies its share in pieces of about CHUNK_BYTES, reporting each piece.
        let piece = (CHUNK_BYTES / std::mem::size_of::<T>().max(1)).max(1);
        let copy = |d: &mut [T], from: &[T]| {
            for (d, from) in d.chunks_mut(piece).zip(from.chunks(piece)) {
                d.copy_from_slice(from);
                progress.advance(std::mem::size_of_val(from) as u64);
            }
        };
        if threads == 1 {
            copy(dst, src);
        } else {
            std::thread::scope(|s| {
                for (d, from) in dst.chunks_mut(per).zip(src.chunks(per)) {
                    s.spawn(move || copy(d, from));
                }
            });
        }
        Ok(Array {
            backing: Backing::Resident(map, src.len()),
            _t: PhantomData,
        })
    }

    /// Whether the array is a huge-page copy ([`Array::resident_from`]).
    pub fn is_resident(&self) -> bool {
        matches!(self.backing, Backing::Resident(..))
    }
}

impl<T: Pod> std::ops::Deref for Array<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.backing {
            Backing::Mapped(m) => cast(&m[..]),
            Backing::Owned(v) => v,
            Backing::Resident(m, len) => cast(&m[..len * std::mem::size_of::<T>()]),
        }
    }
}

impl<T: Pod + std::fmt::Debug> std::fmt::Debug for Array<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Array<{}>[{}]", T::NAME, self.len())
    }
}

enum BackingMut<T> {
    Mapped(MmapMut),
    Owned(Vec<T>),
}

/// A writable, fixed-length array of `T`, zero-initialised: a file mapped read-write (so arrays
/// larger than memory can be filled in place) or an owned vector. Dereferences to `&mut [T]`.
pub struct ArrayMut<T: Pod> {
    backing: BackingMut<T>,
}

impl<T: Pod + Default> ArrayMut<T> {
    /// Creates (or truncates) `path` with room for `len` zeroed elements and maps it.
    pub fn create_file(path: &Path, len: u64) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| Error::io(path, "create", e))?;
        let bytes = len * std::mem::size_of::<T>() as u64;
        file.set_len(bytes)
            .map_err(|e| Error::io(path, "resize", e))?;
        if bytes == 0 {
            return Ok(ArrayMut {
                backing: BackingMut::Owned(Vec::new()),
            });
        }
        // SAFETY: the file was just created by us in a private temporary directory.
        let map =
            unsafe { MmapMut::map_mut(&file) }.map_err(|e| Error::io(path, "memory-map", e))?;
        Ok(ArrayMut {
            backing: BackingMut::Mapped(map),
        })
    }

    /// An in-memory array of `len` default (zero) elements.
    pub fn zeroed(len: usize) -> Self {
        ArrayMut {
            backing: BackingMut::Owned(vec![T::default(); len]),
        }
    }

    /// Flushes a mapped array to its file and returns the owned vector for in-memory arrays.
    pub fn finish(self, path_for_errors: &Path) -> Result<Option<Vec<T>>> {
        match self.backing {
            BackingMut::Mapped(m) => {
                m.flush()
                    .map_err(|e| Error::io(path_for_errors, "flush", e))?;
                Ok(None)
            }
            BackingMut::Owned(v) => Ok(Some(v)),
        }
    }
}

impl<T: Pod> std::ops::Deref for ArrayMut<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.backing {
            BackingMut::Mapped(m) => cast(&m[..]),
            BackingMut::Owned(v) => v,
        }
    }
}

impl<T: Pod> std::ops::DerefMut for ArrayMut<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.backing {
            BackingMut::Mapped(m) => cast_mut(&mut m[..]),
            BackingMut::Owned(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_checks_size_against_meta() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        std::fs::write(&p, as_bytes(&[1u32, 2, 3])).unwrap();
        let a = Array::<u32>::map(&p, 3, "NUM_NODE").unwrap();
        assert_eq!(&a[..], &[1, 2, 3]);
        assert!(a.is_mapped());
        let e = Array::<u32>::map(&p, 4, "NUM_NODE")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("12 bytes (3 u32)") && e.contains("expected 16 bytes = NUM_NODE (4)"),
            "{e}"
        );
        std::fs::write(&p, [0u8; 5]).unwrap();
        let e = Array::<u32>::map(&p, 1, "NUM_NODE")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a whole number of u32"), "{e}");
        std::fs::write(&p, []).unwrap();
        assert_eq!(Array::<u64>::map(&p, 0, "NUM_EDGE").unwrap().len(), 0);
    }

    #[test]
    fn resident_copy_holds_the_same_elements() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        // 1.2 MB: copied on the calling thread (the split across threads is tested on 40 MB in
        // tests/resident_features.rs).
        let v: Vec<f32> = (0..300_001).map(|i| i as f32 * 0.25 - 7.0).collect();
        std::fs::write(&p, as_bytes(&v)).unwrap();
        let mapped = Array::<f32>::map(&p, v.len() as u64, "N").unwrap();
        let copy = mapped.resident_copy().unwrap();
        assert!(copy.is_resident() && !copy.is_mapped() && !mapped.is_resident());
        assert_eq!(&copy[..], &v[..]);
        let halves = Array::from_vec(vec![half::f16::from_f32(1.5), half::f16::from_f32(-2.0)]);
        assert_eq!(&halves.resident_copy().unwrap()[..], &halves[..]);
        let empty = Array::<u64>::from_vec(Vec::new()).resident_copy().unwrap();
        assert!(empty.is_empty() && empty.is_resident());
    }

    #[test]
    fn array_mut_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("y.bin");
        let mut a = ArrayMut::<u64>::create_file(&p, 4).unwrap();
        a.copy_from_slice(&[5, 6, 7, 8]);
        assert!(a.finish(&p).unwrap().is_none());
        let b = Array::<u64>::map(&p, 4, "n").unwrap();
        assert_eq!(&b[..], &[5, 6, 7, 8]);
    }
}
