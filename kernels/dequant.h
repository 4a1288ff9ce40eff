/* dequant.h - weight formats decoded to f32: the row-segment kernels shared
 * by tide_dequant (quant.h) and the linear-layer kernels, which dequantise
 * weight panels with exactly these functions.
 *
 * Value of one weight (the reference semantics, bit for bit):
 *   F32, BF16, F16  widened exactly (tide_convert's rules; NaN kept quiet);
 *   FP8   e4m3 [N, K] with e8m0 scale S [ceil(N/128), ceil(K/128)]:
 *         W[n, k] = fp8(W[n, k]) * 2^(S[n/128, k/128] - 127), one f32
 *         multiply (fp8 subnormals exact, results may round only when they
 *         fall below 2^-126); a scale byte 0xFF gives the quiet NaN
 *         0x7FC00000, an fp8 NaN code (0x7F/0xFF) gives NaN with its sign;
 *   MXFP4 bytes [N, K/2], element 2j in the low nibble of byte j, with e8m0
 *         scale S [N, K/32]: W[n, k] = e2m1(code) * 2^(S[n, k/32] - 127)
 *         (code 8 is -0 and stays -0); a scale byte 0xFF gives 0x7FC00000;
 *   I32, I64  converted to the nearest f32 (ties to even).
 * The AVX2 kernels give the same bits as the references for every input. */
#ifndef TIDE_KERNELS_DEQUANT_H
#define TIDE_KERNELS_DEQUANT_H

#include "tide_internal.h"

/* Internal format ids: the tide_wfmt values, then the integer dtypes. */
enum { TIDE_DQ_I32 = 5, TIDE_DQ_I64 = 6 };

/* A weight as the decoders see it: raw pointers into the (mmap'd) tensors.
 * Rows are n = 0..rows-1 of K logical elements each. */
typedef struct tide_wview {
  int fmt;                /* tide_wfmt or TIDE_DQ_* */
  const uint8_t *w;       /* row n starts at w + n * row_bytes */
  const uint8_t *s;       /* FP8 / MXFP4 scale bytes, else NULL */
  int64_t rows, k;        /* logical shape */
  int64_t row_bytes;      /* bytes per weight row */
  int64_t s_ld;           /* scale bytes per scale row (FP8: ceil(K/128), MXFP4: K/32) */
} tide_wview;

/* Row-segment decoders: dst[i] = value of element k0 + i of one weight row,
 * i < n. `w` is the start of the row, `srow` its scale row (FP8: the scale
 * row of the row's 128-row block; MXFP4: the row's own scales). MXFP4 needs
 * k0 and n even. */
typedef struct tide_dequant_kernels {
  void (*fp8)(float *dst, const uint8_t *w, const uint8_t *srow, int64_t k0, int64_t n);
  void (*mxfp4)(float *dst, const uint8_t *w, const uint8_t *srow, int64_t k0, int64_t n);
  void (*i32)(float *dst, const int32_t *src, int64_t n);
  void (*i64)(float *dst, const int64_t *src, int64_t n);
} tide_dequant_kernels;

extern const tide_dequant_kernels tide_dequant_ref;
#if defined(__x86_64__)
extern const tide_dequant_kernels tide_dequant_avx2;
#endif
/* The active table (AVX2 unless TIDE_REF / tide_kernels_force_ref). */
const tide_dequant_kernels *tide_dequant_kernels_get(void);

/* Scalar value of one element (reference semantics above). */
float tide_dequant_fp8_at(uint8_t code, uint8_t scale);
float tide_dequant_fp4_at(uint8_t code, uint8_t scale);

/* Decode the block rows [r0, r0+nr) x cols [k0, k0+nk) of `v` into dst
 * (row i at dst + i * ldd), then zero dst[i][nk .. pad) for pad > nk (the
 * panels of the linear kernels are padded to a multiple of 8). Single
 * threaded; `kt` selects the kernels. */
void tide_dequant_block(float *dst, int64_t ldd, const tide_wview *v, int64_t r0, int64_t nr, int64_t k0, int64_t nk,
                        int64_t pad, const tide_dequant_kernels *kt);

#endif
