//! Checks that any [`Comm`] implementation must pass, run by every rank of a group together.
//!
//! The unit tests run them over [`crate::LocalComm`] groups of 1, 2 and 3 threads; the example
//! `mpi_check` runs them over `MpiComm` under `mpirun -np N`. A new implementation (a device
//! communicator, say) can reuse them. Every rank must call [`run`] (the checks make the same
//! collective calls on every rank, in the same order).

use crate::{Comm, CommError, MAX_TAG};

/// The outcome of one check on one rank.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckResult {
    /// The check's name.
    pub name: &'static str,
    /// `Ok` when this rank saw what the contract promises, else what differed.
    pub outcome: std::result::Result<(), String>,
}

type Check = fn(&dyn Comm) -> std::result::Result<(), String>;

const CHECKS: [(&str, Check); 13] = [
    ("rank_and_size", rank_and_size),
    ("barrier", barrier),
    ("sum_f32_rank_order", sum_f32_rank_order),
    ("sum_f64_rank_order", sum_f64_rank_order),
    ("broadcast_every_root", broadcast_every_root),
    ("all_gather_variable_lengths", all_gather_variable_lengths),
    (
        "all_to_all_v_variable_lengths",
        all_to_all_v_variable_lengths,
    ),
    ("all_to_all_v_f32", all_to_all_v_f32),
    ("send_recv_order_and_tags", send_recv_order_and_tags),
    ("misuse_is_reported_on_every_rank", misuse_is_reported),
    ("stats_count_calls_and_bytes", stats_count_calls_and_bytes),
    ("split_by_color", split_by_color),
    ("node_ranks_cover_each_machine_once", node_ranks),
];

/// Runs every check on this rank, in order, and returns their outcomes. Every rank of the group
/// must call it at the same time. A check whose communicator call fails reports that error.
pub fn run(comm: &dyn Comm) -> Vec<CheckResult> {
    CHECKS
        .iter()
        .map(|(name, check)| CheckResult {
            name,
            outcome: check(comm),
        })
        .collect()
}

fn err(e: CommError) -> String {
    format!("unexpected error: {e}")
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Rank `r`'s element `i`: signs and binary exponents in -12..=12 vary, so that the order of
/// the additions changes the rounded sum.
fn value_f32(r: usize, i: usize) -> f32 {
    let h = splitmix(((r as u64) << 40) ^ i as u64 ^ 0xF32);
    let sign = ((h >> 63) as u32) << 31;
    let exp = (127 + (h >> 32) % 25 - 12) as u32;
    f32::from_bits(sign | (exp << 23) | (h as u32 & 0x7F_FFFF))
}

fn value_f64(r: usize, i: usize) -> f64 {
    let h = splitmix(((r as u64) << 40) ^ i as u64 ^ 0xF64);
    let h2 = splitmix(h);
    let sign = (h >> 63) << 63;
    let exp = 1023 + (h >> 32) % 61 - 30;
    f64::from_bits(sign | (exp << 52) | (h2 & 0xF_FFFF_FFFF_FFFF))
}

fn bytes_of(r: usize, j: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (splitmix(((r as u64) << 32) ^ ((j as u64) << 16) ^ k as u64) >> 56) as u8)
        .collect()
}

fn rank_and_size(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    if n == 0 || r >= n {
        return Err(format!("rank {r} of size {n}"));
    }
    if !matches!(c.kind(), "local" | "mpi") {
        return Err(format!("kind {:?}", c.kind()));
    }
    let mut mine = (r as u64).to_le_bytes().to_vec();
    mine.extend_from_slice(&(n as u64).to_le_bytes());
    let all = c.all_gather(&mine).map_err(err)?;
    for (i, v) in all.iter().enumerate() {
        let mut want = (i as u64).to_le_bytes().to_vec();
        want.extend_from_slice(&(n as u64).to_le_bytes());
        if *v != want {
            return Err(format!(
                "entry {i} of the gathered (rank, size) pairs is {v:?}"
            ));
        }
    }
    if all.len() != n {
        return Err(format!("gathered {} entries for {n} ranks", all.len()));
    }
    Ok(())
}

fn barrier(c: &dyn Comm) -> std::result::Result<(), String> {
    for _ in 0..3 {
        c.barrier().map_err(err)?;
    }
    Ok(())
}

