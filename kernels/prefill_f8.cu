/*
 * prefill_f8.cu -- paged prefill over an fp8 cache on Hopper's fp8 tensor
 * cores (sm_90a; f16 or bf16 q, head dim 128, an e4m3 or e5m2 cache): Q and
 * P rounded to e4m3, both products on wgmma k32, as flash-attention 3's fp8
 * forward does. Opt-in (tuning prefill_fp8 = 2): Q and P keep 3 bits of
 * mantissa, so the tolerance rule does not hold; docs/fp8.md states the
 * error against the float64 reference.
 *
 * Two entries:
 * - pa_f8_tiles (pa_dequant_params; a block a sequence, kv head and 128-key
 *   tile): the keys the call attends, from their pages into the call's
 *   scratch as the products read them. fp8 wgmma takes both operands K-major
 *   (no transpose for 8-bit types), so K stays [keys][dims] and V is
 *   transposed to [dims][keys]; each a 16 KB tile in the 128-byte swizzle
 *   (16-byte chunk c of row r at c ^ (r % 8)). A V^T row's keys are permuted
 *   within each 32 (f8_key) into the byte order in which S's accumulators
 *   hand a lane its P, so that P packs into A fragments with no shuffle (the
 *   sum over keys does not care about their order). Keys past the sequence's
 *   last are zeros.
 * - pa_prefill_f8 (pa_attn_params; the work items and blocks of the
 *   prefill_ws plan of the same call over 16-bit caches): prefill_ws's roles,
 *   a producer warpgroup and two consumer warpgroups of 64 (query, head) rows
 *   taking turns on the tensor cores. The producer moves each tile with one
 *   bulk copy (the tiles are already in their layout: no tensor maps, no
 *   page walk) and loads Q; each consumer rounds its rows of Q once into
 *   e4m3 A fragments in registers, a power of two a row bringing the row's
 *   largest |element| into [128, 256) (the factor comes back out of the
 *   scores' exponent factor, with k_scale), and P is 2^8 times the softmax's
 *   (at most 256 < 448, its small values above e4m3's subnormals longer;
 *   the row sums carry the same factor, taken out with v_scale at the end).
 *
 * k_out / v_out of pa_f8_tiles and k_cache / v_cache of pa_prefill_f8: the
 * tiles, ((b x kv_heads + hk) x ntile + tile) x 16 KB, ntile = the width in
 * pages x page_size / 128 rounded up (width: bt_stride of the 16-bit plan).
 *
 * Defines: PA_DTYPE (q), PA_D (128), PA_GT, PA_STAGES (2-4), PA_KV (the
 * caches' fp8 format).
 */
#ifndef PA_EMBED_ONLY
#if !defined(PA_DTYPE) || !defined(PA_D) || !defined(PA_GT) || !defined(PA_STAGES) || !defined(PA_KV)
#error "prefill_f8.cu needs PA_DTYPE, PA_D, PA_GT, PA_STAGES, PA_KV"
#endif
#if PA_KV == 5
#define PA_WGMMA_F8_B "e5m2"
#else
#define PA_WGMMA_F8_B "e4m3"
#endif
#define PA_NATURAL 0
#include "prefill_wgmma.cuh"
#include "ws_common.cuh"

namespace {
constexpr int D = PA_D;
constexpr int BM = 128, BN = 128, NTHREADS = 384;
constexpr int GT = PA_GT, QT = BM / GT;
constexpr int Q_BYTES = BM * D * 2; /* Q as loaded (16-bit), then the epilogue's staging */
constexpr int TILE = BN * D;        /* one K or V^T tile: 16 KB */
constexpr int SMEM = 1024 + Q_BYTES + 2 * PA_STAGES * TILE;
constexpr int LIFT = 8;             /* P times 2^LIFT */
constexpr int LAUNCH_REGS = 65536 / NTHREADS / 8 * 8, PRODUCER_REGS = 56, CONSUMER_REGS = 224;
static_assert(D == 128, "head dim 128: a row of K, and of V^T's 128 keys, is one 128-byte swizzle line");
static_assert(PA_KV == PA_DT_FP8_E4M3 || PA_KV == PA_DT_FP8_E5M2, "an fp8 cache");
static_assert(PA_DTYPE == PA_DT_F16 || PA_DTYPE == PA_DT_BF16, "f16 or bf16 q");
static_assert(GT >= 1 && GT <= 16, "heads per tile");
static_assert(PA_STAGES >= 2 && PA_STAGES <= 4, "pipeline depth");
static_assert(SMEM <= 227 * 1024, "shared memory");
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= NTHREADS * LAUNCH_REGS, "setmaxnreg");
} // namespace

