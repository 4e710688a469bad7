/*
 * cuda_variants.h -- the one table of CUDA kernel variants: for each kernel
 * family (a file of kernels/) its keys, the values each key may take and the
 * rules that tie keys together. Everything else is derived from it: the
 * variant-name parser and the NVRTC defines (cuda_compile.c), the catalog that
 * CI compiles, and the planner's eligibility questions ("may decode_mma run
 * head dim 96?", "the most stages prefill_ws holds at head dim 128").
 *
 * A variant is named "<kind> key=value ..." with the keys in the kind's order
 * (e.g. "decode dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024"); each
 * key becomes -DPA_<KEY>=<value>, but for kv, the caches' dtype, which is
 * left out of names and defines at its default (the dtype's own: every
 * 16-bit variant keeps its name) and else ends them ("... kv=fp8_e4m3").
 * Pure code: no driver, no environment.
 */
#ifndef PA_CUDA_VARIANTS_H
#define PA_CUDA_VARIANTS_H

#include "../core/internal.h"

typedef enum pa_vkind {
    PA_VK_UTIL,
    PA_VK_APPEND,
    PA_VK_DECODE,
    PA_VK_DECODE_MMA,
    PA_VK_FALLBACK,
    PA_VK_PREFILL,
    PA_VK_PREFILL_WGMMA,
    PA_VK_PREFILL_WS,
    PA_VK_MERGE, /* pa_merge_states and the cascade's row copy (kernels/merge.cu) */
    PA_VK_PREFILL_F8, /* prefill on the e4m3 tensor cores over fp8 caches (tuning prefill_fp8 = 2) */
    PA_VK_COUNT
} pa_vkind;

typedef enum pa_vkey {
    PA_KEY_DTYPE,   /* 0 f32, 1 f16, 2 bf16 (pa_dtype) */
    PA_KEY_D,       /* head dim */
    PA_KEY_NQ,      /* decode: queries a tile */
    PA_KEY_GT,      /* query heads of a GQA group a tile */
    PA_KEY_PAGE,    /* page size: a power of two, PA_PAGE_ANY (other sizes), PA_PAGE_CONTIG */
    PA_KEY_STAGES,  /* pipeline stages */
    PA_KEY_MAXP,    /* decode: page ids a block holds */
    PA_KEY_KPW,     /* decode_mma: keys a warp and stage */
    PA_KEY_PERSIST, /* decode_mma: persistent blocks */
    PA_KEY_MINB,    /* blocks a SM the registers are sized for */
    PA_KEY_HW,      /* decode_mma: a warp a head tile */
    PA_KEY_NW,      /* decode_mma: warps a block */
    PA_KEY_NATURAL, /* prefill: softmax in natural exponent (softcap, alibi, no scale) */
    PA_KEY_TMA,     /* prefill_ws: 0 cp.async gather, 1 TMA boxes of 64 columns, 2 page boxes */
    PA_KEY_KV,      /* the caches' dtype: 0 the dtype's own (the default: left out of names and
                       defines), else fp8 (4 e4m3, 5 e5m2; pa_dtype) */
    PA_KEY_COUNT
} pa_vkey;

#define PA_PAGE_ANY 0
#define PA_PAGE_CONTIG (-1)

/* A variant, or a partial one (the keys in `set`). */
typedef struct pa_variant {
    pa_vkind kind;
    uint32_t set; /* bit k: key k has a value */
    int32_t v[PA_KEY_COUNT];
} pa_variant;

/* Starts a variant of kind with no key set; sets one key (chainable). */
pa_variant pa_variant_of(pa_vkind kind);
pa_variant *pa_variant_set(pa_variant *v, pa_vkey key, int32_t value);

/* The page key of a problem's cache. */
int32_t pa_variant_page_key(bool paged, int32_t page_size);

/* Whether no rule of the table forbids the keys that are set: each in its
 * domain and the kind's, and every rule all of whose keys are set holds.
 * A whole variant: whether it exists. */
bool pa_variant_allows(const pa_variant *v);
/* The allowed value of `key` nearest to `want` among those the rules leave
 * with the other keys as set (want itself where allowed; values between the
 * least and the most allowed count as a range); `want` when none is. */
int32_t pa_variant_clamp(const pa_variant *v, pa_vkey key, int32_t want);
/* The largest value of `key` that kind `kind` takes (its domain). */
int32_t pa_variant_key_max(pa_vkind kind, pa_vkey key);

/* The variant's name (every key of its kind set), as the kernels are cached
 * and compiled by; false when it does not fit in len. */
bool pa_variant_name(const pa_variant *v, char *buf, size_t len);
/* Parses a name: PA_ERR_ARGUMENT, saying what is wrong, unless it names a
 * variant that exists. */
pa_status pa_variant_parse(pa_context *ctx, const char *name, pa_variant *out);

/* The kind's facts: its file in kernels/, the __constant__ int array of its
 * launch facts (NULL: none), its kernel entry point (NULL: several), whether
 * it needs sm_90a (wgmma, TMA), and its name. */
const char *pa_variant_kind_name(pa_vkind kind);
const char *pa_variant_file(pa_vkind kind);
const char *pa_variant_info_symbol(pa_vkind kind);
const char *pa_variant_entry(pa_vkind kind);
bool pa_variant_needs_sm90a(pa_vkind kind);

/* The NVRTC defines of a whole variant, one per key, in the kind's order. */
#define PA_VARIANT_DEFINE_LEN 48
int pa_variant_defines(const pa_variant *v, char defines[PA_KEY_COUNT][PA_VARIANT_DEFINE_LEN]);

/* The catalog: every kernel and code path at least once (what CI compiles).
 * Derived from the table: for each kind, every combination of the values of
 * its path keys (those that select code paths in the kernel) that the rules
 * allow, with its shape keys taking their sample values in turn. */
int pa_cuda_kernel_catalog_size(void);
const char *pa_cuda_kernel_catalog_name(int index);

#endif /* PA_CUDA_VARIANTS_H */
