//! Byte-level mutations in the manner of AFL's havoc stage, plus decimal-number swaps for text
//! files: each mutated input differs from its seed in one file, by one to four edits.

use crate::bundle::Bundle;
use fanout_rand::Rng;

/// Integers that sit on boundaries (zero, signs, 2^31, 2^32, 2^63, all ones), written in 1, 2,
/// 4 or 8 little-endian bytes over existing bytes.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    7,
    0x7f,
    0x80,
    0xff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];

/// Decimal strings swapped in for a number in text files.
const NUMBERS: [&str; 14] = [
    "0",
    "-1",
    "1",
    "3",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "1e309",
    "nan",
    "inf",
    "0.5",
    "",
];

/// Bytes that matter to the text formats.
const TEXT_BYTES: &[u8] = b"\n\r\t ,#%-.0123456789eE\x00\xff";

/// A copy of `seed` with one file (chosen at random) mutated.
pub fn mutate_bundle(seed: &Bundle, rng: &mut Rng) -> Bundle {
    let mut b = seed.clone();
    if b.files.is_empty() {
        return b;
    }
    let i = rng.below(b.files.len() as u64) as usize;
    // Now and then a file is removed instead: a missing file must be an error too.
    if rng.below(40) == 0 {
        b.files.remove(i);
        return b;
    }
    let text = is_text(&b.files[i].0);
    let data = &mut b.files[i].1;
    for _ in 0..=rng.below(4) {
        if text && rng.below(3) == 0 {
            swap_number(data, rng);
        } else {
            havoc(data, text, rng);
        }
    }
    b
}

/// Whether a file is text (its edits favour text bytes and numbers).
fn is_text(name: &str) -> bool {
    [".txt", ".csv", ".tsv", ".json"]
        .iter()
        .any(|e| name.ends_with(e))
}

/// One random edit of `d`.
fn havoc(d: &mut Vec<u8>, text: bool, rng: &mut Rng) {
    let len = d.len() as u64;
    let pos = |rng: &mut Rng| rng.below(len.max(1)) as usize;
    match rng.below(8) {
        0 if len > 0 => {
            let p = pos(rng);
            d[p] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let p = pos(rng);
            d[p] = if text {
                TEXT_BYTES[rng.below(TEXT_BYTES.len() as u64) as usize]
            } else {
                rng.next_u32() as u8
            };
        }
        2 if len > 0 => {
            let width = [1usize, 2, 4, 8][rng.below(4) as usize];
            let v = INTERESTING[rng.below(INTERESTING.len() as u64) as usize];
            let v = if rng.below(4) == 0 {
                v.wrapping_neg()
            } else {
                v
            };
            // Aligned to the width most of the time: the arrays are of 4- and 8-byte elements.
            let p = if rng.below(4) == 0 {
                pos(rng)
            } else {
                pos(rng) / width * width
            };
            let bytes = v.to_le_bytes();
            for (k, b) in bytes.iter().take(width).enumerate() {
                if let Some(x) = d.get_mut(p + k) {
                    *x = *b;
                }
            }
        }
        3 => {
            let p = pos(rng).min(d.len());
            let n = 1 + rng.below(8) as usize;
            let ins: Vec<u8> = (0..n)
                .map(|_| {
                    if text {
                        TEXT_BYTES[rng.below(TEXT_BYTES.len() as u64) as usize]
                    } else {
                        rng.next_u32() as u8
                    }
                })
                .collect();
            d.splice(p..p, ins);
        }
        4 if len > 0 => {
            let p = pos(rng);
            let n = (1 + rng.below(16) as usize).min(d.len() - p);
            d.drain(p..p + n);
        }
        5 if len > 0 => {
            // Duplicate a range (repeated lines, repeated entries).
            let p = pos(rng);
            let n = (1 + rng.below(32) as usize).min(d.len() - p);
            let copy = d[p..p + n].to_vec();
            let at = pos(rng).min(d.len());
            d.splice(at..at, copy);
        }
        6 if len > 0 => {
            // Truncate (a file cut short), usually by a few bytes.
            let cut = if rng.below(2) == 0 {
                1 + rng.below(8) as usize
            } else {
                pos(rng)
            };
            d.truncate(d.len().saturating_sub(cut));
        }
        _ => {
            if len > 0 {
                let p = pos(rng);
                d[p] = d[p].wrapping_add(1 + rng.below(35) as u8);
            } else {
                d.push(rng.next_u32() as u8);
            }
        }
    }
}

/// Replaces one decimal number of `d` (a run of digits, with its sign and fraction) by one of
/// [`NUMBERS`].
fn swap_number(d: &mut Vec<u8>, rng: &mut Rng) {
    let starts: Vec<usize> = (0..d.len())
        .filter(|&i| d[i].is_ascii_digit() && (i == 0 || !d[i - 1].is_ascii_digit()))
        .collect();
    if starts.is_empty() {
        return;
    }
    let s = starts[rng.below(starts.len() as u64) as usize];
    let mut e = s;
    while e < d.len() && (d[e].is_ascii_digit() || d[e] == b'.') {
        e += 1;
    }
    let s = if s > 0 && d[s - 1] == b'-' { s - 1 } else { s };
    let n = NUMBERS[rng.below(NUMBERS.len() as u64) as usize];
    d.splice(s..e, n.bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_change_one_file_and_are_deterministic_per_seed() {
        let seed = Bundle {
            files: vec![
                ("a.bin".into(), (0..64u8).collect()),
                ("b.txt".into(), b"1 2\n3 4\n".to_vec()),
            ],
        };
        let (mut r1, mut r2) = (Rng::new(9), Rng::new(9));
        let mut changed = 0;
        for _ in 0..200 {
            let a = mutate_bundle(&seed, &mut r1);
            assert_eq!(a, mutate_bundle(&seed, &mut r2));
            let differing = seed.files.iter().filter(|f| !a.files.contains(f)).count();
            assert!(differing <= 1, "{a:?}");
            changed += differing;
        }
        // Some edits cancel out (a byte set to its own value), but most change the input.
        assert!(changed > 150, "{changed}");
    }

    #[test]
    fn number_swaps_replace_a_whole_number() {
        let mut rng = Rng::new(1);
        for _ in 0..100 {
            let mut d = b"-12 345\n".to_vec();
            swap_number(&mut d, &mut rng);
            let s = String::from_utf8(d).unwrap();
            assert!(
                s.ends_with(" 345\n") || s.starts_with("-12 "),
                "one of the two numbers stays whole: {s:?}"
            );
        }
    }
}
