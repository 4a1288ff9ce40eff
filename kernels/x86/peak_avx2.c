/* peak_avx2.c - a burst of independent f32 FMAs on 256-bit vectors, for
 * tide_bench_fma_peak (engine/bench_bw.c): twelve chains, more than the
 * FMA latency times the FMA ports of current x86 cores (4 x 2 on Zen 3,
 * 4 x 2 on Skylake), so the loop runs at the FMA throughput. */
#include <immintrin.h>
#include <stdint.h>

double tide_fma_burst_avx2(int64_t iters);

double tide_fma_burst_avx2(int64_t iters) {
  /* acc = acc * a + b converges to b / (1 - a) = 1: no overflow, no subnormals */
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  __m256 c[12];
  for (int j = 0; j < 12; j++) c[j] = _mm256_set1_ps((float)j);
  for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; j++) c[j] = _mm256_fmadd_ps(c[j], a, b);
  }
  __m256 s = c[0];
  for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, c[j]);
  float o[8];
  _mm256_storeu_ps(o, s);
  return (double)o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}
