/*
 * scripts/lab/dequant_head_check.c -- the kv head of a chunk in pa_dequant
 * (kernels/append.cu) by multiplications, umulhi(x, ceil(2^32 / d)) for x /
 * d, against the two divisions it replaced, (cc % row) / per, on the host:
 * every chunk of a page of 256 keys for per (head_dim / 8) 1..32 and kv heads
 * 1..63, then every 37th kv head count up to 4095 (the kernel's bound) with
 * every 97th chunk where a page holds over a million.
 *   cc -O2 -o /tmp/c scripts/lab/dequant_head_check.c && /tmp/c
 * (2026-12-07: 794068064 checked, 0 differ)
 */
#include <stdint.h>
#include <stdio.h>

static uint32_t umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }

int main(void) {
    long n = 0, bad = 0;
    for (uint32_t per = 1; per <= 32; per++)
        for (uint32_t hk = 1; hk < 4096; hk += hk < 64 ? 1 : 37) {
            const uint32_t m_per = 0xffffffffu / per + 1u, m_hk = 0xffffffffu / hk + 1u;
            const uint32_t all = 256u * hk * per, step = all > 1000000u ? 97u : 1u;
            for (uint32_t cc = 0; cc < all; cc += step) {
                const uint32_t hd = per == 1 ? cc : umulhi(cc, m_per);
                const uint32_t h = hk == 1 ? 0 : hd - umulhi(hd, m_hk) * hk;
                n++;
                if (h != (cc % (hk * per)) / per) {
                    if (bad++ < 10) printf("per %u kv heads %u chunk %u: %u, want %u\n", per, hk, cc, h, (cc % (hk * per)) / per);
                }
            }
        }
    printf("%ld checked, %ld differ\n", n, bad);
    return bad != 0;
}
