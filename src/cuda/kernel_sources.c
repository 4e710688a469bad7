/*
 * kernel_sources.c -- the CUDA C sources of kernels/, embedded in the library
 * so that an installed libpagedattn needs no source tree (NVRTC compiles them
 * at run time; $PAGEDATTN_KERNEL_DIR may point at a directory to use instead,
 * for development).
 *
 * The bytes come in with the assembler's .incbin, which finds the files through
 * the -Wa,-I<kernels dir> option that premake5.lua adds. .incbin is invisible
 * to the compiler's dependency tracking, so each file is also #included here
 * with PA_EMBED_ONLY defined: every kernel file wraps its body in
 * `#ifndef PA_EMBED_ONLY`, the include adds nothing, but -MMD records the
 * dependency and an edited kernel rebuilds this file.
 */
#include "cuda_internal.h"

#define PA_EMBED_ONLY
#include "../../kernels/params.h"
#include "../../kernels/common.cuh"
#include "../../kernels/attn_common.cuh"
#include "../../kernels/mma.cuh"
#include "../../kernels/util.cu"
#include "../../kernels/append.cu"
#include "../../kernels/decode.cu"
#include "../../kernels/decode_mma_shape.cuh"
#include "../../kernels/decode_mma_fp8.cuh"
#include "../../kernels/decode_mma.cu"
#include "../../kernels/fallback.cu"
#include "../../kernels/prefill_common.cuh"
#include "../../kernels/wgmma.cuh"
#include "../../kernels/wgmma_ops.cuh"
#include "../../kernels/prefill_wgmma.cuh"
#include "../../kernels/prefill.cu"
#include "../../kernels/prefill_wgmma.cu"
#include "../../kernels/ws_common.cuh"
#include "../../kernels/prefill_ws.cu"
#include "../../kernels/prefill_f8.cu"
#include "../../kernels/merge.cu"
#undef PA_EMBED_ONLY

/* Each file becomes a NUL-terminated byte array: pa_ksrc_<id> .. pa_ksrc_<id>_end. */
#define EMBED(id, file)                                                        \
    __asm__(".section .rodata.pa_kernels,\"a\",@progbits\n"                    \
            ".balign 16\n"                                                     \
            ".local pa_ksrc_" #id "\n"                                         \
            "pa_ksrc_" #id ":\n"                                               \
            ".incbin \"" file "\"\n"                                           \
            ".local pa_ksrc_" #id "_end\n"                                     \
            "pa_ksrc_" #id "_end:\n"                                           \
            ".byte 0\n"                                                        \
            ".previous\n");                                                    \
    extern const char pa_ksrc_##id[], pa_ksrc_##id##_end[];

EMBED(params, "params.h")
EMBED(common, "common.cuh")
EMBED(attn_common, "attn_common.cuh")
EMBED(mma, "mma.cuh")
EMBED(util, "util.cu")
EMBED(append, "append.cu")
EMBED(decode, "decode.cu")
EMBED(decode_mma, "decode_mma.cu")
EMBED(fallback, "fallback.cu")
EMBED(decode_mma_shape, "decode_mma_shape.cuh")
EMBED(decode_mma_fp8, "decode_mma_fp8.cuh")
EMBED(prefill_common, "prefill_common.cuh")
EMBED(wgmma, "wgmma.cuh")
EMBED(wgmma_ops, "wgmma_ops.cuh")
EMBED(prefill_wgmma_h, "prefill_wgmma.cuh")
EMBED(prefill, "prefill.cu")
EMBED(prefill_wgmma, "prefill_wgmma.cu")
EMBED(ws_common, "ws_common.cuh")
EMBED(prefill_ws, "prefill_ws.cu")
EMBED(prefill_f8, "prefill_f8.cu")
EMBED(merge, "merge.cu")

int pa_kernel_sources(pa_kernel_source out[PA_KERNEL_SOURCES]) {
    const pa_kernel_source table[PA_KERNEL_SOURCES] = {
        {"params.h", pa_ksrc_params, (size_t)(pa_ksrc_params_end - pa_ksrc_params)},
        {"common.cuh", pa_ksrc_common, (size_t)(pa_ksrc_common_end - pa_ksrc_common)},
        {"attn_common.cuh", pa_ksrc_attn_common, (size_t)(pa_ksrc_attn_common_end - pa_ksrc_attn_common)},
        {"mma.cuh", pa_ksrc_mma, (size_t)(pa_ksrc_mma_end - pa_ksrc_mma)},
        {"util.cu", pa_ksrc_util, (size_t)(pa_ksrc_util_end - pa_ksrc_util)},
        {"append.cu", pa_ksrc_append, (size_t)(pa_ksrc_append_end - pa_ksrc_append)},
        {"decode.cu", pa_ksrc_decode, (size_t)(pa_ksrc_decode_end - pa_ksrc_decode)},
        {"decode_mma.cu", pa_ksrc_decode_mma, (size_t)(pa_ksrc_decode_mma_end - pa_ksrc_decode_mma)},
        {"decode_mma_shape.cuh", pa_ksrc_decode_mma_shape, (size_t)(pa_ksrc_decode_mma_shape_end - pa_ksrc_decode_mma_shape)},
        {"decode_mma_fp8.cuh", pa_ksrc_decode_mma_fp8, (size_t)(pa_ksrc_decode_mma_fp8_end - pa_ksrc_decode_mma_fp8)},
        {"fallback.cu", pa_ksrc_fallback, (size_t)(pa_ksrc_fallback_end - pa_ksrc_fallback)},
        {"prefill_common.cuh", pa_ksrc_prefill_common, (size_t)(pa_ksrc_prefill_common_end - pa_ksrc_prefill_common)},
        {"wgmma.cuh", pa_ksrc_wgmma, (size_t)(pa_ksrc_wgmma_end - pa_ksrc_wgmma)},
        {"wgmma_ops.cuh", pa_ksrc_wgmma_ops, (size_t)(pa_ksrc_wgmma_ops_end - pa_ksrc_wgmma_ops)},
        {"prefill_wgmma.cuh", pa_ksrc_prefill_wgmma_h, (size_t)(pa_ksrc_prefill_wgmma_h_end - pa_ksrc_prefill_wgmma_h)},
        {"prefill.cu", pa_ksrc_prefill, (size_t)(pa_ksrc_prefill_end - pa_ksrc_prefill)},
        {"prefill_wgmma.cu", pa_ksrc_prefill_wgmma, (size_t)(pa_ksrc_prefill_wgmma_end - pa_ksrc_prefill_wgmma)},
        {"ws_common.cuh", pa_ksrc_ws_common, (size_t)(pa_ksrc_ws_common_end - pa_ksrc_ws_common)},
        {"prefill_ws.cu", pa_ksrc_prefill_ws, (size_t)(pa_ksrc_prefill_ws_end - pa_ksrc_prefill_ws)},
        {"prefill_f8.cu", pa_ksrc_prefill_f8, (size_t)(pa_ksrc_prefill_f8_end - pa_ksrc_prefill_f8)},
        {"merge.cu", pa_ksrc_merge, (size_t)(pa_ksrc_merge_end - pa_ksrc_merge)},
    };
    memcpy(out, table, sizeof table);
    return PA_KERNEL_SOURCES;
}
