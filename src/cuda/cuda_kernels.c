/*
 * cuda_kernels.c -- kernel variants: their names, NVRTC compilation, and the
 * two caches (loaded modules per device in memory; compiled images on disk).
 *
 * A variant is "<kind> key=value ..." (e.g. "decode dtype=bf16 D=128 nq=1
 * gt=4 page=16 stages=3 maxp=1024"): the kind picks a file of kernels/, each
 * key becomes a -DPA_<KEY>=<value> define. The disk cache key is a 128-bit hash
 * of every kernel source, the options, the architecture and the NVRTC version;
 * a cache file carries that key and a checksum of its payload, so a corrupt,
 * truncated or foreign file is ignored (and rewritten), never trusted.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- variants ---- */

typedef struct kkind {
    const char *kind, *file, *info;
    const char *keys[16];
} kkind;

static const kkind kinds[] = {
    {"util", "util.cu", NULL, {NULL}},
    {"append", "append.cu", NULL, {"dtype", NULL}},
    {"decode", "decode.cu", "pa_decode_info", {"dtype", "D", "nq", "gt", "page", "stages", "maxp", NULL}},
    {"decode_mma", "decode_mma.cu", "pa_decode_mma_info", {"dtype", "D", "nq", "gt", "page", "stages", "maxp", "kpw", "persist", "minb", "hw", "nw", NULL}},
    {"fallback", "fallback.cu", "pa_fallback_info", {"dtype", NULL}},
    {"prefill", "prefill.cu", "pa_prefill_info", {"dtype", "D", "gt", "page", "stages", "natural", "minb", NULL}},
    {"prefill_wgmma", "prefill_wgmma.cu", "pa_prefill_wgmma_info", {"dtype", "D", "gt", "page", "stages", "natural", NULL}},
    {"prefill_ws", "prefill_ws.cu", "pa_prefill_ws_info", {"dtype", "D", "gt", "page", "stages", "natural", "tma", NULL}},
    {"merge", "merge.cu", NULL, {"dtype", NULL}},
};

#define MAX_OPTS 16
#define EXTRA_OPTS 16 /* $PAGEDATTN_NVRTC_OPTIONS */
typedef struct kvariant {
    const kkind *kind;
    char defines[MAX_OPTS][48];
    int ndefines;
} kvariant;

static bool is_pow2(long v) { return v > 0 && (v & (v - 1)) == 0; }

/* Checks one key's value and writes its define. */
static pa_status parse_value(pa_context *ctx, const char *variant, const char *key, const char *val,
                             char *define, size_t len, long *num) {
    char *end = NULL;
    long v = 0;
    if (strcmp(key, "dtype") == 0) {
        v = strcmp(val, "f32") == 0 ? 0 : strcmp(val, "f16") == 0 ? 1 : strcmp(val, "bf16") == 0 ? 2 : -1;
        if (v < 0) goto bad;
        snprintf(define, len, "-DPA_DTYPE=%ld", v);
        *num = v;
        return PA_OK;
    }
    if (strcmp(key, "page") == 0 && strcmp(val, "contig") == 0) v = -1;
    else if (strcmp(key, "page") == 0 && strcmp(val, "any") == 0) v = 0;
    else {
        errno = 0;
        v = strtol(val, &end, 10);
        if (errno || end == val || *end) goto bad;
    }
    bool ok;
    if (strcmp(key, "D") == 0) ok = v >= 8 && v <= 256 && v % 8 == 0;
    else if (strcmp(key, "nq") == 0) ok = v >= 1 && v <= 8;
    else if (strcmp(key, "gt") == 0) ok = v >= 1 && v <= 16;
    else if (strcmp(key, "page") == 0) ok = v <= 0 || (is_pow2(v) && v <= (1 << 20));
    else if (strcmp(key, "stages") == 0) ok = v >= 2 && v <= 8;
    else if (strcmp(key, "maxp") == 0) ok = v >= 32 && v <= 8192 && v % 32 == 0;
    else if (strcmp(key, "natural") == 0) ok = v == 0 || v == 1;
    else if (strcmp(key, "minb") == 0) ok = v >= 1 && v <= 4;
    else if (strcmp(key, "kpw") == 0) ok = v == 8 || v == 16;
    else if (strcmp(key, "tma") == 0) ok = v >= 0 && v <= 2;
    else if (strcmp(key, "persist") == 0) ok = v == 0 || v == 1;
    else if (strcmp(key, "hw") == 0) ok = v == 0 || v == 1;
    else if (strcmp(key, "nw") == 0) ok = v == 4 || v == 8;
    else ok = false;
    if (!ok) goto bad;
    char upper[16];
    size_t i = 0;
    for (; key[i] && i < sizeof upper - 1; i++) upper[i] = (char)(key[i] >= 'a' && key[i] <= 'z' ? key[i] - 32 : key[i]);
    upper[i] = '\0';
    snprintf(define, len, "-DPA_%s=%ld", upper, v);
    *num = v;
    return PA_OK;
bad:
    return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': %s=%s is not a valid value", variant,
                   key, val);
}