extern "C" __constant__ int pa_prefill_f8_info[4] = {NTHREADS, SMEM, BN, QT};

/* 128-key tiles a (sequence, kv head): of `width` pages of page_size */
PA_DEV int f8_ntile(i64 width, int page_size) { return (int)((width * page_size + BN - 1) / BN); }

/* The key (of its tile) at byte position pos of a V^T row: within each 32,
 * the order in which a lane's S accumulators (columns 8 i + 2 t4 + {0, 1})
 * fill its e4m3 A fragment (bytes 4 t4 .. 4 t4 + 3, then 16 + the same). */
PA_DEV int f8_key(int pos) {
    const int r = pos & 15, t = r >> 2, j = r & 3;
    return (pos & ~15) + 2 * t + (j & 1) + 8 * (j >> 1);
}

extern "C" __global__ void __launch_bounds__(256) pa_f8_tiles(const pa_dequant_params p) {
    __shared__ __align__(16) u8 s_v[BN * D]; /* the V tile as the cache holds it, [keys][dims] */
    const int ntile = f8_ntile(p.width, p.page_size);
    const int tile = (int)(blockIdx.x % (unsigned)ntile), bh = (int)(blockIdx.x / (unsigned)ntile);
    const int hk = bh % p.kv_heads, b = bh / p.kv_heads;
    const int seqlen = ((const int *)p.seqlen)[b];
    const i64 out = (i64)blockIdx.x * TILE;
    for (int e = threadIdx.x; e < BN * D / 16; e += blockDim.x) {
        const int r = e >> 3, c = e & 7, key = tile * BN + r;
        uint4 kx = make_uint4(0u, 0u, 0u, 0u), vx = kx;
        if (key < seqlen) {
            const i64 pid = ((const int *)p.block_table)[(i64)b * p.bt_stride + key / p.page_size];
            const i64 src = pid * p.page_stride + ((i64)(key % p.page_size) * p.kv_heads + hk) * D + c * 16;
            kx = *(const uint4 *)((const u8 *)p.k_cache + src);
            vx = *(const uint4 *)((const u8 *)p.v_cache + src);
        }
        *(uint4 *)((u8 *)p.k_out + out + r * 128 + ((c ^ (r & 7)) << 4)) = kx;
        *(uint4 *)(s_v + r * D + c * 16) = vx;
    }
    __syncthreads();
    /* V^T: row d, chunk c = positions 16 c .. 16 c + 15; a warp's 32 dims of
     * one key read 8 words in 8 banks */
    for (int e = threadIdx.x; e < BN * D / 16; e += blockDim.x) {
        const int d = e & (D - 1), c = e / D;
        u32 x[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[i] = 0u;
#pragma unroll
            for (int j = 0; j < 4; j++) x[i] |= (u32)s_v[f8_key(16 * c + 4 * i + j) * D + d] << (8 * j);
        }
        *(uint4 *)((u8 *)p.v_out + out + d * 128 + ((c ^ (d & 7)) << 4)) = make_uint4(x[0], x[1], x[2], x[3]);
    }
}

/* Two f32 to e4m3 codes, lo in the low byte (nearest even, saturating). */
PA_DEV u32 f8_pair(float lo, float hi) {
    u16 c;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c) : "f"(hi), "f"(lo));
    return c;
}
PA_DEV u32 f8_quad(float a, float b, float c, float d) { return f8_pair(a, b) | (f8_pair(c, d) << 16); }

/* Two 16-bit q elements (a word) to f32. */
PA_DEV void q_pair(u32 w, float &a, float &b) {
#if PA_DTYPE == PA_DT_BF16
    a = __uint_as_float(w << 16);
    b = __uint_as_float(w & 0xffff0000u);
#else
    a = pa_f16_to_f32((u16)w);
    b = pa_f16_to_f32((u16)(w >> 16));
#endif
}

