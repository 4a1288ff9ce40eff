/* linear_avx2.c - the invariant AVX2 linear kernel, y = x . W^T over a range
 * of weight rows, for every weight format.
 *
 * One algorithm for every M: the weight rows are cut into panels of NC rows
 * by KC columns, each panel is dequantised once into a stack buffer with the
 * dequant.h decoders (exact f32 values, padded with zeros to a multiple of
 * 8), and register-tiled micro-kernels run the dot form over it: for each
 * (m, n) one 8-lane accumulator, lane = k mod 8, one FMA per 8 k in
 * increasing k, carried across K blocks through a small accumulator buffer,
 * then one fixed horizontal sum. Tile shapes (1x8, 2x6, 3x4, 4x3 and their
 * edges) change only which accumulators live in registers together, never
 * the operations applied to one of them, so every (m, n) gets the same bits
 * whatever M, the tile it falls in, the row range or the thread.
 *
 * Small M skips the panel: fused decoders (below) feed the decoded weights
 * straight from registers to the FMAs, each weight byte read from memory
 * once per call; above M = 6 the rows of x go in passes over each group of
 * weight rows, the later passes decoding it again from L1. Up to M = 24
 * (FP8: 16; MXFP4 stays at 8) that beats the panels when the weight streams
 * from DRAM (fused_max_m). Larger M share each decoded panel over TIDE_LIN_MC rows of
 * x: the panel (24 rows by 512 columns) and the x block stay in L1/L2 while
 * the weight streams, and the loops are compute bound: the micro-kernels do
 * 12 FMAs per 7 loads. On CPUs with AVX-512 VBMI + GFNI the M <= 8 FP8 and
 * MXFP4 groups go to linear_avx512.c, which keeps the same order. */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>

#include "linear.h"

enum { NC = TIDE_LIN_NC, KC = TIDE_LIN_KC, MC = TIDE_LIN_MC, KCP = KC + 8 };

static inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l0+l4 .. l3+l7 */
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));                                       /* (l0+l4)+(l2+l6), (l1+l5)+(l3+l7) */
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

/* acc[i][j] over k in [0, kk): x rows at stride ldx, panel rows at stride
 * KCP, accumulators in A (row i, column j at A + (i * NC + j) * 8). The last
 * group of 8 may be partial (kk % 8): x is read with a mask, the panel is
 * zero-padded there. */
static inline __attribute__((always_inline)) void micro(const int MR, const int NR, const float *x, int64_t ldx,
                                                        const float *P, int64_t kk, float *A, int first) {
  __m256 acc[4][8];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) acc[i][j] = first ? _mm256_setzero_ps() : _mm256_load_ps(A + (i * NC + j) * 8);
  int64_t k = 0, kfull = kk & ~(int64_t)7;
  for (; k < kfull; k += 8) {
    /* x rows in registers, each panel vector loaded once and used MR times:
     * MR * NR + MR + 1 <= 16 registers for 1x8, 2x6, 3x4 (4x3 spills one) */
    __m256 xv[4];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) xv[i] = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
      __m256 w = _mm256_load_ps(P + j * KCP + k);
#pragma GCC unroll 4
      for (int i = 0; i < MR; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], w, acc[i][j]);
    }
  }
  if (k < kk) {
    const int t = (int)(kk - k);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(t), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 w[8];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) w[j] = _mm256_load_ps(P + j * KCP + k);
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      __m256 xv = _mm256_maskload_ps(x + i * ldx + k, mask);
#pragma GCC unroll 8
      for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(xv, w[j], acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) _mm256_store_ps(A + (i * NC + j) * 8, acc[i][j]);
}

typedef void (*micro_fn)(const float *x, int64_t ldx, const float *P, int64_t kk, float *A, int first);
#define MK(mr, nr) \
  static void micro_##mr##x##nr(const float *x, int64_t ldx, const float *P, int64_t kk, float *A, int first) { \
    micro(mr, nr, x, ldx, P, kk, A, first);                                                                      \
  }
MK(1, 1) MK(1, 2) MK(1, 3) MK(1, 4) MK(1, 5) MK(1, 6) MK(1, 7) MK(1, 8)
MK(2, 1) MK(2, 2) MK(2, 3) MK(2, 4) MK(2, 5) MK(2, 6)
MK(3, 1) MK(3, 2) MK(3, 3) MK(3, 4)
MK(4, 1) MK(4, 2) MK(4, 3)
#undef MK

/* widest tile for a row count mr (12 accumulators at most) */
static const int tile_nr[5] = {0, 8, 6, 4, 3};
static const micro_fn tiles[5][9] = {
    {0},
    {0, micro_1x1, micro_1x2, micro_1x3, micro_1x4, micro_1x5, micro_1x6, micro_1x7, micro_1x8},
    {0, micro_2x1, micro_2x2, micro_2x3, micro_2x4, micro_2x5, micro_2x6},
    {0, micro_3x1, micro_3x2, micro_3x3, micro_3x4},
    {0, micro_4x1, micro_4x2, micro_4x3},
};

/* ---- fused decode for M <= 8 ----
 * The same dot form without the panel round trip: a group of RR weight rows
 * (RR chosen per format and M, table fused_rr) is decoded into registers and
 * fed straight to the FMAs, each decoded vector serving the M rows of x. Blocks
 * the inline decoders do not cover exactly (an fp8 scale above 246 or an fp8
 * NaN code, an MXFP4 NaN scale, the ragged last block, the K % 8 tail) are
 * decoded into a small buffer by the exact decoders instead; either way every
 * weight value and every FMA is the one the panel path uses.
 *
 * FP8 has two exact inline decoders:
 *  - the f32 pattern (default): the sign-extended byte shifted left by 20
 *    and masked with 0x87F00000 is the f32 s 0000 eeee mmm 0...0, whose value
 *    is exactly fp8 * 2^-120 for every code (fp8 subnormals become f32
 *    subnormals with the same digits). Times 2^(scale - 7), a normal f32 for
 *    scales up to 134, it is the weight, rounded once like the reference.
 *    Three instructions per 8 weights, plus the multiply.
 *  - the f16 pattern: s<<15 | mag<<7 is exactly fp8 / 256 as an f16, F16C
 *    widens it, times 2^(scale - 119). No f32 subnormal is ever an operand,
 *    so this one runs when DAZ is set (which would zero the subnormal
 *    patterns above) and for scales 135..246.
 * At M = 1 the multiply moves onto x when that is exact (see prescale_range):
 * x * 2^(scale - bias) once per 128-row block, and the FMA sees the same
 * exact product. */

