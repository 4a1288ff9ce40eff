/* ops_testutil.h - small helpers shared by test_ops.c and test_moe.c:
 * seeded bf16-valued random data, tensors over test buffers, error norms. */
#ifndef TIDE_OPS_TESTUTIL_H
#define TIDE_OPS_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tide.h"
#include "tt.h"

/* xorshift64*: deterministic test data */
typedef struct { uint64_t s; } trng;
static inline uint64_t trng_next(trng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 2685821657736338717ull;
}
static inline double trng_unif(trng *r) { return (double)(trng_next(r) >> 11) * (1.0 / 9007199254740992.0); }
static inline double trng_normal(trng *r) {
  double u = trng_unif(r) + 1e-300, v = trng_unif(r);
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}
static inline float bf16v(float x) { return tide_bf16_to_f32(tide_f32_to_bf16(x)); }
/* n normal values * std, rounded to bf16 like every activation */
static inline void fill_bf16(float *p, int64_t n, uint64_t seed, double std) {
  trng r = {seed * 0x9E3779B97F4A7C15ull + 1};
  for (int64_t i = 0; i < n; i++) p[i] = bf16v((float)(trng_normal(&r) * std));
}
static inline void fill_f32(float *p, int64_t n, uint64_t seed, double std) {
  trng r = {seed * 0x9E3779B97F4A7C15ull + 7};
  for (int64_t i = 0; i < n; i++) p[i] = (float)(trng_normal(&r) * std);
}

/* A tensor header over caller memory (no storage: lives while the buffer
 * does; tide functions only read the header). */
static inline tide_tensor tview(void *p, int dtype, int nd, int64_t s0, int64_t s1, int64_t s2) {
  tide_tensor t;
  memset(&t, 0, sizeof t);
  int64_t sz[3] = {s0, s1, s2};
  t.data = p;
  t.dtype = dtype;
  t.ndim = nd;
  for (int i = 0; i < 4; i++) t.sizes[i] = 1;
  for (int i = 0; i < nd; i++) t.sizes[i] = sz[i];
  int64_t st = 1;
  for (int i = nd - 1; i >= 0; i--) {
    t.strides[i] = st;
    st *= t.sizes[i];
  }
  return t;
}
/* rows x n f32 with row stride ld */
static inline tide_tensor trows(float *p, int64_t rows, int64_t n, int64_t ld) {
  tide_tensor t = tview(p, TIDE_F32, 2, rows, n, 0);
  t.strides[0] = ld;
  return t;
}

static inline double nmse(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return den > 0 ? num / den : num;
}
static inline double max_abs_diff(const float *a, const float *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > m || isnan(d)) m = d;
  }
  return m;
}
/* largest distance in bf16 units in the last place (inputs bf16-valued) */
static inline int64_t max_bf16_ulp(const float *a, const float *b, int64_t n) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t x = (int32_t)tide_f32_to_bf16(a[i]), y = (int32_t)tide_f32_to_bf16(b[i]);
    if (x & 0x8000) x = 0x8000 - x; /* sign-magnitude -> ordered */
    if (y & 0x8000) y = 0x8000 - y;
    int64_t d = x > y ? x - y : y - x;
    if (d > m) m = d;
  }
  return m;
}

/* Two bf16-rounded results that may differ by rounding noise only: at most 1
 * bf16 ulp apart anywhere, and on at most 1 + n/100 elements (a last-bit
 * difference before rounding flips the bf16 result on a few elements). */
static inline int close_bf16(const float *a, const float *b, int64_t n) {
  int64_t diff = 0;
  for (int64_t i = 0; i < n; i++) diff += a[i] != b[i];
  return max_bf16_ulp(a, b, n) <= 1 && diff <= 1 + n / 100;
}

static inline void *xalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "test: out of memory\n");
    exit(2);
  }
  return p;
}

#endif
