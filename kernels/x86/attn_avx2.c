/* attn_avx2.c - AVX2/FMA/F16C variants of the attention kernels' inner
 * units (see attn_internal.h). f32 arithmetic throughout; every reduction
 * has one fixed order that does not depend on tiling: a score is a
 * sequential FMA chain over the 512 (or 128) dims, P.V a sequential chain
 * over the candidate list, sums over keys 8 lanes by candidate index mod 8,
 * the indexer head sum in head order. fp8 is decoded exactly through F16C
 * (the 7 low bits of e4m3 placed in an f16 give the value times 2^-8). */
#include <immintrin.h>
#include <math.h>

#include "attn_internal.h"

#define AI static inline __attribute__((always_inline))

/* ---- helpers ---- */
AI __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, y);
}

AI __m256 round_bf16_8(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), x, nan);
}

AI float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
AI float hmax8(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

/* 16 fp8 e4m3 bytes -> two vectors of f32 values times 2^-8 (exact) */
AI void f8x16(const uint8_t *p, __m256 *lo, __m256 *hi) {
  __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
  __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                              _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* dequantise one stored token (576 data + 8 scale bytes) into 512 floats */
AI void mla_load8(float *out, const uint8_t *data, const uint8_t *sc) {
  const __m256 k256 = _mm256_set1_ps(256.0f);
  for (int t = 0; t < 7; t++) {
    /* 2^(b-127) from its bits (b = 0 is the subnormal 2^-127, 255 NaN) */
    uint32_t bits = sc[t] == 255 ? 0x7fc00000u : sc[t] ? (uint32_t)sc[t] << 23 : 0x00400000u;
    __m256 s = _mm256_castsi256_ps(_mm256_set1_epi32((int)bits));
    for (int g = 0; g < 4; g++) {
      __m256 a, b;
      f8x16(data + 64 * t + 16 * g, &a, &b);
      _mm256_storeu_ps(out + 64 * t + 16 * g, _mm256_mul_ps(_mm256_mul_ps(a, k256), s));
      _mm256_storeu_ps(out + 64 * t + 16 * g + 8, _mm256_mul_ps(_mm256_mul_ps(b, k256), s));
    }
  }
  for (int i = 0; i < KV_ROPE; i += 8) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(data + KV_NOPE + 2 * i)));
    _mm256_storeu_ps(out + KV_NOPE + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
  }
}

/* GPT-J rotation of 64 dims: pairs (e, o) -> (e c - o s, e s + o c), or the
 * inverse (e c + o s, o c - e s). Products rounded, then added (no FMA), so
 * the bits equal tide_rope64's. */
AI void rope64_8(float *x, const float *cs, int inverse) {
  const __m256i i0 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), i1 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
  const __m256 neg = _mm256_set1_ps(-0.0f);
  for (int k = 0; k < 4; k++) {
    __m256 c = _mm256_loadu_ps(cs + 8 * k), s = _mm256_loadu_ps(cs + 32 + 8 * k);
    for (int half = 0; half < 2; half++) {
      __m256i ix = half ? i1 : i0;
      __m256 cd = _mm256_permutevar8x32_ps(c, ix), sd = _mm256_permutevar8x32_ps(s, ix);
      float *p = x + 16 * k + 8 * half;
      __m256 v = _mm256_loadu_ps(p);
      __m256 t = _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), sd);
      if (inverse) t = _mm256_xor_ps(t, neg);
      _mm256_storeu_ps(p, _mm256_addsub_ps(_mm256_mul_ps(v, cd), t));
    }
  }
}

/* ---- q rows ---- */
static void q_rows_avx2(float *q, int64_t H, const float *cs, float eps) {
  for (int64_t h = 0; h < H; h++) {
    float *x = q + h * KV_D;
    __m256 ss = _mm256_setzero_ps();
    for (int i = 0; i < KV_D; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      ss = _mm256_fmadd_ps(v, v, ss);
    }
    float r = (float)(1.0 / sqrt((double)hsum8(ss) / KV_D + eps));
    __m256 rv = _mm256_set1_ps(r);
    for (int i = 0; i < KV_D; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), rv));
    rope64_8(x + KV_NOPE, cs, 0);
    for (int i = 0; i < KV_D; i += 8) _mm256_storeu_ps(x + i, round_bf16_8(_mm256_loadu_ps(x + i)));
  }
}

