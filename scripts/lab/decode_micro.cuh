// scripts/lab/decode_micro.cuh -- what the standalone decode micros share
// (decode_pagebox.cu, decode_burst.cu): the bench's shapes (bf16, 32 query /
// 8 kv heads, D 128, page 16 in random order, full pages), the MMA helpers,
// the combine of pieces' partial rows, the streaming-read ceiling and the
// timing of a call as the library times one (a hold kernel, then events),
// and a float64 check of random (sequence, head) rows on the host.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <unistd.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
typedef unsigned long long u64;
typedef unsigned u32;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int HK = 8, GT = 4, H = HK * GT, D = 128, PS = 16;
constexpr int PAGE_BYTES = PS * HK * D * 2; // 32 KB: a page of K (or V), all kv heads

__device__ __forceinline__ u32 saddr(const void *p) { return (u32)__cvta_generic_to_shared(p); }
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

// One warp's head tile (4 query heads in MMA rows 0-3 of lanes' row g; rows g + 8 and g >= GT
// are padding) over 16 keys a step: o (f32, unnormalised), m (log2 units) and this lane's part
// of l. MMA false: no MMAs, the fragments kept alive by their sign bits (the softmax's
// exponentials stay: P feeds a product by 0), the micros' "no MMAs" modes.
struct head_tile {
  float o[D / 8][4];
  float m, l;
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    m = -INFINITY; l = 0.f;
  }
  // S = Q K^T for the step's 16 keys (K fragments: x4 = keys 0-7 / 8-15 x columns 16 ks + 0 / 8)
  template <bool MMA> __device__ __forceinline__ void qk(float (&sa)[2][4], const u32 (&qa)[D / 16][4], const u32 (&kf)[D / 16][4]) {
#pragma unroll
    for (int n = 0; n < 2; n++) sa[n][0] = sa[n][1] = sa[n][2] = sa[n][3] = 0.f;
    if (MMA) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ks++) {
        mma(sa[0], qa[ks], kf[ks][0], kf[ks][1]);
        mma(sa[1], qa[ks], kf[ks][2], kf[ks][3]);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < D / 16; ks++) sa[0][0] += __int_as_float(kf[ks][0] & 0x80000000u);
    }
  }
  // the online softmax of row g: m, l and o rescaled, P (bf16) as the A fragment pa
  __device__ __forceinline__ void softmax(const float (&sa)[2][4], float scale_log2, u32 (&pa)[4]) {
    float mx = fmaxf(fmaxf(sa[0][0], sa[0][1]), fmaxf(sa[1][0], sa[1][1])) * scale_log2;
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 2));
    const float mnew = fmaxf(m, mx), alpha = exp2f(m - mnew);
    float p[2][2];
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int i = 0; i < 2; i++) p[n][i] = exp2f(sa[n][i] * scale_log2 - mnew);
    l = l * alpha + p[0][0] + p[0][1] + p[1][0] + p[1][1];
    m = mnew;
#pragma unroll
    for (int n = 0; n < D / 8; n++) { o[n][0] *= alpha; o[n][1] *= alpha; }
    pa[0] = pack(p[0][0], p[0][1]); pa[1] = 0u; pa[2] = pack(p[1][0], p[1][1]); pa[3] = 0u;
  }
  // o += P V (V fragments by ldmatrix.trans: x4 = columns 16 np + 0 / 8 over keys 0-7 / 8-15)
  template <bool MMA> __device__ __forceinline__ void pv(const u32 (&pa)[4], const u32 (&vf)[D / 16][4]) {
    if (MMA) {
#pragma unroll
      for (int np = 0; np < D / 16; np++) {
        mma(o[2 * np], pa, vf[np][0], vf[np][1]);
        mma(o[2 * np + 1], pa, vf[np][2], vf[np][3]);
      }
    } else {
#pragma unroll
      for (int np = 0; np < D / 16; np++) o[np][0] += __int_as_float(vf[np][0] & 0x80000000u) + pa[0] * 0.f;
    }
  }
  // the partial rows row0 + g (g < GT): o / l and lse (log2 units)
  __device__ __forceinline__ void write(float *part_o, float *part_lse, long long row0, int lane) const {
    const int g = lane >> 2, t4 = lane & 3;
    float lt = l + __shfl_xor_sync(~0u, l, 1);
    lt += __shfl_xor_sync(~0u, lt, 2);
    if (g < GT) {
      const long long row = row0 + g;
      const float inv = 1.f / lt;
#pragma unroll
      for (int n = 0; n < D / 8; n++)
        *(float2 *)(part_o + row * D + n * 8 + 2 * t4) = make_float2(o[n][0] * inv, o[n][1] * inv);
      if (t4 == 0) part_lse[row] = m + log2f(lt);
    }
  }
};

