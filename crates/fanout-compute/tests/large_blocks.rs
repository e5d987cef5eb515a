//! `HugePageAlloc` keeps freed large blocks and hands them to the next request they fit, whose
//! pages then do not fault again; with `FANOUT_BLOCK_CACHE_MB=0` every block is fresh.
//!
//! One test in its own binary (the kept blocks are process-wide, so no other test may allocate
//! large blocks meanwhile); the no-cache case runs this binary again in a child process with
//! the variable set.
#![cfg(target_os = "linux")]

use std::alloc::{GlobalAlloc, Layout};

use fanout_compute::{kept_bytes, HugePageAlloc};

/// Minor page faults of this thread so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    u.ru_minflt
}

/// Allocates `mb` MiB through `HugePageAlloc`, writes every byte, and returns the block and the
/// page faults the writing took.
fn touch(mb: usize) -> (*mut u8, Layout, i64) {
    let layout = Layout::from_size_align(mb << 20, 64).unwrap();
    // SAFETY: a non-zero layout; written within its size.
    let p = unsafe { HugePageAlloc.alloc(layout) };
    assert!(!p.is_null());
    let before = minor_faults();
    unsafe { std::ptr::write_bytes(p, 0x5a, layout.size()) };
    (p, layout, minor_faults() - before)
}

const CHILD: &str = "FANOUT_LARGE_BLOCKS_CHILD";

#[test]
fn freed_blocks_are_reused_without_faults_unless_the_cache_is_off() {
    if std::env::var_os(CHILD).is_some() {
        // The child: nothing is kept, every block faults afresh.
        let (p, layout, _) = touch(64);
        unsafe { HugePageAlloc.dealloc(p, layout) };
        assert_eq!(kept_bytes(), 0, "FANOUT_BLOCK_CACHE_MB=0 keeps nothing");
        let (q, layout, faults) = touch(60);
        // At least one fault per 2 MiB page (512 per 2 MiB without huge pages).
        assert!(faults >= 30, "{faults} faults writing a fresh 60 MiB block");
        unsafe { HugePageAlloc.dealloc(q, layout) };
        return;
    }
    let (p, layout, first) = touch(64);
    assert!(first >= 32, "{first} faults writing a fresh 64 MiB block");
    unsafe { HugePageAlloc.dealloc(p, layout) };
    assert_eq!(kept_bytes(), 64 << 20);
    // A slightly smaller request gets the same block back, already backed: no faults.
    let (q, layout, again) = touch(60);
    assert_eq!(q, p, "the kept block is reused");
    assert!(again <= 2, "{again} faults writing a reused block");
    assert_eq!(kept_bytes(), 0);
    // A zeroed request on a reused block is zero.
    unsafe { HugePageAlloc.dealloc(q, layout) };
    let z = unsafe { HugePageAlloc.alloc_zeroed(layout) };
    assert_eq!(z, p);
    assert!(unsafe { std::slice::from_raw_parts(z, layout.size()) }
        .iter()
        .all(|&b| b == 0));
    // A request over 1.5x smaller does not pin the big block.
    let small = Layout::from_size_align(8 << 20, 64).unwrap();
    let s = unsafe { HugePageAlloc.alloc(small) };
    assert_ne!(s, z);
    unsafe {
        HugePageAlloc.dealloc(s, small);
        HugePageAlloc.dealloc(z, layout);
    }

    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new(me)
        .args([
            "--exact",
            "freed_blocks_are_reused_without_faults_unless_the_cache_is_off",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("FANOUT_BLOCK_CACHE_MB", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
