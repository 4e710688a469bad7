// scripts/lab/decode_burst.cu -- a decode design of warps that each stream
// their own head tile, standalone; measured on the H200 (docs/decode.md): correct
// (max |d| 3e-5 to 2.5e-4), 245-251 us kernel alone at the bench's shapes, 1-3
// us slower than the library's whole call before its own combine (8-29 us);
// its copies alone (mode 4) read 0.963-0.972 of the ceiling at 8 warps a SM;
// a producer and a consumer warp a block (modes 5-7) 0.918-0.933, slower.
// read_size.cu found cp.async copies issued in bursts that each wait for all
// of themselves (stealcp: 16 KB a block, 4-8 blocks a SM) reading at 0.99-1.00
// of the read ceiling on every board, where rings shaped like the decode
// kernel's read 0.88-0.98. Here each warp is a stream of its own: a block is
// one warp, a piece is (sequence, kv head, CHUNK pages) and its warp owns the
// 4 query heads of that kv head for the whole piece (no merge with another
// warp, no block barrier). A burst is one page's 16 rows of the head in K
// and V (8 KB: 16 cp.async a lane, one group); the warp waits for all of it,
// takes its K and V fragments into registers, sends the next burst (the
// piece's next page, or the next piece's first with its q) into the same
// buffer, then does the burst's arithmetic while that one flies. Pieces come
// from a counter, the next one claimed under the current one; their partial
// rows are merged by decode_micro.cuh's combine kernel (a second launch, timed
// apart). The bench's shapes, timed as the library times a call, checked
// against float64 on the host.
//   nvcc -O3 -arch=sm_90a -o /tmp/burst scripts/lab/decode_burst.cu && /tmp/burst B L CHUNK [MODE]
//   (CHUNK pages a piece, 1-32; MODE 0 full, 1 no MMAs: the fragments' loads kept;
//   2 / 3 the same with two bursts in flight a warp, burst2; 4 burst's copies alone, no shared
//   memory read; 5 / 6 a producer and a consumer warp a block, full / no MMAs (burst_pc, 6
//   blocks a SM); 7 mode 5 at 8 blocks a SM (128 registers, 104 bytes spilled);
//   WARPS=N: N blocks a SM at most)
// What to compare: main by `scripts/lab/decode_ab.lua "-" 64x4096,256x1024,8x32768 2` in the
// same visit, and decode_pagebox.cu (250-251 us kernel alone where the library took 248-250).
#include "decode_micro.cuh"

constexpr int ROWB = D * 2;            // a key's row of one head: 256 bytes
constexpr int BURST = 2 * PS * ROWB;   // K and V rows of one page and head: 8 KB
constexpr int QB = GT * ROWB;          // a piece's q rows (4 query heads): 1 KB

struct bpiece { int b, hk, p0, np, part; }; // sequence, kv head, first page index, pages, partial row index

__device__ __forceinline__ void cp16(u32 dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
// a row's 16-byte chunk c at the swizzled place: chunk c ^ (row & 7), so that the 8 rows an
// ldmatrix reads at one column fall in different banks
__device__ __forceinline__ u32 row_off(int row, int c) { return row * ROWB + ((c ^ (row & 7)) << 4); }

// The burst of page `page` (pool index), kv head hk into K rows at kb and V rows PS rows on:
// rows r = 2 i + lane / 16, chunk lane % 16, one 16-byte cp.async each
__device__ __forceinline__ void issue_burst(u32 kb, const __nv_bfloat16 *kc, const __nv_bfloat16 *vc, int page, int hk, int lane) {
  const u32 vb = kb + PS * ROWB;
#pragma unroll
  for (int i = 0; i < PS / 2; i++) {
    const int r = 2 * i + (lane >> 4), c = lane & 15;
    const long long off = (((long long)page * PS + r) * HK + hk) * D + c * 8; // elements
    cp16(kb + row_off(r, c), kc + off);
    cp16(vb + row_off(r, c), vc + off);
  }
}
// a piece's q rows (its 4 query heads, 1 KB: 2 chunks a lane) into qb
__device__ __forceinline__ void issue_qrows(u32 qb, const __nv_bfloat16 *q, int b, int hk, int lane) {
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int e = lane + 32 * i, r = e >> 4, c = e & 15;
    cp16(qb + row_off(r, c), q + ((long long)b * H + hk * GT + r) * D + c * 8);
  }
}
// Q fragments from qb, rows g < GT (the rest zero)
__device__ __forceinline__ void load_qa(u32 (&qa)[D / 16][4], u32 qb, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++) {
    u32 a0 = 0, a2 = 0;
    if (g < GT) {
      asm volatile("ld.shared.b32 %0, [%1];" : "=r"(a0) : "r"(qb + row_off(g, 2 * ks) + 4 * t4));
      asm volatile("ld.shared.b32 %0, [%1];" : "=r"(a2) : "r"(qb + row_off(g, 2 * ks + 1) + 4 * t4));
    }
    qa[ks][0] = a0; qa[ks][1] = 0; qa[ks][2] = a2; qa[ks][3] = 0;
  }
}
// K fragments (x4: keys 0-7 / 8-15 x columns 16 ks + 0 / 8) and V's (transposed)
__device__ __forceinline__ void load_kf(u32 (&kf)[D / 16][4], u32 kb, int lane) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++) {
    const int key = (lane & 7) + 8 * (lane >> 4), c = 2 * ks + ((lane >> 3) & 1);
    ldsm4(kf[ks], kb + row_off(key, c));
  }
}
__device__ __forceinline__ void load_vf(u32 (&vf)[D / 16][4], u32 vb, int lane) {
#pragma unroll
  for (int np = 0; np < D / 16; np++) {
    const int key = (lane & 7) + 8 * ((lane >> 3) & 1), c = 2 * np + (lane >> 4);
    ldsm4t(vf[np], vb + row_off(key, c));
  }
}

