//! `Features::aggregate_into` (a first-layer aggregate read straight from the store) against
//! the plain path it replaces, gathering the rows and adding them up, for f32 and f16 storage:
//! the same bits, whatever the coefficients, repeated sources or row width.

use fanout_graph::{Dataset, FeatDtype};
use half::f16;

mod common;

const N: u64 = 400;

fn write_dataset(out: &std::path::Path, dim: usize, values: &[f32], dtype: FeatDtype) {
    common::write_dataset(out, N, dim, values, dtype)
}

/// Feature values with every kind of f16 in them: normal, subnormal, zero of both signs,
/// infinities, and large and tiny magnitudes.
fn values(dim: usize) -> Vec<f32> {
    (0..N as usize * dim)
        .map(|i| match i % 97 {
            0 => f32::INFINITY,
            1 => -0.0,
            2 => 3.0e-6,  // subnormal in f16
            3 => -6.0e-8, // the smallest f16 subnormal
            4 => 60000.0,
            _ => ((i as f32) * 0.37).sin() * (1 + i % 5) as f32,
        })
        .collect()
}

/// The plain path: gather every source row, then add each destination's edges in order from
/// zero, `coeff[e] * x` (or `x`), as the compute layer's aggregation does.
fn plain(
    f: &fanout_graph::Features,
    ids: &[u32],
    indptr: &[u32],
    indices: &[u32],
    coeff: Option<&[f32]>,
) -> Vec<f32> {
    let d = f.dim;
    let mut x = Vec::new();
    f.gather_into(ids, &mut x);
    let mut out = vec![0.0f32; (indptr.len() - 1) * d];
    for r in 0..indptr.len() - 1 {
        for e in indptr[r] as usize..indptr[r + 1] as usize {
            let s = indices[e] as usize;
            for c in 0..d {
                let v = x[s * d + c];
                out[r * d + c] += match coeff {
                    Some(w) => w[e] * v,
                    None => v,
                };
            }
        }
    }
    out
}

#[test]
fn the_aggregate_read_from_f32_or_f16_storage_equals_the_gathered_rows_aggregated() {
    // Widths around the 8-float conversion and vector steps, and a wide row.
    for dim in [1, 5, 8, 13, 64, 300] {
        let dir = tempfile::tempdir().unwrap();
        let vals = values(dim);
        let (p32, p16) = (dir.path().join("f32"), dir.path().join("f16"));
        write_dataset(&p32, dim, &vals, FeatDtype::F32);
        // The f16 dataset's values, exactly, stored as f32: the reference for the f16 one.
        let rounded: Vec<f32> = vals.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        let pr = dir.path().join("rounded");
        write_dataset(&pr, dim, &rounded, FeatDtype::F32);
        write_dataset(&p16, dim, &vals, FeatDtype::F16);
        let (d32, d16, dr) = (
            Dataset::open(&p32).unwrap(),
            Dataset::open(&p16).unwrap(),
            Dataset::open(&pr).unwrap(),
        );
        // 40 sources (one vertex twice), 30 destinations of 0 to 6 edges, some edges repeated.
        let ids: Vec<u32> = (0..40u32)
            .map(|i| (i * 37 + 11) % N as u32)
            .chain([11])
            .collect();
        let mut indptr = vec![0u32];
        let mut indices = Vec::new();
        for r in 0..30u32 {
            for k in 0..r % 7 {
                indices.push((r * 13 + k * 29) % ids.len() as u32);
            }
            if r % 5 == 0 && r % 7 > 0 {
                indices.push(*indices.last().unwrap());
            }
            indptr.push(indices.len() as u32);
        }
        let coeff: Vec<f32> = (0..indices.len())
            .map(|e| 1.0 / (1 + e % 6) as f32)
            .collect();
        for c in [None, Some(&coeff[..])] {
            let mut got = Vec::new();
            for ds in [&d32, &d16, &dr] {
                let f = ds.features.as_ref().unwrap();
                f.aggregate_into(&ids, &indptr, &indices, c, &mut got);
                let want = plain(f, &ids, &indptr, &indices, c);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same && got.len() == want.len(),
                    "dim {dim}, {:?}",
                    f.dtype()
                );
            }
            // f16 storage reads the same values as their f32 copy.
            let mut from16 = Vec::new();
            let mut from_rounded = Vec::new();
            d16.features
                .as_ref()
                .unwrap()
                .aggregate_into(&ids, &indptr, &indices, c, &mut from16);
            dr.features.as_ref().unwrap().aggregate_into(
                &ids,
                &indptr,
                &indices,
                c,
                &mut from_rounded,
            );
            assert!(from16
                .iter()
                .zip(&from_rounded)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        // Gathering converts each f16 exactly, as `f16::to_f32` does one value at a time.
        let mut rows = Vec::new();
        let f16s = d16.features.as_ref().unwrap();
        f16s.gather_into(&ids, &mut rows);
        let mut one = vec![0.0f32; dim];
        for (i, &v) in ids.iter().enumerate() {
            f16s.copy_row(v as usize, &mut one);
            for c in 0..dim {
                let want = f16::from_f32(vals[v as usize * dim + c]).to_f32();
                assert_eq!(rows[i * dim + c].to_bits(), want.to_bits(), "dim {dim}");
                assert_eq!(one[c].to_bits(), want.to_bits(), "dim {dim}");
            }
        }
    }
}
