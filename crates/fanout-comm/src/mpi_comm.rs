//! One worker per MPI process (cargo feature `mpi`).

use crate::{
    check_p2p, chunk, op_mismatch, sum_bytes_sent, sum_in_order, Comm, CommError, CommStats, Op,
    Result, StatsCell,
};
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::{Count, Threading};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The largest element count of one MPI call (MPI counts and displacements are C `int`s).
const MAX_COUNT: u64 = i32::MAX as u64;

/// A zero-filled buffer of `len` elements whose address is a real allocation even when empty.
///
/// Open MPI's `MPI_IN_PLACE` is the address 1, which is also where an empty Rust slice of bytes
/// points; passed as a collective's buffer, it would mean "in place" (or be rejected).
fn buffer<T: Clone + Default>(len: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(len.max(1));
    v.resize(len, T::default());
    v
}

/// `s`, or an empty slice at `pad`'s (real) address when `s` is empty (see [`buffer`]).
fn real<'a, T>(s: &'a [T], pad: &'a [T; 1]) -> &'a [T] {
    if s.is_empty() {
        &pad[..0]
    } else {
        s
    }
}

/// A worker of an MPI job: rank and size of (a duplicate of) `MPI_COMM_WORLD`.
///
/// Made once per process by [`MpiComm::init`]; it keeps MPI initialised for its lifetime and
/// finalises it when dropped (so create it early and drop it last).
///
/// Every collective first all-gathers a 24-byte header per rank (the collective, its lengths or
/// root) so that every rank detects misuse the same way and returns the same
/// [`CommError::Invalid`]. Data then moves as follows, `N` ranks, `L` elements of `s` bytes:
/// a sum is an `MPI_Alltoallv` of contiguous chunks (rank `r` receives everyone's chunk `r`),
/// the chunk summed in rank order locally, and an `MPI_Allgatherv` of the summed chunks: each
/// rank sends and receives about `2 * s * L * (N - 1) / N` bytes, like a ring all-reduce;
/// `broadcast` is `MPI_Bcast`; `all_gather` is `MPI_Allgatherv`; `all_to_all_v` exchanges counts
/// with `MPI_Alltoall`, then the data with `MPI_Alltoallv`. One call moves at most 2^31 - 1
/// elements per rank (MPI's `int` counts); larger calls return [`CommError::Invalid`] on every
/// rank. Messages a rank sends to itself are queued in process and never touch MPI.
///
/// Threads: [`MpiComm::init`] asks for `MPI_THREAD_MULTIPLE`. If the library only gives
/// `MPI_THREAD_SERIALIZED`, every MPI call is made under a mutex; `recv` then polls
/// (`MPI_Improbe`) and releases the mutex between polls so other threads can send, but a
/// collective or a blocking `send` holds it until done, so keep collectives on one thread.
///
/// Errors: Open MPI's default error handler aborts the job on any MPI error, so MPI failures
/// surface as the job ending, not as [`CommError::Mpi`] (which `init` returns). A peer's
/// [`Comm::fail`] aborts the whole job likewise.
pub struct MpiComm {
    // Declared (so dropped) before the universe: the duplicate is freed before MPI_Finalize.
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    /// Some when the library gave only `MPI_THREAD_SERIALIZED`.
    /// Shared with the groups made by `split`: the library's calls are serialised process-wide.
    serialize: Option<Arc<Mutex<()>>>,
    threading: Threading,
    /// Messages to this rank from itself, by tag.
    self_mail: Mutex<HashMap<u32, VecDeque<Vec<u8>>>>,
    self_mail_cond: Condvar,
    stats: StatsCell,
    /// Shared with the groups made by `split`, so MPI is finalised after the last of them.
    _universe: Arc<Universe>,
}

// SAFETY: the handles inside are plain MPI handles. MPI_THREAD_MULTIPLE (checked at `init`)
// allows calls on them from any thread at once; under MPI_THREAD_SERIALIZED every MPI call goes
// through `serialize`. The rest of the state is behind mutexes or atomics.
unsafe impl Send for MpiComm {}
// SAFETY: as for `Send`.
unsafe impl Sync for MpiComm {}

