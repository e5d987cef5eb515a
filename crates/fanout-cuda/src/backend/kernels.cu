// fanout's CUDA kernels: the element-wise, row, graph, loss and optimiser operations of the
// `Backend` trait (dense products go to cuBLAS). Compiled at run time by NVRTC, once per process
// and device, with `--fmad=false` so that products and sums round as the CPU backend's do
// (which never contracts a multiply and an add); where a kernel sums sequentially in the same
// order as the CPU (spmm and its transpose, per-edge sums, the optimisers), its result is the
// CPU's bit for bit. Warp reductions (row norms) sum in another order, and `expf` may differ
// from Rust's `exp` in the last bit.
//
// Conventions: tensors are row-major f32; `n` counts elements (64-bit); loops are grid-stride,
// so any grid size is correct. Blocks (message-flow graphs) are destination-major CSR:
// `indptr[d]..indptr[d+1]` are the edges into destination d, `indices[e]` the local source of
// edge e, `edst[e]` its destination; the transposed side lists, per source s,
// `tptr[s]..tptr[s+1]` with `tdst` (destination) and `teid` (edge id) in edge order.

typedef long long i64;
typedef unsigned int u32;
typedef unsigned long long u64;

#define GRID_STRIDE(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

// ----- element-wise -----

extern "C" __global__ void add_bias(float* x, const float* b, i64 n, int cols) {
  GRID_STRIDE(i, n) { x[i] = x[i] + b[i % cols]; }
}

extern "C" __global__ void axpy(float alpha, const float* x, float* y, i64 n) {
  GRID_STRIDE(i, n) { y[i] = y[i] + alpha * x[i]; }
}

extern "C" __global__ void scale(float* x, float alpha, i64 n) {
  GRID_STRIDE(i, n) { x[i] = alpha * x[i]; }
}

// The sum of a device group (backend/group.rs): `slots` holds `size` vectors of `n` elements
// one after the other (rank r's at r * n); out[i] = scale * (((slots_0[i] + slots_1[i]) +
// slots_2[i]) + ... + slots_{size-1}[i]), the adds in rank order and the product after them,
// as the host communicators sum and the trainer scales.
extern "C" __global__ void sum_slots(const float* slots, float* out, float scale, i64 n, int size) {
  GRID_STRIDE(i, n) {
    float acc = slots[i];
    for (int r = 1; r < size; ++r) acc = acc + slots[(i64)r * n + i];
    out[i] = scale * acc;
  }
}

extern "C" __global__ void mul(const float* a, const float* b, float* out, i64 n) {
  GRID_STRIDE(i, n) { out[i] = a[i] * b[i]; }
}

extern "C" __global__ void relu(const float* x, float* out, i64 n) {
  GRID_STRIDE(i, n) { out[i] = fmaxf(x[i], 0.0f); }
}

extern "C" __global__ void relu_backward(const float* g, const float* out, float* o, i64 n) {
  GRID_STRIDE(i, n) { o[i] = out[i] > 0.0f ? g[i] : 0.0f; }
}

extern "C" __global__ void leaky_relu(const float* x, float* out, float slope, i64 n) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    out[i] = v > 0.0f ? v : slope * v;
  }
}

extern "C" __global__ void leaky_relu_backward(const float* g, const float* x, float* out,
                                               float slope, i64 n) {
  GRID_STRIDE(i, n) { out[i] = x[i] > 0.0f ? g[i] : slope * g[i]; }
}

// ----- fanout_rand's keyed streams (also used by sample.cu) -----

__device__ __forceinline__ u64 rotl64(u64 x, int k) { return (x << k) | (x >> (64 - k)); }

