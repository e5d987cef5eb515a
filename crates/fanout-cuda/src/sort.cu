// fanout's device prefix sums and stable sorts of u32 keys, used by the sampler (sample.cu) and by
// the backend's block transposes. Compiled after kernels.cu in the same NVRTC program (its
// typedefs and GRID_STRIDE are used). Integer only, so every result is exact and deterministic.

// ----- exclusive prefix sum of u32 (three passes over tiles of SCAN_TILE elements) -----
// out[i] = in[0] + ... + in[i-1] for i in 0..=n. Launched with SCAN_THREADS threads per block,
// one block per tile; tile_sums holds one word per tile.

#define SCAN_THREADS 256
#define SCAN_ITEMS 8
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

// Exclusive scan of one value per thread across the block; returns the block's total.
__device__ u32 block_exclusive_scan(u32 x, u32* excl) {
  __shared__ u32 buf[SCAN_THREADS];
  __syncthreads();
  buf[threadIdx.x] = x;
  __syncthreads();
  for (u32 off = 1; off < SCAN_THREADS; off <<= 1) {
    u32 add = threadIdx.x >= off ? buf[threadIdx.x - off] : 0;
    __syncthreads();
    buf[threadIdx.x] += add;
    __syncthreads();
  }
  *excl = buf[threadIdx.x] - x;
  return buf[SCAN_THREADS - 1];
}

extern "C" __global__ void scan_tile_sums(const u32* in, i64 n, u32* tile_sums) {
  i64 start = (i64)blockIdx.x * SCAN_TILE + (i64)threadIdx.x * SCAN_ITEMS;
  u32 s = 0;
  for (int k = 0; k < SCAN_ITEMS; k++)
    if (start + k < n) s += in[start + k];
  u32 excl;
  u32 total = block_exclusive_scan(s, &excl);
  if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

// Exclusive scan of the tile sums in place, by one block (tiles <= SCAN_THREADS * chunk).
extern "C" __global__ void scan_tile_offsets(u32* tile_sums, i64 tiles) {
  i64 chunk = (tiles + SCAN_THREADS - 1) / SCAN_THREADS;
  i64 start = (i64)threadIdx.x * chunk;
  u32 s = 0;
  for (i64 k = start; k < start + chunk && k < tiles; k++) s += tile_sums[k];
  u32 excl;
  block_exclusive_scan(s, &excl);
  for (i64 k = start; k < start + chunk && k < tiles; k++) {
    u32 v = tile_sums[k];
    tile_sums[k] = excl;
    excl += v;
  }
}

extern "C" __global__ void scan_tiles(const u32* in, i64 n, const u32* tile_offsets, u32* out) {
  i64 start = (i64)blockIdx.x * SCAN_TILE + (i64)threadIdx.x * SCAN_ITEMS;
  u32 s = 0;
  for (int k = 0; k < SCAN_ITEMS; k++)
    if (start + k < n) s += in[start + k];
  u32 excl;
  block_exclusive_scan(s, &excl);
  u32 run = tile_offsets[blockIdx.x] + excl;
  for (int k = 0; k < SCAN_ITEMS; k++) {
    if (start + k < n) {
      out[start + k] = run;
      run += in[start + k];
    }
    if (start + k == n) out[n] = run;
  }
}

// ----- stable LSD radix sort of (u32 key, u32 value) pairs, 8 bits a pass -----
// Tiles of RADIX_TILE consecutive pairs, one block of RADIX_THREADS threads each; thread d of a
// tile owns digit d. hist is digit-major: hist[d * tiles + t]. Its exclusive prefix sum gives
// where tile t's pairs of digit d start, and a tile writes each digit's pairs in their order
// in the tile: the pass is stable, so after the passes the pairs are sorted by key and, among
// equal keys, in their original order.

#define RADIX_THREADS 256
#define RADIX_TILE 2048

__device__ int radix_load(const u32* keys, i64 n, u32 shift, u32* digits) {
  i64 start = (i64)blockIdx.x * RADIX_TILE;
  int len = (int)(n - start < RADIX_TILE ? n - start : RADIX_TILE);
  for (int i = threadIdx.x; i < len; i += RADIX_THREADS) digits[i] = (keys[start + i] >> shift) & 255u;
  __syncthreads();
  return len;
}

extern "C" __global__ void radix_hist(const u32* keys, i64 n, u32 shift, u32* hist, i64 tiles) {
  __shared__ u32 digits[RADIX_TILE];
  int len = radix_load(keys, n, shift, digits);
  u32 c = 0;
  for (int i = 0; i < len; i++) c += digits[i] == threadIdx.x ? 1u : 0u;
  hist[(i64)threadIdx.x * tiles + blockIdx.x] = c;
}

// vals may be null: the values are then the pairs' positions 0..n.
extern "C" __global__ void radix_scatter(const u32* keys, const u32* vals, i64 n, u32 shift,
                                         const u32* offs, i64 tiles, u32* keys_out,
                                         u32* vals_out) {
  __shared__ u32 digits[RADIX_TILE];
  int len = radix_load(keys, n, shift, digits);
  i64 start = (i64)blockIdx.x * RADIX_TILE;
  u32 pos = offs[(i64)threadIdx.x * tiles + blockIdx.x];
  for (int i = 0; i < len; i++) {
    if (digits[i] == threadIdx.x) {
      keys_out[pos] = keys[start + i];
      vals_out[pos] = vals ? vals[start + i] : (u32)(start + i);
      pos++;
    }
  }
}

// out[i] = src[idx[i]].
extern "C" __global__ void gather_u32(const u32* src, const u32* idx, u32* out, i64 n) {
  GRID_STRIDE(i, n) { out[i] = src[idx[i]]; }
}
