/* ckpt_quant_avx2.c - AVX2 variants of the checkpoint writer's kernels
 * (ckpt_quant.h): the same bytes as the scalar references, 8 lanes at a
 * time, with the references' scalar code for tails. */
#include <immintrin.h>
#include <math.h>

#include "ckpt_quant.h"
#include "tide_internal.h"

/* max |x| over 8 lanes into acc; a NaN lane leaves acc (max_ps returns its
 * second operand when either is NaN), like the reference's `a > amax`. */
static inline __m256 amax8(__m256 acc, __m256 x) {
  __m256 a = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  return _mm256_max_ps(a, acc);
}

static inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

/* e4m3 codes of 8 floats in 32-bit lanes: tide_f32_to_f8e4m3 vectorised
 * (RNE, subnormals exact, >= 448 saturates, NaN -> 0x7f, sign kept). */
static inline __m256i f8enc(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
  __m256i sat = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x43dfffff));
  __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), a);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), lsb));
  __m256i code = _mm256_sub_epi32(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(120 << 3));
  code = _mm256_min_epi32(code, _mm256_set1_epi32(0x7e));
  __m256 s = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f));
  __m256i sc = _mm256_cvttps_epi32(_mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  code = _mm256_blendv_epi8(code, sc, sub);
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7e), sat);
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), nan);
  return _mm256_or_si256(code, sign);
}

/* four vectors of 32-bit codes (0..255) -> 32 bytes in element order */
static inline __m256i pack32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static uint8_t avx2_fp8_block(uint8_t *q, int64_t ldq, const float *x, int64_t ldx, int rows, int cols) {
  __m256 acc = _mm256_setzero_ps();
  float amax = 0.0f;
  for (int r = 0; r < rows; r++) {
    const float *row = x + r * ldx;
    int c = 0;
    for (; c + 8 <= cols; c += 8) acc = amax8(acc, _mm256_loadu_ps(row + c));
    for (; c < cols; c++) {
      float a = fabsf(row[c]);
      if (a > amax) amax = a;
    }
  }
  float va = hmax8(acc);
  if (va > amax) amax = va;
  int e = tide_ckq_scale_exp(amax / 448.0f);
  float inv = tide_ckq_pow2(-e);
  __m256 vi = _mm256_set1_ps(inv);
  for (int r = 0; r < rows; r++) {
    const float *row = x + r * ldx;
    uint8_t *qr = q + r * ldq;
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
      __m256i c0 = f8enc(_mm256_mul_ps(_mm256_loadu_ps(row + c), vi));
      __m256i c1 = f8enc(_mm256_mul_ps(_mm256_loadu_ps(row + c + 8), vi));
      __m256i c2 = f8enc(_mm256_mul_ps(_mm256_loadu_ps(row + c + 16), vi));
      __m256i c3 = f8enc(_mm256_mul_ps(_mm256_loadu_ps(row + c + 24), vi));
      _mm256_storeu_si256((__m256i *)(qr + c), pack32(c0, c1, c2, c3));
    }
    for (; c < cols; c++) qr[c] = tide_f32_to_f8e4m3(row[c] * inv);
  }
  return (uint8_t)(e + 127);
}

/* e2m1 codes (0..15) of 8 floats: count the rounding thresholds passed
 * (ties to the even code: strict > below an even code, >= below an odd
 * one), sign as bit 3, NaN -> 0; as tide_f32_to_fp4. */
static inline __m256i f4enc(__m256 v) {
  __m256 a = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  __m256i c = _mm256_setzero_si256();
#define STEP(op, t) c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(t), op)))
  STEP(_CMP_GT_OQ, 0.25f);
  STEP(_CMP_GE_OQ, 0.75f);
  STEP(_CMP_GT_OQ, 1.25f);
  STEP(_CMP_GE_OQ, 1.75f);
  STEP(_CMP_GT_OQ, 2.5f);
  STEP(_CMP_GE_OQ, 3.5f);
  STEP(_CMP_GT_OQ, 5.0f);
#undef STEP
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 28), _mm256_set1_epi32(8));
  c = _mm256_or_si256(c, sign);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_andnot_si256(nan, c);
}

static void avx2_mxfp4(uint8_t *q, uint8_t *scales, const float *x, int64_t n) {
  for (int64_t b = 0; b < n / 32; b++) {
    const float *v = x + 32 * b;
    __m256 x0 = _mm256_loadu_ps(v), x1 = _mm256_loadu_ps(v + 8), x2 = _mm256_loadu_ps(v + 16),
           x3 = _mm256_loadu_ps(v + 24);
    __m256 acc = amax8(amax8(amax8(amax8(_mm256_setzero_ps(), x0), x1), x2), x3);
    int e = tide_ckq_scale_exp(hmax8(acc) / 6.0f);
    __m256 vi = _mm256_set1_ps(tide_ckq_pow2(-e));
    __m256i codes = pack32(f4enc(_mm256_mul_ps(x0, vi)), f4enc(_mm256_mul_ps(x1, vi)), f4enc(_mm256_mul_ps(x2, vi)),
                           f4enc(_mm256_mul_ps(x3, vi)));
    /* byte pairs (even, odd) -> one byte: low nibble even, high nibble odd */
    __m256i w = _mm256_or_si256(_mm256_and_si256(codes, _mm256_set1_epi16(0x000f)),
                                _mm256_and_si256(_mm256_srli_epi16(codes, 4), _mm256_set1_epi16(0x00f0)));
    __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128((__m128i *)(q + 16 * b), packed);
    scales[b] = (uint8_t)(e + 127);
  }
}

static void avx2_uniform(float *dst, int64_t n, uint32_t key, uint32_t lo, float mean, float half) {
  int64_t i = 0;
  __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)lo), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i k = _mm256_set1_epi32((int)key), step = _mm256_set1_epi32(8);
  const __m256 vh = _mm256_set1_ps(half), vm = _mm256_set1_ps(mean), unit = _mm256_set1_ps(1.0f / 8388608.0f);
  for (; i + 8 <= n; i += 8) {
    __m256i x = _mm256_add_epi32(_mm256_mullo_epi32(idx, _mm256_set1_epi32((int)0x9e3779b9u)), k);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x85ebca6bu));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0xc2b2ae35u));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    __m256i s = _mm256_sub_epi32(_mm256_srli_epi32(x, 8), _mm256_set1_epi32(8388608));
    __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(s), unit);
    __m256 t = _mm256_mul_ps(u, vh);
    t = _mm256_add_ps(t, vm);
    _mm256_storeu_ps(dst + i, t);
    idx = _mm256_add_epi32(idx, step);
  }
  tide_ckq_ref.uniform(dst + i, n - i, key, lo + (uint32_t)i, mean, half);
}

const tide_ckq_kernels tide_ckq_avx2 = {avx2_fp8_block, avx2_mxfp4, avx2_uniform};
