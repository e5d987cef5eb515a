//! The `ogb` importer: the OGB raw node-property layout as downloaded (`raw/*.csv[.gz]`,
//! `split/<scheme>/*.csv[.gz]`). Every file is streamed; features go straight into `feat.bin`.

use crate::edgelist::{IdLimit, TextArcs};
use crate::npy_dir::MAX_CLASS;
use crate::text::{line_error, par_map_chunks, show, trim, TextFile, BLOCK_BYTES};
use crate::vertex::{
    bad_feature, check_num_nodes, finish_split, refuse_random, write_splits, FeatElem, VertexData,
};
use crate::{ImportOptions, Imported};
use fanout_graph::{
    build_topology, f16, files, DatasetWriter, Error, FeatDtype, Pod, Progress, Result,
};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

const LAYOUT: &str = "the ogb format expects the dataset root as downloaded: raw/edge.csv[.gz], raw/num-node-list.csv[.gz], optional raw/node-feat.csv[.gz] and raw/node-label.csv[.gz], and optional split/<scheme>/{train,valid,test}.csv[.gz]";

/// `dir/name` or `dir/name.gz`, whichever exists (the plain file first).
fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    [name.to_string(), format!("{name}.gz")]
        .into_iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

fn require(dir: &Path, name: &str) -> Result<PathBuf> {
    find(dir, name)
        .ok_or_else(|| Error::format(dir.join(name), format!("missing (nor {name}.gz); {LAYOUT}")))
}

