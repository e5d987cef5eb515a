//! Writing a dataset atomically: every file goes into a private temporary directory beside the
//! output, and only a complete, checksummed dataset is renamed into place. An interrupted or
//! failed write leaves the user's files exactly as they were.

use crate::array::{as_bytes, ArrayMut, Pod};
use crate::cancel::Cancel;
use crate::checksum::file_checksum;
use crate::dataset::{files, Dataset};
use crate::error::{Error, Result};
use crate::meta::Meta;
use crate::progress::Progress;
use rayon::prelude::*;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

enum Target {
    /// Rename `tmp` to `out` on finish.
    Dir {
        out: PathBuf,
        tmp: PathBuf,
        overwrite: bool,
    },
    /// A self-deleting directory that lives as long as the returned `Dataset`.
    Temporary(Arc<tempfile::TempDir>),
}

/// Builds a dataset directory file by file. Dropping a writer without calling
/// [`DatasetWriter::finish`] deletes everything it wrote.
pub struct DatasetWriter {
    target: Target,
    files: Vec<String>,
    finished: bool,
    cancel: Cancel,
}

impl DatasetWriter {
    /// Starts writing the dataset that will appear at `out`. Fails at once if `out` exists and
    /// `overwrite` is false, or if `out` exists but does not look like a dataset (no meta.txt), so
    /// that `--overwrite` can never delete a folder of someone's other files.
    pub fn create(out: &Path, overwrite: bool) -> Result<Self> {
        if out.exists() {
            if !overwrite {
                return Err(Error::Invalid(format!(
                    "{} already exists; choose another output path or pass --overwrite to replace it",
                    out.display()
                )));
            }
            let is_dataset = out.join(files::META).is_file();
            let is_empty_dir = out
                .read_dir()
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            if !(is_dataset || is_empty_dir) {
                return Err(Error::Invalid(format!(
                    "{} exists and is not a fanout dataset (no meta.txt); refusing to replace it even with --overwrite",
                    out.display()
                )));
            }
        }
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, "create directory", e))?;
        let name = out
            .file_name()
            .ok_or_else(|| Error::Invalid(format!("{}: not a valid output path", out.display())))?
            .to_string_lossy()
            .into_owned();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tmp = parent.join(format!(".{name}.tmp-{}-{stamp}", std::process::id()));
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, "create directory", e))?;
        Ok(DatasetWriter {
            target: Target::Dir {
                out: out.to_path_buf(),
                tmp,
                overwrite,
            },
            files: Vec::new(),
            finished: false,
            cancel: Cancel::default(),
        })
    }

    /// Starts a dataset in a self-deleting temporary directory (for datasets generated for one
    /// run, such as `fanout train`'s embedded default). It is removed when the last `Dataset`
    /// opened from it is dropped.
    pub fn temporary() -> Result<Self> {
        let t = tempfile::Builder::new()
            .prefix("fanout-dataset-")
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), "create temporary directory", e))?;
        Ok(DatasetWriter {
            target: Target::Temporary(Arc::new(t)),
            files: Vec::new(),
            finished: false,
            cancel: Cancel::default(),
        })
    }

    /// This writer, stopping with [`Error::Interrupted`] (and deleting what it wrote) once
    /// `cancel` is cancelled: checked before every file is written, by [`build_topology`]
    /// between batches of arcs, and by [`DatasetWriter::finish`] before and after checksumming.
    ///
    /// [`build_topology`]: crate::build_topology
    pub fn with_cancel(mut self, cancel: Cancel) -> Self {
        self.cancel = cancel;
        self
    }

    /// The writer's cancellation token (never cancelled unless set by
    /// [`DatasetWriter::with_cancel`]).
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    /// The directory files are being written into (not the final location).
    pub fn dir(&self) -> &Path {
        match &self.target {
            Target::Dir { tmp, .. } => tmp,
            Target::Temporary(t) => t.path(),
        }
    }

    /// Path of `file` inside the working directory, recorded for checksumming.
    pub fn file_path(&mut self, file: &str) -> PathBuf {
        if !self.files.iter().any(|f| f == file) {
            self.files.push(file.to_string());
        }
        self.dir().join(file)
    }

    /// A zeroed, writable, file-backed array of `len` elements named `file`.
    pub fn array_mut<T: Pod + Default>(&mut self, file: &str, len: u64) -> Result<ArrayMut<T>> {
        self.cancel.check()?;
        let p = self.file_path(file);
        ArrayMut::create_file(&p, len)
    }

    /// Writes `data` as the file `file`.
    pub fn write_array<T: Pod>(&mut self, file: &str, data: &[T]) -> Result<()> {
        self.cancel.check()?;
        let p = self.file_path(file);
        std::fs::write(&p, as_bytes(data)).map_err(|e| Error::io(&p, "write", e))
    }

    /// Shrinks `file` (written through `array_mut`) to `len` elements of `T`.
    pub fn truncate<T: Pod>(&mut self, file: &str, len: u64) -> Result<()> {
        let p = self.file_path(file);
        let f = OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| Error::io(&p, "open", e))?;
        f.set_len(len * std::mem::size_of::<T>() as u64)
            .map_err(|e| Error::io(&p, "truncate", e))
    }

    /// Checksums every file, writes `meta.txt`, moves the dataset into place and opens it.
    /// `meta.checksums` is replaced by the computed checksums.
    pub fn finish(mut self, mut meta: Meta, progress: &dyn Progress) -> Result<Dataset> {
        self.cancel.check()?;
        let dir = self.dir().to_path_buf();
        let total: u64 = self
            .files
            .iter()
            .map(|f| std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0))
            .sum();
        progress.phase("checksum", total, "bytes");
        let sums: Vec<(String, String)> = self
            .files
            .par_iter()
            .map(|f| Ok((f.clone(), file_checksum(&dir.join(f), progress)?)))
            .collect::<Result<_>>()?;
        progress.finish_phase();
        self.cancel.check()?;
        meta.checksums = sums.into_iter().collect();
        let meta_path = dir.join(files::META);
        let mut f =
            std::fs::File::create(&meta_path).map_err(|e| Error::io(&meta_path, "create", e))?;
        f.write_all(meta.to_text().as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io(&meta_path, "write", e))?;
        for file in &self.files {
            let p = dir.join(file);
            if let Ok(f) = std::fs::File::open(&p) {
                f.sync_all().map_err(|e| Error::io(&p, "sync", e))?;
            }
        }
        self.finished = true;
        match &self.target {
            Target::Dir {
                out,
                tmp,
                overwrite,
            } => {
                if out.exists() {
                    if !overwrite {
                        return Err(Error::Invalid(format!(
                            "{} appeared while writing; the new dataset is left in {}",
                            out.display(),
                            tmp.display()
                        )));
                    }
                    let old = tmp.with_file_name(format!(
                        "{}.old",
                        tmp.file_name().unwrap().to_string_lossy()
                    ));
                    std::fs::rename(out, &old).map_err(|e| Error::io(out, "move aside", e))?;
                    if let Err(e) = std::fs::rename(tmp, out) {
                        // Put the user's dataset back before reporting.
                        let _ = std::fs::rename(&old, out);
                        return Err(Error::io(out, "rename into place", e));
                    }
                    std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, "remove", e))?;
                } else {
                    std::fs::rename(tmp, out)
                        .map_err(|e| Error::io(out, "rename into place", e))?;
                }
                Dataset::open(out)
            }
            Target::Temporary(t) => {
                let mut ds = Dataset::open(t.path())?;
                ds._keep = Some(t.clone());
                Ok(ds)
            }
        }
    }
}

impl Drop for DatasetWriter {
    fn drop(&mut self) {
        if !self.finished {
            if let Target::Dir { tmp, .. } = &self.target {
                let _ = std::fs::remove_dir_all(tmp);
            }
        }
    }
}
