//! The NumPy `.npy` format: a validating header parser, a memory-mapped reader and a small writer.
//!
//! Hand-written rather than taken from a crate: the `.npy` crates at hand either read the whole
//! array into memory or pull in `ndarray`, while importers memory-map the payload so that an edge
//! list larger than memory is streamed by the page cache. The header is a tiny Python dict
//! literal (`{'descr': '<i8', 'fortran_order': False, 'shape': (2, 10556), }`), which a hundred
//! lines parse and validate completely.

use fanout_graph::{f16, Error, Result};
use memmap2::Mmap;
use std::fs::File;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// Headers larger than this are refused (NumPy itself refuses more than 10000 bytes by default).
const MAX_HEADER: usize = 1 << 16;
/// Nesting limit of the header literal (a valid header nests two levels).
const MAX_DEPTH: usize = 8;

/// Element types the importers accept (NumPy `descr` codes, little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// `i1`
    I8,
    /// `i2`
    I16,
    /// `i4`
    I32,
    /// `i8`
    I64,
    /// `u1`
    U8,
    /// `u2`
    U16,
    /// `u4`
    U32,
    /// `u8`
    U64,
    /// `f2`
    F16,
    /// `f4`
    F32,
    /// `f8`
    F64,
}

impl Dtype {
    /// Parses a NumPy `descr` such as `<i8`. Big-endian and non-numeric types are errors whose
    /// text says what to do.
    fn parse(descr: &str) -> std::result::Result<Dtype, String> {
        let b = descr.as_bytes();
        if b.len() < 3 {
            return Err(format!("unsupported dtype {descr:?}"));
        }
        let (order, code) = (b[0], descr.get(1..).unwrap_or_default());
        let t = match code {
            "i1" => Dtype::I8,
            "i2" => Dtype::I16,
            "i4" => Dtype::I32,
            "i8" => Dtype::I64,
            "u1" => Dtype::U8,
            "u2" => Dtype::U16,
            "u4" => Dtype::U32,
            "u8" => Dtype::U64,
            "f2" => Dtype::F16,
            "f4" => Dtype::F32,
            "f8" => Dtype::F64,
            _ => {
                return Err(format!(
                    "unsupported dtype {descr:?}; expected a little-endian integer or float type (int8..int64, uint8..uint64, float16/32/64)"
                ))
            }
        };
        match order {
            b'<' | b'=' | b'|' => Ok(t),
            b'>' if t.size() == 1 => Ok(t),
            b'>' => Err(format!(
                "big-endian dtype {descr:?} is not supported; save the array with arr.astype('<{code}')"
            )),
            _ => Err(format!("unsupported dtype {descr:?}")),
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }

    /// The NumPy name (`int64`, `float32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
        }
    }

    /// True for float16/32/64.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64)
    }
}

/// A validated, memory-mapped `.npy` file. Guarantees after [`NpyArray::open`]: the header is
/// well formed (magic, version 1-3, `descr`, `fortran_order`, `shape` and nothing else), the
/// dtype is one of [`Dtype`], and the file holds exactly `shape` elements after the header.
pub struct NpyArray {
    path: PathBuf,
    map: Option<Mmap>,
    offset: usize,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
    /// True when the payload is stored column-major.
    pub fortran_order: bool,
    len: usize,
}

impl std::fmt::Debug for NpyArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NpyArray({}, {} {})",
            self.path.display(),
            self.dtype.name(),
            shape_str(&self.shape)
        )
    }
}

/// `(2, 10556)` / `(5,)` as NumPy prints shapes.
pub fn shape_str(shape: &[u64]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => {
            let parts: Vec<String> = shape.iter().map(u64::to_string).collect();
            format!("({})", parts.join(", "))
        }
    }
}

