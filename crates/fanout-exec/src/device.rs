//! The device a run computes on: [`Compute::open`] turns a [`DeviceSpec`] (`cpu`, `cuda`,
//! `cuda:N`) into a backend, and [`Compute::train`] runs the run API there. The command line's
//! `--device` and the Python package's `device=` both go through it, so they accept, refuse and
//! report the same devices.

pub use fanout_cuda::{DeviceInfo, DeviceSpec, CUDA_BUILT};

use crate::run::{train, TrainOutcome};
use crate::{
    ExecError, FitObserver, PipelineConfig, Result, RunEnv, SamplingPlacement, TrainConfig,
};
use fanout_compute::Backend;
use fanout_graph::{Dataset, Progress};
use fanout_sample::{
    AliasTables, KHopConfig, RandomWalkConfig, Sampler, SamplerKind, WeightedConfig, FANOUT_ALL,
};
use std::sync::Arc;

/// Where a run computes, as opened by [`Compute::open`].
#[derive(Debug)]
pub enum Compute {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend on an opened GPU, its kernels compiled (only in a build with the
    /// `cuda` feature).
    #[cfg(feature = "cuda")]
    Cuda(fanout_cuda::CudaBackend),
}

impl Compute {
    /// Opens the device `spec` names and, for a GPU, starts the CUDA backend on it (NVRTC
    /// compiles its kernels, cuBLAS starts); returns it with the device's summary as the run
    /// starts (name, memory), for the run's metrics. The error says what is missing (no CUDA in
    /// this build, no driver, no such device, NVRTC or cuBLAS failing) as a clause meant to
    /// follow the device's name (`--device cuda:1: ...`). A spec naming a GPU never opens the
    /// CPU instead.
    pub fn open(spec: DeviceSpec) -> std::result::Result<(Compute, DeviceInfo), String> {
        let device = fanout_cuda::open(spec).map_err(|e| e.to_string())?;
        let info = device.info();
        if device.is_cpu() {
            return Ok((Compute::Cpu, info));
        }
        Ok((cuda_backend(device)?, info))
    }

    /// Trains `cfg` here: [`train`] on the CPU, [`crate::train_with_backend`] on a GPU (which
    /// refuses, before the dataset is opened, what runs on the CPU only: see
    /// [`crate::check_backend`]). With `--workers N` on a GPU, N data-parallel workers run in
    /// this process, one thread and one GPU each: this one and the next N - 1 of the machine,
    /// counted round its GPUs (see [`device_for_node_rank`]), summing their gradients on the
    /// host; a machine with fewer than N GPUs is refused.
    pub fn train(
        self,
        cfg: &TrainConfig,
        env: &RunEnv,
        obs: &mut dyn FitObserver,
    ) -> Result<TrainOutcome> {
        match self {
            Compute::Cpu => train(cfg, env, obs),
            #[cfg(feature = "cuda")]
            Compute::Cuda(be) if cfg.workers > 1 => crate::gpus::train_on_gpus(be, cfg, env, obs),
            #[cfg(feature = "cuda")]
            Compute::Cuda(be) => crate::train_with_backend(be, cfg, env, obs),
        }
    }

    /// Trains `cfg` here as one worker of the group `comm` joins (an MPI rank):
    /// [`crate::train_worker`] on the CPU, [`crate::train_worker_with`] on a GPU. Each
    /// worker opens its own device (see [`device_for_node_rank`]).
    pub fn train_worker(
        self,
        ds: Arc<Dataset>,
        cfg: &TrainConfig,
        comm: &dyn fanout_comm::Comm,
        env: &RunEnv,
        obs: &mut dyn FitObserver,
    ) -> Result<TrainOutcome> {
        match self {
            Compute::Cpu => crate::train_worker(ds, cfg, comm, None, env, obs),
            #[cfg(feature = "cuda")]
            Compute::Cuda(be) => {
                if comm.size() > 1 && cfg.strategy_kind() == crate::StrategyKind::DataParallel {
                    let note = crate::gpus::join_device_group(&be, comm)?;
                    obs.note(&note);
                }
                crate::train_worker_with(be, ds, cfg, comm, None, env, obs)
            }
        }
    }

