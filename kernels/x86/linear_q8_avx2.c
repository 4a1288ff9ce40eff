/* linear_q8_avx2.c - the int8-activation MXFP4 kernel (linear_q8.h) on AVX2.
 *
 * Per pair of blocks (64 weights, 32 bytes) of one row: one load, the low
 * and the high nibbles masked out (the even and the odd columns), each
 * looked up with vpshufb as the unsigned w + 12, then for each row of x two
 * vpmaddubsw against the stored x halves, one 16-bit add, vpmaddwd into 8
 * int32 lanes, the stored 12 * sum(q) subtracted (exact sum(w * q)), and two
 * float operations. About 14 vector operations per 64 weights at M = 1,
 * against about 48 for the exact f32 path, which is what makes the path
 * worth having on AVX2. Rows are processed in groups so each x pair, loaded
 * once per row of the group, feeds several accumulators. */
#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "linear_q8.h"

static inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

/* 32 values: nearest-even of x * id into qc, int8 in column order */
static inline void q8_round32(const float *xb, __m256 vid, int8_t *qc) {
  __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb), vid)),
          i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), vid)),
          i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), vid)),
          i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), vid));
  /* the packs work per 128-bit lane; the dword permutation puts the
   * 4-column groups back in order */
  __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i *)qc, p);
}

float tide_q8_span_avx2(const float *xb, int n, int8_t *qc) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 big = _mm256_set1_ps(FLT_MAX);
  __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int c = 0; c < n; c += 8) {
    __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + c), absmask);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ)); /* Inf/NaN: above FLT_MAX or unordered */
    mx = _mm256_max_ps(mx, a);
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float amax = _mm_cvtss_f32(h);
  float id = amax > 0 ? 127.0f / amax : 0.0f;
  int isbad = _mm256_movemask_ps(bad) != 0;
  if (isbad || !(id <= FLT_MAX)) {
    for (int c = 0; c < n; c += 32) _mm256_storeu_si256((__m256i *)(qc + c), _mm256_setzero_si256());
    return isbad ? NAN : 0.0f;
  }
  __m256 vid = _mm256_set1_ps(id);
  for (int c = 0; c < n; c += 32) q8_round32(xb + c, vid, qc + c);
  return amax / 127.0f;
}

void tide_q8_quantize_avx2(const float *x, int64_t ldx, int64_t m, int64_t K, const tide_q8_rows *out) {
  int64_t nb = K / 32, np = (nb + 1) / 2;
  for (int64_t i = 0; i < m; i++) {
    int8_t *qrow = (int8_t *)out->q + i * np * 64;
    int32_t *crow = (int32_t *)out->c + i * np * 8;
    float *drow = (float *)out->d + i * np * 8;
    for (int64_t b = 0; b < nb; b++) {
      int8_t qc[32];
      float d = tide_q8_span_avx2(x + i * ldx + b * 32, 32, qc);
      tide_q8_store_block(qc, d, b, qrow, crow, drow);
    }
    tide_q8_pad_row(nb, qrow, crow, drow);
  }
}

/* One pair of blocks (p) of RR weight rows against MR rows of x; last:
 * the pair holds one block only (K / 32 odd). */
