/*
 * spec/planner_check.c -- the CUDA backend's work planner on the host
 * (spec/planner_spec.lua builds and runs it; CI has no GPU, and the planner
 * is host code). It includes src/cuda/cuda_attention.c, links with the
 * library's other objects, and plans random problems with plan_rule and
 * plan_items: random query tiles (empty ones too), key-stage sizes, page-id
 * caps, head tiles, capacities, split models, guided pieces, claims, forced
 * chunks and num_splits. For each it checks what the kernels rely on:
 *   - counting (no items) and writing give the same list, rows and counters;
 *   - each tile's items are consecutive, splits 0..n-1 of n, its sequence
 *     and query tile; an empty tile is one empty item at its start;
 *   - fixed pieces cover the tile's keys exactly, in order, none empty, none
 *     over the page-id cap, all but the last whole key stages;
 *   - claiming splits start their static stages claim_keys apart from the
 *     tile's start and end at its end, and the tile is long enough for them;
 *   - a split tile's counters follow the previous ones (twice as many with
 *     claims), and the total is the plan's;
 *   - a sequence with a split tile has partial rows for its widest split,
 *     placed after the previous such sequences; the total is the plan's;
 *   - write_part's list (claiming splits reordered split-major) holds the
 *     same items as plan_items', each once;
 *   - the warp-a-tile blocks run persistent on the shapes where that was
 *     measured faster, and only there (hw_persist_pays).
 * Usage: planner_check SEED PROBLEMS. Prints "N problems, M items: ok", or
 * the first violation (and exits 1).
 */
#include "../src/cuda/cuda_attention.c"