impl MpiComm {
    /// Initialises MPI (asking for `MPI_THREAD_MULTIPLE`, accepting `MPI_THREAD_SERIALIZED`) and
    /// returns this process's worker of the world communicator. Errors with [`CommError::Mpi`]
    /// when MPI was already initialised in this process (one `MpiComm` per process) or gives a
    /// lower thread level. Run outside `mpirun`, it makes a job of one rank (singleton).
    ///
    /// With the environment variable `FANOUT_MPI_THREADS=serialized` it asks for
    /// `MPI_THREAD_SERIALIZED` and serialises its calls whatever the library gives (to test that
    /// path, or for an MPI whose `MULTIPLE` mode is slow or broken).
    pub fn init() -> Result<MpiComm> {
        let force_serialized =
            std::env::var("FANOUT_MPI_THREADS").is_ok_and(|v| v.eq_ignore_ascii_case("serialized"));
        let want = if force_serialized {
            Threading::Serialized
        } else {
            Threading::Multiple
        };
        let (universe, level) = mpi::initialize_with_threading(want).ok_or_else(|| {
            CommError::Mpi(
                "MPI is already initialised in this process (one MpiComm per process)".into(),
            )
        })?;
        let serialize = match level {
            Threading::Multiple if force_serialized => Some(Arc::new(Mutex::new(()))),
            Threading::Multiple => None,
            Threading::Serialized => Some(Arc::new(Mutex::new(()))),
            other => {
                return Err(CommError::Mpi(format!(
                    "the MPI library gives thread level {other:?}; fanout needs SERIALIZED or \
                     MULTIPLE"
                )))
            }
        };
        let comm = universe.world().duplicate();
        let (rank, size) = (comm.rank(), comm.size());
        if rank < 0 || size < 1 || rank >= size {
            return Err(CommError::Mpi(format!(
                "MPI gave rank {rank} of size {size}"
            )));
        }
        Ok(MpiComm {
            comm,
            rank: rank as usize,
            size: size as usize,
            serialize,
            threading: if force_serialized {
                Threading::Serialized
            } else {
                level
            },
            self_mail: Mutex::new(HashMap::new()),
            self_mail_cond: Condvar::new(),
            stats: StatsCell::default(),
            _universe: Arc::new(universe),
        })
    }

    /// True when calls are not serialised: the MPI library gave `MPI_THREAD_MULTIPLE` and
    /// `FANOUT_MPI_THREADS=serialized` was not set.
    pub fn thread_multiple(&self) -> bool {
        self.threading == Threading::Multiple
    }

