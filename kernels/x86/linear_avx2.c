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
 * M <= TIDE_LIN_MC rows of x share each decoded panel, so for decode
 * (M <= 8) every weight byte is read and decoded once; the panel (24 rows x
 * 512 columns, 48 KiB) and the x block stay in L1/L2 while the weight
 * streams from DRAM. For prefill the same loops are compute bound: the
 * micro-kernels do 12 FMAs per 7 loads. */
#include <immintrin.h>

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

void tide_linear_avx2_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const float *x, int64_t ldx, float *y,
                           int64_t ldy, int64_t m, int flags) {
  _Alignas(64) float P[NC * KCP];
  _Alignas(64) float A[MC * NC * 8];
  const int64_t K = l->k;
  for (int64_t n0 = 0; n0 < nr; n0 += NC) {
    const int64_t nn = nr - n0 < NC ? nr - n0 : NC;
    for (int64_t m0 = 0; m0 < m; m0 += MC) {
      const int64_t mm = m - m0 < MC ? m - m0 : MC;
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kk = K - k0 < KC ? K - k0 : KC;
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
