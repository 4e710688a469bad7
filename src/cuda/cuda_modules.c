/*
 * cuda_modules.c -- compiled kernel modules loaded on a device, kept per
 * variant, kernel directory and NVRTC options (the device's tuning), so a
 * process can compare kernel sources or defines: each of its kernels' launch
 * facts (pa_<kind>_info) and entry points.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>

pa_status pa_cuda_module(pa_context *ctx, cuda_impl *impl, const char *variant, pa_kmodule **out) {
    const char *srcdir = impl->tuning.kernel_dir, *options = impl->tuning.nvrtc_options;
    for (pa_kmodule *m = impl->modules; m; m = m->next) {
        if (strcmp(m->name, variant) == 0 && strcmp(m->srcdir, srcdir) == 0 && strcmp(m->options, options) == 0) {
            *out = m;
            return PA_OK;
        }
    }
    if (strlen(variant) >= sizeof impl->modules->name)
        return pa_fail(ctx, PA_ERR_INTERNAL, "kernel variant name too long: %s", variant);
    pa_variant v;
    pa_status st = pa_variant_parse(ctx, variant, &v);
    if (st) return st;
    int image_kind = PA_IMAGE_CUBIN;
    char arch[32];
    pa_cuda_pick_arch(impl->cc_major, impl->cc_minor, arch, sizeof arch, &image_kind);

    pa_kmodule *m = calloc(1, sizeof *m);
    if (!m) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "kernel %s: out of host memory", variant);
    snprintf(m->name, sizeof m->name, "%s", variant);
    snprintf(m->srcdir, sizeof m->srcdir, "%s", srcdir);
    snprintf(m->options, sizeof m->options, "%s", options);
    const pa_compile_from from = {srcdir, "kernel_dir", options, "nvrtc_options"};
    void *image = NULL;
    size_t size = 0;
    bool cached = false;
    st = pa_cuda_variant_image(ctx, variant, &v, arch, image_kind, true, &from, &image, &size, &cached);
    if (st == PA_OK) {
        CUresult r = pa_cu.cuModuleLoadData(&m->module, image);
        if (r != CUDA_SUCCESS && cached) {
            /* a cached image the driver rejects: compile afresh (and replace it) */
            free(image);
            image = NULL;
            st = pa_cuda_variant_image(ctx, variant, &v, arch, image_kind, false, &from, &image, &size, &cached);
            if (st == PA_OK) r = pa_cu.cuModuleLoadData(&m->module, image);
        }
        if (st == PA_OK && r != CUDA_SUCCESS)
            st = pa_cu_fail(ctx, r, "cuModuleLoadData(kernel image)", __FILE__, __LINE__);
    }
    free(image);
    const char *info = pa_variant_info_symbol(v.kind);
    if (st == PA_OK && info) {
        CUdeviceptr ptr = 0;
        size_t bytes = 0;
        if (pa_cu.cuModuleGetGlobal(&ptr, &bytes, m->module, info) == CUDA_SUCCESS &&
            bytes <= sizeof m->info) {
            CUresult r = pa_cu.cuMemcpyDtoHAsync(m->info, ptr, bytes, impl->stream);
            if (r == CUDA_SUCCESS) r = pa_cu.cuStreamSynchronize(impl->stream);
            if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuMemcpyDtoH(kernel info)", __FILE__, __LINE__);
        } else {
            st = pa_fail(ctx, PA_ERR_INTERNAL, "kernel %s: no %s in the module", variant, info);
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
