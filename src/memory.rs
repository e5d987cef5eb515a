//! The CPU backend's [`MemoryProbe`]: a counting global allocator (current and peak heap bytes)
//! and `MemAvailable` from `/proc/meminfo` as the default device memory.
//!
//! Hand-written rather than a crate: it is 40 lines around the system allocator, and what
//! `--cache-ratio auto` needs is exactly "bytes in use now" and "the most in use since a reset",
//! counted over every thread (sampling and kernels run on rayon's pool), which a thread-local
//! or sampling profiler does not give. The cost is two relaxed atomic operations per
//! allocation and one per free.

use fanout_compute::HugePageAlloc;
use fanout_exec::MemoryProbe;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

static CURRENT: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

/// The system allocator with huge pages for large blocks ([`HugePageAlloc`]), counting the
/// bytes it has handed out and not yet taken back ([`in_use`]) and their highest value since
/// the last [`reset_peak`] ([`peak`]). Guarantee: allocates exactly as [`HugePageAlloc`] does;
/// the counts are over requested sizes (`Layout::size`), not the allocator's rounding or its
/// own bookkeeping.
pub struct CountingAlloc;

fn grow(n: usize) {
    let now = CURRENT.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
    if now > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

fn shrink(n: usize) {
    CURRENT.fetch_sub(n as u64, Ordering::Relaxed);
}

// SAFETY: every method forwards to `HugePageAlloc` with the same arguments and only adds counting,
// which never touches the memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = HugePageAlloc.alloc(layout);
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = HugePageAlloc.alloc_zeroed(layout);
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HugePageAlloc.dealloc(ptr, layout);
        shrink(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = HugePageAlloc.realloc(ptr, layout, new_size);
        if !p.is_null() {
            // Count the new block before forgetting the old one, so the peak covers a copy.
            grow(new_size);
            shrink(layout.size());
        }
        p
    }
}

/// Heap bytes in use now (through [`CountingAlloc`]; 0 if it is not the global allocator).
pub fn in_use() -> u64 {
    CURRENT.load(Ordering::Relaxed)
}

/// Restarts the peak from the bytes in use now and returns them.
pub fn reset_peak() -> u64 {
    let now = in_use();
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// The most heap bytes in use since the last [`reset_peak`].
pub fn peak() -> u64 {
    PEAK.load(Ordering::Relaxed).max(in_use())
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes (the file gives kB).
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut it = line["MemAvailable:".len()..].split_whitespace();
    let kb: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") => kb.checked_mul(1024),
        _ => None,
    }
}

/// The host heap as the CPU backend's device memory: peak through [`CountingAlloc`], default
/// budget `MemAvailable`.
pub struct HostHeap;

impl MemoryProbe for HostHeap {
    fn name(&self) -> String {
        "host heap".into()
    }
    fn available(&self) -> Result<u64, String> {
        let text = std::fs::read_to_string("/proc/meminfo")
            .map_err(|e| format!("cannot read /proc/meminfo ({e})"))?;
        mem_available(&text).ok_or_else(|| "/proc/meminfo has no MemAvailable line in kB".into())
    }
    fn reset_peak(&self) -> u64 {
        reset_peak()
    }
    fn peak(&self) -> u64 {
        peak()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_parsed_in_bytes() {
        let t = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(mem_available(t), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: many kB\n"), None);
        assert_eq!(mem_available("MemAvailable: 5 MB\n"), None);
        if let Ok(t) = std::fs::read_to_string("/proc/meminfo") {
            assert!(HostHeap.available().unwrap() > 0, "{t}");
        }
    }

    #[test]
    fn the_counting_allocator_sees_a_buffer_on_another_thread() {
        // The test harness runs with the binary's global allocator (main.rs).
        let start = HostHeap.reset_peak();
        let n = 32 << 20;
        let h = std::thread::spawn(move || {
            let v = vec![1u8; n];
            v.iter().map(|&x| x as u64).sum::<u64>()
        });
        assert_eq!(h.join().unwrap(), n as u64);
        let p = HostHeap.peak();
        // At least the buffer (the other tests of this binary run in parallel and may free
        // a few KB between the reset and the allocation, so not necessarily `start + n`).
        assert!(p >= n as u64 && p >= start, "peak {p} after start {start}");
        // Resetting forgets the buffer, which is freed.
        let again = HostHeap.reset_peak();
        assert!(HostHeap.peak() < again + n as u64);
    }
}
