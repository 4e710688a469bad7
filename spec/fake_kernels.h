/*
 * spec/fake_kernels.h -- launch facts of CUDA kernel variants without a GPU,
 * for the planner's host tests (spec/planner_check.c) and the equivalence
 * harness (spec/plan_equiv.c): what a loaded module's pa_<kind>_info would
 * say (threads, shared bytes, keys a stage, page ids or queries a tile) and
 * how many blocks a SM would hold, computed from the variant's name alone.
 * Shaped like the real kernels' (the same orders of magnitude, eight-warp
 * decode blocks too big for an A100's 163 KB), but a table, not a model:
 * `salt` varies the occupancy so that one run sees many capacities.
 */
#ifndef PA_FAKE_KERNELS_H
#define PA_FAKE_KERNELS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* key=value of a variant name (-1: absent; page: -1 contig, 0 any) */
static int fake_key(const char *variant, const char *key) {
    char pat[24];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *at = strstr(variant, pat);
    if (!at) return -1;
    at += strlen(pat);
    if (strncmp(at, "contig", 6) == 0) return -1;
    if (strncmp(at, "any", 3) == 0) return 0;
    if (strncmp(at, "bf16", 4) == 0) return 2;
    if (strncmp(at, "f16", 3) == 0) return 1;
    if (strncmp(at, "f32", 3) == 0) return 0;
    return atoi(at);
}

static int fake_kind_is(const char *variant, const char *kind) {
    const size_t n = strlen(kind);
    return strncmp(variant, kind, n) == 0 && (variant[n] == ' ' || variant[n] == '\0');
}

/* The module's info array. */
static void fake_info(const char *variant, int info[4]) {
    const int D = fake_key(variant, "D"), stages = fake_key(variant, "stages"), gt = fake_key(variant, "gt");
    memset(info, 0, 4 * sizeof *info);
    if (fake_kind_is(variant, "decode_mma")) {
        const int kpw = fake_key(variant, "kpw"), nw = fake_key(variant, "nw"), hw = fake_key(variant, "hw");
        const int tokens = hw ? kpw : kpw * nw;
        const int esz = strstr(variant, "kv=fp8") ? 1 : 2; /* (fp8 stages hold one byte an element) */
        info[0] = 32 * nw;
        info[2] = tokens;
        info[3] = fake_key(variant, "maxp");
        info[1] = stages * tokens * D * esz * 2 * (hw ? 4 : 1) + info[3] * 4 * (fake_key(variant, "persist") ? 2 : 1);
    } else if (fake_kind_is(variant, "decode")) {
        info[0] = 128;
        info[2] = 32;
        info[3] = fake_key(variant, "maxp");
        info[1] = stages * 16 * D * 4 * 2 + info[3] * 4;
    } else if (fake_kind_is(variant, "prefill_ws")) {
        const int bn = D <= 128 ? 128 : 64;
        info[0] = 384;
        info[2] = bn;
        info[3] = 128 / gt > 0 ? 128 / gt : 1;
        info[1] = stages * bn * D * 2 * 2 + 128 * D * 2;
    } else if (fake_kind_is(variant, "prefill_f8")) { /* (prefill_f8.cu: Q 16-bit, K and V^T tiles of one byte) */
        info[0] = 384;
        info[2] = 128;
        info[3] = 128 / gt > 0 ? 128 / gt : 1;
        info[1] = 1024 + 128 * D * 2 + 2 * stages * 128 * D;
    } else if (fake_kind_is(variant, "prefill_wgmma")) {
        const int bn = D <= 128 ? 64 : 32;
        info[0] = 256; /* (the same query tile as prefill_ws: the planner swaps one for the other) */
        info[2] = bn;
        info[3] = 128 / gt > 0 ? 128 / gt : 1;
        info[1] = stages * bn * D * 2 * 2 + 128 * D * 2;
    } else if (fake_kind_is(variant, "prefill")) {
        info[0] = 256;
        info[2] = 64;
        info[3] = 128 / gt > 0 ? 128 / gt : 1;
        info[1] = stages * 64 * D * 2 * 2;
    } else if (fake_kind_is(variant, "fallback")) {
        info[0] = 256;
        info[1] = 16; /* rows */
        info[2] = 32; /* keys a tile */
    }
}

/* Blocks of `threads` and `smem` bytes a SM holds (228 KB, 2048 threads),
 * at most the variant's minb-bounded count, times a salt of 1..3 halved
 * back: a different capacity for different salts. */
static int fake_blocks_per_sm(const char *variant, int threads, int smem, unsigned salt) {
    int by_smem = (228 * 1024) / (smem + 1024), by_threads = 2048 / (threads > 0 ? threads : 1);
    int n = by_smem < by_threads ? by_smem : by_threads;
    const int minb = fake_key(variant, "minb");
    if (minb > 0 && n > 2 * minb) n = 2 * minb;
    if (salt % 3 == 1 && n > 1) n--;
    if (salt % 3 == 2) n++;
    return n;
}

#endif /* PA_FAKE_KERNELS_H */
