//! In-process workers: the members of a [`LocalComm`] group are threads sharing one state.

use crate::{
    check_p2p, chunk, op_mismatch, sum_bytes_sent, sum_in_order, Comm, CommError, CommStats, Op,
    Result, StatsCell,
};
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// One rank's contribution to a collective round.
type Item = (Op, Box<dyn Any + Send + Sync>);

/// Everything the members of a group share, behind one mutex.
struct State {
    /// The first `fail`: (rank, message). Poisons every later call.
    failed: Option<(usize, String)>,
    /// Members dropped, with why ("exited ..." or "panicked"); they block every later collective.
    exited: Vec<Option<String>>,
    /// The first member dropped: collectives report it (the others may exit because of it).
    first_exit: Option<usize>,
    /// The number of completed collective rounds.
    generation: u64,
    /// Contributions to the open round, by rank.
    slots: Vec<Option<Item>>,
    arrived: usize,
    /// The contributions of the last completed round, by rank. Stays valid until every rank has
    /// read it: the next round cannot complete before each rank contributes to it.
    last: Arc<Vec<Item>>,
    /// Point-to-point queues keyed by (from, to, tag).
    mail: HashMap<(usize, usize, u32), VecDeque<Vec<u8>>>,
    /// Members of groups made by `split`, keyed by (split number, lowest rank of the color),
    /// waiting to be taken by their ranks (in the new group's rank order).
    splits: HashMap<(u64, usize), Vec<Option<LocalComm>>>,
}

struct Shared {
    size: usize,
    state: Mutex<State>,
    cond: Condvar,
}

impl Shared {
    /// Locks the state; a panic elsewhere while holding the lock leaves consistent state (no code
    /// under the lock panics on purpose), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The error of a poisoned group, if it is: a `fail` first, else the member dropped first when
/// `collective` (a dropped member can never join a collective again).
fn poisoned(st: &State, collective: bool) -> Option<CommError> {
    if let Some((rank, message)) = &st.failed {
        return Some(CommError::PeerFailed {
            rank: *rank,
            message: message.clone(),
        });
    }
    if collective {
        if let Some(rank) = st.first_exit {
            return Some(CommError::PeerFailed {
                rank,
                message: st.exited[rank].clone().unwrap_or_default(),
            });
        }
    }
    None
}

/// One member of an in-process group of workers (threads).
///
/// Made by [`LocalComm::group`]; move each member to its worker thread. Collectives complete
/// when every member has called them; sums are in rank order (see the crate doc). `send` never
/// blocks (messages queue without bound). After [`Comm::fail`] on any member every call on every
/// member returns [`CommError::PeerFailed`]; dropping a member (its thread returned or panicked)
/// makes the others' pending and later collectives, and their `recv` from it once its queued
/// messages are read, return [`CommError::PeerFailed`] with "exited ..." or "panicked".
/// Collectives of a group of one take no lock and copy only what they return. Two threads of one
/// rank must not be in collectives at once (the second gets [`CommError::Invalid`]).
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
    stats: StatsCell,
    /// Splits this member has taken part in (every member makes the same sequence).
    splits: AtomicU64,
}

impl LocalComm {
    /// The `n` members of a new group, indexed by rank. `n = 0` gives an empty `Vec`.
    pub fn group(n: usize) -> Vec<LocalComm> {
        let shared = Arc::new(Shared {
            size: n,
            state: Mutex::new(State {
                failed: None,
                exited: vec![None; n],
                first_exit: None,
                generation: 0,
                slots: (0..n).map(|_| None).collect(),
                arrived: 0,
                last: Arc::new(Vec::new()),
                mail: HashMap::new(),
                splits: HashMap::new(),
            }),
            cond: Condvar::new(),
        });
        (0..n)
            .map(|rank| LocalComm {
                rank,
                shared: Arc::clone(&shared),
                stats: StatsCell::default(),
                splits: AtomicU64::new(0),
            })
            .collect()
    }

