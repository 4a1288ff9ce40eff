/* ops_avx2.c - AVX2/FMA variants of the row kernels in ops_kernels.h.
 * Elementwise kernels (scale_row, wsum, post, combine, round, bf16_row) do
 * the same f32 operations in the same order as the references (mul then add,
 * never fused), so they match them bit for bit; sumsq sums in double in four
 * lanes; mix keeps 8-lane f32 partial sums; swiglu uses a polynomial e^x
 * within about 1 ulp of expf. Tails run the scalar formula of the reference. */
#include <immintrin.h>
#include <math.h>

#include "ops_kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* fully unroll a loop of constant trip count, so that arrays of vectors
 * indexed by its counter live in registers */
#define UNROLL _Pragma("GCC unroll 16")

/* lanes 0..rem-1 set, for masked loads of a tail of rem < 8 floats */
static const int32_t tail_mask_src[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
ALWAYS_INLINE __m256i tail_mask(int64_t rem) { return _mm256_loadu_si256((const __m256i *)(tail_mask_src + 8 - rem)); }

/* Round to bf16 precision, nearest even; NaN kept (quieted), as tide_bf16r. */
ALWAYS_INLINE __m256 round_bf16_ps(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

/* The one horizontal reduction used for every 8-lane sum: (i + i+4), then
 * (0+2, 1+3), then (0 + 1). */
ALWAYS_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

ALWAYS_INLINE __m256 bf16x8(const uint16_t *p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* e^x for the SwiGLU: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a
 * degree-7 polynomial (Cephes expf coefficients), times 2^n built from the
 * exponent bits as 2^(n-1) * 2 so that n = 128 still fits. x above
 * 88.7228 gives +inf like expf; below -87 the result is 0 or tiny (it only
 * ever meets 1 + e^x there). NaN inputs do not occur (the gate is clamped
 * with a NaN-absorbing min first). */
ALWAYS_INLINE __m256 exp_ps(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.72283935546875f), lo = _mm256_set1_ps(-87.0f);
  __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  __m256 xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  __m256 v = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(2.0f));
  return _mm256_blendv_ps(v, _mm256_set1_ps(INFINITY), over);
}

/* ---- sums of squares, in double ---- */
static double sumsq_avx2(const float *x, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
    __m256d v0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), v1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(w)), w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1));
    a0 = _mm256_fmadd_pd(v0, v0, a0);
    a1 = _mm256_fmadd_pd(v1, v1, a1);
    a2 = _mm256_fmadd_pd(w0, w0, a2);
    a3 = _mm256_fmadd_pd(w1, w1, a3);
  }
  __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  double acc = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
  for (; i < n; i++) acc += (double)x[i] * x[i];
  return acc;
}

/* ---- y = (x * r) * w ---- */
static void scale_row_avx2(float *y, const float *x, float r, const void *w, int wkind, int64_t n, int round) {
  __m256 rv = _mm256_set1_ps(r);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), rv);
    if (wkind == TIDE_OPSW_F32) v = _mm256_mul_ps(v, _mm256_loadu_ps((const float *)w + i));
    else if (wkind == TIDE_OPSW_BF16) v = _mm256_mul_ps(v, bf16x8((const uint16_t *)w + i));
    _mm256_storeu_ps(y + i, round ? round_bf16_ps(v) : v);
  }
  for (; i < n; i++) {
    float v = x[i] * r;
    if (wkind == TIDE_OPSW_F32) v = v * ((const float *)w)[i];
    else if (wkind == TIDE_OPSW_BF16) v = v * tide_bf16f(((const uint16_t *)w)[i]);
    y[i] = round ? tide_round_bf16(v) : v;
  }
}

/* ---- the mixing product: NT tokens x NR rows of fn per tile ----
 * Accumulator (t, r) sees exactly fma(z_t[k..k+7], fn_r[k..k+7], acc) for k
 * = 0, 8, 16, ... then the masked tail, then hsum: the same sequence for any
 * tile shape, so a token's values do not depend on its neighbours. */
ALWAYS_INLINE void mix_tile(float *m, int64_t ldm, const float *z, int64_t ldz, const float *fn, int64_t ldf,
                            int64_t n, const int NT, const int NR) {
  __m256 acc[2][8];
  UNROLL for (int t = 0; t < NT; t++)
    UNROLL for (int r = 0; r < NR; r++) acc[t][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256 zv[2];
    UNROLL for (int t = 0; t < NT; t++) zv[t] = _mm256_loadu_ps(z + t * ldz + k);
    UNROLL for (int r = 0; r < NR; r++) {
      __m256 f = _mm256_loadu_ps(fn + r * ldf + k);
      UNROLL for (int t = 0; t < NT; t++) acc[t][r] = _mm256_fmadd_ps(zv[t], f, acc[t][r]);
    }
  }
  if (k < n) {
    __m256i mk = tail_mask(n - k);
    __m256 zv[2];
    UNROLL for (int t = 0; t < NT; t++) zv[t] = _mm256_maskload_ps(z + t * ldz + k, mk);
    UNROLL for (int r = 0; r < NR; r++) {
      __m256 f = _mm256_maskload_ps(fn + r * ldf + k, mk);
      UNROLL for (int t = 0; t < NT; t++) acc[t][r] = _mm256_fmadd_ps(zv[t], f, acc[t][r]);
    }
  }
  UNROLL for (int t = 0; t < NT; t++)
    UNROLL for (int r = 0; r < NR; r++) m[t * ldm + r] = hsum(acc[t][r]);
}

