/* dequant.c - scalar references of the weight decoders (the semantics in
 * dequant.h), the panel decoder the linear kernels use, and the public
 * tide_dequant. */
#include <stdio.h>

#include "convert.h"
#include "dequant.h"

static inline float u2f(uint32_t u) {
  union { uint32_t u; float f; } v = {u};
  return v.f;
}

float tide_dequant_fp8_at(uint8_t code, uint8_t scale) {
  if (scale == 0xff) return u2f(0x7fc00000u);
  float v = tide_f8e4m3_to_f32(code);
  if ((code & 0x7f) == 0x7f) return v; /* NaN with the code's sign */
  return v * tide_e8m0_to_f32(scale);
}

float tide_dequant_fp4_at(uint8_t code, uint8_t scale) {
  if (scale == 0xff) return u2f(0x7fc00000u);
  return tide_fp4_to_f32(code) * tide_e8m0_to_f32(scale);
}

static void ref_fp8(float *d, const uint8_t *w, const uint8_t *s, int64_t k0, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = tide_dequant_fp8_at(w[k0 + i], s[(k0 + i) / 128]);
}

static void ref_mxfp4(float *d, const uint8_t *w, const uint8_t *s, int64_t k0, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    int64_t k = k0 + i;
    uint8_t b = w[k / 2];
    d[i] = tide_dequant_fp4_at((k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15), s[k / 32]);
  }
}

static void ref_i32(float *d, const int32_t *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
}

static void ref_i64(float *d, const int64_t *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
}

const tide_dequant_kernels tide_dequant_ref = {ref_fp8, ref_mxfp4, ref_i32, ref_i64};

const tide_dequant_kernels *tide_dequant_kernels_get(void) {
#if defined(__x86_64__)
  if (tide_use_avx2()) return &tide_dequant_avx2;
#endif
  return &tide_dequant_ref;
}

/* One row segment of any format; the plain formats go through the
 * conversion kernels of the matching table (reference or AVX2). */
static void decode_row(float *d, const tide_wview *v, int64_t r, int64_t k0, int64_t nk, const tide_dequant_kernels *kt,
                       const tide_convert_kernels *ck) {
  const uint8_t *row = v->w + r * v->row_bytes;
  switch (v->fmt) {
    case TIDE_W_F32: memcpy(d, (const float *)row + k0, (size_t)nk * 4); break;
    case TIDE_W_BF16: ck->bf16_to_f32(d, (const uint16_t *)row + k0, nk); break;
    case TIDE_W_F16: ck->f16_to_f32(d, (const uint16_t *)row + k0, nk); break;
    case TIDE_W_FP8: kt->fp8(d, row, v->s + (r / 128) * v->s_ld, k0, nk); break;
    case TIDE_W_MXFP4: kt->mxfp4(d, row, v->s + r * v->s_ld, k0, nk); break;
    case TIDE_DQ_I32: kt->i32(d, (const int32_t *)row + k0, nk); break;
    case TIDE_DQ_I64: kt->i64(d, (const int64_t *)row + k0, nk); break;
  }
}

void tide_dequant_block(float *dst, int64_t ldd, const tide_wview *v, int64_t r0, int64_t nr, int64_t k0, int64_t nk,
                        int64_t pad, const tide_dequant_kernels *kt) {
  const tide_convert_kernels *ck = kt == &tide_dequant_ref ? &tide_convert_ref : tide_convert_kernels_get();
  for (int64_t i = 0; i < nr; i++) {
    float *d = dst + i * ldd;
    decode_row(d, v, r0 + i, k0, nk, kt, ck);
    for (int64_t j = nk; j < pad; j++) d[j] = 0.0f;
  }
}

/* ---- public entry ---- */

