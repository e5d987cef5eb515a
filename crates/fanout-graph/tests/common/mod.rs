//! Helpers shared by the integration tests of this crate.

use fanout_graph::{
    build_topology, files, BuildOptions, DatasetWriter, FeatDtype, Meta, NoProgress, SliceArcs,
};
use half::f16;

/// Writes to `out` a dataset of `n` vertices, each with one arc to `(7v + 1) mod n`, and
/// `dim`-wide features `values` (`n * dim` of them), stored as `dtype` (rounded for f16).
pub fn write_dataset(out: &std::path::Path, n: u64, dim: usize, values: &[f32], dtype: FeatDtype) {
    let arcs: Vec<(u64, u64)> = (0..n).map(|v| (v, (v * 7 + 1) % n)).collect();
    let mut w = DatasetWriter::create(out, false).unwrap();
    let opts = BuildOptions {
        num_nodes: Some(n),
        ..Default::default()
    };
    let st = build_topology(&mut SliceArcs(&arcs), &opts, &mut w, &NoProgress).unwrap();
    match dtype {
        FeatDtype::F32 => w.write_array(files::FEAT, values).unwrap(),
        FeatDtype::F16 => {
            let h: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
            w.write_array(files::FEAT, &h).unwrap()
        }
    }
    let meta = Meta {
        num_node: n,
        num_edge: st.num_arcs,
        feat_dim: dim as u64,
        feat_dtype: dtype,
        ..Meta::default()
    };
    w.finish(meta, &NoProgress).unwrap();
}
