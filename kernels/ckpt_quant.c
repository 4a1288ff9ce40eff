/* ckpt_quant.c - scalar references of the checkpoint writer's kernels
 * (ckpt_quant.h): written for reading against the rules in
 * tide/checkpoint.h; the AVX2 variants must match them byte for byte. */
#include <math.h>

#include "ckpt_quant.h"
#include "tide_internal.h"

static uint8_t ref_fp8_block(uint8_t *q, int64_t ldq, const float *x, int64_t ldx, int rows, int cols) {
  float amax = 0.0f;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      float a = fabsf(x[r * ldx + c]);
      if (a > amax) amax = a; /* NaN never compares greater: ignored */
    }
  int e = tide_ckq_scale_exp(amax / 448.0f);
  float inv = tide_ckq_pow2(-e);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) q[r * ldq + c] = tide_f32_to_f8e4m3(x[r * ldx + c] * inv);
  return (uint8_t)(e + 127);
}

static void ref_mxfp4(uint8_t *q, uint8_t *scales, const float *x, int64_t n) {
  for (int64_t b = 0; b < n / 32; b++) {
    const float *v = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) {
      float a = fabsf(v[i]);
      if (a > amax) amax = a;
    }
    int e = tide_ckq_scale_exp(amax / 6.0f);
    float inv = tide_ckq_pow2(-e);
    for (int m = 0; m < 16; m++) {
      uint8_t lo = tide_f32_to_fp4(v[2 * m] * inv), hi = tide_f32_to_fp4(v[2 * m + 1] * inv);
      q[16 * b + m] = (uint8_t)(lo | (hi << 4));
    }
    scales[b] = (uint8_t)(e + 127);
  }
}

static void ref_uniform(float *dst, int64_t n, uint32_t key, uint32_t lo, float mean, float half) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t h = tide_ckq_hash(lo + (uint32_t)i, key);
    float u = (float)((int32_t)(h >> 8) - 8388608) * (1.0f / 8388608.0f);
    float t = u * half; /* two statements: never contracted into an FMA */
    dst[i] = t + mean;
  }
}

const tide_ckq_kernels tide_ckq_ref = {ref_fp8_block, ref_mxfp4, ref_uniform};

const tide_ckq_kernels *tide_ckq_kernels_get(void) {
#if defined(__x86_64__)
  if (tide_use_avx2()) return &tide_ckq_avx2;
#endif
  return &tide_ckq_ref;
}
