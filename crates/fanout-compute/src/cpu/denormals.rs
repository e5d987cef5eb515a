//! Denormal (subnormal) floats flushed to zero while a model trains.
//!
//! Late in training, gradients and the products built from them shrink towards zero, and
//! values under `f32::MIN_POSITIVE` (about 1.2e-38) are subnormal. An x86 core computes on
//! them through a microcode assist that costs on the order of a hundred cycles per operation,
//! so a GEMM whose inputs hold many of them runs several times slower while its results are
//! the same to every bit that matters to an f32 weight. The CPU's two control bits avoid
//! that: FTZ writes a subnormal result as zero and DAZ reads a subnormal input as zero.
//! TensorFlow sets both on its CPU threads; PyTorch leaves them off unless
//! `torch.set_flush_denormal(True)` is called.
//!
//! [`FlushDenormals`] sets both on the calling thread and on every thread of a rayon pool for
//! as long as it lives, and puts each thread's previous setting back when dropped, so a
//! program that calls fanout (a Python session, say) keeps its own floating-point mode. The
//! bits live in each thread's `MXCSR` register; nothing in the standard library or in a
//! well-kept crate sets them, hence the two instructions written here. On other
//! architectures the guard does nothing.

use std::cell::Cell;

/// The `MXCSR` bits set: flush-to-zero (bit 15) and denormals-are-zero (bit 6).
#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

thread_local! {
    /// This thread's control word before the first live guard set it (`None`: no guard).
    static SAVED: Cell<Option<u32>> = const { Cell::new(None) };
    /// Guards alive on this thread (guards of two trainers sharing a pool may overlap).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

#[cfg(target_arch = "x86_64")]
fn control_word() -> u32 {
    let mut csr = 0u32;
    // SAFETY: `stmxcsr` stores the 32-bit MXCSR at the given address, which is `csr`'s;
    // every x86-64 CPU has SSE.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
    }
    csr
}

#[cfg(target_arch = "x86_64")]
fn set_control_word(csr: u32) {
    // SAFETY: `ldmxcsr` loads MXCSR from `csr`; callers only change the FTZ and DAZ bits of
    // a word read from this thread (exceptions stay masked, rounding stays as it was).
    unsafe {
        std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags));
    }
}

