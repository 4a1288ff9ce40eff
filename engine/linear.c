/* linear.c - the linear-layer handle: validates weight formats, and routes
 * y = x . W^T to the reference, the AVX2 kernels or oneDNN. */
#include <stdio.h>

#include "convert.h"
#include "linear.h"

tide_linear_kernel tide_linear_fast = NULL;

#ifndef TIDE_HAVE_DNNL
int tide_dnnl_sgemm_nt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                       float *y, int64_t ldy) {
  return TIDE_ERR(TIDE_E_UNSUPPORTED, "tide was built without oneDNN (TIDE_DNNL=OFF)");
}
#endif

static int bad_shape(const char *fn, const char *what, const tide_tensor *t, const char *want) {
  char b[96];
  return tide_errorf(TIDE_E_INVALID, fn, "%s has shape %s %s, expected %s", what, tide_shape_str(t, b, sizeof b),
                     tide_dtype_name(t->dtype), want);
}

int tide_linear_new(tide_linear **out, const tide_tensor *w, const tide_tensor *scale) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = NULL;
  TIDE_CHECK(tide_check_tensor(__func__, "weight", w, 0, 2));
  if (!tide_tensor_is_contiguous(w)) return TIDE_ERR(TIDE_E_INVALID, "weight must be contiguous");
  int64_t N = w->sizes[0], K = w->sizes[1];
  int fmt;
  char want[160];
  switch (w->dtype) {
    case TIDE_F32: fmt = TIDE_W_F32; break;
    case TIDE_BF16: fmt = TIDE_W_BF16; break;
    case TIDE_F16: fmt = TIDE_W_F16; break;
    case TIDE_F8E4M3: fmt = TIDE_W_FP8; break;
    case TIDE_I8: case TIDE_U8: fmt = TIDE_W_MXFP4; K *= 2; break;
    default:
      return TIDE_ERR(TIDE_E_UNSUPPORTED, "weight dtype %s is not a linear-layer format (f32, bf16, f16, f8e4m3 + e8m0 "
                      "scale, i8/u8 MXFP4 + e8m0 scale)", tide_dtype_name(w->dtype));
  }
  if (fmt == TIDE_W_FP8 || fmt == TIDE_W_MXFP4) {
    if (!scale || !scale->data) return TIDE_ERR(TIDE_E_INVALID, "%s weight [%lld, %lld] needs a scale tensor",
                                               fmt == TIDE_W_FP8 ? "FP8" : "MXFP4", (long long)w->sizes[0], (long long)w->sizes[1]);
    TIDE_CHECK(tide_check_tensor(__func__, "scale", scale, TIDE_DT(TIDE_E8M0) | TIDE_DT(TIDE_U8), 2));
    if (!tide_tensor_is_contiguous(scale)) return TIDE_ERR(TIDE_E_INVALID, "scale must be contiguous");
    int64_t sr = fmt == TIDE_W_FP8 ? (N + 127) / 128 : N;
    int64_t sc = fmt == TIDE_W_FP8 ? (K + 127) / 128 : K / 32;
    if (fmt == TIDE_W_MXFP4 && K % 32)
      return TIDE_ERR(TIDE_E_INVALID, "MXFP4 weight has K = %lld inputs, not a multiple of 32", (long long)K);
    if (scale->sizes[0] != sr || scale->sizes[1] != sc) {
      snprintf(want, sizeof want, "[%lld, %lld] e8m0 for a weight of %lld x %lld", (long long)sr, (long long)sc,
               (long long)N, (long long)K);
      return bad_shape(__func__, "scale", scale, want);
    }
  } else if (scale && scale->data) {
    return TIDE_ERR(TIDE_E_INVALID, "a %s weight takes no scale tensor", tide_dtype_name(w->dtype));
  }
  struct tide_linear *l = tide_xcalloc(1, sizeof *l);
  if (!l) return TIDE_E_NOMEM;
  tide_tensor_ref(&l->w, w);
  if (fmt == TIDE_W_FP8 || fmt == TIDE_W_MXFP4) tide_tensor_ref(&l->scale, scale);
  l->fmt = fmt;
  l->n = N;
  l->k = K;
  l->wbytes = tide_tensor_nbytes(w) + (l->scale.data ? tide_tensor_nbytes(&l->scale) : 0);
  *out = l;
  return TIDE_OK;
}

void tide_linear_free(tide_linear *l) {
  if (!l) return;
  if (l->priv_free) l->priv_free(l->priv);
  tide_tensor_release(&l->w);
  tide_tensor_release(&l->scale);
  tide_xfree(l);
}

int tide_linear_info(const tide_linear *l, int64_t *n, int64_t *k, int *fmt) {
  if (!l) return TIDE_ERR(TIDE_E_INVALID, "NULL linear");
  if (n) *n = l->n;
  if (k) *k = l->k;
  if (fmt) *fmt = l->fmt;
  return TIDE_OK;
}

int64_t tide_linear_weight_bytes(const tide_linear *l) { return l ? l->wbytes : 0; }

