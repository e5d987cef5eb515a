//! Learnable synthetic vertex data: labels, class-centroid features and random splits. Used by
//! the generator presets and by `dataset import --random-features` for topology-only graphs.

use fanout_graph::{files, DatasetWriter, Error, FeatDtype, Progress, Result};
use fanout_rand::Rng;
use half::f16;
use rayon::prelude::*;

/// The most values the class centroids may hold (`classes x dim` f32, 1 GiB): the generator
/// keeps them all in memory, so presets and importers refuse larger requests up front.
pub const MAX_CENTROID_VALUES: u64 = 1 << 28;

/// Stream tags, so the features, centroids, labels and splits of one seed are independent.
const CENTROID_STREAM: u64 = 0xC3;
const FEATURE_STREAM: u64 = 0xFE;
const LABEL_STREAM: u64 = 0x1A;
const SPLIT_STREAM: u64 = 0x5B;
const ROWS_PER_TASK: usize = 4096;

/// `n` labels drawn uniformly from `0..classes`, deterministic per seed.
pub fn uniform_labels(n: u64, classes: u64, seed: u64) -> Vec<i64> {
    assert!(classes > 0, "uniform_labels: classes must be > 0");
    let mut out = vec![0i64; n as usize];
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut r = Rng::keyed(&[seed, LABEL_STREAM, c as u64]);
            for l in chunk {
                *l = r.below(classes) as i64;
            }
        });
    out
}

/// How [`write_class_features`] draws features.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ClassFeatures {
    pub num_classes: u64,
    pub dim: usize,
    pub dtype: FeatDtype,
    /// Scale of the class centroids relative to the unit noise.
    pub signal: f32,
    pub seed: u64,
}

/// Writes `feat.bin`: row `v` = `signal` x centroid(label v) + standard normal noise, where each
/// class centroid is a standard normal vector. Unlabelled rows (-1) are noise only. `signal`
/// sets how separable the classes are from one vertex's features alone; neighbour averaging (what
/// a GNN does) raises separability on homophilous graphs. Deterministic per seed, whatever the
/// thread count.
pub fn write_class_features(
    writer: &mut DatasetWriter,
    labels: &[i64],
    spec: &ClassFeatures,
    progress: &dyn Progress,
) -> Result<()> {
    let ClassFeatures {
        num_classes,
        dim,
        dtype,
        signal,
        seed,
    } = *spec;
    let n = labels.len();
    let mut r = Rng::keyed(&[seed, CENTROID_STREAM]);
    let centroids: Vec<f32> = (0..num_classes as usize * dim)
        .map(|_| r.normal() as f32 * signal)
        .collect();
    progress.phase("features", n as u64, "rows");
    let fill = |row: &mut dyn FnMut(usize, f32), v: usize, rng: &mut Rng| {
        let l = labels[v];
        for j in 0..dim {
            let c = if l >= 0 && (l as u64) < num_classes {
                centroids[l as usize * dim + j]
            } else {
                0.0
            };
            row(j, c + rng.normal() as f32);
        }
    };
    match dtype {
        FeatDtype::F32 => {
            let mut out = writer.array_mut::<f32>(files::FEAT, (n * dim) as u64)?;
            out.par_chunks_mut(ROWS_PER_TASK * dim.max(1))
                .enumerate()
                .for_each(|(c, chunk)| {
                    let mut rng = Rng::keyed(&[seed, FEATURE_STREAM, c as u64]);
                    for (i, row) in chunk.chunks_mut(dim.max(1)).enumerate() {
                        fill(&mut |j, x| row[j] = x, c * ROWS_PER_TASK + i, &mut rng);
                    }
                    progress.advance((chunk.len() / dim.max(1)) as u64);
                });
            out.finish(&writer.dir().join(files::FEAT))?;
        }
        FeatDtype::F16 => {
            let mut out = writer.array_mut::<f16>(files::FEAT, (n * dim) as u64)?;
            out.par_chunks_mut(ROWS_PER_TASK * dim.max(1))
                .enumerate()
                .for_each(|(c, chunk)| {
                    let mut rng = Rng::keyed(&[seed, FEATURE_STREAM, c as u64]);
                    for (i, row) in chunk.chunks_mut(dim.max(1)).enumerate() {
                        fill(
                            &mut |j, x| row[j] = f16::from_f32(x),
                            c * ROWS_PER_TASK + i,
                            &mut rng,
                        );
                    }
                    progress.advance((chunk.len() / dim.max(1)) as u64);
                });
            out.finish(&writer.dir().join(files::FEAT))?;
        }
    }
    progress.finish_phase();
    Ok(())
}

/// Split fractions of the vertex set.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SplitFractions {
    pub train: f64,
    pub valid: f64,
    pub test: f64,
}

impl SplitFractions {
    /// The train / valid / test sizes on `n` vertices: round(fraction x n) each.
    pub fn sizes(&self, n: u64) -> [usize; 3] {
        [self.train, self.valid, self.test].map(|x| (x * n as f64).round() as usize)
    }
}

/// Disjoint train/valid/test vertex sets of sizes round(fraction x n), drawn uniformly without
/// replacement, each sorted ascending. Deterministic per seed.
pub fn split_vertices(n: u64, f: SplitFractions, seed: u64) -> Result<[Vec<u32>; 3]> {
    split_vertices_from(n, None, f, seed)
}

