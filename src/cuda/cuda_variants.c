/*
 * cuda_variants.c -- the table of CUDA kernel variants (cuda_variants.h):
 * each key's domain, each kind's keys, the rules that tie keys together, and
 * what is derived from them (names, parsing, defines, eligibility, the
 * catalog). The kernels' static_asserts guard the same rules a second time.
 */
#define _GNU_SOURCE
#include "cuda_variants.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- keys: names and domains ---- */

static const char *const key_names[PA_KEY_COUNT] = {
    "dtype", "D", "nq", "gt", "page", "stages", "maxp", "kpw", "persist", "minb", "hw", "nw", "natural", "tma", "kv",
};

/* kv's default (the dtype's own caches): left out of names and defines */
static bool at_default(pa_vkey key, int32_t v) { return key == PA_KEY_KV && v == 0; }

static bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

static bool in_domain(pa_vkey key, int32_t v) {
    switch (key) {
    case PA_KEY_DTYPE: return v >= 0 && v <= 2;
    case PA_KEY_D: return v >= 8 && v <= 256 && v % 8 == 0;
    case PA_KEY_NQ: return v >= 1 && v <= 8;
    case PA_KEY_GT: return v >= 1 && v <= 16;
    case PA_KEY_PAGE: return v == PA_PAGE_CONTIG || v == PA_PAGE_ANY || (is_pow2(v) && v <= (1 << 20));
    case PA_KEY_STAGES: return v >= 2 && v <= 8;
    case PA_KEY_MAXP: return v >= 32 && v <= 8192 && v % 32 == 0;
    case PA_KEY_KPW: return v == 8 || v == 16;
    case PA_KEY_MINB: return v >= 1 && v <= 4;
    case PA_KEY_NW: return v == 4 || v == 8;
    case PA_KEY_TMA: return v >= 0 && v <= 2;
    case PA_KEY_KV: return v == 0 || v == PA_FP8_E4M3 || v == PA_FP8_E5M2;
    case PA_KEY_PERSIST:
    case PA_KEY_HW:
    case PA_KEY_NATURAL: return v == 0 || v == 1;
    case PA_KEY_COUNT: break;
    }
    return false;
}

/* The domain in increasing order: the first candidate, and the value after v
 * (false: none). */
static int32_t domain_max(pa_vkey key) {
    switch (key) {
    case PA_KEY_D: return 256;
    case PA_KEY_PAGE: return 1 << 20;
    case PA_KEY_MAXP: return 8192;
    default: return 16;
    }
}
static int32_t domain_first(pa_vkey key) { return key == PA_KEY_PAGE ? PA_PAGE_CONTIG : 0; }
static bool domain_next(pa_vkey key, int32_t v, int32_t *next) {
    if (key == PA_KEY_PAGE) {
        const int64_t n = v < 1 ? (int64_t)v + 1 : (int64_t)v * 2;
        if (n > domain_max(key)) return false;
        *next = (int32_t)n;
        return true;
    }
    for (int32_t n = v + 1; n <= domain_max(key); n++)
        if (in_domain(key, n)) {
            *next = n;
            return true;
        }
    return false;
}

/* ---- kinds ---- */

#define K(key) (1u << (key))
/* A catalog axis: a key and its sample values. */
typedef struct axis {
    pa_vkey key;
    int n;
    int32_t values[8];
} axis;

typedef struct kind_def {
    const char *name, *file, *info, *entry;
    bool sm90a;
    int nkeys;
    pa_vkey keys[13]; /* in the order of its names */
    /* the catalog: every allowed combination of the path axes' values (the
     * first axis slowest); the shape axes' values in turn */
    int npaths, nshapes;
    axis paths[6], shapes[8];
} kind_def;

