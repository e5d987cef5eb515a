//! Line-oriented text input shared by the edge-list and OGB importers.
//!
//! A [`TextFile`] (plain or gzip, told apart by its magic bytes) is read by a background thread in
//! blocks of whole lines; the caller cuts each block into chunks that are parsed in parallel with
//! rayon while the next block is read (and decompressed). Every line keeps its 1-based number, so
//! errors say `line 17: ...` and show the offending text.

use fanout_graph::{Error, Result};
use flate2::read::MultiGzDecoder;
use rayon::prelude::*;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of text per block: large enough to keep every core busy, small enough to bound memory.
pub(crate) const BLOCK_BYTES: usize = 32 << 20;
/// A line longer than this is taken as a sign of a binary or otherwise wrong file.
const MAX_LINE_BYTES: usize = 256 << 20;
/// Characters of an offending line shown in an error message.
const SHOW_CHARS: usize = 80;

/// A text input file, plain or gzip-compressed.
#[derive(Clone, Debug)]
pub(crate) struct TextFile {
    pub path: PathBuf,
    /// Size on disk (compressed size for gzip).
    pub size: u64,
    pub gzip: bool,
}

/// A run of whole lines, `first_line` being the 1-based number of its first line.
pub(crate) struct Block {
    pub text: Vec<u8>,
    pub first_line: u64,
    /// Bytes of the file (compressed bytes for gzip) consumed to produce this block.
    pub raw_bytes: u64,
}

/// A part of a block: whole lines, the first numbered `first_line`, `lines` of them.
pub(crate) struct Chunk<'a> {
    pub text: &'a [u8],
    pub first_line: u64,
    pub lines: u64,
}