static pa_status parse_variant(pa_context *ctx, const char *name, kvariant *out) {
    memset(out, 0, sizeof *out);
    if (!name) return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant: NULL");
    char buf[256];
    if (strlen(name) >= sizeof buf)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%.64s...': too long", name);
    snprintf(buf, sizeof buf, "%s", name);
    char *save = NULL, *tok = strtok_r(buf, " ", &save);
    for (size_t i = 0; tok && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(tok, kinds[i].kind) == 0) out->kind = &kinds[i];
    if (!out->kind)
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "kernel variant '%s': unknown kind (util, append, decode, decode_mma, fallback, prefill, prefill_wgmma, prefill_ws, merge)", name);
    const char *vals[16] = {0};
    while ((tok = strtok_r(NULL, " ", &save))) {
        char *eq = strchr(tok, '=');
        int k = -1;
        if (eq) {
            *eq = '\0';
            for (int i = 0; out->kind->keys[i]; i++)
                if (strcmp(out->kind->keys[i], tok) == 0) k = i;
        }
        if (k < 0 || vals[k])
            return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': unexpected '%s'", name, tok);
        vals[k] = eq + 1;
    }
    long nq = 1, gt = 1, dtype = -1, dim = 0, kpw = 8, page = 0, tma = 0, persist = 0, hw = 0, nw = 4;
    for (int i = 0; out->kind->keys[i]; i++) {
        const char *key = out->kind->keys[i];
        if (!vals[i])
            return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': %s= missing", name, key);
        long v = 0;
        pa_status st = parse_value(ctx, name, key, vals[i], out->defines[out->ndefines],
                                   sizeof out->defines[0], &v);
        if (st) return st;
        out->ndefines++;
        if (strcmp(key, "nq") == 0) nq = v;
        if (strcmp(key, "gt") == 0) gt = v;
        if (strcmp(key, "dtype") == 0) dtype = v;
        if (strcmp(key, "D") == 0) dim = v;
        if (strcmp(key, "kpw") == 0) kpw = v;
        if (strcmp(key, "page") == 0) page = v;
        if (strcmp(key, "tma") == 0) tma = v;
        if (strcmp(key, "persist") == 0) persist = v;
        if (strcmp(key, "hw") == 0) hw = v;
        if (strcmp(key, "nw") == 0) nw = v;
    }
    if (tma == 2 && page < 16)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': tma=2 (page boxes) takes pages of 16 tokens or more",
                       name);
    if (tma && page != -1 && page < 16)
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "kernel variant '%s': tma=1 takes contiguous caches or pages of 16 tokens or more", name);
    const bool mma = strcmp(out->kind->kind, "decode_mma") == 0;
    const bool decode = mma || strcmp(out->kind->kind, "decode") == 0;
    if (decode && nq * gt > (mma ? 16 : 8))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': nq * gt must be <= %d", name, mma ? 16 : 8);
    if (mma && (dtype == 0 || dim % 32 != 0 || dim > 128))
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "kernel variant '%s': decode_mma takes f16 or bf16 and D a multiple of 32 up to 128", name);
    if (mma && kpw == 16 && dim % 64 != 0)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': kpw=16 takes D 64 or 128", name);
    if (mma && hw && (nw != 4 || nq * gt > 8))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': hw=1 (a warp a head tile) takes nw=4 and "
                       "nq * gt <= 8", name);
    if (mma && persist && !hw && kpw != 16)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': persist=1 takes kpw=16 (or hw=1)", name);
    if (mma && nw == 8 && !persist)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': nw=8 (eight warps a block) takes persist=1", name);
    if (strcmp(out->kind->kind, "prefill") == 0 && (dtype == 0 || dim % 16 != 0))
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "kernel variant '%s': prefill takes f16 or bf16 and D a multiple of 16 up to 256", name);
    if ((strcmp(out->kind->kind, "prefill_wgmma") == 0 || strcmp(out->kind->kind, "prefill_ws") == 0) &&
        (dtype == 0 || (dim != 64 && dim != 128 && dim != 256)))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variant '%s': %s takes f16 or bf16 and D 64, 128 or 256", name,
                       out->kind->kind);
    return PA_OK;
}

