//! The communicator of multi-worker training: every multi-worker strategy talks to the other
//! workers only through the [`Comm`] trait.
//!
//! # Two implementations
//!
//! - [`LocalComm`] (always built): the workers are threads of one process
//!   (`fanout train --workers N`). [`LocalComm::group`] makes the `N` members, one per worker
//!   thread. Collectives meet in shared state (a mutex and a condition variable); no bytes are
//!   serialised. A group of one (every single-worker run) answers every collective without locking
//!   anything.
//! - `MpiComm` (cargo feature `mpi`, Open MPI through the `mpi` crate): one worker per MPI process
//!   over `MPI_COMM_WORLD` (a duplicate of it). Build with `cargo build --release --features mpi`
//!   (Debian: `libopenmpi-dev openmpi-bin libclang-dev`) and launch with
//!   `mpirun -np 4 fanout train ...` or, under Slurm, `srun -n 4 --mpi=pmix fanout train ...`.
//!   [`launched_by_mpi`] (always built) tells a program that it was started that way.
//!
//! # Determinism
//!
//! [`Comm::all_reduce_sum_f32`] and [`Comm::all_reduce_sum_f64`] add in rank order: element `i`
//! of the result is `((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{N-1}[i]`, where `x_r` is rank `r`'s
//! buffer, and every rank gets the same bits. Both implementations use the same algorithm
//! (reduce-scatter of contiguous chunks, the sum of each chunk in rank order, then all-gather of
//! the summed chunks), so a run is reproducible for a given seed and worker count whatever the
//! transport, thread timing or network. `MPI_Allreduce` is not used: it does not fix the order.
//!
//! # Misuse
//!
//! Collectives check what they can across ranks (the same collective on every rank, equal
//! lengths for the sums, the same valid root, one send buffer per rank) and then every rank's
//! call returns the same [`CommError::Invalid`], so misuse is reported, never a hang.
//!
//! # Failure
//!
//! A worker that cannot go on calls [`Comm::fail`]. With [`LocalComm`] every other member's
//! pending and later calls return [`CommError::PeerFailed`] promptly; a member dropped (its
//! thread returned or panicked) likewise fails the others' collectives. With `MpiComm`, `fail`
//! prints `fanout: rank R: message` on stderr and calls `MPI_Abort`, which ends every process of
//! the job (so under MPI a peer's failure ends this process rather than returning an error), and
//! `mpirun` exits non-zero.
//!
//! # Device buffers (NCCL)
//!
//! This trait moves host memory. GPUs sum gradients among themselves through NCCL in the CUDA
//! crate (`fanout_cuda::CudaBackend::join_group`, used through
//! `fanout_compute::Backend::sum_over_group`), bootstrapped through a `Comm`: rank 0 makes the
//! NCCL id and sends it to every rank with [`Comm::broadcast`]. NCCL's own reductions are not
//! rank-ordered, so the group gathers every rank's values (`ncclAllGather`) and adds them in
//! rank order on each device, which gives this trait's sums bit for bit.

#![warn(missing_docs)]

mod local;
#[cfg(feature = "mpi")]
mod mpi_comm;

pub mod conformance;

pub use local::LocalComm;
#[cfg(feature = "mpi")]
pub use mpi_comm::MpiComm;

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The result of a communicator call.
pub type Result<T> = std::result::Result<T, CommError>;

/// Why a communicator call did not complete.
#[derive(Debug, Clone, PartialEq)]
pub enum CommError {
    /// Another rank called `fail` (or died): its rank and message.
    PeerFailed {
        /// The rank that failed.
        rank: usize,
        /// What it said (or "exited ..." / "panicked" when it went away).
        message: String,
    },
    /// Misuse: bad rank, mismatched lengths between ranks, etc.
    Invalid(String),
    /// The MPI library reported an error.
    Mpi(String),
}

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommError::PeerFailed { rank, message } => write!(f, "rank {rank} failed: {message}"),
            CommError::Invalid(m) => write!(f, "invalid communicator use: {m}"),
            CommError::Mpi(m) => write!(f, "MPI error: {m}"),
        }
    }
}

impl std::error::Error for CommError {}

