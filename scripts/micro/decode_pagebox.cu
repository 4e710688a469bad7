// scripts/micro/decode_pagebox.cu -- a decode design measured before it is
// built (kernels/NOTES.md, session 28): a unit is a piece of one sequence
// with ALL its kv heads, so a page of 16 tokens (32 KB of K, 32 KB of V at 8
// kv heads x 128 x bf16) is one contiguous TMA box, one instruction, instead
// of 16 cp.async a thread a stage; warp h of 8 consumer warps owns kv head h
// (its 4 query heads) for the whole piece, so no warp merges with another;
// one producer warp claims pieces from a counter and keeps STAGES pages in
// flight (full / empty mbarriers, K and V apart). Pieces write partial rows
// (o, lse) that a second kernel combines. The bench's shapes (bf16, 32 / 8
// heads, D 128, page 16 in random order, full pages), timed as the library
// times a call (a hold kernel, then events), against the streaming read
// measured in the same run, with the output checked against a float64
// reference on the host. No masks, no options: what it answers is whether
// the stream of whole-page boxes with this arithmetic reaches 0.97.
//   nvcc -O3 -arch=sm_90a -o /tmp/pagebox scripts/micro/decode_pagebox.cu -lcuda && /tmp/pagebox
//   /tmp/pagebox B L CHUNK [MODE]   (CHUNK pages a piece; MODE 0 full, 1 no MMAs, 2 neither
//   arithmetic nor q: the stream of page boxes alone)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <unistd.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
typedef unsigned long long u64;
typedef unsigned u32;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int HK = 8, GT = 4, H = HK * GT, D = 128, PS = 16;
constexpr int PAGE_BYTES = PS * HK * D * 2; // 32 KB
constexpr int STAGES = 3;
constexpr int CW = 8;                       // consumer warps (one a kv head)
constexpr int NT = (CW + 1) * 32;
constexpr int Q_BYTES = H * D * 2;          // a sequence's q, all heads: 8 KB
constexpr int SMEM = 2 * STAGES * PAGE_BYTES + 2 * Q_BYTES + 1024 + 256;

