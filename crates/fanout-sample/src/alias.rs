//! Per-row alias tables over arc weights (Walker / Vose), built once in parallel and stored
//! beside the dataset (GUIDE section 1: `weight.bin` f32 per arc; `alias_prob.bin` f32 and
//! `alias_idx.bin` u32 per arc).
//!
//! For the row of vertex `v` with arcs at offsets `a..b` (`d = b - a`), entry `a + i` holds
//! `prob` and `idx`: a draw picks `i` uniformly in `0..d`, keeps `i` with probability
//! `prob[a + i]`, otherwise takes `idx[a + i]` (a position within the row). Then arc `a + j` is
//! drawn with probability `weight[a + j] / sum(weight[a..b])`. Arcs of weight 0 are never drawn;
//! a row whose weights are all zero is marked by `idx == NO_ARC` and yields no draws.

use crate::graph::{with_csr, Csr, CsrJob};
use fanout_graph::{Array, ArrayMut, Dataset, Error, Offset, Progress, Result, VertexId};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// File names of the weighted-sampling arrays.
pub mod files {
    /// f32 weight per stored arc.
    pub const WEIGHT: &str = "weight.bin";
    /// f32 keep-probability per arc.
    pub const ALIAS_PROB: &str = "alias_prob.bin";
    /// u32 alias position (within the row) per arc.
    pub const ALIAS_IDX: &str = "alias_idx.bin";
    /// The checksum of the `weight.bin` the tables were built from (one line, `xxh3:...`).
    pub const ALIAS_KEY: &str = "alias_key.txt";
}

/// `alias_idx` value marking a row whose weights are all zero (no arc can be drawn).
pub const NO_ARC: u32 = u32::MAX;

/// Alias tables and weights of a dataset, memory-mapped (or in memory when they could not be
/// saved). Guarantees after [`AliasTables::load_or_build`]: all three arrays hold NUM_EDGE
/// entries, every `prob` lies in [0, 1] and every `idx` is a position within its row or
/// [`NO_ARC`] (checked on load).
#[derive(Debug)]
pub struct AliasTables {
    /// Weight of every arc (`weight.bin`).
    pub weights: Array<f32>,
    /// Keep-probability of every arc.
    pub prob: Array<f32>,
    /// Alias position of every arc.
    pub idx: Array<u32>,
    /// How the tables were obtained, for people: "loaded", "built and saved", or why saving
    /// failed ("built in memory: ...").
    pub origin: String,
}

impl AliasTables {
    /// Loads `alias_prob.bin`/`alias_idx.bin` from the dataset directory when both exist, have
    /// NUM_EDGE entries, were built from this very `weight.bin` (its checksum is recorded in
    /// `alias_key.txt` beside them: a file's times survive `mv`, `cp -p` and `rsync -a`, its
    /// contents do not lie) and pass the range check; otherwise
    /// builds them from `weight.bin` (parallel over rows) and saves them atomically (temporary
    /// file + rename; an unwritable directory keeps them in memory). Errors if `weight.bin` is
    /// missing, has the wrong size, or holds a negative, NaN or infinite weight.
    pub fn load_or_build(ds: &Dataset, progress: &dyn Progress) -> Result<AliasTables> {
        let dir = &ds.dir;
        let wpath = dir.join(files::WEIGHT);
        if !wpath.is_file() {
            return Err(Error::Invalid(format!(
                "{}: weighted sampling needs {} (one f32 weight per stored arc) in the dataset directory",
                dir.display(),
                files::WEIGHT
            )));
        }
        let e = ds.num_arcs();
        let weights: Array<f32> = Array::map(&wpath, e, "NUM_EDGE")?;
        let (pp, ip) = (dir.join(files::ALIAS_PROB), dir.join(files::ALIAS_IDX));
        let key = fanout_graph::checksum::file_checksum(&wpath, &fanout_graph::NoProgress)?;
        let fresh =
            std::fs::read_to_string(dir.join(files::ALIAS_KEY)).is_ok_and(|k| k.trim() == key);
        if fresh {
            if let (Ok(prob), Ok(idx)) = (
                Array::<f32>::map(&pp, e, "NUM_EDGE"),
                Array::<u32>::map(&ip, e, "NUM_EDGE"),
            ) {
                if check_tables(ds, &prob, &idx).is_ok() {
                    return Ok(AliasTables {
                        weights,
                        prob,
                        idx,
                        origin: "loaded".into(),
                    });
                }
            }
        }
        check_weights(&weights)?;
        progress.phase("build alias tables", ds.num_nodes(), "rows");
        let saved = build_into_files(ds, &weights, &key, dir, progress);
        progress.finish_phase();
        match saved {
            Ok(()) => Ok(AliasTables {
                weights,
                prob: Array::map(&pp, e, "NUM_EDGE")?,
                idx: Array::map(&ip, e, "NUM_EDGE")?,
                origin: "built and saved".into(),
            }),
            Err(err) => {
                let (prob, idx) = build(ds, &weights, progress);
                Ok(AliasTables {
                    weights,
                    prob: Array::from_vec(prob),
                    idx: Array::from_vec(idx),
                    origin: format!("built in memory (could not save: {err})"),
                })
            }
        }
    }
}