static inline __attribute__((always_inline)) void q8_pair(const int MR, const int RR, const int last, const uint8_t *W,
                                                          const uint8_t *S, int64_t rb, int64_t nb, int64_t np,
                                                          int64_t p, const tide_q8_rows *x, const float *ws,
                                                          __m256 acc[4][4]) {
  const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16,
                                       18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
  for (int r = 0; r < RR; r++) {
    const uint8_t *wp = W + r * rb + p * 32;
    __m256i qw = last ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)wp))
                      : _mm256_loadu_si256((const __m256i *)wp);
    __m256i ulo = _mm256_shuffle_epi8(lut, _mm256_and_si256(qw, m4));
    __m256i uhi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(qw, 4), m4));
    __m128 dw0 = _mm_broadcast_ss(ws + S[r * nb + 2 * p]);
    __m128 dw1 = last ? _mm_setzero_ps() : _mm_broadcast_ss(ws + S[r * nb + 2 * p + 1]);
    __m256 dw = _mm256_insertf128_ps(_mm256_castps128_ps256(dw0), dw1, 1);
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const int8_t *xq = x->q + (i * np + p) * 64;
      __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(ulo, _mm256_loadu_si256((const __m256i *)xq)),
                                     _mm256_maddubs_epi16(uhi, _mm256_loadu_si256((const __m256i *)(xq + 32))));
      __m256i s32 = _mm256_sub_epi32(_mm256_madd_epi16(s16, ones),
                                     _mm256_loadu_si256((const __m256i *)(x->c + (i * np + p) * 8)));
      __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(s32), _mm256_loadu_ps(x->d + (i * np + p) * 8));
      acc[i][r] = _mm256_fmadd_ps(t, dw, acc[i][r]);
    }
  }
}

/* MR rows of x against RR weight rows starting at n. */
static inline __attribute__((always_inline)) void q8_group(const int MR, const int RR, const struct tide_linear *l,
                                                           int64_t n, const tide_q8_rows *x, float *y, int64_t ldy,
                                                           int flags) {
  const int64_t K = l->k, nb = K / 32, np = (nb + 1) / 2, rb = K / 2;
  const uint8_t *W = (const uint8_t *)l->w.data + n * rb, *S = (const uint8_t *)l->scale.data + n * nb;
  const float *ws = tide_q8_wscale();
  __m256 acc[4][4];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++) acc[i][r] = _mm256_setzero_ps();
  const int64_t full = nb / 2;
  for (int64_t p = 0; p < full; p++) {
    if ((p & 1) == 0)
#pragma GCC unroll 4
      for (int r = 0; r < RR; r++) _mm_prefetch((const char *)(W + (RR + r) * rb + p * 32), _MM_HINT_T0);
    q8_pair(MR, RR, 0, W, S, rb, nb, np, p, x, ws, acc);
  }
  if (nb & 1) q8_pair(MR, RR, 1, W, S, rb, nb, np, full, x, ws, acc);
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++) tide_linear_store(&y[i * ldy + r], hsum8(acc[i][r]), flags);
}

/* rows of x in passes of up to 4, weight rows in groups of RR(M) */
static void q8_pass(int64_t mr, const struct tide_linear *l, int64_t n, int64_t nr, const tide_q8_rows *x, float *y,
                    int64_t ldy, int flags) {
  int64_t j = 0;
  switch (mr) {
    case 1:
      for (; j + 4 <= nr; j += 4) q8_group(1, 4, l, n + j, x, y + j, ldy, flags);
      for (; j < nr; j++) q8_group(1, 1, l, n + j, x, y + j, ldy, flags);
      break;
    case 2:
      for (; j + 4 <= nr; j += 4) q8_group(2, 4, l, n + j, x, y + j, ldy, flags);
      for (; j < nr; j++) q8_group(2, 1, l, n + j, x, y + j, ldy, flags);
      break;
    case 3:
      for (; j + 3 <= nr; j += 3) q8_group(3, 3, l, n + j, x, y + j, ldy, flags);
      for (; j < nr; j++) q8_group(3, 1, l, n + j, x, y + j, ldy, flags);
      break;
    default:
      for (; j + 2 <= nr; j += 2) q8_group(4, 2, l, n + j, x, y + j, ldy, flags);
      for (; j < nr; j++) q8_group(4, 1, l, n + j, x, y + j, ldy, flags);
      break;
  }
}

/* ---- many rows of x (m > 8): decoded panels, K chunks ----
 *
 * For prefill the passes above decode every weight pair again for each
 * 4 rows of x and walk all of K per pass, so x streams from L2. Here a
 * chunk of Q8P_NC weight rows by Q8P_KC pairs is decoded once into ready
 * operands (the unsigned w + 12 halves and the lane factors, 96 bytes per
 * row and pair) for each block of up to Q8P_MB rows of x, and 4 x 2 tiles
 * of (x rows, weight rows) run over the chunk with their accumulators kept
 * in a small buffer between chunks. Every (row of x, row of W) still sees
 * the same operations on the same operands in the same pair order as
 * above (and as the scalar model): only the loop order differs, so the
 * bits are the same. (The int8-weight kernel below keeps its passes at
 * every m: its operands need no decoding, and the same tiling over it
 * measured no faster.) Stack use: the panel (24 KiB) and the accumulators
 * (16 KiB). */
