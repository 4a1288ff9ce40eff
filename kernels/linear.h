/* linear.h - internals of the linear-layer interface shared by its kernels.
 *
 * Contract of every row kernel: for the weight rows [r0, r0 + nr) and
 * i < m, y[i * ldy + j] = epilogue(sum_k x[i * ldx + k] * W[r0 + j, k]) for
 * j < nr, with x rows of K floats at stride ldx and y rows at stride ldy
 * (floats; y points at the output of row r0). Kernels are single threaded;
 * engine/linear.c splits rows and jobs across threads. */
#ifndef TIDE_KERNELS_LINEAR_H
#define TIDE_KERNELS_LINEAR_H

#include "dequant.h"
#include "tide_internal.h"

struct tide_linear {
  tide_tensor w;        /* [N, K] (MXFP4: [N, K/2] bytes) */
  tide_tensor scale;    /* FP8: e8m0 [ceil(N/128), ceil(K/128)]; MXFP4: e8m0 [N, K/32]; else empty */
  int fmt;              /* tide_wfmt */
  int policy;           /* TIDE_LINEAR_INVARIANT / TIDE_LINEAR_FAST */
  int64_t n, k;
  int64_t wbytes;       /* weight + scale bytes */
  tide_wview view;      /* raw pointers for the decoders */
  int8_t *q8w;          /* Q8 policy on a non-MXFP4 weight: the weight rounded to int8 per 32 columns, rows of
                         * 64 * ceil(K / 64) bytes in the pair order of linear_q8.h (NULL otherwise) */
  float *q8s;           /* its factor per row and 64-column pair [N, ceil(K / 64)] */
  uint8_t *nan8;        /* FP8: per 128 x 128 block (the scale's shape), 0 = not scanned yet, 1 = no NaN code,
                         * 2 = a NaN code; the AVX2 kernel fills it on first use (relaxed atomics) */
};

/* The output step shared by every kernel: add the old y (ACCUMULATE), round
 * to bf16 precision (ROUND_BF16), store. */
static inline void tide_linear_store(float *yp, float v, int flags) {
  if (flags & TIDE_LINEAR_ACCUMULATE) v = *yp + v;
  if (flags & TIDE_LINEAR_ROUND_BF16) v = tide_round_bf16(v);
  *yp = v;
}

/* Value of W[n, k] after dequantisation (the reference semantics). */
float tide_linear_weight_at(const struct tide_linear *l, int64_t n, int64_t k);

/* Scalar reference over all N rows: double accumulation, any format. */
void tide_linear_ref(const struct tide_linear *l, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t m);
/* The same over rows [r0, r0 + nr), with the output flags. */
void tide_linear_ref_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const float *x, int64_t ldx, float *y,
                          int64_t ldy, int64_t m, int flags);
/* Scalar model of the invariant dot form the AVX2 kernels compute: per
 * (m, n) eight f32 lanes (lane = k mod 8, k increasing, fmaf, the last
 * group zero-padded), then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Bitwise
 * equal to the AVX2 kernels (tests use it to pin the order down). Slow. */
void tide_linear_dot_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const float *x, int64_t ldx, float *y,
                          int64_t ldy, int64_t m, int flags);

#if defined(__x86_64__)
/* The AVX2 kernel: for small M (up to 24, FP8 16, MXFP4 8) decodes groups of
 * weight rows in registers and feeds them to the FMAs (every weight read
 * once per call, decoded once per pass of at most 4-6 rows of x; the M <= 8
 * FP8 and MXFP4 groups go to the AVX-512 kernels where ready); for larger M it
 * dequantises panels of at most TIDE_LIN_NC rows x TIDE_LIN_KC columns into a
 * stack buffer with the dequant.h decoders and runs register-tiled dot-form
 * micro-kernels over them (each weight decoded once per TIDE_LIN_MC rows). */
void tide_linear_avx2_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const float *x, int64_t ldx, float *y,
                           int64_t ldy, int64_t m, int flags);

/* Hook for benchmarks and tests: for weight format fmt (TIDE_W_*), sets the
 * largest M that runs the fused kernels (0..64; 0 sends every M to the
 * panels) and the most rows of x per fused pass above M = 6 (3..8) to *max_m
 * and *pass (other values keep the setting), and returns the previous
 * settings in them (-1 for an unknown format). The results do not change.
 * Not thread-safe against forwards. */
void tide_linear_avx2_fused_tune(int fmt, int *max_m, int *pass);

/* Hook for benchmarks and tests: the row-pair MXFP4 kernel for M <= 2
 * (mxp_rows in linear_avx2.c) on (1) or off (0; the vpermps kernels run
 * instead); other values keep the setting. Returns the previous one. The
 * results do not change. Not thread-safe against forwards. */
int tide_linear_avx2_mxp(int on);

/* The fused kernels for M <= 8 (decode in registers, no panel) work on
 * groups of rows; this is what a call shares with each group. */
typedef struct tide_fused_ctx {
  const float *xs;    /* M = 1, FP8: x times the block factor of the group's 128-row block, per 128-column block */
  const uint8_t *pre; /* pre[kb]: xs holds column block kb (else the weights take the factor) */
  int pat;            /* FP8 decodes through the f32 pattern fp8 * 2^-120 (MXCSR.DAZ clear) */
} tide_fused_ctx;

/* One group kernel: rows [n, n + rows) of W for m rows of x (m and rows
 * fixed by the kernel), results at y (row n's output), same contract as
 * tide_linear_avx2_rows. */
typedef void (*tide_fused_fn)(const struct tide_linear *l, int64_t n, const float *x, int64_t ldx, float *y,
                              int64_t ldy, int flags, const tide_fused_ctx *ctx);

/* AVX-512 group kernels (kernels/x86/linear_avx512.c, AVX-512 F/BW/VL/DQ +
 * VBMI + GFNI): bitwise the same results as the AVX2 kernel. Returns the
 * rows per group for format fmt at m rows of x and sets *fn, or returns 0
 * when there is no such kernel (other formats, m > 8, FP8 under DAZ). Only
 * call when tide_linear_avx512_ready(). */
int tide_linear_avx512_group(int fmt, int64_t m, int pat, tide_fused_fn *fn);
#endif

/* The CPU and the OS support the AVX-512 kernels and they are not switched
 * off (TIDE_NO_AVX512=1 in the environment, tide_linear_avx512_force_off). */
int tide_linear_avx512_ready(void);
/* Switch the AVX-512 kernels off (1) or back on (0); returns the previous
 * setting. For tests and benchmarks; not thread-safe against forwards. */
int tide_linear_avx512_force_off(int off);

enum { TIDE_LIN_NC = 24, TIDE_LIN_KC = 512, TIDE_LIN_MC = 64 };

/* oneDNN f32 GEMM y = x . w^T with w f32 [n, k] at row stride ldw.
 * Returns TIDE_E_UNSUPPORTED when tide was built without oneDNN. */
int tide_dnnl_sgemm_nt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                       float *y, int64_t ldy);

#endif
