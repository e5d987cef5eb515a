//! `LocalComm`: the conformance checks with 1, 2 and 3 threads, and the failure semantics
//! (no call hangs after a peer failed, exited or panicked).

use fanout_comm::{conformance, Comm, CommError, LocalComm, MAX_TAG};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Runs `f` on every member of a group of `n`, each on its own thread, and returns the results
/// by rank. Fails the test (instead of hanging it) when they take longer than `limit`.
fn run_group<R, F>(n: usize, limit: Duration, f: F) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(LocalComm) -> R + Send + Sync + Clone + 'static,
{
    let (tx, rx) = mpsc::channel();
    for comm in LocalComm::group(n) {
        let tx = tx.clone();
        let f = f.clone();
        std::thread::spawn(move || {
            let rank = comm.rank();
            let out = f(comm);
            let _ = tx.send((rank, out));
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((rank, r)) => out[rank] = Some(r),
            Err(e) => panic!("group of {n}: a worker did not finish within {limit:?} ({e})"),
        }
    }
    out.into_iter()
        .map(|r| r.expect("every rank reported"))
        .collect()
}

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn conformance_with_1_2_and_3_threads() {
    for n in 1..=3 {
        let results = run_group(n, LIMIT, |c| conformance::run(&c));
        for (rank, res) in results.iter().enumerate() {
            assert_eq!(res.len(), 13);
            for check in res {
                assert_eq!(
                    check.outcome,
                    Ok(()),
                    "n = {n}, rank {rank}, check {}",
                    check.name
                );
            }
        }
    }
}

#[test]
fn sum_follows_rank_order_exactly() {
    // In f32, 1e8 + 1 rounds back to 1e8 (the spacing there is 8), so the order shows.
    for (values, want) in [
        ([1e8f32, 1.0, -1e8], 0.0f32),
        ([1.0, 1e8, -1e8], 0.0),
        ([1e8, -1e8, 1.0], 1.0),
    ] {
        let got = run_group(3, LIMIT, move |c| {
            let mut buf = [values[c.rank()], 2.0 * values[c.rank()]];
            c.all_reduce_sum_f32(&mut buf).map(|_| buf)
        });
        for buf in got {
            let buf = buf.unwrap();
            assert_eq!(buf[0].to_bits(), want.to_bits(), "{values:?}");
            assert_eq!(buf[1].to_bits(), (2.0 * want).to_bits(), "{values:?}");
        }
    }
}

#[test]
fn fail_wakes_ranks_blocked_in_a_collective_and_in_recv() {
    let started = Instant::now();
    let results = run_group(3, Duration::from_secs(10), |c| {
        match c.rank() {
            1 => {
                std::thread::sleep(Duration::from_millis(200));
                c.fail("out of memory in the sampler");
                // The failed member's own later calls report the failure too.
                vec![c.barrier()]
            }
            0 => {
                let mut buf = vec![1.0f32; 100];
                let first = c.all_reduce_sum_f32(&mut buf);
                vec![first, c.barrier(), c.send(2, 0, b"x")]
            }
            _ => vec![c.recv(0, 3).map(|_| ()), c.barrier()],
        }
    });
    let want = CommError::PeerFailed {
        rank: 1,
        message: "out of memory in the sampler".into(),
    };
    for (rank, res) in results.iter().enumerate() {
        for r in res {
            assert_eq!(*r, Err(want.clone()), "rank {rank}");
        }
    }
    assert_eq!(
        want.to_string(),
        "rank 1 failed: out of memory in the sampler"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_dropped_member_fails_the_others_collectives_but_its_messages_arrive() {
    let results = run_group(2, Duration::from_secs(10), |c| {
        if c.rank() == 1 {
            c.send(0, 4, b"last words").unwrap();
            return Vec::new(); // drops the communicator
        }
        std::thread::sleep(Duration::from_millis(100));
        vec![
            c.recv(1, 4),
            c.recv(1, 4),
            c.barrier().map(|_| Vec::new()),
            c.send(1, 0, b"x").map(|_| Vec::new()),
        ]
    });
    let r0 = &results[0];
    assert_eq!(r0[0], Ok(b"last words".to_vec()));
    for r in &r0[1..] {
        match r {
            Err(CommError::PeerFailed { rank: 1, message }) => {
                assert!(message.contains("exited"), "{message}")
            }
            other => panic!("expected PeerFailed from rank 1, got {other:?}"),
        }
    }
}

#[test]
fn a_panicking_member_does_not_hang_the_others() {
    let results = run_group(3, Duration::from_secs(10), |c| {
        if c.rank() == 2 {
            let handle = std::thread::spawn(move || {
                let _c = c;
                panic!("deliberate panic in a test worker");
            });
            assert!(handle.join().is_err());
            return Ok(());
        }
        c.barrier()
    });
    for r in &results[..2] {
        assert_eq!(
            *r,
            Err(CommError::PeerFailed {
                rank: 2,
                message: "panicked".into()
            })
        );
    }
}

#[test]
fn misuse_returns_invalid_without_touching_the_group() {
    let g = LocalComm::group(2);
    assert!(matches!(g[0].send(2, 0, b""), Err(CommError::Invalid(_))));
    assert!(matches!(
        g[0].send(1, MAX_TAG + 1, b""),
        Err(CommError::Invalid(_))
    ));
    assert!(matches!(g[1].recv(5, 0), Err(CommError::Invalid(_))));
    assert!(LocalComm::group(0).is_empty());
    let one = LocalComm::group(1).pop().unwrap();
    let mut v = vec![1u8];
    assert!(matches!(
        one.broadcast(1, &mut v),
        Err(CommError::Invalid(_))
    ));
    assert!(matches!(
        one.all_to_all_v(&[vec![], vec![]]),
        Err(CommError::Invalid(_))
    ));
}

#[test]
fn mismatched_lengths_are_reported_on_every_rank() {
    let results = run_group(3, LIMIT, |c| {
        let mut buf = vec![0.5f64; if c.rank() == 2 { 4 } else { 3 }];
        let first = c.all_reduce_sum_f64(&mut buf);
        let mut ok = vec![0.5f64; 3];
        (first, c.all_reduce_sum_f64(&mut ok).map(|_| ok))
    });
    for (first, then) in results {
        match first {
            Err(CommError::Invalid(m)) => assert!(m.contains("different lengths"), "{m}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert_eq!(then, Ok(vec![1.5; 3]));
    }
}

#[test]
fn point_to_point_keeps_order_per_tag_across_threads() {
    let results = run_group(2, LIMIT, |c| {
        if c.rank() == 0 {
            for k in 0u32..500 {
                c.send(1, k % 3, &k.to_le_bytes()).unwrap();
            }
            Vec::new()
        } else {
            // Receive tag 2 first, then 0, then 1: each stream in send order.
            let mut got = Vec::new();
            for tag in [2u32, 0, 1] {
                for _ in 0..(500 / 3 + u32::from(tag < 500 % 3)) {
                    let m = c.recv(0, tag).unwrap();
                    got.push(u32::from_le_bytes(m.try_into().unwrap()));
                }
            }
            got
        }
    });
    let want: Vec<u32> = [2u32, 0, 1]
        .iter()
        .flat_map(|&t| (0u32..500).filter(move |k| k % 3 == t))
        .collect();
    assert_eq!(results[1], want);
}

#[test]
fn stats_count_broadcast_bytes_at_the_root_only() {
    let results = run_group(3, LIMIT, |c| {
        let mut buf = if c.rank() == 1 {
            vec![9u8; 1000]
        } else {
            Vec::new()
        };
        c.broadcast(1, &mut buf).unwrap();
        (buf.len(), c.stats())
    });
    for (rank, (len, stats)) in results.iter().enumerate() {
        assert_eq!(*len, 1000);
        assert_eq!(stats.calls, 1);
        assert_eq!(stats.bytes_sent, if rank == 1 { 2000 } else { 0 });
        assert!(stats.seconds >= 0.0);
    }
}

#[test]
fn a_group_of_one_is_cheap() {
    let c = LocalComm::group(1).pop().unwrap();
    let mut buf = [1.0f32; 64];
    let t = Instant::now();
    for _ in 0..100_000 {
        c.all_reduce_sum_f32(&mut buf).unwrap();
        c.barrier().unwrap();
    }
    // About 100 ns a call; the bound only catches locking or copying gone wrong.
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(buf, [1.0; 64]);
    assert_eq!(c.stats().calls, 200_000);
    assert_eq!(c.stats().bytes_sent, 0);
    assert_eq!(c.kind(), "local");
}

#[test]
fn comm_is_object_safe_and_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<LocalComm>();
    let g: Vec<Box<dyn Comm>> = LocalComm::group(1)
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Comm>)
        .collect();
    assert_eq!(g[0].size(), 1);
}

#[test]
fn a_second_concurrent_collective_on_one_rank_is_refused() {
    let mut g = LocalComm::group(2);
    let r1 = g.pop().unwrap();
    let r0 = std::sync::Arc::new(g.pop().unwrap());
    let first = {
        let r0 = std::sync::Arc::clone(&r0);
        std::thread::spawn(move || r0.barrier())
    };
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        (r1.barrier(), r1)
    });
    std::thread::sleep(Duration::from_millis(100));
    // Whichever of the two threads of rank 0 came second is refused; the other meets rank 1.
    let second = r0.barrier();
    let first = first.join().unwrap();
    let (r1_result, r1) = late.join().unwrap();
    assert_eq!(r1_result, Ok(()));
    let mut outcomes = [first, second];
    outcomes.sort_by_key(|o| o.is_ok());
    assert!(
        matches!(outcomes[0], Err(CommError::Invalid(_))),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[1], Ok(()));
    // Both ranks can go on.
    let other = std::thread::spawn(move || r1.barrier());
    assert_eq!(r0.barrier(), Ok(()));
    assert_eq!(other.join().unwrap(), Ok(()));
}

/// In process, every member shares the machine: its node rank is its rank.
#[test]
fn local_members_are_all_on_one_machine() {
    for n in 1..=3 {
        let got = run_group(n, LIMIT, |c| c.node_ranks().unwrap());
        let want: Vec<(usize, usize)> = (0..n).map(|r| (r, n)).collect();
        assert_eq!(got, want);
    }
}