enum { FUSED_MAX_M = 8, FUSED_MAX_RR = 8, PREFETCH_BYTES = 1024 };

/* Rows decoded together, by format and M: enough independent accumulators
 * (M x RR) to hide the FMA latency within the 16 ymm registers. */
static const int fused_rr[5][FUSED_MAX_M + 1] = {
    {0, 4, 4, 3, 3, 2, 2, 1, 1}, /* f32 */
    {0, 4, 4, 3, 3, 2, 2, 1, 1}, /* bf16 */
    {0, 4, 4, 3, 3, 2, 2, 1, 1}, /* f16 */
    {0, 8, 4, 3, 3, 2, 2, 1, 1}, /* fp8 */
    {0, 4, 4, 2, 2, 2, 2, 1, 1}, /* mxfp4 */
};

typedef tide_fused_ctx fused_ctx;

/* 8 fp8 bytes -> fp8 * 2^-120 as f32 (see above) */
static inline __attribute__((always_inline)) __m256 f8_pat(const uint8_t *p) {
  __m256i d = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 20), _mm256_set1_epi32((int)0x87f00000u)));
}

/* 16 fp8 bytes -> 16 f16 patterns of fp8 / 256 */
static inline __attribute__((always_inline)) __m256i f8_f16(const uint8_t *p) {
  __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
  return _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xbf80));
}

/* rows [n, n + RR) x columns [k0, k0 + len) through the exact decoders */
static inline __attribute__((always_inline)) void fused_slow(const int MR, const int RR, const struct tide_linear *l,
                                                             int64_t n, const float *x, int64_t ldx, int64_t k0,
                                                             int64_t len, __m256 acc[FUSED_MAX_M][FUSED_MAX_RR]) {
  _Alignas(32) float buf[FUSED_MAX_RR][136];
  tide_dequant_block(&buf[0][0], 136, &l->view, n, RR, k0, len, (len + 7) & ~(int64_t)7, &tide_dequant_avx2);
  for (int64_t k = 0; k < len; k += 8) {
    __m256 xv[FUSED_MAX_M];
    if (k + 8 <= len) {
#pragma GCC unroll 8
      for (int i = 0; i < MR; i++) xv[i] = _mm256_loadu_ps(x + i * ldx + k0 + k);
    } else {
      const __m256i mask =
          _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(len - k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 8
      for (int i = 0; i < MR; i++) xv[i] = _mm256_maskload_ps(x + i * ldx + k0 + k, mask);
    }
#pragma GCC unroll 8
    for (int r = 0; r < RR; r++) {
      __m256 w = _mm256_load_ps(&buf[r][k]);
#pragma GCC unroll 8
      for (int i = 0; i < MR; i++) acc[i][r] = _mm256_fmadd_ps(xv[i], w, acc[i][r]);
    }
  }
}

/* One block of FP8 columns [k0, k0 + 128) of rows [n, n + RR), decoded inline.
 * Returns 0 when the block needs the exact decoders instead. */
static inline __attribute__((always_inline)) int fused_fp8(const int MR, const int RR, const struct tide_linear *l,
                                                           int64_t n, const float *x, int64_t ldx, int64_t k0,
                                                           const fused_ctx *ctx, __m256 acc[FUSED_MAX_M][FUSED_MAX_RR]) {
  const int64_t rb = l->view.row_bytes, kb = k0 / 128;
  const uint8_t *w0 = l->view.w + n * rb + k0;
  const int sc = l->view.s[(n / 128) * l->view.s_ld + kb];
  if (sc > 246) return 0;
  /* NaN codes: the block's flag when fp8_scan has recorded it, else this
   * group's bytes */
  const uint8_t flag = __atomic_load_n(&l->nan8[(n / 128) * l->view.s_ld + kb], __ATOMIC_RELAXED);
  if (flag == 2) return 0;
  if (flag != 1) {
    __m256i mx = _mm256_setzero_si256(); /* max of 2 * byte: 0xFE iff a NaN code (magnitude 0x7F) */
    /* (a loop, not unrolled: fully unrolled, gcc turns the max chain into a
     * tree and spills the 4 * RR loaded vectors) */
#pragma GCC unroll 1
    for (int r = 0; r < RR; r++)
#pragma GCC unroll 4
      for (int j = 0; j < 128; j += 32) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)(w0 + r * rb + j));
        mx = _mm256_max_epu8(mx, _mm256_add_epi8(raw, raw));
      }
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(mx, _mm256_set1_epi8((char)0xfe)))) return 0;
  }
  if (MR == 1 && ctx->pre && ctx->pre[kb]) {
    /* x pre-multiplied by the block's factor, exactly */
    const float *xp = ctx->xs + k0;
    if (ctx->pat) {
      for (int j = 0; j < 128; j += 8) {
        __m256 xv = _mm256_loadu_ps(xp + j);
#pragma GCC unroll 8
        for (int r = 0; r < RR; r++) acc[0][r] = _mm256_fmadd_ps(xv, f8_pat(w0 + r * rb + j), acc[0][r]);
      }
    } else {
      for (int j = 0; j < 128; j += 16) {
        __m256 x0 = _mm256_loadu_ps(xp + j), x1 = _mm256_loadu_ps(xp + j + 8);
#pragma GCC unroll 8
        for (int r = 0; r < RR; r++) {
          __m256i h = f8_f16(w0 + r * rb + j);
          acc[0][r] = _mm256_fmadd_ps(x0, _mm256_cvtph_ps(_mm256_castsi256_si128(h)), acc[0][r]);
          acc[0][r] = _mm256_fmadd_ps(x1, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), acc[0][r]);
        }
      }
    }
    return 1;
  }
  const float *xk = x + k0;
  if (ctx->pat && sc <= 134) {
    const __m256 f = _mm256_castsi256_ps(_mm256_set1_epi32((sc + 120) << 23)); /* 2^(sc - 7) */
    const __m256 nz = _mm256_set1_ps(-0.0f);
    for (int j = 0; j < 128; j += 8) {
#pragma GCC unroll 8
      for (int r = 0; r < RR; r++) {
        /* fma(p, f, -0) = p * f rounded once, signed zeros included; unlike
         * vmulps it takes the subnormal patterns at full speed */
        __m256 w = _mm256_fmadd_ps(f8_pat(w0 + r * rb + j), f, nz);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + i * ldx + j), w, acc[i][r]);
      }
    }
    return 1;
  }
  const __m256 f = _mm256_castsi256_ps(_mm256_set1_epi32((sc + 8) << 23)); /* 2^(sc - 119) */
  for (int j = 0; j < 128; j += 16) {
#pragma GCC unroll 8
    for (int r = 0; r < RR; r++) {
      __m256i h = f8_f16(w0 + r * rb + j);
      __m256 a = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), f);
      __m256 b = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), f);