/* Every kernel and code path at least once: what CI compiles (nvrtc_spec). */
static const char *const catalog[] = {
    "util",
    "append dtype=f32",
    "append dtype=f16",
    "append dtype=bf16",
    "merge dtype=f32",
    "merge dtype=f16",
    "merge dtype=bf16",
    "fallback dtype=f32",
    "fallback dtype=f16",
    "fallback dtype=bf16",
    "decode dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024",
    "decode dtype=bf16 D=128 nq=1 gt=4 page=256 stages=3 maxp=1024",
    "decode dtype=bf16 D=128 nq=1 gt=4 page=contig stages=3 maxp=1024",
    "decode dtype=f16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024",
    "decode dtype=f32 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024",
    "decode dtype=bf16 D=64 nq=1 gt=8 page=16 stages=3 maxp=1024",
    "decode dtype=bf16 D=256 nq=1 gt=4 page=16 stages=3 maxp=1024",
    "decode dtype=bf16 D=128 nq=2 gt=4 page=any stages=3 maxp=1024",
    "decode dtype=bf16 D=128 nq=8 gt=1 page=16 stages=3 maxp=1024",
    "decode dtype=f16 D=96 nq=1 gt=1 page=any stages=3 maxp=1024",
    "decode dtype=f32 D=256 nq=1 gt=8 page=contig stages=3 maxp=1024",
    "decode dtype=bf16 D=40 nq=4 gt=2 page=1 stages=3 maxp=1024",
    "decode dtype=bf16 D=8 nq=1 gt=1 page=8 stages=2 maxp=1024",
    "decode dtype=f32 D=64 nq=1 gt=1 page=any stages=4 maxp=1024",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024 kpw=8 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024 kpw=16 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=f16 D=64 nq=4 gt=2 page=any stages=2 maxp=1024 kpw=16 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=4",
    "decode_mma dtype=f16 D=64 nq=8 gt=2 page=any stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=4",
    "decode_mma dtype=bf16 D=128 nq=2 gt=4 page=contig stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=8",
    "decode_mma dtype=f16 D=64 nq=8 gt=2 page=any stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=8",
    "decode_mma dtype=bf16 D=128 nq=2 gt=4 page=contig stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=8",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=256 stages=3 maxp=1024 kpw=8 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=contig stages=3 maxp=1024 kpw=8 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=f16 D=128 nq=1 gt=4 page=16 stages=4 maxp=1024 kpw=8 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=bf16 D=64 nq=2 gt=8 page=any stages=3 maxp=1024 kpw=8 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=f16 D=96 nq=8 gt=2 page=1 stages=2 maxp=1024 kpw=8 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=bf16 D=32 nq=4 gt=1 page=8 stages=3 maxp=1024 kpw=8 persist=0 minb=1 hw=0 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024 kpw=8 persist=0 minb=3 hw=0 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024 kpw=8 persist=0 minb=3 hw=1 nw=4",
    "decode_mma dtype=f16 D=64 nq=2 gt=2 page=any stages=4 maxp=1024 kpw=8 persist=0 minb=1 hw=1 nw=4",
    "decode_mma dtype=bf16 D=96 nq=4 gt=1 page=contig stages=2 maxp=1024 kpw=8 persist=0 minb=3 hw=1 nw=4",
    "decode_mma dtype=f16 D=128 nq=1 gt=1 page=1 stages=3 maxp=1024 kpw=16 persist=0 minb=1 hw=1 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=8 page=16 stages=3 maxp=1024 kpw=16 persist=0 minb=2 hw=1 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=8 persist=1 minb=3 hw=1 nw=4",
    "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=16 persist=1 minb=2 hw=1 nw=4",
    "decode_mma dtype=f16 D=64 nq=2 gt=2 page=any stages=3 maxp=768 kpw=8 persist=1 minb=3 hw=1 nw=4",
    "decode_mma dtype=bf16 D=128 nq=4 gt=2 page=contig stages=3 maxp=768 kpw=16 persist=1 minb=2 hw=1 nw=4",
    "prefill dtype=bf16 D=128 gt=4 page=16 stages=2 natural=0 minb=2",
    "prefill dtype=bf16 D=128 gt=4 page=256 stages=2 natural=0 minb=2",
    "prefill dtype=bf16 D=128 gt=4 page=contig stages=2 natural=0 minb=2",
    "prefill dtype=f16 D=128 gt=1 page=1 stages=3 natural=1 minb=1",
    "prefill dtype=bf16 D=64 gt=8 page=any stages=2 natural=0 minb=2",
    "prefill dtype=f16 D=256 gt=2 page=16 stages=2 natural=1 minb=1",
    "prefill dtype=bf16 D=80 gt=3 page=any stages=2 natural=0 minb=1",
    "prefill dtype=bf16 D=16 gt=16 page=8 stages=4 natural=1 minb=2",
    "prefill_wgmma dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0",
    "prefill_wgmma dtype=bf16 D=128 gt=4 page=256 stages=3 natural=0",
    "prefill_wgmma dtype=bf16 D=128 gt=4 page=contig stages=3 natural=0",
    "prefill_wgmma dtype=f16 D=64 gt=1 page=1 stages=4 natural=1",
    "prefill_wgmma dtype=bf16 D=256 gt=8 page=any stages=3 natural=1",
    "prefill_wgmma dtype=f16 D=128 gt=3 page=any stages=3 natural=0",
    "prefill_ws dtype=bf16 D=128 gt=4 page=16 stages=2 natural=0 tma=0",
    "prefill_ws dtype=bf16 D=128 gt=4 page=contig stages=3 natural=1 tma=0",
    "prefill_ws dtype=f16 D=64 gt=1 page=1 stages=4 natural=0 tma=0",
    "prefill_ws dtype=bf16 D=256 gt=8 page=any stages=2 natural=1 tma=0",
    "prefill_ws dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0 tma=1",
    "prefill_ws dtype=f16 D=64 gt=1 page=256 stages=4 natural=1 tma=1",
    "prefill_ws dtype=bf16 D=256 gt=8 page=contig stages=2 natural=0 tma=1",
    "prefill_ws dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0 tma=2",
    "prefill_ws dtype=f16 D=64 gt=1 page=32 stages=4 natural=1 tma=2",
    "prefill_ws dtype=bf16 D=256 gt=8 page=256 stages=2 natural=0 tma=2",
};