__device__ __forceinline__ u64 splitmix64(u64* state) {
  *state += 0x9E3779B97F4A7C15ull;
  u64 z = *state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// fanout_rand::mix_keys(&[a, b]).
__device__ __forceinline__ u64 mix_keys2(u64 a, u64 b) {
  u64 state = 0x6A09E667F3BCC908ull ^ 2ull;
  u64 acc = splitmix64(&state);
  state ^= a * 0x9E3779B97F4A7C15ull;
  acc ^= splitmix64(&state);
  acc = rotl64(acc, 23) * 0xD6E8FEB86659FD93ull;
  state ^= b * 0x9E3779B97F4A7C15ull;
  acc ^= splitmix64(&state);
  acc = rotl64(acc, 23) * 0xD6E8FEB86659FD93ull;
  return acc;
}

// ----- dropout and the fused epilogue -----

// seeds[r] = mix_keys([key, id]) with id = ids[r], or r when ids is null: each row's dropout seed,
// as the CPU backend computes it.
extern "C" __global__ void dropout_seeds(const u32* ids, u64 key, i64 rows, u64* seeds) {
  GRID_STRIDE(r, rows) { seeds[r] = mix_keys2(key, ids ? (u64)ids[r] : (u64)r); }
}

// C. Wellons' lowbias32, as fanout_rand::lowbias32.
__device__ __forceinline__ u32 lowbias32(u32 v) {
  v ^= v >> 16;
  v *= 0x7feb352du;
  v ^= v >> 15;
  v *= 0x846ca68bu;
  return v ^ (v >> 16);
}

// The mask value of element (r, c): `keep` or 0. `seeds[r]` is mix_keys([key, id]) of row r.
__device__ __forceinline__ float drop_mask(const u64* seeds, i64 r, int c, u32 thr, float keep) {
  u64 s = seeds[r];
  u32 lo = (u32)s, hi = (u32)(s >> 32);
  u32 d = lowbias32(lowbias32(lo + (u32)c) ^ hi);
  return keep * (float)(d >= thr ? 1u : 0u);
}

extern "C" __global__ void dropout(const float* x, const u64* seeds, u32 thr, float keep,
                                   float* out, float* mask, i64 n, int cols) {
  GRID_STRIDE(i, n) {
    float m = drop_mask(seeds, i / cols, (int)(i % cols), thr, keep);
    mask[i] = m;
    out[i] = x[i] * m;
  }
}

// x <- drop(act(x + bias)); factor (when not null) gets the gradient factor. `bias` and
// `seeds` may be null (no bias, no dropout).
extern "C" __global__ void epilogue(float* x, const float* bias, int relu_on, const u64* seeds,
                                    u32 thr, float keep, float* factor, i64 n, int cols) {
  GRID_STRIDE(i, n) {
    int c = (int)(i % cols);
    float z = bias ? x[i] + bias[c] : x[i];
    float a = relu_on ? fmaxf(z, 0.0f) : z;
    float m = seeds ? drop_mask(seeds, i / cols, c, thr, keep) : 1.0f;
    x[i] = seeds ? a * m : a;
    if (factor) factor[i] = (!relu_on || z > 0.0f) ? m : 0.0f;
  }
}

// ----- reductions -----

// Column sums of a rows x cols matrix in chunks of `chunk` rows: out[k * cols + c] is the sum
// of rows k*chunk .. (k+1)*chunk of column c. Applied until one row is left.
extern "C" __global__ void col_sum_chunks(const float* x, float* out, i64 rows, int cols,
                                          int chunk) {
  i64 chunks = (rows + chunk - 1) / chunk;
  GRID_STRIDE(i, chunks * cols) {
    i64 k = i / cols;
    int c = (int)(i % cols);
    i64 end = (k + 1) * chunk < rows ? (k + 1) * chunk : rows;
    float s = 0.0f;
    for (i64 r = k * chunk; r < end; r++) s += x[r * cols + c];
    out[i] = s;
  }
}

// y[i] += (1 + s[0]) * x[i]: axpy with alpha = 1 + s read on the device (GIN's eps).
extern "C" __global__ void axpy_one_plus(const float* s, const float* x, float* y, i64 n) {
  float alpha = 1.0f + s[0];
  GRID_STRIDE(i, n) { y[i] = y[i] + alpha * x[i]; }
}

// One thread: y[0] += (float)(the partials summed in order from -0.0), as the host adds
// dot_partials' sums (Rust's f64 `sum`) and axpy adds the result with alpha = 1.
extern "C" __global__ void add_partials(const double* partial, int blocks, float* y) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double t = -0.0;
  for (int k = 0; k < blocks; k++) t += partial[k];
  float d = (float)t;
  y[0] = y[0] + 1.0f * d;
}