#define PAGES6 {PA_KEY_PAGE, 6, {16, 256, PA_PAGE_CONTIG, PA_PAGE_ANY, 1, 8}}
static const kind_def kinds[PA_VK_COUNT] = {
    [PA_VK_UTIL] = {"util", "util.cu", NULL, NULL, false, 0, {0}, 0, 0, {{0}}, {{0}}},
    [PA_VK_APPEND] = {"append", "append.cu", NULL, NULL, false, 2, {PA_KEY_DTYPE, PA_KEY_KV}, 2, 0,
                      {{PA_KEY_DTYPE, 3, {0, 1, 2}}, {PA_KEY_KV, 3, {0, PA_FP8_E4M3, PA_FP8_E5M2}}}, {{0}}},
    [PA_VK_MERGE] = {"merge", "merge.cu", NULL, NULL, false, 1, {PA_KEY_DTYPE}, 1, 0,
                     {{PA_KEY_DTYPE, 3, {0, 1, 2}}}, {{0}}},
    [PA_VK_DECODE] = {"decode", "decode.cu", "pa_decode_info", "pa_decode", false, 8,
                      {PA_KEY_DTYPE, PA_KEY_D, PA_KEY_NQ, PA_KEY_GT, PA_KEY_PAGE, PA_KEY_STAGES, PA_KEY_MAXP, PA_KEY_KV},
                      2, 6,
                      {{PA_KEY_DTYPE, 3, {2, 1, 0}}, PAGES6},
                      {{PA_KEY_D, 6, {128, 64, 256, 96, 40, 8}},
                       {PA_KEY_NQ, 4, {1, 2, 8, 4}},
                       {PA_KEY_GT, 4, {8, 4, 1, 2}},
                       {PA_KEY_STAGES, 3, {3, 2, 4}},
                       {PA_KEY_MAXP, 1, {1024}},
                       {PA_KEY_KV, 3, {0, PA_FP8_E4M3, PA_FP8_E5M2}}}},
    [PA_VK_DECODE_MMA] = {"decode_mma", "decode_mma.cu", "pa_decode_mma_info", "pa_decode_mma", false, 13,
                          {PA_KEY_DTYPE, PA_KEY_D, PA_KEY_NQ, PA_KEY_GT, PA_KEY_PAGE, PA_KEY_STAGES, PA_KEY_MAXP,
                           PA_KEY_KPW, PA_KEY_PERSIST, PA_KEY_MINB, PA_KEY_HW, PA_KEY_NW, PA_KEY_KV},
                          6, 7,
                          /* every block mode the rules allow (kpw x persist x hw x nw) on each kind of page,
                           * with 16-bit caches and with fp8 ones (e4m3; e5m2 widens by the same code as in
                           * the other kinds' rows) */
                          {{PA_KEY_KPW, 2, {8, 16}}, {PA_KEY_PERSIST, 2, {0, 1}}, {PA_KEY_HW, 2, {0, 1}},
                           {PA_KEY_NW, 2, {4, 8}}, {PA_KEY_KV, 2, {0, PA_FP8_E4M3}}, PAGES6},
                          {{PA_KEY_DTYPE, 2, {2, 1}},
                           {PA_KEY_D, 4, {128, 64, 96, 32}},
                           {PA_KEY_NQ, 4, {1, 2, 4, 8}},
                           {PA_KEY_GT, 4, {4, 2, 1, 8}},
                           {PA_KEY_STAGES, 3, {3, 2, 4}},
                           {PA_KEY_MAXP, 2, {1024, 768}},
                           {PA_KEY_MINB, 3, {1, 3, 2}}}},
    [PA_VK_FALLBACK] = {"fallback", "fallback.cu", "pa_fallback_info", "pa_attend", false, 2, {PA_KEY_DTYPE, PA_KEY_KV},
                        2, 0, {{PA_KEY_DTYPE, 3, {0, 1, 2}}, {PA_KEY_KV, 3, {0, PA_FP8_E4M3, PA_FP8_E5M2}}}, {{0}}},
    [PA_VK_PREFILL] = {"prefill", "prefill.cu", "pa_prefill_info", "pa_prefill", false, 8,
                       {PA_KEY_DTYPE, PA_KEY_D, PA_KEY_GT, PA_KEY_PAGE, PA_KEY_STAGES, PA_KEY_NATURAL, PA_KEY_MINB,
                        PA_KEY_KV},
                       2, 6,
                       {PAGES6, {PA_KEY_NATURAL, 2, {0, 1}}},
                       {{PA_KEY_DTYPE, 2, {2, 1}},
                        {PA_KEY_D, 5, {128, 64, 256, 80, 16}},
                        {PA_KEY_GT, 6, {4, 1, 8, 2, 3, 16}},
                        {PA_KEY_STAGES, 3, {2, 3, 4}},
                        {PA_KEY_MINB, 2, {2, 1}},
                        {PA_KEY_KV, 3, {0, PA_FP8_E4M3, PA_FP8_E5M2}}}},
    [PA_VK_PREFILL_WGMMA] = {"prefill_wgmma", "prefill_wgmma.cu", "pa_prefill_wgmma_info", "pa_prefill_wgmma", true,
                             6, {PA_KEY_DTYPE, PA_KEY_D, PA_KEY_GT, PA_KEY_PAGE, PA_KEY_STAGES, PA_KEY_NATURAL},
                             2, 4,
                             {{PA_KEY_PAGE, 5, {16, 256, PA_PAGE_CONTIG, PA_PAGE_ANY, 1}}, {PA_KEY_NATURAL, 2, {0, 1}}},
                             {{PA_KEY_DTYPE, 2, {2, 1}},
                              {PA_KEY_D, 3, {128, 64, 256}},
                              {PA_KEY_GT, 4, {4, 1, 8, 3}},
                              {PA_KEY_STAGES, 2, {3, 4}}}},
    [PA_VK_PREFILL_WS] = {"prefill_ws", "prefill_ws.cu", "pa_prefill_ws_info", "pa_prefill_ws", true, 8,
                          {PA_KEY_DTYPE, PA_KEY_D, PA_KEY_GT, PA_KEY_PAGE, PA_KEY_STAGES, PA_KEY_NATURAL, PA_KEY_TMA,
                           PA_KEY_KV},
                          2, 5,
                          {{PA_KEY_TMA, 3, {0, 1, 2}}, {PA_KEY_PAGE, 6, {16, 256, PA_PAGE_CONTIG, PA_PAGE_ANY, 1, 32}}},
                          {{PA_KEY_DTYPE, 2, {2, 1}},
                           {PA_KEY_D, 3, {128, 64, 256}},
                           {PA_KEY_GT, 3, {4, 1, 8}},
                           {PA_KEY_STAGES, 3, {3, 4, 2}},
                           {PA_KEY_NATURAL, 2, {0, 1}}}},
    [PA_VK_PREFILL_F8] = {"prefill_f8", "prefill_f8.cu", "pa_prefill_f8_info", NULL, true, 5,
                          {PA_KEY_DTYPE, PA_KEY_D, PA_KEY_GT, PA_KEY_STAGES, PA_KEY_KV},
                          1, 4,
                          {{PA_KEY_KV, 2, {PA_FP8_E4M3, PA_FP8_E5M2}}},
                          {{PA_KEY_DTYPE, 2, {2, 1}},
                           {PA_KEY_D, 1, {128}},
                           {PA_KEY_GT, 3, {4, 1, 8}},
                           {PA_KEY_STAGES, 3, {4, 2, 3}}}},
};