#pragma GCC unroll 8
      for (int i = 0; i < MR; i++) {
        acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + i * ldx + j), a, acc[i][r]);
        acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + i * ldx + j + 8), b, acc[i][r]);
      }
    }
  }
  return 1;
}

/* Records in l->nan8 which 128 x 128 blocks of the FP8 block row blk hold a
 * NaN code (magnitude 0x7F), scanning the blocks not recorded yet: a
 * weight's first forward reads each block once more, later ones skip the
 * per-group test in fused_fp8 (about a tenth of the work at M = 1). Threads
 * that scan the same block store the same value. */
static void fp8_scan(const struct tide_linear *l, int64_t blk) {
  const int64_t K = l->k, rb = l->view.row_bytes, n0 = blk * 128, n1 = n0 + 128 < l->n ? n0 + 128 : l->n;
  for (int64_t kb = 0; kb * 128 < K; kb++) {
    uint8_t *f = &l->nan8[blk * l->view.s_ld + kb];
    if (__atomic_load_n(f, __ATOMIC_RELAXED)) continue;
    const int64_t c0 = kb * 128, len = K - c0 < 128 ? K - c0 : 128;
    const uint8_t *w = l->view.w + n0 * rb + c0;
    int nan = 0;
    if (len == 128) {
      __m256i mx = _mm256_setzero_si256();
      for (int64_t r = 0; r < n1 - n0; r++)
        for (int j = 0; j < 128; j += 32) {
          __m256i raw = _mm256_loadu_si256((const __m256i *)(w + r * rb + j));
          mx = _mm256_max_epu8(mx, _mm256_add_epi8(raw, raw));
        }
      nan = _mm256_movemask_epi8(_mm256_cmpeq_epi8(mx, _mm256_set1_epi8((char)0xfe))) != 0;
    } else {
      for (int64_t r = 0; r < n1 - n0; r++)
        for (int64_t j = 0; j < len; j++) nan |= (w[r * rb + j] & 0x7f) == 0x7f;
    }
    __atomic_store_n(f, (uint8_t)(nan ? 2 : 1), __ATOMIC_RELAXED);
  }
}

/* MXFP4 decoding: the 8 magnitudes of e2m1 times the block scale 2^(sc -
 * 127) (scale byte 0 is 2^-127), one multiply each as the reference does,
 * stored xor-ed with index << 28: the lane's nibble, shifted down to bits
 * 0..3, picks the magnitude with vpermps (bits 0..2), and the nibble << 28
 * xor-ed back cancels the stored bits and sets the sign (bit 3). */
static inline __m256 mx_table(uint8_t sc) {
  const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256 c28 =
      _mm256_castsi256_ps(_mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28, 6 << 28, 7 << 28));
  const __m256 scale = _mm256_castsi256_ps(_mm256_set1_epi32(sc ? (int)sc << 23 : 0x00400000));
  return _mm256_xor_ps(_mm256_mul_ps(mag, scale), c28);
}

/* mx_table for every scale whose products are exact normal floats (0.5 *
 * 2^(sc - 127) >= 2^-126 and 6 * 2^(sc - 127) < 2^128), so their bits do not
 * depend on MXCSR (FTZ, DAZ, rounding): loading the table saves the kernel a
 * broadcast, a multiply and an xor per row and 32 columns (3% of the
 * instructions at M = 1). Filled once. */
enum { MX_LUT_LO = 2, MX_LUT_HI = 252 };
static _Alignas(32) float mx_lut[256][8];
static pthread_once_t mx_lut_once = PTHREAD_ONCE_INIT, mxp_once = PTHREAD_ONCE_INIT;
/* the row-pair MXFP4 kernel (mxp_rows) on or off (tide_linear_avx2_mxp) */
static int mxp_on = 1;

int tide_linear_avx2_mxp(int on) {
  const int old = mxp_on;
  if (on == 0 || on == 1) mxp_on = on;
  return old;
}

static void mx_lut_fill(void) {
  for (int sc = MX_LUT_LO; sc <= MX_LUT_HI; sc++) _mm256_store_ps(mx_lut[sc], mx_table((uint8_t)sc));
}

