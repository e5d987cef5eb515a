//! GPU sampling (feature `cuda`): [`CudaSampler`], uniform or weighted k-hop sampling and
//! PinSAGE random walks on one GPU with the topology in device memory and FastGL's Fused-Map
//! id remapping fused into the sampling kernel (`sample.cu`).
//!
//! Each uniform hop is four kernels and two prefix sums: count each frontier vertex's edges,
//! prefix-sum them into the block's offsets, draw every vertex's neighbours (one thread per
//! vertex) while lowering each neighbour's remap word to its first edge position, mark the
//! first occurrences, prefix-sum them into new local ids, then assign and look up. A weighted
//! hop (and a random-walk hop) draws into room set aside per vertex, then prefix-sums what
//! each yielded and moves the draws into place (lowering the remap words there): one more
//! kernel, prefix sum and size read back ([`draws`]). The host reads back the duplicate-seed
//! flag, then per hop the sizes and the block, and at the end the input vertices. The arcs
//! (and alias tables) may instead sit in pinned host memory ([`ArcsAt`]).

use crate::backend::kernels::{grid, kernels_for, Kernels};
use crate::cuda::mapped_pinned;
use crate::sort::DeviceSort;
use crate::CudaBackend;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use draws::{Draws, HopEdges, Kind, Readable, Walks};
use fanout_graph::{CsrVisitor, Dataset, Error, Offset, Result, VertexId};
use fanout_sample::graph::check_seeds;
use fanout_sample::{
    AliasTables, BatchKey, Block, HopSample, KHopConfig, KHopSampler, MiniBatch, RandomWalkConfig,
    RandomWalkSampler, Resident, Sampler, WeightedConfig, WeightedSampler,
};
use std::fmt::Display;
use std::sync::{Arc, Mutex};

/// Tag bit of a remap word that holds an edge position (`sample.cu`'s `FIRST`).
const FIRST: usize = 1 << 31;

/// Sampling on a GPU: the [`KHopSampler`] (uniform, [`CudaSampler::with_arcs`]), the
/// [`WeightedSampler`] ([`CudaSampler::weighted`]) or the [`RandomWalkSampler`]
/// ([`CudaSampler::random_walk`]) of `fanout-sample`, run on the device.
///
/// Guarantees: for the same dataset, configuration, seeds and key, [`Sampler::sample`] returns
/// exactly the mini-batch the CPU's sampler returns (the same draws, in the same order, the
/// same local ids in order of first occurrence, the same block weights), and the same errors
/// for seeds out of range or repeated. A device failure is returned as an error naming the
/// CUDA call. Batches are sampled one at a time on the sampler's own stream (concurrent
/// callers wait for each other), so sampling overlaps the training stream's work.
pub struct CudaSampler {
    ds: Arc<Dataset>,
    /// Per hop from the seeds: neighbours per vertex (k-hop) or top-k (random walks).
    fanouts: Vec<u32>,
    draws: Draws,
    device: u32,
    stream: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    indptr: CudaSlice<u64>,
    indices: Readable<u32>,
    work: Mutex<Work>,
}

/// Where a [`CudaSampler`] keeps the graph's arcs (4 bytes each) and, weighted, their
/// weights and alias tables (12 bytes more); the offsets, 8 bytes per vertex, are always on
/// the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArcsAt {
    /// In device memory: the fastest reads.
    Device,
    /// In page-locked host memory that the kernels read over the bus (UVA, zero-copy): for
    /// graphs whose arcs do not fit on the device. Each sampled arc is one read across the bus.
    PinnedHost,
}