impl NpyArray {
    /// Opens and validates `path`; errors name the file and say what was expected.
    pub fn open(path: &Path) -> Result<NpyArray> {
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let file_len = file
            .metadata()
            .map_err(|e| Error::io(path, "stat", e))?
            .len();
        let bad = |d: String| Error::format(path, d);
        if file_len < 10 {
            return Err(bad(format!(
                "file has {file_len} bytes, too short for a .npy header (truncated, or not a .npy file)"
            )));
        }
        // SAFETY: the input is opened read-only and not modified by fanout; as with any mapped
        // input, the user must not rewrite it during the import.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, "memory-map", e))?;
        let header = parse_header(&map).map_err(bad)?;
        let elems = header
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(header.dtype.size() as u64))
            .ok_or_else(|| {
                bad(format!(
                    "shape {} overflows a file size",
                    shape_str(&header.shape)
                ))
            })?;
        let expected = header.offset as u64 + elems;
        if file_len != expected {
            return Err(bad(format!(
                "file has {file_len} bytes, but its header ({} {}) needs {} + {elems} = {expected}; the file is truncated or damaged",
                header.dtype.name(),
                shape_str(&header.shape),
                header.offset
            )));
        }
        let len = (elems / header.dtype.size() as u64) as usize;
        Ok(NpyArray {
            path: path.to_path_buf(),
            map: Some(map),
            offset: header.offset,
            dtype: header.dtype,
            shape: header.shape,
            fortran_order: header.fortran_order,
            len,
        })
    }

    /// The file this array was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the payload on disk.
    pub fn payload_bytes(&self) -> u64 {
        (self.len * self.dtype.size()) as u64
    }

    /// A short description for messages: `int64 (2, 10556)`.
    pub fn describe(&self) -> String {
        format!("{} {}", self.dtype.name(), shape_str(&self.shape))
    }

    /// Storage index of element `(r, c)` of a 2-D array (C or Fortran order).
    pub fn index2(&self, r: usize, c: usize) -> usize {
        let (rows, cols) = (self.shape[0] as usize, self.shape[1] as usize);
        if self.fortran_order {
            r + c * rows
        } else {
            r * cols + c
        }
    }

    fn raw(&self, start: usize, count: usize) -> &[u8] {
        let w = self.dtype.size();
        let map = self.map.as_deref().unwrap_or(&[]);
        &map[self.offset + start * w..self.offset + (start + count) * w]
    }

    /// Elements `start..start + out.len()` in storage order, as i64. Floats are truncated
    /// toward zero (callers check float inputs with [`NpyArray::read_f64`] first); uint64 values
    /// above `i64::MAX` saturate. Panics if the range is out of bounds.
    pub fn read_i64(&self, start: usize, out: &mut [i64]) {
        let src = self.raw(start, out.len());
        match self.dtype {
            Dtype::I8 => conv(src, out, |b| i8::from_le_bytes(b) as i64),
            Dtype::I16 => conv(src, out, |b| i16::from_le_bytes(b) as i64),
            Dtype::I32 => conv(src, out, |b| i32::from_le_bytes(b) as i64),
            Dtype::I64 => conv(src, out, i64::from_le_bytes),
            Dtype::U8 => conv(src, out, |b| u8::from_le_bytes(b) as i64),
            Dtype::U16 => conv(src, out, |b| u16::from_le_bytes(b) as i64),
            Dtype::U32 => conv(src, out, |b| u32::from_le_bytes(b) as i64),
            Dtype::U64 => conv(src, out, |b| {
                u64::from_le_bytes(b).min(i64::MAX as u64) as i64
            }),
            Dtype::F16 => conv(src, out, |b| f16::from_le_bytes(b).to_f32() as i64),
            Dtype::F32 => conv(src, out, |b| f32::from_le_bytes(b) as i64),
            Dtype::F64 => conv(src, out, |b| f64::from_le_bytes(b) as i64),
        }
    }

    /// Elements `start..start + out.len()` in storage order, as f64 (exact for every dtype but
    /// 64-bit integers above 2^53). Panics if the range is out of bounds.
    pub fn read_f64(&self, start: usize, out: &mut [f64]) {
        let src = self.raw(start, out.len());
        match self.dtype {
            Dtype::F16 => conv(src, out, |b| f16::from_le_bytes(b).to_f64()),
            Dtype::F32 => conv(src, out, |b| f32::from_le_bytes(b) as f64),
            Dtype::F64 => conv(src, out, f64::from_le_bytes),
            _ => {
                let mut tmp = vec![0i64; out.len()];
                self.read_i64(start, &mut tmp);
                out.iter_mut().zip(tmp).for_each(|(o, x)| *o = x as f64);
            }
        }
    }

    /// Elements `start..start + out.len()` in storage order, as f32 (rounded from f64 and
    /// large integers). Panics if the range is out of bounds.
    pub fn read_f32(&self, start: usize, out: &mut [f32]) {
        let src = self.raw(start, out.len());
        match self.dtype {
            Dtype::F16 => conv(src, out, |b| f16::from_le_bytes(b).to_f32()),
            Dtype::F32 => conv(src, out, f32::from_le_bytes),
            _ => {
                let mut tmp = vec![0f64; out.len()];
                self.read_f64(start, &mut tmp);
                out.iter_mut().zip(tmp).for_each(|(o, x)| *o = x as f32);
            }
        }
    }
}

