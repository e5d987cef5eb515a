//! Large blocks mapped straight from the kernel, 2 MiB-aligned and advised to use huge pages,
//! and kept after they are freed so the next block of about the same size reuses their pages.
//!
//! Why: a training step allocates its big buffers afresh (the batch's feature matrix,
//! aggregated rows, activations, their gradients: tens to hundreds of MB each). The system
//! allocator returns blocks above its mmap threshold to the kernel when they are freed, so the
//! next step's first touch of each page faults and the kernel clears it: with huge pages that
//! was still about a fifth of a width-1024 GraphSAGE epoch on the 2-core VM (`clear_page_erms`
//! under `folio_zero_user`). A step's sizes change only a little from one batch to the next, so
//! a freed block almost always fits the next request. This is a caching allocator for large
//! blocks only, as PyTorch's CUDA allocator is for device memory; hand-written because the
//! general-purpose allocator crates (jemalloc, mimalloc) replace the whole heap and are tuned
//! by environment, while this is one free list in front of `mmap`.
//!
//! Each block is `[header page][block, 2 MiB-aligned]`: the header page holds the block's
//! capacity, so `dealloc` and `realloc` need nothing but the pointer. Only the block is advised
//! `MADV_HUGEPAGE`; the header keeps a 4 KiB page.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The huge page size: blocks are aligned to it and sized in whole huge pages.
pub(crate) const HUGE_PAGE: usize = super::huge_pages::LARGE_ALIGN;
const PAGE: usize = 4096;
/// At most this many blocks are kept.
const SLOTS: usize = 64;
/// Environment variable: the most megabytes of freed blocks kept (0 keeps none).
const CACHE_LIMIT_ENV: &std::ffi::CStr = c"FANOUT_BLOCK_CACHE_MB";

/// Freed blocks, oldest first: `(start, capacity)`. Pure bookkeeping (no memory is touched),
/// so its policy is tested on its own.
#[derive(Debug)]
pub(crate) struct FreeList {
    slots: [(usize, usize); SLOTS],
    len: usize,
    bytes: usize,
}

impl FreeList {
    pub(crate) const fn new() -> Self {
        FreeList {
            slots: [(0, 0); SLOTS],
            len: 0,
            bytes: 0,
        }
    }

    /// Removes and returns the smallest kept block of capacity in `need..=need * 3 / 2`
    /// (best fit, so a small request does not take the block a large one needs; the bound
    /// keeps a small request from pinning a much larger block).
    pub(crate) fn take(&mut self, need: usize) -> Option<(usize, usize)> {
        let most = need.saturating_add(need / 2);
        let (mut best, mut best_cap) = (None, usize::MAX);
        for (i, &(_, cap)) in self.slots[..self.len].iter().enumerate() {
            if cap >= need && cap <= most && cap < best_cap {
                (best, best_cap) = (Some(i), cap);
            }
        }
        let i = best?;
        let block = self.slots[i];
        self.slots.copy_within(i + 1..self.len, i);
        self.len -= 1;
        self.bytes -= block.1;
        Some(block)
    }

    /// Keeps `block` within `limit` bytes and [`SLOTS`] blocks, dropping the oldest kept blocks
    /// to make room; returns what must be unmapped (the dropped blocks, or `block` itself if
    /// it alone is over the limit), at most `SLOTS + 1` of them in `out`, and how many.
    pub(crate) fn put(
        &mut self,
        block: (usize, usize),
        limit: usize,
        out: &mut [(usize, usize); SLOTS + 1],
    ) -> usize {
        if block.1 > limit {
            out[0] = block;
            return 1;
        }
        let mut n = 0;
        let mut drop = 0;
        while self.len - drop == SLOTS || self.bytes + block.1 > limit {
            out[n] = self.slots[drop];
            self.bytes -= self.slots[drop].1;
            n += 1;
            drop += 1;
        }
        self.slots.copy_within(drop..self.len, 0);
        self.len -= drop;
        self.slots[self.len] = block;
        self.len += 1;
        self.bytes += block.1;
        n
    }

    /// Bytes kept.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

static FREE: Mutex<FreeList> = Mutex::new(FreeList::new());
/// The limit in bytes plus one (0: not read yet).
static LIMIT: AtomicUsize = AtomicUsize::new(0);

/// The most bytes of freed blocks kept: [`CACHE_LIMIT_ENV`] megabytes if set and a number,
/// else a quarter of physical memory. Read once; reads the environment with `getenv`, which
/// does not allocate (this runs inside the global allocator).
fn limit() -> usize {
    let l = LIMIT.load(Ordering::Relaxed);
    if l != 0 {
        return l - 1;
    }
    let from_env = {
        // SAFETY: a NUL-terminated name; getenv returns NULL or a NUL-terminated string that
        // is read before anything else in this thread could change the environment.
        let v = unsafe { libc::getenv(CACHE_LIMIT_ENV.as_ptr()) };
        if v.is_null() {
            None
        } else {
            let s = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
            std::str::from_utf8(s)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .map(|mb| mb.saturating_mul(1 << 20))
        }
    };
    let l = from_env.unwrap_or_else(|| {
        // SAFETY: sysconf only reads system configuration.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages <= 0 || size <= 0 {
            0
        } else {
            (pages as usize).saturating_mul(size as usize) / 4
        }
    });
    LIMIT.store(l.saturating_add(1).max(1), Ordering::Relaxed);
    l
}

