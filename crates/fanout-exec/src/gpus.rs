//! Several GPUs training together: how their workers sum gradients ([`gradient_sum_plan`]:
//! NCCL where every worker has a GPU of its own and can load it, else the host), joining the
//! NCCL group, and `--workers N` on GPUs (one thread and one GPU each). One MPI process per
//! GPU (`src/cmd/mpi.rs`) goes through [`crate::Compute::train_worker`] and joins the group
//! here; threads of one process go through [`crate::Compute::train`] and sum on the host
//! (`train_on_gpus` says why).

#[cfg(feature = "cuda")]
use crate::device::{device_for_node_rank, gpu_count, Compute, DeviceSpec};
use crate::{ExecError, Result};
#[cfg(feature = "cuda")]
use crate::{FitObserver, RunEnv, TrainConfig, TrainOutcome};
#[cfg(feature = "cuda")]
use std::sync::Arc;

/// How the ranks of a data-parallel group on GPUs sum their gradients, as the ranks agreed
/// in [`gradient_sum_plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GradientSum {
    /// On the GPUs, through NCCL (see `fanout_cuda::CudaBackend::join_group`).
    Nccl,
    /// Read back and summed on the host through the communicator, for the reason given.
    Host(String),
}

/// The variable that picks how GPU ranks sum their gradients: `auto` (or unset: NCCL where
/// every rank can use it, else the host), `nccl` (NCCL or an error saying why not) or `host`.
pub const GRADIENT_SUM_VARIABLE: &str = "FANOUT_GRADIENT_SUM";

/// What one rank says before the group decides how to sum: the choice it was given
/// ([`GRADIENT_SUM_VARIABLE`]: 0 auto, 1 nccl, 2 host) and why it cannot use NCCL (empty
/// when it can), as the bytes [`gradient_sum_plan`] reads.
pub fn gradient_sum_vote(choice: u8, blocker: &str) -> Vec<u8> {
    let mut v = vec![choice];
    v.extend_from_slice(blocker.as_bytes());
    v
}

/// The group's decision from every rank's [`gradient_sum_vote`] (indexed by rank), the same
/// on every rank: the host when a rank asks for it; else NCCL when no rank has a reason it
/// cannot; else the host with the first such reason, or an error naming it when a rank asks
/// for NCCL. A vote that is not one of the three choices is an error.
pub fn gradient_sum_plan(votes: &[Vec<u8>]) -> Result<GradientSum> {
    let mut nccl_asked = false;
    let mut blocker = None;
    for (rank, v) in votes.iter().enumerate() {
        match v.first() {
            Some(0) => {}
            Some(1) => nccl_asked = true,
            Some(2) => {
                return Ok(GradientSum::Host(format!(
                    "{GRADIENT_SUM_VARIABLE}=host on rank {rank}"
                )))
            }
            _ => {
                return Err(ExecError::Invalid(format!(
                    "rank {rank} sent a gradient-sum vote of {} bytes starting {:?}; expected \
                     0, 1 or 2 then a reason",
                    v.len(),
                    v.first()
                )))
            }
        }
        if blocker.is_none() && v.len() > 1 {
            blocker = Some(format!("rank {rank}: {}", String::from_utf8_lossy(&v[1..])));
        }
    }
    match (blocker, nccl_asked) {
        (None, _) => Ok(GradientSum::Nccl),
        (Some(why), false) => Ok(GradientSum::Host(why)),
        (Some(why), true) => Err(ExecError::Invalid(format!(
            "{GRADIENT_SUM_VARIABLE}=nccl, but NCCL cannot be used ({why})"
        ))),
    }
}

/// Another rank whose GPU has the same UUID as rank `me`'s (`uuids` indexed by rank; empty
/// ones match nothing), if any: the lowest.
pub fn sharing_rank(uuids: &[Vec<u8>], me: usize) -> Option<usize> {
    let mine = uuids.get(me).filter(|u| !u.is_empty())?;
    (0..uuids.len()).find(|&r| r != me && uuids[r] == *mine)
}