int pa_cuda_kernel_catalog_size(void) { return (int)(sizeof catalog / sizeof catalog[0]); }

const char *pa_cuda_kernel_catalog_name(int index) {
    return index >= 0 && index < pa_cuda_kernel_catalog_size() ? catalog[index] : NULL;
}

/* ---- sources ---- */

typedef struct sources {
    pa_kernel_source src[PA_KERNEL_SOURCES];
    char *owned[PA_KERNEL_SOURCES]; /* read from $PAGEDATTN_KERNEL_DIR */
} sources;

static void sources_free(sources *s) {
    for (int i = 0; i < PA_KERNEL_SOURCES; i++) free(s->owned[i]);
}

static pa_status sources_get(pa_context *ctx, sources *s) {
    memset(s, 0, sizeof *s);
    pa_kernel_sources(s->src);
    const char *dir = getenv("PAGEDATTN_KERNEL_DIR");
    if (!dir || !*dir) return PA_OK;
    for (int i = 0; i < PA_KERNEL_SOURCES; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, s->src[i].name);
        FILE *f = fopen(path, "rb");
        if (!f) {
            sources_free(s);
            return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_KERNEL_DIR: cannot read %s: %s", path,
                           strerror(errno));
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
        if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
            free(text);
            fclose(f);
            sources_free(s);
            return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_KERNEL_DIR: cannot read %s", path);
        }
        fclose(f);
        text[n] = '\0';
        s->owned[i] = text;
        s->src[i].text = text;
        s->src[i].len = (size_t)n;
    }
    return PA_OK;
}

/* ---- hashing: FNV-1a, twice with different bases, for a 128-bit key ---- */

static void hash_bytes(uint64_t h[2], const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h[0] = (h[0] ^ p[i]) * 0x100000001b3ULL;
        h[1] = (h[1] ^ p[i]) * 0x100000001b3ULL;
    }
    /* a separator, so that ("ab", "c") and ("a", "bc") differ */
    h[0] = (h[0] ^ 0xff) * 0x100000001b3ULL;
    h[1] = (h[1] ^ 0xfe) * 0x100000001b3ULL;
}

static uint64_t checksum(const void *data, size_t n) {
    uint64_t h[2] = {0xcbf29ce484222325ULL, 0};
    hash_bytes(h, data, n);
    return h[0];
}

#define CACHE_FORMAT 1u
enum { IMAGE_CUBIN = 1, IMAGE_PTX = 2 };

/* $PAGEDATTN_NVRTC_OPTIONS (development: more NVRTC options; "" when
 * unset), read in one place: the disk cache's key, the compile and the
 * modules kept on a device all see the same text */
static pa_status nvrtc_options(pa_context *ctx, const char **out) {
    const char *env = getenv("PAGEDATTN_NVRTC_OPTIONS");
    *out = env ? env : "";
    if (strlen(*out) >= PA_NVRTC_OPTIONS_MAX)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_NVRTC_OPTIONS: longer than %d characters",
                       PA_NVRTC_OPTIONS_MAX - 1);
    return PA_OK;
}