// Per-block partial sums of a[i] * b[i] in double; `partial` has gridDim.x entries (blockDim.x
// must be 256). The host adds the partials in order.
extern "C" __global__ void dot_partials(const float* a, const float* b, double* partial, i64 n) {
  __shared__ double buf[256];
  double s = 0.0;
  GRID_STRIDE(i, n) { s += (double)a[i] * (double)b[i]; }
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = buf[0];
}

// ----- rows: L2 normalisation (one warp per row) -----

extern "C" __global__ void l2_norms(const float* x, float* norms, i64 rows, int cols) {
  i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
  for (i64 r = warp; r < rows; r += warps) {
    double s = 0.0;
    for (int c = lane; c < cols; c += 32) {
      double v = (double)x[r * cols + c];
      s += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) norms[r] = s > 0.0 ? (float)sqrt(s) : 1.0f;
  }
}

extern "C" __global__ void div_rows(const float* x, const float* norms, float* y, i64 n,
                                    int cols) {
  GRID_STRIDE(i, n) {
    float inv = 1.0f / norms[i / cols];
    y[i] = x[i] * inv;
  }
}

extern "C" __global__ void l2_backward(const float* g, const float* y, const float* norms,
                                       float* out, i64 rows, int cols) {
  i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
  for (i64 r = warp; r < rows; r += warps) {
    float p = 0.0f;
    for (int c = lane; c < cols; c += 32) p += g[r * cols + c] * y[r * cols + c];
    for (int o = 16; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffffu, p, o);
    float inv = 1.0f / norms[r];
    for (int c = lane; c < cols; c += 32) {
      i64 i = r * cols + c;
      out[i] = (g[i] - y[i] * p) * inv;
    }
  }
}

// ----- heads -----

// out[n, h] = sum_f x[n, h*F + f] * a[h, f]
// With `vec` (F a multiple of 4, x and a 16-byte aligned), each thread reads its segments 16
// bytes at a time; the products are summed in the same order either way.
extern "C" __global__ void head_dot(const float* x, const float* a, float* out, i64 rows,
                                    int heads, int f, int vec) {
  GRID_STRIDE(i, rows * heads) {
    i64 r = i / heads;
    int h = (int)(i % heads);
    const float* xr = x + r * heads * f + h * f;
    const float* ar = a + h * f;
    float s = 0.0f;
    if (vec) {
      const float4* x4 = (const float4*)xr;
      const float4* a4 = (const float4*)ar;
      for (int k = 0; k < (f >> 2); k++) {
        float4 u = x4[k], w = a4[k];
        s += u.x * w.x;
        s += u.y * w.y;
        s += u.z * w.z;
        s += u.w * w.w;
      }
    } else {
      for (int k = 0; k < f; k++) s += xr[k] * ar[k];
    }
    out[i] = s;
  }
}

// out[n, j] = g[n, j / F] * v[j] where v is `x` (per-row, `v_row_stride` = cols) or `a`
// (shared, stride 0); with `acc`, adds into out instead of writing.
extern "C" __global__ void head_scale(const float* g, const float* v, i64 v_row_stride,
                                      float* out, i64 rows, int heads, int f, int acc) {
  i64 cols = (i64)heads * f;
  GRID_STRIDE(i, rows * cols) {
    i64 r = i / cols;
    int j = (int)(i % cols);
    float p = g[r * heads + j / f] * v[r * v_row_stride + j];
    out[i] = acc ? out[i] + p : p;
  }
}

extern "C" __global__ void head_mean(const float* x, float* out, i64 rows, int heads, int f,
                                     float inv) {
  GRID_STRIDE(i, rows * f) {
    i64 r = i / f;
    int k = (int)(i % f);
    float s = 0.0f;
    for (int h = 0; h < heads; h++) s = s + inv * x[r * heads * f + h * f + k];
    out[i] = s;
  }
}

extern "C" __global__ void head_mean_backward(const float* g, float* out, i64 rows, int heads,
                                              int f, float inv) {
  i64 cols = (i64)heads * f;
  GRID_STRIDE(i, rows * cols) {
    i64 r = i / cols;
    int k = (int)(i % cols) % f;
    out[i] = g[r * f + k] * inv;
  }
}

// ----- blocks -----