/// The split folder: `scheme` if given, else the only folder under `split/` (none: no splits).
fn split_dir(src: &Path, scheme: Option<&str>) -> Result<Option<PathBuf>> {
    let root = src.join("split");
    let mut schemes: Vec<String> = match std::fs::read_dir(&root) {
        Ok(d) => d
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    schemes.sort();
    let list = || {
        if schemes.is_empty() {
            "there is none".to_string()
        } else {
            format!("found: {}", schemes.join(", "))
        }
    };
    match scheme {
        Some(s) if schemes.iter().any(|x| x == s) => Ok(Some(root.join(s))),
        Some(s) => Err(Error::format(
            root.join(s),
            format!("split scheme {s:?} not found under split/ ({})", list()),
        )),
        None => match schemes.len() {
            0 => Ok(None),
            1 => Ok(Some(root.join(&schemes[0]))),
            _ => Err(Error::format(
                &root,
                format!(
                    "several split schemes ({}); choose one with the split scheme option",
                    schemes.join(", ")
                ),
            )),
        },
    }
}

/// The input files of one OGB dataset root, all opened (so missing ones fail first).
struct OgbFiles {
    edge: TextFile,
    num_nodes: TextFile,
    feat: Option<TextFile>,
    label: Option<TextFile>,
    /// train, valid, test of the chosen split scheme.
    splits: Option<[TextFile; 3]>,
}

/// Finds and opens the files of the dataset root `src`; errors say what is missing.
fn locate(src: &Path, scheme: Option<&str>) -> Result<OgbFiles> {
    if !src.is_dir() {
        return Err(Error::format(src, format!("is not a directory; {LAYOUT}")));
    }
    let raw = src.join("raw");
    if !raw.is_dir() {
        if find(src, "edge.csv").is_some() {
            return Err(Error::format(
                src,
                "looks like the raw/ folder itself; pass the dataset root (the folder holding raw/ and split/)",
            ));
        }
        return Err(Error::format(&raw, format!("missing; {LAYOUT}")));
    }
    if find(&raw, "edge.csv").is_none() && raw.join("relations").is_dir() {
        return Err(Error::format(
            &raw,
            "holds relations/: heterogeneous OGB datasets (such as ogbn-mag) are not supported; the ogb format reads homogeneous node-property datasets",
        ));
    }
    let optional = |name| find(&raw, name).map(|p| TextFile::open(&p)).transpose();
    let splits = match split_dir(src, scheme)? {
        Some(dir) => {
            let open = |n| -> Result<TextFile> {
                let p = find(&dir, n).ok_or_else(|| {
                    Error::format(
                        dir.join(n),
                        format!("missing (nor {n}.gz): a split folder holds train.csv, valid.csv and test.csv"),
                    )
                })?;
                TextFile::open(&p)
            };
            Some([open("train.csv")?, open("valid.csv")?, open("test.csv")?])
        }
        None => None,
    };
    Ok(OgbFiles {
        edge: TextFile::open(&require(&raw, "edge.csv")?)?,
        num_nodes: TextFile::open(&require(&raw, "num-node-list.csv")?)?,
        feat: optional("node-feat.csv")?,
        label: optional("node-label.csv")?,
        splits,
    })
}

/// Imports the OGB dataset root `src`.
pub(crate) fn import(
    src: &Path,
    writer: &mut DatasetWriter,
    opts: &ImportOptions,
    progress: &dyn Progress,
) -> Result<Imported> {
    let OgbFiles {
        edge,
        num_nodes: nnl,
        feat,
        label,
        splits: split_files,
    } = locate(src, opts.split_scheme.as_deref())?;
    if opts.random.is_some() {
        let present = [(&feat, "node features"), (&label, "labels")]
            .into_iter()
            .find_map(|(f, what)| f.as_ref().map(|f| (f.path.clone(), what)))
            .or(split_files.as_ref().map(|s| (s[0].path.clone(), "a split")));
        if let Some((p, what)) = present {
            return Err(refuse_random(&p, what));
        }
    }

    let n = read_num_nodes(&nnl)?;
    let origin = format!("the vertex count in raw/{}", file_name(&nnl.path));
    if let Some(m) = opts.build.num_nodes {
        if m != n {
            return Err(Error::Invalid(format!(
                "--num-nodes {m} disagrees with {origin} ({n})"
            )));
        }
    }
    check_num_nodes(n, &origin)?;
    let input_bytes = [Some(&edge), Some(&nnl), feat.as_ref(), label.as_ref()]
        .into_iter()
        .flatten()
        .chain(split_files.iter().flatten())
        .map(|f| f.size)
        .sum();

    let mut build = opts.build.clone();
    build.num_nodes = Some(n);
    let limit = IdLimit { n, origin };
    let stats = build_topology(
        &mut TextArcs::new(edge, Some(limit.clone())),
        &build,
        writer,
        progress,
    )?;

    let mut vertex = VertexData::default();
    if let Some(f) = &feat {
        vertex.feat_dim = match opts.feat_dtype {
            FeatDtype::F32 => write_features::<f32>(writer, f, &limit, FeatDtype::F32, progress)?,
            FeatDtype::F16 => write_features::<f16>(writer, f, &limit, FeatDtype::F16, progress)?,
        };
    }
    if let Some(l) = &label {
        vertex.num_classes = write_labels(writer, l, &limit, progress)?;
    }
    if let Some(sf) = &split_files {
        let mut ids: [Vec<u32>; 3] = Default::default();
        for (out, f) in ids.iter_mut().zip(sf) {
            *out = read_split(f, n)?;
        }
        vertex.splits = write_splits(writer, ids)?;
    }
    Ok(Imported {
        stats,
        vertex,
        input_bytes,
    })
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Calls `each(line_no, line)` on every line of a small file, in order.
fn small_file_lines(f: &TextFile, mut each: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
    f.for_each_block(BLOCK_BYTES, |b| {
        for c in b.chunks(1) {
            for (no, line) in c.numbered_lines() {
                each(no, line)?;
            }
        }
        Ok(())
    })
}

/// `num-node-list.csv`: one line holding the vertex count of the (single) graph.
fn read_num_nodes(f: &TextFile) -> Result<u64> {
    let mut counts = Vec::new();
    small_file_lines(f, |no, line| {
        let t = trim(line);
        if t.is_empty() {
            return Ok(());
        }
        let n = std::str::from_utf8(t)
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        match n {
            Some(n) => {
                counts.push(n);
                Ok(())
            }
            None => Err(line_error(
                &f.path,
                no,
                format!("expected a vertex count, found {}", show(line)),
            )),
        }
    })?;
    match counts[..] {
        [n] => Ok(n),
        [] => Err(Error::format(
            &f.path,
            "is empty; expected one line holding the number of vertices",
        )),
        _ => Err(Error::format(
            &f.path,
            format!(
                "lists {} graphs; the ogb format imports single-graph node-property datasets",
                counts.len()
            ),
        )),
    }
}

/// Streams a file of exactly `rows_expected.n` lines into `out` (`width` elements per line),
/// parsing blocks in parallel straight into place.
fn read_rows<T: Pod>(
    f: &TextFile,
    rows_expected: &IdLimit,
    width: usize,
    out: &mut [T],
    progress: &dyn Progress,
    parse: impl Fn(&[u8], &mut [T]) -> std::result::Result<(), String> + Sync + Send,
) -> Result<()> {
    let (path, n, origin) = (&f.path, rows_expected.n, &rows_expected.origin);
    let mut rows = 0u64;
    f.for_each_block(BLOCK_BYTES, |block| {
        let chunks = block.par_chunks();
        let lines: u64 = chunks.iter().map(|c| c.lines).sum();
        if block.first_line - 1 + lines > n {
            return Err(line_error(
                path,
                n + 1,
                format!("more rows than the {n} vertices ({origin})"),
            ));
        }
        let mut rest = &mut out[(block.first_line - 1) as usize * width..];
        let mut parts = Vec::with_capacity(chunks.len());
        for c in &chunks {
            let (head, tail) = rest.split_at_mut(c.lines as usize * width);
            parts.push(head);
            rest = tail;
        }
        let done: Vec<Result<()>> = chunks
            .par_iter()
            .zip(parts.into_par_iter())
            .map(|(c, part)| {
                for ((no, line), row) in c.numbered_lines().zip(part.chunks_mut(width)) {
                    parse(line, row).map_err(|e| line_error(path, no, e))?;
                }
                Ok(())
            })
            .collect();
        done.into_iter().collect::<Result<()>>()?;
        rows = block.first_line - 1 + lines;
        progress.advance(block.raw_bytes);
        Ok(())
    })?;
    if rows != n {
        return Err(Error::format(
            path,
            format!("has {rows} rows, expected {n}: one per vertex ({origin})"),
        ));
    }
    Ok(())
}

/// `node-feat.csv` into `feat.bin`; returns the width (taken from line 1).
fn write_features<T: FeatElem + Send>(
    writer: &mut DatasetWriter,
    f: &TextFile,
    rows: &IdLimit,
    dtype: FeatDtype,
    progress: &dyn Progress,
) -> Result<u64> {
    let first = f.first_line()?.unwrap_or_default();
    if trim(&first).is_empty() {
        return Err(line_error(
            &f.path,
            1,
            "expected comma-separated feature values, found an empty line",
        ));
    }
    let width = first.split(|&b| b == b',').count();
    let n = rows.n;
    let len = n
        .checked_mul(width as u64)
        .filter(|l| l.checked_mul(8).is_some())
        .ok_or_else(|| {
            line_error(
                &f.path,
                1,
                format!("{n} rows of {width} values overflow a file size"),
            )
        })?;
    let dest = writer.dir().join(files::FEAT);
    let mut out = writer.array_mut::<T>(files::FEAT, len)?;
    progress.phase("node features", f.size, "bytes");
    read_rows(f, rows, width, &mut out, progress, |line, row| {
        let found = line.iter().filter(|&&b| b == b',').count() + 1;
        if found != width {
            return Err(format!(
                "expected {width} comma-separated feature values (as on line 1), found {found}"
            ));
        }
        for ((k, tok), o) in line.split(|&b| b == b',').enumerate().zip(row.iter_mut()) {
            let x: f32 = std::str::from_utf8(trim(tok))
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    format!("column {}: expected a number, found {}", k + 1, show(tok))
                })?;
            *o = T::store(x)
                .ok_or_else(|| format!("column {}: {}", k + 1, bad_feature(x, dtype)))?;
        }
        Ok(())
    })?;
    progress.finish_phase();
    out.finish(&dest)?;
    Ok(width as u64)
}