enum { Q8P_NC = 32, Q8P_KC = 8, Q8P_MB = 16 };

/* decode rows [n, n + nn) of the MXFP4 weight, pairs [p0, p1), into P
 * (row stride Q8P_KC * 96 bytes) exactly as q8_pair builds its operands */
static void q8p_decode(const struct tide_linear *l, int64_t n, int64_t nn, int64_t p0, int64_t p1, uint8_t *P) {
  const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16,
                                       18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const int64_t K = l->k, nb = K / 32, rb = K / 2, full = nb / 2;
  const float *ws = tide_q8_wscale();
  for (int64_t r = 0; r < nn; r++) {
    const uint8_t *W = (const uint8_t *)l->w.data + (n + r) * rb, *S = (const uint8_t *)l->scale.data + (n + r) * nb;
    uint8_t *o = P + r * (Q8P_KC * 96);
    for (int64_t p = p0; p < p1; p++, o += 96) {
      const int last = p == full;
      __m256i qw = last ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(W + p * 32)))
                        : _mm256_loadu_si256((const __m256i *)(W + p * 32));
      _mm256_store_si256((__m256i *)o, _mm256_shuffle_epi8(lut, _mm256_and_si256(qw, m4)));
      _mm256_store_si256((__m256i *)(o + 32),
                         _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(qw, 4), m4)));
      __m128 dw0 = _mm_broadcast_ss(ws + S[2 * p]);
      __m128 dw1 = last ? _mm_setzero_ps() : _mm_broadcast_ss(ws + S[2 * p + 1]);
      _mm256_store_ps((float *)(o + 64), _mm256_insertf128_ps(_mm256_castps128_ps256(dw0), dw1, 1));
    }
  }
}

/* MR rows of x (row i at x + i) against RR panel rows over the chunk's
 * pairs [p0, p1); A: the accumulators (row i, weight row r at A + (i *
 * Q8P_NC + r) * 8), zero when first */
