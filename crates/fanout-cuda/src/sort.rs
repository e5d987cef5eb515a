//! Prefix sums and stable sorts of `u32` on the device (the kernels of `sort.cu`), shared by the
//! sampler (block offsets, new local ids) and the backend (block transposes). Each function
//! queues its work on the stream and returns without waiting; a failed allocation or launch
//! returns the CUDA call and the driver's error, for the caller to report its own way.

use crate::backend::kernels::{grid, Kernels};
use cudarc::driver::{CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// A failed CUDA call: its name and the driver's error.
pub(crate) type Failure = (&'static str, DriverError);

/// Threads per block and elements per tile of the prefix sum and of the radix sort (`sort.cu`).
const THREADS: u32 = 256;
const SCAN_TILE: usize = 256 * 8;
const RADIX_TILE: usize = 2048;
/// A null device pointer, for the kernels' optional arguments.
const NULL: u64 = 0;

/// The sorting kernels on one stream.
pub(crate) struct DeviceSort<'a> {
    pub(crate) stream: &'a Arc<CudaStream>,
    pub(crate) kernels: &'a Kernels,
}

/// One block of [`THREADS`] threads per tile.
fn tiles_config(tiles: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (tiles as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches kernel `$name` of `$s` with configuration `$cfg` and arguments `$arg` (references
/// that live past the launch), as a `Result<(), Failure>`.
macro_rules! launch {
    ($s:expr, $name:literal, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let mut b = $s.stream.launch_builder($s.kernels.get($name));
        $( b.arg($arg); )*
        // SAFETY: the arguments match the kernel's parameters in sort.cu in number, order and
        // type, and every buffer holds the elements the kernel indexes for these sizes.
        unsafe { b.launch($cfg) }.map(drop).map_err(|e| (concat!("launch ", $name), e))
    }};
}

impl DeviceSort<'_> {
    /// `len` zeroed elements (at least one: the driver refuses empty allocations).
    pub(crate) fn alloc(&self, len: usize) -> Result<CudaSlice<u32>, Failure> {
        self.stream
            .alloc_zeros(len.max(1))
            .map_err(|e| ("cuMemAlloc", e))
    }

    /// `out[i] = input[0] + ... + input[i - 1]` for `i` in `0..=n` (so `out[n]` is the total),
    /// in `u32`: the caller keeps totals below 2^32.
    pub(crate) fn exclusive_scan(
        &self,
        input: &CudaSlice<u32>,
        n: usize,
    ) -> Result<CudaSlice<u32>, Failure> {
        // One tile more than the full ones, so that out[n] always falls in a tile.
        let tiles = n / SCAN_TILE + 1;
        let mut sums = self.alloc(tiles)?;
        let mut out = self.alloc(n + 1)?;
        let (n64, t64) = (n as i64, tiles as i64);
        launch!(
            self,
            "scan_tile_sums",
            tiles_config(tiles),
            [input, &n64, &mut sums]
        )?;
        launch!(
            self,
            "scan_tile_offsets",
            tiles_config(1),
            [&mut sums, &t64]
        )?;
        launch!(
            self,
            "scan_tiles",
            tiles_config(tiles),
            [input, &n64, &sums, &mut out]
        )?;
        Ok(out)
    }

    /// The first `n` keys sorted, and for each its position in `keys`: a stable sort (equal
    /// keys keep their order), so the positions of each key come out increasing. Keys must
    /// be at most `max_key` (the passes skip the bits above it).
    pub(crate) fn sort_with_positions(
        &self,
        keys: &CudaSlice<u32>,
        n: usize,
        max_key: u32,
    ) -> Result<(CudaSlice<u32>, CudaSlice<u32>), Failure> {
        let (mut k_out, mut v_out) = (self.alloc(n)?, self.alloc(n)?);
        if n == 0 {
            return Ok((k_out, v_out));
        }
        let tiles = n.div_ceil(RADIX_TILE);
        let (n64, t64) = (n as i64, tiles as i64);
        let passes = (32 - max_key.leading_zeros()).div_ceil(8).max(1);
        let mut hist = self.alloc(256 * tiles)?;
        let (mut k_in, mut v_in) = (self.alloc(n)?, self.alloc(n)?);
        for pass in 0..passes {
            let shift = 8 * pass;
            // The first pass reads the caller's keys, and its values are the positions.
            let (src_k, src_v) = if pass == 0 {
                (keys, None)
            } else {
                (&k_in, Some(&v_in))
            };
            launch!(
                self,
                "radix_hist",
                tiles_config(tiles),
                [src_k, &n64, &shift, &mut hist, &t64]
            )?;
            let offs = self.exclusive_scan(&hist, 256 * tiles)?;
            let mut b = self
                .stream
                .launch_builder(self.kernels.get("radix_scatter"));
            b.arg(src_k);
            match src_v {
                Some(v) => b.arg(v),
                None => b.arg(&NULL),
            };
            b.arg(&n64).arg(&shift).arg(&offs).arg(&t64);
            b.arg(&mut k_out).arg(&mut v_out);
            // SAFETY: as in `launch!`: radix_scatter(keys, vals or null, n, shift, offs, tiles,
            // keys_out, vals_out), every buffer of n elements, offs of 256 * tiles + 1.
            unsafe { b.launch(tiles_config(tiles)) }
                .map(drop)
                .map_err(|e| ("launch radix_scatter", e))?;
            if pass + 1 < passes {
                std::mem::swap(&mut k_in, &mut k_out);
                std::mem::swap(&mut v_in, &mut v_out);
            }
        }
        Ok((k_out, v_out))
    }

    /// `out[i] = src[idx[i]]` for `i` in `0..n`.
    pub(crate) fn gather(
        &self,
        src: &CudaSlice<u32>,
        idx: &CudaSlice<u32>,
        n: usize,
    ) -> Result<CudaSlice<u32>, Failure> {
        let mut out = self.alloc(n)?;
        let n64 = n as i64;
        if n > 0 {
            launch!(self, "gather_u32", grid(n), [src, idx, &mut out, &n64])?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CudaBackend, CudaDevice};
    use fanout_rand::Rng;

    /// Prefix sums and sorts against the host on sizes around the tile sizes (0, 1, one tile,
    /// one tile and one, many tiles) and keys of 1 to 32 bits. Skips without a GPU.
    #[test]
    fn scans_and_sorts_are_the_hosts() {
        let dev = match CudaDevice::open(0) {
            Ok(d) => d,
            Err(e) => return eprintln!("skipped: no GPU here ({e})"),
        };
        let be = CudaBackend::new(&dev).unwrap();
        let sort = DeviceSort {
            stream: be.stream(),
            kernels: be.kernels(),
        };
        let mut rng = Rng::new(4);
        for n in [0usize, 1, 7, 2047, 2048, 2049, 4096, 100_003, 1 << 20] {
            let counts: Vec<u32> = (0..n).map(|_| rng.below(50) as u32).collect();
            let dev_counts = be.to_device(&counts).unwrap();
            let got = sort.exclusive_scan(&dev_counts, n).unwrap();
            let mut want = vec![0u32];
            for &c in &counts {
                want.push(want.last().unwrap() + c);
            }
            assert_eq!(be.to_host(&got, n + 1).unwrap(), want, "scan of {n}");
            for bits in [1u32, 8, 9, 17, 24, 25, 32] {
                let max_key = if bits == 32 {
                    u32::MAX
                } else {
                    (1 << bits) - 1
                };
                let keys: Vec<u32> = (0..n).map(|_| (rng.next_u64() as u32) & max_key).collect();
                let (k, v) = sort
                    .sort_with_positions(&be.to_device(&keys).unwrap(), n, max_key)
                    .unwrap();
                let mut order: Vec<u32> = (0..n as u32).collect();
                order.sort_by_key(|&i| keys[i as usize]); // stable
                let sorted: Vec<u32> = order.iter().map(|&i| keys[i as usize]).collect();
                assert_eq!(
                    be.to_host(&k, n).unwrap(),
                    sorted,
                    "keys of {n}, {bits} bits"
                );
                assert_eq!(
                    be.to_host(&v, n).unwrap(),
                    order,
                    "positions of {n}, {bits} bits"
                );
            }
        }
    }
}