static uint64_t rs;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static int64_t ri(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

/* (an order of work items, to compare two lists as sets: memcmp, pa_work has no padding) */
_Static_assert(sizeof(pa_work) == 3 * 8 + 10 * 4, "pa_work: padding would make memcmp compare garbage");
static int by_item(const void *a, const void *b) { return memcmp(a, b, sizeof(pa_work)); }

static int problem;
#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            printf("problem %d: %s: ", problem, #cond);                      \
            printf(__VA_ARGS__);                                             \
            printf("\n");                                                    \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

int main(int argc, char **argv) {
    rs = argc > 1 ? strtoull(argv[1], NULL, 10) * 2654435761u + 88172645463325252ull : 88172645463325252ull;
    const int problems = argc > 2 ? atoi(argv[2]) : 2000;
    long long items_total = 0;
    for (problem = 0; problem < problems; problem++) {
        const int B = (int)ri(1, problem % 10 == 0 ? 2000 : 64);
        pa_attn_problem p;
        memset(&p, 0, sizeof p);
        p.batch = B;
        p.paged = rnd() & 1;
        p.page_size = 16;
        p.window_left = p.window_right = -1;
        p.num_splits = rnd() % 4 == 0 ? (int32_t)ri(1, 2000) : 0;
        int32_t *sq = malloc(4 * (size_t)B), *sk = malloc(4 * (size_t)B);
        int64_t *qs = malloc(8 * (size_t)B), *ls = malloc(8 * (size_t)B);
        tile_range *tiles = malloc(sizeof *tiles * 2 * (size_t)B);
        const int maxk = (int)(rnd() % 3 == 0 ? ri(1, 200) : rnd() % 2 ? ri(1, 5000) : ri(1, 300000));
        int64_t ntiles = 0;
        for (int b = 0; b < B; b++) {
            sq[b] = (int32_t)ri(1, 4);
            sk[b] = (int32_t)(rnd() % 2 ? maxk : ri(0, maxk));
            qs[b] = (int64_t)b * 4;
            ls[b] = (int64_t)b * 100;
            const int nt = (int)ri(1, 2);
            for (int i = 0; i < nt; i++) {
                const int32_t lo = rnd() % 5 == 0 ? 0 : (int32_t)ri(0, sk[b] / 2);
                tiles[ntiles++] = (tile_range){b, i, lo, rnd() % 9 == 0 ? lo : sk[b]};
            }
        }
        p.h_seqlen_q = sq;
        p.h_seqlen_k = sk;
        p.h_q_start = qs;
        p.h_lse_start = ls;
        kernel_plan kp;
        memset(&kp, 0, sizeof kp);
        static const int toks[] = {8, 16, 64, 128, 3};
        kp.tokens = toks[rnd() % 5];
        kp.max_chunk = rnd() % 3 == 0 ? 0 : (int)(ri(1, 1000) * kp.tokens);
        kp.head_tiles = (int)ri(1, 16);
        kp.capacity = (int)ri(1, 600);
        kp.tail_splits = rnd() & 1;
        kp.guided = rnd() % 5 == 0;
        kp.claim = rnd() & 1;
        kp.claim_stages = (int)ri(4, 10);
        kp.no_split = rnd() % 6 == 0;
        kp.persistent = rnd() & 1;
        char v[32];
        snprintf(v, sizeof v, "%d", (int)ri(1, 5000));
        if (rnd() % 8 == 0) setenv("PAGEDATTN_SPLIT_CHUNK", v, 1); else unsetenv("PAGEDATTN_SPLIT_CHUNK");
        if (rnd() % 8 == 0) setenv("PAGEDATTN_DECODE_CLAIM_MIN", "100", 1); else unsetenv("PAGEDATTN_DECODE_CLAIM_MIN");
        const int64_t claim_min = env_int("PAGEDATTN_DECODE_CLAIM_MIN", 4096, 0, INT32_MAX);

        work_rule r;
        plan_rule(&p, &kp, tiles, ntiles, &r);
        int64_t rows0, counters0, rows, counters;
        const int64_t n = plan_items(&p, &kp, &r, tiles, ntiles, NULL, &rows0, &counters0);
        pa_work *items = calloc((size_t)n + 1, sizeof *items);
        CHECK(plan_items(&p, &kp, &r, tiles, ntiles, items, &rows, &counters) == n, "items counted and written differ");
        CHECK(rows == rows0 && counters == counters0, "rows %lld / %lld, counters %lld / %lld", (long long)rows,
              (long long)rows0, (long long)counters, (long long)counters0);

        int64_t i = 0, next_counter = 0, next_row = 0;
        int32_t seq = -1, seq_ns = 1;
        int64_t seq_first = 0;
        for (int64_t t = 0; t <= ntiles; t++) {
            if (t == ntiles || tiles[t].b != seq) { /* the previous sequence's partial rows */
                for (int64_t j = seq_first; j < i; j++)
                    CHECK(items[j].part_row == (seq_ns > 1 ? next_row : 0), "sequence %d: part_row %lld, want %lld",
                          seq, (long long)items[j].part_row, (long long)(seq_ns > 1 ? next_row : 0));
                if (seq >= 0 && seq_ns > 1) next_row += (int64_t)seq_ns * sq[seq];
                if (t == ntiles) break;
                seq = tiles[t].b;
                seq_ns = 1;
                seq_first = i;
            }
            const tile_range tr = tiles[t];
            const int64_t len = tr.hi - tr.lo;
            CHECK(i < n, "tile %lld has no items", (long long)t);
            const int32_t ns = items[i].nsplit;
            CHECK(ns >= 1 && i + ns <= n, "tile %lld: %d splits", (long long)t, ns);
            if (ns > seq_ns) seq_ns = ns;
            const bool claimed = r.claims && ns > 1;
            if (ns > 1) {
                CHECK(items[i].counter == next_counter, "tile %lld: counter %d, want %lld", (long long)t,
                      items[i].counter, (long long)next_counter);
                next_counter += (r.claims ? 2 : 1) * kp.head_tiles;
            }
            if (claimed)
                CHECK(len >= ns * r.claim_keys && len >= ns * claim_min, "tile %lld: %lld keys for %d claiming splits",
                      (long long)t, (long long)len, ns);
            int64_t pos = tr.lo;
            for (int32_t s = 0; s < ns; s++, i++) {
                const pa_work *w = &items[i];
                CHECK(w->split == s && w->nsplit == ns && w->b == tr.b && w->i0 == tr.i0, "tile %lld: item %d of %d",
                      (long long)t, s, ns);
                CHECK(w->seqlen_q == sq[tr.b] && w->seqlen_k == sk[tr.b] && w->q_start == qs[tr.b] &&
                          w->lse_start == ls[tr.b], "tile %lld: the sequence's facts", (long long)t);
                if (len == 0) {
                    CHECK(ns == 1 && w->k0 == tr.lo && w->k1 == tr.lo, "empty tile %lld: [%d, %d)", (long long)t,
                          w->k0, w->k1);
                } else if (claimed) {
                    CHECK(w->k0 == tr.lo + s * r.claim_keys && w->k1 == tr.hi, "tile %lld split %d: [%d, %d)",
                          (long long)t, s, w->k0, w->k1);
                } else {
                    const int64_t piece = w->k1 - w->k0;
                    CHECK(w->k0 == pos && piece > 0, "tile %lld split %d: [%d, %d) after %lld", (long long)t, s, w->k0,
                          w->k1, (long long)pos);
                    CHECK(kp.max_chunk == 0 || piece <= kp.max_chunk, "tile %lld split %d: %lld keys over the cap %d",
                          (long long)t, s, (long long)piece, kp.max_chunk);
                    CHECK(s == ns - 1 || piece % kp.tokens == 0, "tile %lld split %d: %lld keys, stages of %d",
                          (long long)t, s, (long long)piece, kp.tokens);
                    pos = w->k1;
                }
            }
            if (len > 0 && !claimed) CHECK(pos == tr.hi, "tile %lld: covered to %lld of %d", (long long)t, (long long)pos,
                                           tr.hi);
        }
        CHECK(i == n, "%lld items past the last tile", (long long)(n - i));
        CHECK(next_counter == counters, "counters %lld, want %lld", (long long)counters, (long long)next_counter);
        CHECK(next_row == rows, "partial rows %lld, want %lld", (long long)rows, (long long)next_row);
        /* write_part: the same items (a permutation) */
        attn_part pt;
        memset(&pt, 0, sizeof pt);
        pt.kp = kp;
        pt.rule = r;
        pt.tiles = tiles;
        pt.ntiles = ntiles;
        pt.nwork = n;
        pa_work *order = calloc((size_t)n + 1, sizeof *order), *sorted = calloc((size_t)n + 1, sizeof *sorted);
        write_part(&p, &pt, order);
        memcpy(sorted, items, sizeof *items * (size_t)n);
        qsort(sorted, (size_t)n, sizeof *sorted, by_item);
        qsort(order, (size_t)n, sizeof *order, by_item);
        CHECK(memcmp(sorted, order, sizeof *order * (size_t)n) == 0, "write_part's items are not the plan's");
        free(sorted);
        free(order);
        items_total += n;
        free(items);
        free(sq);
        free(sk);
        free(qs);
        free(ls);
        free(tiles);
    }
    /* The warp-a-tile blocks' persistence (hw_persist_pays) on the shapes
     * measured for it (docs/planner.md): B x L at 32 query
     * heads over 8 kv heads (eight head tiles a sequence, four a block),
     * 132 SMs, 3 stages, 16 keys a warp at two blocks a SM, 8 at three */
    problem = -1;
    static const struct { int kpw, split, seqs, keys; bool pays; } hwp[] = {
        {16, 0, 512, 128, true},  {16, 0, 2048, 128, true}, {16, 0, 384, 128, true}, {16, 0, 1024, 256, true},
        {16, 0, 512, 96, false},  {16, 0, 512, 112, false}, {16, 0, 128, 128, false}, {16, 0, 200, 128, false},
        {16, 0, 256, 256, false}, {16, 2, 1024, 128, false}, {16, 1, 1024, 128, true}, {8, 0, 2048, 64, false},
    };
    for (size_t i = 0; i < sizeof hwp / sizeof hwp[0]; i++) {
        const bool pays = hw_persist_pays(hwp[i].kpw, 3, hwp[i].kpw == 16 ? 2 : 3, hwp[i].split, hwp[i].keys,
                                          (int64_t)hwp[i].seqs * 8 / 4, 132);
        CHECK(pays == hwp[i].pays, "hw_persist_pays at %d keys a warp, split %d, %d x %d: %d, measured %d",
              hwp[i].kpw, hwp[i].split, hwp[i].seqs, hwp[i].keys, pays, hwp[i].pays);
    }
    printf("%d problems, %lld items: ok\n", problems, items_total);
    return 0;
}
