// fanout's GPU sampling kernels: uniform and weighted k-hop sampling and PinSAGE random walks,
// with FastGL's Fused-Map remapping.
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

// ----- weighted k-hop (crates/fanout-sample/src/weighted.rs, draw for draw) -----

#define NO_ARC 0xFFFFFFFFu

// Rng::next_f32: the top 24 of the next 32 bits, scaled into [0, 1) (exact).
__device__ __forceinline__ float next_f32(Xoshiro* r) {
  u32 x = (u32)(next_u64(r) >> 32);
  return __uint2float_rn(x >> 8) * (1.0f / 16777216.0f);
}

// Rng::next_f64: the top 53 bits, scaled into [0, 1) (exact).
__device__ __forceinline__ double next_f64(Xoshiro* r) {
  return __dmul_rn(__ull2double_rn(next_u64(r) >> 11), 1.0 / 9007199254740992.0);
}

// An arc's alias entry, packed so that one 8-byte read fetches it: the keep-probability's bits
// in the low word, the alias position in the high word.
__device__ __forceinline__ float alias_prob(u64 e) { return __uint_as_float((u32)e); }
__device__ __forceinline__ u32 alias_idx(u64 e) { return (u32)(e >> 32); }

// One alias draw from a row of d arcs: position i kept with probability prob(i), else its alias.
__device__ __forceinline__ u32 alias_draw(Xoshiro* r, u64 d, const u64* alias) {
  u32 i = (u32)below(r, d);
  float u = next_f32(r);
  u64 e = alias[i];
  return u < alias_prob(e) ? i : alias_idx(e);
}

__device__ __forceinline__ bool chosen(const u32* out, u32 c, u32 j) {
  for (u32 y = 0; y < c; y++)
    if (out[y] == j) return true;
  return false;
}

// One thread per frontier vertex: picks its arcs as the CPU's WeightedSampler does and writes
// their row positions, in pick order, at pos[pad[i]..] (room for khop_counts' bound) and their
// number at counts[i]. Without replacement: alias draws that reject repeats, then, after
// 8k + 64 draws, exact successive sampling over the arcs left (its own stream, f64 sums in row
// order, as the CPU's).
extern "C" __global__ void weighted_pick(const u32* frontier, i64 n, const u64* indptr,
                                         const float* w, const u64* alias, u32 k,
                                         u32 replace, u64 base, const u32* pad, u32* pos,
                                         u32* counts) {
  GRID_STRIDE(i, n) {
    u32 v = frontier[i];
    u64 a = indptr[v];
    u64 d = indptr[v + 1] - a;
    const float* wr = w + a;
    u32* out = pos + pad[i];
    u32 c = 0;
    if (d == 0 || alias_idx(alias[a]) == NO_ARC) {
      // No arcs, or none of positive weight.
    } else if (k == FANOUT_ALL || (!replace && d <= (u64)k)) {
      for (u64 j = 0; j < d; j++)
        if (wr[j] > 0.0f) out[c++] = (u32)j;
    } else {
      Xoshiro rng = vertex_rng(base, v);
      if (replace) {
        for (; c < k; c++) out[c] = alias_draw(&rng, d, alias + a);
      } else {
        u64 attempts = 0, most = 8 * (u64)k + 64;
        while (c < k && attempts < most) {
          attempts++;
          u32 j = alias_draw(&rng, d, alias + a);
          if (!chosen(out, c, j)) out[c++] = j;
        }
        Xoshiro rest = vertex_rng(base ^ 0x5EEDull, v);
        while (c < k) {
          double total = 0.0;
          for (u64 j = 0; j < d; j++)
            if (wr[j] > 0.0f && !chosen(out, c, (u32)j)) total = __dadd_rn(total, (double)wr[j]);
          if (total <= 0.0) break;
          double r = __dmul_rn(next_f64(&rest), total);
          u32 pick = NO_ARC;
          for (u64 j = 0; j < d; j++) {
            if (!(wr[j] > 0.0f) || chosen(out, c, (u32)j)) continue;
            pick = (u32)j;
            r = __dsub_rn(r, (double)wr[j]);
            if (r < 0.0) break;
          }
          if (pick == NO_ARC) break;
          out[c++] = pick;
        }
      }
    }
    counts[i] = c;
  }
}

