// scripts/micro/read_size.cu -- what a plain streaming read reaches at the
// decode bench's size (1 GiB) against the 2 GiB pass that the bench's "read"
// ceiling is measured on, timed as the library times a call (a hold kernel,
// then events around the kernel): the fixed cost of one pass (launch, ramp
// up, the last blocks' tail) that any decode kernel pays too.
//   grid    the ceiling's kernel (util.cu pa_read_stream: 512 threads, one
//           resident wave, grid-stride, four 16-byte loads in flight each)
//   chunks  one 128-thread block per 256 KB chunk (the hardware schedules
//           the blocks: dynamic balance, a start-up per block)
//   steal   resident 128-thread blocks taking 64 KB chunks from a counter
//   nvcc -O3 -arch=sm_90a -o /tmp/read_size scripts/micro/read_size.cu && /tmp/read_size
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
int main() {
  const long long maxb = 2ll << 30;
  uint4 *buf; unsigned *sink, *counter;
  CK(cudaMalloc(&buf, maxb)); CK(cudaMalloc(&sink, 4)); CK(cudaMalloc(&counter, 4)); CK(cudaMemset(buf, 1, maxb));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  int sms = 0, occ512 = 0, occ128 = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ512, grid_read, 512, 0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ128, steal_read, 128, 0));
  double ceiling = 0;
  const long long sizes[] = {2ll << 30, 1ll << 30, 1ll << 28, 1ll << 26};
  for (int kind = 0; kind < 3; kind++) {
    for (long long bytes : sizes) {
      std::vector<double> t;
      for (int it = 0; it < 25; it++) {
        hold<<<1, 1, 0, s>>>(30000);
        CK(cudaMemsetAsync(counter, 0, 4, s));
        cudaEventRecord(e0, s);
        const long long n = bytes / 16;
        if (kind == 0) grid_read<<<sms * occ512, 512, 0, s>>>(buf, n, sink);
        else if (kind == 1) chunk_read<<<(unsigned)(bytes / (256 << 10)), 128, 0, s>>>(buf, (256 << 10) / 16, sink);
        else steal_read<<<sms * std::min(occ128, 8), 128, 0, s>>>(buf, (64 << 10) / 16, (int)(bytes / (64 << 10)), counter, sink);
        cudaEventRecord(e1, s);
        CK(cudaStreamSynchronize(s));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        if (it >= 3) t.push_back(ms * 1e-3);
      }
      std::sort(t.begin(), t.end());
      const double best = bytes / t[0] / 1e9, med = bytes / t[t.size() / 2] / 1e9;
      if (kind == 0 && bytes == sizes[0]) ceiling = best;
      const char *names[] = {"grid", "chunks", "steal"};
      printf("%-7s %6lld MiB  best %7.1f GB/s (%.3f of grid 2 GiB best)  median %7.1f GB/s (%.3f)  median %7.1f us\n",
             names[kind], bytes >> 20, best, best / ceiling, med, med / ceiling, t[t.size() / 2] * 1e6);
    }
  }
  return 0;
}