impl Drop for CudaSampler {
    /// Waits for the sampler's queued work: a batch stopped by an error may leave a kernel
    /// reading the pinned arcs by address, which cudarc's event tracking does not see.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}

/// The per-batch workspace, reused: one remap word per graph vertex (all EMPTY between
/// batches) and room for every vertex's id in the batch's vertex list.
struct Work {
    map: CudaSlice<u32>,
    nodes: CudaSlice<u32>,
    dup: CudaSlice<u32>,
    /// A batch stopped before it emptied its remap words: refill them all first.
    dirty: bool,
}

/// The blocks of a batch as the sampler left them on its device, in model order: each block's
/// offsets, local source ids and (weighted) edge weights (buffers of at least `num_dst + 1`,
/// `max(edges, 1)` and `max(edges, 1)` elements), for the compute backend on that device to
/// adopt instead of uploading the host copy (`CudaBackend::adopt_blocks`); and the batch's
/// input vertices (global ids, the host batch's `input_nodes`), for gathering their feature
/// rows without uploading the ids (`CudaBackend::gather_input_rows`).
pub(crate) struct DeviceBlocks {
    /// The device ordinal (`N` of `cuda:N`).
    pub(crate) device: u32,
    /// Each block's destinations, sources and edges, in model order.
    pub(crate) dims: Vec<(usize, usize, usize)>,
    pub(crate) blocks: Vec<DeviceBlock>,
    /// The input vertices (at least `num_inputs` elements).
    pub(crate) inputs: CudaSlice<u32>,
    /// How many input vertices the batch has.
    pub(crate) num_inputs: usize,
}

/// One block of [`DeviceBlocks`].
pub(crate) struct DeviceBlock {
    pub(crate) offs: CudaSlice<u32>,
    pub(crate) ids: CudaSlice<u32>,
    pub(crate) weights: Option<CudaSlice<f32>>,
}

/// Collects the topology as the device layout: `u64` offsets and `u32` ids, the ids into
/// `into` when given (a pinned buffer of the arcs' length: no host copy in between), else
/// into a new vector returned with the offsets.
struct Topology<'a> {
    into: Option<&'a mut [u32]>,
}
impl CsrVisitor for Topology<'_> {
    type Output = (Vec<u64>, Vec<u32>);
    fn visit<O: Offset, I: VertexId>(self, indptr: &[O], indices: &[I]) -> Self::Output {
        let offsets = indptr.iter().map(|&o| o.into()).collect();
        match self.into {
            Some(dst) => {
                assert_eq!(dst.len(), indices.len(), "the buffer fits the arcs");
                for (d, &i) in dst.iter_mut().zip(indices) {
                    *d = i.idx() as u32;
                }
                (offsets, Vec::new())
            }
            None => (offsets, indices.iter().map(|&i| i.idx() as u32).collect()),
        }
    }
}

/// A launch of `$name` with configuration `$cfg` and arguments `$arg` (references that live
/// past the launch), as a `Result` that names the kernel.
macro_rules! launch {
    ($s:expr, $name:literal, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let mut b = $s.stream.launch_builder($s.kernels.get($name));
        $( cudarc::driver::PushKernelArg::arg(&mut b, $arg); )*
        // SAFETY: the arguments match the kernel's parameters in sample.cu in number, order and
        // type; every buffer holds the elements the kernel indexes for these sizes (the
        // frontier and edge counts it is given, and one remap word per graph vertex).
        unsafe { b.launch($cfg) }.map(drop).map_err(|e| $s.failed(concat!("launch ", $name), e))
    }};
}

// After the macro, which it uses.
mod draws;

impl CudaSampler {
    /// A sampler over `ds` on `gpu`'s device (on a stream of its own) with the arcs on the
    /// device: [`CudaSampler::with_arcs`] with [`ArcsAt::Device`].
    pub fn new(gpu: &CudaBackend, ds: Arc<Dataset>, cfg: KHopConfig) -> Result<Self> {
        Self::with_arcs(gpu, ds, cfg, ArcsAt::Device)
    }

    /// A sampler over `ds` on `gpu`'s device (on a stream of its own): copies the offsets (8
    /// bytes per vertex) to the device and the arcs (4 bytes each) where `arcs` says, and
    /// compiles the kernels if this process has not yet. Its batches do not depend on where
    /// the arcs are. Errors: the configuration the CPU sampler refuses, a graph with more than
    /// 2^31 vertices, or a device (or pinned host memory) that cannot hold the topology or
    /// fails.
    pub fn with_arcs(
        gpu: &CudaBackend,
        ds: Arc<Dataset>,
        cfg: KHopConfig,
        arcs: ArcsAt,
    ) -> Result<Self> {
        // The CPU sampler's checks (layout, id width, fanouts), so both refuse the same things.
        KHopSampler::new(ds.clone(), cfg.clone())?;
        let replace = cfg.replace;
        Self::build(gpu, ds, cfg.fanouts, arcs, Kind::Uniform { replace })
    }