/// `cfg.workers` data-parallel workers in this process, one thread and one GPU each: rank 0
/// on `be`'s GPU `K`, rank `r` on GPU `K + r` of the machine (modulo its GPUs). Refused when
/// the machine has fewer GPUs than workers: their queues would compete for one.
///
/// The workers sum their gradients on the host through their [`fanout_comm::LocalComm`], not
/// through NCCL. NCCL's join and collectives block without a timeout and do not see the
/// group's failures: one thread whose GPU fails inside them would leave the others waiting for
/// ever, where one MPI process per GPU ends the whole job (`MPI_Abort`). One process per GPU
/// (`mpirun -np N fanout train --device cuda`) sums on the GPUs.
#[cfg(feature = "cuda")]
pub(crate) fn train_on_gpus(
    be: fanout_cuda::CudaBackend,
    cfg: &TrainConfig,
    env: &RunEnv,
    obs: &mut dyn FitObserver,
) -> Result<TrainOutcome> {
    cfg.validate()?;
    crate::check_backend(&be, cfg)?;
    let (n, gpus) = (cfg.workers, gpu_count());
    if n > gpus {
        return Err(ExecError::Invalid(format!(
            "--workers {n} on the GPU needs a GPU for each worker and this machine has {gpus}; \
             use --workers {gpus} or fewer, or one MPI process per GPU on several machines \
             (`mpirun -np N fanout train --device cuda --strategy data-parallel`)"
        )));
    }
    let first = DeviceSpec::Cuda(be.index());
    let ds = crate::open_dataset(cfg, env.progress)?;
    let worker = |comm: &fanout_comm::LocalComm,
                  pool: Option<Arc<rayon::ThreadPool>>,
                  env: &RunEnv,
                  obs: &mut dyn FitObserver| {
        let rank = fanout_comm::Comm::rank(comm);
        let be = match rank {
            0 => be.clone(),
            r => match Compute::open(device_for_node_rank(first, r, gpus)) {
                Ok((Compute::Cuda(b), _)) => b,
                Ok(_) => return Err(ExecError::Invalid(format!("worker {r}: not a GPU"))),
                Err(why) => {
                    let spec = device_for_node_rank(first, r, gpus);
                    return Err(ExecError::Invalid(format!(
                        "worker {r}: --device {spec}: {why}"
                    )));
                }
            },
        };
        crate::train_worker_with(be, ds.clone(), cfg, comm, pool, env, obs)
    };
    obs.note(&format!(
        "{n} workers on {n} GPUs in this process; gradients read back and summed on the host \
         (one MPI process per GPU sums them on the GPUs through NCCL)"
    ));
    // Each worker's training reports its device's failures itself (`train_worker_with`).
    crate::run::run_group(n, cfg.threads, env, obs, &worker)
}

/// What joining a group of devices needs of one device (NCCL on CUDA): the protocol of
/// [`join_group_of`] written against it, so that it is tested without GPUs.
pub trait GroupDevice {
    /// The device's UUID, unique to it (so ranks find out whether they share one).
    fn uuid(&self) -> std::result::Result<Vec<u8>, String>;
    /// Whether the collective library can be loaded here.
    fn library_present(&self) -> bool;
    /// A new group id, made on rank 0 and sent to the others.
    fn new_group_id(&self) -> std::result::Result<Vec<u8>, String>;
    /// Joins rank `rank` of `size` to the group `id` (a collective).
    fn join(&self, id: &[u8], rank: usize, size: usize) -> std::result::Result<(), String>;
}

#[cfg(feature = "cuda")]
impl GroupDevice for fanout_cuda::CudaBackend {
    fn uuid(&self) -> std::result::Result<Vec<u8>, String> {
        self.device_uuid().map_err(|e| e.to_string())
    }
    fn library_present(&self) -> bool {
        fanout_cuda::nccl_present()
    }
    fn new_group_id(&self) -> std::result::Result<Vec<u8>, String> {
        fanout_cuda::nccl_unique_id().map_err(|e| e.to_string())
    }
    fn join(&self, id: &[u8], rank: usize, size: usize) -> std::result::Result<(), String> {
        self.join_group(id, rank, size).map_err(|e| e.to_string())
    }
}