/// Whether this thread now flushes subnormal inputs and results to zero (always false off
/// x86-64).
pub fn flushing_denormals() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        control_word() & FTZ_DAZ == FTZ_DAZ
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Sets FTZ and DAZ on this thread, remembering the setting they replace (first guard only).
fn enter() {
    let depth = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    #[cfg(target_arch = "x86_64")]
    if depth == 1 {
        let csr = control_word();
        SAVED.with(|s| s.set(Some(csr)));
        set_control_word(csr | FTZ_DAZ);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = depth;
}

/// Undoes [`enter`]: the last guard out puts the remembered FTZ and DAZ bits back (the
/// other bits, such as the exception flags raised meanwhile, are left as they are).
fn leave() {
    let depth = DEPTH.with(|d| {
        let n = d.get().saturating_sub(1);
        d.set(n);
        n
    });
    if depth == 0 {
        if let Some(_saved) = SAVED.with(Cell::take) {
            #[cfg(target_arch = "x86_64")]
            set_control_word((control_word() & !FTZ_DAZ) | (_saved & FTZ_DAZ));
        }
    }
}

/// While alive, the thread that made it and every thread of its pool flush subnormal floats
/// to zero (see the module docs); dropped, each gets its previous setting back. Results of
/// the kernels then stay bit-identical for any thread count: every thread rounds alike.
///
/// A thread starts with the setting of the thread that starts it, so threads started from
/// the guarded thread while the guard lives flush too, and keep flushing after it: the guard
/// starts rayon's global pool before it flushes the calling thread, so that pool's workers
/// are never born flushing. The guard must be dropped on the thread that made it (it is not
/// `Send`). Every worker of the pool runs a short job when the guard is made and when it is
/// dropped, so a pool whose workers wait on the calling thread must not be given to it.
#[must_use = "the setting lasts as long as the guard"]
pub struct FlushDenormals {
    pool: Option<std::sync::Arc<rayon::ThreadPool>>,
    /// Tied to the thread whose setting it changed.
    _thread: std::marker::PhantomData<*const ()>,
}

impl FlushDenormals {
    /// Flushes on the calling thread and on every worker of `pool`, or of the current rayon
    /// pool when `None` (the pool of the calling worker, else the global one).
    pub fn on(pool: Option<std::sync::Arc<rayon::ThreadPool>>) -> Self {
        // Starts the global pool, if nothing has, while this thread still has its own mode.
        let _ = rayon::current_num_threads();
        match &pool {
            Some(p) => p.broadcast(|_| enter()),
            None => rayon::broadcast(|_| enter()),
        };
        enter();
        FlushDenormals {
            pool,
            _thread: std::marker::PhantomData,
        }
    }
}

impl Drop for FlushDenormals {
    fn drop(&mut self) {
        leave();
        match &self.pool {
            Some(p) => p.broadcast(|_| leave()),
            None => rayon::broadcast(|_| leave()),
        };
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::hint::black_box;

    /// A subnormal result of two normal inputs, and a subnormal input times one.
    fn subnormal_arithmetic() -> (f32, f32) {
        let tiny = black_box(f32::MIN_POSITIVE);
        let sub = black_box(f32::from_bits(1));
        (black_box(tiny * 0.25), black_box(sub * 1.0))
    }

    #[test]
    fn the_guard_flushes_this_thread_and_its_pool_and_restores_both() {
        let pool = std::sync::Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap(),
        );
        let on_workers = |p: &rayon::ThreadPool| p.broadcast(|_| subnormal_arithmetic());
        assert!(!flushing_denormals());
        assert_ne!(
            subnormal_arithmetic().0,
            0.0,
            "subnormals are kept by default"
        );
        {
            let _g = FlushDenormals::on(Some(pool.clone()));
            assert!(flushing_denormals());
            assert_eq!(subnormal_arithmetic(), (0.0, 0.0));
            for (r, s) in on_workers(&pool) {
                assert_eq!((r, s), (0.0, 0.0));
            }
            {
                // A second guard over the same threads: its drop keeps the first one's setting.
                let _inner = FlushDenormals::on(Some(pool.clone()));
            }
            assert!(flushing_denormals());
            assert!(pool.broadcast(|_| flushing_denormals()).iter().all(|&f| f));
        }
        assert!(!flushing_denormals());
        assert_eq!(subnormal_arithmetic().0, f32::MIN_POSITIVE * 0.25);
        assert_eq!(subnormal_arithmetic().1, f32::from_bits(1));
        assert!(pool.broadcast(|_| !flushing_denormals()).iter().all(|&f| f));
    }

    #[test]
    fn threads_started_under_a_guard_flush_and_the_global_pool_stops_after_it() {
        std::thread::spawn(|| {
            let _g = FlushDenormals::on(None);
            assert!(std::thread::spawn(flushing_denormals).join().unwrap());
            assert!(rayon::broadcast(|_| flushing_denormals())
                .iter()
                .all(|&f| f));
            drop(_g);
            assert!(rayon::broadcast(|_| !flushing_denormals())
                .iter()
                .all(|&f| f));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_that_already_flushed_keeps_flushing_after_a_guard() {
        std::thread::spawn(|| {
            // The global pool started first: started from this thread once it flushes, its
            // workers would flush for good (and fail the test beside this one).
            let _ = rayon::current_num_threads();
            set_control_word(control_word() | FTZ_DAZ);
            drop(FlushDenormals::on(Some(std::sync::Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .unwrap(),
            ))));
            assert!(flushing_denormals());
        })
        .join()
        .unwrap();
    }
}
