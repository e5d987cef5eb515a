//! `fanout train` as one rank of an MPI job (`mpirun -np N fanout train ...`, `srun`): each
//! process is one data-parallel worker joined to the others by `fanout_comm::MpiComm`. With
//! `--device cuda[:N]` each rank computes on a GPU of its machine, the `r`-th rank there on
//! GPU `N + r` (modulo the GPUs it has): one process per GPU, gradients summed through MPI.

use crate::cmd::train::TrainArgs;
use fanout_exec::TrainConfig;

/// Runs this process's worker. Every rank opens the dataset itself (a shared filesystem, or
/// the same copy on every machine); rank 0 alone draws progress and writes files. A rank that
/// fails prints its message and aborts the whole job (MPI_Abort), so no rank waits forever.
#[cfg(feature = "mpi")]
pub fn train(a: &TrainArgs, cfg: &TrainConfig, quiet: bool) -> Result<(), String> {
    use crate::memory::HostHeap;
    use crate::progress::Bars;
    use fanout_comm::{Comm, MpiComm};
    use fanout_exec::{FitObserver, RunEnv};

    let comm = MpiComm::init().map_err(|e| format!("starting MPI: {e}"))?;
    let rank = comm.rank();
    let bars = Bars::new(quiet || rank != 0);
    let probe = HostHeap;
    let env = RunEnv {
        progress: &bars,
        probe: Some(&probe),
        checkpoint: a.save_model.as_deref(),
        resume: a.resume.as_deref(),
        ..RunEnv::default()
    };
    let result = (|| -> Result<(fanout_exec::TrainOutcome, fanout_exec::DeviceInfo), String> {
        if let Some(t) = cfg.threads {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build_global()
                .map_err(|e| format!("cannot start {t} threads: {e}"))?;
        }
        let (node_rank, _) = comm.node_ranks().map_err(|e| e.to_string())?;
        let spec = fanout_exec::device_for_node_rank(a.device, node_rank, gpu_count(a.device));
        let (compute, device) = fanout_exec::Compute::open(spec).map_err(|why| {
            let asked = if spec == a.device {
                String::new()
            } else {
                format!(" (this rank's GPU for --device {})", a.device)
            };
            format!("--device {spec}{asked}: {why}")
        })?;
        let ds = fanout_exec::open_dataset(cfg, env.progress).map_err(|e| e.to_string())?;
        let mut quiet_obs = ();
        let mut obs0 = crate::cmd::train::observer(cfg, quiet);
        let obs: &mut dyn FitObserver = if rank == 0 { &mut obs0 } else { &mut quiet_obs };
        let out = compute
            .train_worker(ds, cfg, &comm, &env, obs)
            .map_err(|e| e.to_string())?;
        Ok((out, device))
    })();
    match result {
        Ok((out, device)) if rank == 0 => crate::cmd::train::finish(a, &out, Some(&device)),
        Ok(_) => Ok(()),
        Err(e) => {
            // Ends every rank with this message (MPI_Abort); does not return.
            comm.fail(&e);
            Err(e)
        }
    }
}

/// The GPUs a rank may choose among for `spec` (none asked for: 0, and nothing is probed).
#[cfg(feature = "mpi")]
fn gpu_count(spec: fanout_cuda::DeviceSpec) -> usize {
    if spec.is_cpu() {
        0
    } else {
        fanout_exec::gpu_count()
    }
}

/// Without the `mpi` feature, a run started by mpirun is refused (it would otherwise run N
/// unrelated single-worker trainings).
#[cfg(not(feature = "mpi"))]
pub fn train(_: &TrainArgs, _: &TrainConfig, _: bool) -> Result<(), String> {
    Err(
        "started by an MPI launcher, but this fanout was built without MPI; build it with \
         `cargo build --release --features mpi` (needs Open MPI: libopenmpi-dev)"
            .into(),
    )
}
