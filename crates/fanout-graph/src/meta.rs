//! `meta.txt`: the dataset's sizes and options as `KEY<tab>VALUE` lines (GUIDE section 1).
//!
//! GNNLab's seven keys are required; fanout's own keys are optional. Unknown keys are rejected
//! (a typo such as `NUM_EDGES` would otherwise be silently ignored).

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Whether `indptr` is indexed by destination (CSC: a row lists in-neighbours, what pull-style
/// sampling walks) or by source (CSR: a row lists out-neighbours).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    #[default]
    Csc,
    Csr,
}

impl Layout {
    /// The value written in meta.txt.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Csc => "csc",
            Layout::Csr => "csr",
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "csc" => Ok(Layout::Csc),
            "csr" => Ok(Layout::Csr),
            _ => Err(format!("expected csc or csr, found {s:?}")),
        }
    }
}

/// Element type of `feat.bin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatDtype {
    #[default]
    F32,
    F16,
}

impl FeatDtype {
    /// The value written in meta.txt.
    pub fn as_str(self) -> &'static str {
        match self {
            FeatDtype::F32 => "f32",
            FeatDtype::F16 => "f16",
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FeatDtype::F32 => 4,
            FeatDtype::F16 => 2,
        }
    }
}

impl std::str::FromStr for FeatDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(FeatDtype::F32),
            "f16" => Ok(FeatDtype::F16),
            _ => Err(format!("expected f32 or f16, found {s:?}")),
        }
    }
}

/// The parsed content of `meta.txt`. Guarantees after [`Meta::read`]: every required key was
/// present exactly once with a non-negative integer value, and no unknown key was present.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Meta {
    pub num_node: u64,
    pub num_edge: u64,
    pub feat_dim: u64,
    pub num_class: u64,
    pub num_train_set: u64,
    pub num_valid_set: u64,
    pub num_test_set: u64,
    pub layout: Layout,
    pub feat_dtype: FeatDtype,
    /// `CHECKSUM_<FILE>` entries: file name (e.g. `indptr.bin`) -> `xxh3:<16 hex digits>`.
    pub checksums: BTreeMap<String, String>,
}

/// GNNLab's required keys, in the order they are written.
pub const REQUIRED_KEYS: [&str; 7] = [
    "NUM_NODE",
    "NUM_EDGE",
    "FEAT_DIM",
    "NUM_CLASS",
    "NUM_TRAIN_SET",
    "NUM_VALID_SET",
    "NUM_TEST_SET",
];

/// The largest NUM_NODE, NUM_EDGE and NUM_NODE x FEAT_DIM accepted (2^58): arrays of that
/// many 8-byte entries plus one still have a byte size below 2^63.
pub const MAX_ELEMENTS: u64 = 1 << 58;

/// The largest NUM_CLASS accepted (2^24): the output layer has NUM_CLASS columns, and labels
/// beyond this are far past any classification dataset.
pub const MAX_CLASSES: u64 = 1 << 24;

/// fanout's optional keys (besides `CHECKSUM_<FILE>`).
pub const OPTIONAL_KEYS: [&str; 2] = ["LAYOUT", "FEAT_DTYPE"];

/// Maps a data file name to its checksum key: `train_set.bin` -> `CHECKSUM_TRAIN_SET`.
pub fn checksum_key(file: &str) -> String {
    let stem = file.strip_suffix(".bin").unwrap_or(file);
    format!("CHECKSUM_{}", stem.to_ascii_uppercase())
}

/// Inverse of [`checksum_key`]: `CHECKSUM_TRAIN_SET` -> `train_set.bin`.
pub fn checksum_file(key: &str) -> Option<String> {
    let stem = key.strip_prefix("CHECKSUM_")?;
    if stem.is_empty() {
        return None;
    }
    Some(format!("{}.bin", stem.to_ascii_lowercase()))
}

impl Meta {
    /// Reads and validates `path` (a `meta.txt`). Errors name the line and the key.
    pub fn read(path: &Path) -> Result<Meta> {
        let text = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
        let text = String::from_utf8(text)
            .map_err(|e| Error::format(path, format!("not UTF-8 text ({e})")))?;
        Meta::parse(&text, path)
    }