extern "C" __global__ void edge_dst(const u32* indptr, u32* edst, i64 dsts) {
  GRID_STRIDE(d, dsts) {
    for (u32 e = indptr[d]; e < indptr[d + 1]; e++) edst[e] = (u32)d;
  }
}

// counts[s] += number of edges leaving source s (integer atomics: the result is exact).
extern "C" __global__ void count_sources(const u32* indices, u32* counts, i64 edges) {
  GRID_STRIDE(e, edges) { atomicAdd(&counts[indices[e]], 1u); }
}

// kind 0: mean, 1: weighted (w may be null), 2: weighted mean, 3: GCN both (outdeg = edges
// leaving each source, from count_sources).
extern "C" __global__ void edge_coefficients(const u32* indptr, const u32* indices,
                                             const float* w, const u32* outdeg, int kind,
                                             float* out, i64 dsts) {
  GRID_STRIDE(d, dsts) {
    u32 b = indptr[d], e_end = indptr[d + 1];
    u32 deg = e_end - b;
    if (kind == 0) {
      float v = 1.0f / (float)(deg > 0 ? deg : 1);
      for (u32 e = b; e < e_end; e++) out[e] = v;
    } else if (kind == 1) {
      for (u32 e = b; e < e_end; e++) out[e] = w ? w[e] : 1.0f;
    } else if (kind == 2) {
      float total = 0.0f;
      for (u32 e = b; e < e_end; e++) total += w ? w[e] : 1.0f;
      float denom = fmaxf(total, 1.0f);
      for (u32 e = b; e < e_end; e++) out[e] = (w ? w[e] : 1.0f) / denom;
    } else {
      double din = (double)(deg > 0 ? deg : 1);
      for (u32 e = b; e < e_end; e++) {
        u32 s = indices[e];
        u32 od = outdeg[s];
        double dout = (double)(od > 0 ? od : 1);
        out[e] = (float)(1.0 / sqrt(dout * din));
      }
    }
  }
}

// out[d, j] = sum over edges e into d of coeff[e, j / F] * x[src(e), j] (coeff null = 1).
extern "C" __global__ void spmm(const u32* indptr, const u32* indices, const float* coeff,
                                int heads, const float* x, float* out, i64 dsts, int cols) {
  int f = cols / heads;
  GRID_STRIDE(i, dsts * cols) {
    i64 d = i / cols;
    int j = (int)(i % cols);
    int h = j / f;
    float acc = 0.0f;
    for (u32 e = indptr[d]; e < indptr[d + 1]; e++) {
      float v = x[(i64)indices[e] * cols + j];
      acc = acc + (coeff ? coeff[(i64)e * heads + h] * v : v);
    }
    out[i] = acc;
  }
}

// dx[s, j] = sum over edges e out of s (edge order) of coeff[e, j / F] * g[dst(e), j].
extern "C" __global__ void spmm_t(const u32* tptr, const u32* tdst, const u32* teid,
                                  const float* coeff, int heads, const float* g, float* out,
                                  i64 srcs, int cols) {
  int f = cols / heads;
  GRID_STRIDE(i, srcs * cols) {
    i64 s = i / cols;
    int j = (int)(i % cols);
    int h = j / f;
    float acc = 0.0f;
    for (u32 k = tptr[s]; k < tptr[s + 1]; k++) {
      float v = g[(i64)tdst[k] * cols + j];
      acc = acc + (coeff ? coeff[(i64)teid[k] * heads + h] * v : v);
    }
    out[i] = acc;
  }
}

