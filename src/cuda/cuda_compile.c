/*
 * cuda_compile.c -- a kernel variant compiled by NVRTC: its sources (embedded,
 * or read from a directory), its options, and the disk cache of compiled
 * images. The variant's keys and defines come from the variant table
 * (cuda_variants.c); loading modules on a device: cuda_modules.c.
 *
 * The disk cache key is a 128-bit hash of every kernel source, the options,
 * the architecture and the NVRTC version; a cache file carries that key and
 * a checksum of its payload, so a corrupt, truncated or foreign file is
 * ignored (and rewritten), never trusted.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_OPTS 16

/* ---- sources ---- */

/* A kernel directory's files: the .cu, .cuh and .h files in it, whichever
 * they are, so that one library can compile the kernels of another tree
 * whose files differ (a header added or gone: decode A/Bs across commits). */
#define MAX_SOURCES 64
_Static_assert(PA_KERNEL_SOURCES <= MAX_SOURCES, "the embedded sources fit");

typedef struct sources {
    int n;
    pa_kernel_source src[MAX_SOURCES];
    char *owned[MAX_SOURCES][2]; /* a directory's: each file's name and text */
} sources;

static void sources_free(sources *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->owned[i][0]);
        free(s->owned[i][1]);
    }
}

static bool is_source_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return name[0] != '.' && dot && (strcmp(dot, ".cu") == 0 || strcmp(dot, ".cuh") == 0 || strcmp(dot, ".h") == 0);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Appends dir/name to s, its text read whole; s owns name (malloc'd) from here. */
static pa_status source_add(pa_context *ctx, const pa_compile_from *from, sources *s, char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", from->dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        free(name);
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: cannot read %s: %s", from->dir_name, path, strerror(errno));
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        free(name);
        fclose(f);
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: cannot read %s", from->dir_name, path);
    }
    fclose(f);
    text[n] = '\0';
    s->src[s->n] = (pa_kernel_source){name, text, (size_t)n};
    s->owned[s->n][0] = name;
    s->owned[s->n][1] = text;
    s->n++;
    return PA_OK;
}

/* The sources: embedded, or from->dir's when set: the embedded set's names
 * that the directory holds, in the embedded order (the same files give the
 * same cache key as the embedded ones), then its other files by name. */
