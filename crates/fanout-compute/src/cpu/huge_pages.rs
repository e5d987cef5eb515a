//! A global allocator for training: large blocks on transparent huge pages, kept for reuse.
//!
//! A training step allocates its big buffers afresh (the batch's feature matrix, aggregated
//! rows, activations and their gradients: tens to hundreds of MB each). The system allocator
//! maps those from the kernel and the first touch of every 4 KiB page faults and clears it; on
//! the 2-core VM a width-1024 GraphSAGE epoch took 1.37M page faults, about a fifth of its CPU
//! time. Two remedies, for blocks of at least [`HUGE_PAGE_THRESHOLD`] bytes on Linux:
//! - each is mapped 2 MiB-aligned and advised `MADV_HUGEPAGE`, so the kernel backs it with
//!   2 MiB pages where it can (up to 512 times fewer faults; PyTorch's CPU allocator gives the
//!   same advice, `THP_MEM_ALLOC_ENABLE`);
//! - a freed block is kept and handed to the next request it fits (up to 1.5 times the
//!   request), so its pages are not faulted and cleared again (the clearing still took about
//!   a fifth of that epoch with huge pages). Kept blocks are bounded by `FANOUT_BLOCK_CACHE_MB`
//!   megabytes (default a quarter of physical memory; `0` keeps none) and 64 blocks, oldest
//!   dropped first.
//!
//! Smaller blocks, blocks aligned to more than 2 MiB, and every block elsewhere than Linux come
//! from the system allocator unchanged. Without THP (or with it set to `never`) the advice is
//! ignored and only the reuse remains.
//!
//! Binaries opt in: `#[global_allocator] static A: HugePageAlloc = HugePageAlloc;` (the `fanout`
//! command line and the Python module do).

use std::alloc::{GlobalAlloc, Layout, System};

#[cfg(target_os = "linux")]
use super::large_blocks;

/// Allocations from this size up are mapped on huge pages and kept for reuse (smaller ones come
/// from the system allocator's heap, where neither would help).
pub const HUGE_PAGE_THRESHOLD: usize = 4 << 20;

/// The global allocator described in the module documentation: the system allocator for small
/// blocks, huge-page mappings kept for reuse for blocks of at least [`HUGE_PAGE_THRESHOLD`]
/// bytes (Linux). Every block satisfies its layout; `alloc_zeroed` blocks are zero.
#[derive(Clone, Copy, Debug, Default)]
pub struct HugePageAlloc;

/// Bytes of freed large blocks [`HugePageAlloc`] keeps for reuse now (0 elsewhere than Linux).
pub fn kept_bytes() -> usize {
    #[cfg(target_os = "linux")]
    return large_blocks::cached_bytes();
    #[cfg(not(target_os = "linux"))]
    0
}

/// Whether a block of this layout is one of ours (decided by the layout alone, so `dealloc`
/// and `realloc` route it where it came from).
#[inline]
fn is_large(layout: &Layout) -> bool {
    cfg!(target_os = "linux")
        && layout.size() >= HUGE_PAGE_THRESHOLD
        && layout.align() <= LARGE_ALIGN
}

/// The alignment of large blocks (one huge page of x86-64 and aarch64 with 4 KiB base pages).
pub(crate) const LARGE_ALIGN: usize = 2 << 20;

#[cfg(target_os = "linux")]
unsafe fn large_alloc(size: usize, zeroed: bool) -> *mut u8 {
    // SAFETY: forwarded contract.
    unsafe { large_blocks::alloc(size, zeroed) }
}
#[cfg(target_os = "linux")]
unsafe fn large_dealloc(ptr: *mut u8) {
    // SAFETY: forwarded contract.
    unsafe { large_blocks::dealloc(ptr) }
}
#[cfg(target_os = "linux")]
unsafe fn large_capacity(ptr: *mut u8) -> usize {
    // SAFETY: forwarded contract.
    unsafe { large_blocks::capacity(ptr) }
}
#[cfg(not(target_os = "linux"))]
unsafe fn large_alloc(_: usize, _: bool) -> *mut u8 {
    unreachable!("large blocks are Linux only")
}
#[cfg(not(target_os = "linux"))]
unsafe fn large_dealloc(_: *mut u8) {
    unreachable!("large blocks are Linux only")
}
#[cfg(not(target_os = "linux"))]
unsafe fn large_capacity(_: *mut u8) -> usize {
    unreachable!("large blocks are Linux only")
}