static void variant_key(const sources *s, const kvariant *v, const char *arch, int image_kind, const char *extra,
                        uint64_t key[2]) {
    key[0] = 0xcbf29ce484222325ULL;
    key[1] = 0x84222325cbf29ce4ULL;
    for (int i = 0; i < PA_KERNEL_SOURCES; i++) {
        hash_bytes(key, s->src[i].name, strlen(s->src[i].name));
        hash_bytes(key, s->src[i].text, s->src[i].len);
    }
    hash_bytes(key, v->kind->file, strlen(v->kind->file));
    for (int i = 0; i < v->ndefines; i++) hash_bytes(key, v->defines[i], strlen(v->defines[i]));
    char tail[96];
    snprintf(tail, sizeof tail, "%s|nvrtc %d|image %d|format %u", arch, pa_nvrtc_version(),
             image_kind, CACHE_FORMAT);
    hash_bytes(key, tail, strlen(tail));
    if (*extra) hash_bytes(key, extra, strlen(extra));
}

/* ---- the disk cache ---- */

typedef struct cache_header {
    char magic[8]; /* "PAKERNEL" */
    uint32_t format;
    uint32_t kind; /* IMAGE_CUBIN or IMAGE_PTX */
    uint64_t key[2];
    uint64_t size;  /* payload bytes */
    uint64_t check; /* checksum of the payload */
} cache_header;

static bool mkdir_p(const char *dir) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return false;
        *p = '/';
    }
    return mkdir(tmp, 0755) == 0 || errno == EEXIST;
}

/* The cache file of a key, or false when the disk cache is off or unusable. */
static bool cache_path(const char *arch, const uint64_t key[2], char *path, size_t len) {
    char dir[900];
    const char *env = getenv("PAGEDATTN_KERNEL_CACHE");
    if (env) {
        if (!*env || strcmp(env, "off") == 0) return false;
        snprintf(dir, sizeof dir, "%s", env);
    } else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME")) {
        snprintf(dir, sizeof dir, "%s/pagedattn", getenv("XDG_CACHE_HOME"));
    } else if (getenv("HOME") && *getenv("HOME")) {
        snprintf(dir, sizeof dir, "%s/.cache/pagedattn", getenv("HOME"));
    } else {
        return false;
    }
    if (!mkdir_p(dir)) return false;
    snprintf(path, len, "%s/%s-%016llx%016llx.bin", dir, arch, (unsigned long long)key[0],
             (unsigned long long)key[1]);
    return true;
}

