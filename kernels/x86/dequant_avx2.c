/* dequant_avx2.c - AVX2/F16C weight decoders, bit-exact with the references
 * in dequant.c (tested over every code, scale and alignment).
 *
 * FP8 goes through f16: an e4m3 byte b (sign s, magnitude 7 bits) becomes the
 * f16 pattern s<<15 | mag<<7, whose value is exactly fp8(b) / 256 for every
 * code, subnormals included (F16C widens f16 subnormals in hardware, no f32
 * subnormal is ever an operand, and DAZ cannot touch them). Multiplying by
 * 2^(scale - 119) then gives fp8(b) * 2^(scale - 127) with one rounding, as
 * the reference does. Blocks whose scale is above 246 (where that
 * factor is not a normal f32) and blocks holding an fp8 NaN code take the
 * scalar path.
 *
 * MXFP4 uses vpermps on an 8-entry table of |e2m1| * scale. The table is
 * stored xor-ed with c << 28 (c = its index), so xor-ing the looked-up value
 * with (nibble << 28) cancels those bits and leaves the nibble's sign bit in
 * bit 31: one shift and one xor give the signed value, -0 included. */
#include <immintrin.h>

#include "convert.h"
#include "dequant.h"

static inline __m256 f16_lo(__m256i w) { return _mm256_cvtph_ps(_mm256_castsi256_si128(w)); }
static inline __m256 f16_hi(__m256i w) { return _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1)); }

/* 16 fp8 bytes -> 16 f16 patterns (value fp8 / 256), NaN codes not handled */
static inline __m256i f8_f16(const uint8_t *p) {
  __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
  return _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xbf80));
}

static void fp8(float *d, const uint8_t *w, const uint8_t *s, int64_t k0, int64_t n) {
  const __m256i nan2 = _mm256_set1_epi8((char)0xfe);
  int64_t k = k0, end = k0 + n;
  d -= k0; /* index d by k */
  while (k < end) {
    int64_t blk = k >> 7, bend = (blk + 1) * 128 < end ? (blk + 1) * 128 : end;
    uint8_t sc = s[blk];
    if (sc > 246) {
      tide_dequant_ref.fp8(d + k, w, s, k, bend - k);
      k = bend;
      continue;
    }
    const __m256 f = _mm256_castsi256_ps(_mm256_set1_epi32((int)(sc + 8) << 23)); /* 2^(sc - 119) */
    int64_t start = k;
    __m256i mx = _mm256_setzero_si256(); /* max of 2*byte: 0xFE iff a NaN code (mag 0x7F) was seen */
    for (; k + 32 <= bend; k += 32) {
      __m256i raw = _mm256_loadu_si256((const __m256i *)(w + k));
      mx = _mm256_max_epu8(mx, _mm256_add_epi8(raw, raw));
      __m256i a = f8_f16(w + k), b = f8_f16(w + k + 16);
      _mm256_storeu_ps(d + k, _mm256_mul_ps(f16_lo(a), f));
      _mm256_storeu_ps(d + k + 8, _mm256_mul_ps(f16_hi(a), f));
      _mm256_storeu_ps(d + k + 16, _mm256_mul_ps(f16_lo(b), f));
      _mm256_storeu_ps(d + k + 24, _mm256_mul_ps(f16_hi(b), f));
    }
    for (; k + 16 <= bend; k += 16) {
      __m128i raw = _mm_loadu_si128((const __m128i *)(w + k));
      mx = _mm256_max_epu8(mx, _mm256_zextsi128_si256(_mm_add_epi8(raw, raw)));
      __m256i a = f8_f16(w + k);
      _mm256_storeu_ps(d + k, _mm256_mul_ps(f16_lo(a), f));
      _mm256_storeu_ps(d + k + 8, _mm256_mul_ps(f16_hi(a), f));
    }
    if (k < bend) {
      tide_dequant_ref.fp8(d + k, w, s, k, bend - k);
      k = bend;
    }
    /* a NaN code anywhere in the block: redo it exactly */
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(mx, nan2))) tide_dequant_ref.fp8(d + start, w, s, start, k - start);
  }
}

static const float fp4_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static void mxfp4(float *d, const uint8_t *w, const uint8_t *s, int64_t k0, int64_t n) {
  int64_t k = k0, end = k0 + n;
  d -= k0;
  int64_t head = (k + 31) & ~(int64_t)31;
  if (head > end) head = end;
  if (head > k) {
    tide_dequant_ref.mxfp4(d + k, w, s, k, head - k);
    k = head;
  }
  const __m256 mag = _mm256_loadu_ps(fp4_mag);
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256 c28 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28, 6 << 28,
                                                           7 << 28));
  for (; k + 32 <= end; k += 32) {
    uint8_t sc = s[k >> 5];
    if (sc == 0xff) {
      tide_dequant_ref.mxfp4(d + k, w, s, k, 32);
      continue;
    }
    /* 2^(sc - 127); sc = 0 is the subnormal 2^-127 (tide_e8m0_to_f32) */
    __m256 scale = _mm256_castsi256_ps(_mm256_set1_epi32(sc ? (int)sc << 23 : 0x00400000));
    __m256 t = _mm256_xor_ps(_mm256_mul_ps(mag, scale), c28);
    const uint8_t *p = w + (k >> 1);
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
      uint32_t u;
      memcpy(&u, p + 4 * q, 4);
      __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32((int)u), sh);
      __m256 v = _mm256_xor_ps(_mm256_permutevar8x32_ps(t, idx), _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
      _mm256_storeu_ps(d + k + 8 * q, v);
    }
  }
  if (k < end) tide_dequant_ref.mxfp4(d + k, w, s, k, end - k);
}

static void i32(float *d, const int32_t *s, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
  for (; i < n; i++) d[i] = (float)s[i];
}

/* -2^51 <= v < 2^51: v + (2^52 + 2^51) is exact as a double, whose bit pattern is
 * the integer sum; the double then rounds once to f32, as (float)v does. */
static void i64(float *d, const int64_t *s, int64_t n) {
  const __m256i magic = _mm256_set1_epi64x(0x4338000000000000LL);
  const __m256d magicd = _mm256_set1_pd(6755399441055744.0);
  const __m256i lo = _mm256_set1_epi64x(-(1LL << 51)), hi = _mm256_set1_epi64x((1LL << 51) - 1);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(s + i));
    __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi64(lo, v), _mm256_cmpgt_epi64(v, hi));
    if (!_mm256_testz_si256(bad, bad)) {
      for (int j = 0; j < 4; j++) d[i + j] = (float)s[i + j];
      continue;
    }
    __m256d x = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(v, magic)), magicd);
    _mm_storeu_ps(d + i, _mm256_cvtpd_ps(x));
  }
  for (; i < n; i++) d[i] = (float)s[i];
}

const tide_dequant_kernels tide_dequant_avx2 = {fp8, mxfp4, i32, i64};