    /// A weighted sampler over `ds` with its alias `tables` (from
    /// [`AliasTables::load_or_build`]) on `gpu`'s device, the arcs, weights and tables where
    /// `arcs` says: the batches of the CPU's [`WeightedSampler`]. Errors: those of
    /// [`CudaSampler::with_arcs`], and the tables and configuration the CPU sampler refuses.
    pub fn weighted(
        gpu: &CudaBackend,
        ds: Arc<Dataset>,
        cfg: WeightedConfig,
        tables: Arc<AliasTables>,
        arcs: ArcsAt,
    ) -> Result<Self> {
        WeightedSampler::new(ds.clone(), cfg.clone(), tables.clone())?;
        let kind = Kind::Weighted {
            replace: cfg.replace,
            tables: &tables,
        };
        Self::build(gpu, ds, cfg.fanouts, arcs, kind)
    }

    /// A PinSAGE random-walk sampler over `ds` on `gpu`'s device, the arcs where `arcs` says:
    /// the batches of the CPU's [`RandomWalkSampler`] (each vertex's walks, their visit
    /// counts as block weights, the top-k by count). Besides the topology, each hop takes
    /// `walks x length` pairs of 4-byte words per frontier vertex while it runs. Errors: those
    /// of [`CudaSampler::with_arcs`] and the configuration the CPU sampler refuses.
    pub fn random_walk(
        gpu: &CudaBackend,
        ds: Arc<Dataset>,
        cfg: RandomWalkConfig,
        arcs: ArcsAt,
    ) -> Result<Self> {
        RandomWalkSampler::new(ds.clone(), cfg.clone())?;
        let kind = Kind::Walks(Walks {
            walks: cfg.walks,
            length: cfg.length,
            stop_prob: cfg.stop_prob,
        });
        Self::build(gpu, ds, cfg.top_k, arcs, kind)
    }

    /// The sampler of `kind`, after the CPU sampler's checks.
    fn build(
        gpu: &CudaBackend,
        ds: Arc<Dataset>,
        fanouts: Vec<u32>,
        arcs: ArcsAt,
        kind: Kind<'_>,
    ) -> Result<Self> {
        let n = ds.num_nodes() as usize;
        if n >= FIRST {
            return Err(Error::Invalid(format!(
                "GPU sampling takes graphs of fewer than 2^31 vertices; this one has {n}"
            )));
        }
        let ctx = gpu.stream().context();
        let fail = |call: &str, e: &dyn Display| gpu_error(gpu.index(), call, e);
        let kernels = kernels_for(ctx).map_err(|e| fail("kernel compilation", &e))?;
        let stream = ctx.new_stream().map_err(|e| fail("cuStreamCreate", &e))?;
        // Pinned arcs are written straight into their page-locked buffer; device arcs are
        // collected, then uploaded.
        let (p, indices) = match arcs {
            ArcsAt::PinnedHost => {
                let mut p = Vec::new();
                let m = ds.topology.num_arcs() as usize;
                let (buf, addr) = mapped_pinned(ctx, m, |dst| {
                    p = ds.topology.visit(Topology { into: Some(dst) }).0;
                })
                .map_err(|(call, e)| fail(call, &e))?;
                (p, Readable::Pinned { _buf: buf, addr })
            }
            ArcsAt::Device => {
                let (p, i) = ds.topology.visit(Topology { into: None });
                let arcs = if i.is_empty() {
                    stream.alloc_zeros(1)
                } else {
                    stream.clone_htod(&i)
                }
                .map_err(|e| fail("cuMemcpyHtoD (arcs)", &e))?;
                (p, Readable::Device(arcs))
            }
        };
        let draws = Draws::of(kind, ctx, &stream, arcs).map_err(|(call, e)| fail(&call, &e))?;
        if let Some(v) = p.windows(2).position(|w| w[1] - w[0] > u32::MAX as u64) {
            return Err(Error::Invalid(format!(
                "GPU sampling takes rows of fewer than 2^32 arcs; vertex {v} has {}",
                p[v + 1] - p[v]
            )));
        }
        let indptr = stream
            .clone_htod(&p)
            .map_err(|e| fail("cuMemcpyHtoD (offsets)", &e))?;
        drop(p);
        let work = Work {
            map: stream
                .alloc_zeros(n.max(1))
                .map_err(|e| fail("cuMemAlloc", &e))?,
            nodes: stream
                .alloc_zeros(n.max(1))
                .map_err(|e| fail("cuMemAlloc", &e))?,
            dup: stream.alloc_zeros(1).map_err(|e| fail("cuMemAlloc", &e))?,
            dirty: true,
        };
        Ok(CudaSampler {
            ds,
            fanouts,
            draws,
            device: gpu.index(),
            stream,
            kernels,
            indptr,
            indices,
            work: Mutex::new(work),
        })
    }