/* Row R of the Q tile (swizzled 16-bit, pa_swz) as the lane's four e4m3 A
 * fragment words of each 32 dims (a lane holds dims 32 s + 4 t4 .. + 3 and
 * 32 s + 16 + 4 t4 .. + 3, word 2 s and 2 s + 1 of q8), times 2^c: the
 * row's largest |element| into [128, 256). Returns 2^-c. */
PA_DEV float q_row_e4m3(const u8 *smem, int R, int t4, u32 (&q8)[2 * D / 32]) {
    float x[D / 4];
    float amax = 0.f;
#pragma unroll
    for (int h = 0; h < D / 16; h++) { /* 4 elements: dims 16 h + 4 t4 .. */
        const uint2 w = *(const uint2 *)(smem + pa_swz(BM, R, 2 * h + (t4 >> 1)) + (t4 & 1) * 8);
        q_pair(w.x, x[4 * h], x[4 * h + 1]);
        q_pair(w.y, x[4 * h + 2], x[4 * h + 3]);
#pragma unroll
        for (int j = 0; j < 4; j++) amax = fmaxf(amax, fabsf(x[4 * h + j]));
    }
    amax = pa_quad_max(amax);
    /* 2^c = 2^(134 - E) for amax's biased exponent E (clamped: both powers
     * normal; a row of zeros or of subnormals takes the largest) */
    const int E = min(max((int)(__float_as_uint(amax) >> 23), 8), 254);
    const float mul = __uint_as_float((u32)(261 - E) << 23), inv = __uint_as_float((u32)(E - 7) << 23);
#pragma unroll
    for (int h = 0; h < D / 16; h++)
        q8[h] = f8_quad(x[4 * h] * mul, x[4 * h + 1] * mul, x[4 * h + 2] * mul, x[4 * h + 3] * mul);
    return inv;
}

/* S = Q K^T (Q from registers: q8 words 2 s, 2 s + 1 of each row) and O += P V
 * (V^T K-major), 32 of the reduced dimension per wgmma. Not committed. */
