/* linear_avx512.c - AVX-512 variants of the fused M <= 8 kernels for FP8 and
 * MXFP4 weights, bitwise the same results as the AVX2 kernel.
 *
 * Compiled with AVX-512 F/BW/VL/DQ + VBMI + GFNI and used only where CPUID
 * and the OS say so (tide_linear_avx512_ready, engine/linear.c). The
 * invariant order is the AVX2 one: per output eight f32 lanes, lane = k mod
 * 8, one FMA per element in increasing k, one fixed horizontal sum. A zmm
 * accumulator holds two of those 8-lane accumulators - lanes 0..7 belong to
 * weight row 2p, lanes 8..15 to row 2p + 1 of the group - so every FMA
 * still adds x[k] * W[row, k] for the same k into the same lane, and the two
 * halves are summed exactly as hsum8 sums a ymm. x is broadcast to both
 * halves (the same 8 columns for both rows).
 *
 * FP8: the f32 pattern of the AVX2 kernel, s 0000 eeee mmm 0...0 = fp8 *
 * 2^-120, built without shifts: two GF(2) affine byte maps (gf2p8affineqb)
 * turn each fp8 byte into the pattern's top byte (s 0000 e3 e2 e1) and its
 * next byte (e0 m2 m1 m0 0000), and one vpermt2b per 16 weights moves them
 * into place for two rows at once, zeroing the low bytes. Then, as in AVX2,
 * either x carries the block factor 2^(sc - 7) (M = 1, when exact) or the
 * weights are multiplied by it (scales <= 134; larger scales, NaN codes
 * and ragged blocks take the exact decoders).
 *
 * MXFP4: for each row and 32-column block a 16-entry table of the signed
 * e2m1 values times the block scale (the product the reference and the
 * AVX2 table form, one rounding); vpmultishiftqb pulls the nibble of every
 * lane into the low bits of its dword, vpternlogd masks it and adds 16 in
 * the second row's half, and one vpermt2ps looks up both rows' tables. */
#include <immintrin.h>

#include "linear.h"

enum { ZMAX_M = 8, ZMAX_P = 4 };

/* gf2p8affineqb matrices: result bit i is the parity of (byte 7 - i of the
 * matrix) & input. HI: bit 7 <- 7 (sign), bits 2, 1, 0 <- 6, 5, 4 (e3 e2
 * e1); LO: bit 7 <- 3 (e0), bits 6, 5, 4 <- 2, 1, 0 (mantissa). */
#define GF_BIT(out, in) ((uint64_t)1 << (in) << (8 * (7 - (out))))
static const uint64_t GF_HI = GF_BIT(7, 7) | GF_BIT(2, 6) | GF_BIT(1, 5) | GF_BIT(0, 4);
static const uint64_t GF_LO = GF_BIT(7, 3) | GF_BIT(6, 2) | GF_BIT(5, 1) | GF_BIT(4, 0);
#undef GF_BIT

/* vpermt2b indices for the 16 weights of group q (columns 8q..8q+7 of a
 * 32-column step) of two rows held in z = [row a: 32 bytes | row b: 32
 * bytes]: dword j takes byte 3 from HI (index src) and byte 2 from LO
 * (index 64 + src), src = 32 * (j / 8) + 8q + j % 8; bytes 0, 1 are zeroed
 * by the mask. */
#define FP8_SRC(q, j) (32 * ((j) / 8) + 8 * (q) + (j) % 8)
#define FP8_IX(q, j) ((FP8_SRC(q, j) << 24) | ((64 + FP8_SRC(q, j)) << 16))
#define FP8_INDEX(q)                                                                                          \
  _mm512_setr_epi32(FP8_IX(q, 0), FP8_IX(q, 1), FP8_IX(q, 2), FP8_IX(q, 3), FP8_IX(q, 4), FP8_IX(q, 5),       \
                    FP8_IX(q, 6), FP8_IX(q, 7), FP8_IX(q, 8), FP8_IX(q, 9), FP8_IX(q, 10), FP8_IX(q, 11),     \
                    FP8_IX(q, 12), FP8_IX(q, 13), FP8_IX(q, 14), FP8_IX(q, 15))

/* vpmultishiftqb controls: byte 0 of dword j gets the 8 bits from bit
 * 4 * (j % 8) + 32 * g of its qword, whose low nibble is the nibble of lane
 * j % 8 in group g (the source qword holds 16 nibbles of one row); the
 * other bytes of the dword are don't-care. */
