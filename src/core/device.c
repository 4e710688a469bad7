/* device.c -- opening devices by name through the backend registry
 * (src/backends.c); one shared instance per physical device. */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define PA_MAX_BACKENDS 8
#define PA_MAX_DEVICES 64 /* per backend */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pa_device *instances[PA_MAX_BACKENDS][PA_MAX_DEVICES];

void pa_device_retain(pa_device *dev) { atomic_fetch_add(&dev->refcount, 1); }

void pa_device_release(pa_device *dev) {
    if (!dev) return;
    pthread_mutex_lock(&registry_lock);
    if (atomic_fetch_sub(&dev->refcount, 1) == 1) {
        pa_device **slot = &instances[dev->backend][dev->index];
        if (*slot == dev) *slot = NULL;
        dev->ops->destroy(dev);
    }
    pthread_mutex_unlock(&registry_lock);
}

void *pa_backend_proc(const char *name) {
    for (int b = 0; pa_backends[b]; b++) {
        void *f = pa_backends[b]->proc ? pa_backends[b]->proc(name) : NULL;
        if (f) return f;
    }
    return NULL;
}

/* The backend and device index a name asks for ("cpu", "cpu:staged",
 * "cuda", "cuda:3", ...: each backend parses what follows its own name). */
static pa_status parse_name(pa_context *ctx, const char *name, int *backend, int *index) {
    char known[256] = "";
    size_t n = 0;
    for (int b = 0; pa_backends[b] && b < PA_MAX_BACKENDS; b++) {
        const pa_backend_reg *r = pa_backends[b];
        const size_t len = strlen(r->name);
        if (strncmp(name, r->name, len) == 0) {
            const int i = r->parse(name + len);
            if (i >= 0 && i < r->max_devices && i < PA_MAX_DEVICES) {
                *backend = b;
                *index = i;
                return PA_OK;
            }
        }
        if (n < sizeof known)
            n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", n ? ", " : "", r->names);
    }
    return pa_fail(ctx, PA_ERR_ARGUMENT, "device: unknown device name '%s' (expected one of %s)", name, known);
}

/* The name of the default device: $PAGEDATTN_DEVICE, else the first backend
 * usable here. */
static const char *default_name(void) {
    const char *name = getenv("PAGEDATTN_DEVICE");
    if (name && *name) return name;
    for (int b = 0; pa_backends[b]; b++) {
        char why[256];
        if (pa_backends[b]->usable(why, sizeof why)) return pa_backends[b]->name;
    }
    return "cpu";
}

pa_status pa_device_open(pa_context *ctx, const char *name, pa_device **out) {
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: out is NULL");
    *out = NULL;
    if (!name || !*name) name = default_name();
    int backend, index;
    pa_status st = parse_name(ctx, name, &backend, &index);
    if (st) return st;

    pthread_mutex_lock(&registry_lock);
    pa_device **slot = &instances[backend][index];
    if (*slot) {
        pa_device_retain(*slot);
        *out = *slot;
    } else {
        st = pa_backends[backend]->create(ctx, index, out);
        if (st == PA_OK) {
            atomic_store(&(*out)->refcount, 1);
            (*out)->backend = backend;
            *slot = *out;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

pa_device_kind pa_device_get_kind(const pa_device *dev) { return dev->kind; }
int pa_device_index(const pa_device *dev) { return dev->index; }
const char *pa_device_name(const pa_device *dev) { return dev->name; }
const char *pa_device_description(const pa_device *dev) { return dev->description; }
int pa_device_num_threads(const pa_device *dev) { return dev->num_threads; }

pa_status pa_device_synchronize(pa_context *ctx, pa_device *dev) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    return dev->ops->synchronize(ctx, dev);
}

pa_status pa_device_measure_ceilings(pa_context *ctx, pa_device *dev, double seconds,
                                     pa_ceilings *out) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: NULL");
    if (!(seconds > 0 && seconds < 600))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "seconds: %g is not in (0, 600)", seconds);
    memset(out, 0, sizeof *out);
    return dev->ops->measure_ceilings(ctx, dev, seconds, out);
}

/* ---- the laboratory's instruments that belong to a backend (pagedattn_lab.h) ---- */

