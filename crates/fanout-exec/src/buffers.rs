//! Feature buffers recycled between mini-batches.
//!
//! A batch's feature matrix is tens of megabytes (116k rows x 100 floats on the products
//! preset). Allocated afresh for every batch, such a buffer comes from the allocator as newly
//! mapped memory (glibc maps blocks this large directly and unmaps them on free), so the
//! gather that fills it first takes a page fault and a zero-fill for every page it touches. A
//! consumer done with a batch's features hands the buffer back here, and the extract stage
//! fills it again: same pages, no faults.

use std::sync::Mutex;

/// A bounded free list of `Vec<f32>` buffers. Guarantees: [`BufferPool::take`] returns an
/// empty vector (length 0), with the capacity of a buffer given back earlier when there is
/// one; the pool holds at most its capacity of buffers and drops the rest, so it never holds
/// more memory than `capacity` of the largest batches. Safe to share between threads.
#[derive(Debug)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<f32>>>,
    capacity: usize,
}

impl BufferPool {
    /// A pool keeping at most `capacity` buffers (0: keeps none, every buffer is new).
    pub fn new(capacity: usize) -> Self {
        BufferPool {
            free: Mutex::new(Vec::with_capacity(capacity)),
            capacity,
        }
    }

    /// An empty buffer: the largest one given back, or a new (unallocated) one.
    pub fn take(&self) -> Vec<f32> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let largest = (0..free.len()).max_by_key(|&i| free[i].capacity());
        largest.map_or_else(Vec::new, |i| free.swap_remove(i))
    }

    /// Hands a buffer back for a later [`BufferPool::take`]; its contents are dropped. Kept only
    /// when the pool has room (and the buffer has memory to reuse).
    pub fn give(&self, mut buf: Vec<f32>) {
        buf.clear();
        if buf.capacity() == 0 {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.capacity {
            free.push(buf);
        }
    }

    /// Buffers held now.
    pub fn len(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether the pool holds no buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_back_buffer_is_reused_empty_with_its_memory() {
        let pool = BufferPool::new(2);
        let mut a = pool.take();
        assert_eq!(a.capacity(), 0);
        a.extend_from_slice(&[1.0; 1000]);
        let ptr = a.as_ptr();
        pool.give(a);
        let b = pool.take();
        assert!(b.is_empty());
        assert_eq!(b.as_ptr(), ptr, "the same allocation comes back");
        assert!(b.capacity() >= 1000);
        assert!(pool.is_empty());
    }

    #[test]
    fn the_pool_keeps_at_most_its_capacity_and_hands_out_the_largest() {
        let pool = BufferPool::new(2);
        for n in [10, 3000, 200] {
            pool.give(vec![0.0; n]);
        }
        assert_eq!(pool.len(), 2, "the third buffer is dropped");
        assert!(pool.take().capacity() >= 3000);
        assert_eq!(pool.take().capacity(), 10);
        pool.give(Vec::new());
        assert!(pool.is_empty(), "an unallocated buffer is not kept");
        let none = BufferPool::new(0);
        none.give(vec![1.0; 4]);
        assert!(none.is_empty());
    }
}