__global__ void hold(u64 ns) {
  u64 t0, t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

// The SM clock by windows (clock_probe.cu; decode_case's PROBE=1): lane 0 of one block a SM
// counts clock64 cycles over PW windows of PWIN ns of %globaltimer from its start.
constexpr int PW = 48;
constexpr u64 PWIN = 10000;
__global__ void probe(float *mhz) {
  if (threadIdx.x != 0) return;
  u64 t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (int w = 0; w < PW; w++) {
    const u64 c0 = clock64();
    u64 ts;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ts));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (u64)(w + 1) * PWIN);
    const u64 c1 = clock64();
    mhz[blockIdx.x * PW + w] = (float)((double)(c1 - c0) / (double)(t - ts) * 1e3);
  }
}
// the probe's windows gathered over calls: each window's median MHz, on one line
static void print_window_medians(std::vector<std::vector<float>> &win) {
  for (auto &w : win) {
    std::sort(w.begin(), w.end());
    printf(" %4.0f", w[w.size() / 2]);
  }
}

// The pieces of each sequence merged: one warp a (sequence, query head). Partial row
// (first_part[b] + r) * H + head holds piece r's o / l (f32) and its lse (log2 units).
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

// The decode micros' command line: B L CHUNK MODE CHECK (64 4096 32 0 1); ok false (and
// said why) where L is not whole pages or CHUNK is not 1-32
struct micro_args {
  int B, L, chunk, mode, check;
  bool ok;
  micro_args(int argc, char **argv)
      : B(argc > 1 ? atoi(argv[1]) : 64), L(argc > 2 ? atoi(argv[2]) : 4096), chunk(argc > 3 ? atoi(argv[3]) : 32),
        mode(argc > 4 ? atoi(argv[4]) : 0), check(argc > 5 ? atoi(argv[5]) : 1) {
    ok = L % PS == 0 && chunk >= 1 && chunk <= 32;
    if (!ok) printf("L: a multiple of 16; CHUNK 1-32\n");
  }
};