static bool kind_has(pa_vkind kind, pa_vkey key) {
    for (int i = 0; i < kinds[kind].nkeys; i++)
        if (kinds[kind].keys[i] == key) return true;
    return false;
}

/* ---- rules: each reads some keys and holds or not; checked in this order ---- */

typedef struct rule {
    uint32_t kinds; /* bit per pa_vkind */
    uint32_t reads; /* keys */
    bool (*holds)(const int32_t *v);
    const char *why; /* after "kernel variant '<name>': " */
} rule;

static bool r_page_boxes(const int32_t *v) { return !(v[PA_KEY_TMA] == 2 && v[PA_KEY_PAGE] < 16); }
static bool r_tma_page(const int32_t *v) {
    return !(v[PA_KEY_TMA] && v[PA_KEY_PAGE] != PA_PAGE_CONTIG && v[PA_KEY_PAGE] < 16);
}
static bool r_rows8(const int32_t *v) { return v[PA_KEY_NQ] * v[PA_KEY_GT] <= 8; }
static bool r_rows16(const int32_t *v) { return v[PA_KEY_NQ] * v[PA_KEY_GT] <= 16; }
static bool r_mma_shape(const int32_t *v) {
    return v[PA_KEY_DTYPE] != 0 && v[PA_KEY_D] % 32 == 0 && v[PA_KEY_D] <= 128;
}
static bool r_kpw16(const int32_t *v) { return !(v[PA_KEY_KPW] == 16 && v[PA_KEY_D] % 64 != 0); }
/* fp8 caches: decode_mma copies rows of whole 64-byte lines (head dims 64,
 * 128), decode 16-byte chunks of a row */