/// Bytes of freed large blocks kept for reuse now.
pub fn cached_bytes() -> usize {
    FREE.lock().map(|f| f.bytes()).unwrap_or(0)
}

/// The capacity a request of `size` bytes gets, or `None` if that overflows: `size` rounded up
/// to a size class, classes spaced an eighth of a power of two apart (and whole huge pages).
/// A step's buffers vary by a few percent from batch to batch; without classes a request a
/// little larger than every kept block maps a fresh one, and kept blocks pile up in sizes
/// just too small (seen with 4096-wide features: the gathered matrix took fresh pages for
/// several epochs). At most an eighth of a block is never touched by its request.
fn capacity_for(size: usize) -> Option<usize> {
    let top = if size == 0 {
        0
    } else {
        1usize << (usize::BITS - 1 - size.leading_zeros())
    };
    size.checked_next_multiple_of((top / 8).max(HUGE_PAGE))
}

/// The capacity of a block from [`alloc`], from its header.
///
/// # Safety
/// `ptr` came from [`alloc`] and was not unmapped.
pub(crate) unsafe fn capacity(ptr: *mut u8) -> usize {
    // SAFETY: the header page precedes the block and holds its capacity (`map`).
    unsafe { *(ptr.sub(PAGE) as *const usize) }
}

/// A fresh block of `cap` bytes (a multiple of [`HUGE_PAGE`]), 2 MiB-aligned, zeroed (new
/// anonymous pages), or null if the kernel refuses.
unsafe fn map(cap: usize) -> *mut u8 {
    let Some(len) = cap.checked_add(HUGE_PAGE) else {
        return std::ptr::null_mut();
    };
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let base = base as usize;
    // `base` is page-aligned, so `start <= base + HUGE_PAGE` and `start + cap <= base + len`.
    let start = (base + PAGE).next_multiple_of(HUGE_PAGE);
    let end = base + len;
    // SAFETY: both ranges lie inside the mapping just made and outside [start - PAGE, start +
    // cap), which is all that is kept; the header page is written inside the mapping.
    unsafe {
        if start - PAGE > base {
            libc::munmap(base as *mut libc::c_void, start - PAGE - base);
        }
        if end > start + cap {
            libc::munmap((start + cap) as *mut libc::c_void, end - start - cap);
        }
        libc::madvise(start as *mut libc::c_void, cap, libc::MADV_HUGEPAGE);
        *((start - PAGE) as *mut usize) = cap;
    }
    start as *mut u8
}

/// Gives a block back to the kernel.
unsafe fn unmap(start: usize, cap: usize) {
    // SAFETY: [start - PAGE, start + cap) is exactly the mapping `map` kept for this block.
    unsafe {
        libc::munmap((start - PAGE) as *mut libc::c_void, cap + PAGE);
    }
}

/// A block of at least `size` bytes, 2 MiB-aligned: a kept one that fits, else a fresh
/// mapping. If `zeroed`, its first `size` bytes are zero. Null if the kernel refuses.
pub(crate) unsafe fn alloc(size: usize, zeroed: bool) -> *mut u8 {
    let Some(need) = capacity_for(size) else {
        return std::ptr::null_mut();
    };
    let kept = FREE.lock().ok().and_then(|mut f| f.take(need));
    match kept {
        Some((start, _)) => {
            let p = start as *mut u8;
            if zeroed {
                // SAFETY: the block holds at least `need >= size` bytes.
                unsafe { std::ptr::write_bytes(p, 0, size) };
            }
            p
        }
        // SAFETY: a fresh anonymous mapping is zeroed by the kernel.
        None => unsafe { map(need) },
    }
}

