/* cpu_isa_avx512.c -- the CPU kernel for AVX-512 (F, BW, VL, DQ) with F16C. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>
#define ISA_SYM avx512
#define ISA_NAME "avx512"
#define VW 16
#define MK_RB 12
#define LOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#include "cpu_kernel.inc"
#else
#include "cpu_kernels.h"
const pa_cpu_isa pa_cpu_isa_avx512 = {0};
#endif