static inline __attribute__((always_inline)) void q8p_tile(const int MR, const int RR, const uint8_t *P, int64_t p0,
                                                           int64_t p1, const tide_q8_rows *x, int64_t np, float *A,
                                                           int first) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[4][2];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
    for (int r = 0; r < RR; r++)
      acc[i][r] = first ? _mm256_setzero_ps() : _mm256_load_ps(A + (i * Q8P_NC + r) * 8);
  for (int64_t p = p0; p < p1; p++) {
    const uint8_t *o = P + (p - p0) * 96;
#pragma GCC unroll 2
    for (int r = 0; r < RR; r++) {
      const uint8_t *wr = o + r * (Q8P_KC * 96);
      __m256i ulo = _mm256_load_si256((const __m256i *)wr), uhi = _mm256_load_si256((const __m256i *)(wr + 32));
      __m256 dw = _mm256_load_ps((const float *)(wr + 64));
#pragma GCC unroll 4
      for (int i = 0; i < MR; i++) {
        const int8_t *xq = x->q + (i * np + p) * 64;
        __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(ulo, _mm256_loadu_si256((const __m256i *)xq)),
                                       _mm256_maddubs_epi16(uhi, _mm256_loadu_si256((const __m256i *)(xq + 32))));
        __m256i s32 = _mm256_sub_epi32(_mm256_madd_epi16(s16, ones),
                                       _mm256_loadu_si256((const __m256i *)(x->c + (i * np + p) * 8)));
        __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(s32), _mm256_loadu_ps(x->d + (i * np + p) * 8));
        acc[i][r] = _mm256_fmadd_ps(t, dw, acc[i][r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
    for (int r = 0; r < RR; r++) _mm256_store_ps(A + (i * Q8P_NC + r) * 8, acc[i][r]);
}

static void q8p_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                     int64_t ldy, int64_t m, int flags) {
  const int64_t K = l->k, np = (K / 32 + 1) / 2;
  _Alignas(32) uint8_t P[Q8P_NC * Q8P_KC * 96];
  _Alignas(32) float A[Q8P_MB * Q8P_NC * 8];
  for (int64_t n0 = 0; n0 < nr; n0 += Q8P_NC) {
    const int64_t nn = nr - n0 < Q8P_NC ? nr - n0 : Q8P_NC;
    for (int64_t i0 = 0; i0 < m; i0 += Q8P_MB) {
      const int64_t mb = m - i0 < Q8P_MB ? m - i0 : Q8P_MB;
      for (int64_t p0 = 0; p0 < np; p0 += Q8P_KC) {
        const int64_t p1 = np - p0 < Q8P_KC ? np : p0 + Q8P_KC;
        q8p_decode(l, r0 + n0, nn, p0, p1, P);
        for (int64_t i = 0; i < mb; i += 4) {
          const int mr = (int)(mb - i < 4 ? mb - i : 4);
          tide_q8_rows xi = {x->q + (i0 + i) * np * 64, x->c + (i0 + i) * np * 8, x->d + (i0 + i) * np * 8};
          float *Ai = A + i * Q8P_NC * 8;
          for (int64_t r = 0; r < nn; r += 2) {
            const int rr = nn - r < 2 ? 1 : 2;
            const uint8_t *Pr = P + r * (Q8P_KC * 96);
            float *Ar = Ai + r * 8;
            switch (mr * 2 + rr) {
              case 3: q8p_tile(1, 1, Pr, p0, p1, &xi, np, Ar, p0 == 0); break;
              case 4: q8p_tile(1, 2, Pr, p0, p1, &xi, np, Ar, p0 == 0); break;
              case 5: q8p_tile(2, 1, Pr, p0, p1, &xi, np, Ar, p0 == 0); break;
              case 6: q8p_tile(2, 2, Pr, p0, p1, &xi, np, Ar, p0 == 0); break;
              case 7: q8p_tile(3, 1, Pr, p0, p1, &xi, np, Ar, p0 == 0); break;
              case 8: q8p_tile(3, 2, Pr, p0, p1, &xi, np, Ar, p0 == 0); break;
              case 9: q8p_tile(4, 1, Pr, p0, p1, &xi, np, Ar, p0 == 0); break;
              default: q8p_tile(4, 2, Pr, p0, p1, &xi, np, Ar, p0 == 0); break;
            }
          }
        }
      }
      for (int64_t i = 0; i < mb; i++)
        for (int64_t r = 0; r < nn; r++)
          tide_linear_store(&y[(i0 + i) * ldy + n0 + r], hsum8(_mm256_load_ps(A + (i * Q8P_NC + r) * 8)), flags);
    }
  }
}

void tide_linear_q8_avx2_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                              int64_t ldy, int64_t m, int flags) {
  if (m > 8) {
    q8p_rows(l, r0, nr, x, y, ldy, m, flags);
    return;
  }
  const int64_t K = l->k, np = (K / 32 + 1) / 2;
  /* weight rows in blocks of 64 so a block's bytes stay in L2 while every
   * pass of 4 rows of x goes over them (one pass when m <= 4) */
  for (int64_t n0 = 0; n0 < nr; n0 += 64) {
    int64_t nn = nr - n0 < 64 ? nr - n0 : 64;
    for (int64_t i = 0; i < m; i += 4) {
      tide_q8_rows xi = {x->q + i * np * 64, x->c + i * np * 8, x->d + i * np * 8};
      q8_pass(m - i < 4 ? m - i : 4, l, r0 + n0, nn, &xi, y + i * ldy + n0, ldy, flags);
    }
  }
}

/* ---- int8 weights (l->q8w) ---- */