/// One label: an integer class id, `-1`, `nan` or empty (none); `3.0` is read as 3.
fn parse_label(line: &[u8]) -> std::result::Result<i64, String> {
    let t = trim(line);
    if t.is_empty() || t.eq_ignore_ascii_case(b"nan") {
        return Ok(-1);
    }
    if t.contains(&b',') {
        return Err(format!(
            "expected one label per line, found several columns {}; multi-label datasets are not supported",
            show(line)
        ));
    }
    let s = std::str::from_utf8(t).unwrap_or_default();
    let v = match s.parse::<i64>() {
        Ok(v) => Some(v),
        Err(_) => s
            .parse::<f64>()
            .ok()
            .filter(|x| x.fract() == 0.0 && x.abs() <= MAX_CLASS as f64)
            .map(|x| x as i64),
    };
    match v {
        Some(v) if (-1..=MAX_CLASS).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a class id in 0..={MAX_CLASS} (or -1, nan or nothing for none), found {}",
            show(line)
        )),
    }
}

/// `node-label.csv` into `label.bin`; returns the class count.
fn write_labels(
    writer: &mut DatasetWriter,
    f: &TextFile,
    rows: &IdLimit,
    progress: &dyn Progress,
) -> Result<u64> {
    let dest = writer.dir().join(files::LABEL);
    let mut out = writer.array_mut::<i64>(files::LABEL, rows.n)?;
    progress.phase("labels", f.size, "bytes");
    read_rows(f, rows, 1, &mut out, progress, |line, row| {
        row[0] = parse_label(line)?;
        Ok(())
    })?;
    progress.finish_phase();
    let max = out.par_iter().copied().max().unwrap_or(-1);
    out.finish(&dest)?;
    Ok((max + 1).max(0) as u64)
}

