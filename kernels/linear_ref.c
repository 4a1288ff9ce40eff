/* linear_ref.c - scalar references for y = x . W^T in every weight format:
 * dequantise one weight element at a time (the dequant.h semantics) and
 * accumulate in double; and a scalar model of the invariant dot form that
 * the AVX2 kernels must match bit for bit. */
#include <math.h>

#include "convert.h"
#include "linear.h"

float tide_linear_weight_at(const struct tide_linear *l, int64_t n, int64_t k) {
  const uint8_t *w = l->w.data;
  switch (l->fmt) {
    case TIDE_W_F32: return ((const float *)w)[n * l->k + k];
    case TIDE_W_BF16: return tide_bf16_to_f32(((const uint16_t *)w)[n * l->k + k]);
    case TIDE_W_F16: return tide_f16_to_f32(((const uint16_t *)w)[n * l->k + k]);
    case TIDE_W_FP8: {
      const uint8_t *s = l->scale.data;
      int64_t kb = l->scale.sizes[1];
      return tide_dequant_fp8_at(w[n * l->k + k], s[(n / 128) * kb + k / 128]);
    }
    case TIDE_W_MXFP4: {
      const uint8_t *s = l->scale.data;
      uint8_t byte = w[n * (l->k / 2) + k / 2];
      uint8_t code = (k & 1) ? (byte >> 4) : (byte & 15);
      return tide_dequant_fp4_at(code, s[n * (l->k / 32) + k / 32]);
    }
  }
  return 0.0f;
}

void tide_linear_ref_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const float *x, int64_t ldx, float *y,
                          int64_t ldy, int64_t m, int flags) {
  int64_t K = l->k;
  for (int64_t j = 0; j < nr; j++) {
    for (int64_t i = 0; i < m; i++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++) acc += (double)x[i * ldx + k] * (double)tide_linear_weight_at(l, r0 + j, k);
      tide_linear_store(&y[i * ldy + j], (float)acc, flags);
    }
  }
}

void tide_linear_ref(const struct tide_linear *l, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t m) {
  int64_t N = l->n;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * l->k * m > (1 << 20))
#endif
  for (int64_t n = 0; n < N; n++) tide_linear_ref_rows(l, n, 1, x, ldx, y + n, ldy, m, 0);
}

void tide_linear_dot_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const float *x, int64_t ldx, float *y,
                          int64_t ldy, int64_t m, int flags) {
  int64_t K = l->k;
  for (int64_t j = 0; j < nr; j++) {
    for (int64_t i = 0; i < m; i++) {
      float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t g = 0; g < K; g += 8)
        for (int q = 0; q < 8; q++) {
          int64_t k = g + q;
          float xv = k < K ? x[i * ldx + k] : 0.0f, wv = k < K ? tide_linear_weight_at(l, r0 + j, k) : 0.0f;
          lane[q] = fmaf(xv, wv, lane[q]);
        }
      float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
      tide_linear_store(&y[i * ldy + j], s, flags);
    }
  }
}