// FastGL's Memory-Aware aggregation (section 4.2): out[r, j] = sum over k in ptr[r]..ptr[r+1] of
// coeff[id(k), j / F] * x[nbr[k], j], with id(k) = eid[k] (or k when eid is null) and coeff null
// = 1. The forward pass calls it with the block's CSR (eid null), the backward pass with its
// transpose, so it computes what `spmm` and `spmm_t` compute, in the same order per output
// element (bit for bit). The layout is the paper's: a thread block of MA_WARPS warps holds
// MA_WARPS rows (X = 8 targets); each warp walks its row's edges in chunks of 32, staging the
// chunk's neighbour ids and coefficients in shared memory with one coalesced load per warp
// (instead of every lane reading them from global memory edge by edge), then each lane
// accumulates up to MA_COLS columns, lane + 32 q, over the chunk (the paper's Y = 32 features
// are the warp's 32 lanes; a pass covers 32 x MA_COLS = 256 columns).
// The partial sums live in registers, a faster tier than the shared memory the paper puts
// them in. Shared memory: MA_WARPS x 32 x (1 + heads) words (the launch sets it).
#define MA_WARPS 8
#define MA_COLS 8
extern "C" __global__ void spmm_ma(const u32* ptr, const u32* nbr, const u32* eid,
                                   const float* coeff, int heads, const float* x, float* out,
                                   i64 rows, int cols) {
  extern __shared__ u32 staged[];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  u32* s_nbr = staged + warp * 32 * (1 + heads);
  float* s_c = (float*)(s_nbr + 32);
  int f = cols / heads;
  for (i64 r = (i64)blockIdx.x * MA_WARPS + warp; r < rows; r += (i64)gridDim.x * MA_WARPS) {
    u32 b = ptr[r], end = ptr[r + 1];
    for (int c0 = 0; c0 < cols; c0 += 32 * MA_COLS) {
      float acc[MA_COLS];
      int hq[MA_COLS];
#pragma unroll
      for (int q = 0; q < MA_COLS; q++) {
        acc[q] = 0.0f;
        int j = c0 + lane + 32 * q;
        hq[q] = j < cols ? j / f : 0;
      }
      // 64-bit chunk starts: a u32 start would wrap past 2^32 - 32 edges.
      for (i64 e0 = b; e0 < (i64)end; e0 += 32) {
        i64 left = (i64)end - e0;
        u32 n = left < 32 ? (u32)left : 32u;
        __syncwarp();
        if ((u32)lane < n) {
          u32 k = (u32)(e0 + lane);
          s_nbr[lane] = nbr[k];
          if (coeff) {
            i64 id = eid ? (i64)eid[k] : (i64)k;
            for (int h = 0; h < heads; h++) s_c[lane * heads + h] = coeff[id * heads + h];
          }
        }
        __syncwarp();
        for (u32 k = 0; k < n; k++) {
          const float* xr = x + (i64)s_nbr[k] * cols + c0 + lane;
#pragma unroll
          for (int q = 0; q < MA_COLS; q++) {
            if (c0 + lane + 32 * q < cols) {
              float v = xr[32 * q];
              acc[q] = acc[q] + (coeff ? s_c[k * heads + hq[q]] * v : v);
            }
          }
        }
      }
#pragma unroll
      for (int q = 0; q < MA_COLS; q++) {
        int j = c0 + lane + 32 * q;
        if (j < cols) out[r * cols + j] = acc[q];
      }
    }
  }
}