static void mix_2x4(float *m, int64_t ldm, const float *z, int64_t ldz, const float *fn, int64_t ldf, int64_t n) {
  mix_tile(m, ldm, z, ldz, fn, ldf, n, 2, 4);
}
static void mix_2x1(float *m, int64_t ldm, const float *z, int64_t ldz, const float *fn, int64_t ldf, int64_t n) {
  mix_tile(m, ldm, z, ldz, fn, ldf, n, 2, 1);
}
static void mix_1x8(float *m, int64_t ldm, const float *z, int64_t ldz, const float *fn, int64_t ldf, int64_t n) {
  mix_tile(m, ldm, z, ldz, fn, ldf, n, 1, 8);
}
static void mix_1x4(float *m, int64_t ldm, const float *z, int64_t ldz, const float *fn, int64_t ldf, int64_t n) {
  mix_tile(m, ldm, z, ldz, fn, ldf, n, 1, 4);
}
static void mix_1x1(float *m, int64_t ldm, const float *z, int64_t ldz, const float *fn, int64_t ldf, int64_t n) {
  mix_tile(m, ldm, z, ldz, fn, ldf, n, 1, 1);
}

static void mix_avx2(float *m, int64_t ldm, const float *z, int64_t ldz, int nt, const float *fn, int64_t ldf, int nr,
                     int64_t n) {
  int t = 0;
  for (; t + 2 <= nt; t += 2) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) mix_2x4(m + t * ldm + r, ldm, z + t * ldz, ldz, fn + r * ldf, ldf, n);
    for (; r < nr; r++) mix_2x1(m + t * ldm + r, ldm, z + t * ldz, ldz, fn + r * ldf, ldf, n);
  }
  for (; t < nt; t++) {
    int r = 0;
    for (; r + 8 <= nr; r += 8) mix_1x8(m + t * ldm + r, ldm, z + t * ldz, ldz, fn + r * ldf, ldf, n);
    for (; r + 4 <= nr; r += 4) mix_1x4(m + t * ldm + r, ldm, z + t * ldz, ldz, fn + r * ldf, ldf, n);
    for (; r < nr; r++) mix_1x1(m + t * ldm + r, ldm, z + t * ldz, ldz, fn + r * ldf, ldf, n);
  }
}

/* ---- y = sum_i c_i X_i ---- */
ALWAYS_INLINE void wsum_hc(float *y, const float *X, const float *c, const int hc, int64_t d, int round) {
  __m256 cv[TIDE_HC_MAX];
  UNROLL for (int i = 0; i < hc; i++) cv[i] = _mm256_set1_ps(c[i]);
  int64_t k = 0;
  for (; k + 8 <= d; k += 8) {
    __m256 acc = _mm256_mul_ps(cv[0], _mm256_loadu_ps(X + k));
    UNROLL for (int i = 1; i < hc; i++) acc = _mm256_add_ps(acc, _mm256_mul_ps(cv[i], _mm256_loadu_ps(X + i * d + k)));
    _mm256_storeu_ps(y + k, round ? round_bf16_ps(acc) : acc);
  }
  for (; k < d; k++) {
    float acc = c[0] * X[k];
    UNROLL for (int i = 1; i < hc; i++) acc = acc + c[i] * X[i * d + k];
    y[k] = round ? tide_round_bf16(acc) : acc;
  }
}

static void wsum_avx2(float *y, const float *X, const float *c, int hc, int64_t d, int round) {
  switch (hc) {
    case 2: wsum_hc(y, X, c, 2, d, round); break;
    case 3: wsum_hc(y, X, c, 3, d, round); break;
    case 4: wsum_hc(y, X, c, 4, d, round); break;
    case 5: wsum_hc(y, X, c, 5, d, round); break;
    case 6: wsum_hc(y, X, c, 6, d, round); break;
    case 7: wsum_hc(y, X, c, 7, d, round); break;
    default: wsum_hc(y, X, c, 8, d, round); break;
  }
}

