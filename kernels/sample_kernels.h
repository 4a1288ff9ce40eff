/* sample_kernels.h - the passes over a logits row that sampling makes on
 * every token: a scan for the range and for NaN/+inf, exp with a sum, block
 * sums for the draw, and a search for the next value above a threshold.
 * Scalar references in sample_ref.c, AVX2 variants in x86/sample_avx2.c;
 * both give the same bits for every input (tested), so the TIDE_REF switch
 * never changes which token a seed draws.
 * Shapes: n contiguous f32 values, no alignment required. */
#ifndef TIDE_KERNELS_SAMPLE_H
#define TIDE_KERNELS_SAMPLE_H

#include <stdint.h>

/* exp(x) below this argument is flushed to 0 (e^-86 ~ 4.5e-38 is still a
 * normal float, so neither path meets subnormals). */
#define TIDE_EXP_FLUSH (-86.0f)

typedef struct tide_sample_kernels {
  /* Over x[0..n): *max = the largest non-NaN value (-inf if none), *min =
   * the smallest value above -inf (+inf if none), both with -0 read as +0.
   * Returns how many values are NaN or +inf. */
  int64_t (*scan)(const float *x, int64_t n, float *max, float *min);
  /* scan, and copy x into dst on the way (one pass instead of two). */
  int64_t (*scan_copy)(float *dst, const float *x, int64_t n, float *max, float *min);
  /* p[i] = exp(x[i] - m) (p may be NULL: nothing stored; x[i] <= m assumed).
   * Returns the sum of those values in double: value i goes to lane i % 8,
   * lanes are combined as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
  double (*expsum)(float *p, const float *x, int64_t n, float m);
  /* bsum[b] = the sum of p[64b .. 64b+63] (the last block may be short) in
   * double, with the lanes and combination of expsum inside each block.
   * Returns the sum of bsum[] in block order. */
  double (*blocksum)(const float *p, int64_t n, double *bsum);
  /* The first i in [i0, n) with x[i] > t (ge = 0) or x[i] >= t (ge = 1), or n. */
  int64_t (*find)(const float *x, int64_t i0, int64_t n, float t, int ge);
  /* How many x[i] >= t. */
  int64_t (*count_ge)(const float *x, int64_t n, float t);
  /* Stable in-place compaction of the pairs (id[i], x[i]): position i stays
   * when "i is in the prefix bounded by (kt, it)" equals keep_in, where in
   * the prefix means key[i] > kt || (key[i] == kt && id[i] <= it). key may
   * be x itself. Returns how many stay; *low = how many of them had i < s. */
  int64_t (*compact)(int32_t *id, float *x, const float *key, int64_t n, float kt, int32_t it, int keep_in,
                     int64_t s, int64_t *low);
  /* out[i] = histogram bucket of x[i] <= kmax: (int)min((kmax - x) * scale,
   * nb - 0.5) plus 1 when x is -inf (so -inf has the bucket nb). */
  void (*buckets)(uint16_t *out, const float *x, int64_t n, float kmax, float scale, int nb);
  /* pos[0..k) = every i with b[i] == v, increasing; returns k. */
  int64_t (*collect)(int32_t *pos, const uint16_t *b, int64_t n, uint16_t v);
  /* p[i] *= s */
  void (*scale)(float *p, int64_t n, float s);
  /* p[i] /= s (a division, as llama.cpp's temperature) */
  void (*divide)(float *p, int64_t n, float s);
  /* id[i] = i */
  void (*iota)(int32_t *id, int64_t n);
} tide_sample_kernels;

/* The active table (AVX2 when available and TIDE_REF is not set). */
const tide_sample_kernels *tide_sample_kernels_get(void);
extern const tide_sample_kernels tide_sample_ref;
#if defined(__x86_64__)
extern const tide_sample_kernels tide_sample_avx2;
#endif

/* The scalar exp both paths compute (exported for the tests). */
float tide_sample_exp_ref(float x);

/* Constants of that exp: Cody-Waite split of ln 2 and the Cephes expf
 * polynomial for exp(r) - 1 - r on [-ln2/2, ln2/2]. */
#define TIDE_EXP_LOG2E 1.44269504088896341f
#define TIDE_EXP_LN2_HI 0.693359375f
#define TIDE_EXP_LN2_LO (-2.12194440e-4f)
#define TIDE_EXP_P0 1.9875691500e-4f
#define TIDE_EXP_P1 1.3981999507e-3f
#define TIDE_EXP_P2 8.3334519073e-3f
#define TIDE_EXP_P3 4.1665795894e-2f
#define TIDE_EXP_P4 1.6666665459e-1f
#define TIDE_EXP_P5 5.0000001201e-1f

#endif
