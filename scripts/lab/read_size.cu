// scripts/lab/read_size.cu -- what a plain streaming read reaches at the
// decode bench's size (1 GiB) against the 2 GiB pass that the bench's "read"
// ceiling is measured on, timed as the library times a call (a hold kernel,
// then events around the kernel): the fixed cost of one pass (launch, ramp
// up, the last blocks' tail) that any decode kernel pays too.
//   grid    the ceiling's kernel (util.cu pa_read_stream: 512 threads, one
//           resident wave, grid-stride, four 16-byte loads in flight each)
//   chunks  one 128-thread block per 256 KB chunk (the hardware schedules
//           the blocks: dynamic balance, a start-up per block)
//   steal   resident 128-thread blocks taking 64 KB chunks from a counter
//   cp16x3, cp32x3, cp64x3w8   the same chunks through a ring of 3 shared-memory stages of 16 /
//           32 / 64 KB by cp.async, 128 / 128 / 256 threads (as many blocks a SM as fit: cp32x3
//           is the four-warp decode kernel's copy engine, cp64x3w8 the eight-warp one's, without
//           the arithmetic and with contiguous chunks; docs/decode.md)
//   stealcp steal with each thread's loads by cp.async into shared memory (LDGSTS against LDG)
//   cp16x2, cp8x2   rings of two stages (wait_group 0: every copy landed, as stealcp waits)
//   stealcp4, steal4   stealcp and steal at 4 blocks a SM; stealcpahead: stealcp claiming the next
//           chunk under the current one (no pause between chunks)
//   stealcpL1min  stealcp with the largest shared-memory carveout (228 KB: the L1 left is 28 KB)
//   cp16x3L1, cp32x3L1  the rings at 2 / 1 blocks a SM with a ~100 KB carveout (L1 ~156 KB)
//   cp16x3nb   cp16x3 without the barrier a stage (each thread waits for its own copies only; in
//           the H200 cp32x3 and a ring of 6 x 8 KB without it, and rings of 6 x 8, 6 x 16 and
//           12 x 8 KB with it, all read like cp16x3: 0.90-0.93 of the 2 GiB rate at 1 GiB)
//   nvcc -O3 -arch=sm_90a -o /tmp/read_size scripts/lab/read_size.cu && /tmp/read_size
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
typedef unsigned long long u64;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__global__ void hold(u64 ns) {
  u64 t0, t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
__device__ __forceinline__ unsigned fold(uint4 a) { return a.x ^ a.y ^ a.z ^ a.w; }
__global__ void __launch_bounds__(512) grid_read(const uint4 *__restrict__ p, long long n, unsigned *sink) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride)
    acc ^= fold(__ldcs(p + i)) ^ fold(__ldcs(p + i + stride)) ^ fold(__ldcs(p + i + 2 * stride)) ^ fold(__ldcs(p + i + 3 * stride));
  for (; i < n; i += stride) acc ^= fold(__ldcs(p + i));
  if (acc == 0x9e3779b9u) *sink = acc;
}
// one chunk of `words` 16-byte words per call, 128 threads, 8 loads in flight each
__device__ __forceinline__ unsigned chunk(const uint4 *__restrict__ q, long long words) {
  unsigned acc = 0;
  for (long long i = threadIdx.x; i < words; i += 1024) {
    uint4 v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = __ldcs(q + i + k * 128);
#pragma unroll
    for (int k = 0; k < 8; k++) acc ^= fold(v[k]);
  }
  return acc;
}
__global__ void __launch_bounds__(128) chunk_read(const uint4 *__restrict__ p, long long words, unsigned *sink) {
  unsigned acc = chunk(p + (long long)blockIdx.x * words, words);
  if (acc == 0x9e3779b9u) *sink = acc;
}
__global__ void __launch_bounds__(128) steal_read(const uint4 *__restrict__ p, long long words, int nchunks,
                                                  unsigned *counter, unsigned *sink) {
  __shared__ int s_c;
  unsigned acc = 0;
  for (;;) {
    if (threadIdx.x == 0) s_c = atomicAdd(counter, 1);
    __syncthreads();
    const int c = s_c;
    __syncthreads();
    if (c >= nchunks) break;
    acc ^= chunk(p + (long long)c * words, words);
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}
__device__ __forceinline__ void cp16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}
// one chunk of `words` 16-byte words as stealcp reads it: each thread's 8 copies by cp.async
// into its own words of buf (8 x 128 of them), wait_group 0, read back
__device__ __forceinline__ unsigned cp_chunk(uint4 *buf, const uint4 *__restrict__ q, long long words) {
  unsigned acc = 0;
  for (long long i = threadIdx.x; i < words; i += 1024) {
#pragma unroll
    for (int k = 0; k < 8; k++) cp16(&buf[k * 128 + threadIdx.x], q + i + k * 128);
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int k = 0; k < 8; k++) { const uint4 v = buf[k * 128 + threadIdx.x]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  }
  return acc;
}
// steal's blocks and chunks with each thread's 8 loads by cp.async into its own 16-byte words of
// shared memory (wait_group 0, then read back): LDGSTS against LDG, nothing else changed
template <int TAG = 0> // (TAG: a second copy of the function for its own carveout)
__global__ void __launch_bounds__(128) steal_cp_read(const uint4 *__restrict__ p, long long words, int nchunks,
                                                     unsigned *counter, unsigned *sink) {
  __shared__ uint4 buf[8 * 128];
  __shared__ int s_c;
  unsigned acc = 0;
  for (;;) {
    if (threadIdx.x == 0) s_c = atomicAdd(counter, 1u);
    __syncthreads();
    const int c = s_c;
    __syncthreads();
    if (c >= nchunks) break;
    acc ^= cp_chunk(buf, p + (long long)c * words, words);
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// stealcp with the next chunk claimed under the current one (thread 0's atomic at the chunk's
// start, its result stored at its end; one barrier a chunk): no pause between chunks
__global__ void __launch_bounds__(128) steal_cp_ahead(const uint4 *__restrict__ p, long long words, int nchunks,
                                                      unsigned *counter, unsigned *sink) {
  __shared__ uint4 buf[8 * 128];
  __shared__ int s_c[2];
  unsigned acc = 0;
  if (threadIdx.x == 0) s_c[0] = atomicAdd(counter, 1u);
  __syncthreads();
  for (int n = 0;; n++) {
    const int c = s_c[n & 1];
    if (c >= nchunks) break;
    unsigned nx = 0;
    if (threadIdx.x == 0) nx = atomicAdd(counter, 1u);
    acc ^= cp_chunk(buf, p + (long long)c * words, words);
    if (threadIdx.x == 0) s_c[(n + 1) & 1] = (int)nx;
    __syncthreads();
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// resident blocks of NT threads streaming 64 KB chunks from a counter through a ring of ST
// shared-memory stages of SB bytes by cp.async (16 bytes a thread an instruction), the decode
// kernel's copy engine without its arithmetic: a stage is waited for (wait_group ST - 2), a
// barrier, read back (each thread its own 16-byte words), and the copies of stage G + ST - 1
// go out into the buffer stage G - 1 left; the next chunk is claimed a chunk ahead
template <int NT, int SB, int ST, bool BAR = true, int TAG = 0>
__global__ void __launch_bounds__(NT) cp_read(const uint4 *__restrict__ p, long long, int nchunks, unsigned *counter,
                                              unsigned *sink) { // (chunks of 64 KB: no words argument used)
  extern __shared__ __align__(16) uint4 ring[];
  __shared__ int s_ids[8]; // the block's k-th claimed chunk in entry k % 8 (at most 5 in use)
  constexpr int SPC = (64 << 10) / SB, WPS = SB / 16 / NT; // stages a chunk, words a thread a stage
  const int tid = threadIdx.x;
  if (tid == 0) s_ids[0] = (int)atomicAdd(counter, 1u);
  __syncthreads();
  unsigned acc = 0, claim = 0;
  auto issue = [&](int G) {
    const int k = G / SPC, id = s_ids[k & 7];
    // the next chunk, claimed at this one's first stage and stored at its last (so that thread 0
    // does not wait for the atomic), read at its own first (a barrier between): one chunk a block
    // claimed ahead (two ahead left the blocks' ends 128 KB apart)
    if (tid == 0) {
      if (G % SPC == 0) claim = atomicAdd(counter, 1u);
      if (G % SPC == SPC - 1) s_ids[(k + 1) & 7] = (int)claim;
    }
    if (id < nchunks) {
      const uint4 *src = p + (long long)id * ((64 << 10) / 16) + (long long)(G % SPC) * (SB / 16);
      uint4 *dst = ring + (G % ST) * (SB / 16);
#pragma unroll
      for (int w = 0; w < WPS; w++) cp16(dst + w * NT + tid, src + w * NT + tid);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  for (int G = 0; G < ST - 1; G++) issue(G);
  for (int G = 0;; G++) {
    asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
    // (BAR false: no barrier a stage; each thread reads back only its own words, and the claims
    // in s_ids are written a whole chunk before they are read: a timing variant, racy in theory)
    if (BAR || G % SPC == 0) __syncthreads();
    if (s_ids[(G / SPC) & 7] >= nchunks) break;
    const uint4 *b = ring + (G % ST) * (SB / 16);
#pragma unroll
    for (int w = 0; w < WPS; w++) { const uint4 v = b[w * NT + tid]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    issue(G + ST - 1);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (acc == 0x9e3779b9u) *sink = acc;
}

// a chunk reader: (buffer, chunk words, chunks, counter, sink)
typedef void (*chunk_kernel)(const uint4 *, long long, int, unsigned *, unsigned *);

int main() {
  const long long maxb = 2ll << 30;
  uint4 *buf; unsigned *sink, *counter;
  CK(cudaMalloc(&buf, maxb)); CK(cudaMalloc(&sink, 4)); CK(cudaMalloc(&counter, 4)); CK(cudaMemset(buf, 1, maxb));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  int sms = 0, occ512 = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ512, grid_read, 512, 0));
  double ceiling = 0;
  const long long sizes[] = {2ll << 30, 1ll << 30, 1ll << 28, 1ll << 26};
  // The chunk readers (64 KB chunks from the counter): name, kernel, threads, dynamic shared
  // memory, blocks a SM (0: as many as fit, at most 8 for the 128-thread steal kinds' static
  // 16 KB), carveout (-1: the driver's choice)
  struct kind { const char *name; chunk_kernel k; int nt, smem, per_sm, carveout; };
  const kind kinds[] = {
      {"steal", steal_read, 128, 0, 8, -1},
      {"cp16x3", cp_read<128, 16 << 10, 3>, 128, 3 * (16 << 10), 0, -1},
      {"cp32x3", cp_read<128, 32 << 10, 3>, 128, 3 * (32 << 10), 0, -1},
      {"cp64x3w8", cp_read<256, 64 << 10, 3>, 256, 3 * (64 << 10), 0, -1},
      {"stealcp", steal_cp_read<0>, 128, 0, 8, -1},
      {"cp16x2", cp_read<128, 16 << 10, 2>, 128, 2 * (16 << 10), 0, -1},
      {"cp8x2", cp_read<128, 8 << 10, 2>, 128, 2 * (8 << 10), 0, -1},
      {"cp16x3nb", cp_read<128, 16 << 10, 3, false>, 128, 3 * (16 << 10), 0, -1},
      {"stealcp4", steal_cp_read<0>, 128, 0, 4, -1},
      {"stealcpahead", steal_cp_ahead, 128, 0, 8, -1},
      {"steal4", steal_read, 128, 0, 4, -1},
      // the L1 / shared memory split: stealcp with the most shared memory (the L1 left: 256 -
      // 228 KB), the rings at fewer blocks with ~100 KB (the L1 left ~156 KB)
      {"stealcpL1min", steal_cp_read<1>, 128, 0, 8, 100},
      {"cp16x3L1", cp_read<128, 16 << 10, 3, true, 1>, 128, 3 * (16 << 10), 2, 44},
      {"cp32x3L1", cp_read<128, 32 << 10, 3, true, 1>, 128, 3 * (32 << 10), 1, 44},
  };
  const int nk = (int)(sizeof kinds / sizeof kinds[0]);
  std::vector<int> grid(nk);
  for (int i = 0; i < nk; i++) {
    const kind &k = kinds[i];
    if (k.smem > 0) CK(cudaFuncSetAttribute(k.k, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem));
    if (k.carveout >= 0) CK(cudaFuncSetAttribute(k.k, cudaFuncAttributePreferredSharedMemoryCarveout, k.carveout));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k.k, k.nt, k.smem));
    grid[i] = sms * (k.per_sm > 0 ? std::min(occ, k.per_sm) : occ);
  }
  for (int kind = -2; kind < nk; kind++) { // (-2: grid, -1: chunks, then the table)
    for (long long bytes : sizes) {
      std::vector<double> t;
      for (int it = 0; it < 25; it++) {
        hold<<<1, 1, 0, s>>>(30000);
        CK(cudaMemsetAsync(counter, 0, 4, s));
        cudaEventRecord(e0, s);
        const long long n = bytes / 16;
        if (kind == -2) grid_read<<<sms * occ512, 512, 0, s>>>(buf, n, sink);
        else if (kind == -1) chunk_read<<<(unsigned)(bytes / (256 << 10)), 128, 0, s>>>(buf, (256 << 10) / 16, sink);
        else kinds[kind].k<<<grid[kind], kinds[kind].nt, kinds[kind].smem, s>>>(buf, (64 << 10) / 16, (int)(bytes / (64 << 10)), counter, sink);
        cudaEventRecord(e1, s);
        CK(cudaStreamSynchronize(s));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        if (it >= 3) t.push_back(ms * 1e-3);
      }
      CK(cudaGetLastError());
      std::sort(t.begin(), t.end());
      const double best = bytes / t[0] / 1e9, med = bytes / t[t.size() / 2] / 1e9;
      if (kind == -2 && bytes == sizes[0]) ceiling = best;
      const char *name = kind == -2 ? "grid" : kind == -1 ? "chunks" : kinds[kind].name;
      if (kind >= 0) printf("[%d blocks a SM] ", grid[kind] / sms);
      printf("%-7s %6lld MiB  best %7.1f GB/s (%.3f of grid 2 GiB best)  median %7.1f GB/s (%.3f)  median %7.1f us\n",
             name, bytes >> 20, best, best / ceiling, med, med / ceiling, t[t.size() / 2] * 1e6);
    }
  }
  return 0;
}