/* ---- out_j = post_j a + sum_i comb_ij X_i (in place allowed) ---- */
ALWAYS_INLINE void post_hc(float *out, const float *a, const float *X, const float *post, const float *comb,
                           const int hc, int64_t d, int round) {
  int64_t k = 0;
  for (; k + 8 <= d; k += 8) {
    __m256 xv[TIDE_HC_MAX], res[TIDE_HC_MAX];
    __m256 av = _mm256_loadu_ps(a + k);
    UNROLL for (int i = 0; i < hc; i++) xv[i] = _mm256_loadu_ps(X + i * d + k);
    UNROLL for (int j = 0; j < hc; j++) {
      __m256 acc = _mm256_mul_ps(_mm256_broadcast_ss(post + j), av);
      UNROLL for (int i = 0; i < hc; i++) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_broadcast_ss(comb + i * hc + j), xv[i]));
      res[j] = round ? round_bf16_ps(acc) : acc;
    }
    UNROLL for (int j = 0; j < hc; j++) _mm256_storeu_ps(out + j * d + k, res[j]);
  }
  for (; k < d; k++) {
    float col[TIDE_HC_MAX];
    UNROLL for (int j = 0; j < hc; j++) {
      float acc = post[j] * a[k];
      UNROLL for (int i = 0; i < hc; i++) acc = acc + comb[i * hc + j] * X[i * d + k];
      col[j] = round ? tide_round_bf16(acc) : acc;
    }
    UNROLL for (int j = 0; j < hc; j++) out[j * d + k] = col[j];
  }
}

static void post_avx2(float *out, const float *a, const float *X, const float *post, const float *comb, int hc,
                      int64_t d, int round) {
  switch (hc) {
    case 2: post_hc(out, a, X, post, comb, 2, d, round); break;
    case 3: post_hc(out, a, X, post, comb, 3, d, round); break;
    case 4: post_hc(out, a, X, post, comb, 4, d, round); break;
    case 5: post_hc(out, a, X, post, comb, 5, d, round); break;
    case 6: post_hc(out, a, X, post, comb, 6, d, round); break;
    case 7: post_hc(out, a, X, post, comb, 7, d, round); break;
    default: post_hc(out, a, X, post, comb, 8, d, round); break;
  }
}

/* ---- SwiGLU ---- */
static void swiglu_avx2(float *h, const float *g, const float *u, int64_t n, float lim, int round) {
  __m256 lv = _mm256_set1_ps(lim), nlv = _mm256_set1_ps(-lim), one = _mm256_set1_ps(1.0f);
  __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    /* operand order as fminf/fmaxf: a NaN input yields the limit */
    __m256 gv = _mm256_min_ps(_mm256_loadu_ps(g + i), lv);
    __m256 uv = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(u + i), nlv), lv);
    __m256 e = exp_ps(_mm256_xor_ps(gv, sign));
    __m256 v = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv);
    _mm256_storeu_ps(h + i, round ? round_bf16_ps(v) : v);
  }
  for (; i < n; i++) {
    float gv = fminf(g[i], lim);
    float uv = fminf(fmaxf(u[i], -lim), lim);
    float v = gv / (1.0f + expf(-gv)) * uv;
    h[i] = round ? tide_round_bf16(v) : v;
  }
}

/* ---- MoE combine ---- */
static void combine_avx2(float *out, const float *const *ys, const float *w, int k, const float *shared, int64_t d,
                         int round) {
  int64_t j = 0;
  for (; j + 8 <= d; j += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_set1_ps(w[0]), _mm256_loadu_ps(ys[0] + j));
    for (int i = 1; i < k; i++) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(w[i]), _mm256_loadu_ps(ys[i] + j)));
    if (shared) acc = _mm256_add_ps(acc, _mm256_loadu_ps(shared + j));
    _mm256_storeu_ps(out + j, round ? round_bf16_ps(acc) : acc);
  }
  for (; j < d; j++) {
    float acc = w[0] * ys[0][j];
    for (int i = 1; i < k; i++) acc = acc + w[i] * ys[i][j];
    if (shared) acc = acc + shared[j];
    out[j] = round ? tide_round_bf16(acc) : acc;
  }
}

static void round_avx2(float *x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, round_bf16_ps(_mm256_loadu_ps(x + i)));
  for (; i < n; i++) x[i] = tide_round_bf16(x[i]);
}

static void bf16_row_avx2(float *y, const uint16_t *x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, bf16x8(x + i));
  for (; i < n; i++) y[i] = tide_bf16f(x[i]);
}

const tide_ops_kernels tide_ops_avx2 = {
    .sumsq = sumsq_avx2,
    .scale_row = scale_row_avx2,
    .mix = mix_avx2,
    .wsum = wsum_avx2,
    .post = post_avx2,
    .swiglu = swiglu_avx2,
    .combine = combine_avx2,
    .round = round_avx2,
    .bf16_row = bf16_row_avx2,
};