static pa_status sources_get(pa_context *ctx, const pa_compile_from *from, sources *s) {
    memset(s, 0, sizeof *s);
    pa_kernel_source table[PA_KERNEL_SOURCES];
    pa_kernel_sources(table);
    const char *dir = from->dir;
    if (!dir || !*dir) {
        memcpy(s->src, table, sizeof table);
        s->n = PA_KERNEL_SOURCES;
        return PA_OK;
    }
    DIR *d = opendir(dir);
    if (!d) return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: cannot read the directory %s: %s", from->dir_name, dir, strerror(errno));
    char *names[MAX_SOURCES];
    int nn = 0;
    bool over = false;
    for (struct dirent *e; (e = readdir(d)) != NULL && !over;) {
        if (!is_source_name(e->d_name)) continue;
        over = nn == MAX_SOURCES;
        if (!over && (names[nn] = strdup(e->d_name)) != NULL) nn++;
    }
    closedir(d);
    /* the order: by name, then the embedded set's names moved to the front in their order */
    qsort(names, (size_t)nn, sizeof *names, cmp_names);
    int front = 0;
    for (int i = 0; i < PA_KERNEL_SOURCES; i++)
        for (int j = front; j < nn; j++)
            if (strcmp(names[j], table[i].name) == 0) {
                char *t = names[j];
                memmove(names + front + 1, names + front, (size_t)(j - front) * sizeof *names);
                names[front++] = t;
                break;
            }
    pa_status st = over ? pa_fail(ctx, PA_ERR_ARGUMENT, "%s: %s holds more than %d kernel sources (.cu, .cuh, .h)",
                                  from->dir_name, dir, MAX_SOURCES)
                        : PA_OK;
    for (int j = 0; j < nn; j++) {
        if (st) free(names[j]);
        else st = source_add(ctx, from, s, names[j]);
    }
    if (st) sources_free(s);
    return st;
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
#define IMAGE_CUBIN PA_IMAGE_CUBIN
#define IMAGE_PTX PA_IMAGE_PTX

static void variant_key(const sources *s, const pa_variant *v, const char *arch, int image_kind, const char *extra,
                        uint64_t key[2]) {
    key[0] = 0xcbf29ce484222325ULL;
    key[1] = 0x84222325cbf29ce4ULL;
    for (int i = 0; i < s->n; i++) {
        hash_bytes(key, s->src[i].name, strlen(s->src[i].name));
        hash_bytes(key, s->src[i].text, s->src[i].len);
    }
    const char *file = pa_variant_file(v->kind);
    hash_bytes(key, file, strlen(file));
    char defines[PA_KEY_COUNT][PA_VARIANT_DEFINE_LEN];
    const int ndefines = pa_variant_defines(v, defines);
    for (int i = 0; i < ndefines; i++) hash_bytes(key, defines[i], strlen(defines[i]));
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

static pa_status nvrtc_compile(pa_context *ctx, const char *variant, const sources *s, const pa_variant *v,
                               const char *arch, int image_kind, const pa_compile_from *from, void **image,
                               size_t *size) {
    const pa_kernel_source *main_src = NULL;
    const char *file = pa_variant_file(v->kind);
    const char *hnames[MAX_SOURCES], *htexts[MAX_SOURCES];
    int nh = 0;
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->src[i].name, file) == 0) {
            main_src = &s->src[i];
        } else {
            hnames[nh] = s->src[i].name;
            htexts[nh] = s->src[i].text;
            nh++;
        }
    }
    if (!main_src && from->dir && *from->dir)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: %s has no %s (kernel %s)", from->dir_name, from->dir, file, variant);
    if (!main_src) return pa_fail(ctx, PA_ERR_INTERNAL, "kernel %s: no source %s", variant, file);
    char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
    /* more options, split at blanks (e.g. "-Xptxas -v"); the word
     * no-lineinfo drops -lineinfo */
    char extra[512];
    const char *extra_opts[PA_NVRTC_EXTRA];
    int nextra = 0;
    bool lineinfo = true;
    snprintf(extra, sizeof extra, "%s", from->options ? from->options : "");
    for (char *save = NULL, *t = strtok_r(extra, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (strcmp(t, "no-lineinfo") == 0) lineinfo = false;
        else if (nextra < PA_NVRTC_EXTRA) extra_opts[nextra++] = t;
        else return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: more than %d options", from->options_name, PA_NVRTC_EXTRA);
    }
    char defines[PA_KEY_COUNT][PA_VARIANT_DEFINE_LEN];
    const int ndefines = pa_variant_defines(v, defines);
    const char *opts[MAX_OPTS + 8 + PA_NVRTC_EXTRA];
    int nopts = 0;
    opts[nopts++] = arch_opt;
    opts[nopts++] = "--std=c++17";
    opts[nopts++] = "-default-device"; /* unannotated functions (generic lambdas: the prefill kernels' peeled steps) are device code */
    if (lineinfo) opts[nopts++] = "-lineinfo"; /* source lines in compute-sanitizer reports */
    for (int i = 0; i < ndefines; i++) opts[nopts++] = defines[i];
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
        if (log && *log) fprintf(stderr, "pagedattn: NVRTC log of %s (%s):\n%s\n", variant, from->options, log);
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

pa_status pa_cuda_variant_image(pa_context *ctx, const char *name, const pa_variant *v, const char *arch,
                                int image_kind, bool use_disk, const pa_compile_from *from, void **image,
                                size_t *size, bool *was_cached) {
    sources s;
    pa_status st = sources_get(ctx, from, &s);
    if (st) return st;
    const char *extra = from->options ? from->options : "";
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
    st = nvrtc_compile(ctx, name, &s, v, arch, image_kind, from, image, size);
    sources_free(&s);
    if (st == PA_OK && disk) cache_write(path, key, *image, *size, image_kind);
    return st;
}

pa_status pa_cuda_device0_arch(pa_context *ctx, const char *what, char *arch, size_t len, int *image_kind) {
    char why[512];
    if (!pa_cuda_driver_ready(why, sizeof why))
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "%s: no architecture given and no CUDA device: %s", what, why);
    CUdevice d;
    int major = 0, minor = 0;
    CU_TRY(ctx, pa_cu.cuDeviceGet(&d, 0));
    CU_TRY(ctx, pa_cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d));
    CU_TRY(ctx, pa_cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d));
    pa_cuda_pick_arch(major, minor, arch, len, image_kind);
    return PA_OK;
}

/* pa_kernel_compile: the sources and options of the environment
 * ($PAGEDATTN_KERNEL_DIR, $PAGEDATTN_NVRTC_OPTIONS), read at each call. */
pa_status pa_cuda_kernel_compile(pa_context *ctx, const char *variant, const char *arch,
                                 int use_disk_cache, int *was_cached) {
    if (was_cached) *was_cached = 0;
    pa_variant v;
    pa_status st = pa_variant_parse(ctx, variant, &v);
    if (st) return st;
    const pa_compile_from from = {getenv("PAGEDATTN_KERNEL_DIR"), "PAGEDATTN_KERNEL_DIR",
                                  getenv("PAGEDATTN_NVRTC_OPTIONS"), "PAGEDATTN_NVRTC_OPTIONS"};
    if (from.options && strlen(from.options) >= 512)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_NVRTC_OPTIONS: longer than %d characters", 511);
    char why[512];
    if (!pa_nvrtc_ready(why, sizeof why)) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "%s", why);
    char dev_arch[32];
    int image_kind = IMAGE_CUBIN;
    if (!arch || !*arch) {
        st = pa_cuda_device0_arch(ctx, "kernel compile", dev_arch, sizeof dev_arch, &image_kind);
        if (st) return st;
        arch = dev_arch;
    } else if (strncmp(arch, "compute_", 8) == 0) {
        image_kind = IMAGE_PTX;
    } else if (strncmp(arch, "sm_", 3) != 0 || strlen(arch) > 16) {
        return pa_fail(ctx, PA_ERR_ARGUMENT, "arch: '%s' is not like \"sm_90a\" or \"compute_90\"", arch);
    }
    void *image = NULL;
    size_t size = 0;
    bool cached = false;
    st = pa_cuda_variant_image(ctx, variant, &v, arch, image_kind, use_disk_cache != 0, &from, &image, &size, &cached);
    free(image);
    if (was_cached) *was_cached = cached;
    return st;
}