// spmm_ma with 16-byte reads and writes, for widths that are a multiple of 4 with x and out
// 16-byte aligned: each lane accumulates MA_VECS groups of 4 columns, 4 (lane + 32 q) + 0..3
// (256 columns a pass). Each output element sums the same terms in the same order as spmm_ma.
#define MA_VECS 2
extern "C" __global__ void spmm_ma4(const u32* ptr, const u32* nbr, const u32* eid,
                                    const float* coeff, int heads, const float* x, float* out,
                                    i64 rows, int cols) {
  extern __shared__ u32 staged[];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  u32* s_nbr = staged + warp * 32 * (1 + heads);
  float* s_c = (float*)(s_nbr + 32);
  int f = cols / heads, c4 = cols >> 2;
  const float4* x4 = (const float4*)x;
  float4* out4 = (float4*)out;
  for (i64 r = (i64)blockIdx.x * MA_WARPS + warp; r < rows; r += (i64)gridDim.x * MA_WARPS) {
    u32 b = ptr[r], end = ptr[r + 1];
    for (int v0 = 0; v0 < c4; v0 += 32 * MA_VECS) {
      float4 acc[MA_VECS];
      int hq[MA_VECS][4];
#pragma unroll
      for (int q = 0; q < MA_VECS; q++) {
        acc[q].x = 0.0f;
        acc[q].y = 0.0f;
        acc[q].z = 0.0f;
        acc[q].w = 0.0f;
        int v = v0 + lane + 32 * q;
#pragma unroll
        for (int t = 0; t < 4; t++) hq[q][t] = v < c4 ? (4 * v + t) / f : 0;
      }
      // 64-bit chunk starts: a u32 start would wrap past 2^32 - 32 edges.
      for (i64 e0 = b; e0 < (i64)end; e0 += 32) {
        i64 left = (i64)end - e0;
        u32 n = left < 32 ? (u32)left : 32u;
        __syncwarp();
        if ((u32)lane < n) {
          u32 k = (u32)(e0 + lane);
          s_nbr[lane] = nbr[k];
          if (coeff) {
            i64 id = eid ? (i64)eid[k] : (i64)k;
            for (int h = 0; h < heads; h++) s_c[lane * heads + h] = coeff[id * heads + h];
          }
        }
        __syncwarp();
        for (u32 k = 0; k < n; k++) {
          const float4* xr = x4 + (i64)s_nbr[k] * c4 + v0 + lane;
#pragma unroll
          for (int q = 0; q < MA_VECS; q++) {
            if (v0 + lane + 32 * q < c4) {
              float4 v = xr[32 * q];
              if (coeff) {
                const float* ck = s_c + k * heads;
                acc[q].x = acc[q].x + ck[hq[q][0]] * v.x;
                acc[q].y = acc[q].y + ck[hq[q][1]] * v.y;
                acc[q].z = acc[q].z + ck[hq[q][2]] * v.z;
                acc[q].w = acc[q].w + ck[hq[q][3]] * v.w;
              } else {
                acc[q].x = acc[q].x + v.x;
                acc[q].y = acc[q].y + v.y;
                acc[q].z = acc[q].z + v.z;
                acc[q].w = acc[q].w + v.w;
              }
            }
          }
        }
      }
#pragma unroll
      for (int q = 0; q < MA_VECS; q++) {
        int v = v0 + lane + 32 * q;
        if (v < c4) out4[r * c4 + v] = acc[q];
      }
    }
  }
}

// dcoeff[e, h] = <g[dst(e), head h], x[src(e), head h]>; `vec` as for head_dot.
extern "C" __global__ void spmm_coeff_grad(const u32* indices, const u32* edst, const float* g,
                                           const float* x, float* out, i64 edges, int heads,
                                           int f, int vec) {
  i64 cols = (i64)heads * f;
  GRID_STRIDE(i, edges * heads) {
    i64 e = i / heads;
    int h = (int)(i % heads);
    const float* gr = g + (i64)edst[e] * cols + h * f;
    const float* xr = x + (i64)indices[e] * cols + h * f;
    float s = 0.0f;
    if (vec) {
      const float4* g4 = (const float4*)gr;
      const float4* x4 = (const float4*)xr;
      for (int k = 0; k < (f >> 2); k++) {
        float4 u = g4[k], w = x4[k];
        s += u.x * w.x;
        s += u.y * w.y;
        s += u.z * w.z;
        s += u.w * w.w;
      }
    } else {
      for (int k = 0; k < f; k++) s += gr[k] * xr[k];
    }
    out[i] = s;
  }
}

extern "C" __global__ void u_add_v(const u32* indices, const u32* edst, const float* el,
                                   const float* er, float* out, i64 edges, int heads) {
  GRID_STRIDE(i, edges * heads) {
    i64 e = i / heads;
    int h = (int)(i % heads);
    out[i] = el[(i64)indices[e] * heads + h] + er[(i64)edst[e] * heads + h];
  }
}

extern "C" __global__ void edge_sum_to_dst(const u32* indptr, const float* x, float* out,
                                           i64 dsts, int heads) {
  GRID_STRIDE(i, dsts * heads) {
    i64 d = i / heads;
    int h = (int)(i % heads);
    float s = 0.0f;
    for (u32 e = indptr[d]; e < indptr[d + 1]; e++) s += x[(i64)e * heads + h];
    out[i] = s;
  }
}

extern "C" __global__ void edge_sum_to_src(const u32* tptr, const u32* teid, const float* x,
                                           float* out, i64 srcs, int heads) {
  GRID_STRIDE(i, srcs * heads) {
    i64 s = i / heads;
    int h = (int)(i % heads);
    float acc = 0.0f;
    for (u32 k = tptr[s]; k < tptr[s + 1]; k++) acc += x[(i64)teid[k] * heads + h];
    out[i] = acc;
  }
}