/// Counts bytes read from the underlying file (before decompression).
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl TextFile {
    /// Opens `path` and tells gzip (magic bytes 1f 8b) from plain text.
    pub fn open(path: &Path) -> Result<TextFile> {
        let mut f = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let meta = f.metadata().map_err(|e| Error::io(path, "stat", e))?;
        if meta.is_dir() {
            return Err(Error::format(
                path,
                "is a directory; expected a text file (plain or gzip)",
            ));
        }
        let mut magic = [0u8; 2];
        let mut got = 0;
        while got < 2 {
            match f.read(&mut magic[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(path, "read", e)),
            }
        }
        Ok(TextFile {
            path: path.to_path_buf(),
            size: meta.len(),
            gzip: got == 2 && magic == [0x1f, 0x8b],
        })
    }

    /// The decompressed byte stream and the counter of raw bytes read.
    fn reader(&self) -> Result<(Box<dyn Read + Send>, Arc<AtomicU64>)> {
        let f = File::open(&self.path).map_err(|e| Error::io(&self.path, "open", e))?;
        let count = Arc::new(AtomicU64::new(0));
        let counting = Counting {
            inner: f,
            count: count.clone(),
        };
        let r: Box<dyn Read + Send> = if self.gzip {
            Box::new(MultiGzDecoder::new(BufReader::with_capacity(
                1 << 20,
                counting,
            )))
        } else {
            Box::new(counting)
        };
        Ok((r, count))
    }

    /// The error for a failed read at about `line`.
    fn read_error(&self, line: u64, e: std::io::Error) -> Error {
        if self.gzip && e.kind() != std::io::ErrorKind::PermissionDenied {
            Error::format(
                &self.path,
                format!(
                    "line {line}: cannot decompress: {e} (the gzip data is corrupt or truncated)"
                ),
            )
        } else {
            Error::io(&self.path, "read", e)
        }
    }

    /// The first line (without its line ending), or `None` for an empty file.
    pub fn first_line(&self) -> Result<Option<Vec<u8>>> {
        let (r, _) = self.reader()?;
        let mut r = BufReader::new(r).take(MAX_LINE_BYTES as u64 + 1);
        let mut line = Vec::new();
        r.read_until(b'\n', &mut line)
            .map_err(|e| self.read_error(1, e))?;
        if line.len() > MAX_LINE_BYTES {
            return Err(self.too_long(1));
        }
        if line.is_empty() {
            return Ok(None);
        }
        Ok(Some(strip_eol(&line).to_vec()))
    }

    fn too_long(&self, line: u64) -> Error {
        Error::format(
            &self.path,
            format!(
                "line {line} is longer than {} MiB; is this a text file?",
                MAX_LINE_BYTES >> 20
            ),
        )
    }

    /// Reads the file in blocks of about `block_bytes` of whole lines on a background thread and
    /// hands them to `f` in order, stopping at the first error (of reading or of `f`).
    pub fn for_each_block(
        &self,
        block_bytes: usize,
        mut f: impl FnMut(Block) -> Result<()>,
    ) -> Result<()> {
        let (reader, count) = self.reader()?;
        std::thread::scope(|s| {
            // One block in flight while `f` works on the previous one.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Block>>(1);
            s.spawn(move || self.read_blocks(reader, &count, block_bytes, tx));
            for block in rx {
                f(block?)?;
            }
            Ok(())
        })
    }

    /// The reading thread: sends blocks until the end of the file, an error, or a receiver
    /// that hung up.
    fn read_blocks(
        &self,
        mut reader: Box<dyn Read + Send>,
        count: &AtomicU64,
        block_bytes: usize,
        tx: std::sync::mpsc::SyncSender<Result<Block>>,
    ) {
        let mut carry: Vec<u8> = Vec::new();
        let mut next_line = 1u64;
        let mut reported = 0u64;
        loop {
            // A fresh buffer per block (the previous one travels to the parser), starting with
            // the partial line the previous block left over.
            let mut buf = Vec::with_capacity(block_bytes.max(carry.len()) + 64);
            buf.append(&mut carry);
            let mut eof = false;
            // Read until the block holds at least one whole line (or the file ends).
            let cut = loop {
                // Fill up to `block_bytes`; past it (a line longer than a block) grow by blocks.
                let want = match block_bytes.checked_sub(buf.len()) {
                    Some(w) if w > 0 => w,
                    _ => block_bytes.max(1),
                };
                match (&mut reader).take(want as u64).read_to_end(&mut buf) {
                    Ok(0) => {
                        eof = true;
                        break buf.len();
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let _ = tx.send(Err(self.read_error(next_line, e)));
                        return;
                    }
                }
                if buf.len() >= block_bytes {
                    if let Some(p) = buf.iter().rposition(|&b| b == b'\n') {
                        break p + 1;
                    }
                    if buf.len() > MAX_LINE_BYTES {
                        let _ = tx.send(Err(self.too_long(next_line)));
                        return;
                    }
                }
            };
            if buf.is_empty() {
                return;
            }
            carry = buf.split_off(cut);
            let raw = count.load(Ordering::Relaxed);
            let block = Block {
                first_line: next_line,
                raw_bytes: raw - reported,
                text: buf,
            };
            reported = raw;
            next_line += block.text.iter().filter(|&&b| b == b'\n').count() as u64;
            if tx.send(Ok(block)).is_err() || eof {
                return;
            }
        }
    }
}

impl Block {
    /// Cuts the block at line ends into about `parts` chunks for parallel parsing (at least
    /// one), numbering each chunk's first line.
    pub fn chunks(&self, parts: usize) -> Vec<Chunk<'_>> {
        let text = &self.text[..];
        let target = (text.len() / parts.max(1)).max(1 << 16);
        let mut bounds = vec![0usize];
        let mut at = 0;
        while at < text.len() {
            let want = (at + target).min(text.len());
            let end = match text[want..].iter().position(|&b| b == b'\n') {
                Some(p) => want + p + 1,
                None => text.len(),
            };
            bounds.push(end);
            at = end;
        }
        if bounds.len() == 1 {
            bounds.push(0);
        }
        let mut line = self.first_line;
        bounds
            .windows(2)
            .map(|w| {
                let t = &text[w[0]..w[1]];
                let newlines = t.iter().filter(|&&b| b == b'\n').count() as u64;
                let lines = newlines + u64::from(t.last().is_some_and(|&b| b != b'\n'));
                let c = Chunk {
                    text: t,
                    first_line: line,
                    lines,
                };
                line += newlines;
                c
            })
            .collect()
    }

    /// [`Block::chunks`] sized for the current rayon pool.
    pub fn par_chunks(&self) -> Vec<Chunk<'_>> {
        self.chunks(rayon::current_num_threads() * 4)
    }
}

