/* sample_ref.c - scalar references of the sampling kernels (the semantics
 * the AVX2 variants reproduce bit for bit) and the dispatch table. */
#include <math.h>
#include <string.h>

#include "sample_kernels.h"
#include "tide_internal.h"

/* exp(x) for x <= 0: x = n ln2 + r with n = rint(x log2e), exp(r) from the
 * polynomial with fused multiply-adds, times 2^n built in the exponent bits.
 * fmaf is correctly rounded, so this gives the same bits as the AVX2
 * vfmadd sequence. */
float tide_sample_exp_ref(float x) {
  if (!(x >= TIDE_EXP_FLUSH)) return 0.0f;
  float n = rintf(x * TIDE_EXP_LOG2E);
  float r = fmaf(n, -TIDE_EXP_LN2_HI, x);
  r = fmaf(n, -TIDE_EXP_LN2_LO, r);
  float y = TIDE_EXP_P0;
  y = fmaf(y, r, TIDE_EXP_P1);
  y = fmaf(y, r, TIDE_EXP_P2);
  y = fmaf(y, r, TIDE_EXP_P3);
  y = fmaf(y, r, TIDE_EXP_P4);
  y = fmaf(y, r, TIDE_EXP_P5);
  float r2 = r * r;
  y = fmaf(y, r2, r);
  y = y + 1.0f;
  union { uint32_t u; float f; } s;
  s.u = (uint32_t)((int32_t)n + 127) << 23;
  return y * s.f;
}

static int64_t scan_ref(const float *x, int64_t n, float *max, float *min) {
  float mx = -INFINITY, mn = INFINITY;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    if (v != v || v == INFINITY) {
      bad++;
      continue;
    }
    if (v > mx) mx = v;
    if (v < mn && v != -INFINITY) mn = v;
  }
  *max = mx + 0.0f;   /* -0 -> +0: the lane order of a vector max must not matter */
  *min = mn + 0.0f;
  return bad;
}

static int64_t scan_copy_ref(float *dst, const float *x, int64_t n, float *max, float *min) {
  memcpy(dst, x, (size_t)n * 4);
  return scan_ref(x, n, max, min);
}

static double combine8(const double *a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static double expsum_ref(float *p, const float *x, int64_t n, float m) {
  double acc[8] = {0};
  for (int64_t i = 0; i < n; i++) {
    float e = tide_sample_exp_ref(x[i] - m);
    if (p) p[i] = e;
    acc[i & 7] += (double)e;
  }
  return combine8(acc);
}

static double blocksum_ref(const float *p, int64_t n, double *bsum) {
  double total = 0;
  for (int64_t b = 0; b * 64 < n; b++) {
    double acc[8] = {0};
    int64_t end = (b + 1) * 64 < n ? (b + 1) * 64 : n;
    for (int64_t i = b * 64; i < end; i++) acc[i & 7] += (double)p[i];
    bsum[b] = combine8(acc);
    total += bsum[b];
  }
  return total;
}

static int64_t find_ref(const float *x, int64_t i0, int64_t n, float t, int ge) {
  if (ge) {
    for (int64_t i = i0; i < n; i++)
      if (x[i] >= t) return i;
  } else {
    for (int64_t i = i0; i < n; i++)
      if (x[i] > t) return i;
  }
  return n;
}

static int64_t count_ge_ref(const float *x, int64_t n, float t) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++) c += x[i] >= t;
  return c;
}

static int64_t compact_ref(int32_t *id, float *x, const float *key, int64_t n, float kt, int32_t it, int keep_in,
                           int64_t s, int64_t *low) {
  int64_t w = 0, lo = 0;
  for (int64_t i = 0; i < n; i++) {
    float k = key[i];
    int32_t vi = id[i];
    float vx = x[i];
    int in = k > kt || (k == kt && vi <= it);
    if (in == (keep_in != 0)) {
      id[w] = vi;
      x[w] = vx;
      w++;
      lo += i < s;
    }
  }
  *low = lo;
  return w;
}

static void buckets_ref(uint16_t *out, const float *x, int64_t n, float kmax, float scale, int nb) {
  float top = (float)nb - 0.5f;
  for (int64_t i = 0; i < n; i++) {
    float f = (kmax - x[i]) * scale;
    f = f < top ? f : top;   /* also takes NaN (x = -inf with scale 0) and +inf */
    out[i] = (uint16_t)((int)f + (x[i] == -INFINITY));
  }
}

static int64_t collect_ref(int32_t *pos, const uint16_t *b, int64_t n, uint16_t v) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++)
    if (b[i] == v) pos[k++] = (int32_t)i;
  return k;
}

static void scale_ref(float *p, int64_t n, float s) {
  for (int64_t i = 0; i < n; i++) p[i] *= s;
}

static void divide_ref(float *p, int64_t n, float s) {
  for (int64_t i = 0; i < n; i++) p[i] /= s;
}

static void iota_ref(int32_t *id, int64_t n) {
  for (int64_t i = 0; i < n; i++) id[i] = (int32_t)i;
}

const tide_sample_kernels tide_sample_ref = {scan_ref,    scan_copy_ref, expsum_ref,  blocksum_ref, find_ref,  count_ge_ref,
                                             compact_ref, buckets_ref, collect_ref,  scale_ref, divide_ref,
                                             iota_ref};

const tide_sample_kernels *tide_sample_kernels_get(void) {
#if defined(__x86_64__)
  if (tide_use_avx2()) return &tide_sample_avx2;
#endif
  return &tide_sample_ref;
}
