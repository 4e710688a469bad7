/*
 * decode.cu -- paged decode attention (1 to 8 queries per sequence), split-KV.
 *
 * One thread block = one work item (sequence b, key range [k0, k1)) x one head
 * tile: a kv head hk and GT query heads of its GQA group, for NQ queries, so
 * ROWS = NQ * GT rows share every K/V row the block reads (each page is read
 * once per group). Memory-bound: the design goal is bytes in flight.
 *
 *  - Page ids of the block's range are loaded to shared memory first; every
 *    K/V row address is then an absolute 64-bit offset from the cache base
 *    (page * page_stride + slot * row_stride), resolved per row; the block
 *    table is read only for pages that hold keys < k1 <= seqlen_k.
 *  - K and V rows stream through a STAGES-deep cp.async pipeline of T tokens
 *    per stage (16-byte copies, about 16 KB per stage).
 *  - Threads form BDY groups of BDX lanes; a lane holds 8 elements of each
 *    row (q and the output accumulator in registers). A group takes TPG
 *    tokens of every stage: dot products reduced across its lanes with
 *    shuffles, an online softmax in base 2, then P.V. The groups' states are
 *    merged through shared memory at the end, and pa_write_rows writes the
 *    output or the split's partial (and combines the splits, fused).
 *
 * Defines: PA_DTYPE, PA_D (head dim, a multiple of 8, <= 256), PA_NQ, PA_GT,
 * PA_PAGE (-1: contiguous cache; 0: page size at run time; else the page
 * size, a power of two), PA_STAGES, PA_MAXP (page ids per block); PA_KV
 * (optional): the caches' dtype, an fp8 one (head dim a multiple of 16;
 * keys k_cache x k_scale, values v_cache x v_scale), else PA_DTYPE.
 */
#ifndef PA_EMBED_ONLY
#include "attn_common.cuh"

#if !defined(PA_DTYPE) || !defined(PA_D) || !defined(PA_NQ) || !defined(PA_GT) || \
    !defined(PA_PAGE) || !defined(PA_STAGES) || !defined(PA_MAXP)
#error "decode.cu needs PA_DTYPE, PA_D, PA_NQ, PA_GT, PA_PAGE, PA_STAGES, PA_MAXP"
#endif

#define NTHREADS 128
#ifndef PA_KV
#define PA_KV PA_DTYPE
#endif

namespace {
__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int pow2ceil(int x) { return x <= 1 ? 1 : 2 * pow2ceil((x + 1) / 2); }

constexpr int D = PA_D;
constexpr int NQ = PA_NQ, GT = PA_GT, ROWS = NQ * GT;
constexpr int ESZ = PA_DTYPE == PA_DT_F32 ? 4 : 2; /* q */
constexpr int KSZ = PA_KV == PA_DT_F32 ? 4 : PA_DT_IS_FP8(PA_KV) ? 1 : 2; /* the caches */
constexpr int NCH = D / 8;              /* lanes that hold 8 elements of a row */
constexpr int BDX = pow2ceil(NCH);      /* lanes per token group (shuffle width) */
constexpr int BDY = NTHREADS / BDX;     /* token groups */
constexpr int ROWB = D * KSZ;           /* bytes of one K (or V) row */
constexpr int CPR = ROWB / 16;          /* 16-byte chunks per row */
constexpr int TPG_BYTES = cmin(8, pa_cmax(1, 16384 / (2 * ROWB * BDY)));
constexpr int TPG = TPG_BYTES * ROWS > 32 ? pa_cmax(1, 32 / ROWS) : TPG_BYTES; /* tokens per group per stage */
constexpr int T = BDY * TPG;            /* tokens per stage */
constexpr int STAGE_BYTES = 2 * T * ROWB;
constexpr int PAGES_BYTES = PA_PAGE == -1 ? 0 : PA_MAXP * 4;
constexpr int MERGE_BYTES = ROWS * BDY * (D + 2) * 4;
constexpr int SMEM = PAGES_BYTES + pa_cmax(PA_STAGES * STAGE_BYTES, MERGE_BYTES);
constexpr int CHUNKS = T * CPR;         /* 16-byte copies per stage, per K and per V */
/* q and the accumulators take 16 registers per row: 4 blocks of 128 threads
 * per SM fit up to 4 rows; 8 rows get 2 blocks and twice the registers. */
constexpr int MIN_BLOCKS = ROWS <= 4 ? 4 : 2;

static_assert(D % 8 == 0 && D >= 8 && D <= 256, "head dim");
static_assert(PA_KV == PA_DTYPE || (PA_DT_IS_FP8(PA_KV) && D % 16 == 0), "caches: q's dtype, or fp8 rows of 16-byte chunks");
static_assert(ROWS >= 1 && ROWS <= 8, "rows per block");
static_assert(BDX <= 32 && NTHREADS % BDX == 0, "lanes per token");
static_assert(PA_STAGES >= 2, "pipeline depth");
static_assert(PA_PAGE <= 0 || (PA_PAGE & (PA_PAGE - 1)) == 0, "page size: a power of two");
static_assert(PAGES_BYTES % 128 == 0, "stage alignment");
} // namespace