static inline __attribute__((always_inline)) void fused_rows(const int MR, const int RR, const int FMT,
                                                             const struct tide_linear *l, int64_t n, const float *x,
                                                             int64_t ldx, float *y, int64_t ldy, int flags,
                                                             const fused_ctx *ctx) {
  __m256 acc[FUSED_MAX_M][FUSED_MAX_RR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int r = 0; r < RR; r++) acc[i][r] = _mm256_setzero_ps();
  const int64_t K = l->k, rb = l->view.row_bytes;
  const uint8_t *w0 = l->view.w + n * rb;
  const int64_t B = FMT == TIDE_W_FP8 ? 128 : FMT == TIDE_W_MXFP4 ? 32 : 64;
  const int64_t kfull = K / B * B;
  for (int64_t k0 = 0; k0 < kfull; k0 += B) {
    const float *xk = x + k0;
    if (FMT == TIDE_W_FP8 || FMT == TIDE_W_MXFP4) {
      /* the same columns of the next group of rows, RR rows further on:
       * they arrive while this group is decoded */
      const int64_t bb = FMT == TIDE_W_FP8 ? 128 : 16; /* bytes of a row per block */
      if (FMT == TIDE_W_FP8 || (k0 & 127) == 0) {
        const uint8_t *pf = w0 + RR * rb + (k0 * bb) / B;
#pragma GCC unroll 8
        for (int r = 0; r < RR; r++)
          for (int64_t o = 0; o < (bb > 64 ? bb : 64); o += 64) _mm_prefetch((const char *)(pf + r * rb + o), _MM_HINT_T0);
      }
    } else {
      /* these stream at memory speed: the rows 1 KiB ahead */
      const int64_t bb = FMT == TIDE_W_F32 ? 256 : 128; /* bytes of a row per block */
      const uint8_t *pf = w0 + (k0 / B) * bb + PREFETCH_BYTES;
#pragma GCC unroll 8
      for (int r = 0; r < RR; r++)
        for (int64_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)(pf + r * rb + o), _MM_HINT_T0);
    }
    if (FMT == TIDE_W_FP8) {
      if (!fused_fp8(MR, RR, l, n, x, ldx, k0, ctx, acc)) fused_slow(MR, RR, l, n, x, ldx, k0, B, acc);
    } else if (FMT == TIDE_W_MXFP4) {
      const uint8_t *srow = l->view.s + n * l->view.s_ld + k0 / 32;
      int nan = 0;
#pragma GCC unroll 8
      for (int r = 0; r < RR; r++) nan |= srow[r * l->view.s_ld] == 0xff;
      if (nan) {
        fused_slow(MR, RR, l, n, x, ldx, k0, B, acc);
        continue;
      }
      const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
      /* each row's table: from mx_lut for the scales whose products are
       * normal floats, else formed here as mx_table does (same bits) */
      const float *t[FUSED_MAX_RR];
      _Alignas(32) float tb[FUSED_MAX_RR][8];
#pragma GCC unroll 8
      for (int r = 0; r < RR; r++) {
        const uint8_t sc = srow[r * l->view.s_ld];
        if (sc >= MX_LUT_LO && sc <= MX_LUT_HI) {
          t[r] = mx_lut[sc];
        } else {
          _mm256_store_ps(tb[r], mx_table(sc));
          t[r] = tb[r];
        }
      }
#pragma GCC unroll 4
      for (int q = 0; q < 4; q++) {
#pragma GCC unroll 8
        for (int r = 0; r < RR; r++) {
          uint32_t u;
          memcpy(&u, w0 + r * rb + k0 / 2 + 4 * q, 4);
          __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32((int)u), sh);
          __m256 v = _mm256_xor_ps(_mm256_permutevar8x32_ps(_mm256_load_ps(t[r]), idx),
                                   _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
#pragma GCC unroll 8
          for (int i = 0; i < MR; i++)
            acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + i * ldx + 8 * q), v, acc[i][r]);
        }
      }
    } else {
      for (int j = 0; j < 64; j += 8) {
#pragma GCC unroll 8
        for (int r = 0; r < RR; r++) {
          const uint8_t *p = w0 + r * rb;
          __m256 v;
          if (FMT == TIDE_W_F32) {
            v = _mm256_loadu_ps((const float *)p + k0 + j);
          } else if (FMT == TIDE_W_BF16) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + k0 + j)));
            v = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
          } else {
            v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + k0 + j)));
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; i++)
            acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + i * ldx + j), v, acc[i][r]);
        }
      }
    }
  }
  if (kfull < K) fused_slow(MR, RR, l, n, x, ldx, kfull, K - kfull, acc);
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int r = 0; r < RR; r++) tide_linear_store(&y[i * ldy + r], hsum8(acc[i][r]), flags);
}

/* MXFP4 by byte tables, two weight rows per vector ("row pairs").
 *
 * A row's 32-column block is 16 bytes; rows r and r + 1 go into the two
 * 128-bit halves of one register, their low nibbles (even columns) and high
 * nibbles (odd columns) apart. Every e2m1 code times a scale 2^(sc - 127)
 * is exactly a bf16, so two vpshufb per nibble vector look up its high and
 * low bytes in 16-entry tables for the half's scale (mxp_hi, mxp_lo), two
 * byte unpacks make bf16 words and two word unpacks with zero the f32
 * values: 19 shuffle-port operations per 64 weights where the vpermps
 * decoder needs 24 (and a broadcast) per 64.
 *
 * The f32 vectors come out as [r: c, c+2, c+4, c+6 | r+1: the same] for
 * c = 8j (even) and 8j + 1 (odd), j = 0..3 in the block: each lane keeps one
 * row's one residue class of k mod 8, visited in increasing k, so two
 * accumulators per row pair and row of x hold exactly the eight lanes of the
 * invariant dot form (lane q: fmaf over k = q mod 8 in increasing k), and
 * the end sums them as hsum8 does: bitwise the same results. x is read
 * through a copy in the same lane order, 2K floats per row (xp). A block
 * with a scale outside [MX_LUT_LO, MX_LUT_HI] (NaN, subnormal or overflowing
 * products) goes through tide_dequant_block as fused_slow does. */
enum { MXP_MAX_K = 8192, MXP_MAX_M = 2 };
static _Alignas(16) uint8_t mxp_hi[256][16], mxp_lo[256][16];