/// Checks a rank-order sum: every element bit-equal to the sequential sum over ranks 0..N-1,
/// and the same bits on every rank.
fn check_sum<T, const B: usize>(
    c: &dyn Comm,
    value: fn(usize, usize) -> T,
    reduce: &dyn Fn(&mut [T]) -> crate::Result<()>,
    to_bytes: fn(T) -> [u8; B],
) -> std::result::Result<(), String>
where
    T: Copy + std::ops::Add<Output = T> + PartialEq + std::fmt::Debug,
{
    let (r, n) = (c.rank(), c.size());
    let mut order_mattered = false;
    for len in [0usize, 1, n + 1, 1003] {
        let mut buf: Vec<T> = (0..len).map(|i| value(r, i)).collect();
        reduce(&mut buf).map_err(err)?;
        for i in 0..len {
            let mut want = value(0, i);
            for q in 1..n {
                want = want + value(q, i);
            }
            let mut backwards = value(n - 1, i);
            for q in (0..n - 1).rev() {
                backwards = backwards + value(q, i);
            }
            order_mattered |= to_bytes(backwards) != to_bytes(want);
            if to_bytes(buf[i]) != to_bytes(want) {
                return Err(format!(
                    "len {len}, element {i}: got {:?}, the rank-order sum is {want:?}",
                    buf[i]
                ));
            }
        }
        let bytes: Vec<u8> = buf.iter().flat_map(|x| to_bytes(*x)).collect();
        let all = c.all_gather(&bytes).map_err(err)?;
        if let Some(q) = all.iter().position(|b| *b != bytes) {
            return Err(format!(
                "len {len}: rank {q}'s sum differs from this rank's"
            ));
        }
    }
    if n >= 3 && !order_mattered {
        return Err("test data too tame: the summation order changed nothing".into());
    }
    Ok(())
}

fn sum_f32_rank_order(c: &dyn Comm) -> std::result::Result<(), String> {
    check_sum(c, value_f32, &|b| c.all_reduce_sum_f32(b), f32::to_le_bytes)
}

fn sum_f64_rank_order(c: &dyn Comm) -> std::result::Result<(), String> {
    check_sum(c, value_f64, &|b| c.all_reduce_sum_f64(b), f64::to_le_bytes)
}

fn broadcast_every_root(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    for root in 0..n {
        for len in [root * 37 + 3, 0] {
            let want = bytes_of(root, 99, len);
            let mut buf = if r == root {
                want.clone()
            } else {
                vec![0xEE; 5 + r]
            };
            c.broadcast(root, &mut buf).map_err(err)?;
            if buf != want {
                return Err(format!(
                    "root {root}, {len} bytes: received {} bytes that differ",
                    buf.len()
                ));
            }
        }
    }
    Ok(())
}

fn all_gather_variable_lengths(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let all = c.all_gather(&bytes_of(r, 7, r * 11)).map_err(err)?;
    if all.len() != n {
        return Err(format!("{} entries for {n} ranks", all.len()));
    }
    for (i, v) in all.iter().enumerate() {
        if *v != bytes_of(i, 7, i * 11) {
            return Err(format!("entry {i} ({} bytes) differs", v.len()));
        }
    }
    Ok(())
}

fn a2a_len(from: usize, to: usize) -> usize {
    (from * 5 + to * 3) % 9
}

fn all_to_all_v_variable_lengths(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let send: Vec<Vec<u8>> = (0..n).map(|j| bytes_of(r, j, a2a_len(r, j))).collect();
    let got = c.all_to_all_v(&send).map_err(err)?;
    if got.len() != n {
        return Err(format!("{} buffers for {n} ranks", got.len()));
    }
    for (i, v) in got.iter().enumerate() {
        if *v != bytes_of(i, r, a2a_len(i, r)) {
            return Err(format!("what rank {i} sent ({} bytes) differs", v.len()));
        }
    }
    Ok(())
}

