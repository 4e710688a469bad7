/* abi.c -- sizes and field offsets of the public structs, as this compiler lays
 * them out, so the Lua bindings can check that ffi.cdef agrees. */
#include "internal.h"

#include <stddef.h>

typedef struct {
    const char *type, *field;
    int64_t value;
} abi_entry;

#define SIZE(T) {#T, NULL, (int64_t)sizeof(T)}
#define FIELD(T, F) {#T, #F, (int64_t)offsetof(T, F)}

static const abi_entry entries[] = {
    SIZE(pa_ceilings),
    FIELD(pa_ceilings, read_gbps),
    FIELD(pa_ceilings, copy_gbps),
    FIELD(pa_ceilings, fma_gflops),
    FIELD(pa_ceilings, matmul_gflops),
    FIELD(pa_ceilings, seconds),
    FIELD(pa_ceilings, matmul_sustained_gflops),
    FIELD(pa_ceilings, matmul_note),
    SIZE(pa_attention_params),
    FIELD(pa_attention_params, q),
    FIELD(pa_attention_params, k_cache),
    FIELD(pa_attention_params, v_cache),
    FIELD(pa_attention_params, out),
    FIELD(pa_attention_params, k),
    FIELD(pa_attention_params, v),
    FIELD(pa_attention_params, rotary_cos),
    FIELD(pa_attention_params, rotary_sin),
    FIELD(pa_attention_params, cache_seqlens),
    FIELD(pa_attention_params, cache_batch_idx),
    FIELD(pa_attention_params, block_table),
    FIELD(pa_attention_params, alibi_slopes),
    FIELD(pa_attention_params, cu_seqlens_q),
    FIELD(pa_attention_params, seqused_k),
    FIELD(pa_attention_params, softmax_lse),
    FIELD(pa_attention_params, cache_seqlen),
    FIELD(pa_attention_params, max_seqlen_q),
    FIELD(pa_attention_params, causal),
    FIELD(pa_attention_params, window_left),
    FIELD(pa_attention_params, window_right),
    FIELD(pa_attention_params, rotary_interleaved),
    FIELD(pa_attention_params, num_splits),
    FIELD(pa_attention_params, softmax_scale),
    FIELD(pa_attention_params, softcap),
    FIELD(pa_attention_params, kv_indptr),
    FIELD(pa_attention_params, kv_indices),
    FIELD(pa_attention_params, kv_last_page_len),
    FIELD(pa_attention_params, k_scale),
    FIELD(pa_attention_params, v_scale),
    FIELD(pa_attention_params, k_scales),
    FIELD(pa_attention_params, v_scales),
    SIZE(pa_pool_params),
    FIELD(pa_pool_params, num_pages),
    FIELD(pa_pool_params, page_size),
    FIELD(pa_pool_params, num_layers),
    FIELD(pa_pool_params, k_caches),
    FIELD(pa_pool_params, v_caches),
    SIZE(pa_pool_stats),
    FIELD(pa_pool_stats, num_pages),
    FIELD(pa_pool_stats, page_size),
    FIELD(pa_pool_stats, free_pages),
    FIELD(pa_pool_stats, used_pages),
    FIELD(pa_pool_stats, shared_pages),
    FIELD(pa_pool_stats, page_refs),
    FIELD(pa_pool_stats, peak_used_pages),
    FIELD(pa_pool_stats, sequences),
    FIELD(pa_pool_stats, tokens),
    FIELD(pa_pool_stats, cow_copies),
    FIELD(pa_pool_stats, cached_pages),
    FIELD(pa_pool_stats, prefix_hits),
    FIELD(pa_pool_stats, prefix_misses),
    FIELD(pa_pool_stats, prefix_evictions),
    SIZE(pa_prefix_params),
    FIELD(pa_prefix_params, num_pages),
    FIELD(pa_prefix_params, page_size),
    FIELD(pa_prefix_params, parent),
    FIELD(pa_prefix_params, tokens),
    FIELD(pa_prefix_params, keys),
    SIZE(pa_batch_info),
    FIELD(pa_batch_info, batch),
    FIELD(pa_batch_info, total_q),
    FIELD(pa_batch_info, max_seqlen_q),
    FIELD(pa_batch_info, max_seqlen_k),
    FIELD(pa_batch_info, max_pages),
    FIELD(pa_batch_info, num_indices),
    FIELD(pa_batch_info, new_pages),
    FIELD(pa_batch_info, cow_copies),
};

static const abi_entry *find(const char *type, const char *field) {
    if (!type) return NULL;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const abi_entry *e = &entries[i];
        if (strcmp(e->type, type) != 0) continue;
        if (!field ? e->field == NULL : (e->field && strcmp(e->field, field) == 0)) return e;
    }
    return NULL;
}

int64_t pa_abi_sizeof(const char *type_name) {
    const abi_entry *e = find(type_name, NULL);
    return e ? e->value : -1;
}

int64_t pa_abi_offsetof(const char *type_name, const char *field_name) {
    const abi_entry *e = field_name ? find(type_name, field_name) : NULL;
    return e ? e->value : -1;
}
