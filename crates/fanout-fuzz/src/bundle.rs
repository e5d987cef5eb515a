//! [`Bundle`]: the files of one input folder, stored as one corpus file.
//!
//! Encoding (little-endian): the magic `FZB1`, then per file a `u32` name length, the name
//! (UTF-8, a relative path with `/`), a `u64` data length and the data. Hand-written: a dozen
//! lines, where an archive crate would be a dependency for nothing else.

use std::path::Path;

const MAGIC: &[u8; 4] = b"FZB1";

/// Files by relative path, in a fixed order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bundle {
    /// `(relative path, contents)`.
    pub files: Vec<(String, Vec<u8>)>,
}

impl Bundle {
    /// Reads every regular file under `dir` (recursively, sorted by path), skipping names in
    /// `skip`.
    pub fn read_dir(dir: &Path, skip: &[&str]) -> std::io::Result<Bundle> {
        fn walk(
            root: &Path,
            dir: &Path,
            skip: &[&str],
            out: &mut Vec<(String, Vec<u8>)>,
        ) -> std::io::Result<()> {
            for e in std::fs::read_dir(dir)? {
                let p = e?.path();
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                if skip.contains(&name.as_ref()) {
                    continue;
                }
                if p.is_dir() {
                    walk(root, &p, skip, out)?;
                } else {
                    let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy();
                    out.push((rel.replace('\\', "/"), std::fs::read(&p)?));
                }
            }
            Ok(())
        }
        let mut files = Vec::new();
        walk(dir, dir, skip, &mut files)?;
        files.sort();
        Ok(Bundle { files })
    }

    /// Writes the files under `dir` (created with its subfolders).
    pub fn write_dir(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, data) in &self.files {
            let p = dir.join(name);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(p, data)?;
        }
        Ok(())
    }

    /// The corpus-file encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        for (name, data) in &self.files {
            out.extend_from_slice(&(name.len() as u32).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(data.len() as u64).to_le_bytes());
            out.extend_from_slice(data);
        }
        out
    }

    /// Decodes [`Bundle::encode`]'s output; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Bundle, String> {
        let body = bytes
            .strip_prefix(MAGIC)
            .ok_or("not a fuzz bundle (expected the magic FZB1)")?;
        let mut at = 0usize;
        let mut take = |n: u64, what: &str| -> Result<&[u8], String> {
            let n = usize::try_from(n).map_err(|e| e.to_string())?;
            let end = at
                .checked_add(n)
                .filter(|&e| e <= body.len())
                .ok_or_else(|| format!("truncated in {what}"))?;
            let s = &body[at..end];
            at = end;
            Ok(s)
        };
        let mut files = Vec::new();
        let mut left = body.len();
        while left > 0 {
            let len = u32::from_le_bytes(take(4, "a name length")?.try_into().expect("4 bytes"));
            let name = std::str::from_utf8(take(len as u64, "a name")?)
                .map_err(|_| "a file name is not UTF-8".to_string())?
                .to_string();
            if name.is_empty() || name.starts_with('/') || name.split('/').any(|c| c == "..") {
                return Err(format!("file name {name:?} is not a relative path"));
            }
            let dlen = u64::from_le_bytes(take(8, "a data length")?.try_into().expect("8 bytes"));
            let data = take(dlen, "file data")?;
            left -= 4 + len as usize + 8 + data.len();
            files.push((name, data.to_vec()));
        }
        Ok(Bundle { files })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip_and_damage_is_an_error() {
        let b = Bundle {
            files: vec![
                ("meta.txt".into(), b"NUM_NODE\t3\n".to_vec()),
                ("raw/edge.csv".into(), vec![]),
            ],
        };
        let e = b.encode();
        assert_eq!(Bundle::decode(&e).unwrap(), b);
        assert!(Bundle::decode(&e[..e.len() - 3]).is_err());
        assert!(Bundle::decode(b"XXXX").is_err());
        let mut evil = MAGIC.to_vec();
        evil.extend_from_slice(&5u32.to_le_bytes());
        evil.extend_from_slice(b"../x\0");
        assert!(Bundle::decode(&evil).is_err());
    }
}
