/* ops_kernels.h - the row-level kernels behind tide/ops.h: one scalar
 * reference table (kernels/ref/ops_ref.c) and one AVX2 table
 * (kernels/x86/ops_avx2.c), chosen at run time. kernels/ops.c validates the
 * tensors, splits the rows over threads and does the small per-token scalar
 * work (sigmoids, Sinkhorn, routing) that both paths share.
 *
 * Every kernel works on one row (or a small tile of rows) of f32 values; `n`
 * and `d` are counts of floats, strides are in floats, nothing is aligned.
 * `round` != 0 rounds the outputs to bf16 precision (nearest even). */
#ifndef TIDE_KERNELS_OPS_H
#define TIDE_KERNELS_OPS_H

#include "tide_internal.h"

/* Weight vector of an RMSNorm: none, f32 or bf16. */
enum { TIDE_OPSW_NONE = 0, TIDE_OPSW_F32 = 1, TIDE_OPSW_BF16 = 2 };

/* The largest hc (residual streams) and the largest mix = (2+hc)*hc. */
enum { TIDE_HC_MAX = 8, TIDE_HC_MIX_MAX = (2 + TIDE_HC_MAX) * TIDE_HC_MAX };

typedef struct tide_ops_kernels {
  /* sum of x[i]^2 for i < n, accumulated in double */
  double (*sumsq)(const float *x, int64_t n);
  /* y[i] = (x[i] * r) * w[i] (w of kind wkind, or 1); y may be x */
  void (*scale_row)(float *y, const float *x, float r, const void *w, int wkind, int64_t n, int round);
  /* m[t*ldm + r] = sum_k z[t*ldz + k] * fn[r*ldf + k] for t < nt, r < nr:
   * the mHC mixing product. The AVX2 variant keeps 8-lane f32 partial sums
   * in increasing k and one fixed horizontal reduction per (t, r), so the
   * value does not depend on nt, nr or which tile a row falls in; the
   * reference accumulates in double. */
  void (*mix)(float *m, int64_t ldm, const float *z, int64_t ldz, int nt, const float *fn, int64_t ldf, int nr,
              int64_t n);
  /* y[k] = sum_{i<hc} c[i] * X[i*d + k], f32, i in order (c[0]*X_0 first) */
  void (*wsum)(float *y, const float *X, const float *c, int hc, int64_t d, int round);
  /* out[j*d + k] = post[j] * a[k] + sum_i comb[i*hc + j] * X[i*d + k];
   * out may be X (every column is read before it is written) */
  void (*post)(float *out, const float *a, const float *X, const float *post, const float *comb, int hc, int64_t d,
               int round);
  /* h[i] = silu(min(g[i], lim)) * min(max(u[i], -lim), lim); h may be g or u */
  void (*swiglu)(float *h, const float *g, const float *u, int64_t n, float lim, int round);
  /* out[k] = ((w[0]*ys[0][k] + w[1]*ys[1][k]) + ...) + shared[k] (shared may
   * be NULL), f32 mul then add in slot order */
  void (*combine)(float *out, const float *const *ys, const float *w, int k, const float *shared, int64_t d,
                  int round);
  /* x[i] = bf16(x[i]) in place */
  void (*round)(float *x, int64_t n);
  /* y[i] = bf16 value x[i] widened to f32 */
  void (*bf16_row)(float *y, const uint16_t *x, int64_t n);
} tide_ops_kernels;

extern const tide_ops_kernels tide_ops_ref;
#if defined(__x86_64__)
extern const tide_ops_kernels tide_ops_avx2;
#endif
/* The active table: AVX2 when available and not forced to the reference. */
const tide_ops_kernels *tide_ops_kernels_get(void);

#endif
