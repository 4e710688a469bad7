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
/* fp8 through f16: e5m2 is an f16's upper byte; e4m3's 7 bits of exponent
 * and mantissa shifted into an f16 (sign apart) give its value / 256, normal
 * and subnormal alike, and its NaN pattern (all seven ones) becomes an f16 NaN */
static inline __m256 pa_load_e5m2(const void *p) {
    const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_slli_epi16(x, 8));
}
/* e4m3 as f16 bits of value / 256: exponent and mantissa shifted into
 * place, the sign by sign extension (bit 14 holds its copy, cleared) */
static inline __m128i pa_e4m3_h(const void *p) {
    const __m128i x = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm_and_si128(_mm_slli_epi16(x, 7), _mm_set1_epi16((short)0xbf80));
}
static inline __m256 pa_load_e4m3(const void *p) {
    const __m128i em = _mm_set1_epi16(0x3f80), h = pa_e4m3_h(p);
    const __m128i hn = _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), _mm_cmpeq_epi16(_mm_and_si128(h, em), em));
    return _mm256_mul_ps(_mm256_cvtph_ps(hn), _mm256_set1_ps(256.0f));
}
/* (rows without a NaN code: no fix-up) */
static inline __m256 pa_load_e4m3_finite(const void *p) { return _mm256_mul_ps(_mm256_cvtph_ps(pa_e4m3_h(p)), _mm256_set1_ps(256.0f)); }
#define LOAD_E5M2(p) pa_load_e5m2(p)
#define LOAD_E4M3(p) pa_load_e4m3(p)
#define LOAD_E4M3_FINITE(p) pa_load_e4m3_finite(p)
#include "cpu_kernel.inc"
#else
#include "cpu_kernels.h"
const pa_cpu_isa pa_cpu_isa_avx2 = {0};
#endif