static bool r_mma_kv(const int32_t *v) { return v[PA_KEY_KV] == 0 || v[PA_KEY_D] % 64 == 0; }
static bool r_decode_kv(const int32_t *v) { return v[PA_KEY_KV] == 0 || v[PA_KEY_D] % 16 == 0; }
static bool r_hw(const int32_t *v) {
    return !(v[PA_KEY_HW] && (v[PA_KEY_NW] != 4 || v[PA_KEY_NQ] * v[PA_KEY_GT] > 8));
}
static bool r_persist(const int32_t *v) { return !(v[PA_KEY_PERSIST] && !v[PA_KEY_HW] && v[PA_KEY_KPW] != 16); }
static bool r_nw8(const int32_t *v) { return !(v[PA_KEY_NW] == 8 && !v[PA_KEY_PERSIST]); }
static bool r_prefill_shape(const int32_t *v) { return v[PA_KEY_DTYPE] != 0 && v[PA_KEY_D] % 16 == 0; }
static bool r_hopper_shape(const int32_t *v) {
    return v[PA_KEY_DTYPE] != 0 && (v[PA_KEY_D] == 64 || v[PA_KEY_D] == 128 || v[PA_KEY_D] == 256);
}
/* (stages: what a block's shared memory holds, and the least each pipeline works with) */
static bool r_stages4(const int32_t *v) { return v[PA_KEY_STAGES] <= 4; }
static bool r_wgmma_stages(const int32_t *v) { return v[PA_KEY_STAGES] >= 3 && v[PA_KEY_STAGES] <= 4; }
static bool r_f8_shape(const int32_t *v) {
    return v[PA_KEY_DTYPE] != 0 && v[PA_KEY_D] == 128 && v[PA_KEY_KV] != 0;
}
/* fp8 caches on prefill_ws: widened in the block (tuning prefill_fp8 = 3),
 * from page boxes of whole 128-byte rows, beside two 16-bit stages */
static bool r_ws_kv(const int32_t *v) {
    return v[PA_KEY_KV] == 0 || (v[PA_KEY_D] == 128 && v[PA_KEY_TMA] == 1 && v[PA_KEY_PAGE] >= 16 &&
                                 v[PA_KEY_NATURAL] == 0 && v[PA_KEY_STAGES] == 2);
}
static bool r_ws_stages(const int32_t *v) {
    return v[PA_KEY_STAGES] <= (v[PA_KEY_D] <= 64 ? 4 : v[PA_KEY_D] <= 128 ? 3 : 2);
}

