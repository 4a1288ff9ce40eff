/* linear.h - internals of the linear-layer interface shared by its kernels.
 * Contract of every forward kernel: y[m, n] = sum_k x[m, k] * W[n, k] for
 * m < M, n < N, with x rows at stride ldx and y rows at stride ldy (floats);
 * W in the handle's format. Kernels write all M x N outputs. */
#ifndef TIDE_KERNELS_LINEAR_H
#define TIDE_KERNELS_LINEAR_H

#include "tide_internal.h"

struct tide_linear {
  tide_tensor w;        /* [N, K] (MXFP4: [N, K/2] bytes) */
  tide_tensor scale;    /* FP8: e8m0 [ceil(N/128), ceil(K/128)]; MXFP4: e8m0 [N, K/32]; else empty */
  int fmt;              /* tide_wfmt */
  int64_t n, k;
  int64_t wbytes;       /* weight + scale bytes */
  void *priv;           /* backend caches (prepacked panels), freed with priv_free */
  void (*priv_free)(void *);
};

/* Value of W[n, k] after dequantisation (the reference semantics). */
float tide_linear_weight_at(const struct tide_linear *l, int64_t n, int64_t k);

/* Scalar reference: double accumulation, any format. */
void tide_linear_ref(const struct tide_linear *l, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t m);

/* oneDNN f32 GEMM y = x . w^T with w f32 [n, k] at row stride ldw.
 * Returns TIDE_E_UNSUPPORTED when tide was built without oneDNN. */
int tide_dnnl_sgemm_nt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                       float *y, int64_t ldy);

/* Optional fast paths provided by kernel files; each returns TIDE_OK, or
 * TIDE_E_UNSUPPORTED when it does not handle this format/shape (the caller
 * then falls back). Set by the quantised-kernel module at startup. */
typedef int (*tide_linear_kernel)(const struct tide_linear *l, float *y, int64_t ldy, const float *x, int64_t ldx,
                                  int64_t m, int backend);
extern tide_linear_kernel tide_linear_fast;

#endif