static void mxp_fill(void) {
  for (int sc = MX_LUT_LO; sc <= MX_LUT_HI; sc++)
    for (int c = 0; c < 16; c++) {
      uint32_t u; /* mx_lut holds magnitude x scale xor-ed with (c & 7) << 28: undo that, add the sign */
      memcpy(&u, &mx_lut[sc][c & 7], 4);
      u ^= (uint32_t)(c & 7) << 28;
      if (c & 8) u |= 0x80000000u;
      mxp_hi[sc][c] = (uint8_t)(u >> 24);
      mxp_lo[sc][c] = (uint8_t)(u >> 16);
    }
}

/* x rows [0, m) in the row-pair lane order: per 8 columns, the even ones
 * twice, then the odd ones twice */
static void mxp_permute(const float *x, int64_t ldx, int m, int64_t K, float *xp) {
  for (int i = 0; i < m; i++)
    for (int64_t j = 0; j < K / 8; j++) {
      const float *a = x + i * ldx + 8 * j;
      float *o = xp + i * 2 * K + 16 * j;
      for (int q = 0; q < 4; q++) {
        o[q] = o[4 + q] = a[2 * q];
        o[8 + q] = o[12 + q] = a[2 * q + 1];
      }
    }
}

static inline float mxp_sum(const float *e, const float *o) {
  /* e: classes 0, 2, 4, 6; o: 1, 3, 5, 7; the hsum8 order */
  return ((e[0] + e[2]) + (e[1] + e[3])) + ((o[0] + o[2]) + (o[1] + o[3]));
}

/* rows [n, n + 2 RP) for MR rows of x (xp: mxp_permute's copy) */
static inline __attribute__((always_inline)) void mxp_rows(const int MR, const int RP, const struct tide_linear *l,
                                                           int64_t n, const float *xp, float *y, int64_t ldy,
                                                           int flags) {
  const int64_t K = l->k, rb = l->view.row_bytes, sl = l->view.s_ld;
  const uint8_t *w0 = l->view.w + n * rb, *s0 = l->view.s + n * sl;
  const __m256i m4 = _mm256_set1_epi8(0x0f), z = _mm256_setzero_si256();
  __m256 ae[MXP_MAX_M][2], ao[MXP_MAX_M][2];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
    for (int p = 0; p < RP; p++) ae[i][p] = ao[i][p] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    const int64_t kb = k0 / 32;
    if ((k0 & 127) == 0) { /* the next group's rows, 128 columns on */
#pragma GCC unroll 4
      for (int r = 0; r < 2 * RP; r++) _mm_prefetch((const char *)(w0 + (2 * RP + r) * rb + k0 / 2), _MM_HINT_T0);
    }
    int odd = 0;
#pragma GCC unroll 4
    for (int r = 0; r < 2 * RP; r++) {
      const uint8_t sc = s0[r * sl + kb];
      odd |= sc < MX_LUT_LO || sc > MX_LUT_HI;
    }
    const float *xk = xp + 2 * k0;
    if (__builtin_expect(odd, 0)) {
      _Alignas(32) float buf[4][40];
      tide_dequant_block(&buf[0][0], 40, &l->view, n, 2 * RP, k0, 32, 32, &tide_dequant_avx2);
      for (int p = 0; p < RP; p++)
        for (int j = 0; j < 4; j++) {
          _Alignas(32) float ve[8], vo[8];
          for (int q = 0; q < 4; q++) {
            ve[q] = buf[2 * p][8 * j + 2 * q];
            ve[4 + q] = buf[2 * p + 1][8 * j + 2 * q];
            vo[q] = buf[2 * p][8 * j + 2 * q + 1];
            vo[4 + q] = buf[2 * p + 1][8 * j + 2 * q + 1];
          }
          for (int i = 0; i < MR; i++) {
            const float *xi = xk + i * 2 * K + 16 * j;
            ae[i][p] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), _mm256_load_ps(ve), ae[i][p]);
            ao[i][p] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), _mm256_load_ps(vo), ao[i][p]);
          }
        }
      continue;
    }
#pragma GCC unroll 2
    for (int p = 0; p < RP; p++) {
      const uint8_t *a = w0 + 2 * p * rb + k0 / 2;
      const uint8_t sa = s0[2 * p * sl + kb], sb = s0[(2 * p + 1) * sl + kb];
      const __m256i v = _mm256_loadu2_m128i((const __m128i *)(a + rb), (const __m128i *)a);
      const __m256i th = _mm256_loadu2_m128i((const __m128i *)mxp_hi[sb], (const __m128i *)mxp_hi[sa]);
      const __m256i tl = _mm256_loadu2_m128i((const __m128i *)mxp_lo[sb], (const __m128i *)mxp_lo[sa]);
      const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      const __m256i he = _mm256_shuffle_epi8(th, lo), le = _mm256_shuffle_epi8(tl, lo);
      const __m256i ho = _mm256_shuffle_epi8(th, hi), lq = _mm256_shuffle_epi8(tl, hi);
      const __m256i wea = _mm256_unpacklo_epi8(le, he), web = _mm256_unpackhi_epi8(le, he);
      const __m256i woa = _mm256_unpacklo_epi8(lq, ho), wob = _mm256_unpackhi_epi8(lq, ho);
      const __m256 e[4] = {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, wea)),
                           _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, wea)),
                           _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, web)),
                           _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, web))};
      const __m256 o[4] = {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, woa)),
                           _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, woa)),
                           _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, wob)),
                           _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, wob))};
#pragma GCC unroll 4
      for (int j = 0; j < 4; j++)
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
          const float *xi = xk + i * 2 * K + 16 * j;
          ae[i][p] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), e[j], ae[i][p]);
          ao[i][p] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), o[j], ao[i][p]);
        }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
    for (int p = 0; p < RP; p++) {
      _Alignas(32) float e[8], o[8];
      _mm256_store_ps(e, ae[i][p]);
      _mm256_store_ps(o, ao[i][p]);
      tide_linear_store(&y[i * ldy + 2 * p], mxp_sum(e, o), flags);
      tide_linear_store(&y[i * ldy + 2 * p + 1], mxp_sum(e + 4, o + 4), flags);
    }
}