fn all_to_all_v_f32(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let make = |from: usize, to: usize| -> Vec<f32> {
        (0..a2a_len(to, from) * 3)
            .map(|k| value_f32(from * 64 + to, k))
            .collect()
    };
    let send: Vec<Vec<f32>> = (0..n).map(|j| make(r, j)).collect();
    let got = c.all_to_all_v_f32(&send).map_err(err)?;
    if got.len() != n {
        return Err(format!("{} buffers for {n} ranks", got.len()));
    }
    for (i, v) in got.iter().enumerate() {
        let want = make(i, r);
        if v.len() != want.len() || v.iter().zip(&want).any(|(a, b)| a.to_bits() != b.to_bits()) {
            return Err(format!("what rank {i} sent ({} values) differs", v.len()));
        }
    }
    Ok(())
}

fn send_recv_order_and_tags(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    // Even ranks send first, odd ranks receive first, so no rank relies on buffering.
    let sends = |c: &dyn Comm| -> crate::Result<()> {
        c.send(next, 5, &bytes_of(r, 1, 10))?;
        c.send(next, 5, &bytes_of(r, 2, 0))?;
        c.send(next, 5, &bytes_of(r, 3, 300))?;
        c.send(next, MAX_TAG, &bytes_of(r, 4, 7))
    };
    let mut got = Vec::new();
    let recvs = |c: &dyn Comm, got: &mut Vec<Vec<u8>>| -> crate::Result<()> {
        // The tag-MAX_TAG message was sent last but is received first.
        got.push(c.recv(prev, MAX_TAG)?);
        for _ in 0..3 {
            got.push(c.recv(prev, 5)?);
        }
        Ok(())
    };
    if r % 2 == 0 || n == 1 {
        sends(c).map_err(err)?;
        recvs(c, &mut got).map_err(err)?;
    } else {
        recvs(c, &mut got).map_err(err)?;
        sends(c).map_err(err)?;
    }
    let want = [
        bytes_of(prev, 4, 7),
        bytes_of(prev, 1, 10),
        bytes_of(prev, 2, 0),
        bytes_of(prev, 3, 300),
    ];
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        if g != w {
            return Err(format!(
                "message {k} from rank {prev} differs ({} bytes)",
                g.len()
            ));
        }
    }
    c.barrier().map_err(err)
}

fn expect_invalid<T: std::fmt::Debug>(
    what: &str,
    got: crate::Result<T>,
) -> std::result::Result<(), String> {
    match got {
        Err(CommError::Invalid(_)) => Ok(()),
        other => Err(format!("{what}: expected Err(Invalid), got {other:?}")),
    }
}

fn misuse_is_reported(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    if n >= 2 {
        let mut buf = vec![1.0f32; r + 1];
        expect_invalid(
            "sum with lengths differing by rank",
            c.all_reduce_sum_f32(&mut buf),
        )?;
        let mut buf = vec![1.0f64; 2 * r];
        expect_invalid(
            "f64 sum with lengths differing by rank",
            c.all_reduce_sum_f64(&mut buf),
        )?;
        let got = if r == 0 {
            c.barrier().map(|_| Vec::new())
        } else {
            c.all_gather(&[1, 2, 3])
        };
        expect_invalid("barrier on rank 0, all_gather on the others", got)?;
        let mut buf = vec![1u8; 4];
        expect_invalid(
            "broadcast roots differing by rank",
            c.broadcast(r, &mut buf),
        )?;
    }
    let mut buf = vec![1u8; 4];
    expect_invalid("broadcast root = size", c.broadcast(n, &mut buf))?;
    let send = vec![Vec::<u8>::new(); n + 1];
    expect_invalid("all_to_all_v with size + 1 buffers", c.all_to_all_v(&send))?;
    let send = vec![Vec::<f32>::new(); n.saturating_sub(1)];
    expect_invalid(
        "all_to_all_v_f32 with size - 1 buffers",
        c.all_to_all_v_f32(&send),
    )?;
    expect_invalid("send to rank size", c.send(n, 0, b"x"))?;
    expect_invalid("recv from rank size", c.recv(n, 0))?;
    expect_invalid("send with tag MAX_TAG + 1", c.send(r, MAX_TAG + 1, b"x"))?;
    // The communicator is still usable.
    let mut v = [r as f64];
    c.all_reduce_sum_f64(&mut v).map_err(err)?;
    let want = (n * (n - 1) / 2) as f64;
    if v[0] != want {
        return Err(format!("sum after misuse: {} (expected {want})", v[0]));
    }
    Ok(())
}

