/* ops_ref.c - scalar references of the row kernels in ops_kernels.h: plain
 * loops in the order the doc states, double where a long sum is taken. The
 * AVX2 table is tested against these. */
#include <math.h>

#include "ops_kernels.h"

static double sumsq_ref(const float *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

static float weight_at(const void *w, int wkind, int64_t i) {
  switch (wkind) {
    case TIDE_OPSW_F32: return ((const float *)w)[i];
    case TIDE_OPSW_BF16: return tide_bf16f(((const uint16_t *)w)[i]);
    default: return 1.0f;
  }
}

static void scale_row_ref(float *y, const float *x, float r, const void *w, int wkind, int64_t n, int round) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] * r;
    if (wkind != TIDE_OPSW_NONE) v = v * weight_at(w, wkind, i);
    y[i] = round ? tide_round_bf16(v) : v;
  }
}

static void mix_ref(float *m, int64_t ldm, const float *z, int64_t ldz, int nt, const float *fn, int64_t ldf, int nr,
                    int64_t n) {
  for (int t = 0; t < nt; t++)
    for (int r = 0; r < nr; r++) {
      double acc = 0;
      for (int64_t k = 0; k < n; k++) acc += (double)z[t * ldz + k] * fn[r * ldf + k];
      m[t * ldm + r] = (float)acc;
    }
}

static void wsum_ref(float *y, const float *X, const float *c, int hc, int64_t d, int round) {
  for (int64_t k = 0; k < d; k++) {
    float acc = c[0] * X[k];
    for (int i = 1; i < hc; i++) acc = acc + c[i] * X[i * d + k];
    y[k] = round ? tide_round_bf16(acc) : acc;
  }
}

static void post_ref(float *out, const float *a, const float *X, const float *post, const float *comb, int hc,
                     int64_t d, int round) {
  float col[TIDE_HC_MAX];
  for (int64_t k = 0; k < d; k++) {
    for (int j = 0; j < hc; j++) {
      float acc = post[j] * a[k];
      for (int i = 0; i < hc; i++) acc = acc + comb[i * hc + j] * X[i * d + k];
      col[j] = round ? tide_round_bf16(acc) : acc;
    }
    for (int j = 0; j < hc; j++) out[j * d + k] = col[j]; /* after every read of column k */
  }
}

static void swiglu_ref(float *h, const float *g, const float *u, int64_t n, float lim, int round) {
  for (int64_t i = 0; i < n; i++) {
    float gv = fminf(g[i], lim);
    float uv = fminf(fmaxf(u[i], -lim), lim);
    float v = gv / (1.0f + expf(-gv)) * uv;
    h[i] = round ? tide_round_bf16(v) : v;
  }
}

static void combine_ref(float *out, const float *const *ys, const float *w, int k, const float *shared, int64_t d,
                        int round) {
  for (int64_t j = 0; j < d; j++) {
    float acc = w[0] * ys[0][j];
    for (int i = 1; i < k; i++) acc = acc + w[i] * ys[i][j];
    if (shared) acc = acc + shared[j];
    out[j] = round ? tide_round_bf16(acc) : acc;
  }
}

static void round_ref(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = tide_round_bf16(x[i]);
}

static void bf16_row_ref(float *y, const uint16_t *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = tide_bf16f(x[i]);
}

const tide_ops_kernels tide_ops_ref = {
    .sumsq = sumsq_ref,
    .scale_row = scale_row_ref,
    .mix = mix_ref,
    .wsum = wsum_ref,
    .post = post_ref,
    .swiglu = swiglu_ref,
    .combine = combine_ref,
    .round = round_ref,
    .bf16_row = bf16_row_ref,
};