/// Writes `weight.bin` (one f32 per stored arc, in stored order) into `dir` atomically.
pub fn write_weights(dir: &Path, weights: &[f32]) -> Result<()> {
    let tmp = temp_name(dir, files::WEIGHT);
    std::fs::write(&tmp, fanout_graph::array::as_bytes(weights))
        .map_err(|e| Error::io(&tmp, "write", e))?;
    rename(&tmp, &dir.join(files::WEIGHT))
}

fn temp_name(dir: &Path, file: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    dir.join(format!(".{file}.tmp-{}-{nanos}", std::process::id()))
}

fn rename(tmp: &Path, to: &Path) -> Result<()> {
    std::fs::rename(tmp, to).map_err(|e| {
        let _ = std::fs::remove_file(tmp);
        Error::io(to, "rename into place", e)
    })
}

fn check_weights(w: &[f32]) -> Result<()> {
    if let Some(i) = w
        .par_iter()
        .position_first(|x| !(x.is_finite() && *x >= 0.0))
    {
        return Err(Error::Invalid(format!(
            "{}: arc {i} has weight {}; weights must be finite and >= 0",
            files::WEIGHT,
            w[i]
        )));
    }
    Ok(())
}

/// Builds both tables into temporary files beside the dataset, renames them into place, then
/// records `key` (the checksum of the weights) beside them: last, so that tables whose writing
/// was cut short are never taken for current.
fn build_into_files(
    ds: &Dataset,
    w: &[f32],
    key: &str,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<()> {
    let e = ds.num_arcs();
    let (tp, ti) = (
        temp_name(dir, files::ALIAS_PROB),
        temp_name(dir, files::ALIAS_IDX),
    );
    let result = (|| {
        let mut prob = ArrayMut::<f32>::create_file(&tp, e)?;
        let mut idx = ArrayMut::<u32>::create_file(&ti, e)?;
        with_csr(
            &ds.topology,
            Build {
                w,
                prob: &mut prob,
                idx: &mut idx,
                progress,
            },
        );
        prob.finish(&tp)?;
        idx.finish(&ti)?;
        // The old key goes first: tables replaced halfway must not match it.
        match std::fs::remove_file(dir.join(files::ALIAS_KEY)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(dir.join(files::ALIAS_KEY), "remove", e))
            }
            _ => {}
        }
        rename(&ti, &dir.join(files::ALIAS_IDX))?;
        rename(&tp, &dir.join(files::ALIAS_PROB))?;
        let tk = temp_name(dir, files::ALIAS_KEY);
        std::fs::write(&tk, format!("{key}\n")).map_err(|e| Error::io(&tk, "write", e))?;
        rename(&tk, &dir.join(files::ALIAS_KEY))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tp);
        let _ = std::fs::remove_file(&ti);
    }
    result
}

/// Builds both tables in memory.
pub fn build(ds: &Dataset, w: &[f32], progress: &dyn Progress) -> (Vec<f32>, Vec<u32>) {
    let e = ds.num_arcs() as usize;
    let (mut prob, mut idx) = (vec![0f32; e], vec![0u32; e]);
    with_csr(
        &ds.topology,
        Build {
            w,
            prob: &mut prob,
            idx: &mut idx,
            progress,
        },
    );
    (prob, idx)
}

struct Build<'a> {
    w: &'a [f32],
    prob: &'a mut [f32],
    idx: &'a mut [u32],
    progress: &'a dyn Progress,
}

const ROWS: usize = 4096;

