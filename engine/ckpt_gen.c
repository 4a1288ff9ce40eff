/* ckpt_gen.c - what writing checkpoints needs besides the writer: FP8 block
 * and MXFP4 quantisation of f32 tensors, deterministic random weights in
 * any stored format, and random tid2eid tables. Work is split by blocks or
 * rows, and every value depends only on (seed, logical index), so results
 * do not depend on the thread count. */
#include <math.h>

#include "ckpt_quant.h"
#include "convert.h"
#include "tide_internal.h"

static int check_out(const char *fn, const char *what, const tide_tensor *t, unsigned mask, int64_t d0, int64_t d1) {
  TIDE_CHECK(tide_check_tensor(fn, what, t, mask, 2));
  if (!tide_tensor_is_contiguous(t)) return tide_errorf(TIDE_E_INVALID, fn, "%s must be contiguous", what);
  if (t->readonly) return tide_errorf(TIDE_E_INVALID, fn, "%s is read-only", what);
  if (t->sizes[0] != d0 || t->sizes[1] != d1) {
    char b[96];
    return tide_errorf(TIDE_E_INVALID, fn, "%s has shape %s, expected [%lld, %lld]", what, tide_shape_str(t, b, sizeof b),
                       (long long)d0, (long long)d1);
  }
  return TIDE_OK;
}

static int check_x(const char *fn, const tide_tensor *x) {
  TIDE_CHECK(tide_check_tensor(fn, "x", x, TIDE_DT(TIDE_F32), 2));
  if (!tide_tensor_is_contiguous(x)) return tide_errorf(TIDE_E_INVALID, fn, "x must be contiguous");
  return TIDE_OK;
}

int tide_ckpt_quant_fp8(tide_tensor *q, tide_tensor *scale, const tide_tensor *x) {
  TIDE_CHECK(check_x(__func__, x));
  int64_t n = x->sizes[0], k = x->sizes[1], nb = (n + 127) / 128, kb = (k + 127) / 128;
  TIDE_CHECK(check_out(__func__, "q", q, TIDE_DT(TIDE_F8E4M3), n, k));
  TIDE_CHECK(check_out(__func__, "scale", scale, TIDE_DT(TIDE_E8M0), nb, kb));
  const tide_ckq_kernels *K = tide_ckq_kernels_get();
  const float *xs = x->data;
  uint8_t *qs = q->data, *ss = scale->data;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n * k > 65536)
#endif
  for (int64_t b = 0; b < nb * kb; b++) {
    int64_t r0 = (b / kb) * 128, c0 = (b % kb) * 128;
    int rows = (int)(n - r0 < 128 ? n - r0 : 128), cols = (int)(k - c0 < 128 ? k - c0 : 128);
    ss[b] = K->fp8_block(qs + r0 * k + c0, k, xs + r0 * k + c0, k, rows, cols);
  }
  return TIDE_OK;
}

int tide_ckpt_quant_mxfp4(tide_tensor *q, tide_tensor *scale, const tide_tensor *x) {
  TIDE_CHECK(check_x(__func__, x));
  int64_t n = x->sizes[0], k = x->sizes[1];
  if (k % 32) return TIDE_ERR(TIDE_E_INVALID, "x has %lld columns, MXFP4 needs a multiple of 32", (long long)k);
  TIDE_CHECK(check_out(__func__, "q", q, TIDE_DT(TIDE_I8) | TIDE_DT(TIDE_U8), n, k / 2));
  TIDE_CHECK(check_out(__func__, "scale", scale, TIDE_DT(TIDE_E8M0), n, k / 32));
  const tide_ckq_kernels *K = tide_ckq_kernels_get();
  const float *xs = x->data;
  uint8_t *qs = q->data, *ss = scale->data;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n * k > 65536)
#endif
  for (int64_t r = 0; r < n; r++) K->mxfp4(qs + r * (k / 2), ss + r * (k / 32), xs + r * k, k);
  return TIDE_OK;
}