extern "C" __global__ void edge_softmax(const u32* indptr, const float* s, float* out, i64 dsts,
                                        int heads) {
  GRID_STRIDE(i, dsts * heads) {
    i64 d = i / heads;
    int h = (int)(i % heads);
    u32 b = indptr[d], end = indptr[d + 1];
    float m = -__int_as_float(0x7f800000);
    for (u32 e = b; e < end; e++) m = fmaxf(m, s[(i64)e * heads + h]);
    float total = 0.0f;
    for (u32 e = b; e < end; e++) {
      float v = expf(s[(i64)e * heads + h] - m);
      out[(i64)e * heads + h] = v;
      total += v;
    }
    for (u32 e = b; e < end; e++) out[(i64)e * heads + h] /= total;
  }
}

extern "C" __global__ void edge_softmax_backward(const u32* indptr, const float* a,
                                                 const float* g, float* out, i64 dsts,
                                                 int heads) {
  GRID_STRIDE(i, dsts * heads) {
    i64 d = i / heads;
    int h = (int)(i % heads);
    u32 b = indptr[d], end = indptr[d + 1];
    float s = 0.0f;
    for (u32 e = b; e < end; e++) s += a[(i64)e * heads + h] * g[(i64)e * heads + h];
    for (u32 e = b; e < end; e++) {
      i64 k = (i64)e * heads + h;
      out[k] = a[k] * (g[k] - s);
    }
  }
}

// ----- row gathers and scatters -----

extern "C" __global__ void gather_rows(const float* x, const u32* idx, float* out, i64 n,
                                       int cols) {
  GRID_STRIDE(i, n * cols) {
    i64 r = i / cols;
    int c = (int)(i % cols);
    out[i] = x[(i64)idx[r] * cols + c];
  }
}

// out[r, :] = x[idx[r], :], one warp per row (coalesced row copies, 16 bytes a lane when the
// rows and both buffers are 16-byte aligned). An id of `x_rows` or more gives a row of zeros
// (callers that take ids from the host check them first; ids already on the device are not
// checked anywhere else).
extern "C" __global__ void gather_rows_warp(const float* x, i64 x_rows, const u32* idx, float* out,
                                            i64 n, int cols) {
  int lane = threadIdx.x & 31;
  i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
  bool vec = (cols & 3) == 0 && ((u64)x & 15) == 0 && ((u64)out & 15) == 0;
  for (i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < n; r += warps) {
    u32 id = idx[r];
    float* dst = out + r * cols;
    if ((i64)id >= x_rows) {
      for (int c = lane; c < cols; c += 32) dst[c] = 0.0f;
      continue;
    }
    const float* src = x + (i64)id * cols;
    if (vec) {
      const float4* s4 = (const float4*)src;
      float4* d4 = (float4*)dst;
      for (int c = lane; c < (cols >> 2); c += 32) d4[c] = s4[c];
    } else {
      for (int c = lane; c < cols; c += 32) dst[c] = src[c];
    }
  }
}

// y[target[g], :] += sum of x[members[k], :] for k in gptr[g]..gptr[g+1], in that order.
extern "C" __global__ void scatter_add_groups(const u32* target, const u32* gptr,
                                              const u32* members, const float* x, float* y,
                                              i64 groups, int cols) {
  GRID_STRIDE(i, groups * cols) {
    i64 g = i / cols;
    int c = (int)(i % cols);
    float acc = y[(i64)target[g] * cols + c];
    for (u32 k = gptr[g]; k < gptr[g + 1]; k++) acc = acc + x[(i64)members[k] * cols + c];
    y[(i64)target[g] * cols + c] = acc;
  }
}

