//! Where samplers read the rows from: the dataset's memory-mapped files, or a private copy in
//! anonymous memory advised for transparent huge pages.
//!
//! Sampling is random access to `indptr` and `indices`: with 4 KiB pages almost every row read
//! also misses the TLB once the topology outgrows a few MiB (and a TLB miss costs a nested page
//! walk in a virtual machine). A copy backed by 2 MiB pages removes most of those misses; measured
//! here, k-hop sampling ran 10% faster on the products preset (12.6M arcs) and 20% faster at its
//! full scale (123.7M arcs). The copy is made on the first mini-batch, once per dataset object:
//! samplers built from the same `Arc<Dataset>` share it.

use crate::graph::{with_csr, Csr, CsrJob};
use fanout_graph::{Array, Dataset, Ids, NoProgress, Offsets};
use std::marker::PhantomData;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Where a sampler reads the topology from: with [`Residency::Auto`] or
/// [`Residency::Resident`], 32-bit topologies are copied into huge-page memory (64-bit ones
/// always stay mapped).
pub use fanout_graph::Residency;

/// Element types a [`HugeBuf`] may hold.
///
/// # Safety
/// All-zero bytes must be a valid value, the type must have no padding and the alignment must
/// divide the page size.
pub(crate) unsafe trait Plain: Send + Sync + 'static {}
// SAFETY: plain integers / atomics of them; zero is valid; alignment 4.
unsafe impl Plain for u32 {}
// SAFETY: AtomicU32 has the layout of u32.
unsafe impl Plain for AtomicU32 {}

/// A zero-initialised array in anonymous memory, advised for transparent huge pages where the
/// system supports it (Linux); plain anonymous memory elsewhere.
pub(crate) struct HugeBuf<T: Plain> {
    map: memmap2::MmapMut,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Plain> HugeBuf<T> {
    /// `len` zeroed elements. Panics if the memory cannot be mapped.
    pub fn zeroed(len: usize) -> Self {
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        let map = memmap2::MmapMut::map_anon(bytes).expect("map anonymous memory");
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        HugeBuf {
            map,
            len,
            _t: PhantomData,
        }
    }
}

impl<T: Plain> std::ops::Deref for HugeBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping is page-aligned, holds at least `len` elements, is zero-initialised
        // (valid for `Plain` types) and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr() as *const T, self.len) }
    }
}

