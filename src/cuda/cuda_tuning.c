/*
 * cuda_tuning.c -- pa_cuda_tuning's fields: defaults, ranges, what each does
 * (the README's CUDA tuning table says the same), and the check of a struct.
 * The reasons behind the defaults: docs/decode.md, docs/prefill.md,
 * docs/planner.md.
 */
#include "cuda_tuning.h"

#include <stddef.h>
#include <stdint.h>

/* A field: its public description, where it lives, its default, and the
 * values besides [min, max] it takes (0 for "auto"; kpw fields: 8 or 16 only). */
typedef struct field {
    pa_tuning_field pub;
    size_t offset;
    int32_t dflt;
    int32_t lo;   /* the least value besides an auto 0 (= pub.min where 0 is not one) */
    bool kpw;     /* 8 or 16 (or an auto 0 when lo allows it) */
} field;

#define I(name, lo, hi, zero, dflt, names, doc)                                                 \
    {{#name, 0, (zero) ? 0 : (lo), (hi), names, doc}, offsetof(pa_cuda_tuning, name), (dflt), (lo), false}
#define KPW(name, zero, dflt, doc) \
    {{#name, 0, (zero) ? 0 : 8, 16, NULL, doc}, offsetof(pa_cuda_tuning, name), (dflt), 8, true}
#define TEXT(name, doc) \
    {{#name, 1, 0, (int64_t)sizeof(((pa_cuda_tuning *)0)->name), NULL, doc}, offsetof(pa_cuda_tuning, name), 0, 0, false}
#define BIG INT32_MAX

static const field fields[] = {
    I(fallback, 0, 1, 0, 0, NULL, "1: every sequence on the plain fallback kernel (tests)"),
    I(decode_kernel, 0, 1, 0, 0, "auto|simt",
      "decode kernel: auto (tensor cores for f16/bf16 at head dims up to 128, else CUDA cores) or simt"),
    I(prefill_kernel, 0, 3, 0, 0, "auto|ws|wgmma|mma",
      "prefill kernel: auto (Hopper: ws where TMA applies and the query tiles fill the GPU, else wgmma; "
      "mma.sync elsewhere), ws, wgmma (Hopper) or mma"),
    KPW(decode_kpw, 0, 16, "tensor-core decode at head dims 64 and 128: keys a warp and stage (16 or 8)"),
    I(decode_stages, 2, 8, 1, 0, NULL, "decode pipeline stages; 0: 3 at 16 keys a warp, 4 at 8"),
    I(decode_persist, 0, 1, 0, 1, NULL,
      "1: persistent decode blocks (units from a counter) where the units outnumber the resident blocks; 0: one "
      "block a unit"),
    I(decode_persist_min_keys, 0, BIG, 0, 256, NULL,
      "persistent blocks only where the query tiles average this many keys; a call with a wave of shorter ones "
      "splits there"),
    I(decode_max_blocks, 0, BIG, 0, 0, NULL, "persistent blocks launched at most; 0: as many as are resident"),
    I(decode_wide, 0, 2, 0, 1, "off|auto|always",
      "eight-warp persistent blocks: off, auto (sequences of >= wide_min_keys in <= wide_max_units units a SM; "
      "not over fp8 caches), always (where their shared memory fits)"),
    I(decode_wide_min_keys, 0, BIG, 0, 1024, NULL, "eight-warp blocks where the sequences average this many keys"),
    I(decode_wide_max_units, 0, 1 << 20, 0, 6, NULL, "eight-warp blocks where the units are at most this many a SM"),
    KPW(decode_short_kpw, 1, 0,
        "short units' kernel: keys a warp (8, 16); 0: 16 where a warp takes a head tile of >= 96 keys, else 8"),
    I(decode_short_stages, 2, 8, 0, 3, NULL, "short units' kernel: pipeline stages"),
    I(decode_short_minb, 1, 4, 1, 0, NULL,
      "short units' kernel: blocks a SM its registers allow; 0: 3 at 8 keys a warp, 2 at 16"),
    I(decode_hw, 0, 2, 0, 1, "off|auto|always",
      "a warp a head tile (four head tiles a block) for short units and units under hw_max_keys: off, auto "
      "(where its blocks fill hw_min_waves), always (also under them)"),
    I(decode_hw_persist, 0, 2, 0, 1, "off|auto|always",
      "warp-a-tile blocks persistent: off, auto (16 keys a warp, units of >= 8 stages, two or more a block, not "
      "a split call's short part), always"),
    I(decode_hw_max_keys, 0, BIG, 0, 512, NULL, "a warp a head tile for units under this many keys on average"),
    I(decode_hw_min_waves, 0, 100000, 0, 50, NULL,
      "a warp a head tile where its blocks fill this many hundredths of a wave (and, for units that are not "
      "short, not 1.0-1.5 waves)"),
    I(decode_split_short, 0, 1, 0, 1, NULL,
      "1: a call with a wave of units under persist_min_keys and longer ones runs them as two launches"),
    I(decode_overlap, 0, 1, 0, 1, NULL,
      "1: the short sequences' launch starts in the long ones' tail (programmatic launch, sm_90+)"),
    I(decode_claim, 0, 2, 0, 1, "off|auto|always",
      "the splits of a paged query tile, one block a unit, claim its keys two stages at a time: off (fixed ranges), "
      "auto (not over fp8 caches), always"),
    I(decode_claim_min, 0, BIG, 0, 4096, NULL, "claims where every split has this many keys"),
    I(decode_claim_order, 0, 1, 0, 1, NULL, "1: claiming splits launched split-major; 0: sequence-major"),
    I(decode_first_pages, 0, 1, 0, 1, NULL,
      "1: the host lists each first unit's first 32 page ids (paged tensor-core decode); 0: blocks read them"),
    I(decode_guided, 0, 1, 0, 0, NULL, "1: key ranges cut into pieces that shrink towards the end of the list"),
    I(decode_guide, 1, 64, 0, 2, NULL, "guided pieces: 1 / (guide x resident blocks) of the keys left"),
    I(decode_min_chunk, 1, BIG, 1, 0, NULL, "guided pieces of at least this many keys; 0: 512 persistent, else 256"),
    I(split_chunk, 0, BIG, 0, 0, NULL, "keys a split; 0: the planner's (about a wave of blocks)"),
    I(split_waves, 1, 64, 0, 1, NULL, "waves of blocks the automatic split aims at below one wave"),
    I(prefill_stages, 2, 8, 1, 0, NULL,
      "prefill pipeline stages, clamped to the kernel's range; 0: ws 3 (2 at head dim 256), wgmma 3, mma.sync 2"),
    I(prefill_minb, 1, 4, 1, 0, NULL, "mma.sync prefill: blocks a SM its registers allow; 0: 2, 1 at head dim 256"),
    I(prefill_tma, 0, 1, 0, 1, NULL, "ws: 1 K/V by TMA boxes where they apply; 0 the cp.async gather"),
    I(prefill_page_boxes, 0, 1, 0, 1, NULL, "ws with TMA, paged: 1 a box a page of every column; 0 of 64 columns"),
    I(prefill_tma_q, 0, 1, 0, 1, NULL, "ws with TMA: 1 the Q tile by TMA where it may; 0 cp.async"),
    I(prefill_tma_o, 0, 1, 0, 1, NULL, "ws with TMA: 1 O stored by TMA where it may; 0 16-byte stores"),
    I(prefill_first_boxes, 0, 1, 0, 1, NULL, "ws with TMA, paged: 1 the host lists each item's first boxes; 0"),
    I(prefill_order, 0, 1, 0, 1, NULL, "ws: 1 blocks by sequence, longest first; 0 longest first over all"),
    I(prefill_fp8, 0, 3, 0, 1, NULL,
      "fp8 caches, paged: 1 prefill on the Hopper kernels over a 16-bit copy of the keys it reads; 2 on the e4m3 "
      "tensor cores where they apply (head dim 128; Q and P in e4m3: not within the tolerance rule), else as 1; "
      "3 prefill_ws widening the fp8 pages in the block where it applies (head dim 128, pages of 16 or more, no "
      "softcap or ALiBi), else as 1; 0 mma.sync"),
    I(prefill_fp8_max_mb, 1, 1 << 20, 0, 1024, NULL,
      "prefill_fp8: the copy (K and V) of at most this many MiB, kept as scratch; larger calls read the fp8 bytes"),
    I(cascade_overlap, 0, 1, 0, 1, NULL,
      "cascade: 1 the shared level on a second stream beside the suffix level (both run at once); 0 one stream"),
    I(cascade_share, 1, 100, 0, 25, NULL,
      "cascade_overlap: the shared level's kernel and splits planned for this percent of a wave (the rest: the suffix level's)"),
    I(timing_hold_us, 0, 1000000, 0, 50, NULL, "pa_device_timing: microseconds the stream is held before a timed call"),
    TEXT(kernel_dir, "kernel sources read from this directory (\"\": the embedded ones)"),
    TEXT(nvrtc_options, "more NVRTC options, split at blanks (\"no-lineinfo\" drops -lineinfo)"),
};
#define NFIELDS ((int)(sizeof fields / sizeof fields[0]))

_Static_assert(sizeof(pa_cuda_tuning) == 42 * 4 + 256 + 512, "pa_cuda_tuning: a field without a table entry");

int pa_cuda_tuning_field_count_impl(void) { return NFIELDS; }
const pa_tuning_field *pa_cuda_tuning_field_impl(int index) {
    return index >= 0 && index < NFIELDS ? &fields[index].pub : NULL;
}

void pa_cuda_tuning_set_defaults(pa_cuda_tuning *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < NFIELDS; i++)
        if (!fields[i].pub.is_text) memcpy((char *)out + fields[i].offset, &fields[i].dflt, sizeof(int32_t));
}

int pa_nvrtc_option_words(const char *text) {
    int n = 0;
    for (const char *s = text; *s;) {
        while (*s == ' ' || *s == '\t') s++;
        if (!*s) break;
        if (strncmp(s, "no-lineinfo", 11) != 0 || (s[11] != '\0' && s[11] != ' ' && s[11] != '\t')) n++;
        while (*s && *s != ' ' && *s != '\t') s++;
    }
    return n <= PA_NVRTC_EXTRA ? n : -1;
}

pa_status pa_cuda_tuning_check(pa_context *ctx, const pa_cuda_tuning *t) {
    if (!t) return pa_fail(ctx, PA_ERR_ARGUMENT, "tuning: NULL");
    for (int i = 0; i < NFIELDS; i++) {
        const field *f = &fields[i];
        const char *at = (const char *)t + f->offset;
        if (f->pub.is_text) {
            if (!memchr(at, '\0', (size_t)f->pub.max))
                return pa_fail(ctx, PA_ERR_ARGUMENT, "tuning: %s: longer than %d characters", f->pub.name,
                               (int)f->pub.max - 1);
            continue;
        }
        int32_t v;
        memcpy(&v, at, sizeof v);
        const bool zero = f->pub.min == 0;
        if (f->kpw) {
            if (!(v == 8 || v == 16 || (zero && v == 0)))
                return pa_fail(ctx, PA_ERR_ARGUMENT, "tuning: %s: %d is not %s8 or 16", f->pub.name, v,
                               zero ? "0 (auto), " : "");
        } else if (!((v >= f->lo && v <= f->pub.max) || (zero && v == 0))) {
            return pa_fail(ctx, PA_ERR_ARGUMENT, "tuning: %s: %d is not %sin [%d, %lld]", f->pub.name, v,
                           zero && f->lo > 0 ? "0 (auto) or " : "", f->lo, (long long)f->pub.max);
        }
    }
    if (pa_nvrtc_option_words(t->nvrtc_options) < 0)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "tuning: nvrtc_options: more than %d options", PA_NVRTC_EXTRA);
    return PA_OK;
}