    /// Parses meta.txt content; `path` is used in error messages only.
    pub fn parse(text: &str, path: &Path) -> Result<Meta> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut m = Meta::default();
        let mut required = [None::<u64>; 7];
        for (i, raw) in text.lines().enumerate() {
            let lineno = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let key = parts.next().unwrap_or_default();
            let value = parts.next().ok_or_else(|| {
                Error::format(
                    path,
                    format!("line {lineno}: key {key} has no value (expected KEY<tab>VALUE)"),
                )
            })?;
            if let Some(extra) = parts.next() {
                return Err(Error::format(
                    path,
                    format!("line {lineno}: key {key} has more than one value ({extra:?} after {value:?})"),
                ));
            }
            if let Some(prev) = seen.insert(key.to_string(), lineno) {
                return Err(Error::format(
                    path,
                    format!("line {lineno}: key {key} repeats line {prev}"),
                ));
            }
            let int = |v: &str| -> Result<u64> {
                v.parse::<u64>().map_err(|_| {
                    Error::format(
                        path,
                        format!("line {lineno}: {key} = {v:?}, expected a non-negative integer"),
                    )
                })
            };
            if let Some(idx) = REQUIRED_KEYS.iter().position(|k| *k == key) {
                required[idx] = Some(int(value)?);
            } else if key == "LAYOUT" {
                m.layout = value
                    .parse()
                    .map_err(|e| Error::format(path, format!("line {lineno}: LAYOUT: {e}")))?;
            } else if key == "FEAT_DTYPE" {
                m.feat_dtype = value
                    .parse()
                    .map_err(|e| Error::format(path, format!("line {lineno}: FEAT_DTYPE: {e}")))?;
            } else if let Some(file) = checksum_file(key) {
                let ok = value
                    .strip_prefix("xxh3:")
                    .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()));
                if !ok {
                    return Err(Error::format(
                        path,
                        format!("line {lineno}: {key} = {value:?}, expected xxh3:<16 hex digits>"),
                    ));
                }
                m.checksums.insert(file, value.to_string());
            } else {
                return Err(Error::format(
                    path,
                    format!(
                        "line {lineno}: unknown key {key:?}; known keys are {}, {} and CHECKSUM_<FILE>",
                        REQUIRED_KEYS.join(", "),
                        OPTIONAL_KEYS.join(", ")
                    ),
                ));
            }
        }
        let missing: Vec<&str> = REQUIRED_KEYS
            .iter()
            .zip(required.iter())
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            return Err(Error::format(
                path,
                format!("missing required key(s) {}", missing.join(", ")),
            ));
        }
        let r: Vec<u64> = required.iter().map(|v| v.unwrap()).collect();
        (
            m.num_node,
            m.num_edge,
            m.feat_dim,
            m.num_class,
            m.num_train_set,
            m.num_valid_set,
            m.num_test_set,
        ) = (r[0], r[1], r[2], r[3], r[4], r[5], r[6]);
        m.check_sizes(path)?;
        Ok(m)
    }

    /// Checks that the sizes can describe arrays this machine can address, before any of them is
    /// used in arithmetic: NUM_NODE and NUM_EDGE at most [`MAX_ELEMENTS`] (so `NUM_NODE + 1`
    /// offsets of 8 bytes cannot overflow), NUM_NODE x FEAT_DIM feature values at most
    /// [`MAX_ELEMENTS`], NUM_CLASS at most [`MAX_CLASSES`], and no split longer than NUM_NODE
    /// (a split lists each vertex once). The error names `path`, the key, its value and the limit.
    pub fn check_sizes(&self, path: &Path) -> Result<()> {
        let too_big = |key: &str, v: u64, why: String| {
            Err(Error::format(
                path,
                format!("{key} = {v} is too large: {why}"),
            ))
        };
        for (key, v) in [("NUM_NODE", self.num_node), ("NUM_EDGE", self.num_edge)] {
            if v > MAX_ELEMENTS {
                return too_big(
                    key,
                    v,
                    format!("expected at most {MAX_ELEMENTS} (2^58, the most 8-byte entries a file can address)"),
                );
            }
        }
        if !matches!(self.num_node.checked_mul(self.feat_dim), Some(x) if x <= MAX_ELEMENTS) {
            return too_big(
                "FEAT_DIM",
                self.feat_dim,
                format!(
                    "NUM_NODE ({}) x FEAT_DIM values exceed {MAX_ELEMENTS} (2^58)",
                    self.num_node
                ),
            );
        }
        if self.num_class > MAX_CLASSES {
            return too_big(
                "NUM_CLASS",
                self.num_class,
                format!(
                    "expected at most {MAX_CLASSES} (2^24; the output layer has NUM_CLASS columns)"
                ),
            );
        }
        for (key, v) in [
            ("NUM_TRAIN_SET", self.num_train_set),
            ("NUM_VALID_SET", self.num_valid_set),
            ("NUM_TEST_SET", self.num_test_set),
        ] {
            if v > self.num_node {
                return too_big(
                    key,
                    v,
                    format!(
                        "expected at most NUM_NODE = {} (a split lists each vertex once)",
                        self.num_node
                    ),
                );
            }
        }
        Ok(())
    }

    /// The meta.txt text for this value (required keys first, then fanout's keys).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let vals = [
            self.num_node,
            self.num_edge,
            self.feat_dim,
            self.num_class,
            self.num_train_set,
            self.num_valid_set,
            self.num_test_set,
        ];
        for (k, v) in REQUIRED_KEYS.iter().zip(vals) {
            let _ = writeln!(s, "{k}\t{v}");
        }
        let _ = writeln!(s, "LAYOUT\t{}", self.layout.as_str());
        let _ = writeln!(s, "FEAT_DTYPE\t{}", self.feat_dtype.as_str());
        for (file, sum) in &self.checksums {
            let _ = writeln!(s, "{}\t{sum}", checksum_key(file));
        }
        s
    }

    /// True when ids need 64 bits (`indices64.bin`).
    pub fn wide_ids(&self) -> bool {
        self.num_node >= 1 << 32
    }

    /// True when edge offsets need 64 bits (`indptr64.bin`).
    pub fn wide_offsets(&self) -> bool {
        self.num_edge >= 1 << 32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("meta.txt")
    }

    const GNNLAB: &str = "NUM_NODE\t2708\nNUM_EDGE\t10556\nFEAT_DIM\t1433\nNUM_CLASS\t7\nNUM_TRAIN_SET\t140\nNUM_VALID_SET\t500\nNUM_TEST_SET\t1000\n";

    #[test]
    fn gnnlab_seven_keys_parse_with_defaults() {
        let m = Meta::parse(GNNLAB, p()).unwrap();
        assert_eq!(m.num_node, 2708);
        assert_eq!(m.num_test_set, 1000);
        assert_eq!(m.layout, Layout::Csc);
        assert_eq!(m.feat_dtype, FeatDtype::F32);
        // Spaces instead of tabs, as some converters write.
        let spaced = GNNLAB.replace('\t', "    ");
        assert_eq!(Meta::parse(&spaced, p()).unwrap(), m);
    }

    #[test]
    fn round_trip_with_options_and_checksums() {
        let mut m = Meta::parse(GNNLAB, p()).unwrap();
        m.layout = Layout::Csr;
        m.feat_dtype = FeatDtype::F16;
        m.checksums
            .insert("train_set.bin".into(), "xxh3:0123456789abcdef".into());
        assert_eq!(Meta::parse(&m.to_text(), p()).unwrap(), m);
        assert!(m
            .to_text()
            .contains("CHECKSUM_TRAIN_SET\txxh3:0123456789abcdef"));
    }

    #[test]
    fn errors_name_line_and_key() {
        let e = Meta::parse(&format!("{GNNLAB}NUM_EDGES\t5\n"), p()).unwrap_err();
        assert!(
            e.to_string().contains("line 8: unknown key \"NUM_EDGES\""),
            "{e}"
        );
        let e = Meta::parse(&GNNLAB.replace("10556", "-3"), p()).unwrap_err();
        assert!(e.to_string().contains("line 2: NUM_EDGE = \"-3\""), "{e}");
        let e = Meta::parse(&GNNLAB.replace("NUM_CLASS\t7\n", ""), p()).unwrap_err();
        assert!(
            e.to_string().contains("missing required key(s) NUM_CLASS"),
            "{e}"
        );
        let e = Meta::parse(&format!("{GNNLAB}NUM_NODE\t1\n"), p()).unwrap_err();
        assert!(e.to_string().contains("repeats line 1"), "{e}");
        let e = Meta::parse(&format!("{GNNLAB}LAYOUT\tcoo\n"), p()).unwrap_err();
        assert!(e.to_string().contains("expected csc or csr"), "{e}");
        let e = Meta::parse(&format!("{GNNLAB}CHECKSUM_FEAT\tmd5:ab\n"), p()).unwrap_err();
        assert!(e.to_string().contains("expected xxh3:"), "{e}");
    }

    #[test]
    fn sizes_beyond_what_arrays_can_address_are_refused_naming_the_key() {
        let max = u64::MAX.to_string();
        for (from, to, needle) in [
            (
                "NUM_NODE\t2708",
                format!("NUM_NODE\t{max}"),
                "NUM_NODE = 18446744073709551615 is too large",
            ),
            (
                "NUM_EDGE\t10556",
                format!("NUM_EDGE\t{}", MAX_ELEMENTS + 1),
                "NUM_EDGE = 288230376151711745 is too large",
            ),
            (
                "FEAT_DIM\t1433",
                format!("FEAT_DIM\t{}", 1u64 << 50),
                "NUM_NODE (2708) x FEAT_DIM values exceed",
            ),
            (
                "FEAT_DIM\t1433",
                format!("FEAT_DIM\t{max}"),
                "FEAT_DIM = 18446744073709551615",
            ),
            (
                "NUM_CLASS\t7",
                format!("NUM_CLASS\t{}", MAX_CLASSES + 1),
                "NUM_CLASS = 16777217 is too large",
            ),
            (
                "NUM_TEST_SET\t1000",
                "NUM_TEST_SET\t2709".to_string(),
                "expected at most NUM_NODE = 2708",
            ),
        ] {
            let text = GNNLAB.replace(from, &to);
            assert_ne!(text, GNNLAB);
            let e = Meta::parse(&text, p()).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
            assert!(e.starts_with("meta.txt: "), "{e}");
        }
        // The limits themselves are accepted.
        let at = GNNLAB
            .replace("NUM_CLASS\t7", &format!("NUM_CLASS\t{MAX_CLASSES}"))
            .replace("NUM_TEST_SET\t1000", "NUM_TEST_SET\t2708");
        Meta::parse(&at, p()).unwrap();
    }
}