#define KIND(k) (1u << (k))
static const rule rules[] = {
    {KIND(PA_VK_PREFILL_WS), K(PA_KEY_TMA) | K(PA_KEY_PAGE), r_page_boxes,
     "tma=2 (page boxes) takes pages of 16 tokens or more"},
    {KIND(PA_VK_PREFILL_WS), K(PA_KEY_TMA) | K(PA_KEY_PAGE), r_tma_page,
     "tma=1 takes contiguous caches or pages of 16 tokens or more"},
    {KIND(PA_VK_DECODE), K(PA_KEY_NQ) | K(PA_KEY_GT), r_rows8, "nq * gt must be <= 8"},
    {KIND(PA_VK_DECODE_MMA), K(PA_KEY_NQ) | K(PA_KEY_GT), r_rows16, "nq * gt must be <= 16"},
    {KIND(PA_VK_DECODE_MMA), K(PA_KEY_DTYPE) | K(PA_KEY_D), r_mma_shape,
     "decode_mma takes f16 or bf16 and D a multiple of 32 up to 128"},
    {KIND(PA_VK_DECODE_MMA), K(PA_KEY_KPW) | K(PA_KEY_D), r_kpw16, "kpw=16 takes D 64 or 128"},
    {KIND(PA_VK_DECODE_MMA), K(PA_KEY_KV) | K(PA_KEY_D), r_mma_kv, "decode_mma takes fp8 caches (kv=) at D 64 or 128"},
    {KIND(PA_VK_DECODE), K(PA_KEY_KV) | K(PA_KEY_D), r_decode_kv, "decode takes fp8 caches (kv=) at D a multiple of 16"},
    {KIND(PA_VK_DECODE_MMA), K(PA_KEY_HW) | K(PA_KEY_NW) | K(PA_KEY_NQ) | K(PA_KEY_GT), r_hw,
     "hw=1 (a warp a head tile) takes nw=4 and nq * gt <= 8"},
    {KIND(PA_VK_DECODE_MMA), K(PA_KEY_PERSIST) | K(PA_KEY_HW) | K(PA_KEY_KPW), r_persist,
     "persist=1 takes kpw=16 (or hw=1)"},
    {KIND(PA_VK_DECODE_MMA), K(PA_KEY_NW) | K(PA_KEY_PERSIST), r_nw8, "nw=8 (eight warps a block) takes persist=1"},
    {KIND(PA_VK_PREFILL), K(PA_KEY_DTYPE) | K(PA_KEY_D), r_prefill_shape,
     "prefill takes f16 or bf16 and D a multiple of 16 up to 256"},
    {KIND(PA_VK_PREFILL_WGMMA), K(PA_KEY_DTYPE) | K(PA_KEY_D), r_hopper_shape,
     "prefill_wgmma takes f16 or bf16 and D 64, 128 or 256"},
    {KIND(PA_VK_PREFILL_WS), K(PA_KEY_DTYPE) | K(PA_KEY_D), r_hopper_shape,
     "prefill_ws takes f16 or bf16 and D 64, 128 or 256"},
    {KIND(PA_VK_PREFILL), K(PA_KEY_STAGES), r_stages4, "prefill takes stages 2 to 4"},
    {KIND(PA_VK_PREFILL_WGMMA), K(PA_KEY_STAGES), r_wgmma_stages, "prefill_wgmma takes stages 3 or 4"},
    {KIND(PA_VK_PREFILL_F8), K(PA_KEY_DTYPE) | K(PA_KEY_D) | K(PA_KEY_KV), r_f8_shape,
     "prefill_f8 takes f16 or bf16, D 128 and an fp8 cache (kv=)"},
    {KIND(PA_VK_PREFILL_F8), K(PA_KEY_STAGES), r_stages4, "prefill_f8 takes stages 2 to 4"},
    {KIND(PA_VK_PREFILL_WS), K(PA_KEY_KV) | K(PA_KEY_D) | K(PA_KEY_TMA) | K(PA_KEY_PAGE) | K(PA_KEY_NATURAL) | K(PA_KEY_STAGES),
     r_ws_kv, "prefill_ws takes fp8 caches (kv=) at D 128 with tma=1, pages of 16 or more, natural=0 and stages 2"},
    {KIND(PA_VK_PREFILL_WS), K(PA_KEY_STAGES) | K(PA_KEY_D), r_ws_stages,
     "prefill_ws holds stages 2 to 4 at D 64, 2 to 3 at 128, 2 at 256"},
};
#define NRULES (sizeof rules / sizeof rules[0])

