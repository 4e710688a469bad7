// scripts/lab/l2_read.cu -- the L2's read rate: every SM reads a buffer that
// fits in the L2 (8, 16, 32 MB) many times over, 16-byte loads that skip L1,
// at 2, 4 and 8 blocks of 512 threads per SM (docs/prefill.md:
// what a prefill block of 64 rows, 64 FLOP per byte of K/V, would need). A
// lower bound: each load's index also takes a 64-bit modulo.
//   nvcc -O3 -arch=sm_90a -o /tmp/l2_read scripts/lab/l2_read.cu && /tmp/l2_read
#include <cstdio>
#include <cuda_runtime.h>
__global__ void rd(const uint4 *__restrict__ p, size_t n, int reps, uint4 *out) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int r = 0; r < reps; r++) {
        size_t start = ((size_t)blockIdx.x * 7919 + r * 104729) % n;
        for (size_t i = threadIdx.x; i < n / gridDim.x; i += blockDim.x) {
            uint4 v = __ldcg(p + (start + i) % n);
            acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
        }
    }
    if (acc.x == 0x12345678) out[0] = acc;
}
int main() {
    for (size_t mb : {8, 16, 32}) {
        size_t n = mb * 1024 * 1024 / 16;
        uint4 *p, *o; cudaMalloc(&p, n * 16); cudaMalloc(&o, 16); cudaMemset(p, 1, n * 16);
        for (int bpsm : {2, 4, 8}) {
            int blocks = 132 * bpsm, reps = 64;
            cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
            rd<<<blocks, 512>>>(p, n, 2, o);
            cudaEventRecord(a); rd<<<blocks, 512>>>(p, n, reps, o); cudaEventRecord(b); cudaEventSynchronize(b);
            float ms; cudaEventElapsedTime(&ms, a, b);
            double bytes = (double)(n / blocks) * blocks * 16 * reps;
            printf("buffer %zu MB, %d blocks/SM: %.0f GB/s\n", mb, bpsm, bytes / ms / 1e6);
        }
        cudaFree(p); cudaFree(o);
    }
}