    /// Evaluates a checkpoint here: [`crate::evaluate_checkpoint_with`] on this device's
    /// backend.
    pub fn evaluate(self, req: &crate::EvalRequest, progress: &dyn Progress) -> Result<f64> {
        match self {
            Compute::Cpu => crate::evaluate_checkpoint(req, progress),
            #[cfg(feature = "cuda")]
            Compute::Cuda(be) => crate::evaluate_checkpoint_with(be, req, progress),
        }
    }
}

/// The device that the rank at `node_rank` among its machine's ranks
/// ([`fanout_comm::Comm::node_ranks`]) opens when `spec` is asked for, on a machine with
/// `gpus` GPUs: the CPU for the CPU; for `cuda:N`, GPU `N + node_rank` counted round the
/// machine's GPUs. So `--device cuda` gives the ranks of a machine a GPU each, in order, and
/// ranks share GPUs only when they outnumber them. With `gpus == 0` (none seen) `spec` is
/// returned as is, for opening it to say why.
pub fn device_for_node_rank(spec: DeviceSpec, node_rank: usize, gpus: usize) -> DeviceSpec {
    match spec {
        DeviceSpec::Cuda(n) if gpus > 0 => {
            let index = (n as usize + node_rank) % gpus;
            DeviceSpec::Cuda(u32::try_from(index).unwrap_or(n))
        }
        other => other,
    }
}

/// The GPUs the CUDA driver sees, or 0 (a build without CUDA, no driver, a driver that sees
/// none).
pub fn gpu_count() -> usize {
    #[cfg(feature = "cuda")]
    return fanout_cuda::cuda_device_count().unwrap_or(0);
    #[cfg(not(feature = "cuda"))]
    0
}

#[cfg(feature = "cuda")]
fn cuda_backend(device: fanout_cuda::Device) -> std::result::Result<Compute, String> {
    let fanout_cuda::Device::Cuda(gpu) = &device else {
        return Err("not a CUDA device".into());
    };
    fanout_cuda::CudaBackend::new(gpu)
        .map(Compute::Cuda)
        .map_err(|e| format!("opened {}, but {e}", device.info()))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(device: fanout_cuda::Device) -> std::result::Result<Compute, String> {
    // `open` refuses CUDA specs in a build without the feature; this is only reached if that
    // ever changes.
    Err(format!(
        "opened {}, but this build has no CUDA compute path; rebuild with `{}`",
        device.info(),
        fanout_cuda::REBUILD_HINT
    ))
}

/// The sampler this run draws its batches with on the device (see [`SamplingPlacement`]):
/// `Ok(Some((sampler, note)))` to use instead of the host's, `Ok(None)` to sample on the host,
/// `Err` when `device` or `uva` is asked for where it cannot be (no GPU backend, the
/// layer-wise sampler, a device whose free memory cannot be read, what it would copy there
/// taking more than [`TOPOLOGY_SHARE`] of the device's free memory).
pub(crate) fn device_sampler<B: Backend>(
    be: &B,
    cfg: &TrainConfig,
    ds: &Arc<Dataset>,
    fanouts: &[u32],
    tables: Option<&Arc<AliasTables>>,
) -> Result<Option<(Arc<dyn Sampler>, String)>> {
    check_sampling_placement(be, cfg)?;
    let asked = cfg.sampling_placement;
    let kind = cfg.sampler_kind();
    if asked == SamplingPlacement::Host || !samples_on_gpu(kind) {
        return Ok(None);
    }
    let Some(gpu) = cuda_of(be) else {
        return Ok(None);
    };
    let (fanouts, spec) = (fanouts.to_vec(), &cfg.sampler);
    let (replace, remap) = (spec.replace, spec.remap);
    let draws = match kind {
        // Weighted draws need the host sampler's alias tables (`SamplerSpec::build_with`
        // hands them over).
        SamplerKind::Weighted => match tables {
            None => {
                return Err(ExecError::Invalid(
                    "weighted sampling on the GPU was not given the alias tables (a bug in \
                     fanout; --sampling-placement host samples on the CPU)"
                        .into(),
                ))
            }
            Some(t) => GpuDraws::Weighted(
                WeightedConfig {
                    fanouts,
                    replace,
                    remap,
                },
                t.clone(),
            ),
        },
        SamplerKind::Randomwalk => GpuDraws::Walks(RandomWalkConfig {
            top_k: fanouts,
            walks: spec.walks,
            length: spec.walk_length,
            stop_prob: spec.stop_prob,
            remap,
        }),
        _ => GpuDraws::Uniform(KHopConfig {
            fanouts,
            replace,
            remap,
        }),
    };
    let n = ds.num_nodes();
    // Always on the device: the offsets (8 bytes a vertex) and the remap words and vertex list
    // (8 more); the arcs (4 bytes each, and 12 more for the weights and alias tables) where
    // the placement says.
    let per_arc = if matches!(draws, GpuDraws::Weighted(..)) {
        16
    } else {
        4
    };
    let (fixed, arcs) = ((n + 1) * 8 + n * 8, ds.meta.num_edge * per_arc);
    // A bound on the rows of a k-hop's FANOUT_ALL draws (a pass over the offsets, made only
    // for those).
    let all_arcs = match &draws {
        GpuDraws::Uniform(KHopConfig { fanouts, .. })
        | GpuDraws::Weighted(WeightedConfig { fanouts, .. }, _) => fanouts.contains(&FANOUT_ALL),
        GpuDraws::Walks(_) => false,
    };
    let max_degree = if all_arcs {
        ds.topology.max_row_length()
    } else {
        u64::MAX
    };
    // The batches whose blocks are on the device at once: sampled and waiting, prepared and
    // waiting, and the one training.
    let (sampled, prepared) = PipelineConfig {
        prefetch: cfg.prefetch.max(1),
        reorder_window: cfg.reorder_window(),
        ..PipelineConfig::default()
    }
    .batches_in_flight();
    let batches = sampled + prepared + 1;
    let batch = sampling_room(
        &draws,
        Graph {
            nodes: n,
            edges: ds.meta.num_edge,
            max_degree,
        },
        cfg.batch_size.unwrap_or(1) as u64,
    )
    .total(batches as u64);
    let mb = |b: u64| b as f64 / 1e6;
    let memory = TopologyMemory {
        fixed,
        arcs,
        batch,
        batches,
        free: be.free_memory(),
        host_available: fanout_graph::available_memory(),
        auto_uva: !matches!(draws, GpuDraws::Weighted(..)),
    };
    let Some(on_device) = topology_on_device(asked, memory, be.name())? else {
        return Ok(None);
    };
    let what = match draws {
        GpuDraws::Uniform(_) => "k-hop",
        GpuDraws::Weighted(..) => "weighted k-hop",
        GpuDraws::Walks(_) => "PinSAGE random walks",
    };
    let sampler = new_gpu_sampler(gpu, ds, draws, on_device)?;
    let note = if on_device {
        format!(
            "sampling on the GPU ({what} with Fused-Map remapping; topology {:.0} MB on the device)",
            mb(fixed + arcs)
        )
    } else {
        format!(
            "sampling on the GPU ({what} with Fused-Map remapping; {:.0} MB on the device, the \
             arcs' {:.0} MB read from pinned host memory)",
            mb(fixed),
            mb(arcs)
        )
    };
    Ok(Some((sampler, note)))
}

/// The most of a device's free memory that `--sampling-placement device` (the topology) or
/// `uva` (offsets and remap table) may take; `auto` takes at most a quarter.
pub(crate) const TOPOLOGY_SHARE: f64 = 0.75;

/// What [`sampling_room`] bounds a batch's draws by.
#[derive(Clone, Copy, Debug)]
struct Graph {
    nodes: u64,
    edges: u64,
    /// The longest row's arcs (only read for `FANOUT_ALL` k-hops).
    max_degree: u64,
}

/// What [`sampling_room`] bounds: per batch on the device, and for the one being sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Room {
    /// Kept by each batch until its step.
    kept: u64,
    /// Taken while a batch is sampled.
    transient: u64,
}

impl Room {
    /// The bound with `batches` on the device at once.
    fn total(self, batches: u64) -> u64 {
        self.kept
            .saturating_mul(batches)
            .saturating_add(self.transient)
    }
}

/// A bound on the device memory that GPU sampling takes beyond the topology, for batches of
/// `batch` seeds ([`Room::total`]: with several on the device at once). Each keeps its
/// blocks (offsets, source ids, and weights where the draws give them), its seeds and its
/// input vertices until its step; the batch being sampled also needs its largest hop's
/// transient room: the draw's (counts and their scan, a weighted hop's picks before they are
/// placed, a walk hop's visits: two words per step of every walk) or the remap's that follows
/// it (a flag and a position per drawn edge, and their scan's tile sums), whichever is larger.
/// Each hop's frontier is bounded by the previous frontier plus its edges, and by the graph's
/// vertices; a k-hop's edges by `k` per vertex, and where each arc is drawn at most once by
/// the longest row per vertex and by the graph's arcs; a walk hop's by its top-k (or every
/// step of its walks) per vertex, not by arcs: walks reach past a vertex's own arcs. All sums
/// saturate.
fn sampling_room(draws: &GpuDraws, g: Graph, batch: u64) -> Room {
    let (ks, replace, weighted): (&[u32], bool, bool) = match draws {
        GpuDraws::Uniform(c) => (&c.fanouts, c.replace, false),
        GpuDraws::Weighted(c, _) => (&c.fanouts, c.replace, true),
        GpuDraws::Walks(c) => (&c.top_k, false, true),
    };
    let per_edge = if weighted { 8 } else { 4 };
    // A batch's seeds, then its hops.
    let (mut frontier, mut kept, mut transient) =
        (batch.min(g.nodes), batch.saturating_mul(4), 0u64);
    for &k in ks {
        let n = frontier;
        let m = match draws {
            GpuDraws::Walks(c) => {
                n.saturating_mul((c.walks as u64 * c.length as u64).min(k as u64))
            }
            _ if k == FANOUT_ALL => n.saturating_mul(g.max_degree).min(g.edges),
            _ if replace => n.saturating_mul(k as u64),
            _ => n.saturating_mul((k as u64).min(g.max_degree)).min(g.edges),
        };
        // Counts, their offsets' scan (tile sums at most a word per element) and what each
        // kind of draw adds.
        let draw = match draws {
            GpuDraws::Uniform(_) => n.saturating_mul(8).saturating_add(8),
            // Also the room's offsets and the picks, one word per edge of the bound.
            GpuDraws::Weighted(..) => n
                .saturating_mul(16)
                .saturating_add(16)
                .saturating_add(m.saturating_mul(4)),
            GpuDraws::Walks(c) => n
                .saturating_mul(8 * c.walks as u64)
                .saturating_mul(c.length as u64)
                .saturating_add(n.saturating_mul(8))
                .saturating_add(8),
        };
        // The remap: a flag, a position and (at most) a tile sum per drawn edge.
        let remap = m.saturating_mul(12).saturating_add(8);
        transient = transient.max(draw).max(remap);
        kept = kept
            .saturating_add(n.saturating_add(1).saturating_mul(4))
            .saturating_add(m.saturating_mul(per_edge));
        frontier = n.saturating_add(m).min(g.nodes);
    }
    // The input vertices.
    kept = kept.saturating_add(frontier.saturating_mul(4));
    Room { kept, transient }
}

/// Bytes a GPU sampler needs, and what the machine has for them.
#[derive(Clone, Copy, Debug)]
struct TopologyMemory {
    /// Always on the device: offsets, remap words and vertex list.
    fixed: u64,
    /// The arcs, on the device or in pinned host memory.
    arcs: u64,
    /// A bound on what sampling takes on the device ([`sampling_room`]).
    batch: u64,
    /// The batches that bound counts (on the device at once).
    batches: usize,
    /// The device's free memory, `None` when it could not be read.
    free: Option<u64>,
    /// The host's available memory.
    host_available: u64,
    /// Whether `auto` may read the arcs over the bus. On an H200 with 16 cores, sampling so
    /// was 4.0-6.1x as fast as the host's sampler for uniform draws and 6.7-8.4x for random
    /// walks, but 0.9-1.0x for weighted draws (each waits for its alias entry to come back
    /// across the bus), so `auto` leaves weighted sampling whose topology does not fit on the
    /// device to the host (docs/cuda.md).
    auto_uva: bool,
}

/// Where [`device_sampler`] keeps the topology for placement `asked`: `Some(true)` all on the
/// device, `Some(false)` the arcs in pinned host memory, `None` sampling on the host; `Err`
/// when `device` or `uva` is asked for and the device's free memory is unknown or what they
/// copy there, with sampling's room ([`sampling_room`]), would take more than
/// [`TOPOLOGY_SHARE`] of it. `auto` takes the device when everything fits in a quarter of its
/// free memory, else pinned arcs (where `TopologyMemory::auto_uva` allows) when the rest fits
/// in a quarter of it and the arcs in a quarter of the host's available memory, else the
/// host.
fn topology_on_device(
    asked: SamplingPlacement,
    m: TopologyMemory,
    device: &str,
) -> Result<Option<bool>> {
    let mb = |b: u64| b as f64 / 1e6;
    let bad = |m: String| Err(ExecError::Invalid(m));
    let Some(free) = m.free else {
        // A GPU that cannot say how much memory it has left: auto samples on the host.
        if matches!(asked, SamplingPlacement::Auto | SamplingPlacement::Host) {
            return Ok(None);
        }
        return bad(format!(
            "--sampling-placement {}: {device} could not report its free memory; use \
             --sampling-placement host",
            asked.name()
        ));
    };
    // What an explicit placement may take: the rest is left to the step's tensors and the
    // features or their cache.
    let room = (free as f64 * TOPOLOGY_SHARE) as u64;
    // Sampling's room is on the device wherever the arcs are.
    let (fixed, arcs, batch) = (m.fixed, m.arcs, m.batch);
    let on_device = fixed.saturating_add(batch);
    let all = on_device.saturating_add(arcs);
    // What a refusal says about sampling's part, and what shrinks it where it weighs.
    let sampling = |what: &str, total: u64| {
        let part = format!(
            "{what} take {:.0} MB and sampling up to {:.0} MB more ({} batches in flight), \
             {:.0} MB in all on the device",
            mb(total - batch),
            mb(batch),
            m.batches,
            mb(total)
        );
        let smaller = if batch >= total / 10 {
            ", or a smaller --batch-size or fanouts"
        } else {
            ""
        };
        (part, smaller)
    };
    Ok(Some(match asked {
        SamplingPlacement::Host => return Ok(None),
        SamplingPlacement::Auto if all <= free / 4 => true,
        // Arcs that do not fit are read from pinned host memory where that pays
        // (`auto_uva`). Pinned memory cannot be paged out, so auto takes at most a quarter of
        // what the host has available.
        SamplingPlacement::Auto
            if m.auto_uva && on_device <= free / 4 && arcs <= m.host_available / 4 =>
        {
            false
        }
        SamplingPlacement::Auto => return Ok(None),
        SamplingPlacement::Device if all > room => {
            let (part, smaller) = sampling("the topology's arrays", all);
            return bad(format!(
                "--sampling-placement device: {part}, but {device} has {:.0} MB free (they may \
                 take {:.0}%, leaving the rest for training); use --sampling-placement uva \
                 (the arcs read from pinned host memory) or host{smaller}",
                mb(free),
                TOPOLOGY_SHARE * 100.0
            ));
        }
        SamplingPlacement::Device => true,
        SamplingPlacement::Uva if on_device > room => {
            let (part, smaller) = sampling("the offsets and remap table", on_device);
            return bad(format!(
                "--sampling-placement uva: {part}, but {device} has {:.0} MB free (they may \
                 take {:.0}%, leaving the rest for training); use --sampling-placement \
                 host{smaller}",
                mb(free),
                TOPOLOGY_SHARE * 100.0
            ));
        }
        SamplingPlacement::Uva => false,
    }))
}

/// Whether the GPU has a sampler of this kind: k-hop (uniform or weighted) or random walks.
fn samples_on_gpu(kind: SamplerKind) -> bool {
    matches!(
        kind,
        SamplerKind::Khop | SamplerKind::Weighted | SamplerKind::Randomwalk
    )
}

/// What a GPU sampler draws. (A build without CUDA never builds one, so never reads them.)
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
enum GpuDraws {
    Uniform(KHopConfig),
    Weighted(WeightedConfig, Arc<AliasTables>),
    Walks(RandomWalkConfig),
}

/// Refuses `--sampling-placement device` or `uva` where it cannot be: a backend other than
/// the CUDA one, or a sampler the GPU does not have (layer-wise).
pub(crate) fn check_sampling_placement<B: Backend>(be: &B, cfg: &TrainConfig) -> Result<()> {
    let p = cfg.sampling_placement;
    if !matches!(p, SamplingPlacement::Device | SamplingPlacement::Uva) {
        return Ok(());
    }
    if cuda_of(be).is_none() {
        return Err(ExecError::Invalid(format!(
            "--sampling-placement {} needs a GPU (--device cuda); this run computes on {}",
            p.name(),
            be.name()
        )));
    }
    let kind = cfg.sampler_kind();
    if !samples_on_gpu(kind) {
        return Err(ExecError::Invalid(format!(
            "--sampling-placement {} samples k-hop, weighted and random walks only; the {} \
             sampler runs on the host (--sampling-placement host)",
            p.name(),
            kind.name()
        )));
    }
    Ok(())
}

#[cfg(feature = "cuda")]
type Gpu = fanout_cuda::CudaBackend;
#[cfg(not(feature = "cuda"))]
type Gpu = ();

/// `be` as the CUDA backend, if it is one.
fn cuda_of<B: Backend>(be: &B) -> Option<&Gpu> {
    if cfg!(feature = "cuda") {
        (be as &dyn std::any::Any).downcast_ref::<Gpu>()
    } else {
        None
    }
}

/// The GPU sampler of `draws`, with the arcs on the device or (`on_device` false) in pinned
/// host memory.
#[cfg(feature = "cuda")]
fn new_gpu_sampler(
    gpu: &Gpu,
    ds: &Arc<Dataset>,
    draws: GpuDraws,
    on_device: bool,
) -> Result<Arc<dyn Sampler>> {
    use fanout_cuda::{ArcsAt, CudaSampler};
    let at = if on_device {
        ArcsAt::Device
    } else {
        ArcsAt::PinnedHost
    };
    let ds = ds.clone();
    Ok(Arc::new(match draws {
        GpuDraws::Uniform(cfg) => CudaSampler::with_arcs(gpu, ds, cfg, at)?,
        GpuDraws::Weighted(cfg, t) => CudaSampler::weighted(gpu, ds, cfg, t, at)?,
        GpuDraws::Walks(cfg) => CudaSampler::random_walk(gpu, ds, cfg, at)?,
    }))
}

#[cfg(not(feature = "cuda"))]
fn new_gpu_sampler(_: &Gpu, _: &Arc<Dataset>, _: GpuDraws, _: bool) -> Result<Arc<dyn Sampler>> {
    unreachable!("cuda_of finds no GPU backend in a build without CUDA")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cuda` gives a machine's ranks its GPUs in turn, `cuda:N` starts at GPU N, ranks share
    /// GPUs only when they outnumber them; the CPU and an unseen GPU count change nothing.
    #[test]
    fn each_rank_of_a_machine_takes_the_next_gpu() {
        let on = |n: u32, ranks: usize, gpus: usize| -> Vec<DeviceSpec> {
            (0..ranks)
                .map(|r| device_for_node_rank(DeviceSpec::Cuda(n), r, gpus))
                .collect()
        };
        use DeviceSpec::Cuda;
        assert_eq!(on(0, 4, 4), [Cuda(0), Cuda(1), Cuda(2), Cuda(3)]);
        assert_eq!(on(0, 3, 2), [Cuda(0), Cuda(1), Cuda(0)]);
        assert_eq!(on(2, 3, 4), [Cuda(2), Cuda(3), Cuda(0)]);
        assert_eq!(on(0, 2, 1), [Cuda(0), Cuda(0)]);
        assert_eq!(on(5, 2, 0), [Cuda(5), Cuda(5)]);
        assert_eq!(device_for_node_rank(DeviceSpec::Cpu, 3, 8), DeviceSpec::Cpu);
    }

    /// Auto, device and uva against the device's free memory: the quarter auto takes, the
    /// share an explicit placement may take, an unknown free memory.
    #[test]
    fn the_topology_goes_where_the_memory_allows() {
        use SamplingPlacement::{Auto, Device, Host, Uva};
        let gb = 1u64 << 30;
        let m = |fixed: u64, arcs: u64, free: Option<u64>| TopologyMemory {
            fixed,
            arcs,
            batch: 0,
            batches: 4,
            free,
            host_available: 256 * gb,
            auto_uva: true,
        };
        let at = |asked, mem| topology_on_device(asked, mem, "cuda").map_err(|e| e.to_string());
        // 100 GB free: 10 GB all fits in auto's quarter.
        assert_eq!(at(Auto, m(2 * gb, 8 * gb, Some(100 * gb))), Ok(Some(true)));
        // 50 GB on a 100 GB device: auto pins the arcs; device takes it (under 75%).
        assert_eq!(
            at(Auto, m(2 * gb, 48 * gb, Some(100 * gb))),
            Ok(Some(false))
        );
        assert_eq!(
            at(Device, m(2 * gb, 48 * gb, Some(100 * gb))),
            Ok(Some(true))
        );
        // Weighted sampling (no uva for auto): auto samples on the host, uva is still taken
        // when asked for, and what fits goes to the device.
        let weighted = |fixed, arcs| TopologyMemory {
            auto_uva: false,
            ..m(fixed, arcs, Some(100 * gb))
        };
        assert_eq!(at(Auto, weighted(2 * gb, 48 * gb)), Ok(None));
        assert_eq!(at(Uva, weighted(2 * gb, 48 * gb)), Ok(Some(false)));
        assert_eq!(at(Auto, weighted(2 * gb, 8 * gb)), Ok(Some(true)));
        // Arcs beyond a quarter of the host's memory: auto samples on the host.
        assert_eq!(at(Auto, m(2 * gb, 80 * gb, Some(40 * gb))), Ok(None));
        // 90 of 100 GB: device is refused (it would leave 10% for training), uva is not.
        let e = at(Device, m(2 * gb, 88 * gb, Some(100 * gb))).unwrap_err();
        assert!(e.contains("may take 75%") && e.contains("uva"), "{e}");
        assert_eq!(at(Uva, m(2 * gb, 88 * gb, Some(100 * gb))), Ok(Some(false)));
        let e = at(Uva, m(80 * gb, 8 * gb, Some(100 * gb))).unwrap_err();
        assert!(e.contains("offsets and remap table take"), "{e}");
        // A batch's sampling room counts with the topology: 60 GB of arcs fit in 75% of
        // 100 GB, not with 20 GB of room for a batch beside them (the refusal names it);
        // uva keeps only the offsets and the room on the device.
        let roomy = |batch| TopologyMemory {
            batch,
            ..m(2 * gb, 60 * gb, Some(100 * gb))
        };
        assert_eq!(at(Device, roomy(gb)), Ok(Some(true)));
        let e = at(Device, roomy(20 * gb)).unwrap_err();
        assert!(
            e.contains("sampling up to 21475 MB more (4 batches in flight)")
                && e.contains("MB in all on the device")
                && e.contains("a smaller --batch-size"),
            "{e}"
        );
        // A small part for sampling is named but not blamed.
        let long = TopologyMemory {
            batch: 5 * gb,
            ..m(2 * gb, 70 * gb, Some(100 * gb))
        };
        let e = at(Device, long).unwrap_err();
        assert!(
            e.contains("sampling up to") && !e.contains("--batch-size"),
            "{e}"
        );
        assert_eq!(at(Uva, roomy(20 * gb)), Ok(Some(false)));
        // Auto's quarter: 2 + 8 GB fit in 25 GB, not with 16 GB for a batch.
        let small = |batch| TopologyMemory {
            batch,
            ..m(2 * gb, 8 * gb, Some(100 * gb))
        };
        assert_eq!(at(Auto, small(0)), Ok(Some(true)));
        assert_eq!(at(Auto, small(16 * gb)), Ok(Some(false)));
        assert_eq!(at(Auto, small(24 * gb)), Ok(None));
        // Free memory unknown: auto and host sample on the host; device and uva say why.
        assert_eq!(at(Auto, m(gb, gb, None)), Ok(None));
        assert_eq!(at(Host, m(gb, gb, Some(100 * gb))), Ok(None));
        for asked in [Device, Uva] {
            let e = at(asked, m(gb, gb, None)).unwrap_err();
            assert!(e.contains("could not report its free memory"), "{e}");
            assert!(!e.contains("0 MB"), "{e}");
        }
    }

    /// The batch bound, hop by hop, for the three kinds of draws, worked out by hand.
    #[test]
    fn a_batch_s_sampling_room_is_bounded_hop_by_hop() {
        use fanout_sample::RemapKind;
        let remap = RemapKind::default();
        let big = Graph {
            nodes: 1 << 30,
            edges: 1 << 30,
            max_degree: u64::MAX,
        };
        let uniform = |fanouts: Vec<u32>, replace| {
            GpuDraws::Uniform(KHopConfig {
                fanouts,
                replace,
                remap,
            })
        };
        // 100 seeds, 10 then 5 each: 1,000 then 5,500 edges from frontiers of 100 and 1,100,
        // 6,600 input vertices. Kept: the seeds, the offsets, the ids, the inputs; transient:
        // the second hop's remap (a flag, a position and a tile sum per edge).
        let room = sampling_room(&uniform(vec![10, 5], false), big, 100);
        let kept = 4 * 100 + 4 * (101 + 1_101) + 4 * (1_000 + 5_500) + 4 * 6_600;
        assert_eq!(
            room,
            Room {
                kept,
                transient: 12 * 5_500 + 8
            }
        );
        assert_eq!(room.total(3), 3 * kept + 12 * 5_500 + 8);
        // Without repeats a hop yields at most every arc, and at most the longest row per
        // vertex; with them, k per vertex.
        let few = Graph { edges: 300, ..big };
        let capped = Room {
            kept: 4 * 100 + 4 * 101 + 4 * 300 + 4 * 400,
            transient: 12 * 300 + 8,
        };
        assert_eq!(sampling_room(&uniform(vec![10], false), few, 100), capped);
        let short = Graph {
            max_degree: 3,
            ..big
        };
        assert_eq!(sampling_room(&uniform(vec![10], false), short, 100), capped);
        let repeats = sampling_room(&uniform(vec![10], true), few, 100);
        assert_eq!(repeats.kept, 4 * 100 + 4 * 101 + 4 * 1_000 + 4 * 1_100);
        // Every arc: rows of at most 20 arcs, 400 arcs in all, 50 vertices.
        let small = Graph {
            nodes: 50,
            edges: 400,
            max_degree: 20,
        };
        let all = sampling_room(&uniform(vec![FANOUT_ALL, FANOUT_ALL], false), small, 10);
        assert_eq!(
            all,
            Room {
                kept: 4 * 10 + 4 * (11 + 51) + 4 * (200 + 400) + 4 * 50,
                transient: 12 * 400 + 8,
            }
        );
        // Walks: 4 walks of 3 steps, top 2, from 100 seeds: 200 weighted edges, though the
        // graph has only 50 arcs (walks go past a vertex's own arcs); the visits, 8 bytes a
        // step of every walk, outweigh the remap. Top-k "all": every step's vertex.
        let walks = |k| {
            GpuDraws::Walks(RandomWalkConfig {
                top_k: vec![k],
                walks: 4,
                length: 3,
                stop_prob: 0.5,
                remap,
            })
        };
        let tiny = Graph { edges: 50, ..big };
        assert_eq!(
            sampling_room(&walks(2), tiny, 100),
            Room {
                kept: 4 * 100 + 4 * 101 + 8 * 200 + 4 * 300,
                transient: 8 * 12 * 100 + 8 * 100 + 8,
            }
        );
        assert_eq!(
            sampling_room(&walks(FANOUT_ALL), tiny, 100).kept,
            4 * 100 + 4 * 101 + 8 * 1_200 + 4 * 1_300
        );
        // Weighted: the picks' room (a word per edge of the bound) with the counts, the
        // room's offsets and their scans; every arc of rows of at most 30 for FANOUT_ALL.
        let empty = || fanout_graph::Array::from_vec(Vec::new());
        let tables = Arc::new(AliasTables {
            weights: empty(),
            prob: empty(),
            idx: fanout_graph::Array::from_vec(Vec::new()),
            origin: String::new(),
        });
        let weighted = |k| {
            GpuDraws::Weighted(
                WeightedConfig {
                    fanouts: vec![k],
                    replace: false,
                    remap,
                },
                tables.clone(),
            )
        };
        assert_eq!(
            sampling_room(&weighted(10), big, 100),
            Room {
                kept: 4 * 100 + 4 * 101 + 8 * 1_000 + 4 * 1_100,
                transient: 12 * 1_000 + 8,
            }
        );
        let rows30 = Graph {
            edges: 5_000,
            max_degree: 30,
            ..big
        };
        let w = sampling_room(&weighted(FANOUT_ALL), rows30, 100);
        assert_eq!(w.kept, 4 * 100 + 4 * 101 + 8 * 3_000 + 4 * 3_100);
        assert_eq!(w.transient, 12 * 3_000 + 8);
    }

    /// The bound against real batches: the GPU samplers draw the CPU samplers' batches
    /// (`fanout-cuda`'s sampler tests), so what a batch keeps on the device is what these
    /// blocks hold; every one of them must be within the bound, and every hop's remap within
    /// its transient room.
    #[test]
    fn sampled_batches_stay_within_the_bound() {
        use fanout_sample::{BatchKey, KHopSampler, RandomWalkSampler, RemapKind};
        use fanout_synth::{generate, GenOptions, Preset};
        let (ds, _) = generate(
            &Preset::Products.config(Some(3_000)),
            &GenOptions::default(),
            None,
            &fanout_graph::NoProgress,
        )
        .unwrap();
        let ds = Arc::new(ds);
        let n = ds.num_nodes();
        let g = Graph {
            nodes: n,
            edges: ds.meta.num_edge,
            max_degree: ds.topology.max_row_length(),
        };
        let remap = RemapKind::default();
        let khop = |fanouts: Vec<u32>, replace| KHopConfig {
            fanouts,
            replace,
            remap,
        };
        let mut cases: Vec<(GpuDraws, Box<dyn Sampler>)> = vec![
            (
                GpuDraws::Uniform(khop(vec![10, 5], false)),
                Box::new(KHopSampler::new(ds.clone(), khop(vec![10, 5], false)).unwrap()),
            ),
            (
                GpuDraws::Uniform(khop(vec![25, 10], true)),
                Box::new(KHopSampler::new(ds.clone(), khop(vec![25, 10], true)).unwrap()),
            ),
            (
                GpuDraws::Uniform(khop(vec![FANOUT_ALL, 3], false)),
                Box::new(KHopSampler::new(ds.clone(), khop(vec![FANOUT_ALL, 3], false)).unwrap()),
            ),
        ];
        let walk = |top_k: Vec<u32>| RandomWalkConfig {
            top_k,
            walks: 6,
            length: 4,
            stop_prob: 0.2,
            remap,
        };
        for k in [vec![5, 5], vec![FANOUT_ALL]] {
            cases.push((
                GpuDraws::Walks(walk(k.clone())),
                Box::new(RandomWalkSampler::new(ds.clone(), walk(k)).unwrap()),
            ));
        }
        for (draws, sampler) in &cases {
            for (batch, step) in [(1usize, 0u64), (64, 1), (512, 2), (3_000, 3)] {
                // Distinct seeds spread over the graph (7 is prime to its 3,000 vertices).
                let seeds: Vec<u32> = (0..batch as u32).map(|i| (i * 7) % n as u32).collect();
                let key = BatchKey {
                    seed: 5,
                    epoch: 0,
                    step,
                };
                let b = sampler.sample(&seeds, key).unwrap();
                let room = sampling_room(draws, g, seeds.len() as u64);
                let per_edge = if matches!(draws, GpuDraws::Walks(_)) {
                    8
                } else {
                    4
                };
                let kept: u64 = 4 * seeds.len() as u64
                    + b.blocks
                        .iter()
                        .map(|k| 4 * (k.num_dst as u64 + 1) + per_edge * k.num_edges() as u64)
                        .sum::<u64>()
                    + 4 * b.input_nodes.len() as u64;
                assert!(
                    kept <= room.kept,
                    "batch {batch}: keeps {kept} > {}",
                    room.kept
                );
                for k in &b.blocks {
                    assert!(
                        12 * k.num_edges() as u64 + 8 <= room.transient,
                        "batch {batch}"
                    );
                }
            }
        }
    }

    #[test]
    fn cpu_opens_and_a_gpu_is_never_quietly_the_cpu() {
        let (c, info) = Compute::open(DeviceSpec::Cpu).expect("the CPU always opens");
        assert!(matches!(c, Compute::Cpu));
        assert_eq!(info.device, "cpu");
        match Compute::open(DeviceSpec::Cuda(0)) {
            // A build without CUDA, or a machine without a driver or GPU: an error that says
            // which.
            Err(why) => {
                assert!(
                    why.contains("CUDA") || why.contains("cuda"),
                    "the error names what is missing: {why}"
                );
                if !fanout_cuda::CUDA_BUILT {
                    assert!(why.contains(fanout_cuda::REBUILD_HINT), "{why}");
                }
            }
            Ok((c, info)) => {
                assert!(!matches!(c, Compute::Cpu), "cuda:0 opened the CPU");
                assert_eq!(info.device, "cuda:0");
            }
        }
    }
}