// One thread per frontier vertex: moves its picks (row positions at pos[pad[i]..]) into the
// block as global ids at ids[offs[i]..offs[i+1]] with their stored weights at wout, and
// lowers each id's remap word to its edge position when map is not null (as khop_sample).
extern "C" __global__ void weighted_place(const u32* frontier, i64 n, const u64* indptr,
                                          const u32* indices, const float* w, const u32* pad,
                                          const u32* pos, const u32* offs, u32* ids, float* wout,
                                          u32* map) {
  GRID_STRIDE(i, n) {
    u64 a = indptr[frontier[i]];
    const u32* p = pos + pad[i];
    u32 o = offs[i];
    u32 c = offs[i + 1] - o;
    for (u32 j = 0; j < c; j++) {
      u64 e = a + p[j];
      u32 u = indices[e];
      ids[o + j] = u;
      wout[o + j] = w[e];
      if (map) atomicMin(&map[u], FIRST | (o + j));
    }
  }
}

// ----- PinSAGE random walks (crates/fanout-sample/src/randomwalk.rs, step for step) -----

// One thread per frontier vertex v: `walks` walks of at most `length` steps from v, each step
// to a uniform entry of the current row, counting visits to vertices other than v, stopping
// with probability stop_prob after each step or at an empty row. The visited vertices and
// their counts (room for walks x length each, at i x room) are sorted by decreasing count,
// then increasing id; counts[i] = how many of them the block keeps (at most k).
extern "C" __global__ void walk_pick(const u32* frontier, i64 n, const u64* indptr,
                                     const u32* indices, u32 walks, u32 length, double stop_prob,
                                     u64 base, u64 room, u32 k, u32* vis, u32* hits,
                                     u32* counts) {
  GRID_STRIDE(i, n) {
    u32 v = frontier[i];
    u32* ids = vis + (u64)i * room;
    u32* cs = hits + (u64)i * room;
    u32 c = 0;
    Xoshiro rng = vertex_rng(base, v);
    for (u32 w = 0; w < walks; w++) {
      u32 cur = v;
      for (u32 s = 0; s < length; s++) {
        u64 a = indptr[cur];
        u64 d = indptr[cur + 1] - a;
        if (d == 0) break;
        cur = indices[a + below(&rng, d)];
        if (cur != v) {
          u32 y = 0;
          while (y < c && ids[y] != cur) y++;
          if (y < c) {
            cs[y]++;
          } else {
            ids[c] = cur;
            cs[c] = 1;
            c++;
          }
        }
        if (next_f64(&rng) < stop_prob) break;
      }
    }
    // Insertion sort: (count desc, id asc) is a total order on distinct ids, so any sort gives
    // the CPU's order.
    for (u32 x = 1; x < c; x++) {
      u32 id = ids[x], h = cs[x];
      u32 y = x;
      while (y > 0 && (cs[y - 1] < h || (cs[y - 1] == h && ids[y - 1] > id))) {
        ids[y] = ids[y - 1];
        cs[y] = cs[y - 1];
        y--;
      }
      ids[y] = id;
      cs[y] = h;
    }
    counts[i] = c < k ? c : k;
  }
}

// One thread per frontier vertex: moves its kept vertices into the block at ids[offs[i]..]
// with their visit counts as weights, lowering remap words when map is not null.
extern "C" __global__ void walk_place(i64 n, u64 room, const u32* vis, const u32* hits,
                                      const u32* offs, u32* ids, float* wout, u32* map) {
  GRID_STRIDE(i, n) {
    u32 o = offs[i];
    u32 c = offs[i + 1] - o;
    for (u32 j = 0; j < c; j++) {
      u32 u = vis[(u64)i * room + j];
      ids[o + j] = u;
      wout[o + j] = (float)hits[(u64)i * room + j];
      if (map) atomicMin(&map[u], FIRST | (o + j));
    }
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