/* The TPG x ROWS scores of a token group summed over its BDX lanes (each
 * lane holds a partial dot product over its 8 elements), every lane getting
 * every sum. With V = TPG x ROWS a power of two up to BDX: halving rounds (a
 * lane keeps half of its values and adds its partner's half of them), a
 * butterfly over the lanes left, then each sum broadcast from a lane that
 * holds it: 2V - 1 + log2(BDX / V) shuffles where the plain butterfly takes
 * V log2(BDX) (head dim 256, 4 rows: 32 against 80). */
PA_DEV void group_sums(float (&s)[TPG][ROWS], int tx) {
    constexpr int V = TPG * ROWS;
    if constexpr ((V & (V - 1)) != 0 || V > BDX || V < 2) {
#pragma unroll
        for (int off = BDX / 2; off >= 1; off >>= 1) {
#pragma unroll
            for (int u = 0; u < TPG; u++)
#pragma unroll
                for (int r = 0; r < ROWS; r++) s[u][r] += __shfl_xor_sync(0xffffffffu, s[u][r], off);
        }
    } else {
        float v[V];
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = s[i / ROWS][i % ROWS];
        /* round k (offset BDX >> k): values [0, n) -> [0, n / 2); the lane
         * whose offset bit is set keeps the upper half. Then lane tx holds
         * the sum of value tx / (BDX / V) over the lanes of its round bits. */
        constexpr int R = V >= 32 ? 5 : V >= 16 ? 4 : V >= 8 ? 3 : V >= 4 ? 2 : 1; /* log2 V */
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int n = V >> k, off = (BDX / 2) >> k;
            const bool upper = (tx & off) != 0;
#pragma unroll
            for (int i = 0; i < V / 2; i++) {
                if (i >= n / 2) break; /* (a constant bound: the loop unrolls before n is known) */
                /* (selp: a ?: of two elements would index v at run time, in local memory) */
                float keep, give;
                asm("{ .reg .pred u; setp.ne.u32 u, %4, 0; selp.f32 %0, %2, %3, u; selp.f32 %1, %3, %2, u; }"
                    : "=f"(keep), "=f"(give)
                    : "f"(v[n / 2 + i]), "f"(v[i]), "r"((unsigned)upper));
                v[i] = keep + __shfl_xor_sync(0xffffffffu, give, off);
            }
        }
#pragma unroll
        for (int off = BDX / V / 2; off >= 1; off >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
#pragma unroll
        for (int i = 0; i < V; i++) s[i / ROWS][i % ROWS] = __shfl_sync(0xffffffffu, v[0], i * (BDX / V), BDX);
    }
}

/* What the host needs to launch a variant: threads, dynamic shared bytes,
 * tokens per stage, page ids per block (read with cuModuleGetGlobal). */
extern "C" __constant__ int pa_decode_info[4] = {NTHREADS, SMEM, T, PA_MAXP};

extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS) pa_decode(const pa_attn_params p) {
    extern __shared__ __align__(128) u8 smem[];
    __shared__ int s_flag;
    __shared__ pa_work s_w; /* in shared memory rather than registers: few fields are hot */
    __shared__ float s_slope[ROWS];
    int *s_pages = (int *)smem;
    u8 *s_kv = smem + PAGES_BYTES;

    const int tid = threadIdx.x, tx = tid % BDX, ty = tid / BDX;
    const int head_tile = blockIdx.x % p.head_tiles;
    if (tid == 0) s_w = ((const pa_work *)p.work)[blockIdx.x / p.head_tiles];
    __syncthreads();
    const pa_work &w = s_w;
    constexpr float hr = pa_headroom<PA_DTYPE>();
    const int tiles_per_group = p.group / GT;
    const int hk = head_tile / tiles_per_group;
    const int g0 = (head_tile - hk * tiles_per_group) * GT;
    const int ps = PA_PAGE > 0 ? PA_PAGE : p.page_size;

    /* 1. page ids of keys [k0, k1), never past the last page holding a key */
    const int first_page = pa_load_page_ids<PA_PAGE, NTHREADS>(p, w.b, w.k0, w.k1, ps, s_pages);

    /* 2. q rows (scaled; base-2 scores unless softcap/ALiBi need natural units) */
    const bool natural = p.softcap > 0.f || p.alibi != 0;
    /* (an fp8 cache's key scale goes into q, its value scale into the output) */
    constexpr bool FP8 = PA_DT_IS_FP8(PA_KV);
    const float qscale = (natural ? p.scale : p.scale * PA_LOG2E) * (FP8 ? pa_k_scale(p, hk) : 1.f);
    const float vscale = FP8 ? pa_v_scale(p, hk) : 1.f;
    float q[ROWS][8], o[ROWS][8], mrow[ROWS], lrow[ROWS];
    int lo[NQ], hi[NQ];
#pragma unroll
    for (int qi = 0; qi < NQ; qi++) {
        int l = 0, h = 0;
        if (qi < w.seqlen_q) {
            pa_mask_range(p.window_left, p.window_right, w.seqlen_q, w.seqlen_k, qi, &l, &h);
            l = max(l, w.k0);
            h = min(h, w.k1);
        }
        lo[qi] = l;
        hi[qi] = h;
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int qi = r / GT, h = hk * p.group + g0 + r % GT;
        mrow[r] = -PA_INF;
        lrow[r] = 0.f;
        if (tid == 0)
            s_slope[r] = p.alibi && qi < w.seqlen_q
                             ? ((const float *)p.alibi)[(i64)w.b * p.alibi_batch_stride + h] * PA_LOG2E
                             : 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) q[r][e] = o[r][e] = 0.f;
        if (qi < w.seqlen_q && tx < NCH) {
            const i64 off = ((w.q_start + qi) * p.heads + h) * (i64)D + tx * 8;
            if (p.q_f32) pa_load8<PA_DT_F32>((const float *)p.q + off, q[r]);
            else pa_load8<PA_DTYPE>((const char *)p.q + off * ESZ, q[r]);
#pragma unroll
            for (int e = 0; e < 8; e++) q[r][e] *= qscale;
        }
    }
    __syncthreads();

    /* 3. the pipeline: stage st holds keys k0 + st*T ... in buffer st % STAGES */
    const int nst = (w.k1 - w.k0 + T - 1) / T;
    const i64 head_off = (i64)hk * D;
    auto issue = [&](int st) {
        const int kb = w.k0 + st * T;
        u8 *sk = s_kv + (st % PA_STAGES) * STAGE_BYTES, *sv = sk + T * ROWB;
#pragma unroll
        for (int it = 0; it < (CHUNKS + NTHREADS - 1) / NTHREADS; it++) {
            const int c = tid + it * NTHREADS;
            if (CHUNKS % NTHREADS != 0 && c >= CHUNKS) break;
            const int t = c / CPR, ch = c - t * CPR;
            const int tok = kb + t;
            const bool ok = tok < w.k1;
            const int tc = ok ? tok : w.k0; /* a valid address even when nothing is read */
            i64 off;
            if (PA_PAGE == -1) {
                off = (i64)w.cache_row * p.page_stride + (i64)tc * p.row_stride;
            } else {
                const int pg = tc / ps;
                off = (i64)s_pages[pg - first_page] * p.page_stride + (i64)(tc - pg * ps) * p.row_stride;
            }
            const i64 byte = (off + head_off) * KSZ + ch * 16;
            pa_cp_async16(sk + c * 16, (const u8 *)p.k_cache + byte, ok);
            pa_cp_async16(sv + c * 16, (const u8 *)p.v_cache + byte, ok);
        }
    };