/// Decodes `W`-byte little-endian elements of `src` into `out`.
#[inline]
fn conv<const W: usize, T>(src: &[u8], out: &mut [T], f: impl Fn([u8; W]) -> T) {
    for (o, c) in out.iter_mut().zip(src.chunks_exact(W)) {
        let mut b = [0u8; W];
        b.copy_from_slice(c);
        *o = f(b);
    }
}

struct Header {
    dtype: Dtype,
    fortran_order: bool,
    shape: Vec<u64>,
    /// Where the payload starts.
    offset: usize,
}

fn parse_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    if &bytes[..6] != MAGIC {
        return Err("not a .npy file: it does not start with \\x93NUMPY".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        2 | 3 => return Err("file is truncated inside the .npy header".into()),
        _ => {
            return Err(format!(
                ".npy format version {major}.{minor} is not supported; expected 1.0, 2.0 or 3.0"
            ))
        }
    };
    if len > MAX_HEADER {
        return Err(format!(
            ".npy header claims {len} bytes; at most {MAX_HEADER} are accepted"
        ));
    }
    let end = start + len;
    if bytes.len() < end {
        return Err(format!(
            "file is truncated inside the .npy header ({} bytes, header ends at {end})",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| "the .npy header is not text".to_string())?;
    let mut p = Lexer {
        s: text.as_bytes(),
        i: 0,
    };
    let lit = p.value(0)?;
    p.skip_ws();
    if p.i != p.s.len() {
        return Err(format!(
            "unexpected text after the .npy header dict: {:?}",
            &text[p.i..]
        ));
    }
    let Lit::Dict(entries) = lit else {
        return Err(format!("the .npy header is not a dict: {text:?}"));
    };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    for (k, v) in entries {
        match (k.as_str(), v) {
            ("descr", Lit::Str(s)) => descr = Some(s),
            ("fortran_order", Lit::Bool(b)) => fortran = Some(b),
            ("shape", Lit::Tuple(items)) => {
                let dims: Option<Vec<u64>> = items
                    .into_iter()
                    .map(|x| match x {
                        Lit::Int(d) => Some(d),
                        _ => None,
                    })
                    .collect();
                shape = Some(dims.ok_or("header 'shape' must be a tuple of integers")?);
            }
            ("descr", Lit::List(fields)) => {
                return Err(format!(
                    "structured dtypes ('descr' a list of {} fields) are not supported",
                    fields.len()
                ))
            }
            ("descr", v) => {
                return Err(format!("header key 'descr' has an unexpected value {v:?}"))
            }
            (k @ ("fortran_order" | "shape"), v) => {
                return Err(format!("header key '{k}' has an unexpected value {v:?}"))
            }
            (k, _) => return Err(format!("unexpected key '{k}' in the .npy header")),
        }
    }
    let missing = |k: &str| format!("the .npy header has no '{k}' key: {text:?}");
    let dtype = Dtype::parse(&descr.ok_or_else(|| missing("descr"))?)?;
    Ok(Header {
        dtype,
        fortran_order: fortran.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
        offset: end,
    })
}

/// A value of the header literal.
#[derive(Debug)]
enum Lit {
    Str(String),
    Bool(bool),
    Int(u64),
    Tuple(Vec<Lit>),
    List(Vec<Lit>),
    Dict(Vec<(String, Lit)>),
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }

    fn err<T>(&self, what: &str) -> std::result::Result<T, String> {
        Err(format!(
            "malformed .npy header at byte {}: expected {what}",
            self.i
        ))
    }

    fn value(&mut self, depth: usize) -> std::result::Result<Lit, String> {
        if depth > MAX_DEPTH {
            return self.err("a shallower literal");
        }
        match self.peek() {
            Some(q @ (b'\'' | b'"')) => {
                self.i += 1;
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i] != q {
                    self.i += 1;
                }
                if self.i == self.s.len() {
                    return self.err("a closing quote");
                }
                let s = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                self.i += 1;
                Ok(Lit::Str(s))
            }
            Some(b'{') => {
                self.i += 1;
                let mut out = Vec::new();
                loop {
                    if self.peek() == Some(b'}') {
                        self.i += 1;
                        return Ok(Lit::Dict(out));
                    }
                    let Lit::Str(k) = self.value(depth + 1)? else {
                        return self.err("a string key");
                    };
                    if self.peek() != Some(b':') {
                        return self.err("':'");
                    }
                    self.i += 1;
                    out.push((k, self.value(depth + 1)?));
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {}
                        _ => return self.err("',' or '}'"),
                    }
                }
            }
            Some(open @ (b'(' | b'[')) => {
                let close = if open == b'(' { b')' } else { b']' };
                self.i += 1;
                let mut out = Vec::new();
                loop {
                    if self.peek() == Some(close) {
                        self.i += 1;
                        return Ok(if open == b'(' {
                            Lit::Tuple(out)
                        } else {
                            Lit::List(out)
                        });
                    }
                    out.push(self.value(depth + 1)?);
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(c) if c == close => {}
                        _ => return self.err("',' or a closing bracket"),
                    }
                }
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                    self.i += 1;
                }
                let digits = std::str::from_utf8(&self.s[start..self.i]).unwrap_or_default();
                let v = digits
                    .parse::<u64>()
                    .map_err(|_| format!("header integer {digits} does not fit in 64 bits"))?;
                // Python 2 wrote longs as `3L`.
                if self.s.get(self.i) == Some(&b'L') {
                    self.i += 1;
                }
                Ok(Lit::Int(v))
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i].is_ascii_alphanumeric() {
                    self.i += 1;
                }
                match &self.s[start..self.i] {
                    b"True" => Ok(Lit::Bool(true)),
                    b"False" => Ok(Lit::Bool(false)),
                    _ => {
                        self.i = start;
                        self.err("True, False, a number, a string or a bracket")
                    }
                }
            }
            _ => self.err("a value"),
        }
    }
}