/* A valid cached image of key, or NULL (missing, short, foreign, corrupt). */
static void *cache_read(const char *path, const uint64_t key[2], size_t *size, int *kind) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    cache_header h;
    struct stat sb;
    void *data = NULL;
    if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)sizeof h ||
        read(fd, &h, sizeof h) != (ssize_t)sizeof h)
        goto out;
    if (memcmp(h.magic, "PAKERNEL", 8) != 0 || h.format != CACHE_FORMAT ||
        (h.kind != IMAGE_CUBIN && h.kind != IMAGE_PTX) || h.key[0] != key[0] || h.key[1] != key[1] ||
        h.size == 0 || h.size != (uint64_t)sb.st_size - sizeof h || h.size > ((uint64_t)1 << 30))
        goto out;
    data = malloc((size_t)h.size + 1);
    if (!data) goto out;
    size_t got = 0;
    while (got < h.size) {
        ssize_t n = read(fd, (char *)data + got, (size_t)h.size - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    if (got != h.size || checksum(data, (size_t)h.size) != h.check) {
        free(data);
        data = NULL;
        goto out;
    }
    ((char *)data)[h.size] = '\0'; /* PTX is text */
    *size = (size_t)h.size;
    *kind = (int)h.kind;
out:
    close(fd);
    return data;
}

/* Best effort: a temporary file renamed into place, so that readers see a
 * whole file or none. */
static void cache_write(const char *path, const uint64_t key[2], const void *data, size_t size,
                        int kind) {
    static atomic_uint serial;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&serial, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return;
    cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, "PAKERNEL", 8);
    h.format = CACHE_FORMAT;
    h.kind = (uint32_t)kind;
    h.key[0] = key[0];
    h.key[1] = key[1];
    h.size = size;
    h.check = checksum(data, size);
    bool ok = write(fd, &h, sizeof h) == (ssize_t)sizeof h;
    size_t put = 0;
    while (ok && put < size) {
        ssize_t n = write(fd, (const char *)data + put, size - put);
        if (n <= 0) ok = false;
        else put += (size_t)n;
    }
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

/* ---- NVRTC ---- */

/* The architecture NVRTC should target for compute capability major.minor:
 * real machine code when NVRTC knows the chip (sm_90a on Hopper, for its
 * architecture-specific instructions), else PTX for the newest architecture it
 * knows, which the driver then compiles. */
void pa_cuda_pick_arch(int major, int minor, char *arch, size_t len, int *image_kind) {
    const int want = major * 10 + minor;
    int n = 0, best = 0, archs[128];
    bool known = false;
    if (pa_nvrtc_ready(NULL, 0) && pa_rtc.nvrtcGetNumSupportedArchs(&n) == 0 && n > 0 && n <= 128 &&
        pa_rtc.nvrtcGetSupportedArchs(archs) == 0) {
        for (int i = 0; i < n; i++) {
            if (archs[i] == want) known = true;
            if (archs[i] > best) best = archs[i];
        }
    } else {
        known = true; /* cannot tell: try the chip's own */
    }
    if (known || want < best || best == 0) {
        snprintf(arch, len, "sm_%d%s", want, want == 90 ? "a" : "");
        *image_kind = IMAGE_CUBIN;
    } else {
        snprintf(arch, len, "compute_%d", best);
        *image_kind = IMAGE_PTX;
    }
}

/* NVRTC's log of a program (malloc'd, NUL-terminated), or NULL */
static char *program_log(nvrtcProgram prog) {
    size_t log_size = 0;
    char *log = NULL;
    if (pa_rtc.nvrtcGetProgramLogSize(prog, &log_size) != 0 || log_size == 0 || !(log = malloc(log_size + 1)))
        return NULL;
    if (pa_rtc.nvrtcGetProgramLog(prog, log) != 0) {
        free(log);
        return NULL;
    }
    log[log_size] = '\0';
    return log;
}

static pa_status nvrtc_compile(pa_context *ctx, const char *variant, const sources *s,
                               const kvariant *v, const char *arch, int image_kind, const char *env,
                               void **image, size_t *size) {
    const pa_kernel_source *main_src = NULL;
    const char *hnames[PA_KERNEL_SOURCES], *htexts[PA_KERNEL_SOURCES];
    int nh = 0;
    for (int i = 0; i < PA_KERNEL_SOURCES; i++) {
        if (strcmp(s->src[i].name, v->kind->file) == 0) {
            main_src = &s->src[i];
        } else {
            hnames[nh] = s->src[i].name;
            htexts[nh] = s->src[i].text;
            nh++;
        }
    }
    if (!main_src) return pa_fail(ctx, PA_ERR_INTERNAL, "kernel %s: no source %s", variant, v->kind->file);
    char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
    /* env, $PAGEDATTN_NVRTC_OPTIONS: more options, split at blanks (e.g.
     * "-Xptxas -v"); the token no-lineinfo drops -lineinfo */
    char extra[PA_NVRTC_OPTIONS_MAX];
    const char *extra_opts[EXTRA_OPTS];
    int nextra = 0;
    bool lineinfo = true;
    snprintf(extra, sizeof extra, "%s", env);
    for (char *save = NULL, *t = strtok_r(extra, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (strcmp(t, "no-lineinfo") == 0) lineinfo = false;
        else if (nextra < EXTRA_OPTS) extra_opts[nextra++] = t;
        else return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_NVRTC_OPTIONS: more than %d options", EXTRA_OPTS);
    }
    const char *opts[MAX_OPTS + 8 + EXTRA_OPTS];
    int nopts = 0;
    opts[nopts++] = arch_opt;
    opts[nopts++] = "--std=c++17";
    opts[nopts++] = "-default-device"; /* unannotated functions (generic lambdas: the prefill kernels' peeled steps) are device code */
    if (lineinfo) opts[nopts++] = "-lineinfo"; /* source lines in compute-sanitizer reports */
    for (int i = 0; i < v->ndefines; i++) opts[nopts++] = v->defines[i];
    for (int i = 0; i < nextra; i++) opts[nopts++] = extra_opts[i];

    nvrtcProgram prog = NULL;
    nvrtcResult r = pa_rtc.nvrtcCreateProgram(&prog, main_src->text, main_src->name, nh, htexts, hnames);
    if (r != 0)
        return pa_fail(ctx, PA_ERR_COMPILE, "nvrtcCreateProgram(%s) failed: %s", variant,
                       pa_rtc.nvrtcGetErrorString(r));
    r = pa_rtc.nvrtcCompileProgram(prog, nopts, opts);
    if (r != 0) {
        char *log = program_log(prog);
        pa_status st = pa_fail(ctx, PA_ERR_COMPILE,
                               "NVRTC could not compile kernel '%s' (%s, %s): %s\n%s", variant,
                               main_src->name, arch, pa_rtc.nvrtcGetErrorString(r), log ? log : "");
        free(log);
        pa_rtc.nvrtcDestroyProgram(&prog);
        return st;
    }
    if (nextra > 0) { /* options given by hand (e.g. -Xptxas -v): their report to stderr */
        char *log = program_log(prog);
        if (log && *log) fprintf(stderr, "pagedattn: NVRTC log of %s (%s):\n%s\n", variant, env, log);
        free(log);
    }
    size_t n = 0;
    r = image_kind == IMAGE_CUBIN ? pa_rtc.nvrtcGetCUBINSize(prog, &n) : pa_rtc.nvrtcGetPTXSize(prog, &n);
    void *buf = r == 0 && n > 0 ? malloc(n + 1) : NULL;
    if (buf) r = image_kind == IMAGE_CUBIN ? pa_rtc.nvrtcGetCUBIN(prog, buf) : pa_rtc.nvrtcGetPTX(prog, buf);
    pa_rtc.nvrtcDestroyProgram(&prog);
    if (!buf || r != 0) {
        free(buf);
        return pa_fail(ctx, r ? PA_ERR_COMPILE : PA_ERR_OUT_OF_MEMORY,
                       "kernel %s: cannot get the compiled image from NVRTC", variant);
    }
    ((char *)buf)[n] = '\0';
    *image = buf;
    *size = n;
    return PA_OK;
}

/* The image of a variant: from the disk cache when allowed and valid, else
 * compiled (and then stored). */
static pa_status variant_image(pa_context *ctx, const char *variant, const kvariant *v,
                               const char *arch, int image_kind, bool use_disk, void **image,
                               size_t *size, bool *was_cached) {
    const char *extra;
    pa_status st = nvrtc_options(ctx, &extra);
    if (st) return st;
    sources s;
    st = sources_get(ctx, &s);
    if (st) return st;
    uint64_t key[2];
    variant_key(&s, v, arch, image_kind, extra, key);
    char path[1024];
    bool disk = use_disk && cache_path(arch, key, path, sizeof path);
    *was_cached = false;
    if (disk) {
        int kind = 0;
        *image = cache_read(path, key, size, &kind);
        if (*image && kind == image_kind) {
            *was_cached = true;
            sources_free(&s);
            return PA_OK;
        }
        free(*image);
        *image = NULL;
    }
    st = nvrtc_compile(ctx, variant, &s, v, arch, image_kind, extra, image, size);
    sources_free(&s);
    if (st == PA_OK && disk) cache_write(path, key, *image, *size, image_kind);
    return st;
}

pa_status pa_cuda_kernel_compile(pa_context *ctx, const char *variant, const char *arch,
                                 int use_disk_cache, int *was_cached) {
    if (was_cached) *was_cached = 0;
    kvariant v;
    pa_status st = parse_variant(ctx, variant, &v);
    if (st) return st;
    char why[512];
    if (!pa_nvrtc_ready(why, sizeof why)) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "%s", why);
    char dev_arch[32];
    int image_kind = IMAGE_CUBIN;
    if (!arch || !*arch) {
        if (!pa_cuda_driver_ready(why, sizeof why))
            return pa_fail(ctx, PA_ERR_UNSUPPORTED,
                           "kernel compile: no architecture given and no CUDA device: %s", why);
        CUdevice d;
        int major = 0, minor = 0;
        CU_TRY(ctx, pa_cu.cuDeviceGet(&d, 0));
        CU_TRY(ctx, pa_cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d));
        CU_TRY(ctx, pa_cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d));
        pa_cuda_pick_arch(major, minor, dev_arch, sizeof dev_arch, &image_kind);
        arch = dev_arch;
    } else if (strncmp(arch, "compute_", 8) == 0) {
        image_kind = IMAGE_PTX;
    } else if (strncmp(arch, "sm_", 3) != 0 || strlen(arch) > 16) {
        return pa_fail(ctx, PA_ERR_ARGUMENT, "arch: '%s' is not like \"sm_90a\" or \"compute_90\"", arch);
    }
    void *image = NULL;
    size_t size = 0;
    bool cached = false;
    st = variant_image(ctx, variant, &v, arch, image_kind, use_disk_cache != 0, &image, &size, &cached);
    free(image);
    if (was_cached) *was_cached = cached;
    return st;
}