/// Like [`split_vertices`], but drawn from `pool` (distinct ids below `n`) when given: the
/// sizes are still round(fraction x n), so a pool concentrates a split of the usual size in one
/// region of the graph. Errors when the fractions are out of range or the sizes do not fit in
/// the pool (naming both). Deterministic per (pool, seed).
pub fn split_vertices_from(
    n: u64,
    pool: Option<&[u32]>,
    f: SplitFractions,
    seed: u64,
) -> Result<[Vec<u32>; 3]> {
    let fr = [f.train, f.valid, f.test];
    if fr.iter().any(|x| !(0.0..=1.0).contains(x)) || fr.iter().sum::<f64>() > 1.0 + 1e-9 {
        return Err(Error::Invalid(format!(
            "split fractions train {} / valid {} / test {} must each lie in [0, 1] and sum to at most 1",
            f.train, f.valid, f.test
        )));
    }
    if n > u32::MAX as u64 {
        return Err(Error::Invalid(format!(
            "{n} vertices: splits support at most 2^32 - 1"
        )));
    }
    let mut perm: Vec<u32> = match pool {
        Some(p) => p.to_vec(),
        None => (0..n as u32).collect(),
    };
    let sizes = f.sizes(n);
    let wanted = sizes.iter().sum::<usize>();
    if pool.is_some() && wanted > perm.len() {
        return Err(Error::Invalid(format!(
            "split of {wanted} vertices (train {} / valid {} / test {} of {n}) does not fit in \
             the {} labelled vertices",
            sizes[0],
            sizes[1],
            sizes[2],
            perm.len()
        )));
    }
    let total = wanted.min(perm.len());
    let len = perm.len();
    let mut r = Rng::keyed(&[seed, SPLIT_STREAM]);
    // Partial Fisher-Yates: only the first `total` positions are needed.
    for i in 0..total {
        let j = i + r.below((len - i) as u64) as usize;
        perm.swap(i, j);
    }
    let mut out: [Vec<u32>; 3] = Default::default();
    let mut at = 0;
    for (k, &s) in sizes.iter().enumerate() {
        let s = s.min(total - at);
        let mut part = perm[at..at + s].to_vec();
        part.sort_unstable();
        out[k] = part;
        at += s;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_graph::{Meta, NoProgress};

    #[test]
    fn splits_are_disjoint_sized_and_deterministic() {
        let f = SplitFractions {
            train: 0.1,
            valid: 0.05,
            test: 0.2,
        };
        let a = split_vertices(1000, f, 3).unwrap();
        assert_eq!(
            a.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![100, 50, 200]
        );
        let mut all: Vec<u32> = a.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 350);
        assert_eq!(a, split_vertices(1000, f, 3).unwrap());
        // From a pool (500 even ids): the same sizes, every vertex from the pool; a pool smaller
        // than the 350 wanted is an error.
        let pool: Vec<u32> = (0..1000).filter(|v| v % 2 == 0).collect();
        let b = split_vertices_from(1000, Some(&pool), f, 3).unwrap();
        assert_eq!(b.each_ref().map(Vec::len), a.each_ref().map(Vec::len));
        assert!(b.iter().flatten().all(|v| v % 2 == 0));
        let e = split_vertices_from(1000, Some(&pool[..100]), f, 3).unwrap_err();
        assert!(e.to_string().contains("100 labelled vertices"), "{e}");
        assert_ne!(a, split_vertices(1000, f, 4).unwrap());
        let bad = SplitFractions {
            train: 0.9,
            valid: 0.2,
            test: 0.0,
        };
        assert!(split_vertices(10, bad, 0)
            .unwrap_err()
            .to_string()
            .contains("sum to at most 1"));
    }

    #[test]
    fn features_separate_classes_by_centroid() {
        let n = 4000;
        let labels = uniform_labels(n, 4, 9);
        let mut w = DatasetWriter::temporary().unwrap();
        let spec = ClassFeatures {
            num_classes: 4,
            dim: 16,
            dtype: FeatDtype::F32,
            signal: 1.0,
            seed: 9,
        };
        write_class_features(&mut w, &labels, &spec, &NoProgress).unwrap();
        w.write_array::<u32>(files::INDPTR, &vec![0; n as usize + 1])
            .unwrap();
        w.write_array::<u32>(files::INDICES, &[]).unwrap();
        let meta = Meta {
            num_node: n,
            feat_dim: 16,
            num_class: 4,
            ..Meta::default()
        };
        let ds = w.finish(meta, &NoProgress).unwrap();
        let f = ds.features.as_ref().unwrap();
        // Class means estimated from the data; nearest-mean accuracy must be far above chance
        // (0.25) with signal 1.0 in 16 dimensions.
        let mut means = vec![0f64; 4 * 16];
        let mut cnt = [0f64; 4];
        let mut row = vec![0f32; 16];
        for v in 0..n as usize {
            f.copy_row(v, &mut row);
            let l = labels[v] as usize;
            cnt[l] += 1.0;
            for j in 0..16 {
                means[l * 16 + j] += row[j] as f64;
            }
        }
        for l in 0..4 {
            for j in 0..16 {
                means[l * 16 + j] /= cnt[l];
            }
        }
        let mut correct = 0;
        for v in 0..n as usize {
            f.copy_row(v, &mut row);
            let best = (0..4)
                .min_by(|&a, &b| {
                    let d = |c: usize| {
                        (0..16)
                            .map(|j| (row[j] as f64 - means[c * 16 + j]).powi(2))
                            .sum::<f64>()
                    };
                    d(a).partial_cmp(&d(b)).unwrap()
                })
                .unwrap();
            correct += (best == labels[v] as usize) as u32;
        }
        let acc = correct as f64 / n as f64;
        assert!(acc > 0.7, "nearest-centroid accuracy {acc}");
    }
}