/// What a communicator has done so far on this rank (for metrics).
///
/// `bytes_sent` counts payload bytes this rank hands to other ranks (its own share is not
/// counted, nor the few bytes of per-call headers the MPI implementation exchanges); the count is
/// the same for both implementations. Per call, with `N` ranks and element size `s`:
/// a sum of `L` elements sends `s * ((L - c) + (N - 1) * c)` where `c` is this rank's chunk
/// (about `L / N`), so about `2 * s * L * (N - 1) / N`; `broadcast` sends `len * (N - 1)` from the
/// root and nothing from the others; `all_gather` sends `len * (N - 1)`; `all_to_all_v` sends the
/// bytes of `send[j]` for `j != rank`; `send` counts its bytes unless sent to itself; `barrier`
/// sends nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct CommStats {
    /// Calls that returned `Ok` (of every method except `rank`, `size`, `kind`, `fail` and
    /// `stats`).
    pub calls: u64,
    /// Payload bytes sent to other ranks (see the type's doc).
    pub bytes_sent: u64,
    /// Wall-clock seconds spent inside those calls, waiting included.
    pub seconds: f64,
}

/// The largest point-to-point tag: 32767, the smallest `MPI_TAG_UB` the MPI standard allows.
/// Both implementations reject larger tags with [`CommError::Invalid`], so a program that works
/// in-process also works under any MPI.
pub const MAX_TAG: u32 = 32767;

/// The communicator: rank, size, deterministic collectives and ordered point-to-point messages.
///
/// Every rank must make the same sequence of collective calls (as in MPI). A communicator is
/// `Send + Sync`, so a worker may share it between its pipeline threads; point-to-point calls may
/// come from any of them, collectives should come from one thread per rank at a time.
pub trait Comm: Send + Sync {
    /// This worker's rank, in `0..size()`.
    fn rank(&self) -> usize;
    /// The number of workers (at least 1).
    fn size(&self) -> usize;
    /// "local" or "mpi" (for metrics).
    fn kind(&self) -> &'static str;
    /// Returns once every rank has called `barrier`.
    fn barrier(&self) -> Result<()>;
    /// In-place sum over ranks. Deterministic: the result is bit-identical on every rank and is
    /// the sum taken in rank order 0,1,..,N-1 (so a run is reproducible per seed and worker count).
    /// Every rank must pass the same length (Err(Invalid) otherwise where detectable).
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()>;
    /// Same for f64 (metrics: losses, counts).
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;
    /// Root's bytes to every rank (length may differ from the receivers' initial Vec; receivers'
    /// Vec is replaced). Every rank must pass the same `root < size()` (Err(Invalid) otherwise).
    fn broadcast(&self, root: usize, buf: &mut Vec<u8>) -> Result<()>;
    /// Every rank's bytes, indexed by rank (variable lengths).
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// `send[j]` goes to rank j; returns `recv` with `recv[i]` = what rank i sent to me. Variable
    /// lengths.
    /// `send.len()` must be `size()` on every rank (Err(Invalid) on every rank otherwise).
    fn all_to_all_v(&self, send: &[Vec<u8>]) -> Result<Vec<Vec<u8>>>;
    /// [`Comm::all_to_all_v`] for f32 values.
    fn all_to_all_v_f32(&self, send: &[Vec<f32>]) -> Result<Vec<Vec<f32>>>;
    /// Point to point; messages between a pair with the same tag arrive in order. `to` may be
    /// this rank. `tag <= MAX_TAG`. Do not rely on buffering: under MPI a large message may
    /// block until the receiver posts the matching `recv` (in-process sends never block).
    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()>;
    /// Receives the next message from `from` with `tag` (blocking).
    fn recv(&self, from: usize, tag: u32) -> Result<Vec<u8>>;
    /// This rank failed with `message`: every other rank's pending and later calls return
    /// Err(PeerFailed{rank, message}) instead of hanging.
    ///
    /// [`LocalComm`]: returns; this member's own later calls also return that error.
    /// `MpiComm`: prints "fanout: rank R: message" on stderr and calls `MPI_Abort` (error code 1),
    /// which ends every process of the job; it never returns.
    fn fail(&self, message: &str);
    /// Bytes this rank has sent so far through collectives and send (for metrics), and the
    /// seconds spent inside calls.
    fn stats(&self) -> CommStats;
    /// Collective: splits the group by `color`. Every rank gets a new communicator joining
    /// the ranks that passed the same color, ranked in their order in this group (like
    /// `MPI_Comm_split` with the old rank as key). Used by strategies whose roles reduce among
    /// themselves only (GNNLab's trainers). The new group's collectives and messages are
    /// separate from this group's.
    fn split(&self, color: usize) -> Result<Box<dyn Comm>>;
    /// Collective: `(node_rank, node_size)`, this rank's place among the ranks that run on its
    /// machine (in the order of their ranks) and how many they are. A launcher that starts
    /// one process per GPU gives each the GPU of its node rank. In process: `(rank, size)`;
    /// under MPI, `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`.
    fn node_ranks(&self) -> Result<(usize, usize)>;
    /// Whether two threads of this rank may run collectives at the same time, each on its own
    /// communicator (this one and one made by [`Comm::split`]): true in process and under
    /// `MPI_THREAD_MULTIPLE`, false under `MPI_THREAD_SERIALIZED` (one collective holds the
    /// process-wide lock until every rank has joined it).
    fn concurrent_collectives(&self) -> bool {
        true
    }
}