#define MXP(mr, rp)                                                                                        \
  static void mxp_##mr##_##rp(const struct tide_linear *l, int64_t n, const float *xp, float *y, int64_t ldy, \
                              int flags) {                                                                  \
    mxp_rows(mr, rp, l, n, xp, y, ldy, flags);                                                               \
  }
MXP(1, 2) MXP(2, 2)
#undef MXP
typedef void (*mxp_fn)(const struct tide_linear *l, int64_t n, const float *xp, float *y, int64_t ldy, int flags);
/* [M - 1]: row pairs per group (4 or 8 accumulators), and the kernel. At
 * M = 3 and 4 (one or two pairs) it measured no faster than the vpermps
 * kernels, whose decode is already shared by the rows of x. */
static const int mxp_rp[MXP_MAX_M] = {2, 2};
static const mxp_fn mxp_tab[MXP_MAX_M] = {mxp_1_2, mxp_2_2};

typedef void (*fused_fn)(const struct tide_linear *l, int64_t n, const float *x, int64_t ldx, float *y, int64_t ldy,
                         int flags, const fused_ctx *ctx);
#define FK(mr, rr, fmt)                                                                                        \
  static void fused_##mr##_##rr##_##fmt(const struct tide_linear *l, int64_t n, const float *x, int64_t ldx, \
                                        float *y, int64_t ldy, int flags, const fused_ctx *ctx) {           \
    fused_rows(mr, rr, fmt, l, n, x, ldx, y, ldy, flags, ctx);                                               \
  }
/* every (M, rows) pair of fused_rr, and one row for the ragged ends */
#define FK_PLAIN(fmt)                                                                                           \
  FK(1, 1, fmt) FK(1, 4, fmt) FK(2, 1, fmt) FK(2, 4, fmt) FK(3, 1, fmt) FK(3, 3, fmt) FK(4, 1, fmt) FK(4, 3, fmt) \
  FK(5, 1, fmt) FK(5, 2, fmt) FK(6, 1, fmt) FK(6, 2, fmt) FK(7, 1, fmt) FK(8, 1, fmt)
FK_PLAIN(0) FK_PLAIN(1) FK_PLAIN(2)
FK(1, 1, 3) FK(1, 8, 3) FK(2, 1, 3) FK(2, 4, 3) FK(3, 1, 3) FK(3, 3, 3) FK(4, 1, 3) FK(4, 3, 3)
FK(5, 1, 3) FK(5, 2, 3) FK(6, 1, 3) FK(6, 2, 3) FK(7, 1, 3) FK(8, 1, 3)
FK(1, 1, 4) FK(1, 4, 4) FK(2, 1, 4) FK(2, 4, 4) FK(3, 1, 4) FK(3, 2, 4) FK(4, 1, 4) FK(4, 2, 4)
FK(5, 1, 4) FK(5, 2, 4) FK(6, 1, 4) FK(6, 2, 4) FK(7, 1, 4) FK(8, 1, 4)
#undef FK_PLAIN
#undef FK
#define FK_ROW(fmt, a, b, c, d, e, f, g, h)                                                                     \
  {{fused_1_1_##fmt, fused_1_##a##_##fmt}, {fused_2_1_##fmt, fused_2_##b##_##fmt},                             \
   {fused_3_1_##fmt, fused_3_##c##_##fmt}, {fused_4_1_##fmt, fused_4_##d##_##fmt},                             \
   {fused_5_1_##fmt, fused_5_##e##_##fmt}, {fused_6_1_##fmt, fused_6_##f##_##fmt},                             \
   {fused_7_1_##fmt, fused_7_##g##_##fmt}, {fused_8_1_##fmt, fused_8_##h##_##fmt}}
/* [format][M - 1][group of fused_rr rows or one row]; must match fused_rr */
static const fused_fn fused_tab[5][FUSED_MAX_M][2] = {
    FK_ROW(0, 4, 4, 3, 3, 2, 2, 1, 1), FK_ROW(1, 4, 4, 3, 3, 2, 2, 1, 1), FK_ROW(2, 4, 4, 3, 3, 2, 2, 1, 1),
    FK_ROW(3, 8, 4, 3, 3, 2, 2, 1, 1), FK_ROW(4, 4, 4, 2, 2, 2, 2, 1, 1)};
#undef FK_ROW

/* Passes for M > 6: the rows of x are cut into passes of at most PASS rows,
 * as even as possible, and each group of weight rows is run once per pass
 * (the first pass reads it from memory, the others decode it again from L1).
 * A group then has pass_g[format] rows whatever the pass size, so every pass
 * size 1..PASS has a kernel for it; ragged ends take the one-row kernels. */
#define FK(mr, rr, fmt)                                                                                        \
  static void fused_##mr##_##rr##_##fmt(const struct tide_linear *l, int64_t n, const float *x, int64_t ldx, \
                                        float *y, int64_t ldy, int flags, const fused_ctx *ctx) {           \
    fused_rows(mr, rr, fmt, l, n, x, ldx, y, ldy, flags, ctx);                                               \
  }
#define FK_PASS3(fmt) FK(1, 3, fmt) FK(2, 3, fmt)
#define FK_PASS2(fmt) FK(1, 2, fmt) FK(2, 2, fmt) FK(3, 2, fmt) FK(4, 2, fmt)
FK_PASS3(0) FK_PASS3(1) FK_PASS3(2) FK_PASS3(3) FK_PASS2(0) FK_PASS2(1) FK_PASS2(2) FK_PASS2(3)
FK(1, 2, 4) FK(2, 2, 4)
#undef FK_PASS3
#undef FK_PASS2
#undef FK
enum { PASS_MAX = 8 };
/* [format][group rows 1..3][pass rows - 1] */
#define PT3(f) {fused_1_3_##f, fused_2_3_##f, fused_3_3_##f, fused_4_3_##f}
#define PT2(f) {fused_1_2_##f, fused_2_2_##f, fused_3_2_##f, fused_4_2_##f, fused_5_2_##f, fused_6_2_##f}
#define PT1(f) {fused_1_1_##f, fused_2_1_##f, fused_3_1_##f, fused_4_1_##f, fused_5_1_##f, fused_6_1_##f, \
                fused_7_1_##f, fused_8_1_##f}
static const fused_fn pass_tab[5][4][PASS_MAX] = {
    {{0}, PT1(0), PT2(0), PT3(0)}, {{0}, PT1(1), PT2(1), PT3(1)}, {{0}, PT1(2), PT2(2), PT3(2)},
    {{0}, PT1(3), PT2(3), PT3(3)}, {{0}, PT1(4), PT2(4), {0}},
};
#undef PT1
#undef PT2
#undef PT3

/* FP8 at M = 1: the block factor 2^(sc - bias) can move from the weight to
 * x when that is exact: x * 2^(sc - bias) must be a normal float (or zero,
 * inf, NaN) for every x of the row, with the factor itself normal; then the
 * digits of x are kept, fma(x * c, w, acc) and fma(x, w * c, acc) see the
 * same exact product and give the same bits (the weight w * c is exact for
 * every fp8 code and scale <= 246), and the decoder saves its multiply.
 * bias is 7 for the f32 pattern, 119 for the f16 pattern. Returns the
 * allowed scale range [*lo, *hi] (empty when *lo > *hi). */
static void prescale_range(const float *x, int64_t K, int bias, int *lo, int *hi) {
  float amax = 0.0f, amin = INFINITY;
  const __m256 inf = _mm256_set1_ps(INFINITY), absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps(), vmin = inf;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + k), absm);
    __m256 fin = _mm256_cmp_ps(a, inf, _CMP_LT_OQ); /* finite (NaN compares false) */
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(a, fin));
    __m256 nz = _mm256_and_ps(fin, _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_NEQ_OQ));
    vmin = _mm256_min_ps(vmin, _mm256_blendv_ps(inf, a, nz));
  }
  _Alignas(32) float t0[8], t1[8];
  _mm256_store_ps(t0, vmax);
  _mm256_store_ps(t1, vmin);
  for (int i = 0; i < 8; i++) {
    if (t0[i] > amax) amax = t0[i];
    if (t1[i] < amin) amin = t1[i];
  }
  for (; k < K; k++) {
    float a = fabsf(x[k]);
    if (a == INFINITY || a != a) continue; /* inf/NaN give the same result either way */
    if (a > amax) amax = a;
    if (a != 0.0f && a < amin) amin = a;
  }
  int e, emax = -200, emin = 200;
  if (amax > 0.0f) {
    frexpf(amax, &e);
    emax = e - 1; /* |x| < 2^(emax + 1) */
  }
  if (amin < INFINITY) {
    frexpf(amin, &e);
    emin = e - 1; /* |x| >= 2^emin */
  }
  int h = 127 + bias - emax, lw = bias - 126 - emin;
  if (h > 127 + bias) h = 127 + bias; /* the factor is a normal float */
  if (h > 246) h = 246;               /* the weights are finite */
  if (lw < bias - 126) lw = bias - 126;
  if (lw < 0) lw = 0;
  *hi = h;
  *lo = lw;
}