/// Element types [`write_npy`] can write.
pub trait NpyElement: Copy {
    /// The NumPy `descr` (`<i8`, ...).
    const DESCR: &'static str;
    /// Appends the little-endian bytes of `self`.
    fn put(self, out: &mut Vec<u8>);
}

macro_rules! npy_element {
    ($($t:ty => $d:literal),*) => {$(
        impl NpyElement for $t {
            const DESCR: &'static str = $d;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
npy_element!(i8 => "|i1", i16 => "<i2", i32 => "<i4", i64 => "<i8", u8 => "|u1", u16 => "<u2",
    u32 => "<u4", u64 => "<u8", f16 => "<f2", f32 => "<f4", f64 => "<f8");

/// Writes `data` as a version 1.0 `.npy` file of the given `shape` in C (row-major) order, as
/// `numpy.save` does. Fails without writing if `data.len()` is not the product of `shape`.
pub fn write_npy<T: NpyElement>(path: &Path, shape: &[u64], data: &[T]) -> Result<()> {
    write_npy_ordered(path, shape, false, data)
}

/// Like [`write_npy`], but `data` is in Fortran (column-major) order and the header says so,
/// as `numpy.save` writes a transposed view.
pub fn write_npy_fortran<T: NpyElement>(path: &Path, shape: &[u64], data: &[T]) -> Result<()> {
    write_npy_ordered(path, shape, true, data)
}

fn write_npy_ordered<T: NpyElement>(
    path: &Path,
    shape: &[u64],
    fortran: bool,
    data: &[T],
) -> Result<()> {
    let n = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    if n != Some(data.len() as u64) {
        return Err(Error::Invalid(format!(
            "write_npy {}: shape {} does not hold {} elements",
            path.display(),
            shape_str(shape),
            data.len()
        )));
    }
    let order = if fortran { "True" } else { "False" };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': {order}, 'shape': {}, }}",
        T::DESCR,
        shape_str(shape)
    );
    // Pad with spaces so the payload starts on a 64-byte boundary; the header ends in '\n'.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &x in data {
        x.put(&mut out);
    }
    std::fs::write(path, out).map_err(|e| Error::io(path, "write", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_file(dir: &Path, header: &str, payload: &[u8]) -> PathBuf {
        let p = dir.join("x.npy");
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(payload);
        std::fs::write(&p, b).unwrap();
        p
    }

    fn open_err(p: &Path) -> String {
        NpyArray::open(p).unwrap_err().to_string()
    }

    #[test]
    fn round_trip_every_dtype_and_order() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.npy");
        write_npy(&p, &[2, 3], &[1i64, -2, 3, 4, 5, 6]).unwrap();
        let a = NpyArray::open(&p).unwrap();
        assert_eq!(
            (a.dtype, a.shape.clone(), a.fortran_order),
            (Dtype::I64, vec![2, 3], false)
        );
        let mut v = vec![0i64; 6];
        a.read_i64(0, &mut v);
        assert_eq!(v, [1, -2, 3, 4, 5, 6]);
        assert_eq!(a.index2(1, 0), 3);
        // Payload starts 64-byte aligned, as numpy writes it.
        assert_eq!((std::fs::metadata(&p).unwrap().len() - 48) % 64, 0);

        write_npy_fortran(&p, &[2, 3], &[1i32, 4, -2, 5, 3, 6]).unwrap();
        let a = NpyArray::open(&p).unwrap();
        assert!(a.fortran_order);
        let mut v = vec![0i64; 6];
        a.read_i64(0, &mut v);
        let row1: Vec<i64> = (0..3).map(|c| v[a.index2(1, c)]).collect();
        assert_eq!(row1, [4, 5, 6]);

        write_npy(
            &p,
            &[3],
            &[f16::from_f32(0.5), f16::from_f32(-2.0), f16::ZERO],
        )
        .unwrap();
        let mut f = vec![0f32; 3];
        NpyArray::open(&p).unwrap().read_f32(0, &mut f);
        assert_eq!(f, [0.5, -2.0, 0.0]);
        write_npy(&p, &[2], &[1.25f64, 7.0]).unwrap();
        let a = NpyArray::open(&p).unwrap();
        assert_eq!(a.describe(), "float64 (2,)");
        let mut f = vec![0f32; 2];
        a.read_f32(0, &mut f);
        assert_eq!(f, [1.25, 7.0]);
        write_npy(&p, &[2], &[u64::MAX, 3]).unwrap();
        let mut v = vec![0i64; 2];
        NpyArray::open(&p).unwrap().read_i64(0, &mut v);
        assert_eq!(v, [i64::MAX, 3]);
        assert!(write_npy(&p, &[4], &[1u8]).is_err());
    }

    #[test]
    fn python2_and_version2_headers_parse() {
        let d = tempfile::tempdir().unwrap();
        let p = header_file(
            d.path(),
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 1L), }\n",
            &[1, 0, 0, 0, 2, 0, 0, 0],
        );
        assert_eq!(NpyArray::open(&p).unwrap().shape, vec![2, 1]);
        // Version 2.0: 4-byte header length.
        let h = "{\"descr\": \"<u2\", \"fortran_order\": False, \"shape\": ()}\n";
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[2, 0]);
        b.extend_from_slice(&(h.len() as u32).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&[7, 0]);
        std::fs::write(&p, b).unwrap();
        let a = NpyArray::open(&p).unwrap();
        assert_eq!((a.len(), a.dtype), (1, Dtype::U16));
    }

    #[test]
    fn malformed_headers_are_named_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.npy");
        std::fs::write(&p, b"\x93NUMPY").unwrap();
        assert!(open_err(&p).contains("x.npy: file has 6 bytes, too short"));
        std::fs::write(&p, b"PK\x03\x04 not numpy at all").unwrap();
        assert!(open_err(&p).contains("does not start with \\x93NUMPY"));
        std::fs::write(&p, b"\x93NUMPY\x04\x00\x10\x00{}").unwrap();
        assert!(open_err(&p).contains("version 4.0 is not supported"));
        std::fs::write(&p, b"\x93NUMPY\x01\x00\x50\x00{'descr': '<i8'").unwrap();
        assert!(open_err(&p).contains("truncated inside the .npy header"));

        let cases = [
            (
                "{'descr': '>i8', 'fortran_order': False, 'shape': (1,), }",
                "arr.astype('<i8')",
            ),
            (
                "{'descr': '<U8', 'fortran_order': False, 'shape': (1,), }",
                "unsupported dtype \"<U8\"",
            ),
            (
                "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }",
                "structured dtypes",
            ),
            (
                "{'descr': '<i8', 'shape': (1,), }",
                "no 'fortran_order' key",
            ),
            (
                "{'descr': '<i8', 'fortran_order': 0, 'shape': (1,), }",
                "unexpected value",
            ),
            (
                "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), 'x': 1}",
                "unexpected key 'x'",
            ),
            (
                "{'descr': '<i8', 'fortran_order': False, 'shape': ('a',), }",
                "tuple of integers",
            ),
            (
                "{'descr': '<i8', 'fortran_order': Fals, 'shape': (1,), }",
                "expected True, False",
            ),
            (
                "{'descr': '<i8' 'fortran_order': False}",
                "expected ',' or '}'",
            ),
            ("[1, 2]", "is not a dict"),
            ("((((((((((((1))))))))))))", "shallower"),
        ];
        for (h, want) in cases {
            let p = header_file(d.path(), h, &[0; 8]);
            let e = open_err(&p);
            assert!(e.contains(want) && e.contains("x.npy"), "{h}: {e}");
        }
        // Payload shorter and longer than the shape says.
        let h = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }";
        let e = open_err(&header_file(d.path(), h, &[0; 40]));
        assert!(
            e.contains("(2, 3)) needs") && e.contains("truncated"),
            "{e}"
        );
        assert!(NpyArray::open(&header_file(d.path(), h, &[0; 48])).is_ok());
        assert!(open_err(&header_file(d.path(), h, &[0; 56])).contains("damaged"));
        let h = "{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }";
        assert!(open_err(&header_file(d.path(), h, &[])).contains("overflows"));
    }
}