/* ---- attention ---- */
enum { TK = 16 };   /* keys per tile */

/* S[h][0..16) = scale * q_h . Kt (Kt: [512][16] transposed keys), HB heads */
AI void s_block(float *S, int64_t ldS, const float *q, const float *Kt, int HB, float scale) {
  __m256 a0[6], a1[6];
  _Pragma("GCC unroll 8")
  for (int h = 0; h < HB; h++) a0[h] = a1[h] = _mm256_setzero_ps();
  for (int d = 0; d < KV_D; d++) {
    __m256 k0 = _mm256_loadu_ps(Kt + d * TK), k1 = _mm256_loadu_ps(Kt + d * TK + 8);
    _Pragma("GCC unroll 8")
    for (int h = 0; h < HB; h++) {
      __m256 qb = _mm256_broadcast_ss(q + h * KV_D + d);
      a0[h] = _mm256_fmadd_ps(qb, k0, a0[h]);
      a1[h] = _mm256_fmadd_ps(qb, k1, a1[h]);
    }
  }
  __m256 sv = _mm256_set1_ps(scale);
  _Pragma("GCC unroll 8")
  for (int h = 0; h < HB; h++) {
    _mm256_storeu_ps(S + h * ldS, _mm256_mul_ps(a0[h], sv));
    _mm256_storeu_ps(S + h * ldS + 8, _mm256_mul_ps(a1[h], sv));
  }
}
static void s_tile(float *S, int64_t ldS, const float *q, int64_t nh, const float *Kt, float scale) {
  int64_t h = 0;
  for (; h + 6 <= nh; h += 6) s_block(S + h * ldS, ldS, q + h * KV_D, Kt, 6, scale);
  switch (nh - h) {
    case 5: s_block(S + h * ldS, ldS, q + h * KV_D, Kt, 5, scale); break;
    case 4: s_block(S + h * ldS, ldS, q + h * KV_D, Kt, 4, scale); break;
    case 3: s_block(S + h * ldS, ldS, q + h * KV_D, Kt, 3, scale); break;
    case 2: s_block(S + h * ldS, ldS, q + h * KV_D, Kt, 2, scale); break;
    case 1: s_block(S + h * ldS, ldS, q + h * KV_D, Kt, 1, scale); break;
    default: break;
  }
}