PA_DEV void f8_qk(float (&s)[BN / 8][4], const u32 (&q0)[2 * D / 32], const u32 (&q1)[2 * D / 32], u32 k_addr) {
#pragma unroll
    for (int kk = 0; kk < D / 32; kk++) {
        const u32 a[4] = {q0[2 * kk], q1[2 * kk], q0[2 * kk + 1], q1[2 * kk + 1]};
        pa_wgmma_rs8_128(s, a, pa_wgmma_desc(k_addr + kk * 32, 16, 1024), kk > 0);
    }
}
PA_DEV void f8_pv(float (&o)[D / 8][4], const u32 (&pa)[BN / 32][4], u32 v_addr) {
#pragma unroll
    for (int ks = 0; ks < BN / 32; ks++) pa_wgmma_rs8_128(o, pa[ks], pa_wgmma_desc(v_addr + ks * 32, 16, 1024), 1);
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) pa_prefill_f8(const pa_attn_params p) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap(); /* wgmma and setmaxnreg need sm_90a (other targets compile a stub) */
#else
    extern __shared__ __align__(128) u8 smem_raw[];
    __shared__ pa_work s_w;
    __shared__ int s_lo[BM], s_hi[BM];
    __shared__ float s_slope[1];
    __shared__ __align__(8) u64 bar_q, full_k[PA_STAGES], full_v[PA_STAGES], empty_k[PA_STAGES], empty_v[PA_STAGES];
    const u32 raw = pa_smem_addr(smem_raw), base = (raw + 1023u) & ~1023u; /* swizzle period */
    u8 *smem = smem_raw + (base - raw);
    const u32 k_addr = base + Q_BYTES, v_addr = k_addr + PA_STAGES * TILE;

    const int tid = threadIdx.x, wg = tid >> 7;
    const int item = blockIdx.x / p.head_tiles, head_tile = blockIdx.x % p.head_tiles;
    const int tiles_per_group = p.group / GT;
    const int hk = head_tile / tiles_per_group;
    const int g0 = (head_tile - hk * tiles_per_group) * GT;
    if (tid == 0) {
        s_w = ((const pa_work *)p.work)[item];
        mbar_init(&bar_q, 96); /* producer warps 1-3 */
        mbar_init_rings(full_k, full_v, empty_k, empty_v, 1); /* the issuing thread's expect_tx */
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const pa_work w = s_w;
    const int kbase = w.k0 - w.k0 % BN; /* tile t holds keys kbase + t BN .. + BN - 1 */
    const int nt = (w.k1 - kbase + BN - 1) / BN;

    if (wg == 0) {
        /* ---- producer: warp 0 lane 0 the tiles, warps 1-3 Q ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS) : "memory");
        if (tid >= 32) {
            pa_prefill_load_q<BM, GT, D>(p, w, hk, g0, tid - 32, 96, [&](int r, int c) { return smem + pa_swz(BM, r, c); });
            if (p.q_f32) {
                mbar_arrive(&bar_q); /* release: the stores (the consumers read Q with ld.shared, no proxy fence) */
            } else {
                mbar_arrive_cp_async(&bar_q);
                pa_cp_async_wait<0>();
            }
            return;
        }
        if (tid != 0) return;
        const int ntile = f8_ntile(p.bt_stride, p.page_size); /* (bt_stride: the 16-bit plan's width) */
        const u8 *kt0 = (const u8 *)p.k_cache + (((i64)w.b * p.kv_heads + hk) * ntile + kbase / BN) * TILE;
        const u8 *vt0 = (const u8 *)p.v_cache + (kt0 - (const u8 *)p.k_cache);
        for (int t = 0; t < nt; t++) {
            const int s = t % PA_STAGES;
            const u32 ph = (u32)(t / PA_STAGES) & 1u;
            mbar_wait(&empty_k[s], ph ^ 1u); /* a fresh barrier passes parity 1 */
            mbar_arrive_expect_tx(&full_k[s], TILE);
            bulk_load(k_addr + s * TILE, kt0 + (i64)t * TILE, TILE, &full_k[s]);
            mbar_wait(&empty_v[s], ph ^ 1u);
            mbar_arrive_expect_tx(&full_v[s], TILE);
            bulk_load(v_addr + s * TILE, vt0 + (i64)t * TILE, TILE, &full_v[s]);
        }
        return;
    }

    /* ---- consumers ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
    const int ctid = tid - 128, lane = tid & 31, cwarp = ctid >> 5, cw = cwarp >> 2;
    const int R0 = cw * 64 + (cwarp & 3) * 16 + (lane >> 2);
    pa_prefill_rows<BM, GT, 0>(p, w, hk, g0, s_lo, s_hi, s_slope, ctid, 256);
    consumers_sync();
    pa_lane_rows rs = pa_lane_rows_init<GT, 0>(p, w, R0, s_lo, s_hi, s_slope);
    __shared__ int s_wr[16];
    if (lane == 0) {
        s_wr[cwarp] = rs.wlo;
        s_wr[8 + cwarp] = rs.whi;
    }
    consumers_sync();
    int ti0, ti1;
    pa_interior_tiles(s_wr, 8, kbase, BN, nt, ti0, ti1);

    /* Q: this lane's rows in e4m3, their factors into the scores' */
    u32 q0[2 * D / 32], q1[2 * D / 32];
    mbar_wait(&bar_q, 0);
    {
        const float ks = p.k_scales ? ((const float *)p.k_scales)[hk] : p.k_scale;
        const int t4 = lane & 3;
        rs.c2 *= ks * q_row_e4m3(smem, R0, t4, q0);
        rs.c2b *= ks * q_row_e4m3(smem, R0 + 8, t4, q1);
    }

    float o[D / 8][4];
    pa_zero(o);
    float s[BN / 8][4];
    u32 pa[BN / 32][4];
    auto release = [&](u64 *bar) { /* this warp is done with a slot */
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };
    /* P (lifted) as e4m3 A fragments: keys 32 u .. 32 u + 31, in f8_key's order */
    auto pack = [](const float (&x)[BN / 8][4], u32 (&a)[BN / 32][4]) {
#pragma unroll
        for (int u = 0; u < BN / 32; u++) {
            a[u][0] = f8_quad(x[4 * u][0], x[4 * u][1], x[4 * u + 1][0], x[4 * u + 1][1]);
            a[u][1] = f8_quad(x[4 * u][2], x[4 * u][3], x[4 * u + 1][2], x[4 * u + 1][3]);
            a[u][2] = f8_quad(x[4 * u + 2][0], x[4 * u + 2][1], x[4 * u + 3][0], x[4 * u + 3][1]);
            a[u][3] = f8_quad(x[4 * u + 2][2], x[4 * u + 2][3], x[4 * u + 3][2], x[4 * u + 3][3]);
        }
    };
    if (cw == 1) turn_pass(1); /* consumer 0 issues first */
    /* one iteration; WITH_PV false for tile 0 only (prefill_ws.cu) */
    auto step = [&](int t, auto with_pv, auto masked) {
        constexpr bool WITH_PV = decltype(with_pv)::value;
        const int st = t % PA_STAGES;
        mbar_wait(&full_k[st], (u32)(t / PA_STAGES) & 1u);
        if constexpr (WITH_PV) mbar_wait(&full_v[(t - 1) % PA_STAGES], (u32)((t - 1) / PA_STAGES) & 1u);
        pa_fence_operands(s);
        pa_fence_operands(o);
        turn_wait(cw);
        pa_wgmma_fence();
        f8_qk(s, q0, q1, k_addr + st * TILE);
        pa_wgmma_commit();
        if constexpr (WITH_PV) {
            f8_pv(o, pa, v_addr + ((t - 1) % PA_STAGES) * TILE);
            pa_wgmma_commit();
        }
        turn_pass(cw);
        pa_wgmma_wait<WITH_PV ? 1 : 0>(); /* S(t) has completed; P V(t - 1) may still run */
        pa_fence_operands(s);
        release(&empty_k[st]);
        pa_wg_softmax_with<BN, 0, WITH_PV, decltype(masked)::value ? 1 : 0, D / 8, LIFT>(p, rs, s, o, pa,
                                                                                         kbase + t * BN, pack);
        if constexpr (WITH_PV) release(&empty_v[(t - 1) % PA_STAGES]); /* P V(t - 1) retired in the softmax */
    };
    constexpr pa_bool<false> F{};
    constexpr pa_bool<true> T{};
    if (nt > 0) {
        if (ti0 == 0 && ti1 > 0) step(0, F, F);
        else step(0, F, T);
    }
    for (int t = 1; t < nt; t++) {
        if (t >= ti0 && t < ti1) step(t, T, F);
        else step(t, T, T);
    }
    if (nt > 0) {
        mbar_wait(&full_v[(nt - 1) % PA_STAGES], (u32)((nt - 1) / PA_STAGES) & 1u);
        pa_fence_operands(o);
        pa_wgmma_fence();
        f8_pv(o, pa, v_addr + ((nt - 1) % PA_STAGES) * TILE);
        pa_wgmma_commit();
        pa_wgmma_wait<0>();
        pa_fence_operands(o);
        pa_fence_operands(pa);
    }

    /* the lift out of O and the row sums; v_scale into O */
    {
        const float vs = (p.v_scales ? ((const float *)p.v_scales)[hk] : p.v_scale) * (1.f / (1 << LIFT));
        rs.l0 *= 1.f / (1 << LIFT);
        rs.l1 *= 1.f / (1 << LIFT);
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) o[n][j] *= vs;
    }
    /* epilogue (prefill_ws.cu's, without TMA): rows of O into this
     * consumer's own rows of the Q tile (read into registers long ago) */
    if (p.out_f32) {
        pa_write_rows_f32<D, BM, GT>(p, w, hk, g0, rs, o, R0);
    } else {
        pa_stage_rows_swz<D, BM, GT>(p, w, hk, g0, rs, o, R0, smem);
        if (cw == 0) asm volatile("bar.sync 4, 128;\n" ::: "memory");
        else asm volatile("bar.sync 5, 128;\n" ::: "memory");
        pa_write_rows_swz<D, BM, GT, 64, 128>(p, w, hk, g0, smem, cw * 64, ctid & 127);
    }
    if (cw == 0) turn_wait(0); /* consumer 1's last pass */
#endif
}

#endif /* PA_EMBED_ONLY */