/// True when this process was started by an MPI launcher (`mpirun`/`mpiexec` of Open MPI or
/// MPICH, or `srun` with PMI/PMIx): one of `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `PMI_RANK`,
/// `PMIX_RANK` is set. Needs no MPI library, so a command line can decide whether to create an
/// `MpiComm` or say that the binary was built without the `mpi` feature.
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The elements of a length-`len` buffer that rank `r` of `n` sums in a reduce-scatter:
/// contiguous chunks, the first `len % n` ranks one element longer.
pub(crate) fn chunk(len: usize, n: usize, r: usize) -> Range<usize> {
    let base = len / n;
    let extra = len % n;
    let lo = r * base + r.min(extra);
    let hi = lo + base + usize::from(r < extra);
    lo..hi
}

/// `out = parts[0] + parts[1] + ...`, added in that order element by element. Every part has
/// `out.len()` elements.
pub(crate) fn sum_in_order<T: Copy + std::ops::Add<Output = T>>(parts: &[&[T]], out: &mut [T]) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    out.copy_from_slice(first);
    for p in rest {
        for (o, x) in out.iter_mut().zip(p.iter()) {
            *o = *o + *x;
        }
    }
}

/// The bytes a rank sends in a rank-ordered sum of `len` elements of `elem` bytes (see
/// [`CommStats`]).
pub(crate) fn sum_bytes_sent(len: usize, n: usize, r: usize, elem: usize) -> u64 {
    let c = chunk(len, n, r).len();
    ((len - c) + (n - 1) * c) as u64 * elem as u64
}

/// Lock-free call counters behind [`Comm::stats`].
#[derive(Default)]
pub(crate) struct StatsCell {
    calls: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
}

