/* linear_q8.h - the opt-in int8-activation path for MXFP4 weights
 * (policy TIDE_LINEAR_Q8, docs/linear.md "int8 activations").
 *
 * Each row of x is quantised per block of 32 columns (the MXFP4 scale
 * block): d = amax / 127, q = nearest-even(x * (127 / amax)), so that
 * x ~ d * q with |q| <= 127. A weight block is 2 * e2m1 (an integer w in
 * -12..12) times 2^(s - 128).
 *
 * The dot form works on pairs of blocks (2p, 2p + 1), eight f32 lanes per
 * output: lane j < 4 takes columns 8j..8j+7 of block 2p, lane j >= 4 columns
 * 8(j-4)..8(j-4)+7 of block 2p + 1. Per pair and lane the 8 integer products
 * w * q are summed exactly (int32), then t = float(sum) * d_x and
 * acc = fma(t, 2^(s - 128), acc) with the lane's block factors; a block past
 * the end (K / 32 odd) counts as sum 0 with both factors 0. After the last
 * pair the lanes are added as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
 *
 * The AVX2 kernel uses the weight bytes as stored: the low nibbles of a
 * block's 16 bytes are its even columns, the high nibbles its odd ones, so x
 * is stored per pair as [even columns of 2p | of 2p+1 | odd of 2p | of 2p+1]
 * (64 bytes). The byte products come from vpmaddubsw on the unsigned w + 12;
 * each lane's 12 * sum(q) (stored with x) is subtracted in int32, which
 * gives exactly sum(w * q).
 *
 * The result of one (row of x, row of W) depends on nothing else: the path
 * is invariant to the batch, the row range and the thread count like the
 * exact one, only its numbers differ (by the int8 rounding of x). */
#ifndef TIDE_KERNELS_LINEAR_Q8_H
#define TIDE_KERNELS_LINEAR_Q8_H

#include "linear.h"

/* Quantised rows of x: m rows of K = 32 * nb columns, np = ceil(nb / 2)
 * pairs. Row i's data starts at q + i * 64 * np, c + i * 8 * np,
 * d + i * 8 * np. */
typedef struct tide_q8_rows {
  const int8_t *q;    /* [m, np, 64] in the pair order above (zeros past the end) */
  const int32_t *c;   /* [m, np, 8] 12 * the sum of each lane's 8 q */
  const float *d;     /* [m, np, 8] each lane's block factor (0: an all-zero block or past the end;
                       * NaN: a block holding Inf/NaN) */
} tide_q8_rows;

/* bytes of quantised x for m rows of K columns (q, c, d, each 32-aligned
 * when the base is) */
static inline size_t tide_q8_bytes(int64_t m, int64_t K) {
  int64_t np = (K / 32 + 1) / 2;
  return (size_t)(m * np) * (64 + 32 + 32);
}
/* the three arrays inside a block of tide_q8_bytes(m, K) bytes */
static inline tide_q8_rows tide_q8_layout(void *base, int64_t m, int64_t K) {
  int64_t np = (K / 32 + 1) / 2;
  tide_q8_rows r;
  r.q = (const int8_t *)base;
  r.c = (const int32_t *)((char *)base + m * np * 64);
  r.d = (const float *)((char *)base + m * np * 96);
  return r;
}

/* The policy applies to this handle: MXFP4 (K a multiple of 32), or any
 * other format whose weight was rounded to int8 when the policy was set
 * (q8w; same rule for the weight as for x: per 32-column block
 * d = amax / 127, q = nearest-even(w * 127 / amax)). */
static inline int tide_linear_q8_applies(const struct tide_linear *l) {
  return l->policy == TIDE_LINEAR_Q8 && l->k % 32 == 0 && l->k > 0 && (l->fmt == TIDE_W_MXFP4 || l->q8w);
}

/* Round rows [r0, r0 + nr) of l's weight into l->q8w / l->q8s (single
 * threaded; the caller splits rows). buf: K floats of scratch. */
void tide_q8_quantize_weight_rows(struct tide_linear *l, int64_t r0, int64_t nr, float *buf);
/* int8-weight rows: the same contract as the MXFP4 ones below, the weight
 * from l->q8w / l->q8s. */
void tide_linear_q8w_ref_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                              int64_t ldy, int64_t m, int flags);

/* Quantise m rows of K floats (row stride ldx) into out (tide_q8_layout of
 * the same m, K): scalar reference and the AVX2 version (bitwise the same). */
void tide_q8_quantize_ref(const float *x, int64_t ldx, int64_t m, int64_t K, const tide_q8_rows *out);
/* Rows [r0, r0 + nr) of W against m quantised rows (the contract of
 * tide_linear_avx2_rows, with x given as tide_q8_rows). */
void tide_linear_q8_ref_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                             int64_t ldy, int64_t m, int flags);
#if defined(__x86_64__)
void tide_q8_quantize_avx2(const float *x, int64_t ldx, int64_t m, int64_t K, const tide_q8_rows *out);
void tide_linear_q8_avx2_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                              int64_t ldy, int64_t m, int flags);
void tide_linear_q8w_avx2_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                               int64_t ldy, int64_t m, int flags);
/* n (32 or 64) floats: nearest-even q by column and the factor (the AVX2
 * form of the reference's rule, bitwise the same) */
float tide_q8_span_avx2(const float *xb, int n, int8_t *qc);
#endif

/* the quantisers' common tail: store block b's q (by column) and factor d
 * into a row's pair layout; zero the missing half pair of a row (odd nb) */
void tide_q8_store_block(const int8_t *qcol, float d, int64_t b, int8_t *qrow, int32_t *crow, float *drow);
void tide_q8_pad_row(int64_t nb, int8_t *qrow, int32_t *crow, float *drow);

/* 2^(s - 128) for every e8m0 scale byte (0xFF: NaN): the factor of the
 * doubled e2m1 integers. Filled once. */
const float *tide_q8_wscale(void);

#endif
