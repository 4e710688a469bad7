/* cpu_isa_avx2.c -- the CPU kernel for AVX2 + FMA + F16C. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#define ISA_SYM avx2
#define ISA_NAME "avx2"
#define VW 8
#define MK_RB 6
#define LOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#include "cpu_kernel.inc"
#else
#include "cpu_kernels.h"
const pa_cpu_isa pa_cpu_isa_avx2 = {0};
#endif