__device__ __forceinline__ u32 saddr(const void *p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64 *b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(b)), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_arrive(u64 *b) { asm volatile("{.reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0];}" ::"r"(saddr(b)) : "memory"); }
__device__ __forceinline__ void mbar_expect(u64 *b, u32 bytes) { asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(b)), "r"(bytes) : "memory"); }
__device__ __forceinline__ void mbar_wait(u64 *b, u32 ph) {
  asm volatile("{.reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W;}" ::"r"(saddr(b)), "r"(ph) : "memory");
}
// the page box: 5-D map (64 el, 8 rows, 2 column blocks, 8 heads, 8-row groups), box all of a page
__device__ __forceinline__ void tma_page(u32 dst, const CUtensorMap *m, int group, u64 *b) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %2, %2, %2, %3}], [%4];"
               ::"r"(dst), "l"((u64)m), "r"(0), "r"(group), "r"(saddr(b)) : "memory");
}
// a contiguous global -> shared copy by the TMA unit, completing on b
__device__ __forceinline__ void bulk_copy(u32 dst, const void *src, u32 bytes, u64 *b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"((u64)src), "r"(bytes), "r"(saddr(b)) : "memory");
}
__device__ __forceinline__ void ldsm4(u32 (&r)[4], u32 a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm4t(u32 (&r)[4], u32 a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(u32 *)&v;
}
// byte offset in a landed page of (key k, column c) of head h: lines (group, head, block, row) of
// 128 bytes, 16-byte chunks swizzled by the row (128-byte swizzle, 1024-byte aligned buffer)
__device__ __forceinline__ u32 page_off(int h, int k, int c) {
  const int line = (((k >> 3) * HK + h) * 2 + (c >> 6)) * 8 + (k & 7);
  return line * 128 + ((((c & 63) >> 3) ^ (k & 7)) << 4);
}

struct piece { int b, p0, np, part; }; // sequence, first page index, pages, partial row index

__global__ void hold(u64 ns) {
  u64 t0, t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

template <int MODE>
__global__ void __launch_bounds__(NT, 1) pagebox(const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                                                 const piece *pieces, int npieces, const int *pages, int pps,
                                                 const __nv_bfloat16 *q, float scale_log2, float *part_o, float *part_lse,
                                                 u32 *counter) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  unsigned char *kbuf = smem, *vbuf = smem + STAGES * PAGE_BYTES;
  unsigned char *qbuf = smem + 2 * STAGES * PAGE_BYTES; // two pieces' q (by piece parity)
  u64 *bars = (u64 *)(qbuf + 2 * Q_BYTES);
  u64 *full_k = bars, *full_v = bars + STAGES, *empty_k = bars + 2 * STAGES, *empty_v = bars + 3 * STAGES;
  int *info = (int *)(bars + 4 * STAGES); // per stage: piece index (-1: end), page index in the piece
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < STAGES; s++) { mbar_init(&full_k[s], 1); mbar_init(&full_v[s], 1); mbar_init(&empty_k[s], CW); mbar_init(&empty_v[s], CW); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == CW) {
    // producer: pieces from the counter, one ahead; their page ids by the warp's lanes
    int it = 0, npc = 0;
    u32 cur = lane == 0 ? atomicAdd(counter, 1u) : 0;
    cur = __shfl_sync(~0u, cur, 0);
    piece pc = cur < (u32)npieces ? pieces[cur] : piece{0, 0, 0, 0};
    int ids = cur < (u32)npieces && lane < pc.np ? pages[(long long)pc.b * pps + pc.p0 + lane] : 0;
    while (cur < (u32)npieces) {
      // the next piece, fetched once this one's first pages are out (its chain under their flight)
      u32 nxt = 0;
      piece pn{0, 0, 0, 0};
      int nids = 0;
      const int at = pc.np > 1 ? 1 : 0;
      for (int i = 0; i < pc.np; i++, it++) {
        const int page = __shfl_sync(~0u, ids, i);
        const int s = it % STAGES;
        const u32 ph = (u32)(it / STAGES) & 1u;
        if (lane == 0) {
          mbar_wait(&empty_k[s], ph ^ 1u);
          info[2 * s] = (int)cur; info[2 * s + 1] = i;
          // a piece's first page brings its sequence's q (MODE < 2), into buffer npc & 1
          const bool wq = i == 0 && MODE < 2;
          mbar_expect(&full_k[s], PAGE_BYTES + (wq ? Q_BYTES : 0));
          if (wq) bulk_copy(saddr(qbuf + (npc & 1) * Q_BYTES), q + (long long)pc.b * H * D, Q_BYTES, &full_k[s]);
          tma_page(saddr(kbuf + s * PAGE_BYTES), &kmap, page * 2, &full_k[s]);
          mbar_wait(&empty_v[s], ph ^ 1u);
          mbar_expect(&full_v[s], PAGE_BYTES);
          tma_page(saddr(vbuf + s * PAGE_BYTES), &vmap, page * 2, &full_v[s]);
        }
        if (i == at) {
          nxt = lane == 0 ? atomicAdd(counter, 1u) : 0;
          nxt = __shfl_sync(~0u, nxt, 0);
          if (nxt < (u32)npieces) pn = pieces[nxt];
          nids = nxt < (u32)npieces && lane < pn.np ? pages[(long long)pn.b * pps + pn.p0 + lane] : 0;
        }
      }
      cur = nxt; pc = pn; ids = nids; npc++;
    }
    if (lane == 0) {
      const int s = it % STAGES;
      mbar_wait(&empty_k[s], ((u32)(it / STAGES) & 1u) ^ 1u);
      info[2 * s] = -1;
      mbar_arrive(&full_k[s]);
    }
    return;
  }
  // consumer warp h = warp: kv head h, query heads h GT .. h GT + 3 in MMA rows 0-3
  const int h = warp, g = lane >> 2, t4 = lane & 3;
  u32 qa[D / 16][4];
  float o[D / 8][4];
  float m0 = -INFINITY, l0 = 0.f;
  int npc = 0; // (pieces started: their q buffer is npc & 1, as the producer's)
  for (int it = 0;; it++) {
    const int s = it % STAGES;
    const u32 ph = (u32)(it / STAGES) & 1u;
    mbar_wait(&full_k[s], ph);
    const int pi = info[2 * s], idx = info[2 * s + 1];
    if (pi < 0) break;
    const piece pc = pieces[pi];
    if (idx == 0) {
      // Q of this piece's sequence and head group (landed with the page), rows g < GT (the rest zero)
      const unsigned char *qs = qbuf + (npc & 1) * Q_BYTES;
      npc++;
#pragma unroll
      for (int ks = 0; ks < D / 16; ks++) {
        u32 a0 = 0, a2 = 0;
        if (g < GT && MODE < 2) {
          const __nv_bfloat16 *qr = (const __nv_bfloat16 *)qs + (h * GT + g) * D + ks * 16 + 2 * t4;
          a0 = *(const u32 *)qr;
          a2 = *(const u32 *)(qr + 8);
        }
        qa[ks][0] = a0; qa[ks][1] = 0; qa[ks][2] = a2; qa[ks][3] = 0;
      }
#pragma unroll
      for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
      m0 = -INFINITY; l0 = 0.f;
    }
    const u32 kb = saddr(kbuf + s * PAGE_BYTES), vb = saddr(vbuf + s * PAGE_BYTES);
    // K fragments: x4 = keys 0-7 / 8-15 x columns 16 ks + 0 / 8
    u32 kf[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
      const int key = (lane & 7) + 8 * (lane >> 4), col = ks * 16 + 8 * ((lane >> 3) & 1);
      ldsm4(kf[ks], kb + page_off(h, key, col));
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty_k[s]);
    float sa[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if (MODE == 0) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ks++) {
        mma(sa[0], qa[ks], kf[ks][0], kf[ks][1]);
        mma(sa[1], qa[ks], kf[ks][2], kf[ks][3]);
      }
    } else {
      // no MMAs: the fragments kept alive by their sign bits (the softmax's exponentials stay:
      // P feeds the product by 0 below)
#pragma unroll
      for (int ks = 0; ks < D / 16; ks++) sa[0][0] += __int_as_float(kf[ks][0] & 0x80000000u);
    }
    // online softmax of row g (rows g + 8 are padding: P = 0)
    float mx = fmaxf(fmaxf(sa[0][0], sa[0][1]), fmaxf(sa[1][0], sa[1][1])) * scale_log2;
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 2));
    const float mnew = fmaxf(m0, mx), alpha = exp2f(m0 - mnew);
    float p[2][2];
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int i = 0; i < 2; i++) p[n][i] = exp2f(sa[n][i] * scale_log2 - mnew);
    l0 = l0 * alpha + p[0][0] + p[0][1] + p[1][0] + p[1][1];
    m0 = mnew;