/* O[h][d0..d0+32) += sum over the tile's nt keys of P[h][e] * Kr[e][..], HB heads */
AI void pv_block(float *O, const float *P, int64_t ldS, const float *Kr, int nt, int HB, int first) {
  for (int d0 = 0; d0 < KV_D; d0 += 32) {
    __m256 a[3][4];
    _Pragma("GCC unroll 8")
    for (int h = 0; h < HB; h++)
      _Pragma("GCC unroll 4")
      for (int v = 0; v < 4; v++) a[h][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(O + h * KV_D + d0 + 8 * v);
    for (int e = 0; e < nt; e++) {
      __m256 k0 = _mm256_loadu_ps(Kr + e * KV_D + d0), k1 = _mm256_loadu_ps(Kr + e * KV_D + d0 + 8);
      __m256 k2 = _mm256_loadu_ps(Kr + e * KV_D + d0 + 16), k3 = _mm256_loadu_ps(Kr + e * KV_D + d0 + 24);
      _Pragma("GCC unroll 8")
      for (int h = 0; h < HB; h++) {
        __m256 p = _mm256_broadcast_ss(P + h * ldS + e);
        a[h][0] = _mm256_fmadd_ps(p, k0, a[h][0]);
        a[h][1] = _mm256_fmadd_ps(p, k1, a[h][1]);
        a[h][2] = _mm256_fmadd_ps(p, k2, a[h][2]);
        a[h][3] = _mm256_fmadd_ps(p, k3, a[h][3]);
      }
    }
    _Pragma("GCC unroll 8")
    for (int h = 0; h < HB; h++)
      _Pragma("GCC unroll 4")
      for (int v = 0; v < 4; v++) _mm256_storeu_ps(O + h * KV_D + d0 + 8 * v, a[h][v]);
  }
}
static void pv_tile(float *O, const float *P, int64_t ldS, int64_t nh, const float *Kr, int nt, int first) {
  int64_t h = 0;
  for (; h + 3 <= nh; h += 3) pv_block(O + h * KV_D, P + h * ldS, ldS, Kr, nt, 3, first);
  if (nh - h == 2) pv_block(O + h * KV_D, P + h * ldS, ldS, Kr, nt, 2, first);
  if (nh - h == 1) pv_block(O + h * KV_D, P + h * ldS, ldS, Kr, nt, 1, first);
}

/* keys e0..e0+nt of the list into Kr [16][512] (rows >= nt zero) and, when
 * Kt != NULL, the transposed panel Kt [512][16] */
static void load_tile(float *Kr, float *Kt, const uint8_t *const *kd, const uint8_t *const *ks, int64_t e0, int nt) {
  for (int e = 0; e < TK; e++) {
    if (e < nt) mla_load8(Kr + e * KV_D, kd[e0 + e], ks[e0 + e]);
    else memset(Kr + e * KV_D, 0, KV_D * sizeof(float));
  }
  if (!Kt) return;
  for (int d = 0; d < KV_D; d += 8) {
    for (int e0b = 0; e0b < TK; e0b += 8) {
      /* 8x8 transpose of Kr[e0b..+8][d..d+8] into Kt[d..d+8][e0b..+8] */
      __m256 r0 = _mm256_loadu_ps(Kr + (e0b + 0) * KV_D + d), r1 = _mm256_loadu_ps(Kr + (e0b + 1) * KV_D + d);
      __m256 r2 = _mm256_loadu_ps(Kr + (e0b + 2) * KV_D + d), r3 = _mm256_loadu_ps(Kr + (e0b + 3) * KV_D + d);
      __m256 r4 = _mm256_loadu_ps(Kr + (e0b + 4) * KV_D + d), r5 = _mm256_loadu_ps(Kr + (e0b + 5) * KV_D + d);
      __m256 r6 = _mm256_loadu_ps(Kr + (e0b + 6) * KV_D + d), r7 = _mm256_loadu_ps(Kr + (e0b + 7) * KV_D + d);
      __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
      __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
      __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
      __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float *o = Kt + d * TK + e0b;
      _mm256_storeu_ps(o + 0 * TK, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(o + 1 * TK, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(o + 2 * TK, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(o + 3 * TK, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(o + 4 * TK, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(o + 5 * TK, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(o + 6 * TK, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(o + 7 * TK, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
  }
}

static void attn_avx2(float *out, float *stats, const float *q, int64_t nh, const uint8_t *const *kd,
                      const uint8_t *const *ks, int64_t nk, int64_t nwin, const float *sink, float scale,
                      float *scratch) {
  if (nk == 0) {
    memset(out, 0, (size_t)nh * KV_D * sizeof(float));
    if (stats)
      for (int64_t h = 0; h < nh; h++) {
        stats[h * 4 + 0] = stats[h * 4 + 1] = 0;
        stats[h * 4 + 2] = 1;
        stats[h * 4 + 3] = -INFINITY;
      }
    return;
  }
  int64_t ldS = (nk + TK - 1) / TK * TK;
  float *S = scratch, *Kr = S + nh * ldS, *Kt = Kr + TK * KV_D, *O = Kt + TK * KV_D;
  /* pass 1: scores */
  for (int64_t e0 = 0; e0 < nk; e0 += TK) {
    int nt = nk - e0 < TK ? (int)(nk - e0) : TK;
    load_tile(Kr, Kt, kd, ks, e0, nt);
    s_tile(S + e0, ldS, q, nh, Kt, scale);
  }
  /* softmax numerators: P = exp(s - m), sums in 8 lanes by index mod 8 */
  float *mx = O + nh * KV_D, *zs = mx + nh, *zw = zs + nh;
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t h = 0; h < nh; h++) {
    float *sh = S + h * ldS;
    for (int64_t e = nk; e < ldS; e++) sh[e] = -INFINITY;
    __m256 m8 = ninf;
    for (int64_t e = 0; e < ldS; e += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(sh + e));
    float m = hmax8(m8);
    __m256 mv = _mm256_set1_ps(m), z8 = _mm256_setzero_ps(), w8 = _mm256_setzero_ps();
    __m256i nw = _mm256_set1_epi32((int)nwin);
    for (int64_t e = 0; e < ldS; e += 8) {
      __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(sh + e), mv));
      z8 = _mm256_add_ps(z8, p);
      if (stats) {
        __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32((int)e));
        w8 = _mm256_add_ps(w8, _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_cmpgt_epi32(nw, idx))));
      }
      _mm256_storeu_ps(sh + e, round_bf16_8(p));
    }
    mx[h] = m;
    zs[h] = hsum8(z8);
    zw[h] = hsum8(w8);
  }
  /* pass 2: P . V with V = K, keys in list order */
  for (int64_t e0 = 0; e0 < nk; e0 += TK) {
    int nt = nk - e0 < TK ? (int)(nk - e0) : TK;
    load_tile(Kr, NULL, kd, ks, e0, nt);
    pv_tile(O, S + e0, ldS, nh, Kr, nt, e0 == 0);
  }
  for (int64_t h = 0; h < nh; h++) {
    float m = mx[h], z = zs[h];
    float es = (float)exp((double)sink[h] - m);
    float den = z + es;
    __m256 dv = _mm256_set1_ps(den);
    for (int i = 0; i < KV_D; i += 8)
      _mm256_storeu_ps(out + h * KV_D + i, round_bf16_8(_mm256_div_ps(_mm256_loadu_ps(O + h * KV_D + i), dv)));
    if (stats) {
      stats[h * 4 + 0] = zw[h] / den;
      stats[h * 4 + 1] = (z - zw[h]) / den;
      stats[h * 4 + 2] = es / den;
      stats[h * 4 + 3] = m + logf(z);
    }
  }
}

/* ---- compressor pooling ---- */
static void pool_avx2(float *out, int64_t dc, int64_t n, const float *const *a, const float *const *b,
                      const float *const *ape) {
  for (int64_t ch = 0; ch < dc; ch += 8) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t t = 0; t < n; t++) {
      __m256 s = _mm256_loadu_ps(b[t] + ch);
      if (ape[t]) s = _mm256_add_ps(s, _mm256_loadu_ps(ape[t] + ch));
      mx = _mm256_max_ps(mx, s);
    }
    __m256 z = _mm256_setzero_ps(), acc = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; t++) {
      __m256 s = _mm256_loadu_ps(b[t] + ch);
      if (ape[t]) s = _mm256_add_ps(s, _mm256_loadu_ps(ape[t] + ch));
      __m256 w = exp256(_mm256_sub_ps(s, mx));
      z = _mm256_add_ps(z, w);
      acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(a[t] + ch), acc);
    }
    _mm256_storeu_ps(out + ch, _mm256_div_ps(acc, z));
  }
}