enum { PRESCALE_MAX_K = 16384, FUSED_MAX_PASSES = 64 };

/* rows per group for passes of at most p rows of x (a kernel for every pass
 * size 1..p must exist in pass_tab): 8-12 accumulators */
static int pass_g(int fmt, int p) { return p <= 4 ? (fmt == TIDE_W_MXFP4 ? 2 : 3) : p <= 6 ? 2 : 1; }

/* Per format: the largest M that runs the fused kernels, and the most rows
 * of x per pass above M = 6 (measured from DRAM, docs/linear.md) */
static int fused_max_m[5] = {24, 24, 24, 16, 8}, pass_rows[5] = {4, 4, 4, 6, 4};

void tide_linear_avx2_fused_tune(int fmt, int *max_m, int *pass) {
  if (fmt < 0 || fmt > TIDE_W_MXFP4) {
    *max_m = *pass = -1;
    return;
  }
  const int old_m = fused_max_m[fmt], old_p = pass_rows[fmt];
  if (*max_m >= 0 && *max_m <= FUSED_MAX_PASSES) fused_max_m[fmt] = *max_m;
  if (*pass >= 3 && *pass <= PASS_MAX) pass_rows[fmt] = *pass;
  *max_m = old_m;
  *pass = old_p;
}

static void fused_gemv(const struct tide_linear *l, int64_t r0, int64_t nr, const float *x, int64_t ldx, float *y,
                       int64_t ldy, int64_t m, int flags) {
  const fused_fn *tab = fused_tab[l->fmt][(m <= FUSED_MAX_M ? m : 1) - 1];
  if (l->fmt == TIDE_W_MXFP4) {
    pthread_once(&mx_lut_once, mx_lut_fill);
    pthread_once(&mxp_once, mxp_fill);
  }
  const int64_t K = l->k;
  fused_ctx ctx = {NULL, NULL, !(_mm_getcsr() & 0x0040)}; /* MXCSR.DAZ would zero the f32 subnormal patterns */
  const int bias = ctx.pat ? 7 : 119;
  const int pre_on = l->fmt == TIDE_W_FP8 && m == 1 && K <= PRESCALE_MAX_K;
  _Alignas(32) float xs[pre_on ? PRESCALE_MAX_K : 1];
  uint8_t pre[pre_on ? PRESCALE_MAX_K / 128 : 1];
  int lo = 0, hi = -1;
  if (pre_on) {
    prescale_range(x, K, bias, &lo, &hi);
    ctx.xs = xs;
    ctx.pre = pre;
  }
  /* M <= 6: one pass of fused_rr rows per group; more rows of x: passes */
  const int prow = pass_rows[l->fmt];
  const int npass = m <= 6 ? 1 : (int)((m + prow - 1) / prow);
  const int g = npass == 1 ? fused_rr[l->fmt][m] : pass_g(l->fmt, prow);
  int pm[FUSED_MAX_PASSES]; /* rows of x per pass, as even as possible */
  for (int p = 0; p < npass; p++) pm[p] = (int)(m / npass + (p < m % npass));
  tide_fused_fn zf = NULL;
  int zg = 0;
#ifdef TIDE_HAVE_AVX512
  if (tide_linear_avx512_ready()) zg = tide_linear_avx512_group(l->fmt, m, ctx.pat, &zf);
#endif
  /* MXFP4 at M <= MXP_MAX_M: groups of row pairs through mxp_rows */
  const int mxp = l->fmt == TIDE_W_MXFP4 && m <= MXP_MAX_M && !zg && K <= MXP_MAX_K && K % 32 == 0 && mxp_on;
  float xpbuf[mxp ? 2 * K * m : 1];
  if (mxp) mxp_permute(x, ldx, (int)m, K, xpbuf);
  int64_t blk = -1, sblk = -1;
  for (int64_t n = r0; n < r0 + nr;) {
    if (mxp && r0 + nr - n >= 2 * mxp_rp[m - 1]) {
      mxp_tab[m - 1](l, n, xpbuf, y + (n - r0), ldy, flags);
      n += 2 * mxp_rp[m - 1];
      continue;
    }
    if (l->fmt == TIDE_W_FP8 && n / 128 != sblk) {
      sblk = n / 128;
      fp8_scan(l, sblk);
    }
    if (pre_on && n / 128 != blk) { /* a new 128-row block: its scales decide */
      blk = n / 128;
      const uint8_t *srow = l->view.s + blk * l->view.s_ld;
      for (int64_t kb = 0; kb * 128 < K; kb++) {
        int sc = srow[kb];
        pre[kb] = kb * 128 + 128 <= K && sc >= lo && sc <= hi;
        if (!pre[kb]) continue;
        const __m256 c = _mm256_castsi256_ps(_mm256_set1_epi32((sc - bias + 127) << 23));
        for (int j = 0; j < 128; j += 8)
          _mm256_store_ps(xs + kb * 128 + j, _mm256_mul_ps(_mm256_loadu_ps(x + kb * 128 + j), c));
      }
    }
    /* a group of g (or zg) rows; an FP8 group must share one 128-row scale
     * block */
    if (zg && r0 + nr - n >= zg && (l->fmt != TIDE_W_FP8 || n / 128 == (n + zg - 1) / 128)) {
      zf(l, n, x, ldx, y + (n - r0), ldy, flags, &ctx);
      n += zg;
      continue;
    }
    int big = r0 + nr - n >= g && (l->fmt != TIDE_W_FP8 || n / 128 == (n + g - 1) / 128);
    if (npass == 1) {
      tab[big](l, n, x, ldx, y + (n - r0), ldy, flags, &ctx);
    } else {
      const fused_fn *pt = big ? pass_tab[l->fmt][g] : pass_tab[l->fmt][1];
      for (int p = 0, i0 = 0; p < npass; i0 += pm[p++])
        pt[pm[p] - 1](l, n, x + i0 * ldx, ldx, y + (n - r0) + i0 * ldy, ldy, flags, &ctx);
    }
    n += big ? g : 1;
  }
}

