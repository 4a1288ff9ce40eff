/* convert_avx2.c - AVX2/F16C variants of the conversion kernels. Same
 * results as the references in convert.c, bit for bit (tested). */
#include <immintrin.h>

#include "convert.h"
#include "tide_internal.h"

static void bf16_to_f32(float *d, const uint16_t *s, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
    __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(a));
    __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
    _mm256_storeu_ps(d + i + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
  }
  for (; i < n; i++) d[i] = tide_bf16f(s[i]);
}

/* RNE with NaN kept quiet: the same integer trick as the scalar version. */
static inline __m128i bf16_round8(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  __m256i qn = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  r = _mm256_blendv_epi8(r, qn, nan);
  r = _mm256_srli_epi32(r, 16);
  __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
  return _mm_packus_epi32(lo, hi);
}

static void f32_to_bf16(uint16_t *d, const float *s, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(d + i), bf16_round8(_mm256_loadu_ps(s + i)));
  for (; i < n; i++) d[i] = tide_bf16r(s[i]);
}

static void f16_to_f32(float *d, const uint16_t *s, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++) d[i] = tide_f16_to_f32(s[i]);
}

static void f32_to_f16(uint16_t *d, const float *s, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) d[i] = tide_f32_to_f16(s[i]);
}

/* e4m3 -> f32 without a table: put the 7 magnitude bits where f32 keeps its
 * exponent and mantissa, then multiply by 2^120 to rebias; this is exact for
 * normals and subnormals alike. 0x7F/0xFF become NaN. */
static inline __m256 f8x8(__m128i bytes8) {
  __m256i x = _mm256_cvtepu8_epi32(bytes8);
  __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7f));
  __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)),
                           _mm256_castsi256_ps(_mm256_set1_epi32((127 + 120) << 23)));
  __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
  f = _mm256_or_ps(f, _mm256_castsi256_ps(sign));
  __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f)));
  return _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_or_si256(sign, _mm256_set1_epi32(0x7fc00000))), nan);
}

static void f8_to_f32(float *d, const uint8_t *s, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i b = _mm_loadu_si128((const __m128i *)(s + i));
    _mm256_storeu_ps(d + i, f8x8(b));
    _mm256_storeu_ps(d + i + 8, f8x8(_mm_srli_si128(b, 8)));
  }
  for (; i < n; i++) d[i] = tide_f8e4m3_to_f32(s[i]);
}

/* ---- streaming variants: scalar until dst is 32-byte aligned, then whole
 * vectors with non-temporal stores, then the scalar tail; the fence makes
 * the stores visible before the caller (or another thread) reads them. ---- */
static int64_t head_to_align(const float *d, int64_t n) {
  int64_t h = (int64_t)(((32 - ((uintptr_t)d & 31)) & 31) / 4);
  if ((uintptr_t)d & 3) h = n; /* not even float-aligned: no vector stores */
  return h < n ? h : n;
}

static void bf16_to_f32_stream(float *d, const uint16_t *s, int64_t n) {
  int64_t i = head_to_align(d, n);
  bf16_to_f32(d, s, i);
  for (; i + 16 <= n; i += 16) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
    __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(a));
    __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1));
    _mm256_stream_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
    _mm256_stream_ps(d + i + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
  }
  _mm_sfence();
  bf16_to_f32(d + i, s + i, n - i);
}

static void f16_to_f32_stream(float *d, const uint16_t *s, int64_t n) {
  int64_t i = head_to_align(d, n);
  f16_to_f32(d, s, i);
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  _mm_sfence();
  f16_to_f32(d + i, s + i, n - i);
}

static void f8_to_f32_stream(float *d, const uint8_t *s, int64_t n) {
  int64_t i = head_to_align(d, n);
  f8_to_f32(d, s, i);
  for (; i + 16 <= n; i += 16) {
    __m128i b = _mm_loadu_si128((const __m128i *)(s + i));
    _mm256_stream_ps(d + i, f8x8(b));
    _mm256_stream_ps(d + i + 8, f8x8(_mm_srli_si128(b, 8)));
  }
  _mm_sfence();
  f8_to_f32(d + i, s + i, n - i);
}

const tide_convert_kernels tide_convert_avx2 = {bf16_to_f32,        f32_to_bf16,       f16_to_f32,
                                                f32_to_f16,         f8_to_f32,         bf16_to_f32_stream,
                                                f16_to_f32_stream,  f8_to_f32_stream};