/* ---- indexer logits ---- */
/* tot[16] += sum over HB heads (in order) of w_h * relu(q_h . Kt) */
AI void is_block(__m256 *t0, __m256 *t1, const float *q, const float *w, const float *Kt, int HB) {
  __m256 a0[6], a1[6];
  _Pragma("GCC unroll 8")
  for (int h = 0; h < HB; h++) a0[h] = a1[h] = _mm256_setzero_ps();
  for (int d = 0; d < KV_ID; d++) {
    __m256 k0 = _mm256_loadu_ps(Kt + d * 16), k1 = _mm256_loadu_ps(Kt + d * 16 + 8);
    _Pragma("GCC unroll 8")
    for (int h = 0; h < HB; h++) {
      __m256 qb = _mm256_broadcast_ss(q + h * KV_ID + d);
      a0[h] = _mm256_fmadd_ps(qb, k0, a0[h]);
      a1[h] = _mm256_fmadd_ps(qb, k1, a1[h]);
    }
  }
  const __m256 z = _mm256_setzero_ps();
  _Pragma("GCC unroll 8")
  for (int h = 0; h < HB; h++) {
    __m256 wv = _mm256_broadcast_ss(w + h);
    *t0 = _mm256_fmadd_ps(wv, _mm256_max_ps(a0[h], z), *t0);
    *t1 = _mm256_fmadd_ps(wv, _mm256_max_ps(a1[h], z), *t1);
  }
}