/* The first rule the set keys break (NULL: none), or "" where a key is outside its domain. */
static const char *broken(const pa_variant *v) {
    if ((unsigned)v->kind >= PA_VK_COUNT) return "";
    for (int k = 0; k < PA_KEY_COUNT; k++)
        if ((v->set & K(k)) && (!kind_has(v->kind, (pa_vkey)k) || !in_domain((pa_vkey)k, v->v[k]))) return "";
    for (size_t i = 0; i < NRULES; i++)
        if ((rules[i].kinds & KIND(v->kind)) && (rules[i].reads & v->set) == rules[i].reads && !rules[i].holds(v->v))
            return rules[i].why;
    return NULL;
}

pa_variant pa_variant_of(pa_vkind kind) {
    pa_variant v;
    memset(&v, 0, sizeof v);
    v.kind = kind;
    return v;
}

pa_variant *pa_variant_set(pa_variant *v, pa_vkey key, int32_t value) {
    v->v[key] = value;
    v->set |= K(key);
    return v;
}

int32_t pa_variant_page_key(bool paged, int32_t page_size) {
    if (!paged) return PA_PAGE_CONTIG;
    return is_pow2(page_size) && page_size <= (1 << 20) ? page_size : PA_PAGE_ANY;
}

bool pa_variant_allows(const pa_variant *v) { return broken(v) == NULL; }

int32_t pa_variant_clamp(const pa_variant *v, pa_vkey key, int32_t want) {
    pa_variant w = *v;
    int32_t best = want;
    int64_t best_d = -1;
    int32_t x = domain_first(key);
    do {
        pa_variant_set(&w, key, x);
        if (pa_variant_allows(&w)) {
            const int64_t d = x > want ? (int64_t)x - want : (int64_t)want - x;
            if (best_d < 0 || d < best_d) {
                best = x;
                best_d = d;
            }
        }
    } while (domain_next(key, x, &x));
    return best;
}

int32_t pa_variant_key_max(pa_vkind kind, pa_vkey key) {
    int32_t x = domain_first(key), best = x;
    pa_variant w = pa_variant_of(kind);
    do {
        pa_variant_set(&w, key, x);
        if (pa_variant_allows(&w)) best = x;
    } while (domain_next(key, x, &x));
    return best;
}

const char *pa_variant_kind_name(pa_vkind kind) { return kinds[kind].name; }
const char *pa_variant_file(pa_vkind kind) { return kinds[kind].file; }
const char *pa_variant_info_symbol(pa_vkind kind) { return kinds[kind].info; }
const char *pa_variant_entry(pa_vkind kind) { return kinds[kind].entry; }
bool pa_variant_needs_sm90a(pa_vkind kind) { return kinds[kind].sm90a; }

/* ---- names ---- */

static const char *const dtype_names[3] = {"f32", "f16", "bf16"};

static int value_text(pa_vkey key, int32_t v, char *buf, size_t len) {
    if (key == PA_KEY_DTYPE) return snprintf(buf, len, "%s", dtype_names[v]);
    if (key == PA_KEY_KV) return snprintf(buf, len, "%s", pa_dtype_name((pa_dtype)v));
    if (key == PA_KEY_PAGE && v == PA_PAGE_CONTIG) return snprintf(buf, len, "contig");
    if (key == PA_KEY_PAGE && v == PA_PAGE_ANY) return snprintf(buf, len, "any");
    return snprintf(buf, len, "%d", v);
}

bool pa_variant_name(const pa_variant *v, char *buf, size_t len) {
    const kind_def *kd = &kinds[v->kind];
    size_t n = (size_t)snprintf(buf, len, "%s", kd->name);
    for (int i = 0; i < kd->nkeys && n < len; i++) {
        char val[16];
        if (at_default(kd->keys[i], v->v[kd->keys[i]])) continue;
        value_text(kd->keys[i], v->v[kd->keys[i]], val, sizeof val);
        n += (size_t)snprintf(buf + n, len - n, " %s=%s", key_names[kd->keys[i]], val);
    }
    return n < len;
}

