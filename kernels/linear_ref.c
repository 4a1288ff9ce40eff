/* linear_ref.c - the scalar reference for y = x . W^T in every weight
 * format: dequantise one weight element at a time, accumulate in double. */
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
      return tide_f8e4m3_to_f32(w[n * l->k + k]) * tide_e8m0_to_f32(s[(n / 128) * kb + k / 128]);
    }
    case TIDE_W_MXFP4: {
      const uint8_t *s = l->scale.data;
      uint8_t byte = w[n * (l->k / 2) + k / 2];
      uint8_t code = (k & 1) ? (byte >> 4) : (byte & 15);
      return tide_fp4_to_f32(code) * tide_e8m0_to_f32(s[n * (l->k / 32) + k / 32]);
    }
  }
  return 0.0f;
}

void tide_linear_ref(const struct tide_linear *l, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t m) {
  int64_t N = l->n, K = l->k;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * K * m > (1 << 20))
#endif
  for (int64_t n = 0; n < N; n++) {
    for (int64_t i = 0; i < m; i++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++) acc += (double)x[i * ldx + k] * (double)tide_linear_weight_at(l, n, k);
      y[i * ldy + n] = (float)acc;
    }
  }
}
