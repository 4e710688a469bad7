// scripts/lab/decode_pattern.cu -- does decode's access pattern cost HBM
// bandwidth? Streams the bench's K/V bytes (64 x 4096 keys, 8 kv heads, head
// dim 128, bf16: 2 x 537 MB) three ways and prints GB/s over a sequential read
// of the same bytes:
//   per-head: block = (sequence, kv head, split), 256 B of every 2 KB token
//     row (decode's pattern), page 16 in random page order or unpaged;
//   all-heads: block = (sequence, split), whole 2 KB rows;
//   HND: per-head blocks on [page, head, token, dim] caches (a page's 16 rows of
//   one head, 4 KB, contiguous).
// Plain 16-byte streaming loads (ld.global.cs), 4 per thread and tensor in
// flight; no shared memory, no arithmetic: the memory system alone.
//   nvcc -O3 -arch=sm_90a -o /tmp/decode_pattern scripts/lab/decode_pattern.cu && /tmp/decode_pattern
// H200 (docs/decode.md): per-head page 16 0.98-1.00 of the
// sequential read (4433 GB/s) with 256 blocks or more; unpaged 1.01-1.02.
// Later, against the bench's ceiling too (one 2 GiB read, 4595 GB/s; the
// two 537 MB launches read 0.973 of it): per-head page 16 0.944-0.977 at the
// bench's shapes with enough blocks (8 x 32768: 0.949 at best), unpaged
// 0.973-0.994. The pattern costs 2-5 % of the ceiling, random pages 1-4 %;
// HND rows read the same or lower (page 16: 0.95-0.99 at 8 splits); more
// splits read best at 16-32 (8 x 32768 0.967, 64 x 4096 0.981), 8 (256 x 1024 0.987).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
typedef long long i64;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__global__ void __launch_bounds__(512) seq_read(const uint4 *__restrict__ p, i64 n, unsigned *sink) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) { uint4 a = __ldcs(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// ROWB bytes per (token, block): 256 (one kv head) or 2048 (all 8 heads).
// block = (seq b, head h [per-head mode], split s); tokens [s*L/S, (s+1)*L/S)
template <int ROWB, int U, bool HNDL = false>
__global__ void __launch_bounds__(256) pat_read(const unsigned char *__restrict__ K, const unsigned char *__restrict__ V,
                                               const int *__restrict__ pt, int L, int S, int HK, int page, unsigned *sink) {
  constexpr int LPR = ROWB / 16;             // lanes (16 B) per row
  constexpr int RPI = 256 / LPR;             // rows per block per load step
  int bid = blockIdx.x;
  const int s = bid % S; bid /= S;
  const int h = ROWB == 256 ? bid % HK : 0;
  const int b = ROWB == 256 ? bid / HK : bid;
  const int t0 = (int)((i64)L * s / S), t1 = (int)((i64)L * (s + 1) / S);
  const int npages = (L + page - 1) / page;
  const int r = threadIdx.x / LPR, c = threadIdx.x % LPR;
  unsigned acc = 0;
  auto addr = [&](int t) -> i64 {
    if (HNDL) { // [page, head, token, dim]: a page's rows of one head together (page 0: [b, head, token, dim])
      const i64 blk = page > 0 ? (i64)pt[(i64)b * npages + t / page] * HK + h : (i64)b * HK + h;
      return (blk * (page > 0 ? page : L) + (page > 0 ? t % page : t)) * 256 + c * 16;
    }
    i64 row;
    if (page > 0) row = (i64)pt[(i64)b * npages + t / page] * page + t % page;
    else row = (i64)b * L + t;
    return (row * HK * 256) + (ROWB == 256 ? h * 256 : 0) + c * 16;
  };
  for (int t = t0; t < t1; t += RPI * U) {
    uint4 kx[U], vx[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int tok = t + u * RPI + r;
      if (tok < t1) {
        const i64 a = addr(tok);
        kx[u] = __ldcs((const uint4 *)(K + a));
        vx[u] = __ldcs((const uint4 *)(V + a));
      } else kx[u] = vx[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= kx[u].x ^ kx[u].y ^ kx[u].z ^ kx[u].w ^ vx[u].x ^ vx[u].y ^ vx[u].z ^ vx[u].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

template <class F> float time_ms(F f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; i++) f();
  std::vector<float> v;
  for (int i = 0; i < 21; i++) {
    cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); v.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  const int HK = 8, D = 128;
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const i64 bytes1 = (i64)64 * 4096 * HK * D * 2; // one of K, V: 537 MB
  unsigned char *K, *V; unsigned *sink; int *pt;
  CK(cudaMalloc(&K, bytes1)); CK(cudaMalloc(&V, bytes1)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(K, 1, bytes1)); CK(cudaMemset(V, 2, bytes1));
  const i64 rows = bytes1 / (HK * D * 2);
  CK(cudaMalloc(&pt, rows * 4));
  // sequential read of both (2 x 537 MB), grid as the library's ceiling kernel? use sms*4 x 512
  const i64 n16 = bytes1 / 16;
  float seq = time_ms([&] { seq_read<<<sms * 4, 512>>>((const uint4 *)K, n16, sink); seq_read<<<sms * 4, 512>>>((const uint4 *)V, n16, sink); });
  const double seq_gbps = 2.0 * bytes1 / (seq * 1e-3) / 1e9;
  // the bench's ceiling: the same kernel over one 2 GiB buffer (the ratios
  // above are over two 537 MB launches, which read lower than the ceiling)
  double ceil_gbps;
  {
    uint4 *big; CK(cudaMalloc(&big, 2ll << 30)); CK(cudaMemset(big, 3, 2ll << 30));
    const float ms = time_ms([&] { seq_read<<<sms * 4, 512>>>(big, (2ll << 30) / 16, sink); });
    ceil_gbps = (2.0 * (1 << 30)) / (ms * 1e-3) / 1e9;
    CK(cudaFree(big));
  }
  printf("sequential read: %.1f GB/s (%.1f us), %.3f of the ceiling (one 2 GiB read: %.1f GB/s)\n", seq_gbps, seq * 1e3,
         seq_gbps / ceil_gbps, ceil_gbps);
  struct W { int B, L; } wls[] = {{64, 4096}, {8, 32768}, {256, 1024}};
  srand(7);
  for (auto wl : wls) {
    for (int page : {16, 0}) {
      // page table: a random permutation of all pages
      const int npages = (wl.L + 15) / 16;
      std::vector<int> perm((size_t)wl.B * npages);
      for (size_t i = 0; i < perm.size(); i++) perm[i] = (int)i;
      for (size_t i = perm.size() - 1; i > 0; i--) std::swap(perm[i], perm[rand() % (i + 1)]);
      CK(cudaMemcpy(pt, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
      for (int S : {1, 2, 4, 8, 16, 32}) {
        const int pg = page ? 16 : 0;
        float ms1 = time_ms([&] { pat_read<256, 4><<<wl.B * HK * S, 256>>>(K, V, pt, wl.L, S, HK, pg, sink); });
        float msh = time_ms([&] { pat_read<256, 4, true><<<wl.B * HK * S, 256>>>(K, V, pt, wl.L, S, HK, pg, sink); });
        float ms8 = time_ms([&] { pat_read<2048, 4><<<wl.B * S, 256>>>(K, V, pt, wl.L, S * 1, HK, pg, sink); });
        float ms8b = time_ms([&] { pat_read<2048, 4><<<wl.B * S * 8, 256>>>(K, V, pt, wl.L, S * 8, HK, pg, sink); });
        const double gb = 2.0 * bytes1 / 1e9;
        printf("%3dx%-6d %-8s splits %d: per-head %.1f GB/s (x %.3f, ceiling x %.3f, %d blocks; HND ceiling x %.3f) | all-heads same blocks/row %.3f (%d blocks) | all-heads 8x splits %.3f (%d blocks)\n",
               wl.B, wl.L, page ? "page16" : "unpaged", S, gb / (ms1 * 1e-3), gb / (ms1 * 1e-3) / seq_gbps, gb / (ms1 * 1e-3) / ceil_gbps, wl.B * HK * S,
               gb / (msh * 1e-3) / ceil_gbps,
               gb / (ms8 * 1e-3) / seq_gbps, wl.B * S, gb / (ms8b * 1e-3) / seq_gbps, wl.B * S * 8);
      }
    }
  }
  return 0;
}