/// The choice [`GRADIENT_SUM_VARIABLE`] makes, as a [`gradient_sum_vote`] byte: 0 auto (or
/// unset), 1 nccl, 2 host; an error for any other value.
pub fn gradient_sum_choice() -> Result<u8> {
    match std::env::var(GRADIENT_SUM_VARIABLE).as_deref() {
        Err(_) | Ok("") | Ok("auto") => Ok(0),
        Ok("nccl") => Ok(1),
        Ok("host") => Ok(2),
        Ok(other) => Err(ExecError::Invalid(format!(
            "{GRADIENT_SUM_VARIABLE} is {other:?}; expected auto, nccl or host"
        ))),
    }
}

/// [`join_group_of`] for a GPU, with the choice [`GRADIENT_SUM_VARIABLE`] makes.
#[cfg(feature = "cuda")]
pub(crate) fn join_device_group(
    be: &fanout_cuda::CudaBackend,
    comm: &dyn fanout_comm::Comm,
) -> Result<String> {
    join_group_of(be, comm, gradient_sum_choice()?)
}

/// Decides with the other ranks of `comm` how the group sums its gradients
/// ([`gradient_sum_plan`] of every rank's `choice` and blocker: no library, an unreadable
/// UUID, a GPU shared with another rank) and, for a device group, joins `dev` to it: rank 0
/// makes the id and broadcasts it (or why it has none, which every rank then takes as a
/// blocker), and every rank waits at a barrier before the blocking join. A collective whose
/// answer is the same on every rank. Returns the note that says how the gradients are summed.
pub fn join_group_of(
    dev: &dyn GroupDevice,
    comm: &dyn fanout_comm::Comm,
    choice: u8,
) -> Result<String> {
    // Each rank's GPU by its UUID (empty where it cannot be read), so that ranks sharing a
    // GPU are found whatever each process sees of the machine (CUDA_VISIBLE_DEVICES).
    let uuid = dev.uuid().unwrap_or_default();
    let uuids = comm.all_gather(&uuid)?;
    let blocker = if !dev.library_present() {
        "NCCL (libnccl.so) cannot be loaded".to_string()
    } else if uuid.is_empty() {
        "its GPU's UUID cannot be read".to_string()
    } else if let Some(other) = sharing_rank(&uuids, comm.rank()) {
        format!("rank {other} uses the same GPU, and NCCL needs a GPU per rank")
    } else {
        String::new()
    };
    let votes = comm.all_gather(&gradient_sum_vote(choice, &blocker))?;
    let host = |why: String| {
        format!(
            "gradients read back and summed on the host through {} ({why})",
            comm.kind()
        )
    };
    if let GradientSum::Host(why) = gradient_sum_plan(&votes)? {
        return Ok(host(why));
    }
    // Rank 0's id, or why it has none (a leading 1), for every rank.
    let mut id = vec![0u8];
    if comm.rank() == 0 {
        match dev.new_group_id() {
            Ok(bytes) => id.extend_from_slice(&bytes),
            Err(e) => {
                id = vec![1];
                id.extend_from_slice(e.as_bytes());
            }
        }
    }
    comm.broadcast(0, &mut id)?;
    // Every rank has the id before any enters NCCL's blocking join, which makes no MPI
    // progress (an MPI that finishes a broadcast lazily would wait for it forever).
    comm.barrier()?;
    if id.first() != Some(&0) {
        let why = format!("rank 0: {}", String::from_utf8_lossy(&id[1..]));
        if votes.iter().any(|v| v.first() == Some(&1)) {
            return Err(ExecError::Invalid(format!(
                "{GRADIENT_SUM_VARIABLE}=nccl, but NCCL cannot be used ({why})"
            )));
        }
        return Ok(host(why));
    }
    dev.join(&id[1..], comm.rank(), comm.size())
        .map_err(|e| ExecError::Invalid(format!("joining the NCCL group: {e}")))?;
    Ok(format!(
        "gradients summed on the GPUs through NCCL ({} ranks: an all-gather, then added in rank \
         order on each GPU, the host sum's bits)",
        comm.size()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The id, rank and size a device was asked to join with.
    type Joined = (Vec<u8>, usize, usize);

    /// A device for [`join_group_of`]: its UUID (`None`: unreadable), whether the library
    /// loads, the id it makes as rank 0 (`Err`: why not), and the join it was asked for.
    struct Fake {
        uuid: Option<&'static [u8]>,
        present: bool,
        id: std::result::Result<&'static [u8], &'static str>,
        joined: Mutex<Option<Joined>>,
    }

    impl GroupDevice for Fake {
        fn uuid(&self) -> std::result::Result<Vec<u8>, String> {
            self.uuid
                .map(<[u8]>::to_vec)
                .ok_or_else(|| "unreadable".into())
        }
        fn library_present(&self) -> bool {
            self.present
        }
        fn new_group_id(&self) -> std::result::Result<Vec<u8>, String> {
            self.id.map(<[u8]>::to_vec).map_err(str::to_string)
        }
        fn join(&self, id: &[u8], rank: usize, size: usize) -> std::result::Result<(), String> {
            *self.joined.lock().unwrap() = Some((id.to_vec(), rank, size));
            Ok(())
        }
    }

    fn fake(uuid: &'static [u8]) -> Fake {
        Fake {
            uuid: Some(uuid),
            present: true,
            id: Ok(b"ID"),
            joined: Mutex::new(None),
        }
    }

    /// [`fake`] without the library.
    fn no_library(uuid: &'static [u8]) -> Fake {
        Fake {
            present: false,
            ..fake(uuid)
        }
    }

    /// [`fake`] that cannot make a group id.
    fn no_id(uuid: &'static [u8]) -> Fake {
        Fake {
            id: Err("no network interface"),
            ..fake(uuid)
        }
    }

    /// Every rank's note (or error) and join, the ranks running the protocol as threads.
    fn protocol(devs: Vec<Fake>, choices: &[u8]) -> Vec<(String, Option<Joined>)> {
        std::thread::scope(|s| {
            let hs: Vec<_> = fanout_comm::LocalComm::group(devs.len())
                .into_iter()
                .zip(devs)
                .map(|(comm, dev)| {
                    let choice = choices[fanout_comm::Comm::rank(&comm)];
                    s.spawn(move || {
                        let r = join_group_of(&dev, &comm, choice);
                        let note = r.unwrap_or_else(|e| format!("error: {e}"));
                        (note, dev.joined.into_inner().unwrap())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// The protocol gives every rank the same answer and joins all or none of them: NCCL when
    /// every rank can; the host, naming the first rank that cannot and why (no library, an
    /// unreadable UUID, a shared GPU, rank 0 without an id, a rank asking for the host);
    /// an error on every rank when one asks for NCCL and it cannot be had.
    #[test]
    fn ranks_join_the_device_group_together_or_not_at_all() {
        let all_same = |out: &[(String, Option<Joined>)], what: &str| {
            assert!(out.iter().all(|o| o.0 == out[0].0), "{what}: {out:?}");
        };
        let out = protocol(vec![fake(b"a"), fake(b"b"), fake(b"c")], &[0, 0, 0]);
        all_same(&out, "all can");
        assert!(out[0].0.contains("through NCCL (3 ranks"), "{out:?}");
        for (r, o) in out.iter().enumerate() {
            assert_eq!(o.1, Some((b"ID".to_vec(), r, 3)), "rank {r} joined");
        }
        let host_for = |devs: Vec<Fake>, choices: &[u8], why: &str| {
            let out = protocol(devs, choices);
            all_same(&out, why);
            assert!(
                out[0].0.starts_with("gradients read back"),
                "{why}: {out:?}"
            );
            assert!(out[0].0.contains(why), "{why}: {out:?}");
            assert!(out.iter().all(|o| o.1.is_none()), "{why}: nobody joins");
        };
        host_for(
            vec![fake(b"a"), fake(b"b"), fake(b"a")],
            &[0, 0, 0],
            "rank 0: rank 2 uses the same GPU",
        );
        host_for(
            vec![fake(b"a"), no_library(b"b")],
            &[0, 0],
            "rank 1: NCCL (libnccl.so) cannot be loaded",
        );
        let unread = Fake {
            uuid: None,
            ..fake(b"b")
        };
        host_for(
            vec![fake(b"a"), unread],
            &[0, 0],
            "rank 1: its GPU's UUID cannot be read",
        );
        host_for(
            vec![no_id(b"a"), fake(b"b")],
            &[0, 0],
            "rank 0: no network interface",
        );
        host_for(
            vec![fake(b"a"), fake(b"b")],
            &[1, 2],
            "FANOUT_GRADIENT_SUM=host on rank 1",
        );

        let out = protocol(vec![fake(b"a"), no_library(b"b")], &[1, 0]);
        all_same(&out, "nccl asked");
        assert!(
            out[0].0.starts_with("error:") && out[0].0.contains("=nccl"),
            "{out:?}"
        );
        let out = protocol(vec![no_id(b"a"), fake(b"b")], &[0, 1]);
        all_same(&out, "nccl asked, no id");
        assert!(
            out[0].0.contains("=nccl") && out[0].0.contains("no network"),
            "{out:?}"
        );
        assert!(out.iter().all(|o| o.1.is_none()), "nobody joins");
    }

    /// Ranks share a GPU when their UUIDs are equal; unread ones share nothing.
    #[test]
    fn ranks_sharing_a_gpu_are_found() {
        let u = |b: &[u8]| b.to_vec();
        let uuids = [u(b"a"), u(b"b"), u(b"a"), u(b""), u(b"")];
        assert_eq!(sharing_rank(&uuids, 0), Some(2));
        assert_eq!(sharing_rank(&uuids, 2), Some(0));
        assert_eq!(sharing_rank(&uuids, 1), None);
        assert_eq!(sharing_rank(&uuids, 3), None);
        assert_eq!(sharing_rank(&uuids, 9), None);
    }

    /// NCCL when every rank can use it; the host when one asks for it or, unasked for NCCL,
    /// when one cannot (naming the first such rank); an error when NCCL is asked for and a
    /// rank cannot, or a vote is malformed.
    #[test]
    fn ranks_agree_how_to_sum_gradients() {
        let v = gradient_sum_vote;
        assert_eq!(
            gradient_sum_plan(&[v(0, ""), v(0, "")]).unwrap(),
            GradientSum::Nccl
        );
        assert_eq!(
            gradient_sum_plan(&[v(1, ""), v(0, "")]).unwrap(),
            GradientSum::Nccl
        );
        let host = gradient_sum_plan(&[v(0, ""), v(2, ""), v(1, "no nccl")]).unwrap();
        assert_eq!(
            host,
            GradientSum::Host("FANOUT_GRADIENT_SUM=host on rank 1".into())
        );
        let shared = gradient_sum_plan(&[v(0, ""), v(0, "shared"), v(0, "missing")]).unwrap();
        assert_eq!(shared, GradientSum::Host("rank 1: shared".into()));
        let asked = gradient_sum_plan(&[v(1, ""), v(0, "missing")])
            .unwrap_err()
            .to_string();
        assert!(
            asked.contains("=nccl") && asked.contains("rank 1: missing"),
            "{asked}"
        );
        let bad = gradient_sum_plan(&[v(0, ""), vec![]])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("rank 1"), "{bad}");
        assert!(gradient_sum_plan(&[v(7, "")]).is_err());
    }
}