// *flag = 1 when an element of x is a NaN or an infinity (exponent bits all set). Every thread
// that finds one writes the same value, so the race is harmless.
extern "C" __global__ void any_non_finite(const float* x, i64 n, int* flag) {
  GRID_STRIDE(i, n) {
    if ((__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) *flag = 1;
  }
}

// ----- loss and metrics (one thread per row) -----

extern "C" __global__ void softmax_xent(const float* x, const int* labels, float inv,
                                        float* grad, double* row_loss, i64 rows, int classes) {
  GRID_STRIDE(r, rows) {
    const float* xr = x + r * classes;
    float* g = grad + r * classes;
    int y = labels[r];
    if (y < 0) {
      row_loss[r] = 0.0;
      for (int c = 0; c < classes; c++) g[c] = 0.0f;
      continue;
    }
    float m = -__int_as_float(0x7f800000);
    for (int c = 0; c < classes; c++) m = fmaxf(m, xr[c]);
    double sum = 0.0;
    for (int c = 0; c < classes; c++) sum += exp((double)(xr[c] - m));
    double lse = (double)m + log(sum);
    row_loss[r] = lse - (double)xr[y];
    for (int c = 0; c < classes; c++) g[c] = (float)exp((double)xr[c] - lse) * inv;
    g[y] -= inv;
  }
}

extern "C" __global__ void argmax_hits(const float* x, const int* labels, int* hit, i64 rows,
                                       int classes) {
  GRID_STRIDE(r, rows) {
    const float* xr = x + r * classes;
    int best = 0;
    for (int c = 1; c < classes; c++)
      if (xr[c] > xr[best]) best = c;
    hit[r] = labels[r] >= 0 && best == labels[r];
  }
}

// One thread: out[0] = the row losses summed in row order (from -0.0, as Rust's f64 `sum`),
// out[1] = the hits counted.
// The summed row losses and the hit count, in row order (one thread).
__device__ void sum_figures(const double* row_loss, const int* hit, i64 rows, double* out) {
  double total = -0.0;
  long long hits = 0;
  i64 r = 0;
  // Eight loads issued before their adds (which stay in row order).
  for (; r + 8 <= rows; r += 8) {
    double v[8];
    int h[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      v[j] = row_loss[r + j];
      h[j] = hit[r + j];
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
      total += v[j];
      hits += h[j] != 0;
    }
  }
  for (; r < rows; r++) {
    total += row_loss[r];
    hits += hit[r] != 0;
  }
  out[0] = total;
  out[1] = (double)hits;
}

extern "C" __global__ void step_figures(const double* row_loss, const int* hit, i64 rows,
                                        double* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  sum_figures(row_loss, hit, rows, out);
}

// step_figures left on the device as floats: the mean loss as the host computes it from the
// sums (the f64 quotient rounded to f32) and the hit count (exact below 2^24).
extern "C" __global__ void step_figures_f32(const double* row_loss, const int* hit, i64 rows,
                                            i64 count, float* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double f[2];
  sum_figures(row_loss, hit, rows, f);
  out[0] = (float)(f[0] / (double)count);
  out[1] = (float)f[1];
}

// Marks the gate (1 x (1 + slots) floats) when x holds a NaN or an infinity: gate[0] = 1 and
// gate[1 + slot] one of those values. The gated optimiser kernels skip while gate[0] != 0.
extern "C" __global__ void mark_non_finite(const float* x, i64 n, float* gate, i64 slot) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    if ((__float_as_uint(v) & 0x7f800000u) == 0x7f800000u) {
      gate[0] = 1.0f;
      gate[1 + slot] = v;
    }
  }
}

// ----- optimisers (PyTorch semantics, as the CPU backend) -----

// The optimiser kernels do nothing while gate[0] != 0 (mark_non_finite).
extern "C" __global__ void adam(float* p, const float* g, float* m, float* v, float b1, float b2,
                                float eps, float wd, float step_size, float inv_sqrt_bc2, i64 n,
                                const float* gate) {
  if (gate[0] != 0.0f) return;
  GRID_STRIDE(i, n) {
    float gi = g[i] + wd * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    p[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
  }
}

extern "C" __global__ void sgd(float* p, const float* g, float lr, float wd, i64 n,
                               const float* gate) {
  if (gate[0] != 0.0f) return;
  GRID_STRIDE(i, n) { p[i] -= lr * (g[i] + wd * p[i]); }
}

extern "C" __global__ void sgd_momentum(float* p, const float* g, float* buf, float lr, float mu,
                                        float wd, i64 n, const float* gate) {
  if (gate[0] != 0.0f) return;
  GRID_STRIDE(i, n) {
    buf[i] = mu * buf[i] + g[i] + wd * p[i];
    p[i] -= lr * buf[i];
  }
}