fn stats_count_calls_and_bytes(c: &dyn Comm) -> std::result::Result<(), String> {
    let n = c.size();
    let before = c.stats();
    c.all_gather(&[7u8; 100]).map_err(err)?;
    let mut buf = vec![1.0f32; 10];
    c.all_reduce_sum_f32(&mut buf).map_err(err)?;
    let after = c.stats();
    if after.calls != before.calls + 2 {
        return Err(format!(
            "calls went from {} to {}",
            before.calls, after.calls
        ));
    }
    let want = 100 * (n as u64 - 1) + crate::sum_bytes_sent(10, n, c.rank(), 4);
    if after.bytes_sent - before.bytes_sent != want {
        return Err(format!(
            "bytes_sent grew by {} (expected {want})",
            after.bytes_sent - before.bytes_sent
        ));
    }
    if after.seconds.is_nan() || after.seconds < before.seconds {
        return Err(format!(
            "seconds went from {} to {}",
            before.seconds, after.seconds
        ));
    }
    Ok(())
}

/// Splits the group into even and odd ranks: each new group holds exactly the ranks of its
/// color in their old order, its sums and messages stay inside it, and the old group still
/// works afterwards.
fn split_by_color(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let sub = c.split(r % 2).map_err(err)?;
    let members: Vec<usize> = (0..n).filter(|q| q % 2 == r % 2).collect();
    if sub.size() != members.len() || members.get(sub.rank()) != Some(&r) {
        return Err(format!(
            "rank {r} became rank {} of {} (expected {} of {})",
            sub.rank(),
            sub.size(),
            members.iter().position(|&q| q == r).unwrap_or(usize::MAX),
            members.len()
        ));
    }
    let mut v = [r as f64 + 1.0];
    sub.all_reduce_sum_f64(&mut v).map_err(err)?;
    let want: f64 = members.iter().map(|&q| q as f64 + 1.0).sum();
    if v[0] != want {
        return Err(format!(
            "sum over the sub-group is {} (expected {want})",
            v[0]
        ));
    }
    // A ring of messages inside the sub-group.
    let (sr, sn) = (sub.rank(), sub.size());
    sub.send((sr + 1) % sn, 7, &[r as u8]).map_err(err)?;
    let got = sub.recv((sr + sn - 1) % sn, 7).map_err(err)?;
    let from = members[(sr + sn - 1) % sn];
    if got != [from as u8] {
        return Err(format!("sub-group message {got:?} (expected [{from}])"));
    }
    drop(sub);
    c.barrier().map_err(err)
}

/// Each rank's `(node_rank, node_size)` is a place in its machine's group (`node_rank <
/// node_size <= size`), and the groups cover the ranks once: for every group size `k`, the
/// ranks in groups of `k` number `k` times the ranks at place 0 of such groups, and each place
/// below `k` is taken by that many ranks.
fn node_ranks(c: &dyn Comm) -> std::result::Result<(), String> {
    let (r, k) = c.node_ranks().map_err(err)?;
    if r >= k || k > c.size() {
        return Err(format!("node rank {r} of {k} in a group of {}", c.size()));
    }
    let mine = [(r as u64).to_le_bytes(), (k as u64).to_le_bytes()].concat();
    let all: Vec<(u64, u64)> = c
        .all_gather(&mine)
        .map_err(err)?
        .iter()
        .map(|b| match (b.get(..8), b.get(8..16)) {
            (Some(r), Some(k)) if b.len() == 16 => (
                u64::from_le_bytes(r.try_into().unwrap_or([0; 8])),
                u64::from_le_bytes(k.try_into().unwrap_or([0; 8])),
            ),
            _ => (u64::MAX, 0),
        })
        .collect();
    let mut places = std::collections::BTreeMap::<(u64, u64), u64>::new();
    for &(r, k) in &all {
        *places.entry((k, r)).or_default() += 1;
    }
    for &(k, _) in places.keys() {
        let groups = places.get(&(k, 0)).copied().unwrap_or(0);
        if (0..k).any(|p| places.get(&(k, p)).copied().unwrap_or(0) != groups) {
            return Err(format!("node ranks {all:?} do not form groups"));
        }
    }
    Ok(())
}