int tide_dequant(tide_tensor *out, const tide_tensor *w, const tide_tensor *scale, int64_t row0) {
  TIDE_CHECK(tide_check_tensor(__func__, "w", w, 0, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, TIDE_DT(TIDE_F32), -1));
  if (!tide_tensor_is_contiguous(w)) return TIDE_ERR(TIDE_E_INVALID, "w must be contiguous");
  if (out->readonly) return TIDE_ERR(TIDE_E_INVALID, "out is read-only");
  char a[96], b[96];
  tide_wview v = {0};
  int64_t last = w->ndim ? w->sizes[w->ndim - 1] : 1;
  int64_t numel = tide_tensor_numel(w);
  v.w = w->data;
  v.k = last;
  v.rows = last ? numel / last : 0;
  int needs_scale = 0;
  switch (w->dtype) {
    case TIDE_F32: v.fmt = TIDE_W_F32; break;
    case TIDE_BF16: v.fmt = TIDE_W_BF16; break;
    case TIDE_F16: v.fmt = TIDE_W_F16; break;
    case TIDE_I32: v.fmt = TIDE_DQ_I32; break;
    case TIDE_I64: v.fmt = TIDE_DQ_I64; break;
    case TIDE_F8E4M3: v.fmt = TIDE_W_FP8; needs_scale = 1; break;
    case TIDE_I8: case TIDE_U8: v.fmt = TIDE_W_MXFP4; needs_scale = 1; v.k = 2 * last; break;
    default:
      return TIDE_ERR(TIDE_E_UNSUPPORTED, "cannot dequantise %s weights (f32, bf16, f16, f8e4m3 + scale, i8/u8 MXFP4 "
                      "+ scale, i32, i64)", tide_dtype_name(w->dtype));
  }
  v.row_bytes = last * (tide_dtype_bits(w->dtype) / 8);
  if (needs_scale) {
    const char *fname = v.fmt == TIDE_W_FP8 ? "FP8" : "MXFP4";
    if (w->ndim != 2)
      return TIDE_ERR(TIDE_E_INVALID, "%s weight %s must be 2-d [N, %s]", fname, tide_shape_str(w, a, sizeof a),
                      v.fmt == TIDE_W_FP8 ? "K" : "K/2");
    if (!scale || !scale->data) return TIDE_ERR(TIDE_E_INVALID, "%s weight %s needs a scale tensor", fname,
                                               tide_shape_str(w, a, sizeof a));
    TIDE_CHECK(tide_check_tensor(__func__, "scale", scale, TIDE_DT(TIDE_E8M0) | TIDE_DT(TIDE_U8), 2));
    if (!tide_tensor_is_contiguous(scale)) return TIDE_ERR(TIDE_E_INVALID, "scale must be contiguous");
    int64_t sr = v.fmt == TIDE_W_FP8 ? (v.rows + 127) / 128 : v.rows;
    int64_t sc = v.fmt == TIDE_W_FP8 ? (v.k + 127) / 128 : v.k / 32;
    if (v.fmt == TIDE_W_MXFP4 && v.k % 32)
      return TIDE_ERR(TIDE_E_INVALID, "MXFP4 weight has K = %lld inputs, not a multiple of 32", (long long)v.k);
    if (scale->sizes[0] != sr || scale->sizes[1] != sc)
      return TIDE_ERR(TIDE_E_INVALID, "scale has shape %s, expected [%lld, %lld] for a %s weight of %lld x %lld",
                      tide_shape_str(scale, a, sizeof a), (long long)sr, (long long)sc, fname, (long long)v.rows,
                      (long long)v.k);
    v.s = scale->data;
    v.s_ld = sc;
  } else if (scale && scale->data) {
    return TIDE_ERR(TIDE_E_INVALID, "a %s tensor takes no scale", tide_dtype_name(w->dtype));
  }
  /* out: [K] (one row) or [R, K] with contiguous rows */
  if (out->ndim < 1 || out->ndim > 2 || out->sizes[out->ndim - 1] != v.k || out->strides[out->ndim - 1] != 1)
    return TIDE_ERR(TIDE_E_INVALID, "out %s must be [R, %lld] (or [%lld]) f32 with contiguous rows for w %s",
                    tide_shape_str(out, a, sizeof a), (long long)v.k, (long long)v.k, tide_shape_str(w, b, sizeof b));
  int64_t R = out->ndim == 2 ? out->sizes[0] : 1, ld = out->ndim == 2 ? out->strides[0] : v.k;
  if (row0 < 0 || row0 + R > v.rows)
    return TIDE_ERR(TIDE_E_RANGE, "rows %lld..%lld outside the %lld rows of w %s", (long long)row0,
                    (long long)(row0 + R - 1), (long long)v.rows, tide_shape_str(w, a, sizeof a));
  if (R == 0 || v.k == 0) return TIDE_OK;
  const tide_dequant_kernels *kt = tide_dequant_kernels_get();
  float *dst = out->data;
  /* rows are independent, so any split gives the same bytes */
  const int64_t chunk = v.k >= 4096 ? 4 : (16384 + v.k - 1) / v.k;
  int64_t nchunks = (R + chunk - 1) / chunk;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (R * v.k >= (1 << 18))
#endif
  for (int64_t c = 0; c < nchunks; c++) {
    int64_t r = c * chunk, nr = R - r < chunk ? R - r : chunk;
    tide_dequant_block(dst + r * ld, ld, &v, row0 + r, nr, 0, v.k, 0, kt);
  }
  return TIDE_OK;
}