impl StatsCell {
    /// Records one call that started at `start` and sent `bytes`.
    pub(crate) fn record(&self, start: Instant, bytes: u64) {
        let ns = start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.nanos.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> CommStats {
        CommStats {
            calls: self.calls.load(Ordering::Relaxed),
            bytes_sent: self.bytes.load(Ordering::Relaxed),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

/// The collectives, named in mismatch errors and coded in the MPI per-call header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Barrier = 1,
    SumF32 = 2,
    SumF64 = 3,
    Broadcast = 4,
    AllGather = 5,
    AllToAll = 6,
    AllToAllF32 = 7,
    /// The second step of a sum (the all-gather of the summed chunks), in-process only.
    SumGather = 8,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Barrier => "barrier",
            Op::SumF32 => "all_reduce_sum_f32",
            Op::SumF64 => "all_reduce_sum_f64",
            Op::Broadcast => "broadcast",
            Op::AllGather => "all_gather",
            Op::AllToAll => "all_to_all_v",
            Op::AllToAllF32 => "all_to_all_v_f32",
            Op::SumGather => "all_reduce_sum (gather step)",
        }
    }

    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn from_code(code: u64) -> Option<Op> {
        [
            Op::Barrier,
            Op::SumF32,
            Op::SumF64,
            Op::Broadcast,
            Op::AllGather,
            Op::AllToAll,
            Op::AllToAllF32,
            Op::SumGather,
        ]
        .into_iter()
        .find(|op| *op as u64 == code)
    }
}

/// The error every rank reports when ranks called different collectives (`ops[r]` is rank `r`'s).
pub(crate) fn op_mismatch(ops: &[Option<Op>]) -> Option<CommError> {
    let first = ops.first().copied().flatten();
    if ops.iter().all(|o| *o == first && o.is_some()) {
        return None;
    }
    let list: Vec<String> = ops
        .iter()
        .enumerate()
        .map(|(r, o)| format!("rank {r}: {}", o.map_or("unknown", Op::name)))
        .collect();
    Some(CommError::Invalid(format!(
        "ranks called different collectives ({})",
        list.join(", ")
    )))
}

/// Checks a point-to-point peer and tag.
pub(crate) fn check_p2p(peer: usize, size: usize, tag: u32) -> Result<()> {
    if peer >= size {
        return Err(CommError::Invalid(format!(
            "rank {peer} out of range (size {size})"
        )));
    }
    if tag > MAX_TAG {
        return Err(CommError::Invalid(format!(
            "tag {tag} above MAX_TAG ({MAX_TAG})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_tile_the_buffer() {
        for len in [0usize, 1, 2, 5, 7, 1003] {
            for n in 1..=5 {
                let mut next = 0;
                for r in 0..n {
                    let c = chunk(len, n, r);
                    assert_eq!(c.start, next, "len {len} n {n} r {r}");
                    assert!(c.len() == len / n || c.len() == len / n + 1);
                    next = c.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn display_is_one_line() {
        let e = CommError::PeerFailed {
            rank: 1,
            message: "out of memory".into(),
        };
        assert_eq!(e.to_string(), "rank 1 failed: out of memory");
        assert!(!CommError::Invalid("x".into()).to_string().contains('\n'));
        assert_eq!(CommError::Mpi("y".into()).to_string(), "MPI error: y");
    }

    #[test]
    fn op_codes_round_trip_and_mismatch_is_reported() {
        for code in 0..10 {
            if let Some(op) = Op::from_code(code) {
                assert_eq!(op as u64, code);
            }
        }
        assert!(Op::from_code(0).is_none());
        assert!(op_mismatch(&[Some(Op::Barrier), Some(Op::Barrier)]).is_none());
        let e = op_mismatch(&[Some(Op::Barrier), Some(Op::AllGather)]).unwrap();
        assert!(e.to_string().contains("rank 1: all_gather"), "{e}");
        assert!(op_mismatch(&[None]).is_some());
    }

    #[test]
    fn sum_bytes_follow_the_chunks() {
        assert_eq!(sum_bytes_sent(10, 1, 0, 4), 0);
        // n = 2, len 10: chunk 5; sends 5 in the scatter and 5 in the gather.
        assert_eq!(sum_bytes_sent(10, 2, 0, 4), 40);
        // n = 3, len 10: rank 0's chunk is 4: sends 6, then 4 to each of 2 ranks.
        assert_eq!(sum_bytes_sent(10, 3, 0, 8), (6 + 8) * 8);
    }

    #[test]
    fn launched_by_mpi_reads_the_launcher_variables() {
        // `cargo test` does not run under a launcher (mpi_check covers the other case).
        let vars = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"];
        if vars.iter().all(|v| std::env::var_os(v).is_none()) {
            assert!(!launched_by_mpi());
        }
    }

    #[test]
    fn p2p_checks() {
        assert!(check_p2p(1, 2, MAX_TAG).is_ok());
        assert!(matches!(check_p2p(2, 2, 0), Err(CommError::Invalid(_))));
        assert!(matches!(
            check_p2p(0, 2, MAX_TAG + 1),
            Err(CommError::Invalid(_))
        ));
    }
}
