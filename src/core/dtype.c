/* dtype.c -- the element types' sizes and names: a leaf every backend calls,
 * kept out of tensor.c so that a backend's object does not call the file that
 * owns device handles (tensor.c -> device.c -> the backends). */
#include "pagedattn.h"

size_t pa_dtype_size(pa_dtype dtype) {
    switch (dtype) {
    case PA_F32: return 4;
    case PA_F16: return 2;
    case PA_BF16: return 2;
    case PA_I32: return 4;
    case PA_FP8_E4M3: return 1;
    case PA_FP8_E5M2: return 1;
    }
    return 0;
}

const char *pa_dtype_name(pa_dtype dtype) {
    switch (dtype) {
    case PA_F32: return "f32";
    case PA_F16: return "f16";
    case PA_BF16: return "bf16";
    case PA_I32: return "i32";
    case PA_FP8_E4M3: return "fp8_e4m3";
    case PA_FP8_E5M2: return "fp8_e5m2";
    }
    return "?";
}
