// scripts/lab/cta_gap.cu -- how long an SM takes from one block's end to
// the next block's start: 16 waves of blocks that busy-wait 5 us and stamp
// %globaltimer at their start and end (with their SM), for 384 threads and
// 0 to 224 KB of dynamic shared memory, and with what prefill_ws.cu does at
// a block's start and end (setmaxnreg, mbarrier inits, a bulk load waited
// for, bulk stores waited for .read or fully, 16-byte stores).
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/cta_gap scripts/lab/cta_gap.cu && /tmp/cta_gap
// H200: median 0.16 us in every configuration (docs/prefill.md).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
typedef unsigned long long u64;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)
__device__ __forceinline__ u64 gt() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
template <int MODE>
__global__ void __launch_bounds__(384, 1) busy(u64 ns, u64 *rec, unsigned char *gbuf) {
  extern __shared__ unsigned char sm[];
  u64 t0 = gt();
  if (MODE == 1) { // setmaxnreg like the ws kernel
    if (threadIdx.x < 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
  }
  if (MODE == 2) { // mbarrier init + fence + syncthreads
    __shared__ __align__(8) u64 bars[16];
    if (threadIdx.x < 16) asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(&bars[threadIdx.x])));
    asm volatile("fence.mbarrier_init.release.cluster;");
    __syncthreads();
  }
  u64 t;
  if (MODE == 6) { // bulk load 64 KB at the start, wait for it
    __shared__ __align__(8) u64 bar;
    unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(b));
      asm volatile("fence.mbarrier_init.release.cluster;");
      asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(b), "r"(65536));
      for (int i = 0; i < 4; i++)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
          :: "r"((unsigned)__cvta_generic_to_shared(sm) + i * 16384), "l"(gbuf + ((long long)blockIdx.x * 65536 + i * 16384) % (64ll << 20)), "r"(16384), "r"(b) : "memory");
    }
    __syncthreads();
    asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], 0; @!p bra W; }" :: "r"(b) : "memory");
  }
  do { t = gt(); } while (t - t0 < ns);
  if (MODE == 3 || MODE == 4 || MODE == 7) {
    if (threadIdx.x == 0 || (MODE == 7 && threadIdx.x == 128)) {
      int half = MODE == 7 ? 16384 : 32768, off = threadIdx.x == 128 ? 16384 : 0;
      asm volatile("fence.proxy.async.shared::cta;");
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(gbuf + (long long)blockIdx.x * 32768 + off), "r"((unsigned)__cvta_generic_to_shared(sm) + off), "r"(half) : "memory");
      asm volatile("cp.async.bulk.commit_group;");
      if (MODE == 4) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      else asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
  }
  if (MODE == 5) {
    uint4 *g = (uint4 *)(gbuf + (long long)blockIdx.x * 32768);
    for (int i = threadIdx.x; i < 2048; i += blockDim.x) g[i] = make_uint4(i, 1, 2, 3);
  }
  __shared__ unsigned char st[384]; st[threadIdx.x] = (unsigned char)t;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    rec[blockIdx.x * 3] = t0; rec[blockIdx.x * 3 + 1] = gt(); rec[blockIdx.x * 3 + 2] = s + (u64)st[7] * 0;
  }
}
unsigned char *g_buf;
template <int MODE> void run(const char *name, int threads, int smem, u64 ns, int nb) {
  u64 *d; CK(cudaMalloc(&d, nb * 3 * 8));
  CK(cudaFuncSetAttribute(busy<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int rep = 0; rep < 2; rep++) { busy<MODE><<<nb, threads, smem>>>(ns, d, g_buf); CK(cudaDeviceSynchronize()); }
  std::vector<u64> h(nb * 3); CK(cudaMemcpy(h.data(), d, nb * 24, cudaMemcpyDeviceToHost));
  std::vector<std::vector<std::pair<u64,u64>>> per(200);
  u64 first = ~0ull, last = 0;
  for (int i = 0; i < nb; i++) { per[h[i*3+2]].push_back({h[i*3], h[i*3+1]}); first = std::min(first, h[i*3]); last = std::max(last, h[i*3+1]); }
  std::vector<double> gaps;
  for (auto &v : per) { std::sort(v.begin(), v.end()); for (size_t i = 1; i < v.size(); i++) if (v[i].first > v[i-1].second) gaps.push_back((v[i].first - v[i-1].second) / 1e3); }
  std::sort(gaps.begin(), gaps.end());
  double mean = 0; for (double g : gaps) mean += g; mean /= std::max<size_t>(1, gaps.size());
  printf("%-34s thr %3d smem %6d: gaps %zu, median %.2f us, mean %.2f, p10 %.2f p90 %.2f; span %.1f us\n", name, threads, smem, gaps.size(),
         gaps.empty() ? 0 : gaps[gaps.size()/2], mean, gaps.empty()?0:gaps[gaps.size()/10], gaps.empty()?0:gaps[gaps.size()*9/10], (last-first)/1e3);
  CK(cudaFree(d));
}
int main() {
  int nb = 132 * 16; u64 ns = 5000;
  CK(cudaMalloc(&g_buf, 96ll << 20)); CK(cudaMemset(g_buf, 0, 96ll << 20));
  run<3>("bulk store 32K, wait read", 384, 224 * 1024, ns, nb);
  run<4>("bulk store 32K, wait all", 384, 224 * 1024, ns, nb);
  run<7>("2 threads bulk store 16K, read", 384, 224 * 1024, ns, nb);
  run<5>("st.global 32K", 384, 224 * 1024, ns, nb);
  run<6>("bulk load 64K at start", 384, 224 * 1024, ns, nb);
  run<0>("plain", 384, 0, ns, nb);
  run<0>("plain", 384, 100 * 1024, ns, nb);
  run<0>("plain", 384, 224 * 1024, ns, nb);
  run<0>("plain", 128, 224 * 1024, ns, nb);
  run<1>("setmaxnreg", 384, 224 * 1024, ns, nb);
  run<2>("mbarrier init", 384, 224 * 1024, ns, nb);
  run<0>("plain, 20 us", 384, 224 * 1024, 20000, nb);
  return 0;
}