    fn guard(&self) -> Option<MutexGuard<'_, ()>> {
        self.serialize
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// All-gathers `[op, a, b]` from every rank and checks that all ranks called `op`.
    fn header(&self, op: Op, a: u64, b: u64) -> Result<Vec<[u64; 3]>> {
        let mine = [op as u64, a, b];
        let mut all = vec![0u64; 3 * self.size];
        self.comm.all_gather_into(&mine[..], &mut all[..]);
        let rows: Vec<[u64; 3]> = all.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect();
        let ops: Vec<Option<Op>> = rows.iter().map(|h| Op::from_code(h[0])).collect();
        match op_mismatch(&ops) {
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }

    fn sum<T>(&self, buf: &mut [T], op: Op) -> Result<()>
    where
        T: Equivalence + Copy + Default + std::ops::Add<Output = T>,
    {
        let n = self.size;
        let start = Instant::now();
        if n == 1 {
            self.stats.record(start, 0);
            return Ok(());
        }
        let _g = self.guard();
        let len = buf.len();
        let fits = (len as u64).saturating_add(n as u64) <= MAX_COUNT;
        let rows = self.header(op, len as u64, u64::from(fits))?;
        if rows.iter().any(|h| h[1] != len as u64) {
            let lens: Vec<u64> = rows.iter().map(|h| h[1]).collect();
            return Err(CommError::Invalid(format!(
                "{}: ranks passed different lengths ({lens:?})",
                op.name()
            )));
        }
        if rows.iter().any(|h| h[2] == 0) {
            return Err(CommError::Invalid(format!(
                "{}: {len} elements is more than one MPI call moves",
                op.name()
            )));
        }
        let ranges: Vec<_> = (0..n).map(|j| chunk(len, n, j)).collect();
        let counts: Vec<Count> = ranges.iter().map(|c| c.len() as Count).collect();
        let displs: Vec<Count> = ranges.iter().map(|c| c.start as Count).collect();
        let cm = ranges[self.rank].len();
        let recv_counts: Vec<Count> = vec![cm as Count; n];
        let recv_displs: Vec<Count> = (0..n).map(|i| (i * cm) as Count).collect();
        if len == 0 {
            self.stats.record(start, 0);
            return Ok(());
        }
        let mut recv = buffer::<T>(n * cm);
        {
            let send = Partition::new(&*buf, &counts[..], &displs[..]);
            let mut into = PartitionMut::new(&mut recv[..], &recv_counts[..], &recv_displs[..]);
            self.comm.all_to_all_varcount_into(&send, &mut into);
        }
        let pieces: Vec<&[T]> = (0..n).map(|i| &recv[i * cm..(i + 1) * cm]).collect();
        let mut summed = buffer::<T>(cm);
        sum_in_order(&pieces, &mut summed);
        {
            let mut into = PartitionMut::new(&mut *buf, &counts[..], &displs[..]);
            self.comm.all_gather_varcount_into(&summed[..], &mut into);
        }
        let bytes = sum_bytes_sent(len, n, self.rank, std::mem::size_of::<T>());
        self.stats.record(start, bytes);
        Ok(())
    }

    fn a2a<T: Equivalence + Copy + Default>(&self, send: &[Vec<T>], op: Op) -> Result<Vec<Vec<T>>> {
        let n = self.size;
        let start = Instant::now();
        if n == 1 {
            if send.len() != 1 {
                return Err(CommError::Invalid(format!(
                    "{}: {} send buffers for 1 rank",
                    op.name(),
                    send.len()
                )));
            }
            self.stats.record(start, 0);
            return Ok(vec![send[0].clone()]);
        }
        let _g = self.guard();
        let longest = send.iter().map(Vec::len).max().unwrap_or(0) as u64;
        let rows = self.header(op, send.len() as u64, longest)?;
        let bad: Vec<usize> = (0..n).filter(|&i| rows[i][1] != n as u64).collect();
        if !bad.is_empty() {
            return Err(CommError::Invalid(format!(
                "{}: ranks {bad:?} did not pass one send buffer per rank ({n})",
                op.name()
            )));
        }
        // Every rank's send and receive totals are at most N times the longest buffer anywhere.
        let global_longest = rows.iter().map(|h| h[2]).max().unwrap_or(0);
        if global_longest.saturating_mul(n as u64) > MAX_COUNT {
            return Err(CommError::Invalid(format!(
                "{}: a buffer of {global_longest} elements is too long for one MPI call of {n} \
                 ranks",
                op.name()
            )));
        }
        let send_counts: Vec<Count> = send.iter().map(|v| v.len() as Count).collect();
        let mut send_displs = Vec::with_capacity(n);
        let mut flat = Vec::with_capacity(send.iter().map(Vec::len).sum::<usize>().max(1));
        for v in send {
            send_displs.push(flat.len() as Count);
            flat.extend_from_slice(v);
        }
        let mut recv_counts: Vec<Count> = vec![0; n];
        self.comm
            .all_to_all_into(&send_counts[..], &mut recv_counts[..]);
        if recv_counts.iter().any(|&c| c < 0) {
            return Err(CommError::Mpi("MPI_Alltoall gave a negative count".into()));
        }
        let mut recv_displs = Vec::with_capacity(n);
        let mut total = 0usize;
        for &c in &recv_counts {
            recv_displs.push(total as Count);
            total += c as usize;
        }
        let mut recv = buffer::<T>(total);
        {
            let from = Partition::new(&flat[..], &send_counts[..], &send_displs[..]);
            let mut into = PartitionMut::new(&mut recv[..], &recv_counts[..], &recv_displs[..]);
            self.comm.all_to_all_varcount_into(&from, &mut into);
        }
        let out: Vec<Vec<T>> = (0..n)
            .map(|i| {
                let lo = recv_displs[i] as usize;
                recv[lo..lo + recv_counts[i] as usize].to_vec()
            })
            .collect();
        let bytes: u64 = send
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != self.rank)
            .map(|(_, v)| (v.len() * std::mem::size_of::<T>()) as u64)
            .sum();
        self.stats.record(start, bytes);
        Ok(out)
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn kind(&self) -> &'static str {
        "mpi"
    }

