/*
 * scripts/lab/fp8_append_sure_check.c -- the fp8 append's f32 path (kv8 in
 * kernels/append.cu) against the host's definition of the cache byte
 * (pa_f64_to_fp8 of (a b + e f) * (1 / scale), each operation in double), on
 * the host: where kv8 says it is sure, its byte must be the definition's.
 * put_x's exact products are checked the same way. The hardware's
 * cvt.rn.satfinite (f32 -> fp8, nearest even, saturating) is modelled by
 * pa_f32_to_fp8, which the GPU specs check it against. Samples:
 * bf16 and f16 values (random bits, random normals), rotary terms (a b + e f
 * with cos/sin of random angles, or v's plain x: b = 1, e f = -0 * 0), scales
 * of random bits, random exponents, powers of two and values near 1, and
 * values put on or next to an fp8 rounding boundary.
 *   cc -O2 -I src -o /tmp/fp8_append_sure_check scripts/lab/fp8_append_sure_check.c -lm && /tmp/fp8_append_sure_check [N]
 */
#include "core/internal.h"
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 88172645463325252ULL;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static double unit(void) { return (double)(next() >> 11) * 0x1p-53; }
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* a 16-bit value (bf16 or f16) as a float */
static float x16(int bf) {
    const int mode = (int)(next() % 4);
    float x;
    if (mode == 0) x = bf ? pa_bf16_to_f32((uint16_t)next()) : pa_f16_to_f32((uint16_t)next());
    else x = (float)((unit() * 2 - 1) * pow(2.0, (double)(next() % 24) - 12));
    return bf ? pa_bf16_to_f32(pa_f32_to_bf16(x)) : pa_f16_to_f32(pa_f32_to_f16(x));
}
static float scale_of(void) {
    switch (next() % 4) {
    case 0: return from_bits((uint32_t)next() & 0x7fffffffu);
    case 1: return ldexpf(1.0f, (int)(next() % 60) - 30);
    case 2: return (float)(1.0 + (unit() - 0.5) * 1e-3);
    default: return (float)(unit() * pow(2.0, (double)(next() % 40) - 20));
    }
}

int main(int argc, char **argv) {
    const long n = argc > 1 ? atol(argv[1]) : 200000000L;
    long checked = 0, sure_n = 0, exact_n = 0, bad = 0;
    for (long it = 0; it < n; it++) {
        const pa_dtype dt = (it & 1) ? PA_FP8_E5M2 : PA_FP8_E4M3;
        const int bf = (it >> 1) & 1;
        const float s = scale_of();
        if (!(s > 0) || !isfinite(s)) continue;
        const double invd = 1.0 / (double)s;
        float a = x16(bf), b, e, f;
        int plain = 0;
        if (next() % 3 == 0) { /* v: plain x */
            plain = 1;
            b = 1.0f;
            e = -0.0f;
            f = 0.0f;
        } else {
            const double th = unit() * 6.283185307179586;
            const float c = (float)cos(th), sn = (float)sin(th), x1 = x16(bf);
            if (next() & 1) { b = c; e = -x1; f = sn; } /* y0 = x0 c - x1 s */
            else { b = sn; e = x1; f = c; }             /* y1 = x0 s + x1 c */
        }
        if (next() % 8 == 0) { /* on or next to a rounding boundary: a = (a midpoint) * scale, rounded to 16 bits */
            const uint8_t code = (uint8_t)(next() & 0x7e);
            const double lo = pa_fp8_to_f32(code, dt), hi = pa_fp8_to_f32((uint8_t)(code + 1), dt);
            const float want = (float)((lo + hi) / 2 * s);
            a = bf ? pa_bf16_to_f32(pa_f32_to_bf16(want)) : pa_f16_to_f32(pa_f32_to_f16(want));
            if (next() & 1) a = nextafterf(a, 0.0f);
            plain = 1;
            b = 1.0f;
            e = -0.0f;
            f = 0.0f;
        }
        const uint8_t def = pa_f64_to_fp8(((double)a * b + (double)e * f) * invd, dt);
        const float inv = (float)invd, tol = fabsf(inv) * 0x1p-20f;
        const int fast = invd >= 0x1p-60 && invd <= 0x1p20;
        checked++;
        if (plain && fast && (double)inv == invd) { /* kv8::put_x: an exact product */
            const float z = a * inv;
            if (fmaf(a, inv, -z) == 0.0f) {
                exact_n++;
                if (pa_f32_to_fp8(z, dt) != def) {
                    if (bad < 10) printf("x=%a s=%a: exact f32 %02x, definition %02x\n", a, s, pa_f32_to_fp8(z, dt), def);
                    bad++;
                }
                continue;
            }
        }
        /* kv8::put */
        const float t = e * f, z = fmaf(a, b, t) * inv;
        const float err = fmaf(fabsf(a), fabsf(b), fabsf(t)) * tol;
        const uint8_t lo = pa_f32_to_fp8(z - err, dt), hi = pa_f32_to_fp8(z + err, dt);
        const int sure = fast && lo == hi && bits(err) - 0x0e000000u <= 0x71800000u - 0x0e000000u;
        if (sure) {
            sure_n++;
            if (lo != def) {
                if (bad < 10)
                    printf("a=%a b=%a e=%a f=%a s=%a: f32 path %02x, definition %02x\n", a, b, e, f, s, lo, def);
                bad++;
            }
        }
    }
    printf("%ld checked, %ld exact products, %ld sure by the interval (%.4f%% decided in f32), %ld differ\n", checked,
           exact_n, sure_n, 100.0 * (exact_n + sure_n) / checked, bad);
    return bad != 0;
}
