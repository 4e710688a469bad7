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
/* fp8 through f16 (cpu_isa_avx2.c says how) */
static inline __m512 pa_load_e5m2(const void *p) {
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(x, 8));
}
/* e4m3 as f16 bits of value / 256: exponent and mantissa shifted into
 * place, the sign by sign extension (bit 14 holds its copy, cleared) */
static inline __m256i pa_e4m3_h(const void *p) {
    const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16((short)0xbf80));
}
static inline __m512 pa_load_e4m3(const void *p) {
    const __m256i em = _mm256_set1_epi16(0x3f80), h = pa_e4m3_h(p);
    const __m256i hn = _mm256_mask_mov_epi16(h, _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, em), em), _mm256_set1_epi16(0x7e00));
    return _mm512_mul_ps(_mm512_cvtph_ps(hn), _mm512_set1_ps(256.0f));
}
/* (rows without a NaN code: no fix-up) */
static inline __m512 pa_load_e4m3_finite(const void *p) { return _mm512_mul_ps(_mm512_cvtph_ps(pa_e4m3_h(p)), _mm512_set1_ps(256.0f)); }
#define LOAD_E5M2(p) pa_load_e5m2(p)
#define LOAD_E4M3(p) pa_load_e4m3(p)
#define LOAD_E4M3_FINITE(p) pa_load_e4m3_finite(p)
#include "cpu_kernel.inc"
#else
#include "cpu_kernels.h"
const pa_cpu_isa pa_cpu_isa_avx512 = {0};
#endif