#pragma unroll
    for (int st = 0; st < PA_STAGES - 1; st++) {
        if (st < nst) issue(st);
        pa_cp_async_commit();
    }

    for (int st = 0; st < nst; st++) {
        pa_cp_async_wait<PA_STAGES - 2>();
        __syncthreads(); /* stage st landed for all; buffer (st - 1) % STAGES is free */
        if (st + PA_STAGES - 1 < nst) issue(st + PA_STAGES - 1);
        pa_cp_async_commit();

        const u8 *sk = s_kv + (st % PA_STAGES) * STAGE_BYTES, *sv = sk + T * ROWB;
        const int kb = w.k0 + st * T;
        float s[TPG][ROWS];
#pragma unroll
        for (int u = 0; u < TPG; u++) {
            const int j = ty + BDY * u;
            float kf[8];
            pa_load8_or_zero<PA_KV>(tx < NCH, sk + j * ROWB + tx * 8 * KSZ, kf);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                float a = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) a = fmaf(q[r][e], kf[e], a);
                s[u][r] = a;
            }
        }
        group_sums(s, tx);
        /* masks, softcap, ALiBi; then the online softmax in base 2 */
#pragma unroll
        for (int u = 0; u < TPG; u++) {
            const int tok = kb + ty + BDY * u;
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const int qi = r / GT;
                float x = s[u][r];
                if (natural) {
                    if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
                    x *= PA_LOG2E;
                    if (p.alibi) {
                        const int diag = qi + w.seqlen_k - w.seqlen_q;
                        x -= s_slope[r] * fabsf((float)(diag - tok));
                    }
                }
                s[u][r] = (tok >= lo[qi] && tok < hi[qi]) ? x : -PA_INF;
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float bx = -PA_INF;
#pragma unroll
            for (int u = 0; u < TPG; u++) bx = fmaxf(bx, s[u][r]);
            const float mx = fmaxf(mrow[r], bx + hr);
            if (mx == -PA_INF) { /* nothing valid yet: keep the empty state */
#pragma unroll
                for (int u = 0; u < TPG; u++) s[u][r] = 0.f;
                continue;
            }
            const float alpha = pa_exp2(mrow[r] - mx); /* mrow = -inf -> 0 */
            mrow[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int u = 0; u < TPG; u++) {
                s[u][r] = pa_exp2(s[u][r] - mx);
                sum += s[u][r];
            }
            lrow[r] = lrow[r] * alpha + sum;
#pragma unroll
            for (int e = 0; e < 8; e++) o[r][e] *= alpha;
        }
#pragma unroll
        for (int u = 0; u < TPG; u++) {
            const int j = ty + BDY * u;
            float vf[8];
            pa_load8_or_zero<PA_KV>(tx < NCH, sv + j * ROWB + tx * 8 * KSZ, vf);
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int e = 0; e < 8; e++) o[r][e] = fmaf(s[u][r], vf[e], o[r][e]);
        }
    }
    pa_cp_async_wait<0>();
    __syncthreads(); /* the stage buffers become the merge area */

    /* 4. merge the BDY groups: o[ROWS][BDY][D], then (m, l)[ROWS][BDY] */
    float *sm_o = (float *)s_kv;
    float *sm_ml = sm_o + ROWS * BDY * D;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (tx < NCH) {
            float4 *dst = (float4 *)(sm_o + (r * BDY + ty) * D + tx * 8);
            dst[0] = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
            dst[1] = make_float4(o[r][4], o[r][5], o[r][6], o[r][7]);
        }
        if (tx == 0) {
            sm_ml[(r * BDY + ty) * 2] = mrow[r];
            sm_ml[(r * BDY + ty) * 2 + 1] = lrow[r];
        }
    }
    __syncthreads();
    auto lse2_of = [&](int r) { return pa_merged_lse2(sm_ml, BDY, r); };
    auto o_of = [&](int r, int d) {
        const float o = pa_merged_o(sm_ml, BDY, r, [&](int y) { return sm_o[(r * BDY + y) * D + d]; });
        return FP8 ? o * vscale : o;
    };
    pa_write_rows<PA_DTYPE>(p, w, ROWS, GT, hk, g0, head_tile, o_of, lse2_of, &s_flag);
}

#endif /* PA_EMBED_ONLY */