#define FP4_CTRL(g)                                                                                          \
  _mm512_setr_epi32(32 * (g), 32 * (g) + 4, 32 * (g) + 8, 32 * (g) + 12, 32 * (g) + 16, 32 * (g) + 20,      \
                    32 * (g) + 24, 32 * (g) + 28, 32 * (g), 32 * (g) + 4, 32 * (g) + 8, 32 * (g) + 12,      \
                    32 * (g) + 16, 32 * (g) + 20, 32 * (g) + 24, 32 * (g) + 28)

static const float e2m1_signed[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l0+l4 .. l3+l7 */
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));                                       /* (l0+l4)+(l2+l6), (l1+l5)+(l3+l7) */
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

static inline __attribute__((always_inline)) __m512 bcast8(const float *p) {
  return _mm512_broadcast_f32x8(_mm256_loadu_ps(p));
}

/* rows [n, n + 2P) x columns [k0, k0 + len) through the exact decoders */
static inline __attribute__((always_inline)) void zslow(const int MR, const int P, const struct tide_linear *l,
                                                        int64_t n, const float *x, int64_t ldx, int64_t k0,
                                                        int64_t len, __m512 acc[ZMAX_M][ZMAX_P]) {
  _Alignas(64) float buf[2 * ZMAX_P][136];
  tide_dequant_block(&buf[0][0], 136, &l->view, n, 2 * P, k0, len, (len + 7) & ~(int64_t)7, &tide_dequant_avx2);
  for (int64_t k = 0; k < len; k += 8) {
    const __mmask8 mk = k + 8 <= len ? 0xff : (__mmask8)((1u << (len - k)) - 1);
    __m512 v[ZMAX_P];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
      v[p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_load_ps(&buf[2 * p][k])), _mm256_load_ps(&buf[2 * p + 1][k]),
                                1);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      __m512 xv = _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(mk, x + i * ldx + k0 + k));
#pragma GCC unroll 4
      for (int p = 0; p < P; p++) acc[i][p] = _mm512_fmadd_ps(xv, v[p], acc[i][p]);
    }
  }
}

/* FP8 columns [k0, k0 + 128) of rows [n, n + 2P); 0 when the block needs the
 * exact decoders */
static inline __attribute__((always_inline)) int zfp8(const int MR, const int P, const struct tide_linear *l,
                                                      int64_t n, const float *x, int64_t ldx, int64_t k0,
                                                      const tide_fused_ctx *ctx, __m512 acc[ZMAX_M][ZMAX_P]) {
  const int64_t rb = l->view.row_bytes, kb = k0 / 128;
  const uint8_t *w0 = l->view.w + n * rb + k0;
  const int sc = l->view.s[(n / 128) * l->view.s_ld + kb];
  const int pre = MR == 1 && ctx->pre && ctx->pre[kb];
  if (sc > (pre ? 246 : 134)) return 0;
  __m512i mx = _mm512_setzero_si512(); /* max of 2 * byte: 0xFE iff a NaN code */
#pragma GCC unroll 8
  for (int r = 0; r < 2 * P; r++)
#pragma GCC unroll 2
    for (int j = 0; j < 128; j += 64) {
      __m512i raw = _mm512_loadu_si512(w0 + r * rb + j);
      mx = _mm512_max_epu8(mx, _mm512_add_epi8(raw, raw));
    }
  if (_mm512_cmpeq_epi8_mask(mx, _mm512_set1_epi8((char)0xfe))) return 0;
  const __m512i ah = _mm512_set1_epi64((long long)GF_HI), al = _mm512_set1_epi64((long long)GF_LO);
  const __m512i i0 = FP8_INDEX(0), i1 = FP8_INDEX(1), i2 = FP8_INDEX(2), i3 = FP8_INDEX(3);
  const __mmask64 km = 0xccccccccccccccccull; /* bytes 2 and 3 of every dword */
  const __m512 f = _mm512_castsi512_ps(_mm512_set1_epi32((sc + 120) << 23)), nz = _mm512_set1_ps(-0.0f); /* 2^(sc - 7) */
  const float *xk = pre ? ctx->xs + k0 : x + k0;
  for (int j = 0; j < 128; j += 32) {
    __m512i hi[ZMAX_P], lo[ZMAX_P];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) {
      const uint8_t *a = w0 + 2 * p * rb + j;
      __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                                     _mm256_loadu_si256((const __m256i *)(a + rb)), 1);
      hi[p] = _mm512_gf2p8affine_epi64_epi8(z, ah, 0);
      lo[p] = _mm512_gf2p8affine_epi64_epi8(z, al, 0);
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
      const __m512i iq = q == 0 ? i0 : q == 1 ? i1 : q == 2 ? i2 : i3;
      __m512 v[ZMAX_P];
#pragma GCC unroll 4
      for (int p = 0; p < P; p++) {
        v[p] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(km, hi[p], iq, lo[p]));
        if (!pre) v[p] = _mm512_fmadd_ps(v[p], f, nz); /* = v * f, and fast on subnormal v */
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; i++) {
        __m512 xv = bcast8(xk + i * ldx + j + 8 * q);
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) acc[i][p] = _mm512_fmadd_ps(xv, v[p], acc[i][p]);
      }
    }
  }
  return 1;
}

