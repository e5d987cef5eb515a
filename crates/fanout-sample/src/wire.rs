//! A sampled mini-batch as bytes, for sending it to another worker (GNNLab's factored design:
//! sampler workers send topology and ids, never features).
//!
//! The layout is flat little-endian arrays behind a small header, written and read by hand: the
//! batch is a handful of integer arrays whose copy is the whole cost, so a general serialisation
//! crate would add a dependency without saving code or time. [`decode`] checks every length
//! against the bytes it has and then [`MiniBatch::validate`]s the result, so a damaged message
//! is an error, never a panic or an out-of-range id downstream.

use crate::minibatch::{BatchKey, Block, MiniBatch};

const MAGIC: &[u8; 4] = b"FOMB";
const VERSION: u32 = 1;

/// The bytes of `mb` (see [`decode`]). Guarantee: `decode(&encode(mb)) == mb`.
pub fn encode(mb: &MiniBatch) -> Vec<u8> {
    let edges: usize = mb.blocks.iter().map(|b| b.indices.len()).sum();
    let mut out = Vec::with_capacity(64 + 4 * mb.input_nodes.len() + 8 * edges);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    for v in [mb.key.seed, mb.key.epoch, mb.key.step] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    put_len(&mut out, mb.num_seeds);
    put_u32s(&mut out, &mb.input_nodes);
    match &mb.labels {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            put_len(&mut out, l.len());
            for v in l {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    put_len(&mut out, mb.blocks.len());
    for b in &mb.blocks {
        put_len(&mut out, b.num_dst);
        put_len(&mut out, b.num_src);
        put_u32s(&mut out, &b.indptr);
        put_u32s(&mut out, &b.indices);
        match &b.weights {
            None => out.push(0),
            Some(w) => {
                out.push(1);
                put_len(&mut out, w.len());
                for v in w {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
    out
}

/// The mini-batch `bytes` hold. Errors (one line) on a wrong header, a length beyond the
/// bytes, trailing bytes, or a batch that fails [`MiniBatch::validate`].
pub fn decode(bytes: &[u8]) -> Result<MiniBatch, String> {
    let mut r = Reader { b: bytes, at: 0 };
    if r.take(4)? != MAGIC {
        return Err("not a sampled mini-batch (bad magic)".into());
    }
    let version = u32::from_le_bytes(r.array()?);
    if version != VERSION {
        return Err(format!(
            "mini-batch message version {version}, expected {VERSION}"
        ));
    }
    let key = BatchKey {
        seed: r.u64()?,
        epoch: r.u64()?,
        step: r.u64()?,
    };
    let num_seeds = r.len()?;
    let input_nodes = r.u32s()?;
    let labels = match r.flag()? {
        false => None,
        true => {
            let n = r.len()?;
            let raw = r.take(n.checked_mul(8).ok_or("label count overflows")?)?;
            Some(
                raw.chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect(),
            )
        }
    };
    let layers = r.len()?;
    let mut blocks = Vec::with_capacity(layers.min(64));
    for _ in 0..layers {
        let num_dst = r.len()?;
        let num_src = r.len()?;
        let indptr = r.u32s()?;
        let indices = r.u32s()?;
        let weights = match r.flag()? {
            false => None,
            true => {
                let n = r.len()?;
                let raw = r.take(n.checked_mul(4).ok_or("weight count overflows")?)?;
                Some(
                    raw.chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
                        .collect(),
                )
            }
        };
        blocks.push(Block {
            num_dst,
            num_src,
            indptr,
            indices,
            weights,
        });
    }
    if r.at != bytes.len() {
        return Err(format!("{} bytes after the mini-batch", bytes.len() - r.at));
    }
    let mb = MiniBatch {
        resident: Default::default(),
        key,
        num_seeds,
        blocks,
        input_nodes,
        labels,
    };
    if num_seeds > mb.input_nodes.len() || mb.labels.as_ref().is_some_and(|l| l.len() != num_seeds)
    {
        return Err("seed count disagrees with the input nodes or labels".into());
    }
    mb.validate()?;
    if let Some(b) = mb.blocks.first() {
        if b.num_src != mb.input_nodes.len() {
            return Err(format!(
                "the input layer has {} sources but {} input nodes",
                b.num_src,
                mb.input_nodes.len()
            ));
        }
    }
    Ok(mb)
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn put_u32s(out: &mut Vec<u8>, v: &[u32]) {
    put_len(out, v.len());
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                format!(
                    "mini-batch message cut short: {n} bytes wanted at offset {} of {}",
                    self.at,
                    self.b.len()
                )
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn len(&mut self) -> Result<usize, String> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| format!("length {v} does not fit this machine"))
    }
    fn flag(&mut self) -> Result<bool, String> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            f => Err(format!("flag byte {f}, expected 0 or 1")),
        }
    }
    fn u32s(&mut self) -> Result<Vec<u32>, String> {
        let n = self.len()?;
        let raw = self.take(n.checked_mul(4).ok_or("array length overflows")?)?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::random_graph;
    use crate::{KHopConfig, KHopSampler, RemapKind, Sampler};

    fn sampled() -> MiniBatch {
        let ds = random_graph(60, 10, 3);
        let cfg = KHopConfig {
            fanouts: vec![3, 2],
            replace: false,
            remap: RemapKind::default(),
        };
        let s = KHopSampler::new(ds, cfg).unwrap();
        let key = BatchKey {
            seed: 5,
            epoch: 2,
            step: 9,
        };
        s.sample(&[0, 3, 7], key).unwrap()
    }

    #[test]
    fn round_trip_is_exact() {
        let mut mb = sampled();
        assert_eq!(decode(&encode(&mb)).unwrap(), mb);
        mb.blocks[0].weights = Some(
            (0..mb.blocks[0].indices.len())
                .map(|i| i as f32 * 0.5)
                .collect(),
        );
        mb.labels = None;
        assert_eq!(decode(&encode(&mb)).unwrap(), mb);
    }

    #[test]
    fn every_truncation_and_many_corruptions_are_errors() {
        let bytes = encode(&sampled());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "a message cut at {n} decoded");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        // Flipping any byte must never panic; most flips are caught.
        let mut caught = 0;
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xA5;
            caught += usize::from(decode(&b).is_err());
        }
        assert!(
            caught > bytes.len() / 2,
            "only {caught} of {} flips caught",
            bytes.len()
        );
    }
}
