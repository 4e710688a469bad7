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
    SIZE(pa_cuda_tuning),
    FIELD(pa_cuda_tuning, fallback),
    FIELD(pa_cuda_tuning, decode_kernel),
    FIELD(pa_cuda_tuning, prefill_kernel),
    FIELD(pa_cuda_tuning, decode_kpw),
    FIELD(pa_cuda_tuning, decode_stages),
    FIELD(pa_cuda_tuning, decode_persist),
    FIELD(pa_cuda_tuning, decode_persist_min_keys),
    FIELD(pa_cuda_tuning, decode_max_blocks),
    FIELD(pa_cuda_tuning, decode_wide),
    FIELD(pa_cuda_tuning, decode_wide_min_keys),
    FIELD(pa_cuda_tuning, decode_wide_max_units),
    FIELD(pa_cuda_tuning, decode_short_kpw),
    FIELD(pa_cuda_tuning, decode_short_stages),
    FIELD(pa_cuda_tuning, decode_short_minb),
    FIELD(pa_cuda_tuning, decode_hw),
    FIELD(pa_cuda_tuning, decode_hw_persist),
    FIELD(pa_cuda_tuning, decode_hw_max_keys),
    FIELD(pa_cuda_tuning, decode_hw_min_waves),
    FIELD(pa_cuda_tuning, decode_split_short),
    FIELD(pa_cuda_tuning, decode_overlap),
    FIELD(pa_cuda_tuning, decode_claim),
    FIELD(pa_cuda_tuning, decode_claim_min),
    FIELD(pa_cuda_tuning, decode_claim_order),
    FIELD(pa_cuda_tuning, decode_first_pages),
    FIELD(pa_cuda_tuning, decode_guided),
    FIELD(pa_cuda_tuning, decode_guide),
    FIELD(pa_cuda_tuning, decode_min_chunk),
    FIELD(pa_cuda_tuning, split_chunk),
    FIELD(pa_cuda_tuning, split_waves),
    FIELD(pa_cuda_tuning, prefill_stages),
    FIELD(pa_cuda_tuning, prefill_minb),
    FIELD(pa_cuda_tuning, prefill_tma),
    FIELD(pa_cuda_tuning, prefill_page_boxes),
    FIELD(pa_cuda_tuning, prefill_tma_q),
    FIELD(pa_cuda_tuning, prefill_tma_o),
    FIELD(pa_cuda_tuning, prefill_first_boxes),
    FIELD(pa_cuda_tuning, prefill_order),
    FIELD(pa_cuda_tuning, timing_hold_us),
    FIELD(pa_cuda_tuning, kernel_dir),
    FIELD(pa_cuda_tuning, nvrtc_options),
    SIZE(pa_tuning_field),
    FIELD(pa_tuning_field, name),
    FIELD(pa_tuning_field, is_text),
    FIELD(pa_tuning_field, min),
    FIELD(pa_tuning_field, max),
    FIELD(pa_tuning_field, names),
    FIELD(pa_tuning_field, doc),
    SIZE(pa_kernel_shape),
    FIELD(pa_kernel_shape, dtype),
    FIELD(pa_kernel_shape, head_dim),
    FIELD(pa_kernel_shape, heads),
    FIELD(pa_kernel_shape, kv_heads),
    FIELD(pa_kernel_shape, page_size),
    FIELD(pa_kernel_shape, seqlen_q),
    FIELD(pa_kernel_shape, natural),
    FIELD(pa_kernel_shape, rotary),
    FIELD(pa_kernel_shape, kv_dtype),
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