/// A split file: one vertex id per line (blank lines skipped).
fn read_split(f: &TextFile, n: u64) -> Result<Vec<u32>> {
    let mut ids: Vec<(u64, u64)> = Vec::new();
    f.for_each_block(BLOCK_BYTES, |block| {
        let chunks = block.par_chunks();
        let parts = par_map_chunks(&chunks, |c| {
            let mut out = Vec::new();
            for (no, line) in c.numbered_lines() {
                let t = trim(line);
                if t.is_empty() {
                    continue;
                }
                let id = std::str::from_utf8(t)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok());
                match id {
                    Some(id) => out.push((id, no)),
                    None => {
                        return Err(line_error(
                            &f.path,
                            no,
                            format!(
                                "expected a vertex id (a non-negative integer), found {}",
                                show(line)
                            ),
                        ))
                    }
                }
            }
            Ok(out)
        })?;
        parts.into_iter().for_each(|p| ids.extend(p));
        Ok(())
    })?;
    let (v, lines): (Vec<u64>, Vec<u64>) = ids.into_iter().unzip();
    finish_split(&f.path, &v, n, &|i| format!("line {}", lines[i]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npy::write_npy;
    use crate::testutil::{import_err, import_ok, rows};
    use crate::text::tests::write_gz;
    use crate::{Format, RandomFeatures};

    const FEAT: &str = "0,0.5,1\n1.5,2,2.5\n3,3.5,4\n4.5,5,5.5\n";

    /// Writes `files` (path relative to `root` -> content) gzip-compressed, or plain when the
    /// path does not end in `.gz`.
    fn layout(root: &Path, files: &[(&str, &str)]) {
        let _ = std::fs::remove_dir_all(root);
        for (rel, text) in files {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            if rel.ends_with(".gz") {
                write_gz(&p, text.as_bytes());
            } else {
                std::fs::write(&p, text).unwrap();
            }
        }
    }

    /// The small graph of the npy tests, as OGB would ship it.
    fn small() -> Vec<(&'static str, &'static str)> {
        vec![
            ("raw/edge.csv.gz", "0,1\n2,1\n0,1\n3,2\n1,0\n"),
            ("raw/num-node-list.csv.gz", "4\n"),
            ("raw/node-feat.csv.gz", FEAT),
            ("raw/node-label.csv", "1\nnan\n0.0\n2\n"),
            ("split/time/train.csv.gz", "0\n3\n"),
            ("split/time/valid.csv.gz", "2\n"),
            ("split/time/test.csv.gz", "1\n"),
        ]
    }

    fn with(
        mut files: Vec<(&'static str, &'static str)>,
        rel: &'static str,
        text: &'static str,
    ) -> Vec<(&'static str, &'static str)> {
        files.retain(|(r, _)| *r != rel);
        files.push((rel, text));
        files
    }

    fn without(
        mut files: Vec<(&'static str, &'static str)>,
        rel: &str,
    ) -> Vec<(&'static str, &'static str)> {
        files.retain(|(r, _)| *r != rel);
        files
    }

    #[test]
    fn small_dataset_matches_the_npy_import() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("ogbn-small");
        layout(&src, &small());
        let (ds, s) = import_ok(
            Format::Ogb,
            &src,
            &d.path().join("out"),
            &ImportOptions::default(),
        );
        assert_eq!(rows(&ds), vec![vec![1], vec![0, 0, 2], vec![3], vec![]]);
        assert_eq!(
            (s.num_nodes, s.num_arcs, s.feat_dim, s.num_classes),
            (4, 5, 3, 3)
        );
        assert_eq!((s.train, s.valid, s.test), (2, 1, 1));
        assert_eq!(&ds.labels.as_ref().unwrap()[..], &[1, -1, 0, 2]);

        let npy = d.path().join("npy");
        std::fs::create_dir(&npy).unwrap();
        write_npy(
            &npy.join("edge_index.npy"),
            &[2, 5],
            &[0i64, 2, 0, 3, 1, 1, 1, 1, 2, 0],
        )
        .unwrap();
        let f: Vec<f32> = (0..12).map(|x| x as f32 * 0.5).collect();
        write_npy(&npy.join("node_feat.npy"), &[4, 3], &f).unwrap();
        write_npy(&npy.join("node_label.npy"), &[4], &[1i64, -1, 0, 2]).unwrap();
        write_npy(&npy.join("train_idx.npy"), &[2], &[0i64, 3]).unwrap();
        write_npy(&npy.join("valid_idx.npy"), &[1], &[2i64]).unwrap();
        write_npy(&npy.join("test_idx.npy"), &[1], &[1i64]).unwrap();
        let (dn, _) = import_ok(
            Format::Npy,
            &npy,
            &d.path().join("out-npy"),
            &ImportOptions::default(),
        );
        assert_eq!(ds.meta.checksums, dn.meta.checksums);
        // f16 features through the csv path.
        let o = ImportOptions {
            feat_dtype: FeatDtype::F16,
            ..Default::default()
        };
        let (h, _) = import_ok(Format::Ogb, &src, &d.path().join("out-h"), &o);
        let mut row = [0f32; 3];
        h.features.as_ref().unwrap().copy_row(1, &mut row);
        assert_eq!((h.meta.feat_dtype, row), (FeatDtype::F16, [1.5, 2.0, 2.5]));
    }

    #[test]
    fn split_schemes_are_chosen_or_listed() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("ds");
        let mut files = small();
        files.extend([
            ("split/random/train.csv", "1\n\n2\n"),
            ("split/random/valid.csv", "0\n"),
            ("split/random/test.csv", ""),
        ]);
        layout(&src, &files);
        let o = ImportOptions::default();
        let e = import_err(Format::Ogb, &src, &d.path().join("o"), &o);
        assert!(
            e.contains("split: several split schemes (random, time); choose one"),
            "{e}"
        );
        let pick = |s: &str| ImportOptions {
            split_scheme: Some(s.into()),
            ..Default::default()
        };
        let (ds, s) = import_ok(Format::Ogb, &src, &d.path().join("r"), &pick("random"));
        assert_eq!((s.train, s.valid, s.test), (2, 1, 0));
        assert_eq!(&ds.train[..], &[1, 2]);
        let e = import_err(Format::Ogb, &src, &d.path().join("o"), &pick("species"));
        assert!(
            e.contains("split scheme \"species\" not found under split/ (found: random, time)"),
            "{e}"
        );
        // No split folder at all: no splits.
        layout(
            &src,
            &small()
                .into_iter()
                .filter(|(r, _)| !r.starts_with("split"))
                .collect::<Vec<_>>(),
        );
        let (_, s) = import_ok(Format::Ogb, &src, &d.path().join("n"), &o);
        assert_eq!((s.train, s.valid, s.test), (0, 0, 0));
        // The split scheme option belongs to the ogb format.
        let e = import_err(Format::Npy, &src, &d.path().join("o"), &pick("time"));
        assert!(e.contains("applies to the ogb format only"), "{e}");
    }

    #[test]
    fn missing_files_say_what_the_layout_expects() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("ds");
        let out = d.path().join("o");
        let o = ImportOptions::default();
        layout(&src, &without(small(), "raw/num-node-list.csv.gz"));
        let e = import_err(Format::Ogb, &src, &out, &o);
        assert!(
            e.contains(
                "raw/num-node-list.csv: missing (nor num-node-list.csv.gz); the ogb format expects"
            ),
            "{e}"
        );
        layout(&src, &without(small(), "raw/edge.csv.gz"));
        assert!(import_err(Format::Ogb, &src, &out, &o).contains("raw/edge.csv: missing"));
        layout(&src, &without(small(), "split/time/valid.csv.gz"));
        let e = import_err(Format::Ogb, &src, &out, &o);
        assert!(
            e.contains("split/time/valid.csv: missing (nor valid.csv.gz)"),
            "{e}"
        );
        layout(&src, &small());
        let e = import_err(Format::Ogb, &src.join("raw"), &out, &o);
        assert!(e.contains("looks like the raw/ folder itself"), "{e}");
        let e = import_err(Format::Ogb, &src.join("split"), &out, &o);
        assert!(
            e.contains("split/raw: missing; the ogb format expects"),
            "{e}"
        );
        layout(
            &src,
            &[
                ("raw/relations/paper___cites___paper/edge.csv.gz", "0,1\n"),
                ("raw/num-node-list.csv", "2\n"),
            ],
        );
        assert!(import_err(Format::Ogb, &src, &out, &o).contains("heterogeneous OGB datasets"));
        let e = import_err(Format::Ogb, &src.join("raw/num-node-list.csv"), &out, &o);
        assert!(e.contains("is not a directory"), "{e}");
    }

    #[test]
    fn malformed_files_name_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("ds");
        let out = d.path().join("o");
        let o = ImportOptions::default();
        let cases: Vec<(&str, &str, &str)> = vec![
            ("raw/edge.csv.gz", "0,1\n1,9\n", "edge.csv.gz: line 2: vertex id 9 is out of range; expected < 4 (the vertex count in raw/num-node-list.csv.gz)"),
            ("raw/edge.csv.gz", "0,1\n1;2\n", "edge.csv.gz: line 2: expected two non-negative integer vertex ids, found \"1;2\""),
            ("raw/edge.csv.gz", "\n", "edge.csv.gz: no edges found"),
            ("raw/num-node-list.csv.gz", "four\n", "num-node-list.csv.gz: line 1: expected a vertex count, found \"four\""),
            ("raw/num-node-list.csv.gz", "4\n5\n", "lists 2 graphs"),
            ("raw/num-node-list.csv.gz", "", "num-node-list.csv.gz: is empty"),
            ("raw/node-feat.csv.gz", "0,0.5,1\n1.5,2\n3,3.5,4\n4.5,5,5.5\n", "node-feat.csv.gz: line 2: expected 3 comma-separated feature values (as on line 1), found 2"),
            ("raw/node-feat.csv.gz", "0,0.5,1\n1.5,2,2.5,7\n3,3.5,4\n4.5,5,5.5\n", "line 2: expected 3 comma-separated feature values (as on line 1), found 4"),
            ("raw/node-feat.csv.gz", "0,0.5,1\n1.5,abc,2.5\n3,3.5,4\n4.5,5,5.5\n", "node-feat.csv.gz: line 2: column 2: expected a number, found \"abc\""),
            ("raw/node-feat.csv.gz", "0,0.5,1\n1.5,2,2.5\n3,nan,4\n4.5,5,5.5\n", "line 3: column 2: value NaN; features must be finite"),
            ("raw/node-feat.csv.gz", "0,0.5,1\n1.5,2,2.5\n3,3.5,4\n", "node-feat.csv.gz: has 3 rows, expected 4: one per vertex"),
            ("raw/node-feat.csv.gz", "0,0.5,1\n1.5,2,2.5\n3,3.5,4\n4.5,5,5.5\n1,1,1\n", "node-feat.csv.gz: line 5: more rows than the 4 vertices"),
            ("raw/node-feat.csv.gz", "\n", "node-feat.csv.gz: line 1: expected comma-separated feature values, found an empty line"),
            ("raw/node-label.csv", "1\n3.5\n0\n2\n", "node-label.csv: line 2: expected a class id in 0..=2147483647 (or -1, nan or nothing for none), found \"3.5\""),
            ("raw/node-label.csv", "1\n-2\n0\n2\n", "line 2: expected a class id"),
            ("raw/node-label.csv", "1,0\n0,1\n0,0\n1,1\n", "line 1: expected one label per line, found several columns"),
            ("raw/node-label.csv", "1\n0\n", "node-label.csv: has 2 rows, expected 4"),
            ("split/time/train.csv.gz", "0\n4\n", "train.csv.gz: line 2: vertex id 4 is out of range; expected < 4"),
            ("split/time/train.csv.gz", "0\n\n0\n", "train.csv.gz: line 3: vertex 0 appears twice (also at line 1)"),
            ("split/time/test.csv.gz", "1\nx\n", "test.csv.gz: line 2: expected a vertex id (a non-negative integer), found \"x\""),
        ];
        for (rel, text, want) in cases {
            layout(&src, &with(small(), rel, text));
            let e = import_err(Format::Ogb, &src, &out, &o);
            assert!(e.contains(want), "{rel}: {e}\nexpected: {want}");
        }
        // Labels: empty line and -1 mean none, "3.0" is 3.
        layout(&src, &with(small(), "raw/node-label.csv", "1\n\n-1\n3.0\n"));
        let (ds, s) = import_ok(Format::Ogb, &src, &out, &o);
        assert_eq!(
            (&ds.labels.as_ref().unwrap()[..], s.num_classes),
            (&[1, -1, -1, 3][..], 4)
        );
    }

    #[test]
    fn topology_only_ogb_with_random_features() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("ds");
        layout(
            &src,
            &[
                ("raw/edge.csv", "0,1\n1,2\n2,0\n"),
                ("raw/num-node-list.csv", "10\n"),
            ],
        );
        let r = RandomFeatures {
            dim: 4,
            classes: 3,
            train_frac: 0.5,
            valid_frac: 0.2,
            test_frac: 0.3,
            seed: 9,
            signal: 2.0,
        };
        let o = ImportOptions {
            random: Some(r),
            ..Default::default()
        };
        let (ds, s) = import_ok(Format::Ogb, &src, &d.path().join("o"), &o);
        assert_eq!((s.num_nodes, s.feat_dim, s.num_classes), (10, 4, 3));
        assert_eq!((s.train, s.valid, s.test), (5, 2, 3));
        assert_eq!(ds.labels.as_ref().unwrap().len(), 10);
        layout(&src, &small());
        let e = import_err(Format::Ogb, &src, &d.path().join("o2"), &o);
        assert!(
            e.contains("already has node features") && e.contains("node-feat.csv.gz"),
            "{e}"
        );
    }
}