int pa_variant_defines(const pa_variant *v, char defines[PA_KEY_COUNT][PA_VARIANT_DEFINE_LEN]) {
    const kind_def *kd = &kinds[v->kind];
    int n = 0;
    for (int i = 0; i < kd->nkeys; i++) {
        const pa_vkey key = kd->keys[i];
        if (at_default(key, v->v[key])) continue; /* (the kernels' own default) */
        char upper[16];
        size_t j = 0;
        for (; key_names[key][j] && j < sizeof upper - 1; j++) {
            const char c = key_names[key][j];
            upper[j] = (char)(c >= 'a' && c <= 'z' ? c - 32 : c);
        }
        upper[j] = '\0';
        snprintf(defines[n++], PA_VARIANT_DEFINE_LEN, "-DPA_%s=%d", upper, v->v[key]);
    }
    return n;
}

/* One key's value from its text; false when it is not one of the key's values. */
static bool parse_value(pa_vkey key, const char *val, int32_t *out) {
    long v;
    if (key == PA_KEY_DTYPE) {
        v = strcmp(val, "f32") == 0 ? 0 : strcmp(val, "f16") == 0 ? 1 : strcmp(val, "bf16") == 0 ? 2 : -1;
    } else if (key == PA_KEY_KV) {
        v = strcmp(val, "fp8_e4m3") == 0 ? PA_FP8_E4M3 : strcmp(val, "fp8_e5m2") == 0 ? PA_FP8_E5M2 : -1;
    } else if (key == PA_KEY_PAGE && strcmp(val, "contig") == 0) {
        v = PA_PAGE_CONTIG;
    } else if (key == PA_KEY_PAGE && strcmp(val, "any") == 0) {
        v = PA_PAGE_ANY;
    } else {
        char *end = NULL;
        errno = 0;
        v = strtol(val, &end, 10);
        if (errno || end == val || *end || v < INT32_MIN || v > INT32_MAX) return false;
    }
    if (!in_domain(key, (int32_t)v)) return false;
    *out = (int32_t)v;
    return true;
}

pa_status pa_variant_parse(pa_context *ctx, const char *name, pa_variant *out) {
    memset(out, 0, sizeof *out);
    if (!name) return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant: NULL");
    char buf[256];
    if (strlen(name) >= sizeof buf) return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%.64s...': too long", name);
    snprintf(buf, sizeof buf, "%s", name);
    char *save = NULL, *tok = strtok_r(buf, " ", &save);
    int kind = -1;
    for (int i = 0; tok && i < PA_VK_COUNT; i++)
        if (strcmp(tok, kinds[i].name) == 0) kind = i;
    if (kind < 0) {
        char known[256] = "";
        size_t n = 0;
        for (int i = 0; i < PA_VK_COUNT && n < sizeof known; i++)
            n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "", kinds[i].name);
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': unknown kind (%s)", name, known);
    }
    const kind_def *kd = &kinds[kind];
    const char *vals[13] = {0};
    while ((tok = strtok_r(NULL, " ", &save))) {
        char *eq = strchr(tok, '=');
        int k = -1;
        if (eq) {
            *eq = '\0';
            for (int i = 0; i < kd->nkeys; i++)
                if (strcmp(key_names[kd->keys[i]], tok) == 0) k = i;
        }
        if (k < 0 || vals[k]) return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': unexpected '%s'", name, tok);
        vals[k] = eq + 1;
    }
    pa_variant v = pa_variant_of((pa_vkind)kind);
    for (int i = 0; i < kd->nkeys; i++) {
        const char *key = key_names[kd->keys[i]];
        int32_t x;
        if (!vals[i] && kd->keys[i] == PA_KEY_KV) { /* (left out at its default) */
            pa_variant_set(&v, PA_KEY_KV, 0);
            continue;
        }
        if (!vals[i]) return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': %s= missing", name, key);
        if (!parse_value(kd->keys[i], vals[i], &x))
            return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': %s=%s is not a valid value", name, key, vals[i]);
        pa_variant_set(&v, kd->keys[i], x);
    }
    const char *why = broken(&v);
    if (why) return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': %s", name, why);
    *out = v;
    return PA_OK;
}

/* ---- the catalog ---- */

