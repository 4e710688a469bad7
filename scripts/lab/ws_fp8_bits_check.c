/*
 * scripts/lab/ws_fp8_bits_check.c -- prefill_ws's widening of fp8 into bf16
 * by the bits (ws_fp8x4_to_bf16 and ws_fp8_special, kernels/prefill_ws.cu)
 * against the exact decode, on the host: every byte of every position of
 * 4-byte words whose other bytes are random, both formats. The bf16 product
 * by 2^120 (2^112) is modelled in f32: a bf16 times a power of two is exact
 * there, and back in bf16 (8 significant bits at most). A word with a NaN or
 * infinity code must be flagged (the kernel then takes the f32 route); every
 * other code must come out as its exact value, signed zeros included.
 *   cc -O2 -o /tmp/c scripts/lab/ws_fp8_bits_check.c -lm && /tmp/c
 * (2026-12-07: 2 x 4 x 256 x 4096 words, 0 differ)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static float f32_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static float bf16_value(uint32_t h) { return f32_of(h << 16); }
static double decode(int e4, uint32_t b) {
    const double s = b & 0x80 ? -1.0 : 1.0;
    if (e4) {
        const int e = (b >> 3) & 15, m = b & 7;
        if (e == 15 && m == 7) return NAN;
        return s * (e ? (1 + m / 8.0) * ldexp(1, e - 7) : m * ldexp(1, -9));
    }
    const int e = (b >> 2) & 31, m = b & 3;
    if (e == 31) return m ? NAN : s * INFINITY;
    return s * (e ? (1 + m / 4.0) * ldexp(1, e - 15) : m * ldexp(1, -16));
}
static uint32_t perm(uint32_t w, int hi) { /* __byte_perm(w, 0, 0x1404 / 0x3424) */
    const uint32_t b0 = (w >> (hi ? 16 : 0)) & 0xff, b1 = (w >> (hi ? 24 : 8)) & 0xff;
    return (b0 << 8) | (b1 << 24);
}

int main(void) {
    uint64_t rng = 88172645463325252ull, n = 0, bad = 0;
    for (int e4 = 0; e4 < 2; e4++) {
        const uint32_t SH = e4 ? 4 : 3;
        const float POW = e4 ? ldexpf(1, 120) : ldexpf(1, 112);
        for (int pos = 0; pos < 4; pos++)
            for (uint32_t b = 0; b < 256; b++)
                for (int r = 0; r < 4096; r++) {
                    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                    const uint32_t w = ((uint32_t)rng & ~(0xffu << (8 * pos))) | (b << (8 * pos));
                    const uint32_t sp = e4 ? (w & 0x7f7f7f7fu) + 0x01010101u : (w & 0x7c7c7c7cu) + 0x04040404u;
                    int special = 0;
                    for (int k = 0; k < 4; k++) special |= !isfinite(decode(e4, (w >> (8 * k)) & 0xff));
                    n++;
                    if (((sp & 0x80808080u) != 0) != special) { bad++; continue; }
                    if (special) continue;
                    for (int k = 0; k < 4; k++) {
                        const uint32_t a = perm(w, k >= 2), half = k & 1 ? a >> 16 : a & 0xffff;
                        const uint32_t placed = ((half & 0x7f00u) >> SH) | (half & 0x8000u);
                        const float got = bf16_value(placed) * POW;
                        const double want = decode(e4, (w >> (8 * k)) & 0xff);
                        if ((double)got != want || !signbit(got) != !signbit(want)) bad++;
                    }
                }
    }
    printf("%llu words checked, %llu differ\n", (unsigned long long)n, (unsigned long long)bad);
    return bad != 0;
}
