//! The CUDA backend's device group (NCCL) against the host communicator: the rank-order sum
//! kernel gives `fanout_comm`'s all-reduce bit for bit, and a group of one (all one GPU can
//! hold: NCCL refuses two ranks on one device) sums, scales and unpacks through NCCL as the
//! trainer's host path would; backends on one GPU read one UUID. Skips itself, printing why, where there is no GPU or no NCCL.
#![cfg(feature = "cuda")]

mod common;
use common::gpu;
use fanout_comm::{Comm, LocalComm};
use fanout_compute::{Backend, Tensor};
use fanout_cuda::{nccl_present, nccl_unique_id};
use fanout_rand::Rng;

/// Values over many magnitudes, so that the order of the adds shows in the bits.
fn spread(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_f32() - 0.5) * 10f32.powi(rng.below(8) as i32 - 4))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `parts` summed by a `LocalComm` group of `parts.len()` threads (rank order), as every
/// rank gets it.
fn host_sum(parts: &[Vec<f32>]) -> Vec<f32> {
    std::thread::scope(|s| {
        let hs: Vec<_> = LocalComm::group(parts.len())
            .into_iter()
            .map(|comm| {
                let mut mine = parts[comm.rank()].clone();
                s.spawn(move || {
                    comm.all_reduce_sum_f32(&mut mine).unwrap();
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).next().unwrap()
    })
}

#[test]
fn rows_summed_in_order_are_the_host_communicators_sum() {
    let Some(be) = gpu() else { return };
    let mut rng = Rng::new(7);
    for (ranks, n) in [(1, 5), (2, 1000), (3, 4099), (5, 70_001)] {
        let parts: Vec<Vec<f32>> = (0..ranks).map(|_| spread(n, &mut rng)).collect();
        let scale = 1.0 / 3.0;
        let want: Vec<f32> = host_sum(&parts).iter().map(|v| v * scale).collect();
        let flat: Vec<f32> = parts.concat();
        let x = be.upload(&Tensor::new(ranks, n, flat)).unwrap();
        let got = be
            .download(&be.sum_rows_in_order(&x, scale).unwrap())
            .unwrap();
        assert_eq!(got.rows(), 1);
        assert_eq!(bits(got.data()), bits(&want), "{ranks} rows of {n}");
        if ranks >= 3 {
            // Another order of the adds gives other bits here, so the check above can fail.
            let reversed: Vec<f32> = (0..n)
                .map(|i| (0..ranks).rev().fold(0.0f32, |a, r| a + parts[r][i]) * scale)
                .collect();
            assert_ne!(bits(&reversed), bits(&want), "{ranks} rows: order shows");
        }
    }
    let empty = be.upload(&Tensor::new(0, 4, vec![])).unwrap();
    assert_eq!(
        be.download(&be.sum_rows_in_order(&empty, 2.0).unwrap())
            .unwrap()
            .data(),
        &[0.0; 4]
    );
}

#[test]
fn a_group_of_one_sums_through_nccl() {
    let Some(be) = gpu() else { return };
    if !nccl_present() {
        eprintln!("skipped: NCCL (libnccl.so) cannot be loaded here");
        return;
    }
    assert_eq!(be.device_group(), None);
    let id = nccl_unique_id().unwrap();
    assert_eq!(id.len(), 128);
    be.join_group(&id, 0, 1).unwrap();
    assert_eq!(be.device_group(), Some((0, 1)));
    let again = be.join_group(&id, 0, 1).unwrap_err().to_string();
    assert!(again.contains("already"), "{again}");

    let mut rng = Rng::new(11);
    let shapes = [(5, 7), (1, 13), (0, 4), (300, 129)];
    let hosts: Vec<Tensor> = shapes
        .iter()
        .map(|&(r, c)| Tensor::new(r, c, spread(r * c, &mut rng)))
        .collect();
    let mut devs: Vec<_> = hosts.iter().map(|t| be.upload(t).unwrap()).collect();
    let (scale_in, scale_out) = (37.0f32, 1.0 / 59.0);
    let mut refs: Vec<_> = devs.iter_mut().collect();
    be.sum_over_group(&mut refs, scale_in, scale_out).unwrap();
    for ((host, dev), shape) in hosts.iter().zip(&devs).zip(shapes) {
        // The trainer's host path for one rank: scaled in, summed (alone), scaled out.
        let want: Vec<f32> = host
            .data()
            .iter()
            .map(|v| (v * scale_in) * scale_out)
            .collect();
        let got = be.download(dev).unwrap();
        assert_eq!((got.rows(), got.cols()), shape);
        assert_eq!(bits(got.data()), bits(&want), "{shape:?}");
    }

    let other = gpu().unwrap();
    // Two backends on one GPU read one UUID: what tells ranks that they share it.
    let uuid = be.device_uuid().unwrap();
    assert_eq!(uuid.len(), 16);
    assert!(uuid.iter().any(|&b| b != 0), "{uuid:?}");
    assert_eq!(other.device_uuid().unwrap(), uuid);
    let short = other.join_group(&id[..5], 0, 1).unwrap_err().to_string();
    assert!(
        short.contains("5 bytes") && short.contains("128"),
        "{short}"
    );
    let rank = other.join_group(&id, 1, 1).unwrap_err().to_string();
    assert!(rank.contains("rank 1 of a group of 1"), "{rank}");
    assert_eq!(other.device_group(), None);
}