#define CATALOG_MAX 256
#define CATALOG_NAME 160
static char catalog[CATALOG_MAX][CATALOG_NAME];
static int catalog_n;
static pthread_once_t catalog_once = PTHREAD_ONCE_INIT;

static void catalog_add(const pa_variant *v) {
    if (catalog_n < CATALOG_MAX && pa_variant_name(v, catalog[catalog_n], CATALOG_NAME)) catalog_n++;
}

/* Kind kd's rows: the path axes' combinations (an odometer), each completed
 * by the shape axes, one by one: the value the rules allow with what is set
 * that pairs with the most (axis, value) pairs of the row not yet seen in
 * this kind's rows (ties: the one after the axis's last). So every path
 * combination compiles once, every sample value appears, and the values
 * meet each other as evenly as the rows allow. */
#define SLOTS 13 /* path and shape axes of a kind */
#define VALS 8
typedef struct cover {
    const kind_def *kd;
    int nslots;
    const axis *ax[SLOTS];
    bool seen[SLOTS * VALS][SLOTS * VALS];
    int cursor[SLOTS];
} cover;

/* Completes row v (slots with value[slot] >= 0 already set); false when an
 * open axis has no value the rules allow. */
static bool complete_row(cover *c, pa_variant *v, int value[SLOTS]) {
    for (int slot = 0; slot < c->nslots; slot++) {
        if (value[slot] >= 0) continue;
        const axis *ax = c->ax[slot];
        int best = -1, best_new = -1;
        for (int t = 0; t < ax->n; t++) {
            const int i = (c->cursor[slot] + t) % ax->n;
            pa_variant w = *v;
            if (!pa_variant_allows(pa_variant_set(&w, ax->key, ax->values[i]))) continue;
            int fresh = 0;
            for (int o = 0; o < c->nslots; o++)
                if (value[o] >= 0) fresh += !c->seen[slot * VALS + i][o * VALS + value[o]];
            if (fresh > best_new) {
                best = i;
                best_new = fresh;
            }
        }
        if (best < 0) return false;
        pa_variant_set(v, ax->key, ax->values[best]);
        value[slot] = best;
        c->cursor[slot] = best + 1;
    }
    return true;
}

static void take_row(cover *c, const pa_variant *v, const int value[SLOTS]) {
    catalog_add(v);
    for (int x = 0; x < c->nslots; x++)
        for (int y = 0; y < c->nslots; y++) c->seen[x * VALS + value[x]][y * VALS + value[y]] = true;
}

static void catalog_kind(pa_vkind kind) {
    static cover c;
    memset(&c, 0, sizeof c);
    const kind_def *kd = c.kd = &kinds[kind];
    for (int a = 0; a < kd->npaths; a++) c.ax[c.nslots++] = &kd->paths[a];
    for (int a = 0; a < kd->nshapes; a++) c.ax[c.nslots++] = &kd->shapes[a];
    int at[6] = {0};
    for (;;) {
        pa_variant v = pa_variant_of(kind);
        int value[SLOTS];
        for (int x = 0; x < SLOTS; x++) value[x] = -1;
        for (int a = 0; a < kd->npaths; a++) {
            pa_variant_set(&v, kd->paths[a].key, kd->paths[a].values[at[a]]);
            value[a] = at[a];
        }
        if (pa_variant_allows(&v) && complete_row(&c, &v, value)) take_row(&c, &v, value);
        int a = kd->npaths - 1; /* the odometer's next combination */
        while (a >= 0 && ++at[a] == kd->paths[a].n) at[a--] = 0;
        if (a < 0) break;
    }
}

static void catalog_build(void) {
    for (int k = 0; k < PA_VK_COUNT; k++) catalog_kind((pa_vkind)k);
}

int pa_cuda_kernel_catalog_size(void) {
    pthread_once(&catalog_once, catalog_build);
    return catalog_n;
}

const char *pa_cuda_kernel_catalog_name(int index) {
    pthread_once(&catalog_once, catalog_build);
    return index >= 0 && index < catalog_n ? catalog[index] : NULL;
}