/* MXFP4 columns [k0, k0 + 32) of rows [n, n + 2P); sf[r * sld] = the f32
 * scale of row n + r for this block */
static inline __attribute__((always_inline)) void zfp4(const int MR, const int P, const struct tide_linear *l,
                                                       int64_t n, const float *x, int64_t ldx, int64_t k0,
                                                       const float *sf, int64_t sld, __m512 acc[ZMAX_M][ZMAX_P]) {
  const int64_t rb = l->view.row_bytes;
  const uint8_t *w0 = l->view.w + n * rb + k0 / 2;
  const __m512 tab = _mm512_loadu_ps(e2m1_signed);
  const __m512i c0 = FP4_CTRL(0), c1 = FP4_CTRL(1), m15 = _mm512_set1_epi32(15);
  const __m512i row = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);
  __m512 ta[ZMAX_P], tb[ZMAX_P];
#pragma GCC unroll 4
  for (int p = 0; p < P; p++) {
    ta[p] = _mm512_mul_ps(tab, _mm512_set1_ps(sf[(2 * p) * sld]));
    tb[p] = _mm512_mul_ps(tab, _mm512_set1_ps(sf[(2 * p + 1) * sld]));
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; h++) {
    __m512i src[ZMAX_P];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) {
      const uint8_t *a = w0 + 2 * p * rb + 8 * h;
      long long u0, u1;
      memcpy(&u0, a, 8);
      memcpy(&u1, a + rb, 8);
      src[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi64x(u0)), _mm256_set1_epi64x(u1), 1);
    }
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
      __m512 v[ZMAX_P];
#pragma GCC unroll 4
      for (int p = 0; p < P; p++) {
        /* (nibble & 15) | (16 in the second row's half): 0xEA = (A & B) | C */
        __m512i idx = _mm512_ternarylogic_epi32(_mm512_multishift_epi64_epi8(g ? c1 : c0, src[p]), m15, row, 0xea);
        v[p] = _mm512_permutex2var_ps(ta[p], idx, tb[p]);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; i++) {
        __m512 xv = bcast8(x + i * ldx + k0 + 16 * h + 8 * g);
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) acc[i][p] = _mm512_fmadd_ps(xv, v[p], acc[i][p]);
      }
    }
  }
}

enum { SF_BLOCKS = 16 }; /* MXFP4 scale blocks converted to f32 at a time */