/* ---- random values ---- */
static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t tide_ckpt_seed(uint64_t seed, const char *name) {
  uint64_t h = 1469598103934665603ULL;
  for (const char *s = name ? name : ""; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
  return mix64(mix64(seed) ^ h);
}

/* uniform values for logical indices idx .. idx+n-1: the kernel's 32-bit
 * counter is the low half of the index, the key mixes the seed with the high
 * half, so a run is split where the low half wraps */
static void gen_run(const tide_ckq_kernels *K, float *dst, int64_t n, uint64_t seed, uint64_t idx, float mean,
                    float half) {
  while (n > 0) {
    uint64_t room = ((uint64_t)1 << 32) - (idx & 0xffffffffu);
    int64_t len = (uint64_t)n < room ? n : (int64_t)room;
    uint32_t key = (uint32_t)mix64(seed ^ ((idx >> 32) * 0x9e3779b97f4a7c15ULL));
    K->uniform(dst, len, key, (uint32_t)idx, mean, half);
    dst += len;
    idx += (uint64_t)len;
    n -= len;
  }
}

int tide_ckpt_gen_weight(tide_tensor *w, tide_tensor *scale, uint64_t seed, double mean, double std) {
  TIDE_CHECK(tide_check_tensor(__func__, "w", w, 0, -1));
  if (!tide_tensor_is_contiguous(w)) return TIDE_ERR(TIDE_E_INVALID, "w must be contiguous");
  if (w->readonly) return TIDE_ERR(TIDE_E_INVALID, "w is read-only");
  if (!isfinite(mean) || !isfinite(std) || std < 0)
    return TIDE_ERR(TIDE_E_INVALID, "mean %g and std %g must be finite, std >= 0", mean, std);
  const tide_ckq_kernels *K = tide_ckq_kernels_get();
  float m = (float)mean, half = (float)(std * sqrt(3.0));
  int dt = w->dtype;
  int nth = tide_omp_threads();
  if (dt == TIDE_F32 || dt == TIDE_BF16 || dt == TIDE_F16) {
    if (scale) return TIDE_ERR(TIDE_E_INVALID, "a %s tensor takes no scale", tide_dtype_name(dt));
    int64_t n = tide_tensor_numel(w);
    enum { CH = 16384 };
    float *tmp = NULL;
    if (dt != TIDE_F32 && !(tmp = tide_xmalloc((size_t)nth * CH * sizeof(float)))) return TIDE_E_NOMEM;
    const tide_convert_kernels *cv = tide_convert_kernels_get();
    int64_t nch = (n + CH - 1) / CH;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
    for (int64_t c = 0; c < nch; c++) {
      int64_t off = c * CH, len = n - off < CH ? n - off : CH;
      if (dt == TIDE_F32) {
        gen_run(K, (float *)w->data + off, len, seed, (uint64_t)off, m, half);
      } else {
        float *t = tmp + (size_t)tide_omp_tid() * CH;
        gen_run(K, t, len, seed, (uint64_t)off, m, half);
        if (dt == TIDE_BF16) cv->f32_to_bf16((uint16_t *)w->data + off, t, len);
        else cv->f32_to_f16((uint16_t *)w->data + off, t, len);
      }
    }
    tide_xfree(tmp);
    return TIDE_OK;
  }
  if (w->ndim != 2) return TIDE_ERR(TIDE_E_INVALID, "a %s weight must be 2-d", tide_dtype_name(dt));
  if (dt == TIDE_F8E4M3) {
    int64_t n = w->sizes[0], k = w->sizes[1], nb = (n + 127) / 128, kb = (k + 127) / 128;
    TIDE_CHECK(check_out(__func__, "scale", scale, TIDE_DT(TIDE_E8M0), nb, kb));
    float *tmp = tide_xmalloc((size_t)nth * 128 * 128 * sizeof(float));
    if (!tmp) return TIDE_E_NOMEM;
    uint8_t *qs = w->data, *ss = scale->data;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n * k > 65536)
#endif
    for (int64_t b = 0; b < nb * kb; b++) {
      int64_t r0 = (b / kb) * 128, c0 = (b % kb) * 128;
      int rows = (int)(n - r0 < 128 ? n - r0 : 128), cols = (int)(k - c0 < 128 ? k - c0 : 128);
      float *t = tmp + (size_t)tide_omp_tid() * 128 * 128;
      for (int r = 0; r < rows; r++) gen_run(K, t + r * cols, cols, seed, (uint64_t)((r0 + r) * k + c0), m, half);
      ss[b] = K->fp8_block(qs + r0 * k + c0, k, t, cols, rows, cols);
    }
    tide_xfree(tmp);
    return TIDE_OK;
  }
  if (dt == TIDE_I8 || dt == TIDE_U8) {
    int64_t n = w->sizes[0], k = 2 * w->sizes[1];
    if (k % 32) return TIDE_ERR(TIDE_E_INVALID, "MXFP4 weight of %lld columns: not a multiple of 32", (long long)k);
    TIDE_CHECK(check_out(__func__, "scale", scale, TIDE_DT(TIDE_E8M0), n, k / 32));
    float *tmp = tide_xmalloc((size_t)nth * (size_t)k * sizeof(float));
    if (!tmp) return TIDE_E_NOMEM;
    uint8_t *qs = w->data, *ss = scale->data;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n * k > 65536)
#endif
    for (int64_t r = 0; r < n; r++) {
      float *t = tmp + (size_t)tide_omp_tid() * (size_t)k;
      gen_run(K, t, k, seed, (uint64_t)(r * k), m, half);
      K->mxfp4(qs + r * (k / 2), ss + r * (k / 32), t, k);
    }
    tide_xfree(tmp);
    return TIDE_OK;
  }
  return TIDE_ERR(TIDE_E_INVALID, "cannot generate weights of dtype %s", tide_dtype_name(dt));
}

int tide_ckpt_gen_ids(tide_tensor *t, uint64_t seed, int64_t nv) {
  TIDE_CHECK(tide_check_tensor(__func__, "t", t, TIDE_DT(TIDE_I64) | TIDE_DT(TIDE_I32), 2));
  if (!tide_tensor_is_contiguous(t) || t->readonly) return TIDE_ERR(TIDE_E_INVALID, "t must be contiguous and writable");
  int64_t rows = t->sizes[0], k = t->sizes[1];
  if (k > nv || k > 1024 || nv > ((int64_t)1 << 31))
    return TIDE_ERR(TIDE_E_INVALID, "cannot draw %lld distinct values below %lld (k <= 1024, n < 2^31)", (long long)k,
                    (long long)nv);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (rows * k > 65536)
#endif
  for (int64_t r = 0; r < rows; r++) {
    int64_t sorted[1024];
    for (int64_t j = 0; j < k; j++) {
      /* the v-th value not drawn yet: sequential sampling without replacement */
      int64_t v = (int64_t)(mix64(seed ^ mix64((uint64_t)r * 0x9e3779b97f4a7c15ULL + (uint64_t)j)) % (uint64_t)(nv - j));
      int64_t pos = 0;
      while (pos < j && sorted[pos] <= v) {
        v++;
        pos++;
      }
      for (int64_t q = j; q > pos; q--) sorted[q] = sorted[q - 1];
      sorted[pos] = v;
      if (t->dtype == TIDE_I64) ((int64_t *)t->data)[r * k + j] = v;
      else ((int32_t *)t->data)[r * k + j] = (int32_t)v;
    }
  }
  return TIDE_OK;
}