impl<T: Plain> std::ops::DerefMut for HugeBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and the borrow of `self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr() as *mut T, self.len) }
    }
}

/// A resident copy of a 32-bit topology.
struct ResidentCsr {
    indptr: Array<u32>,
    indices: Array<u32>,
}

/// Copies shared between samplers built from the same dataset object.
static SHARED: Mutex<Vec<(Weak<Dataset>, Weak<ResidentCsr>)>> = Mutex::new(Vec::new());

/// The rows a sampler reads: the dataset's topology, or a resident copy of it, made (or found
/// among the copies of other samplers of the same dataset object) on first use.
pub(crate) struct Rows {
    ds: Arc<Dataset>,
    residency: Residency,
    copy: OnceLock<Option<Arc<ResidentCsr>>>,
}

impl Rows {
    /// Rows for `ds`, to be copied into huge-page memory when `residency` says so.
    pub fn new(ds: Arc<Dataset>, residency: Residency) -> Rows {
        Rows {
            ds,
            residency,
            copy: OnceLock::new(),
        }
    }

    fn copy(&self) -> Option<&Arc<ResidentCsr>> {
        self.copy
            .get_or_init(
                || match (&self.ds.topology.indptr, &self.ds.topology.indices) {
                    (Offsets::U32(p), Ids::U32(i))
                        if self.residency.wants_copy((p.len() + i.len()) as u64 * 4) =>
                    {
                        Some(shared_copy(&self.ds, p, i))
                    }
                    _ => None,
                },
            )
            .as_ref()
    }

    /// Whether the rows are read from a resident copy.
    pub fn is_resident(&self) -> bool {
        self.copy().is_some()
    }

    /// Runs `job` on the rows.
    pub fn run<J: CsrJob>(&self, job: J) -> J::Out {
        match self.copy() {
            Some(c) => job.run(Csr {
                indptr: &c.indptr[..],
                indices: &c.indices[..],
            }),
            None => with_csr(&self.ds.topology, job),
        }
    }
}

fn shared_copy(ds: &Arc<Dataset>, p: &[u32], i: &[u32]) -> Arc<ResidentCsr> {
    let mut shared = SHARED.lock().unwrap();
    shared.retain(|(d, c)| d.strong_count() > 0 && c.strong_count() > 0);
    let found = shared.iter().find_map(|(d, c)| {
        d.upgrade()
            .filter(|d| Arc::ptr_eq(d, ds))
            .and_then(|_| c.upgrade())
    });
    if let Some(c) = found {
        return c;
    }
    let copy_of = |src| Array::resident_from(src, &NoProgress).expect("map anonymous memory");
    let copy = Arc::new(ResidentCsr {
        indptr: copy_of(p),
        indices: copy_of(i),
    });
    shared.push((Arc::downgrade(ds), Arc::downgrade(&copy)));
    copy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{install_from_threads, pool, random_graph};

    struct RowSum(u32);
    impl CsrJob for RowSum {
        type Out = (usize, u64);
        fn run<O: fanout_graph::Offset, I: fanout_graph::VertexId>(
            self,
            g: Csr<'_, O, I>,
        ) -> (usize, u64) {
            let row = g.row(self.0);
            (row.len(), row.iter().map(|&x| x.into()).sum())
        }
    }

    #[test]
    fn resident_copy_reads_the_same_rows_and_is_shared() {
        let ds = random_graph(500, 50, 3);
        let mapped = Rows::new(ds.clone(), Residency::Mapped);
        let a = Rows::new(ds.clone(), Residency::Resident);
        let b = Rows::new(ds.clone(), Residency::Auto);
        assert!(!mapped.is_resident() && a.is_resident() && b.is_resident());
        assert!(Arc::ptr_eq(a.copy().unwrap(), b.copy().unwrap()));
        for v in [0u32, 1, 250, 499] {
            assert_eq!(a.run(RowSum(v)), mapped.run(RowSum(v)));
        }
        let z: HugeBuf<AtomicU32> = HugeBuf::zeroed(10);
        assert_eq!(z.len(), 10);
    }

    /// The copy is made on first use, which is on pool workers when batches are sampled in
    /// parallel (several loaders sharing a sampler): concurrent first uses must not
    /// deadlock. (A copy made with rayon jobs inside the `OnceLock` initialiser did: its
    /// worker, waiting for a stolen part of the copy, ran another loader's sampling job, which
    /// re-entered the initialiser.)
    #[test]
    fn concurrent_first_uses_from_outside_the_pool_finish() {
        // Over 2^20 ids: the rayon fill this replaced split them into jobs.
        let ds = random_graph(60_000, 50, 5);
        let plain = Rows::new(ds.clone(), Residency::Mapped);
        let want: Vec<(usize, u64)> = (0..64u32).map(|v| plain.run(RowSum(v * 97))).collect();
        let pool = Arc::new(pool(2));
        for _ in 0..3 {
            // Fresh rows each round: every round makes (or finds) the copy on first use.
            let rows = Arc::new(Rows::new(ds.clone(), Residency::Resident));
            let jobs: Vec<_> = (0..8)
                .map(|_| {
                    let rows = rows.clone();
                    move || {
                        (0..64u32)
                            .map(|v| rows.run(RowSum(v * 97)))
                            .collect::<Vec<_>>()
                    }
                })
                .collect();
            for got in install_from_threads(&pool, jobs) {
                assert_eq!(got, want);
            }
        }
    }
}