/* ---- modules on a device ---- */

pa_status pa_cuda_module(pa_context *ctx, cuda_impl *impl, const char *variant, pa_kmodule **out) {
    /* keyed by the variant, the source directory and the extra NVRTC options,
     * so that a process can compare kernel sources or defines
     * (PAGEDATTN_KERNEL_DIR or PAGEDATTN_NVRTC_OPTIONS set per call: tuning
     * sweeps) */
    const char *srcdir = getenv("PAGEDATTN_KERNEL_DIR");
    if (!srcdir) srcdir = "";
    if (strlen(srcdir) >= sizeof impl->modules->srcdir)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_KERNEL_DIR: longer than %d characters",
                       (int)sizeof impl->modules->srcdir - 1);
    const char *options;
    pa_status st = nvrtc_options(ctx, &options);
    if (st) return st;
    for (pa_kmodule *m = impl->modules; m; m = m->next) {
        if (strcmp(m->name, variant) == 0 && strcmp(m->srcdir, srcdir) == 0 && strcmp(m->options, options) == 0) {
            *out = m;
            return PA_OK;
        }
    }
    if (strlen(variant) >= sizeof impl->modules->name)
        return pa_fail(ctx, PA_ERR_INTERNAL, "kernel variant name too long: %s", variant);
    kvariant v;
    st = parse_variant(ctx, variant, &v);
    if (st) return st;
    int image_kind = IMAGE_CUBIN;
    char arch[32];
    pa_cuda_pick_arch(impl->cc_major, impl->cc_minor, arch, sizeof arch, &image_kind);

    pa_kmodule *m = calloc(1, sizeof *m);
    if (!m) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "kernel %s: out of host memory", variant);
    snprintf(m->name, sizeof m->name, "%s", variant);
    snprintf(m->srcdir, sizeof m->srcdir, "%s", srcdir);
    snprintf(m->options, sizeof m->options, "%s", options);
    void *image = NULL;
    size_t size = 0;
    bool cached = false;
    st = variant_image(ctx, variant, &v, arch, image_kind, true, &image, &size, &cached);
    if (st == PA_OK) {
        CUresult r = pa_cu.cuModuleLoadData(&m->module, image);
        if (r != CUDA_SUCCESS && cached) {
            /* a cached image the driver rejects: compile afresh (and replace it) */
            free(image);
            image = NULL;
            st = variant_image(ctx, variant, &v, arch, image_kind, false, &image, &size, &cached);
            if (st == PA_OK) r = pa_cu.cuModuleLoadData(&m->module, image);
        }
        if (st == PA_OK && r != CUDA_SUCCESS)
            st = pa_cu_fail(ctx, r, "cuModuleLoadData(kernel image)", __FILE__, __LINE__);
    }
    free(image);
    if (st == PA_OK && v.kind->info) {
        CUdeviceptr ptr = 0;
        size_t bytes = 0;
        if (pa_cu.cuModuleGetGlobal(&ptr, &bytes, m->module, v.kind->info) == CUDA_SUCCESS &&
            bytes <= sizeof m->info) {
            CUresult r = pa_cu.cuMemcpyDtoHAsync(m->info, ptr, bytes, impl->stream);
            if (r == CUDA_SUCCESS) r = pa_cu.cuStreamSynchronize(impl->stream);
            if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuMemcpyDtoH(kernel info)", __FILE__, __LINE__);
        } else {
            st = pa_fail(ctx, PA_ERR_INTERNAL, "kernel %s: no %s in the module", variant, v.kind->info);
        }
    }
    if (st != PA_OK) {
        if (m->module) pa_cu.cuModuleUnload(m->module);
        free(m);
        return st;
    }
    m->next = impl->modules;
    impl->modules = m;
    *out = m;
    return PA_OK;
}