// The piece counter: a warp's claim (lane 0's atomic, shared by a shuffle), and lane i's
// page id of piece pc (page i of its range; 0 past its end)
__device__ __forceinline__ u32 claim(u32 *counter, int lane) {
  return __shfl_sync(~0u, lane == 0 ? atomicAdd(counter, 1u) : 0u, 0);
}
__device__ __forceinline__ int piece_ids(const bpiece &pc, const int *pages, int pps, int lane) {
  return lane < pc.np ? pages[(long long)pc.b * pps + pc.p0 + lane] : 0;
}
// The next piece, claimed under the current one (burst, burst2): its atomic at the piece's
// start (start), its item and page ids at a later page (fetch), so no round trip waits
struct next_piece {
  u32 raw, nx;
  bpiece pn;
  int nids;
  __device__ __forceinline__ void start(u32 *counter, int npieces, int lane) {
    raw = lane == 0 ? atomicAdd(counter, 1u) : 0u;
    nx = (u32)npieces; pn = bpiece{0, 0, 0, 0, 0}; nids = 0;
  }
  __device__ __forceinline__ void fetch(const bpiece *pieces, int npieces, const int *pages, int pps, int lane) {
    nx = __shfl_sync(~0u, raw, 0);
    if (nx < (u32)npieces) pn = pieces[nx];
    nids = nx < (u32)npieces ? piece_ids(pn, pages, pps, lane) : 0;
  }
  __device__ __forceinline__ bool some(int npieces) const { return nx < (u32)npieces; }
};