    fn failed(&self, call: &str, e: impl Display) -> Error {
        gpu_error(self.device, call, &e)
    }

    fn alloc<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(len.max(1))
            .map_err(|e| self.failed("cuMemAlloc", e))
    }

    fn upload(&self, host: &[u32]) -> Result<CudaSlice<u32>> {
        if host.is_empty() {
            return self.alloc(1);
        }
        self.stream
            .clone_htod(host)
            .map_err(|e| self.failed("cuMemcpyHtoD", e))
    }

    /// Elements `from..to` of `dev`, on the host (waits for the stream).
    fn download<T: DeviceRepr>(
        &self,
        dev: &CudaSlice<T>,
        from: usize,
        to: usize,
    ) -> Result<Vec<T>> {
        if from == to {
            return Ok(Vec::new());
        }
        self.stream
            .clone_dtoh(&dev.slice(from..to))
            .map_err(|e| self.failed("cuMemcpyDtoH", e))
    }

    /// `out[i] = input[0] + ... + input[i - 1]` for `i` in `0..=n`, on the device.
    fn exclusive_scan(&self, input: &CudaSlice<u32>, n: usize) -> Result<CudaSlice<u32>> {
        let sort = DeviceSort {
            stream: &self.stream,
            kernels: &self.kernels,
        };
        sort.exclusive_scan(input, n)
            .map_err(|(call, e)| self.failed(call, e))
    }

    fn sample_with(&self, w: &mut Work, seeds: &[u32], key: BatchKey) -> Result<MiniBatch> {
        let n_all = self.ds.num_nodes() as usize;
        let b = seeds.len();
        if b > n_all {
            // More seeds than vertices repeat one; the vertex list has room for n_all only.
            return Err(duplicate_seed(seeds));
        }
        if w.dirty {
            let n64 = n_all as i64;
            launch!(self, "fill_u32", grid(n_all), [&mut w.map, &n64, &u32::MAX])?;
        }
        // Until the batch empties its remap words again at the end.
        w.dirty = true;
        let seeds_d = self.upload(seeds)?;
        self.stream
            .memset_zeros(&mut w.dup)
            .map_err(|e| self.failed("cuMemsetD8", e))?;
        let b64 = b as i64;
        launch!(
            self,
            "remap_seeds",
            grid(b),
            [&seeds_d, &b64, &mut w.map, &mut w.nodes, &mut w.dup]
        )?;
        if self.download(&w.dup, 0, 1)?[0] > 0 {
            return Err(duplicate_seed(seeds));
        }
        let mut total = b;
        let mut blocks = Vec::with_capacity(self.fanouts.len());
        let mut on_device = Vec::with_capacity(self.fanouts.len());
        for hop in 0..self.fanouts.len() {
            let num_dst = total;
            let HopEdges {
                offs,
                mut ids,
                weights,
                m,
            } = self.draw_hop(&w.nodes, num_dst, &key, hop, Some(&mut w.map))?;
            if m >= FIRST || total + m >= FIRST {
                return Err(Error::Invalid(format!(
                    "a mini-batch of more than 2^31 edges or vertices (hop {hop}: {m} edges)"
                )));
            }
            let mut flags = self.alloc::<u32>(m)?;
            let m64 = m as i64;
            launch!(
                self,
                "remap_mark",
                grid(m),
                [&ids, &m64, &w.map, &mut flags]
            )?;
            let pos = self.exclusive_scan(&flags, m)?;
            let new = self.download(&pos, m, m + 1)?[0] as usize;
            let base = total as u32;
            launch!(
                self,
                "remap_assign",
                grid(m),
                [&ids, &m64, &pos, &base, &mut w.map, &mut w.nodes]
            )?;
            launch!(self, "remap_lookup", grid(m), [&mut ids, &m64, &w.map])?;
            total += new;
            blocks.push(Block {
                num_dst,
                num_src: total,
                indptr: self.download(&offs, 0, num_dst + 1)?,
                indices: self.download(&ids, 0, m)?,
                weights: match &weights {
                    Some(wt) => Some(self.download(wt, 0, m)?),
                    None => None,
                },
            });
            on_device.push(DeviceBlock { offs, ids, weights });
        }
        blocks.reverse();
        on_device.reverse();
        // The batch's own copy of its input vertices (the work list is reused by the next
        // batch), queued before the download below waits for the stream.
        let mut inputs = self.alloc::<u32>(total)?;
        if total > 0 {
            self.stream
                .memcpy_dtod(&w.nodes.slice(0..total), &mut inputs)
                .map_err(|e| self.failed("cuMemcpyDtoD (input vertices)", e))?;
        }
        let input_nodes = self.download(&w.nodes, 0, total)?;
        let t64 = total as i64;
        launch!(
            self,
            "remap_reset",
            grid(total),
            [&w.nodes, &t64, &mut w.map]
        )?;
        w.dirty = false;
        let labels = self
            .ds
            .labels
            .as_ref()
            .map(|l| input_nodes[..b].iter().map(|&s| l[s as usize]).collect());
        Ok(MiniBatch {
            resident: Resident(Some(Arc::new(DeviceBlocks {
                device: self.device,
                dims: blocks
                    .iter()
                    .map(|b| (b.num_dst, b.num_src, b.num_edges()))
                    .collect(),
                blocks: on_device,
                inputs,
                num_inputs: total,
            }))),
            key,
            num_seeds: b,
            blocks,
            input_nodes,
            labels,
        })
    }
}