impl CsrJob for Build<'_> {
    type Out = ();
    fn run<O: Offset, I: VertexId>(self, g: Csr<'_, O, I>) {
        let n = g.indptr.len().saturating_sub(1);
        let off = |v: usize| Offset::idx(g.indptr[v]);
        // Split the outputs by row chunks so chunks fill in parallel.
        let mut parts = Vec::new();
        let (mut rp, mut ri) = (&mut self.prob[..], &mut self.idx[..]);
        for r0 in (0..n).step_by(ROWS) {
            let r1 = (r0 + ROWS).min(n);
            let len = off(r1) - off(r0);
            let (hp, tp) = rp.split_at_mut(len);
            let (hi, ti) = ri.split_at_mut(len);
            parts.push((r0, r1, hp, hi));
            (rp, ri) = (tp, ti);
        }
        let (w, progress) = (self.w, self.progress);
        parts.into_par_iter().for_each(|(r0, r1, prob, idx)| {
            let base = off(r0);
            let (mut small, mut large, mut p) = (Vec::new(), Vec::new(), Vec::new());
            for v in r0..r1 {
                let (a, b) = (off(v) - base, off(v + 1) - base);
                vose(
                    &w[base + a..base + b],
                    &mut prob[a..b],
                    &mut idx[a..b],
                    (&mut small, &mut large, &mut p),
                );
            }
            progress.advance((r1 - r0) as u64);
        });
    }
}

/// Vose's alias method for one row (`scratch` is reused between rows).
fn vose(
    w: &[f32],
    prob: &mut [f32],
    idx: &mut [u32],
    scratch: (&mut Vec<u32>, &mut Vec<u32>, &mut Vec<f64>),
) {
    let (small, large, p) = scratch;
    let d = w.len();
    let sum: f64 = w.iter().map(|&x| x as f64).sum();
    if sum <= 0.0 {
        prob.fill(0.0);
        idx.fill(NO_ARC);
        return;
    }
    small.clear();
    large.clear();
    p.clear();
    p.extend(w.iter().map(|&x| x as f64 * d as f64 / sum));
    for (i, &x) in p.iter().enumerate() {
        if x < 1.0 {
            small.push(i as u32)
        } else {
            large.push(i as u32)
        }
    }
    while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
        small.pop();
        prob[s as usize] = p[s as usize] as f32;
        idx[s as usize] = l;
        p[l as usize] = (p[l as usize] + p[s as usize]) - 1.0;
        if p[l as usize] < 1.0 {
            large.pop();
            small.push(l);
        }
    }
    // Leftovers have probability 1 up to rounding; a zero-weight leftover must still never be
    // drawn, so it defers to the heaviest arc.
    let heaviest = (0..d).max_by(|&a, &b| w[a].total_cmp(&w[b])).unwrap_or(0) as u32;
    for &i in small.iter().chain(large.iter()) {
        if w[i as usize] > 0.0 {
            prob[i as usize] = 1.0;
            idx[i as usize] = i;
        } else {
            prob[i as usize] = 0.0;
            idx[i as usize] = heaviest;
        }
    }
}