static inline __attribute__((always_inline)) void zrows(const int MR, const int P, const int FMT,
                                                        const struct tide_linear *l, int64_t n, const float *x,
                                                        int64_t ldx, float *y, int64_t ldy, int flags,
                                                        const tide_fused_ctx *ctx) {
  __m512 acc[ZMAX_M][ZMAX_P];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) acc[i][p] = _mm512_setzero_ps();
  const int64_t K = l->k, rb = l->view.row_bytes;
  const uint8_t *w0 = l->view.w + n * rb;
  if (FMT == TIDE_W_FP8) {
    const int64_t kfull = K / 128 * 128;
    for (int64_t k0 = 0; k0 < kfull; k0 += 128) {
      /* the same columns of the next group, 2P rows further on */
      const uint8_t *pf = w0 + 2 * P * rb + k0;
#pragma GCC unroll 8
      for (int r = 0; r < 2 * P; r++) {
        _mm_prefetch((const char *)(pf + r * rb), _MM_HINT_T0);
        _mm_prefetch((const char *)(pf + r * rb + 64), _MM_HINT_T0);
      }
      if (!zfp8(MR, P, l, n, x, ldx, k0, ctx, acc)) zslow(MR, P, l, n, x, ldx, k0, 128, acc);
    }
    if (kfull < K) zslow(MR, P, l, n, x, ldx, kfull, K - kfull, acc);
  } else {
    /* MXFP4 (K is a multiple of 32): the scales of SF_BLOCKS blocks of every
     * row as f32, 2^(s - 127) (s = 0 is the subnormal 2^-127); blocks where
     * a row has the NaN scale are decoded exactly */
    _Alignas(64) float sf[2 * ZMAX_P][SF_BLOCKS];
    const int64_t nb = K / 32, sld = l->view.s_ld;
    const uint8_t *s0 = l->view.s + n * sld;
    for (int64_t b0 = 0; b0 < nb; b0 += SF_BLOCKS) {
      const int64_t cnt = nb - b0 < SF_BLOCKS ? nb - b0 : SF_BLOCKS;
      const __mmask16 mk = (__mmask16)((1u << cnt) - 1);
      unsigned nan = 0;
#pragma GCC unroll 8
      for (int r = 0; r < 2 * P; r++) {
        __m512i s = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mk, s0 + r * sld + b0));
        __m512i v = _mm512_mask_mov_epi32(_mm512_slli_epi32(s, 23), _mm512_cmpeq_epi32_mask(s, _mm512_setzero_si512()),
                                          _mm512_set1_epi32(0x00400000));
        nan |= _mm512_mask_cmpeq_epi32_mask(mk, s, _mm512_set1_epi32(0xff));
        _mm512_store_ps(sf[r], _mm512_castsi512_ps(v));
      }
      for (int64_t b = 0; b < cnt; b++) {
        const int64_t k0 = (b0 + b) * 32;
        if ((k0 & 127) == 0) { /* the same columns of the next group */
          const uint8_t *pf = w0 + 2 * P * rb + k0 / 2;
#pragma GCC unroll 8
          for (int r = 0; r < 2 * P; r++) _mm_prefetch((const char *)(pf + r * rb), _MM_HINT_T0);
        }
        if ((nan >> b) & 1)
          zslow(MR, P, l, n, x, ldx, k0, 32, acc);
        else
          zfp4(MR, P, l, n, x, ldx, k0, &sf[0][b], SF_BLOCKS, acc);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) {
      tide_linear_store(&y[i * ldy + 2 * p], hsum8(_mm512_castps512_ps256(acc[i][p])), flags);
      tide_linear_store(&y[i * ldy + 2 * p + 1], hsum8(_mm512_extractf32x8_ps(acc[i][p], 1)), flags);
    }
}

#define ZK(mr, p, fmt)                                                                                         \
  static void zfused_##mr##_##p##_##fmt(const struct tide_linear *l, int64_t n, const float *x, int64_t ldx,   \
                                        float *y, int64_t ldy, int flags, const tide_fused_ctx *ctx) {         \
    zrows(mr, p, fmt, l, n, x, ldx, y, ldy, flags, ctx);                                                       \
  }
/* pairs of rows per group by M: 8 rows for M <= 3, 4 beyond */
ZK(1, 4, 3) ZK(2, 4, 3) ZK(3, 4, 3) ZK(4, 2, 3) ZK(5, 2, 3) ZK(6, 2, 3) ZK(7, 2, 3) ZK(8, 2, 3)
ZK(1, 4, 4) ZK(2, 4, 4) ZK(3, 4, 4) ZK(4, 2, 4) ZK(5, 2, 4) ZK(6, 2, 4) ZK(7, 2, 4) ZK(8, 2, 4)
#undef ZK

static const tide_fused_fn zfp8_tab[ZMAX_M] = {zfused_1_4_3, zfused_2_4_3, zfused_3_4_3, zfused_4_2_3,
                                               zfused_5_2_3, zfused_6_2_3, zfused_7_2_3, zfused_8_2_3};
static const tide_fused_fn zfp4_tab[ZMAX_M] = {zfused_1_4_4, zfused_2_4_4, zfused_3_4_4, zfused_4_2_4,
                                               zfused_5_2_4, zfused_6_2_4, zfused_7_2_4, zfused_8_2_4};

int tide_linear_avx512_group(int fmt, int64_t m, int pat, tide_fused_fn *fn) {
  if (m < 1 || m > ZMAX_M) return 0;
  if (fmt == TIDE_W_FP8 && pat) {
    *fn = zfp8_tab[m - 1];
    return m <= 3 ? 8 : 4;
  }
  if (fmt == TIDE_W_MXFP4) {
    *fn = zfp4_tab[m - 1];
    return m <= 3 ? 8 : 4;
  }
  return 0;
}