/// The CPU remapper's error for seeds with a repeat (the smallest repeated one).
fn duplicate_seed(seeds: &[u32]) -> Error {
    let mut s = seeds.to_vec();
    s.sort_unstable();
    let dup = s.windows(2).find(|p| p[0] == p[1]).map_or(0, |p| p[0]);
    Error::Invalid(format!(
        "seed vertex {dup} appears more than once in one mini-batch (the seed set lists it twice; \
                 `fanout dataset verify` checks a dataset's split files)"
    ))
}

fn gpu_error(device: u32, call: &str, e: &dyn Display) -> Error {
    Error::Invalid(format!(
        "GPU sampling on cuda:{device}: CUDA {call} failed: {e}"
    ))
}

impl Sampler for CudaSampler {
    fn sample(&self, seeds: &[u32], key: BatchKey) -> Result<MiniBatch> {
        check_seeds(seeds, self.ds.num_nodes())?;
        let mut w = self.work.lock().unwrap_or_else(|p| p.into_inner());
        self.sample_with(&mut w, seeds, key)
    }
    fn num_layers(&self) -> usize {
        self.fanouts.len()
    }
    fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }
    fn name(&self) -> &'static str {
        match self.draws {
            Draws::Uniform { .. } => "khop",
            Draws::Weighted { .. } => "weighted",
            Draws::Walks(_) => "randomwalk",
        }
    }
    fn sample_hop(&self, frontier: &[u32], key: BatchKey, hop: usize) -> Result<HopSample> {
        if matches!(self.draws, Draws::Walks(_)) {
            // The CPU's refusal (the Sampler default), word for word.
            return Err(Error::Invalid(format!(
                "the {} sampler draws a hop for the whole frontier at once, so it cannot be \
                 split across workers; use the khop or weighted sampler",
                self.name()
            )));
        }
        check_seeds(frontier, self.ds.num_nodes())?;
        if hop >= self.fanouts.len() {
            return Err(Error::Invalid(format!(
                "hop {hop} asked of a {}-hop sampler",
                self.fanouts.len()
            )));
        }
        let _w = self.work.lock().unwrap_or_else(|p| p.into_inner());
        let f = self.upload(frontier)?;
        let h = self.draw_hop(&f, frontier.len(), &key, hop, None)?;
        Ok(HopSample {
            indptr: self.download(&h.offs, 0, frontier.len() + 1)?,
            ids: self.download(&h.ids, 0, h.m)?,
            weights: match &h.weights {
                Some(wt) => Some(self.download(wt, 0, h.m)?),
                None => None,
            },
        })
    }
}