impl<'a> Chunk<'a> {
    /// The lines with their numbers, line endings (`\n`, `\r\n`) removed.
    pub fn numbered_lines(&self) -> impl Iterator<Item = (u64, &'a [u8])> + 'a {
        let first = self.first_line;
        self.text
            .split_inclusive(|&b| b == b'\n')
            .enumerate()
            .map(move |(i, l)| (first + i as u64, strip_eol(l)))
    }
}

/// Runs `f` on every chunk in parallel; returns the results in order, or the error of the
/// earliest failing chunk (so errors name the first bad line whatever the scheduling).
pub(crate) fn par_map_chunks<R: Send>(
    chunks: &[Chunk<'_>],
    f: impl Fn(&Chunk<'_>) -> Result<R> + Sync + Send,
) -> Result<Vec<R>> {
    let results: Vec<Result<R>> = chunks.par_iter().map(f).collect();
    results.into_iter().collect()
}

/// The line without its trailing `\n` or `\r\n`.
pub(crate) fn strip_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The line quoted for an error message, cut after [`SHOW_CHARS`] characters.
pub(crate) fn show(line: &[u8]) -> String {
    let s = String::from_utf8_lossy(line);
    let mut out: String = s.chars().take(SHOW_CHARS).collect();
    if s.chars().count() > SHOW_CHARS {
        out.push_str("...");
    }
    format!("{out:?}")
}

/// The error for `line` number `line_no` of `path`.
pub(crate) fn line_error(path: &Path, line_no: u64, detail: impl std::fmt::Display) -> Error {
    Error::format(path, format!("line {line_no}: {detail}"))
}

/// Column separators of edge lists: spaces, tabs and commas.
#[inline]
pub(crate) fn is_sep(b: u8) -> bool {
    b == b' ' || b == b'\t' || b == b','
}

/// A line holding only blanks, or a `#` / `%` comment.
#[inline]
pub(crate) fn is_blank_or_comment(line: &[u8]) -> bool {
    match line.iter().find(|&&b| b != b' ' && b != b'\t') {
        None => true,
        Some(&c) => c == b'#' || c == b'%',
    }
}

/// Parses the decimal digits at `line[i..]`: the value and the index after them, or `None`
/// when there is no digit or the value exceeds `u64`.
#[inline]
pub(crate) fn parse_u64_at(line: &[u8], mut i: usize) -> Option<(u64, usize)> {
    let start = i;
    let mut v: u64 = 0;
    while i < line.len() && line[i].is_ascii_digit() {
        v = v.checked_mul(10)?.checked_add((line[i] - b'0') as u64)?;
        i += 1;
    }
    (i > start).then_some((v, i))
}

/// Parses `src dst [more columns]` (separators: runs of spaces, tabs and commas; leading blanks
/// and a UTF-8 byte-order mark skipped). `Some(None)` for a blank or comment line, `None` when
/// the line is malformed.
#[inline]
pub(crate) fn parse_arc(line: &[u8]) -> Option<Option<(u64, u64)>> {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if is_blank_or_comment(line) {
        return Some(None);
    }
    let mut i = 0;
    while line[i] == b' ' || line[i] == b'\t' {
        i += 1;
    }
    let (s, mut i) = parse_u64_at(line, i)?;
    if i == line.len() || !is_sep(line[i]) {
        return None;
    }
    while i < line.len() && is_sep(line[i]) {
        i += 1;
    }
    let (d, i) = parse_u64_at(line, i)?;
    if i < line.len() && !is_sep(line[i]) {
        return None;
    }
    Some(Some((s, d)))
}

/// Trims ASCII blanks (spaces, tabs) at both ends.
pub(crate) fn trim(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|&c| c != b' ' && c != b'\t');
    match start {
        None => &[],
        Some(s) => {
            let e = b
                .iter()
                .rposition(|&c| c != b' ' && c != b'\t')
                .unwrap_or(s);
            &b[s..=e]
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// Writes `text` gzip-compressed to `path`.
    pub(crate) fn write_gz(path: &Path, text: &[u8]) {
        let f = File::create(path).unwrap();
        let mut g = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
        g.write_all(text).unwrap();
        g.finish().unwrap();
    }

    /// Every line of `file` with its number, read through blocks and chunks of the given sizes.
    fn all_lines(file: &TextFile, block: usize, parts: usize) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        file.for_each_block(block, |b| {
            for c in b.chunks(parts) {
                let got: Vec<_> = c.numbered_lines().map(|(n, l)| (n, l.to_vec())).collect();
                assert_eq!(got.len() as u64, c.lines);
                out.extend(got);
            }
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn blocks_keep_line_numbers_for_plain_and_gzip() {
        let d = tempfile::tempdir().unwrap();
        let mut text = String::new();
        for i in 0..5000 {
            text.push_str(&format!("{i} {}\r\n", i * 7));
        }
        text.push_str("last line without newline");
        let plain = d.path().join("a.txt");
        std::fs::write(&plain, &text).unwrap();
        let gz = d.path().join("a.txt.gz");
        write_gz(&gz, text.as_bytes());
        let want: Vec<(u64, Vec<u8>)> = text
            .split("\r\n")
            .enumerate()
            .map(|(i, l)| (i as u64 + 1, l.as_bytes().to_vec()))
            .collect();
        for p in [&plain, &gz] {
            let f = TextFile::open(p).unwrap();
            assert_eq!(f.gzip, p == &gz);
            for (block, parts) in [(1, 1), (100, 3), (1 << 20, 8)] {
                assert_eq!(all_lines(&f, block, parts), want, "{p:?} {block} {parts}");
            }
            assert_eq!(f.first_line().unwrap().unwrap(), b"0 0");
        }
        // Raw byte counts add up to the file size.
        let f = TextFile::open(&gz).unwrap();
        let mut raw = 0;
        f.for_each_block(1000, |b| {
            raw += b.raw_bytes;
            Ok(())
        })
        .unwrap();
        assert_eq!(raw, f.size);
    }

    #[test]
    fn empty_file_has_no_blocks_and_errors_stop_reading() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("e.txt");
        std::fs::write(&p, "").unwrap();
        let f = TextFile::open(&p).unwrap();
        assert!(all_lines(&f, 10, 2).is_empty());
        assert_eq!(f.first_line().unwrap(), None);
        std::fs::write(&p, "a\n".repeat(10_000)).unwrap();
        let mut seen = 0;
        let e = TextFile::open(&p)
            .unwrap()
            .for_each_block(100, |_| {
                seen += 1;
                Err(Error::Invalid("stop".into()))
            })
            .unwrap_err();
        assert_eq!((e.to_string(), seen), ("stop".to_string(), 1));
    }

    #[test]
    fn truncated_gzip_is_an_error_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.gz");
        let text: String = (0..20000).map(|i| format!("{i} {i}\n")).collect();
        write_gz(&p, text.as_bytes());
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
        let e = TextFile::open(&p)
            .unwrap()
            .for_each_block(1 << 20, |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.gz: line 1: cannot decompress"), "{e}");
    }

    #[test]
    fn arc_lines_parse() {
        assert_eq!(parse_arc(b"1 2"), Some(Some((1, 2))));
        assert_eq!(parse_arc(b"  1\t\t2 0.5 extra"), Some(Some((1, 2))));
        assert_eq!(parse_arc(b"3,4"), Some(Some((3, 4))));
        assert_eq!(parse_arc(b"3, 4,"), Some(Some((3, 4))));
        assert_eq!(parse_arc(b"\xEF\xBB\xBF5 6"), Some(Some((5, 6))));
        assert_eq!(parse_arc(b""), Some(None));
        assert_eq!(parse_arc(b"   "), Some(None));
        assert_eq!(parse_arc(b"# 1 2"), Some(None));
        assert_eq!(parse_arc(b" % konect"), Some(None));
        for bad in [
            &b"1"[..],
            b"1 ",
            b"-1 2",
            b"1 -2",
            b"1 2x",
            b"1x 2",
            b"a b",
            b"1.0 2",
            b"99999999999999999999 1",
        ] {
            assert_eq!(parse_arc(bad), None, "{:?}", show(bad));
        }
    }

    #[test]
    fn show_truncates_long_lines() {
        assert_eq!(show(b"12 abc"), "\"12 abc\"");
        let long = "x".repeat(200);
        assert_eq!(
            show(long.as_bytes()),
            format!("{:?}", "x".repeat(80) + "...")
        );
        assert_eq!(trim(b" \t a b \t"), b"a b");
        assert_eq!(trim(b"   "), b"");
    }
}
