/* cpu_isa_avx512.c -- the CPU kernel for AVX-512 (F, BW, VL) with F16C. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>
#define ISA_SYM avx512
#define ISA_NAME "avx512"
#define VW 16
#define MK_RB 12
#define F16C_WIDTH 16
#include "cpu_kernel.inc"
#else
#include "cpu_kernels.h"
const pa_cpu_isa pa_cpu_isa_avx512 = {0};
#endif