    fn concurrent_collectives(&self) -> bool {
        self.serialize.is_none()
    }

    fn barrier(&self) -> Result<()> {
        let start = Instant::now();
        if self.size > 1 {
            // The header all-gather needs every rank: it is the barrier (and checks that every
            // rank called barrier).
            let _g = self.guard();
            self.header(Op::Barrier, 0, 0)?;
        }
        self.stats.record(start, 0);
        Ok(())
    }

    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.sum(buf, Op::SumF32)
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.sum(buf, Op::SumF64)
    }

    fn broadcast(&self, root: usize, buf: &mut Vec<u8>) -> Result<()> {
        let n = self.size;
        let start = Instant::now();
        if n == 1 {
            if root != 0 {
                return Err(CommError::Invalid(format!(
                    "broadcast root {root} out of range (size 1)"
                )));
            }
            self.stats.record(start, 0);
            return Ok(());
        }
        let _g = self.guard();
        let len = if root == self.rank { buf.len() } else { 0 };
        let rows = self.header(Op::Broadcast, root as u64, len as u64)?;
        if root >= n || rows.iter().any(|h| h[1] != root as u64) {
            let roots: Vec<u64> = rows.iter().map(|h| h[1]).collect();
            return Err(CommError::Invalid(format!(
                "broadcast roots by rank {roots:?} must be equal and below {n}"
            )));
        }
        let root_len = rows[root][2];
        if root_len > MAX_COUNT {
            return Err(CommError::Invalid(format!(
                "broadcast of {root_len} bytes is more than one MPI call moves"
            )));
        }
        if self.rank != root {
            buf.clear();
            buf.resize(root_len as usize, 0);
        }
        if root_len > 0 {
            self.comm
                .process_at_rank(root as i32)
                .broadcast_into(&mut buf[..]);
        }
        let bytes = if self.rank == root {
            root_len * (n as u64 - 1)
        } else {
            0
        };
        self.stats.record(start, bytes);
        Ok(())
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.size;
        let start = Instant::now();
        if n == 1 {
            self.stats.record(start, 0);
            return Ok(vec![mine.to_vec()]);
        }
        let _g = self.guard();
        let rows = self.header(Op::AllGather, mine.len() as u64, 0)?;
        let total = rows.iter().fold(0u64, |t, h| t.saturating_add(h[1]));
        if total > MAX_COUNT {
            return Err(CommError::Invalid(format!(
                "all_gather of {total} bytes in all is more than one MPI call moves"
            )));
        }
        let counts: Vec<Count> = rows.iter().map(|h| h[1] as Count).collect();
        let mut displs = Vec::with_capacity(n);
        let mut at = 0;
        for &c in &counts {
            displs.push(at);
            at += c;
        }
        let mut recv = buffer::<u8>(total as usize);
        let pad = [0u8];
        {
            let mut into = PartitionMut::new(&mut recv[..], &counts[..], &displs[..]);
            self.comm
                .all_gather_varcount_into(real(mine, &pad), &mut into);
        }
        let out = (0..n)
            .map(|i| recv[displs[i] as usize..(displs[i] + counts[i]) as usize].to_vec())
            .collect();
        self.stats.record(start, (mine.len() * (n - 1)) as u64);
        Ok(out)
    }

    fn all_to_all_v(&self, send: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        self.a2a(send, Op::AllToAll)
    }

    fn all_to_all_v_f32(&self, send: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        self.a2a(send, Op::AllToAllF32)
    }

    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()> {
        let start = Instant::now();
        check_p2p(to, self.size, tag)?;
        if to == self.rank {
            let mut mail = self.self_mail.lock().unwrap_or_else(|e| e.into_inner());
            mail.entry(tag).or_default().push_back(data.to_vec());
            drop(mail);
            self.self_mail_cond.notify_all();
            self.stats.record(start, 0);
            return Ok(());
        }
        if data.len() as u64 > MAX_COUNT {
            return Err(CommError::Invalid(format!(
                "send of {} bytes is more than one MPI call moves",
                data.len()
            )));
        }
        {
            let _g = self.guard();
            self.comm
                .process_at_rank(to as i32)
                .send_with_tag(data, tag as i32);
        }
        self.stats.record(start, data.len() as u64);
        Ok(())
    }

    fn recv(&self, from: usize, tag: u32) -> Result<Vec<u8>> {
        let start = Instant::now();
        check_p2p(from, self.size, tag)?;
        if from == self.rank {
            let mut mail = self.self_mail.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(m) = mail.get_mut(&tag).and_then(VecDeque::pop_front) {
                    drop(mail);
                    self.stats.record(start, 0);
                    return Ok(m);
                }
                mail = self
                    .self_mail_cond
                    .wait(mail)
                    .unwrap_or_else(|e| e.into_inner());
            }
        }
        let process = self.comm.process_at_rank(from as i32);
        let data = match &self.serialize {
            None => {
                process
                    .matched_probe_with_tag(tag as i32)
                    .matched_receive_vec::<u8>()
                    .0
            }
            Some(_) => {
                let mut wait = Duration::from_micros(20);
                loop {
                    {
                        let _g = self.guard();
                        if let Some(m) = process.immediate_matched_probe_with_tag(tag as i32) {
                            break m.matched_receive_vec::<u8>().0;
                        }
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(1));
                }
            }
        };
        self.stats.record(start, 0);
        Ok(data)
    }

    /// Prints `fanout: rank R: message` on stderr and calls `MPI_Abort` with error code 1, which
    /// ends every process of the job (`mpirun` exits non-zero). Never returns.
    fn fail(&self, message: &str) {
        // One write: `eprintln!` writes its pieces separately (stderr is unbuffered), and
        // mpirun's own abort banner could land between them.
        use std::io::Write;
        let line = format!("fanout: rank {}: {message}\n", self.rank);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        self.comm.abort(1)
    }

    fn stats(&self) -> CommStats {
        self.stats.get()
    }

    fn node_ranks(&self) -> Result<(usize, usize)> {
        let key = i32::try_from(self.rank)
            .map_err(|_| CommError::Invalid(format!("rank {} is too large", self.rank)))?;
        let node = {
            let _g = self.guard();
            self.comm.split_shared(key)
        };
        Ok((node.rank() as usize, node.size() as usize))
    }

    fn split(&self, color: usize) -> Result<Box<dyn Comm>> {
        let color = i32::try_from(color)
            .map_err(|_| CommError::Invalid(format!("split: color {color} is too large")))?;
        let sub = {
            let _g = self.guard();
            self.comm
                .split_by_color(mpi::topology::Color::with_value(color))
        }
        .ok_or_else(|| CommError::Mpi("MPI_Comm_split gave no communicator".into()))?;
        let (rank, size) = (sub.rank(), sub.size());
        Ok(Box::new(MpiComm {
            comm: sub,
            rank: rank as usize,
            size: size as usize,
            serialize: self.serialize.clone(),
            threading: self.threading,
            self_mail: Mutex::new(HashMap::new()),
            self_mail_cond: Condvar::new(),
            stats: StatsCell::default(),
            _universe: Arc::clone(&self._universe),
        }))
    }
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("threading", &self.threading)
            .finish()
    }
}
