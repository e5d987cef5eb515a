//! The CUDA C kernels of `kernels.cu`: compiled with NVRTC once per process and device, loaded
//! as one module, looked up by name, and launched with a grid-stride configuration.

use crate::Error;
use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The kernel source (CUDA C), compiled at run time: the backend's kernels, the prefix sums and
/// sorts (`crate::sort`), then the sampler's (`crate::sample`), in one program.
pub(crate) const SOURCE: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("../sort.cu"),
    include_str!("../sample/sample.cu")
);

/// Every kernel of [`SOURCE`], loaded up front so that a missing one fails at start-up.
const NAMES: &[&str] = &[
    "add_bias",
    "axpy",
    "scale",
    "sum_slots",
    "mul",
    "relu",
    "relu_backward",
    "leaky_relu",
    "leaky_relu_backward",
    "dropout_seeds",
    "dropout",
    "epilogue",
    "col_sum_chunks",
    "dot_partials",
    "axpy_one_plus",
    "add_partials",
    "l2_norms",
    "div_rows",
    "l2_backward",
    "head_dot",
    "head_scale",
    "head_mean",
    "head_mean_backward",
    "edge_dst",
    "count_sources",
    "edge_coefficients",
    "spmm",
    "spmm_t",
    "spmm_ma",
    "spmm_ma4",
    "spmm_coeff_grad",
    "u_add_v",
    "edge_sum_to_dst",
    "edge_sum_to_src",
    "edge_softmax",
    "edge_softmax_backward",
    "gather_rows",
    "gather_rows_warp",
    "scatter_add_groups",
    "any_non_finite",
    "softmax_xent",
    "argmax_hits",
    "step_figures",
    "step_figures_f32",
    "mark_non_finite",
    "adam",
    "sgd",
    "sgd_momentum",
    // sort.cu
    "scan_tile_sums",
    "scan_tile_offsets",
    "scan_tiles",
    "radix_hist",
    "radix_scatter",
    "gather_u32",
    // sample.cu
    "khop_counts",
    "khop_sample",
    "weighted_pick",
    "weighted_place",
    "walk_pick",
    "walk_place",
    "remap_seeds",
    "remap_mark",
    "remap_assign",
    "remap_lookup",
    "remap_reset",
    "fill_u32",
];

/// The loaded kernels of one device.
#[derive(Debug)]
pub(crate) struct Kernels {
    funcs: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    /// The kernel `name`. Panics on a name that is not in [`NAMES`] (a bug in this crate).
    pub(crate) fn get(&self, name: &'static str) -> &CudaFunction {
        self.funcs
            .get(name)
            .unwrap_or_else(|| panic!("CUDA kernel {name} is not in kernels.cu's list"))
    }
}

/// The kernels for `ctx`'s device, compiled on first use in this process (NVRTC for the
/// device's own architecture, `--fmad=false`) and shared afterwards.
pub(crate) fn kernels_for(ctx: &Arc<CudaContext>) -> Result<Arc<Kernels>, Error> {
    static CACHE: OnceLock<Mutex<HashMap<usize, Arc<Kernels>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(k) = map.get(&ctx.ordinal()) {
        return Ok(k.clone());
    }
    let (major, minor) = ctx.compute_capability().map_err(|e| Error::Driver {
        call: "cuDeviceGetAttribute(compute capability)",
        detail: e.to_string(),
    })?;
    let opts = CompileOptions {
        fmad: Some(false),
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some("fanout_kernels.cu".to_string()),
        ..Default::default()
    };
    let ptx = crate::cuda::guarded_any("nvrtcCompileProgram", || {
        compile_ptx_with_opts(SOURCE, opts).map_err(|e| e.to_string())
    })?;
    let module = crate::cuda::guarded_any("cuModuleLoadData", || {
        ctx.load_module(ptx).map_err(|e| e.to_string())
    })?;
    let mut funcs = HashMap::new();
    for &name in NAMES {
        let f = crate::cuda::guarded_any("cuModuleGetFunction", || {
            module
                .load_function(name)
                .map_err(|e| format!("{name}: {e}"))
        })?;
        funcs.insert(name, f);
    }
    let k = Arc::new(Kernels { funcs });
    map.insert(ctx.ordinal(), k.clone());
    Ok(k)
}

/// Threads per block of every element-wise launch.
pub(crate) const THREADS: u32 = 256;

/// A grid-stride launch over `n` work items: one thread per item up to 65,536 blocks.
pub(crate) fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 1 << 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches kernel `$name` of backend `$be` over `$n` work items (nothing when `$n` is 0) with
/// the arguments `$arg` (each a reference to a value that lives past the launch: a
/// `CudaSlice`, or a scalar bound beforehand). A failed launch returns from the calling
/// function with the driver's error (`backend::device_error`, converted by `Into` to that
/// function's error type).
macro_rules! launch {
    ($be:expr, $name:literal, $n:expr, [$($arg:expr),* $(,)?]) => {{
        let n: usize = $n;
        if n > 0 {
            let func = $be.kernels.get($name);
            let mut b = $be.stream.launch_builder(func);
            $( cudarc::driver::PushKernelArg::arg(&mut b, $arg); )*
            // SAFETY: the arguments match the kernel's parameters in kernels.cu in number,
            // order and type (pointers as device slices or u64 device addresses, i64 / i32 /
            // u32 / f32 scalars); every slice holds at least the elements the kernel indexes
            // for these sizes (checked by the caller's shape asserts).
            let cfg = $crate::backend::kernels::grid(n);
            if let Err(e) = $be.timed($name, || unsafe { b.launch(cfg) }) {
                return Err($crate::backend::device_error(concat!("launch ", $name), e).into());
            }
        }
    }};
}
pub(crate) use launch;

/// Launches kernel `$name` of backend `$be` with the launch configuration `$cfg` (for kernels
/// that set their own block shape or shared memory) and the arguments `$arg`, as [`launch`]
/// does.
macro_rules! launch_with {
    ($be:expr, $name:literal, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let func = $be.kernels.get($name);
        let mut b = $be.stream.launch_builder(func);
        $( cudarc::driver::PushKernelArg::arg(&mut b, $arg); )*
        let cfg: cudarc::driver::LaunchConfig = $cfg;
        // SAFETY: as for `launch`; `$cfg` gives the kernel the block shape and shared memory
        // its comment in kernels.cu asks for.
        if let Err(e) = $be.timed($name, || unsafe { b.launch(cfg) }) {
            return Err($crate::backend::device_error(concat!("launch ", $name), e).into());
        }
    }};
}
pub(crate) use launch_with;
