/* tide/quant.h - quantised weight formats and their dequantisation to f32.
 * Part of tide.h; include tide.h, not this file.
 *
 * Formats (doc 1.4): FP8 = f8e4m3 [N, K] with an e8m0 scale per 128x128
 * block, [ceil(N/128), ceil(K/128)] (ragged edges use the ceiling):
 * W[n, k] = fp8 * 2^(S[n/128, k/128] - 127). MXFP4 = i8/u8 [N, K/2], two e2m1
 * codes per byte (element 2j in the low nibble), e8m0 scale [N, K/32]:
 * W[n, k] = e2m1 * 2^(S[n, k/32] - 127). The f32 results are exact (one f32
 * multiply by a power of two; fp8 subnormals and -0 exact); a scale byte 0xFF
 * (NaN) gives the quiet NaN 0x7FC00000, an fp8 NaN code gives NaN with its
 * sign. The linear-layer kernels dequantise with the same decoders. */

/* Dequantise rows [row0, row0 + R) of w into out (f32 [R, K], or [K] for
 * R = 1, rows contiguous, row stride >= K). w: f32, bf16, f16, i32, i64 (any
 * shape; rows = all dims but the last, K = the last; scale NULL), f8e4m3
 * [N, K] + scale, or i8/u8 [N, K/2] (MXFP4) + scale (K = 2 x the last dim).
 * AVX2 or scalar reference (TIDE_REF), bitwise the same; threads split rows.
 * Errors name the shapes (TIDE_E_INVALID) or the row range (TIDE_E_RANGE). */
int tide_dequant(tide_tensor *out, const tide_tensor *w, const tide_tensor *scale, int64_t row0);