#pragma unroll
    for (int n = 0; n < D / 8; n++) { o[n][0] *= alpha; o[n][1] *= alpha; }
    const u32 pa[4] = {pack(p[0][0], p[0][1]), 0u, pack(p[1][0], p[1][1]), 0u};
    mbar_wait(&full_v[s], ph);
    u32 vf[D / 16][4];
#pragma unroll
    for (int np = 0; np < D / 16; np++) {
      const int key = (lane & 7) + 8 * ((lane >> 3) & 1), col = np * 16 + 8 * (lane >> 4);
      ldsm4t(vf[np], vb + page_off(h, key, col));
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty_v[s]);
    if (MODE == 0) {
#pragma unroll
      for (int np = 0; np < D / 16; np++) {
        mma(o[2 * np], pa, vf[np][0], vf[np][1]);
        mma(o[2 * np + 1], pa, vf[np][2], vf[np][3]);
      }
    } else {
#pragma unroll
      for (int np = 0; np < D / 16; np++) o[np][0] += __int_as_float(vf[np][0] & 0x80000000u) + pa[0] * 0.f;
    }
    if (idx == pc.np - 1) {
      // the piece's partial rows: o / l and lse (log2 units) of query heads h GT + g
      float l = l0 + __shfl_xor_sync(~0u, l0, 1);
      l += __shfl_xor_sync(~0u, l, 2);
      if (g < GT) {
        const long long row = (long long)pc.part * H + h * GT + g;
        const float inv = 1.f / l;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
          *(float2 *)(part_o + row * D + n * 8 + 2 * t4) = make_float2(o[n][0] * inv, o[n][1] * inv);
        if (t4 == 0) part_lse[row] = m0 + log2f(l);
      }
    }
  }
}