/// Takes back a block from [`alloc`]: kept for reuse within the limit, else unmapped.
pub(crate) unsafe fn dealloc(ptr: *mut u8) {
    // SAFETY: the caller's contract.
    let cap = unsafe { capacity(ptr) };
    let mut out = [(0usize, 0usize); SLOTS + 1];
    let n = match FREE.lock() {
        Ok(mut f) => f.put((ptr as usize, cap), limit(), &mut out),
        Err(_) => {
            out[0] = (ptr as usize, cap);
            1
        }
    };
    // Unmapped outside the lock: munmap of a large block takes a while.
    for &(start, cap) in &out[..n] {
        // SAFETY: each is a block from `map` that is no longer handed out or kept.
        unsafe { unmap(start, cap) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    #[test]
    fn take_is_best_fit_within_half_again_the_request() {
        let mut f = FreeList::new();
        let mut out = [(0, 0); SLOTS + 1];
        for (i, cap) in [10 * MB, 6 * MB, 8 * MB, 40 * MB].into_iter().enumerate() {
            assert_eq!(f.put((i + 1, cap), usize::MAX, &mut out), 0);
        }
        assert_eq!(f.bytes(), 64 * MB);
        // 6 fits 5 best (8 and 10 fit too, 40 is over 1.5x).
        assert_eq!(f.take(5 * MB), Some((2, 6 * MB)));
        assert_eq!(f.take(5 * MB), None, "8 and 10 MB are over 1.5 x 5 MB");
        assert_eq!(f.take(7 * MB), Some((3, 8 * MB)));
        assert_eq!(f.take(30 * MB), Some((4, 40 * MB)));
        assert_eq!(f.take(11 * MB), None, "nothing at least 11 MB is left");
        assert_eq!(f.bytes(), 10 * MB);
        assert_eq!(f.take(10 * MB), Some((1, 10 * MB)));
        assert_eq!(f.bytes(), 0);
    }

    #[test]
    fn put_drops_the_oldest_blocks_to_stay_within_the_limit() {
        let mut f = FreeList::new();
        let mut out = [(0, 0); SLOTS + 1];
        assert_eq!(f.put((1, 4 * MB), 10 * MB, &mut out), 0);
        assert_eq!(f.put((2, 4 * MB), 10 * MB, &mut out), 0);
        // 12 MB would be over: the oldest goes.
        assert_eq!(f.put((3, 4 * MB), 10 * MB, &mut out), 1);
        assert_eq!(out[0], (1, 4 * MB));
        assert_eq!(f.bytes(), 8 * MB);
        // A block over the limit by itself is not kept, and nothing else goes.
        assert_eq!(f.put((4, 11 * MB), 10 * MB, &mut out), 1);
        assert_eq!(out[0], (4, 11 * MB));
        assert_eq!(f.bytes(), 8 * MB);
        // A zero limit keeps nothing.
        let mut none = FreeList::new();
        assert_eq!(none.put((5, 2 * MB), 0, &mut out), 1);
        assert_eq!(none.bytes(), 0);
    }

    #[test]
    fn put_keeps_at_most_slots_blocks() {
        let mut f = FreeList::new();
        let mut out = [(0, 0); SLOTS + 1];
        for i in 0..SLOTS {
            assert_eq!(f.put((i + 1, MB), usize::MAX, &mut out), 0);
        }
        assert_eq!(f.put((SLOTS + 1, MB), usize::MAX, &mut out), 1);
        assert_eq!(out[0], (1, MB), "the oldest goes");
        assert_eq!(f.bytes(), SLOTS * MB);
        // The newest is the one kept last: taking all gives SLOTS blocks, 2..=SLOTS+1.
        let mut starts: Vec<usize> = std::iter::from_fn(|| f.take(MB).map(|b| b.0)).collect();
        starts.sort_unstable();
        assert_eq!(starts, (2..=SLOTS + 1).collect::<Vec<_>>());
    }

    #[test]
    fn capacities_are_whole_huge_pages_in_classes_an_eighth_apart() {
        assert_eq!(capacity_for(4 * MB), Some(4 * MB));
        assert_eq!(capacity_for(5 * MB + 3), Some(6 * MB));
        assert_eq!(capacity_for(64 * MB), Some(64 * MB));
        assert_eq!(capacity_for(64 * MB + 1), Some(72 * MB));
        assert_eq!(capacity_for(470 * MB), Some(480 * MB));
        assert_eq!(capacity_for(usize::MAX), None);
        for size in (1..4000).map(|i| i * 997 * 1024) {
            let c = capacity_for(size).unwrap();
            assert!(c >= size && c.is_multiple_of(HUGE_PAGE), "{size} -> {c}");
            assert!(c - size < (size / 8).max(HUGE_PAGE), "{size} -> {c}");
        }
    }

    #[test]
    fn blocks_are_aligned_and_zeroed_when_asked_even_if_reused() {
        // SAFETY: blocks are written within their sizes and handed back once each.
        unsafe {
            let p = alloc(5 * MB + 3, false);
            assert!(!p.is_null());
            assert_eq!(p as usize % HUGE_PAGE, 0);
            // 6 MiB if fresh; a block another test freed may be up to 1.5x that.
            assert!((6 * MB..=9 * MB).contains(&capacity(p)));
            std::ptr::write_bytes(p, 7, 5 * MB + 3);
            dealloc(p);
            // Another test may take the kept block first; either way the block is zeroed.
            let q = alloc(5 * MB, true);
            assert!(std::slice::from_raw_parts(q, 5 * MB)
                .iter()
                .all(|&b| b == 0));
            dealloc(q);
        }
    }
}
