/* ckpt_quant.h - kernels of the checkpoint writer: FP8 128x128 block and
 * MXFP4 quantisation of f32, and the counter-based uniform generator of
 * random weights. Scalar references (ckpt_quant.c) and AVX2 variants
 * (x86/ckpt_quant_avx2.c) give identical bytes; the exact rules are in
 * tide/checkpoint.h. Shapes: row-major f32 input, no alignment required. */
#ifndef TIDE_KERNELS_CKPT_QUANT_H
#define TIDE_KERNELS_CKPT_QUANT_H

#include <stdint.h>
#include <string.h>

typedef struct tide_ckq_kernels {
  /* Quantise a rows x cols block (x row stride ldx floats) to e4m3 codes (q
   * row stride ldq bytes) under one power-of-two scale; returns its e8m0 byte. */
  uint8_t (*fp8_block)(uint8_t *q, int64_t ldq, const float *x, int64_t ldx, int rows, int cols);
  /* Quantise n floats (n % 32 == 0) to n/2 bytes of e2m1 pairs (element 2m
   * in the low nibble of byte m) and n/32 e8m0 scales. */
  void (*mxfp4)(uint8_t *q, uint8_t *scales, const float *x, int64_t n);
  /* dst[i] = u * half + mean, u = the uniform in [-1, 1) of counter lo + i
   * under `key` (lo + n must not wrap past 2^32). */
  void (*uniform)(float *dst, int64_t n, uint32_t key, uint32_t lo, float mean, float half);
} tide_ckq_kernels;

const tide_ckq_kernels *tide_ckq_kernels_get(void);
extern const tide_ckq_kernels tide_ckq_ref;
#if defined(__x86_64__)
extern const tide_ckq_kernels tide_ckq_avx2;
#endif

/* e = ceil(log2 s) from the bits of s >= 0, clamped to [-127, 127]
 * (0 -> -127, inf/NaN -> 127): the exponent of the scale 2^e. */
static inline int tide_ckq_scale_exp(float s) {
  uint32_t u;
  memcpy(&u, &s, 4);
  if (u == 0 || (u & 0x80000000u)) return -127;
  if (u >= 0x7f800000u) return 127;
  int ex = (int)(u >> 23), e;
  if (ex == 0) e = u > 0x00400000u ? -126 : -127; /* subnormal: below 2^-126 */
  else e = ex - 127 + ((u & 0x7fffffu) != 0);
  return e < -127 ? -127 : e > 127 ? 127 : e;
}

/* 2^k as a float for k in [-127, 127] (2^-127 is subnormal). */
static inline float tide_ckq_pow2(int k) {
  uint32_t u = k >= -126 ? (uint32_t)(k + 127) << 23 : 0x00400000u;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The 32-bit counter hash behind the generator (murmur3's finaliser of a
 * golden-ratio step). */
static inline uint32_t tide_ckq_hash(uint32_t i, uint32_t key) {
  uint32_t x = i * 0x9e3779b9u + key;
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

#endif