// SAFETY: a layout is served by exactly one of two allocators, chosen by `is_large` of the
// layout, and freed or resized by the same one (the layout given back is the one it was
// allocated with, or for `realloc` the old one). Large blocks are 2 MiB-aligned (so any
// alignment up to 2 MiB holds) and at least the requested size; `realloc` moves a block
// between the two when the new size crosses the threshold.
unsafe impl GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_large(&layout) {
            large_alloc(layout.size(), false)
        } else {
            System.alloc(layout)
        }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_large(&layout) {
            large_alloc(layout.size(), true)
        } else {
            System.alloc_zeroed(layout)
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(&layout) {
            large_dealloc(ptr)
        } else {
            System.dealloc(ptr, layout)
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees a valid layout for `new_size` with the same alignment.
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        match (is_large(&layout), is_large(&new_layout)) {
            (false, false) => System.realloc(ptr, layout, new_size),
            // Grows or shrinks inside its capacity: nothing moves.
            (true, true) if new_size <= large_capacity(ptr) => ptr,
            _ => {
                let q = self.alloc(new_layout);
                if !q.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, q, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                q
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_contents_and_zeroes_whatever_the_size() {
        for size in [
            64,
            HUGE_PAGE_THRESHOLD - 1,
            HUGE_PAGE_THRESHOLD,
            3 * HUGE_PAGE_THRESHOLD + 5,
        ] {
            let layout = Layout::from_size_align(size, 64).unwrap();
            // SAFETY: a non-zero layout; the blocks are written within their sizes and freed
            // with the layouts they were allocated with.
            unsafe {
                let z = HugePageAlloc.alloc_zeroed(layout);
                assert!(!z.is_null());
                assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                let p = HugePageAlloc.alloc(layout);
                for i in (0..size).step_by(4093) {
                    *p.add(i) = (i % 251) as u8;
                }
                let q = HugePageAlloc.realloc(p, layout, 2 * size);
                for i in (0..size).step_by(4093) {
                    assert_eq!(*q.add(i), (i % 251) as u8);
                }
                HugePageAlloc.dealloc(q, Layout::from_size_align(2 * size, 64).unwrap());
                HugePageAlloc.dealloc(z, layout);
            }
        }
    }

    #[test]
    fn realloc_keeps_contents_within_and_across_the_threshold() {
        let align = 64;
        // SAFETY: each block is written within its size and freed or resized with the layout
        // it currently has.
        unsafe {
            let small = Layout::from_size_align(HUGE_PAGE_THRESHOLD + 1, align).unwrap();
            let p = HugePageAlloc.alloc(small);
            assert_eq!(
                p as usize % LARGE_ALIGN,
                0,
                "large blocks are 2 MiB-aligned"
            );
            for i in (0..small.size()).step_by(4093) {
                *p.add(i) = (i % 251) as u8;
            }
            // Grows inside its whole huge pages: the block does not move.
            let q = HugePageAlloc.realloc(p, small, HUGE_PAGE_THRESHOLD + (1 << 20));
            assert_eq!(q, p);
            // Shrinks below the threshold: moves to the system allocator with its contents.
            let grown = Layout::from_size_align(HUGE_PAGE_THRESHOLD + (1 << 20), align).unwrap();
            let r = HugePageAlloc.realloc(q, grown, 1 << 20);
            for i in (0..1 << 20).step_by(4093) {
                assert_eq!(*r.add(i), (i % 251) as u8);
            }
            HugePageAlloc.dealloc(r, Layout::from_size_align(1 << 20, align).unwrap());
        }
    }

    /// Where the kernel honours the advice (THP `madvise` or `always`), a large block touched
    /// once is backed by huge pages: /proc/self/smaps shows AnonHugePages in its mapping.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_blocks_get_huge_pages_where_the_kernel_offers_them() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !mode.contains("[madvise]") {
            eprintln!(
                "THP is not in madvise mode here ({}); nothing to check",
                mode.trim()
            );
            return;
        }
        let size = 64 << 20;
        let layout = Layout::from_size_align(size, 64).unwrap();
        // SAFETY: written within the block, freed with its layout.
        let p = unsafe { HugePageAlloc.alloc(layout) };
        unsafe { std::ptr::write_bytes(p, 1, size) };
        let huge_kb = |addr: usize| -> u64 {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let mut inside = false;
            for line in smaps.lines() {
                if let Some((range, _)) = line.split_once(' ') {
                    if let Some((a, b)) = range.split_once('-') {
                        if let (Ok(a), Ok(b)) =
                            (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                        {
                            inside = a <= addr && addr < b;
                            continue;
                        }
                    }
                }
                if inside && line.starts_with("AnonHugePages:") {
                    return line.split_whitespace().nth(1).unwrap().parse().unwrap();
                }
            }
            0
        };
        let with_advice = huge_kb(p as usize + size / 2);
        // The plain system allocator, for contrast: no huge pages in madvise mode.
        let q = unsafe { System.alloc(layout) };
        unsafe { std::ptr::write_bytes(q, 1, size) };
        let without = huge_kb(q as usize + size / 2);
        unsafe {
            HugePageAlloc.dealloc(p, layout);
            System.dealloc(q, layout);
        }
        // At least one 2 MiB page (how many depends on free, unfragmented memory).
        assert!(
            with_advice >= 2 << 10,
            "{with_advice} KiB of huge pages with the advice"
        );
        assert_eq!(without, 0, "huge pages without the advice");
    }
}