template <int MODE>
__global__ void __launch_bounds__(32, 8) burst(const __nv_bfloat16 *kc, const __nv_bfloat16 *vc, const bpiece *pieces,
                                            int npieces, const int *pages, int pps, const __nv_bfloat16 *q,
                                            float scale_log2, float *part_o, float *part_lse, u32 *counter) {
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 kb = saddr(smem), vb = kb + PS * ROWB, qb = kb + BURST;
  const int lane = threadIdx.x;
  const u32 cur = claim(counter, lane);
  if (cur >= (u32)npieces) return;
  bpiece pc = pieces[cur];
  int ids = piece_ids(pc, pages, pps, lane);
  issue_burst(kb, kc, vc, __shfl_sync(~0u, ids, 0), pc.hk, lane);
  issue_qrows(qb, q, pc.b, pc.hk, lane);
  asm volatile("cp.async.commit_group;" ::: "memory");
  u32 qa[D / 16][4];
  head_tile t;
  for (;;) {
    // the next piece: its claim's atomic now, its item and page ids two pages on (or at the last)
    next_piece n;
    n.start(counter, npieces, lane);
    t.reset();
    const int at = min(2, pc.np - 1);
    for (int i = 0; i < pc.np; i++) {
      if (i == at) n.fetch(pieces, npieces, pages, pps, lane);
      asm volatile("cp.async.wait_group 0;" ::: "memory");
      __syncwarp();
      // the next burst into the same buffer: this piece's next page, or the next piece's first
      auto issue_next = [&] {
        if (i + 1 < pc.np) issue_burst(kb, kc, vc, __shfl_sync(~0u, ids, i + 1), pc.hk, lane);
        else if (n.some(npieces)) { issue_burst(kb, kc, vc, __shfl_sync(~0u, n.nids, 0), n.pn.hk, lane); issue_qrows(qb, q, n.pn.b, n.pn.hk, lane); }
        asm volatile("cp.async.commit_group;" ::: "memory");
      };
      if (MODE == 2) { issue_next(); continue; } // copies alone: nothing read
      if (i == 0) load_qa(qa, qb, lane);
      u32 kf[D / 16][4], vf[D / 16][4];
      load_kf(kf, kb, lane);
      load_vf(vf, vb, lane);
      __syncwarp();
      issue_next();
      float sa[2][4];
      u32 pa[4];
      t.qk<MODE == 0>(sa, qa, kf);
      t.softmax(sa, scale_log2, pa);
      t.pv<MODE == 0>(pa, vf);
    }
    if (MODE < 2) t.write(part_o, part_lse, (long long)pc.part * H + pc.hk * GT, lane); // the piece's partial rows
    if (!n.some(npieces)) break;
    pc = n.pn; ids = n.nids;
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// Two bursts in flight a warp (NB2): the burst of page i + 2 goes out into page i's buffer once
// page i's arithmetic has read it, so a warp waits (wait_group 1) only for the older of two;
// the fragments are taken from shared memory as the MMAs need them (fewer registers, so
// 12 warps a SM: 192 KB in flight a SM against NB1's 64 KB). Pieces of 2 pages or more.
template <int MODE>
__global__ void __launch_bounds__(32, 12) burst2(const __nv_bfloat16 *kc, const __nv_bfloat16 *vc, const bpiece *pieces,
                                             int npieces, const int *pages, int pps, const __nv_bfloat16 *q,
                                             float scale_log2, float *part_o, float *part_lse, u32 *counter) {
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 b0 = saddr(smem), qb = b0 + 2 * BURST;
  const int lane = threadIdx.x;
  const u32 cur = claim(counter, lane);
  if (cur >= (u32)npieces) return;
  bpiece pc = pieces[cur];
  int ids = piece_ids(pc, pages, pps, lane);
  issue_burst(b0, kc, vc, __shfl_sync(~0u, ids, 0), pc.hk, lane);
  issue_qrows(qb, q, pc.b, pc.hk, lane);
  asm volatile("cp.async.commit_group;" ::: "memory");
  issue_burst(b0 + BURST, kc, vc, __shfl_sync(~0u, ids, 1), pc.hk, lane);
  asm volatile("cp.async.commit_group;" ::: "memory");
  u32 qa[D / 16][4];
  head_tile t;
  int buf = 0; // the buffer of this piece's page i (bursts alternate over the whole stream)
  for (;;) {
    next_piece n;
    n.start(counter, npieces, lane);
    t.reset();
    const int at = min(1, pc.np - 2);
    for (int i = 0; i < pc.np; i++) {
      if (i == at) n.fetch(pieces, npieces, pages, pps, lane);
      asm volatile("cp.async.wait_group 1;" ::: "memory");
      __syncwarp();
      const u32 kb = b0 + buf * BURST, vb = kb + PS * ROWB;
      if (i == 0) load_qa(qa, qb, lane);
      u32 kf[D / 16][4], vf[D / 16][4];
      load_kf(kf, kb, lane);
      float sa[2][4];
      u32 pa[4];
      t.qk<MODE == 0>(sa, qa, kf);
      load_vf(vf, vb, lane);
      t.softmax(sa, scale_log2, pa);
      t.pv<MODE == 0>(pa, vf);
      __syncwarp();
      // the burst two on from this one, into this one's buffer
      if (i + 2 < pc.np) issue_burst(kb, kc, vc, __shfl_sync(~0u, ids, i + 2), pc.hk, lane);
      else if (n.some(npieces)) {
        issue_burst(kb, kc, vc, __shfl_sync(~0u, n.nids, i + 2 - pc.np), n.pn.hk, lane);
        if (i + 2 == pc.np) issue_qrows(qb, q, n.pn.b, n.pn.hk, lane);
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
      buf ^= 1;
    }
    t.write(part_o, part_lse, (long long)pc.part * H + pc.hk * GT, lane);
    if (!n.some(npieces)) break;
    pc = n.pn; ids = n.nids;
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// A producer warp and a consumer warp a block (PC, mode 5): the producer streams
// the bursts (copies alone as in mode 4, but two in flight, wait_group 1) into a ring of NB
// buffers and hands each over by a named barrier (FULL + buffer) with a header (first / last
// page of its piece, the piece's partial row and kv head, q's buffer); the consumer takes
// them (Q K^T, softmax, P V as burst2) and hands the buffer back (EMPTY + buffer). No
// arithmetic on the copies' chain. Pieces of 2 pages or more (a piece's q buffer, by parity,
// is rewritten two pieces on).
constexpr int PC_NB = 3;
// named barriers by immediate ids (ptxas reserves all 16 where an id is a register, and
// an SM holds 4 such blocks): FULL + buffer (1-3) and EMPTY + buffer (4-6)
__device__ __forceinline__ void nbar_sync(int id) {
  switch (id) {
  case 1: asm volatile("bar.sync 1, 64;" ::: "memory"); break;
  case 2: asm volatile("bar.sync 2, 64;" ::: "memory"); break;
  case 3: asm volatile("bar.sync 3, 64;" ::: "memory"); break;
  case 4: asm volatile("bar.sync 4, 64;" ::: "memory"); break;
  case 5: asm volatile("bar.sync 5, 64;" ::: "memory"); break;
  default: asm volatile("bar.sync 6, 64;" ::: "memory"); break;
  }
}
__device__ __forceinline__ void nbar_arrive(int id) {
  switch (id) {
  case 1: asm volatile("bar.arrive 1, 64;" ::: "memory"); break;
  case 2: asm volatile("bar.arrive 2, 64;" ::: "memory"); break;
  case 3: asm volatile("bar.arrive 3, 64;" ::: "memory"); break;
  case 4: asm volatile("bar.arrive 4, 64;" ::: "memory"); break;
  case 5: asm volatile("bar.arrive 5, 64;" ::: "memory"); break;
  default: asm volatile("bar.arrive 6, 64;" ::: "memory"); break;
  }
}
static_assert(PC_NB == 3, "barrier ids 1-6");
struct phdr { int flags, row0, qpar, pad; }; // flags: 1 first, 2 last, 4 done
template <int MODE, int MB>
__global__ void __launch_bounds__(64, MB) burst_pc(const __nv_bfloat16 *kc, const __nv_bfloat16 *vc, const bpiece *pieces,
                                              int npieces, const int *pages, int pps, const __nv_bfloat16 *q,
                                              float scale_log2, float *part_o, float *part_lse, u32 *counter) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ phdr hdr[PC_NB];
  const u32 b0 = saddr(smem), qb0 = b0 + PC_NB * BURST;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == 0) { // producer
    int j = 0, npc = 0; // bursts issued, pieces begun
    for (;;) {
      const u32 cur = claim(counter, lane);
      if (cur >= (u32)npieces) break;
      const bpiece pc = pieces[cur];
      const int ids = piece_ids(pc, pages, pps, lane);
      const int qpar = npc++ & 1;
      for (int i = 0; i < pc.np; i++, j++) {
        const int buf = j % PC_NB;
        if (j >= PC_NB) nbar_sync(4 + buf); // its consumer is done with it
        issue_burst(b0 + buf * BURST, kc, vc, __shfl_sync(~0u, ids, i), pc.hk, lane);
        if (i == 0) issue_qrows(qb0 + qpar * QB, q, pc.b, pc.hk, lane);
        if (lane == 0) hdr[buf] = phdr{(i == 0 ? 1 : 0) | (i == pc.np - 1 ? 2 : 0), pc.part * H + pc.hk * GT, qpar, 0};
        asm volatile("cp.async.commit_group;" ::: "memory");
        if (j >= 1) { // the burst before this one has landed: hand it over
          asm volatile("cp.async.wait_group 1;" ::: "memory");
          __syncwarp();
          nbar_arrive(1 + (j - 1) % PC_NB);
        }
      }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp();
    if (j >= 1) nbar_arrive(1 + (j - 1) % PC_NB);
    // the end: one more entry, no copies
    const int buf = j % PC_NB;
    if (j >= PC_NB) nbar_sync(4 + buf);
    if (lane == 0) hdr[buf].flags = 4;
    __syncwarp();
    nbar_arrive(1 + buf);
    // the consumer's hand-backs that no later burst waited for
    for (int k = j + 1 - PC_NB; k < j; k++)
      if (k >= 0) nbar_sync(4 + k % PC_NB);
    return;
  }
  // consumer
  u32 qa[D / 16][4];
  head_tile t;
  for (int j = 0;; j++) {
    const int buf = j % PC_NB;
    nbar_sync(1 + buf);
    const phdr h = hdr[buf];
    if (h.flags & 4) break;
    const u32 kb = b0 + buf * BURST, vb = kb + PS * ROWB;
    if (h.flags & 1) {
      load_qa(qa, qb0 + h.qpar * QB, lane);
      t.reset();
    }
    u32 kf[D / 16][4], vf[D / 16][4];
    load_kf(kf, kb, lane);
    float sa[2][4];
    u32 pa[4];
    t.qk<MODE == 0>(sa, qa, kf);
    load_vf(vf, vb, lane);
    __syncwarp();
    nbar_arrive(4 + buf); // the buffer is read
    t.softmax(sa, scale_log2, pa);
    t.pv<MODE == 0>(pa, vf);
    if (h.flags & 2) t.write(part_o, part_lse, h.row0, lane);
  }
}

int main(int argc, char **argv) {
  const micro_args a(argc, argv);
  if (!a.ok) return 1;
  const int B = a.B, L = a.L, chunk = a.chunk, mode = a.mode, check = a.check;
  decode_case c(B, L);
  // pieces: sequence b's key ranges of `chunk` pages, each for the 8 kv heads in turn (the
  // heads of one range claimed together, so the pages' 8 head rows are read at about one time)
  std::vector<bpiece> pcs;
  for (int b = 0; b < B; b++) {
    int r = 0;
    for (int p0 = 0; p0 < c.pps; p0 += chunk, r++)
      for (int hk = 0; hk < HK; hk++) pcs.push_back(bpiece{b, hk, p0, std::min(chunk, c.pps - p0), 0});
    c.np[b] = r;
  }
  for (int b = 0, f = 0; b < B; f += c.np[b], b++) c.first[b] = f;
  for (auto &pc : pcs) pc.part = c.first[pc.b] + pc.p0 / chunk;
  const int npc = (int)pcs.size();
  c.alloc_parts(c.first[B - 1] + c.np[B - 1]);
  bpiece *dpcs;
  CK(cudaMalloc(&dpcs, npc * sizeof(bpiece)));
  CK(cudaMemcpy(dpcs, pcs.data(), npc * sizeof(bpiece), cudaMemcpyHostToDevice));
  const bool two = mode == 2 || mode == 3; // modes 2 / 3: burst2, full / no MMAs; 4: burst's copies alone
  const bool pcw = mode >= 5;  // 5 / 6: a producer and a consumer warp, full / no MMAs; 7: 5 at 8 blocks a SM
  if ((two || pcw) && (chunk < 2 || c.pps % chunk == 1)) { printf("pieces of 2 pages or more\n"); return 1; }
  auto kern = mode == 0 ? burst<0> : mode == 1 ? burst<1> : mode == 2 ? burst2<0> : mode == 3 ? burst2<1>
            : mode == 5 ? burst_pc<0, 6> : mode == 6 ? burst_pc<1, 6> : mode == 7 ? burst_pc<0, 8> : burst<2>;
  const int SMEM = pcw ? PC_NB * BURST + 2 * QB : two ? 2 * BURST + QB : BURST + QB;
  const int threads = pcw ? 64 : 32;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, threads, SMEM));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, kern));
  // WARPS=N: N blocks a SM (persistent: sms N blocks), at most what fits
  if (getenv("WARPS")) occ = std::min(occ, std::max(1, atoi(getenv("WARPS"))));
  const char *name = pcw ? "burst_pc" : two ? "burst2" : "burst";
  printf("%s: %d registers, %d blocks of %d warps a SM (%d of shared memory each)\n", name, fa.numRegs, occ, threads / 32, SMEM);
  const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);
  const double read_gbps = c.read_ceiling();
  double k_us, t_us;
  c.time_calls([&] { kern<<<c.sms * occ, threads, SMEM, c.st>>>(c.dk, c.dv, dpcs, npc, c.dpages, c.pps, c.dq, scale_log2, c.po, c.pl, c.ctr); },
               &k_us, &t_us);
  report(name, c, chunk, npc, mode, read_gbps, k_us, t_us);
  if ((mode == 0 || mode == 2 || mode == 5 || mode == 7) && check) printf("  check: max |d| %.3g over 16 random (sequence, head) rows (bf16 output, P in bf16)\n", c.check());
  return 0;
}
