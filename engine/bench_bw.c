/* bench_bw.c - the machine's read bandwidth, measured in the same run as a
 * benchmark so ratios against it are meaningful on a noisy machine. */
#include <math.h>
#include <stdlib.h>

#include "tide_internal.h"

#if defined(__x86_64__)
double tide_fma_burst_avx2(int64_t iters);
#endif

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

/* The scalar fallback of the FMA burst: twelve chains of fmaf, one lane. */
static double fma_burst_scalar(int64_t iters) {
  float c[12];
  for (int j = 0; j < 12; j++) c[j] = (float)j;
  for (int64_t i = 0; i < iters; i++)
    for (int j = 0; j < 12; j++) c[j] = fmaf(c[j], 0.999f, 0.001f);
  double s = 0;
  for (int j = 0; j < 12; j++) s += c[j];
  return s;
}

volatile double tide_fma_sink;

double tide_bench_fma_peak(double seconds, int threads) {
  if (!(seconds > 0)) seconds = 0.2;
  int lanes = 1;
#if defined(__x86_64__)
  if (tide_kernels_avx2()) lanes = 8;
#endif
  int old = tide_threads_get();
  if (threads > 0) tide_threads_set(threads);
  /* size one burst to ~10 ms on this core, then run bursts for `seconds`;
   * the best of three is the rate */
  int64_t iters = 1 << 16;
  for (;;) {
    double t0 = tide_time();
#if defined(__x86_64__)
    tide_fma_sink = lanes == 8 ? tide_fma_burst_avx2(iters) : fma_burst_scalar(iters);
#else
    tide_fma_sink = fma_burst_scalar(iters);
#endif
    double dt = tide_time() - t0;
    if (dt > 0.01 || iters > ((int64_t)1 << 40)) break;
    iters *= dt > 0.001 ? 2 : 8;
  }
  double best = 0;
  for (int r = 0; r < 3; r++) {
    double t0 = tide_time(), dt = 0, flops = 0;
    do {
      double sink = 0;
      int nt = 1;
#ifdef _OPENMP
#pragma omp parallel reduction(+ : sink)
#endif
      {
#if defined(__x86_64__)
        sink += lanes == 8 ? tide_fma_burst_avx2(iters) : fma_burst_scalar(iters);
#else
        sink += fma_burst_scalar(iters);
#endif
#ifdef _OPENMP
#pragma omp single nowait
        nt = omp_get_num_threads();
#endif
      }
      tide_fma_sink = sink;
      flops += (double)iters * 12.0 * lanes * 2.0 * nt;
      dt = tide_time() - t0;
    } while (dt < seconds / 3);
    double gf = flops / dt / 1e9;
    if (gf > best) best = gf;
  }
  if (threads > 0) tide_threads_set(old);
  return best;
}