pa_status pa_device_timing(pa_context *ctx, pa_device *dev, int on) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (!dev->ops->timing) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "timing: %s cannot time its kernels", dev->name);
    return dev->ops->timing(ctx, dev, on);
}

pa_status pa_device_timing_last(pa_context *ctx, pa_device *dev, double *seconds) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (!seconds) return pa_fail(ctx, PA_ERR_ARGUMENT, "seconds: NULL");
    *seconds = 0;
    if (!dev->ops->timing_last) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "timing: %s cannot time its kernels", dev->name);
    return dev->ops->timing_last(ctx, dev, seconds);
}

/* The kernel catalog and compiler: the extras of the backend that compiles
 * kernels at run time (none: an empty catalog). */
typedef int (*catalog_size_fn)(void);
typedef const char *(*catalog_name_fn)(int);
typedef pa_status (*compile_fn)(pa_context *, const char *, const char *, int, int *);

int pa_kernel_catalog_size(void) {
    catalog_size_fn f = (catalog_size_fn)pa_backend_proc("kernel_catalog_size");
    return f ? f() : 0;
}

const char *pa_kernel_catalog_name(int index) {
    catalog_name_fn f = (catalog_name_fn)pa_backend_proc("kernel_catalog_name");
    return f ? f(index) : NULL;
}

pa_status pa_kernel_compile(pa_context *ctx, const char *variant, const char *arch, int use_disk_cache,
                            int *was_cached) {
    if (was_cached) *was_cached = 0;
    compile_fn f = (compile_fn)pa_backend_proc("kernel_compile");
    if (!f) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "kernel compile: no backend compiles kernels");
    return f(ctx, variant, arch, use_disk_cache, was_cached);
}

/* The tuning of a device's kernels and the planner's view of them. */

pa_status pa_device_get_tuning(pa_context *ctx, pa_device *dev, pa_cuda_tuning *out, int defaults) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: NULL");
    if (!dev->ops->get_tuning) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "tuning: %s has no kernel tuning", dev->name);
    return dev->ops->get_tuning(ctx, dev, out, defaults);
}

pa_status pa_device_set_tuning(pa_context *ctx, pa_device *dev, const pa_cuda_tuning *tuning) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (!tuning) return pa_fail(ctx, PA_ERR_ARGUMENT, "tuning: NULL");
    if (!dev->ops->set_tuning) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "tuning: %s has no kernel tuning", dev->name);
    return dev->ops->set_tuning(ctx, dev, tuning);
}

pa_status pa_device_last_plan(pa_context *ctx, pa_device *dev, char *out, size_t len) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (!out || len == 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: NULL or empty");
    out[0] = '\0';
    if (!dev->ops->last_plan) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "last plan: %s plans no kernels", dev->name);
    return dev->ops->last_plan(ctx, dev, out, len);
}

typedef int (*field_count_fn)(void);
typedef const pa_tuning_field *(*field_fn)(int);
typedef pa_status (*variants_fn)(pa_context *, const pa_kernel_shape *, const pa_cuda_tuning *, const char *, char *,
                                 size_t, int *);

typedef void (*defaults_fn)(pa_cuda_tuning *);
void pa_cuda_tuning_defaults(pa_cuda_tuning *out) {
    defaults_fn f = (defaults_fn)pa_backend_proc("tuning_defaults");
    if (f) f(out);
    else memset(out, 0, sizeof *out);
}

int pa_cuda_tuning_field_count(void) {
    field_count_fn f = (field_count_fn)pa_backend_proc("tuning_field_count");
    return f ? f() : 0;
}

const pa_tuning_field *pa_cuda_tuning_field(int index) {
    field_fn f = (field_fn)pa_backend_proc("tuning_field");
    return f ? f(index) : NULL;
}

pa_status pa_kernel_variants_for(pa_context *ctx, const pa_kernel_shape *shape, const pa_cuda_tuning *tuning,
                                 const char *arch, char *out, size_t out_len, int *count) {
    if (count) *count = 0;
    variants_fn f = (variants_fn)pa_backend_proc("kernel_variants_for");
    if (!f) return pa_fail(ctx, PA_ERR_UNSUPPORTED, "kernel variants: no backend plans kernels");
    return f(ctx, shape, tuning, arch, out, out_len, count);
}