static void iscore_avx2(float *out, int64_t n, const uint8_t *k8, const float *ks, const float *q, const float *w,
                        int64_t nI) {
  float Kt[KV_ID * 16] __attribute__((aligned(32)));
  float tmp[16];
  const __m256 k256 = _mm256_set1_ps(256.0f);
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    int nt = n - i0 < 16 ? (int)(n - i0) : 16;
    /* decode and transpose: Kt[d][e] (x 2^-8, undone at the end) */
    for (int e = 0; e < 16; e++) {
      if (e < nt) {
        const uint8_t *p = k8 + (i0 + e) * KV_ID;
        for (int g = 0; g < KV_ID; g += 16) {
          __m256 lo, hi;
          f8x16(p + g, &lo, &hi);
          float v[16];
          _mm256_storeu_ps(v, lo);
          _mm256_storeu_ps(v + 8, hi);
          for (int k = 0; k < 16; k++) Kt[(g + k) * 16 + e] = v[k];
        }
      } else {
        for (int d = 0; d < KV_ID; d++) Kt[d * 16 + e] = 0;
      }
    }
    __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
    int64_t h = 0;
    for (; h + 6 <= nI; h += 6) is_block(&t0, &t1, q + h * KV_ID, w + h, Kt, 6);
    switch (nI - h) {
      case 5: is_block(&t0, &t1, q + h * KV_ID, w + h, Kt, 5); break;
      case 4: is_block(&t0, &t1, q + h * KV_ID, w + h, Kt, 4); break;
      case 3: is_block(&t0, &t1, q + h * KV_ID, w + h, Kt, 3); break;
      case 2: is_block(&t0, &t1, q + h * KV_ID, w + h, Kt, 2); break;
      case 1: is_block(&t0, &t1, q + h * KV_ID, w + h, Kt, 1); break;
      default: break;
    }
    _mm256_storeu_ps(tmp, _mm256_mul_ps(t0, k256));
    _mm256_storeu_ps(tmp + 8, _mm256_mul_ps(t1, k256));
    for (int e = 0; e < nt; e++) out[i0 + e] = tmp[e] * ks[i0 + e];
  }
}

/* ---- fp8_ds_mla store (same bytes as tide_mla_store) ---- */
/* e4m3 codes (0..0x7e, sign in bit 7) of 8 clamped values; flush: |x| < 2^-6 -> +0 */
AI __m256i e4m3_codes(__m256 x, int flush) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), tiny = _mm256_set1_ps(0.015625f);
  __m256 ax = _mm256_and_ps(x, absm);
  __m256i sign = _mm256_srli_epi32(_mm256_castps_si256(_mm256_andnot_ps(absm, x)), 24);
  __m256 sub = _mm256_cmp_ps(ax, tiny, _CMP_LT_OQ);
  __m256i cs = _mm256_cvtps_epi32(_mm256_mul_ps(ax, _mm256_set1_ps(512.0f))); /* RNE */
  __m256i u = _mm256_castps_si256(ax);
  u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1))));
  __m256i cn = _mm256_sub_epi32(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(120 << 3));
  cn = _mm256_min_epi32(cn, _mm256_set1_epi32(0x7e));
  __m256i code = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(cn), _mm256_castsi256_ps(cs), sub));
  code = _mm256_or_si256(code, sign);
  if (flush) code = _mm256_andnot_si256(_mm256_castps_si256(sub), code);
  return code;
}
/* bf16 bits of 8 values (RNE, NaN quiet), in the low 16 bits of each lane */
AI __m256i bf16_bits8(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
  __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_srli_epi32(_mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan)), 16);
}