    /// Contributes `payload` to the next collective round and returns every rank's contribution,
    /// by rank, once all have arrived (or the error of a poisoned group).
    fn exchange<P: Any + Send + Sync>(&self, op: Op, payload: P) -> Result<Arc<Vec<Item>>> {
        let n = self.shared.size;
        let mut st = self.shared.lock();
        if let Some(e) = poisoned(&st, true) {
            return Err(e);
        }
        if st.slots[self.rank].is_some() {
            return Err(CommError::Invalid(format!(
                "{}: rank {} is already in a collective on another thread",
                op.name(),
                self.rank
            )));
        }
        let my_gen = st.generation;
        st.slots[self.rank] = Some((op, Box::new(payload)));
        st.arrived += 1;
        if st.arrived == n {
            let items: Vec<Item> = st.slots.iter_mut().filter_map(Option::take).collect();
            if items.len() != n {
                return Err(CommError::Invalid(
                    "internal: a collective round lost a contribution".into(),
                ));
            }
            st.last = Arc::new(items);
            st.arrived = 0;
            st.generation += 1;
            self.shared.cond.notify_all();
            let ops: Vec<Option<Op>> = st.last.iter().map(|(o, _)| Some(*o)).collect();
            return match op_mismatch(&ops) {
                Some(e) => Err(e),
                None => Ok(Arc::clone(&st.last)),
            };
        }
        loop {
            if st.generation != my_gen {
                let ops: Vec<Option<Op>> = st.last.iter().map(|(o, _)| Some(*o)).collect();
                return match op_mismatch(&ops) {
                    Some(e) => Err(e),
                    None => Ok(Arc::clone(&st.last)),
                };
            }
            if let Some(e) = poisoned(&st, true) {
                return Err(e);
            }
            st = self.shared.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn sum<T>(&self, buf: &mut [T], op: Op) -> Result<()>
    where
        T: Copy + std::ops::Add<Output = T> + Send + Sync + 'static,
    {
        let n = self.shared.size;
        let start = Instant::now();
        if n == 1 {
            self.stats.record(start, 0);
            return Ok(());
        }
        let all = self.exchange(op, buf.to_vec())?;
        let parts: Vec<&[T]> = all
            .iter()
            .filter_map(|(_, p)| p.downcast_ref::<Vec<T>>().map(Vec::as_slice))
            .collect();
        if parts.len() != n {
            return Err(CommError::Invalid("internal: sum payload type".into()));
        }
        if let Some(r) = parts.iter().position(|p| p.len() != buf.len()) {
            let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
            return Err(CommError::Invalid(format!(
                "{}: ranks passed different lengths ({lens:?}; rank {r} differs from rank 0)",
                op.name()
            )));
        }
        let mine = chunk(buf.len(), n, self.rank);
        let pieces: Vec<&[T]> = parts.iter().map(|p| &p[mine.clone()]).collect();
        let mut summed = buf[mine].to_vec();
        sum_in_order(&pieces, &mut summed);
        drop(pieces);
        drop(parts);
        drop(all);
        let all = self.exchange(Op::SumGather, summed)?;
        for (r, (_, p)) in all.iter().enumerate() {
            let piece = p
                .downcast_ref::<Vec<T>>()
                .ok_or_else(|| CommError::Invalid("internal: sum payload type".into()))?;
            let range = chunk(buf.len(), n, r);
            if piece.len() != range.len() {
                return Err(CommError::Invalid("internal: sum chunk length".into()));
            }
            buf[range].copy_from_slice(piece);
        }
        let bytes = sum_bytes_sent(buf.len(), n, self.rank, std::mem::size_of::<T>());
        self.stats.record(start, bytes);
        Ok(())
    }

    fn a2a<T: Clone + Send + Sync + 'static>(
        &self,
        send: &[Vec<T>],
        op: Op,
    ) -> Result<Vec<Vec<T>>> {
        let n = self.shared.size;
        let start = Instant::now();
        let bytes: u64 = send
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != self.rank)
            .map(|(_, v)| (v.len() * std::mem::size_of::<T>()) as u64)
            .sum();
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
        // Wrong counts still join the round so that every rank reports the misuse.
        let payload: Option<Vec<Mutex<Vec<T>>>> =
            (send.len() == n).then(|| send.iter().map(|v| Mutex::new(v.clone())).collect());
        let all = self.exchange(op, payload)?;
        let mut out = Vec::with_capacity(n);
        let mut bad = Vec::new();
        for (r, (_, p)) in all.iter().enumerate() {
            match p.downcast_ref::<Option<Vec<Mutex<Vec<T>>>>>() {
                Some(Some(v)) => {
                    let mut slot = v[self.rank].lock().unwrap_or_else(|e| e.into_inner());
                    out.push(std::mem::take(&mut *slot));
                }
                _ => bad.push(r),
            }
        }
        if !bad.is_empty() {
            return Err(CommError::Invalid(format!(
                "{}: ranks {bad:?} did not pass one send buffer per rank ({n})",
                op.name()
            )));
        }
        self.stats.record(start, bytes);
        Ok(out)
    }
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn kind(&self) -> &'static str {
        "local"
    }

    fn barrier(&self) -> Result<()> {
        let start = Instant::now();
        if self.shared.size > 1 {
            self.exchange(Op::Barrier, ())?;
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
        let n = self.shared.size;
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
        let payload: (usize, Option<Vec<u8>>) = (root, (root == self.rank).then(|| buf.clone()));
        let all = self.exchange(Op::Broadcast, payload)?;
        let entries: Vec<&(usize, Option<Vec<u8>>)> = all
            .iter()
            .filter_map(|(_, p)| p.downcast_ref::<(usize, Option<Vec<u8>>)>())
            .collect();
        if entries.len() != n {
            return Err(CommError::Invalid(
                "internal: broadcast payload type".into(),
            ));
        }
        let roots: Vec<usize> = entries.iter().map(|e| e.0).collect();
        if roots.iter().any(|&r| r != root) || root >= n {
            return Err(CommError::Invalid(format!(
                "broadcast roots by rank {roots:?} must be equal and below {n}"
            )));
        }
        let bytes = if self.rank == root {
            (buf.len() * (n - 1)) as u64
        } else {
            match &entries[root].1 {
                Some(data) => {
                    buf.clear();
                    buf.extend_from_slice(data);
                }
                None => return Err(CommError::Invalid("internal: broadcast root data".into())),
            }
            0
        };
        self.stats.record(start, bytes);
        Ok(())
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.shared.size;
        let start = Instant::now();
        if n == 1 {
            self.stats.record(start, 0);
            return Ok(vec![mine.to_vec()]);
        }
        let all = self.exchange(Op::AllGather, mine.to_vec())?;
        let out: Vec<Vec<u8>> = all
            .iter()
            .filter_map(|(_, p)| p.downcast_ref::<Vec<u8>>().cloned())
            .collect();
        if out.len() != n {
            return Err(CommError::Invalid(
                "internal: all_gather payload type".into(),
            ));
        }
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
        check_p2p(to, self.shared.size, tag)?;
        let msg = data.to_vec();
        {
            let mut st = self.shared.lock();
            if let Some(e) = poisoned(&st, false) {
                return Err(e);
            }
            if let Some(why) = &st.exited[to] {
                return Err(CommError::PeerFailed {
                    rank: to,
                    message: why.clone(),
                });
            }
            st.mail
                .entry((self.rank, to, tag))
                .or_default()
                .push_back(msg);
        }
        self.shared.cond.notify_all();
        let bytes = if to == self.rank {
            0
        } else {
            data.len() as u64
        };
        self.stats.record(start, bytes);
        Ok(())
    }

    fn recv(&self, from: usize, tag: u32) -> Result<Vec<u8>> {
        let start = Instant::now();
        check_p2p(from, self.shared.size, tag)?;
        let mut st = self.shared.lock();
        loop {
            if let Some(e) = poisoned(&st, false) {
                return Err(e);
            }
            if let Some(msg) = st
                .mail
                .get_mut(&(from, self.rank, tag))
                .and_then(VecDeque::pop_front)
            {
                drop(st);
                self.stats.record(start, 0);
                return Ok(msg);
            }
            if let Some(why) = &st.exited[from] {
                return Err(CommError::PeerFailed {
                    rank: from,
                    message: why.clone(),
                });
            }
            st = self.shared.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn fail(&self, message: &str) {
        let mut st = self.shared.lock();
        if st.failed.is_none() {
            st.failed = Some((self.rank, message.to_string()));
        }
        drop(st);
        self.shared.cond.notify_all();
    }

    fn stats(&self) -> CommStats {
        self.stats.get()
    }

    /// Every member runs in this process, so on this machine.
    fn node_ranks(&self) -> Result<(usize, usize)> {
        Ok((self.rank, self.size()))
    }

    fn split(&self, color: usize) -> Result<Box<dyn Comm>> {
        let seq = self.splits.fetch_add(1, Ordering::Relaxed);
        let colors: Vec<usize> = self
            .all_gather(&(color as u64).to_le_bytes())?
            .iter()
            .map(|b| {
                b.get(..8).map_or(usize::MAX, |b| {
                    u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8])) as usize
                })
            })
            .collect();
        let same: Vec<usize> = (0..colors.len()).filter(|&r| colors[r] == color).collect();
        let leader = same[0];
        let index = same.iter().position(|&r| r == self.rank).unwrap_or(0);
        let mut st = self.shared.lock();
        if self.rank == leader {
            let members = LocalComm::group(same.len()).into_iter().map(Some).collect();
            st.splits.insert((seq, leader), members);
            self.shared.cond.notify_all();
        }
        loop {
            if let Some(e) = poisoned(&st, false) {
                return Err(e);
            }
            if let Some(members) = st.splits.get_mut(&(seq, leader)) {
                let mine = members[index].take();
                if members.iter().all(Option::is_none) {
                    st.splits.remove(&(seq, leader));
                }
                return mine.map(|c| Box::new(c) as Box<dyn Comm>).ok_or_else(|| {
                    CommError::Invalid("split: this rank's member was already taken".into())
                });
            }
            if let Some(why) = &st.exited[leader] {
                return Err(CommError::PeerFailed {
                    rank: leader,
                    message: why.clone(),
                });
            }
            st = self.shared.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for LocalComm {
    /// Marks this member as gone so that the others' collectives (and `recv` from it, once its
    /// queued messages are read) fail instead of waiting for it forever.
    fn drop(&mut self) {
        if self.shared.size <= 1 {
            return;
        }
        let why = if std::thread::panicking() {
            "panicked".to_string()
        } else {
            "exited (its communicator was dropped)".to_string()
        };
        let mut st = self.shared.lock();
        st.exited[self.rank] = Some(why);
        st.first_exit.get_or_insert(self.rank);
        drop(st);
        self.shared.cond.notify_all();
    }
}

impl std::fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalComm")
            .field("rank", &self.rank)
            .field("size", &self.shared.size)
            .finish()
    }
}