static inline __attribute__((always_inline)) void q8w_pair(const int MR, const int RR, const int8_t *W,
                                                           const float *S, int64_t rq, int64_t np, int64_t p,
                                                           const tide_q8_rows *x, __m256 acc[4][4]) {
  const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
  for (int r = 0; r < RR; r++) {
    const int8_t *wp = W + r * rq + p * 64;
    __m256i wlo = _mm256_loadu_si256((const __m256i *)wp), whi = _mm256_loadu_si256((const __m256i *)(wp + 32));
    __m256i alo = _mm256_sign_epi8(wlo, wlo), ahi = _mm256_sign_epi8(whi, whi);
    __m256 dw = _mm256_broadcast_ss(S + r * np + p);
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const int8_t *xq = x->q + (i * np + p) * 64;
      /* |w| * (x with w's sign): at most 2 * 127 * 127 per 16-bit pair, no saturation */
      __m256i plo = _mm256_madd_epi16(
          _mm256_maddubs_epi16(alo, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xq), wlo)), ones);
      __m256i phi = _mm256_madd_epi16(
          _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + 32)), whi)), ones);
      __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(plo, phi)),
                               _mm256_loadu_ps(x->d + (i * np + p) * 8));
      acc[i][r] = _mm256_fmadd_ps(t, dw, acc[i][r]);
    }
  }
}

static inline __attribute__((always_inline)) void q8w_group(const int MR, const int RR, const struct tide_linear *l,
                                                            int64_t n, const tide_q8_rows *x, float *y, int64_t ldy,
                                                            int flags) {
  const int64_t K = l->k, np = (K / 32 + 1) / 2, rq = np * 64;
  const int8_t *W = l->q8w + n * rq;
  const float *S = l->q8s + n * np;
  __m256 acc[4][4];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++) acc[i][r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < np; p++) {
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++) _mm_prefetch((const char *)(W + (RR + r) * rq + p * 64), _MM_HINT_T0);
    q8w_pair(MR, RR, W, S, rq, np, p, x, acc);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++) tide_linear_store(&y[i * ldy + r], hsum8(acc[i][r]), flags);
}

static void q8w_pass(int64_t mr, const struct tide_linear *l, int64_t n, int64_t nr, const tide_q8_rows *x, float *y,
                     int64_t ldy, int flags) {
  int64_t j = 0;
  switch (mr) {
    case 1:
      for (; j + 4 <= nr; j += 4) q8w_group(1, 4, l, n + j, x, y + j, ldy, flags);
      for (; j < nr; j++) q8w_group(1, 1, l, n + j, x, y + j, ldy, flags);
      break;
    case 2:
      for (; j + 4 <= nr; j += 4) q8w_group(2, 4, l, n + j, x, y + j, ldy, flags);
      for (; j < nr; j++) q8w_group(2, 1, l, n + j, x, y + j, ldy, flags);
      break;
    case 3:
      for (; j + 3 <= nr; j += 3) q8w_group(3, 3, l, n + j, x, y + j, ldy, flags);
      for (; j < nr; j++) q8w_group(3, 1, l, n + j, x, y + j, ldy, flags);
      break;
    default:
      for (; j + 2 <= nr; j += 2) q8w_group(4, 2, l, n + j, x, y + j, ldy, flags);
      for (; j < nr; j++) q8w_group(4, 1, l, n + j, x, y + j, ldy, flags);
      break;
  }
}

void tide_linear_q8w_avx2_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                               int64_t ldy, int64_t m, int flags) {
  const int64_t K = l->k, np = (K / 32 + 1) / 2;
  for (int64_t n0 = 0; n0 < nr; n0 += 64) {
    int64_t nn = nr - n0 < 64 ? nr - n0 : 64;
    for (int64_t i = 0; i < m; i += 4) {
      tide_q8_rows xi = {x->q + i * np * 64, x->c + i * np * 8, x->d + i * np * 8};
      q8w_pass(m - i < 4 ? m - i : 4, l, r0 + n0, nn, &xi, y + i * ldy + n0, ldy, flags);
    }
  }
}