static float bf2f(__nv_bfloat16 v) { return __bfloat162float(v); }
static u64 rng = 88172645463325252ull;
static u64 next() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static float urand() { return (float)((next() >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f; }

// B sequences of L keys: K / V pools of B L / 16 pages (NHD, 8 kv heads), random bf16 in
// [-1, 1), q [B][H][D]; sequence b's pages are perm[b pps ...] (a random order of the pool).
// The caller sets first / np (its pieces' partial rows per sequence) and calls alloc_parts.
struct decode_case {
  int B, L, pps, sms;
  long long npages;
  std::vector<__nv_bfloat16> hk, hv, hq;
  std::vector<int> perm, first, np;
  __nv_bfloat16 *dk, *dv, *dq, *dout;
  int *dpages, *dfirst, *dnp;
  float *po, *pl;
  u32 *ctr;
  cudaStream_t st;
  cudaEvent_t e0, e1, e2;
  decode_case(int B_, int L_) : B(B_), L(L_), pps(L_ / PS), npages((long long)B_ * (L_ / PS)) {
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    hk.resize(npages * PAGE_BYTES / 2); hv.resize(hk.size()); hq.resize((size_t)B * H * D);
    for (auto &x : hk) x = __float2bfloat16(urand());
    for (auto &x : hv) x = __float2bfloat16(urand());
    for (auto &x : hq) x = __float2bfloat16(urand());
    perm.resize(npages);
    for (long long i = 0; i < npages; i++) perm[i] = (int)i;
    for (long long i = npages - 1; i > 0; i--) std::swap(perm[i], perm[next() % (i + 1)]);
    CK(cudaMalloc(&dk, npages * PAGE_BYTES)); CK(cudaMalloc(&dv, npages * PAGE_BYTES));
    CK(cudaMalloc(&dq, hq.size() * 2)); CK(cudaMalloc(&dout, hq.size() * 2));
    CK(cudaMalloc(&dpages, npages * 4)); CK(cudaMalloc(&ctr, 4));
    CK(cudaMemcpy(dk, hk.data(), npages * PAGE_BYTES, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv.data(), npages * PAGE_BYTES, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpages, perm.data(), npages * 4, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventCreate(&e2);
    first.assign(B, 0); np.assign(B, 0);
  }
  double bytes() const { return 2.0 * npages * PAGE_BYTES; }
  void alloc_parts(int nparts) {
    CK(cudaMalloc(&po, (size_t)nparts * H * D * 4)); CK(cudaMalloc(&pl, (size_t)nparts * H * 4));
    CK(cudaMalloc(&dfirst, B * 4)); CK(cudaMalloc(&dnp, B * 4));
    CK(cudaMemcpy(dfirst, first.data(), B * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dnp, np.data(), B * 4, cudaMemcpyHostToDevice));
  }
  // the bench's ceiling kernel over 2 GiB, best of 9 passes, timed alike (GB/s)
  double read_ceiling() {
    uint4 *rb; unsigned *sink;
    CK(cudaMalloc(&rb, 2ull << 30)); CK(cudaMalloc(&sink, 4)); CK(cudaMemset(rb, 1, 2ull << 30));
    int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, grid_read, 512, 0));
    float best = 1e30f;
    for (int i = 0; i < 10; i++) {
      hold<<<1, 1, 0, st>>>(30000);
      cudaEventRecord(e0, st);
      grid_read<<<sms * occ, 512, 0, st>>>(rb, (2ll << 30) / 16, sink);
      cudaEventRecord(e1, st);
      CK(cudaStreamSynchronize(st));
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      if (i > 0) best = std::min(best, ms);
    }
    CK(cudaFree(rb)); CK(cudaFree(sink));
    return (2.0 * (1 << 30)) / (best * 1e-3) / 1e9;
  }
  // launch() on st, 25 timed calls after 3 (the piece counter reset before each, 1 ms after
  // each): the medians of the kernel alone and of kernel + combine, us
  template <class F> void time_calls(F launch, double *k_us, double *t_us) {
    std::vector<float> tk, tt;
    // PROBE=1: the SM clock through each call (probe's windows from the hold's start)
    const bool prb = getenv("PROBE") && atoi(getenv("PROBE"));
    float *dm = nullptr;
    cudaStream_t st2 = nullptr;
    std::vector<float> hm(sms * PW);
    std::vector<std::vector<float>> win(PW);
    if (prb) { CK(cudaMalloc(&dm, sms * PW * 4)); CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking)); }
    for (int i = 0; i < 28; i++) {
      if (prb) probe<<<sms, 32, 0, st2>>>(dm);
      hold<<<1, 1, 0, st>>>(30000);
      CK(cudaMemsetAsync(ctr, 0, 4, st));
      cudaEventRecord(e0, st);
      launch();
      cudaEventRecord(e1, st);
      combine<<<(B * H * 32 + 255) / 256, 256, 0, st>>>(po, pl, dfirst, dnp, B, dout);
      cudaEventRecord(e2, st);
      CK(cudaStreamSynchronize(st));
      float a, c; cudaEventElapsedTime(&a, e0, e1); cudaEventElapsedTime(&c, e0, e2);
      if (i >= 3) { tk.push_back(a * 1e3f); tt.push_back(c * 1e3f); }
      if (prb) {
        CK(cudaStreamSynchronize(st2));
        CK(cudaMemcpy(hm.data(), dm, hm.size() * 4, cudaMemcpyDeviceToHost));
        for (int w = 0; w < PW && i >= 3; w++)
          for (int s = 0; s < sms; s++) win[w].push_back(hm[s * PW + w]);
      }
      usleep(1000);
    }
    if (prb) {
      printf("  SM clock, MHz by %.0f us windows from the hold's start:", PWIN / 1e3);
      print_window_medians(win);
      printf("\n");
      CK(cudaFree(dm)); CK(cudaStreamDestroy(st2));
    }
    CK(cudaGetLastError());
    std::sort(tk.begin(), tk.end()); std::sort(tt.begin(), tt.end());
    *k_us = tk[tk.size() / 2]; *t_us = tt[tt.size() / 2];
  }
  // max |d| of 16 random (sequence, query head) rows of dout against float64
  double check() {
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
    return maxd;
  }
};

static void report(const char *name, const decode_case &c, int chunk, int npieces, int mode, double read_gbps,
                   double k_us, double t_us) {
  const double bytes = c.bytes();
  printf("%s %dx%d chunk %d (%d pieces, %.2f a SM) mode %d: kernel %.1f us (%.1f GB/s, %.3f of read %.1f), "
         "with combine %.1f us (%.3f); 0.97 of read: %.1f us\n",
         name, c.B, c.L, chunk, npieces, (double)npieces / c.sms, mode, k_us, bytes / k_us / 1e3,
         bytes / k_us / 1e3 / read_gbps, read_gbps, t_us, bytes / t_us / 1e3 / read_gbps, bytes / (0.97 * read_gbps) / 1e3);
}