/// Checks loaded tables: probabilities in [0, 1], aliases within their rows, or a row all
/// [`NO_ARC`] (as [`vose`] writes them: samplers look at a row's first alias only).
fn check_tables(ds: &Dataset, prob: &[f32], idx: &[u32]) -> Result<()> {
    struct Check<'a>(&'a [f32], &'a [u32]);
    impl CsrJob for Check<'_> {
        type Out = bool;
        fn run<O: Offset, I: VertexId>(self, g: Csr<'_, O, I>) -> bool {
            let n = g.indptr.len().saturating_sub(1) as u32;
            (0..n).into_par_iter().all(|v| {
                let (a, b) = g.bounds(v);
                let none = a < b && self.1[a] == NO_ARC;
                (a..b).all(|e| {
                    (0.0..=1.0).contains(&self.0[e])
                        && if none {
                            self.1[e] == NO_ARC
                        } else {
                            (self.1[e] as usize) < b - a
                        }
                })
            })
        }
    }
    if with_csr(&ds.topology, Check(prob, idx)) {
        Ok(())
    } else {
        Err(Error::Invalid("alias tables out of range".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use fanout_graph::{Layout, NoProgress};

    /// The exact distribution a row's table encodes.
    fn encoded(prob: &[f32], idx: &[u32]) -> Vec<f64> {
        let d = prob.len();
        let mut out = vec![0.0; d];
        for i in 0..d {
            out[i] += prob[i] as f64 / d as f64;
            if idx[i] != NO_ARC {
                out[idx[i] as usize] += (1.0 - prob[i] as f64) / d as f64;
            }
        }
        out
    }

    #[test]
    fn vose_tables_encode_the_weights_exactly() {
        let mut r = fanout_rand::Rng::new(1);
        for d in [1usize, 2, 5, 37, 300] {
            let mut w: Vec<f32> = (0..d).map(|_| r.next_f32() * 10.0).collect();
            if d > 2 {
                w[1] = 0.0;
                w[d - 1] = 1e-6;
            }
            let (mut prob, mut idx) = (vec![0f32; d], vec![0u32; d]);
            vose(
                &w,
                &mut prob,
                &mut idx,
                (&mut vec![], &mut vec![], &mut vec![]),
            );
            let sum: f64 = w.iter().map(|&x| x as f64).sum();
            for (i, p) in encoded(&prob, &idx).into_iter().enumerate() {
                assert!((p - w[i] as f64 / sum).abs() < 1e-6, "d {d} arc {i}: {p}");
            }
        }
        let (mut prob, mut idx) = (vec![0f32; 3], vec![0u32; 3]);
        vose(
            &[0.0; 3],
            &mut prob,
            &mut idx,
            (&mut vec![], &mut vec![], &mut vec![]),
        );
        assert!(idx.iter().all(|&i| i == NO_ARC));
    }

    #[test]
    fn load_or_build_saves_reloads_and_rebuilds_when_stale() {
        let arcs: Vec<(u64, u64)> = (0..200).map(|i| (i % 17, i % 5)).collect();
        let ds = dataset(&arcs, 20, Layout::Csc);
        let e = ds.num_arcs() as usize;
        let err = AliasTables::load_or_build(&ds, &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs weight.bin"), "{err}");
        let w: Vec<f32> = (0..e).map(|i| (i % 4) as f32).collect();
        write_weights(&ds.dir, &w).unwrap();
        let t = AliasTables::load_or_build(&ds, &NoProgress).unwrap();
        assert_eq!(t.origin, "built and saved");
        assert!(ds.dir.join(files::ALIAS_PROB).is_file() && t.prob.is_mapped());
        let t2 = AliasTables::load_or_build(&ds, &NoProgress).unwrap();
        assert_eq!(t2.origin, "loaded");
        assert_eq!((&t2.prob[..], &t2.idx[..]), (&t.prob[..], &t.idx[..]));
        // A truncated table is rebuilt, not trusted (drop the mappings before damaging the file).
        let want = t.idx.to_vec();
        drop((t, t2));
        std::fs::write(ds.dir.join(files::ALIAS_IDX), [0u8; 8]).unwrap();
        let t3 = AliasTables::load_or_build(&ds, &NoProgress).unwrap();
        assert_eq!(t3.origin, "built and saved");
        assert_eq!(&t3.idx[..], &want[..]);
        // An alias that leaves its row, or a row marked empty after its first arc, is rebuilt:
        // a sampler would index past the row.
        drop(t3);
        let row0 = ds.topology.row(0).len();
        assert!(row0 >= 2, "vertex 0 has a row of several arcs");
        for bad in [NO_ARC, row0 as u32] {
            let mut damaged = want.clone();
            damaged[1] = bad;
            std::fs::write(
                ds.dir.join(files::ALIAS_IDX),
                fanout_graph::array::as_bytes(&damaged),
            )
            .unwrap();
            let t4 = AliasTables::load_or_build(&ds, &NoProgress).unwrap();
            assert_eq!(t4.origin, "built and saved", "alias {bad}");
            assert_eq!(&t4.idx[..], &want[..]);
        }
        // New weights moved in with an old timestamp (as `mv`, `cp -p` or `rsync -a` leave
        // them) are noticed by content: the tables are rebuilt from them.
        let w2: Vec<f32> = (0..e).map(|i| ((i + 1) % 3) as f32).collect();
        let moved = ds.dir.join("w2.bin");
        std::fs::write(&moved, fanout_graph::array::as_bytes(&w2)).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&moved)
            .unwrap()
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
            .unwrap();
        std::fs::rename(&moved, ds.dir.join(files::WEIGHT)).unwrap();
        let t5 = AliasTables::load_or_build(&ds, &NoProgress).unwrap();
        assert_eq!(t5.origin, "built and saved");
        let (p2, i2) = build(&ds, &w2, &NoProgress);
        assert_eq!((&t5.prob[..], &t5.idx[..]), (&p2[..], &i2[..]));
        drop(t5);
        assert_eq!(
            AliasTables::load_or_build(&ds, &NoProgress).unwrap().origin,
            "loaded"
        );
        // No temporary files are left behind.
        let stray = std::fs::read_dir(&ds.dir)
            .unwrap()
            .filter(|f| {
                f.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".tmp-")
            })
            .count();
        assert_eq!(stray, 0);
        // Bad weights are refused with the arc named.
        let mut bad = w.clone();
        bad[3] = -1.0;
        write_weights(&ds.dir, &bad).unwrap();
        std::fs::remove_file(ds.dir.join(files::ALIAS_PROB)).unwrap();
        let err = AliasTables::load_or_build(&ds, &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(err.contains("arc 3 has weight -1"), "{err}");
    }
}
