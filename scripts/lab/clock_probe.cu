// scripts/lab/clock_probe.cu -- the SM clock through a call, timed as the
// bench and decode_ab time one: the host idle for GAP us (usleep), then the
// library's hold kernel (30 us), then the work. One warp a SM (its lane 0)
// counts clock64 cycles over windows of PWIN ns of %globaltimer from the hold's
// start, so a clock that ramps up after the idle gap (or sags under load)
// shows as MHz by window. The work: none (the probe alone), or a 1 GiB read
// (grid_read, the bench's ceiling kernel) on a second stream, launched after
// the probe so the probe has its slot on every SM. Each row: the median over
// the SMs and 15 calls (after 3) of each window's MHz, then the read's time.
//   nvcc -O3 -arch=sm_90a -o /tmp/clock_probe scripts/lab/clock_probe.cu && /tmp/clock_probe
// Question (docs/measuring.md): is part of a decode call's fixed
// cost a clock that is still low when it starts? No: 1977-1983 MHz in every
// window after gaps of 0-100 ms, alone or under the read (dips to ~1950 in
// its first 100 us), and through decode_burst's calls (PROBE=1). The probe's
// spinning warp slows a decode sharing its SMs ~3x: read its MHz, not times.
#include "decode_micro.cuh"

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *dm; uint4 *rb; unsigned *sink;
  CK(cudaMalloc(&dm, sms * PW * 4));
  CK(cudaMalloc(&rb, 1ull << 30)); CK(cudaMalloc(&sink, 4)); CK(cudaMemset(rb, 1, 1ull << 30));
  int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, grid_read, 512, 0));
  cudaStream_t st, st2;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> hm(sms * PW);
  const int gaps[] = {0, 1000, 10000, 100000};
  printf("clock_probe: %d SMs, windows of %.0f us from the hold's start (hold 30 us); MHz, median over SMs and calls\n",
         sms, PWIN / 1e3);
  for (int load = 0; load < 2; load++)
    for (int gap : gaps) {
      std::vector<std::vector<float>> win(PW);
      std::vector<float> rt;
      for (int i = 0; i < 18; i++) {
        if (gap) usleep(gap);
        probe<<<sms, 32, 0, st2>>>(dm);
        hold<<<1, 1, 0, st>>>(30000);
        cudaEventRecord(e0, st);
        if (load) grid_read<<<sms * occ, 512, 0, st>>>(rb, (1ll << 30) / 16, sink);
        cudaEventRecord(e1, st);
        CK(cudaDeviceSynchronize());
        if (i < 3) continue;
        float ms; cudaEventElapsedTime(&ms, e0, e1); rt.push_back(ms * 1e3f);
        CK(cudaMemcpy(hm.data(), dm, hm.size() * 4, cudaMemcpyDeviceToHost));
        for (int w = 0; w < PW; w++)
          for (int s = 0; s < sms; s++) win[w].push_back(hm[s * PW + w]);
      }
      std::sort(rt.begin(), rt.end());
      printf("%-5s gap %6d us:", load ? "read" : "none", gap);
      print_window_medians(win);
      if (load) printf(" | read %.1f us (%.1f GB/s)", rt[rt.size() / 2], (double)(1 << 30) / rt[rt.size() / 2] / 1e3);
      printf("\n");
    }
  return 0;
}
