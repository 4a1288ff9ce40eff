/* bench_bw.c - the machine's read bandwidth, measured in the same run as a
 * benchmark so ratios against it are meaningful on a noisy machine. */
#include <stdlib.h>

#include "tide_internal.h"

/* Sum as 64-bit integers with four independent accumulators: the compiler
 * vectorises this loop at -O2 well enough to saturate DRAM; the AVX2 file
 * has no faster trick for a pure read. */
static uint64_t sum_range(const uint64_t *p, int64_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; i++) a += p[i];
  return a + b + c + d;
}

volatile uint64_t tide_bw_sink;

double tide_bench_read_bw(int64_t bytes, int reps, int threads) {
  if (bytes <= 0) bytes = (int64_t)512 << 20;
  if (reps <= 0) reps = 3;
  int64_t n = bytes / 8;
  uint64_t *buf = tide_xmalloc((size_t)n * 8);
  if (!buf) return -1.0;
  int old = tide_threads_get();
  if (threads > 0) tide_threads_set(threads);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t i = 0; i < n; i++) buf[i] = (uint64_t)i;
  double best = 0;
  for (int r = 0; r < reps; r++) {
    uint64_t total = 0;
    double t0 = tide_time();
#ifdef _OPENMP
#pragma omp parallel reduction(+ : total)
    {
      int nt = omp_get_num_threads(), id = omp_get_thread_num();
      int64_t chunk = (n + nt - 1) / nt, lo = id * chunk, hi = lo + chunk > n ? n : lo + chunk;
      if (lo < hi) total += sum_range(buf + lo, hi - lo);
    }
#else
    total = sum_range(buf, n);
#endif
    double dt = tide_time() - t0;
    tide_bw_sink = total;
    double gbs = (double)bytes / dt / 1e9;
    if (gbs > best) best = gbs;
  }
  if (threads > 0) tide_threads_set(old);
  tide_xfree(buf);
  return best;
}
