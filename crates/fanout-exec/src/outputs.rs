//! Checks on the files a run will write, made before it starts: a run that trains for an hour
//! and then cannot write its metrics, or writes them over its own config or checkpoint, loses
//! what the user had or what the run made.

use crate::error::{ExecError, Result};
use std::path::{Path, PathBuf};

/// Refuses, before anything runs, outputs (`(flag, path)`) that could not be written or would
/// destroy something: an output that is a folder or whose folder does not exist, two outputs
/// naming the same file, and an output that is one of the run's `inputs` (`(flag, path)`, such
/// as its config or the checkpoint it resumes). Files are compared through links (same device
/// and inode where both exist). The error names both flags.
pub fn check_outputs(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    for (flag, p) in outputs {
        if p.is_dir() {
            return Err(ExecError::Invalid(format!(
                "{flag} {}: is a folder; expected a file name",
                p.display()
            )));
        }
        // Where the file will be: through a link that points to nothing yet, its target.
        let at = match std::fs::read_link(p) {
            Ok(t) if !p.exists() => p.parent().map_or(t.clone(), |d| d.join(&t)),
            _ => p.to_path_buf(),
        };
        let dir = at.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(d) = dir.filter(|d| !d.is_dir()) {
            return Err(ExecError::Invalid(format!(
                "{flag} {}: the folder {} does not exist",
                p.display(),
                d.display()
            )));
        }
    }
    for (i, (flag, p)) in outputs.iter().enumerate() {
        let earlier = outputs[..i].iter().map(|(f, q)| (f, q, "is also"));
        let reads = inputs.iter().map(|(f, q)| (f, q, "would write over"));
        for (other, q, how) in earlier.chain(reads) {
            if same_file(p, q) {
                return Err(ExecError::Invalid(format!(
                    "{flag} {} {how} {other} {}: give it another name",
                    p.display(),
                    q.display()
                )));
            }
        }
    }
    Ok(())
}

/// Whether `a` and `b` name one file: the same device and inode where both exist (links and
/// different spellings included), else the same absolute path.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return (x.dev(), x.ino()) == (y.dev(), y.ino());
        }
    }
    absolute(a) == absolute(b)
}

/// `p` as an absolute path (resolved through links where it exists).
fn absolute(p: &Path) -> PathBuf {
    p.canonicalize()
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_that_would_fail_or_destroy_are_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let cfg = d.join("run.toml");
        std::fs::write(&cfg, "epochs = 1\n").unwrap();
        let ckpt = d.join("model.st");
        std::fs::write(&ckpt, b"weights").unwrap();
        let link = d.join("link.st");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&ckpt, &link).unwrap();
        let m = d.join("m.json");
        let inputs = [("--config", cfg.as_path()), ("--resume", ckpt.as_path())];
        let err = |outs: &[(&str, &Path)]| check_outputs(outs, &inputs).unwrap_err().to_string();
        // Fine: new files in existing folders, or an existing output file that is no input.
        check_outputs(
            &[("--metrics-out", &m), ("--save-model", &d.join("new.st"))],
            &inputs,
        )
        .unwrap();
        assert!(err(&[("--metrics-out", d)]).contains("is a folder"));
        assert!(err(&[("--metrics-out", &d.join("no/m.json"))]).contains("does not exist"));
        let e = err(&[("--metrics-out", &cfg)]);
        assert!(
            e.contains("--metrics-out") && e.contains("would write over --config"),
            "{e}"
        );
        let e = err(&[("--metrics-out", &m), ("--save-model", &m)]);
        assert!(
            e.contains("--save-model") && e.contains("is also --metrics-out"),
            "{e}"
        );
        // Another spelling of the same path, and a link to the input.
        let e = err(&[("--save-model", &d.join(".").join("model.st"))]);
        assert!(e.contains("would write over --resume"), "{e}");
        #[cfg(unix)]
        assert!(err(&[("--save-model", &link)]).contains("would write over --resume"));
    }
}