/* The panel of rows [n, n + nn) x columns from k on (k < K), or when k is
 * past the end the first columns of the next rows up to nend, into L1. With
 * few rows of x each panel is used briefly and the next one comes from DRAM:
 * 24 row streams of 512 columns each, which the hardware prefetchers do not
 * follow well; fetching it while this one is used measured +10-30% (M = 16
 * from DRAM). */
static void panel_prefetch(const struct tide_linear *l, int64_t n, int64_t nn, int64_t nend, int64_t k) {
  const int64_t K = l->k, rb = l->view.row_bytes;
  if (k >= K) {
    n += nn;
    k = 0;
    nn = nend - n < NC ? nend - n : NC;
  }
  /* bytes [b0, b1) of each row (K is a multiple of 32 for MXFP4, so whole bytes) */
  const int64_t b0 = k * rb / K, b1 = (k + KC < K ? k + KC : K) * rb / K;
  const uint8_t *w = l->view.w + n * rb;
  for (int64_t r = 0; r < nn; r++)
    for (int64_t o = b0; o < b1; o += 64) _mm_prefetch((const char *)(w + r * rb + o), _MM_HINT_T0);
}

void tide_linear_avx2_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const float *x, int64_t ldx, float *y,
                           int64_t ldy, int64_t m, int flags) {
  if (m <= fused_max_m[l->fmt]) {
    fused_gemv(l, r0, nr, x, ldx, y, ldy, m, flags);
    return;
  }
  _Alignas(64) float P[NC * KCP];
  _Alignas(64) float A[MC * NC * 8];
  const int64_t K = l->k;
  const int64_t nc = NC;
  for (int64_t n0 = 0; n0 < nr; n0 += nc) {
    const int64_t nn = nr - n0 < nc ? nr - n0 : nc;
    for (int64_t m0 = 0; m0 < m; m0 += MC) {
      const int64_t mm = m - m0 < MC ? m - m0 : MC;
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kk = K - k0 < KC ? K - k0 : KC;
        if (m <= MC) panel_prefetch(l, r0 + n0, nn, r0 + nr, k0 + KC);
        tide_dequant_block(P, KCP, &l->view, r0 + n0, nn, k0, kk, (kk + 7) & ~(int64_t)7, &tide_dequant_avx2);
        for (int64_t i0 = 0; i0 < mm; i0 += 4) {
          const int mr = mm - i0 < 4 ? (int)(mm - i0) : 4, w = tile_nr[mr];
          const float *xi = x + (m0 + i0) * ldx + k0;
          for (int64_t j0 = 0; j0 < nn; j0 += w) {
            const int nrt = nn - j0 < w ? (int)(nn - j0) : w;
            tiles[mr][nrt](xi, ldx, P + j0 * KCP, kk, A + (i0 * NC + j0) * 8, k0 == 0);
          }
        }
      }
      for (int64_t i = 0; i < mm; i++)
        for (int64_t j = 0; j < nn; j++)
          tide_linear_store(&y[(m0 + i) * ldy + n0 + j], hsum8(_mm256_load_ps(A + (i * NC + j) * 8)), flags);
    }
  }
}
