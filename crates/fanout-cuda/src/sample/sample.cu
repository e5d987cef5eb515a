// fanout's GPU sampling kernels: uniform k-hop sampling with FastGL's Fused-Map remapping.
// Compiled after kernels.cu in the same NVRTC program (its typedefs and GRID_STRIDE are used).
//
// The draws are the CPU sampler's (crates/fanout-sample/src/khop.rs) bit for bit: vertex v's
// stream in a hop is xoshiro256++ seeded through SplitMix64 from mix_keys([base, v]) (fanout-rand;
// splitmix64 and mix_keys2 are in kernels.cu),
// integers below n by Lemire's multiply-and-reject, rows without replacement by Floyd's
// algorithm (a draw t already chosen is replaced by j), so a GPU batch is the CPU batch.
//
// Remapping (Fused-Map, FastGL Alg. 2, on a dense table with one word per graph vertex): a
// word is EMPTY, FIRST | p (p the smallest edge position of the key in this hop), or a local id
// (< 2^31). The sampling kernel lowers each sampled key's word to its edge position with
// atomicMin as it writes the edge (a local id is below every FIRST | p, so it stays); then the
// edges whose position is their key's first are the new vertices, numbered in order of first
// occurrence by a prefix sum: the order a sequential scan gives, whatever the thread timing.

#define FIRST 0x80000000u
#define EMPTY 0xFFFFFFFFu
#define FANOUT_ALL 0xFFFFFFFFu

struct Xoshiro {
  u64 s0, s1, s2, s3;
};

// fanout_rand::Rng::keyed(&[base, v]).
__device__ __forceinline__ Xoshiro vertex_rng(u64 base, u32 v) {
  u64 st = mix_keys2(base, (u64)v);
  Xoshiro r;
  r.s0 = splitmix64(&st);
  r.s1 = splitmix64(&st);
  r.s2 = splitmix64(&st);
  r.s3 = splitmix64(&st);
  return r;
}

__device__ __forceinline__ u64 next_u64(Xoshiro* r) {
  u64 result = rotl64(r->s0 + r->s3, 23) + r->s0;
  u64 t = r->s1 << 17;
  r->s2 ^= r->s0;
  r->s3 ^= r->s1;
  r->s1 ^= r->s2;
  r->s0 ^= r->s3;
  r->s2 ^= t;
  r->s3 = rotl64(r->s3, 45);
  return result;
}

// Rng::below(n): uniform in [0, n) by Lemire's multiply-and-reject (n > 0).
__device__ __forceinline__ u64 below(Xoshiro* r, u64 n) {
  u64 x = next_u64(r);
  u64 lo = x * n;
  u64 hi = __umul64hi(x, n);
  if (lo < n) {
    u64 threshold = (0ull - n) % n;
    while (lo < threshold) {
      x = next_u64(r);
      lo = x * n;
      hi = __umul64hi(x, n);
    }
  }
  return hi;
}

__device__ __forceinline__ u32 row_count(u64 d, u32 k, u32 replace) {
  if (d == 0) return 0;
  if (k == FANOUT_ALL) return (u32)d;
  if (replace) return k;
  return d < (u64)k ? (u32)d : k;
}

// counts[i] = edges frontier vertex i yields.
extern "C" __global__ void khop_counts(const u32* frontier, i64 n, const u64* indptr, u32 k,
                                       u32 replace, u32* counts) {
  GRID_STRIDE(i, n) {
    u32 v = frontier[i];
    counts[i] = row_count(indptr[v + 1] - indptr[v], k, replace);
  }
}

// One thread per frontier vertex: writes its sampled neighbours (global ids) at
// ids[offs[i]..offs[i+1]] in the CPU sampler's order, and lowers each one's remap word to its
// edge position (the fused claim of Fused-Map) when map is not null.
extern "C" __global__ void khop_sample(const u32* frontier, i64 n, const u64* indptr,
                                       const u32* indices, u32 k, u32 replace, u64 base,
                                       const u32* offs, u32* ids, u32* map) {
  GRID_STRIDE(i, n) {
    u32 v = frontier[i];
    u64 a = indptr[v];
    u64 d = indptr[v + 1] - a;
    u32 o = offs[i];
    u32 c = offs[i + 1] - o;
    u32* out = ids + o;
    if (k == FANOUT_ALL || (!replace && d <= (u64)k)) {
      for (u32 j = 0; j < c; j++) out[j] = indices[a + j];
    } else {
      Xoshiro rng = vertex_rng(base, v);
      if (replace) {
        for (u32 j = 0; j < c; j++) out[j] = (u32)below(&rng, d);
      } else {
        // Floyd: for j in d-k..d, t = below(j + 1); take t unless already taken, else j.
        u64 j = d - c;
        for (u32 x = 0; x < c; x++, j++) {
          u32 t = (u32)below(&rng, j + 1);
          bool seen = false;
          for (u32 y = 0; y < x; y++) seen |= out[y] == t;
          out[x] = seen ? (u32)j : t;
        }
      }
      for (u32 j = 0; j < c; j++) out[j] = indices[a + out[j]];
    }
    if (map)
      for (u32 j = 0; j < c; j++) atomicMin(&map[out[j]], FIRST | (o + j));
  }
}

// The seeds take local ids 0..n in order; dup counts seeds whose word was already taken.
extern "C" __global__ void remap_seeds(const u32* seeds, i64 n, u32* map, u32* nodes, u32* dup) {
  GRID_STRIDE(i, n) {
    u32 s = seeds[i];
    nodes[i] = s;
    if (atomicCAS(&map[s], EMPTY, (u32)i) != EMPTY) atomicAdd(dup, 1u);
  }
}

// flags[e] = 1 where edge e is its key's first occurrence in this hop (a new vertex).
extern "C" __global__ void remap_mark(const u32* ids, i64 m, const u32* map, u32* flags) {
  GRID_STRIDE(e, m) { flags[e] = map[ids[e]] == (FIRST | (u32)e) ? 1u : 0u; }
}

// New vertex at edge e (pos[e+1] > pos[e]) gets local id base + pos[e].
extern "C" __global__ void remap_assign(const u32* ids, i64 m, const u32* pos, u32 base, u32* map,
                                        u32* nodes) {
  GRID_STRIDE(e, m) {
    if (pos[e + 1] != pos[e]) {
      u32 id = base + pos[e];
      nodes[id] = ids[e];
      map[ids[e]] = id;
    }
  }
}

// ids[e] = the local id of its key.
extern "C" __global__ void remap_lookup(u32* ids, i64 m, const u32* map) {
  GRID_STRIDE(e, m) { ids[e] = map[ids[e]]; }
}

// Empties the words of the batch's vertices for the next batch.
extern "C" __global__ void remap_reset(const u32* nodes, i64 n, u32* map) {
  GRID_STRIDE(i, n) { map[nodes[i]] = EMPTY; }
}

extern "C" __global__ void fill_u32(u32* x, i64 n, u32 value) {
  GRID_STRIDE(i, n) { x[i] = value; }
}