/* Run a kernel on f32 rows; converts x/y through scratch when they are bf16. */
static int run(const tide_linear *l, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t m, int backend) {
  if (backend == TIDE_BACKEND_REF) {
    tide_linear_ref(l, y, ldy, x, ldx, m);
    return TIDE_OK;
  }
  if (tide_linear_fast) {
    int rc = tide_linear_fast(l, y, ldy, x, ldx, m, backend);
    if (rc != TIDE_E_UNSUPPORTED) return rc;
  }
  if (backend == TIDE_BACKEND_DNNL || backend == TIDE_BACKEND_AUTO) {
    if (l->fmt == TIDE_W_F32) {
      int rc = tide_dnnl_sgemm_nt(m, l->n, l->k, x, ldx, l->w.data, l->k, y, ldy);
      if (rc != TIDE_E_UNSUPPORTED || backend == TIDE_BACKEND_DNNL) return rc;
    } else if (backend == TIDE_BACKEND_DNNL) {
      return TIDE_ERR(TIDE_E_UNSUPPORTED, "no oneDNN path for %s weights", tide_dtype_name(l->w.dtype));
    }
  }
  if (backend == TIDE_BACKEND_AVX2)
    return TIDE_ERR(TIDE_E_UNSUPPORTED, "no AVX2 kernel for %s weights on this build/CPU", tide_dtype_name(l->w.dtype));
  tide_linear_ref(l, y, ldy, x, ldx, m);
  return TIDE_OK;
}

int tide_linear_forward(const tide_linear *l, tide_tensor *y, const tide_tensor *x, int backend) {
  if (!l) return TIDE_ERR(TIDE_E_INVALID, "NULL linear");
  if (backend < TIDE_BACKEND_AUTO || backend > TIDE_BACKEND_DNNL) return TIDE_ERR(TIDE_E_INVALID, "bad backend %d", backend);
  const unsigned act = TIDE_DT(TIDE_F32) | TIDE_DT(TIDE_BF16);
  TIDE_CHECK(tide_check_tensor(__func__, "x", x, act, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "y", y, act, -1));
  if (x->ndim < 1 || x->ndim > 2 || y->ndim != x->ndim) {
    char a[96], b[96];
    return TIDE_ERR(TIDE_E_INVALID, "x %s and y %s must both be [M, K] / [M, N] (or 1-d)", tide_shape_str(x, a, sizeof a),
                    tide_shape_str(y, b, sizeof b));
  }
  int64_t M = x->ndim == 2 ? x->sizes[0] : 1, K = x->sizes[x->ndim - 1], N = y->sizes[y->ndim - 1];
  if (K != l->k || N != l->n || (y->ndim == 2 && y->sizes[0] != M)) {
    char a[96], b[96];
    return TIDE_ERR(TIDE_E_INVALID, "x %s, y %s do not fit a weight of N=%lld x K=%lld", tide_shape_str(x, a, sizeof a),
                    tide_shape_str(y, b, sizeof b), (long long)l->n, (long long)l->k);
  }
  if (x->strides[x->ndim - 1] != 1 || y->strides[y->ndim - 1] != 1)
    return TIDE_ERR(TIDE_E_INVALID, "x and y rows must be contiguous");
  if (y->readonly) return TIDE_ERR(TIDE_E_INVALID, "y is read-only");
  if (M == 0) return TIDE_OK;
  int64_t ldx = x->ndim == 2 ? x->strides[0] : K, ldy = y->ndim == 2 ? y->strides[0] : N;
  float *xs = NULL, *ys = NULL;
  const float *xf = x->data;
  float *yf = y->data;
  if (x->dtype != TIDE_F32) {
    xs = tide_xmalloc((size_t)(M * K) * 4);
    if (!xs) return TIDE_E_NOMEM;
    for (int64_t i = 0; i < M; i++)
      tide_convert(xs + i * K, TIDE_F32, (const uint16_t *)x->data + i * ldx, TIDE_BF16, K);
    xf = xs;
    ldx = K;
  }
  int64_t ldyf = ldy;
  if (y->dtype != TIDE_F32) {
    ys = tide_xmalloc((size_t)(M * N) * 4);
    if (!ys) {
      tide_xfree(xs);
      return TIDE_E_NOMEM;
    }
    yf = ys;
    ldyf = N;
  }
  int rc = run(l, yf, ldyf, xf, ldx, M, backend);
  if (rc == TIDE_OK && ys)
    for (int64_t i = 0; i < M; i++) tide_convert((uint16_t *)y->data + i * ldy, TIDE_BF16, ys + i * N, TIDE_F32, N);
  tide_xfree(xs);
  tide_xfree(ys);
  return rc;
}

int tide_matmul(tide_tensor *y, const tide_tensor *x, const tide_tensor *w, int backend) {
  TIDE_CHECK(tide_check_tensor(__func__, "w", w, TIDE_DT(TIDE_F32) | TIDE_DT(TIDE_BF16) | TIDE_DT(TIDE_F16), 2));
  tide_tensor wc;
  memset(&wc, 0, sizeof wc);
  const tide_tensor *wp = w;
  if (!tide_tensor_is_contiguous(w)) {
    TIDE_CHECK(tide_tensor_clone(&wc, w, -1));
    wp = &wc;
  }
  tide_linear *l;
  int rc = tide_linear_new(&l, wp, NULL);
  if (rc == TIDE_OK) {
    rc = tide_linear_forward(l, y, x, backend);
    tide_linear_free(l);
  }
  tide_tensor_release(&wc);
  return rc;
}