// the pieces of each sequence merged: one warp a (sequence, query head)
__global__ void combine(const float *part_o, const float *part_lse, const int *first_part, const int *nparts, int B,
                        __nv_bfloat16 *out) {
  const int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (w >= B * H) return;
  const int b = w / H, hq = w % H, f = first_part[b], n = nparts[b];
  float mx = -INFINITY;
  for (int i = 0; i < n; i++) mx = fmaxf(mx, part_lse[(long long)(f + i) * H + hq]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, den = 0.f;
  for (int i = 0; i < n; i++) {
    const long long row = (long long)(f + i) * H + hq;
    const float wgt = exp2f(part_lse[row] - mx);
    const float4 v = *(const float4 *)(part_o + row * D + lane * 4);
    acc[0] += wgt * v.x; acc[1] += wgt * v.y; acc[2] += wgt * v.z; acc[3] += wgt * v.w;
    den += wgt;
  }
  for (int i = 0; i < 4; i++) out[((long long)b * H + hq) * D + lane * 4 + i] = __float2bfloat16(acc[i] / den);
}

__global__ void __launch_bounds__(512) grid_read(const uint4 *__restrict__ p, long long n, unsigned *sink) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) { const uint4 a = __ldcs(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
  if (acc == 0x9e3779b9u) *sink = acc;
}

static float bf2f(__nv_bfloat16 v) { return __bfloat162float(v); }
static u64 rng = 88172645463325252ull;
static u64 next() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static float urand() { return (float)((next() >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f; }

static void make_map(CUtensorMap *m, void *base, long long npages) {
  const cuuint64_t row = (cuuint64_t)HK * D * 2;
  const cuuint64_t dims[5] = {64, 8, D / 64, HK, (cuuint64_t)npages * PS / 8};
  const cuuint64_t strides[4] = {row, 128, D * 2, 8 * row};
  const cuuint32_t box[5] = {64, 8, D / 64, HK, PS / 8};
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  CUresult r = cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, base, dims, strides, box, unit,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { printf("cuTensorMapEncodeTiled: %d\n", (int)r); exit(1); }
}

int main(int argc, char **argv) {
  const int B = argc > 1 ? atoi(argv[1]) : 64, L = argc > 2 ? atoi(argv[2]) : 4096;
  const int chunk = argc > 3 ? atoi(argv[3]) : 32, mode = argc > 4 ? atoi(argv[4]) : 0;
  const int check = argc > 5 ? atoi(argv[5]) : 1;
  if (L % PS || chunk < 1 || chunk > 32) { printf("L: a multiple of 16; CHUNK 1-32\n"); return 1; }
  const int pps = L / PS;
  const long long npages = (long long)B * pps;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // caches: random bf16 in [-1, 1), pages in random order
  std::vector<__nv_bfloat16> hk(npages * PAGE_BYTES / 2), hv(hk.size()), hq((size_t)B * H * D);
  for (auto &x : hk) x = __float2bfloat16(urand());
  for (auto &x : hv) x = __float2bfloat16(urand());
  for (auto &x : hq) x = __float2bfloat16(urand());
  std::vector<int> perm(npages);
  for (long long i = 0; i < npages; i++) perm[i] = (int)i;
  for (long long i = npages - 1; i > 0; i--) std::swap(perm[i], perm[next() % (i + 1)]);
  // pieces: each sequence in pieces of `chunk` pages, in sequence order
  std::vector<piece> pcs;
  std::vector<int> first(B), np(B);
  for (int b = 0; b < B; b++) {
    first[b] = (int)pcs.size();
    for (int p0 = 0; p0 < pps; p0 += chunk) pcs.push_back(piece{b, p0, std::min(chunk, pps - p0), (int)pcs.size()});
    np[b] = (int)pcs.size() - first[b];
  }
  const int npc = (int)pcs.size();
  __nv_bfloat16 *dk, *dv, *dq, *dout;
  float *po, *pl;
  int *dpages, *dfirst, *dnp;
  piece *dpcs;
  u32 *ctr;
  CK(cudaMalloc(&dk, npages * PAGE_BYTES)); CK(cudaMalloc(&dv, npages * PAGE_BYTES));
  CK(cudaMalloc(&dq, hq.size() * 2)); CK(cudaMalloc(&dout, hq.size() * 2));
  CK(cudaMalloc(&po, (size_t)npc * H * D * 4)); CK(cudaMalloc(&pl, (size_t)npc * H * 4));
  CK(cudaMalloc(&dpages, npages * 4)); CK(cudaMalloc(&dfirst, B * 4)); CK(cudaMalloc(&dnp, B * 4));
  CK(cudaMalloc(&dpcs, npc * sizeof(piece))); CK(cudaMalloc(&ctr, 4));
  CK(cudaMemcpy(dk, hk.data(), npages * PAGE_BYTES, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, hv.data(), npages * PAGE_BYTES, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dpages, perm.data(), npages * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dfirst, first.data(), B * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dnp, np.data(), B * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dpcs, pcs.data(), npc * sizeof(piece), cudaMemcpyHostToDevice));
  CUtensorMap km, vm;
  make_map(&km, dk, npages);
  make_map(&vm, dv, npages);
  auto kern = mode == 0 ? pagebox<0> : mode == 1 ? pagebox<1> : pagebox<2>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1, e2; cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventCreate(&e2);
  // the streaming read of 2 GiB (the bench's ceiling kernel), timed alike
  uint4 *rb; unsigned *sink; CK(cudaMalloc(&rb, 2ull << 30)); CK(cudaMalloc(&sink, 4)); CK(cudaMemset(rb, 1, 2ull << 30));
  int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, grid_read, 512, 0));
  float best_read = 1e30f;
  for (int i = 0; i < 10; i++) {
    hold<<<1, 1, 0, st>>>(30000);
    cudaEventRecord(e0, st);
    grid_read<<<sms * occ, 512, 0, st>>>(rb, (2ll << 30) / 16, sink);
    cudaEventRecord(e1, st);
    CK(cudaStreamSynchronize(st));
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) best_read = std::min(best_read, ms);
  }
  const double read_gbps = (2.0 * (1 << 30)) / (best_read * 1e-3) / 1e9;
  const double bytes = 2.0 * npages * PAGE_BYTES;
  CK(cudaMemset(ctr, 0, 4));
  std::vector<float> tk, tt;
  for (int i = 0; i < 28; i++) {
    hold<<<1, 1, 0, st>>>(30000);
    CK(cudaMemsetAsync(ctr, 0, 4, st));
    cudaEventRecord(e0, st);
    kern<<<sms, NT, SMEM, st>>>(km, vm, dpcs, npc, dpages, pps, dq, scale_log2, po, pl, ctr);
    cudaEventRecord(e1, st);
    combine<<<(B * H * 32 + 255) / 256, 256, 0, st>>>(po, pl, dfirst, dnp, B, dout);
    cudaEventRecord(e2, st);
    CK(cudaStreamSynchronize(st));
    float a, c; cudaEventElapsedTime(&a, e0, e1); cudaEventElapsedTime(&c, e0, e2);
    if (i >= 3) { tk.push_back(a * 1e3f); tt.push_back(c * 1e3f); }
    usleep(1000);
  }
  CK(cudaGetLastError());
  std::sort(tk.begin(), tk.end()); std::sort(tt.begin(), tt.end());
  const double k_us = tk[tk.size() / 2], t_us = tt[tt.size() / 2];
  printf("pagebox %dx%d chunk %d (%d pieces, %.2f a SM) mode %d: kernel %.1f us (%.1f GB/s, %.3f of read %.1f), "
         "with combine %.1f us (%.3f); 0.97 of read: %.1f us\n",
         B, L, chunk, npc, (double)npc / sms, mode, k_us, bytes / k_us / 1e3, bytes / k_us / 1e3 / read_gbps, read_gbps,
         t_us, bytes / t_us / 1e3 / read_gbps, bytes / (0.97 * read_gbps) / 1e3);
  if (mode == 0 && check) {
    // float64 reference of a few (sequence, head) rows
    std::vector<__nv_bfloat16> out(hq.size());
    CK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
    double maxd = 0;
    for (int t = 0; t < 16; t++) {
      const int b = (int)(next() % B), hq_ = (int)(next() % H), kh = hq_ / GT;
      std::vector<double> sc(L);
      double mx = -1e300;
      for (int k = 0; k < L; k++) {
        const long long pg = perm[(long long)b * pps + k / PS];
        const __nv_bfloat16 *kr = &hk[((pg * PS + k % PS) * HK + kh) * D];
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)bf2f(hq[((long long)b * H + hq_) * D + d]) * bf2f(kr[d]);
        sc[k] = s / sqrt((double)D);
        mx = std::max(mx, sc[k]);
      }
      double den = 0;
      for (int k = 0; k < L; k++) den += (sc[k] = exp(sc[k] - mx));
      for (int d = 0; d < D; d++) {
        double acc = 0;
        for (int k = 0; k < L; k++) {
          const long long pg = perm[(long long)b * pps + k / PS];
          acc += sc[k] * bf2f(hv[((pg * PS + k % PS) * HK + kh) * D + d]);
        }
        maxd = std::max(maxd, fabs(acc / den - bf2f(out[((long long)b * H + hq_) * D + d])));
      }
    }
    printf("  check: max |d| %.3g over 16 random (sequence, head) rows (bf16 output, P in bf16)\n", maxd);
  }
  return 0;
}