static void mla_store_avx2(uint8_t *data, uint8_t *sc, const float *v, int flush) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i ord = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int t = 0; t < 7; t++) {
    const float *x = v + 64 * t;
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 64; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absm));
    float s = fmaxf(hmax8(m) / 448.0f, 1e-4f);
    int e = tide_ceil_log2f(s);
    sc[t] = (uint8_t)(e + 127);
    __m256 mul = _mm256_castsi256_ps(_mm256_set1_epi32((127 - e) << 23));
    const __m256 hi = _mm256_set1_ps(448.0f), lo = _mm256_set1_ps(-448.0f);
    for (int i = 0; i < 64; i += 32) {
      __m256i c[4];
      for (int k = 0; k < 4; k++) {
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), mul);
        y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
        c[k] = e4m3_codes(y, flush);
      }
      __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
      _mm256_storeu_si256((__m256i *)(data + 64 * t + i), _mm256_permutevar8x32_epi32(p, ord));
    }
  }
  sc[7] = 0;
  for (int i = 0; i < KV_ROPE; i += 16) {
    __m256i a = bf16_bits8(_mm256_loadu_ps(v + KV_NOPE + i)), b = bf16_bits8(_mm256_loadu_ps(v + KV_NOPE + i + 8));
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256((__m256i *)(data + KV_NOPE + 2 * i), p);
  }
}

/* ---- indexer query and output path ---- */
static void iq_rows_avx2(uint8_t *q8, float *scales, const float *qi, int64_t nI, const float *cs) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 hi = _mm256_set1_ps(448.0f), lo = _mm256_set1_ps(-448.0f);
  const __m256i ord = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t h = 0; h < nI; h++) {
    float v[KV_ID];
    memcpy(v, qi + h * KV_ID, sizeof v);
    rope64_8(v + 64, cs, 0);
    for (int i = 64; i < KV_ID; i += 8) _mm256_storeu_ps(v + i, round_bf16_8(_mm256_loadu_ps(v + i)));
    __m256 m = _mm256_set1_ps(1e-4f);
    for (int i = 0; i < KV_ID; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v + i), absm));
    int e = tide_ceil_log2f(hmax8(m) / 448.0f);
    __m256 mul = _mm256_castsi256_ps(_mm256_set1_epi32((127 - e) << 23));
    for (int i = 0; i < KV_ID; i += 32) {
      __m256i c[4];
      for (int k = 0; k < 4; k++) {
        __m256 y = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8 * k), mul), lo), hi);
        c[k] = e4m3_codes(y, 0);
      }
      __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
      _mm256_storeu_si256((__m256i *)(q8 + h * KV_ID + i), _mm256_permutevar8x32_epi32(p, ord));
    }
    scales[h] = ldexpf(1.0f, e);
  }
}

static void unrope_rows_avx2(float *out, const float *in, int64_t H, const float *cs) {
  for (int64_t h = 0; h < H; h++) {
    const float *x = in + h * KV_D;
    float *y = out + h * KV_D, v[KV_ROPE];
    if (y != x) memcpy(y, x, KV_NOPE * sizeof(float));
    memcpy(v, x + KV_NOPE, sizeof v);
    rope64_8(v, cs, 1);
    for (int i = 0; i < KV_ROPE; i += 8) _mm256_storeu_ps(y + KV_NOPE + i, round_bf16_8(_mm256_loadu_ps(v + i)));
  }
}

const tide_attn_kernels tide_attn_avx2 = {q_rows_avx2, attn_avx2, pool_avx2, iscore_avx2, mla_store_avx2,
                                          iq_rows_avx2, unrope_rows_avx2};