pa_status pa_cuda_function(pa_context *ctx, cuda_impl *impl, pa_kmodule *m, const char *entry,
                           int smem_bytes, CUfunction *out) {
    (void)impl;
    int i = 0;
    for (; i < m->nfuncs; i++)
        if (strcmp(m->func_names[i], entry) == 0) break;
    if (i == m->nfuncs) {
        if (m->nfuncs == PA_KMODULE_FUNCS)
            return pa_fail(ctx, PA_ERR_INTERNAL, "kernel %s: too many entry points", m->name);
        CU_TRY(ctx, pa_cu.cuModuleGetFunction(&m->funcs[i], m->module, entry));
        m->func_names[i] = entry; /* callers pass string literals */
        m->nfuncs++;
    }
    /* dynamic + static shared memory above 48 KB needs an opt-in: ask for
     * every size used (once per size; the static part is the kernel's own) */
    if (smem_bytes > m->smem_set[i]) {
        CU_TRY(ctx, pa_cu.cuFuncSetAttribute(m->funcs[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             smem_bytes));
        m->smem_set[i] = smem_bytes;
    }
    *out = m->funcs[i];
    return PA_OK;
}

void pa_cuda_modules_free(cuda_impl *impl) {
    pa_kmodule *m = impl->modules;
    while (m) {
        pa_kmodule *next = m->next;
        if (m->module) pa_cu.cuModuleUnload(m->module);
        free(m);
        m = next;
    }
    impl->modules = NULL;
}
