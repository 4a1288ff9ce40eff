/* sample_avx2.c - AVX2/FMA variants of the sampling kernels. Each one does
 * the operations of its reference in sample_ref.c in the same order (lane i
 * of a vector is element i % 8, sums are kept per lane in double and
 * combined the same way), so the results are identical (tested). */
#include <immintrin.h>
#include <math.h>

#include "sample_kernels.h"
#include "tide_internal.h"

static inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(TIDE_EXP_FLUSH);
  __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  __m256 xc = _mm256_max_ps(x, lo);   /* keeps -inf away from the exponent bits; masked below */
  __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(TIDE_EXP_LOG2E)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TIDE_EXP_LN2_HI), xc);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TIDE_EXP_LN2_LO), r);
  __m256 y = _mm256_set1_ps(TIDE_EXP_P0);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(TIDE_EXP_P1));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(TIDE_EXP_P2));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(TIDE_EXP_P3));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(TIDE_EXP_P4));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(TIDE_EXP_P5));
  __m256 r2 = _mm256_mul_ps(r, r);
  y = _mm256_fmadd_ps(y, r2, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_and_ps(y, keep);
}

static double combine8(const double *a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static inline void add8(__m256d *a, __m256d *b, __m256 v) {
  *a = _mm256_add_pd(*a, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  *b = _mm256_add_pd(*b, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

static inline int64_t scan_body(float *dst, const float *x, int64_t n, float *max, float *min) {
  const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
  __m256 vmx = ninf, vmn = pinf;
  int64_t bad = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (dst) _mm256_storeu_ps(dst + i, v);
    __m256 b = _mm256_or_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(v, pinf, _CMP_EQ_OQ));
    int m = _mm256_movemask_ps(b);
    if (m) {
      bad += __builtin_popcount((unsigned)m);
      v = _mm256_blendv_ps(v, ninf, b);   /* a bad value takes part in neither max nor min */
    }
    vmx = _mm256_max_ps(v, vmx);
    __m256 w = _mm256_blendv_ps(v, pinf, _mm256_cmp_ps(v, ninf, _CMP_EQ_OQ));
    vmn = _mm256_min_ps(w, vmn);
  }
  float a[8], b8[8];
  _mm256_storeu_ps(a, vmx);
  _mm256_storeu_ps(b8, vmn);
  float mx = -INFINITY, mn = INFINITY;
  for (int k = 0; k < 8; k++) {
    if (a[k] > mx) mx = a[k];
    if (b8[k] < mn) mn = b8[k];
  }
  for (; i < n; i++) {
    float v = x[i];
    if (dst) dst[i] = v;
    if (v != v || v == INFINITY) {
      bad++;
      continue;
    }
    if (v > mx) mx = v;
    if (v < mn && v != -INFINITY) mn = v;
  }
  *max = mx + 0.0f;
  *min = mn + 0.0f;
  return bad;
}

static int64_t scan_avx2(const float *x, int64_t n, float *max, float *min) {
  return scan_body(NULL, x, n, max, min);
}

static int64_t scan_copy_avx2(float *dst, const float *x, int64_t n, float *max, float *min) {
  return scan_body(dst, x, n, max, min);
}

static double expsum_avx2(float *p, const float *x, int64_t n, float m) {
  __m256 vm = _mm256_set1_ps(m);
  __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    if (p) _mm256_storeu_ps(p + i, e);
    add8(&a, &b, e);
  }
  double acc[8];
  _mm256_storeu_pd(acc, a);
  _mm256_storeu_pd(acc + 4, b);
  for (; i < n; i++) {
    float e = tide_sample_exp_ref(x[i] - m);
    if (p) p[i] = e;
    acc[i & 7] += (double)e;
  }
  return combine8(acc);
}

static double blocksum_avx2(const float *p, int64_t n, double *bsum) {
  double total = 0;
  int64_t b = 0;
  for (; (b + 1) * 64 <= n; b++) {
    const float *q = p + b * 64;
    __m256d a = _mm256_setzero_pd(), c = _mm256_setzero_pd();
    for (int k = 0; k < 64; k += 8) add8(&a, &c, _mm256_loadu_ps(q + k));
    double acc[8];
    _mm256_storeu_pd(acc, a);
    _mm256_storeu_pd(acc + 4, c);
    bsum[b] = combine8(acc);
    total += bsum[b];
  }
  if (b * 64 < n) {
    double acc[8] = {0};
    for (int64_t i = b * 64; i < n; i++) acc[i & 7] += (double)p[i];
    bsum[b] = combine8(acc);
    total += bsum[b];
  }
  return total;
}

static int64_t find_avx2(const float *x, int64_t i0, int64_t n, float t, int ge) {
  __m256 vt = _mm256_set1_ps(t);
  int64_t i = i0;
  if (ge) {
    for (; i + 8 <= n; i += 8) {
      int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GE_OQ));
      if (m) return i + __builtin_ctz((unsigned)m);
    }
    for (; i < n; i++)
      if (x[i] >= t) return i;
  } else {
    for (; i + 8 <= n; i += 8) {
      int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GT_OQ));
      if (m) return i + __builtin_ctz((unsigned)m);
    }
    for (; i < n; i++)
      if (x[i] > t) return i;
  }
  return n;
}

static int64_t count_ge_avx2(const float *x, int64_t n, float t) {
  __m256 vt = _mm256_set1_ps(t);
  int64_t c = 0, i = 0;
  for (; i + 8 <= n; i += 8)
    c += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GE_OQ)));
  for (; i < n; i++) c += x[i] >= t;
  return c;
}

/* Byte indices of the set bits of each 8-bit mask, packed low to high: the
 * permutation that moves the kept lanes of a vector to its front. */
static const uint64_t pack_lut[256] = {
    0x0000000000000000ull, 0x0000000000000000ull, 0x0000000000000001ull, 0x0000000000000100ull,
    0x0000000000000002ull, 0x0000000000000200ull, 0x0000000000000201ull, 0x0000000000020100ull,
    0x0000000000000003ull, 0x0000000000000300ull, 0x0000000000000301ull, 0x0000000000030100ull,
    0x0000000000000302ull, 0x0000000000030200ull, 0x0000000000030201ull, 0x0000000003020100ull,
    0x0000000000000004ull, 0x0000000000000400ull, 0x0000000000000401ull, 0x0000000000040100ull,
    0x0000000000000402ull, 0x0000000000040200ull, 0x0000000000040201ull, 0x0000000004020100ull,
    0x0000000000000403ull, 0x0000000000040300ull, 0x0000000000040301ull, 0x0000000004030100ull,
    0x0000000000040302ull, 0x0000000004030200ull, 0x0000000004030201ull, 0x0000000403020100ull,
    0x0000000000000005ull, 0x0000000000000500ull, 0x0000000000000501ull, 0x0000000000050100ull,
    0x0000000000000502ull, 0x0000000000050200ull, 0x0000000000050201ull, 0x0000000005020100ull,
    0x0000000000000503ull, 0x0000000000050300ull, 0x0000000000050301ull, 0x0000000005030100ull,
    0x0000000000050302ull, 0x0000000005030200ull, 0x0000000005030201ull, 0x0000000503020100ull,
    0x0000000000000504ull, 0x0000000000050400ull, 0x0000000000050401ull, 0x0000000005040100ull,
    0x0000000000050402ull, 0x0000000005040200ull, 0x0000000005040201ull, 0x0000000504020100ull,
    0x0000000000050403ull, 0x0000000005040300ull, 0x0000000005040301ull, 0x0000000504030100ull,
    0x0000000005040302ull, 0x0000000504030200ull, 0x0000000504030201ull, 0x0000050403020100ull,
    0x0000000000000006ull, 0x0000000000000600ull, 0x0000000000000601ull, 0x0000000000060100ull,
    0x0000000000000602ull, 0x0000000000060200ull, 0x0000000000060201ull, 0x0000000006020100ull,
    0x0000000000000603ull, 0x0000000000060300ull, 0x0000000000060301ull, 0x0000000006030100ull,
    0x0000000000060302ull, 0x0000000006030200ull, 0x0000000006030201ull, 0x0000000603020100ull,
    0x0000000000000604ull, 0x0000000000060400ull, 0x0000000000060401ull, 0x0000000006040100ull,
    0x0000000000060402ull, 0x0000000006040200ull, 0x0000000006040201ull, 0x0000000604020100ull,
    0x0000000000060403ull, 0x0000000006040300ull, 0x0000000006040301ull, 0x0000000604030100ull,
    0x0000000006040302ull, 0x0000000604030200ull, 0x0000000604030201ull, 0x0000060403020100ull,
    0x0000000000000605ull, 0x0000000000060500ull, 0x0000000000060501ull, 0x0000000006050100ull,
    0x0000000000060502ull, 0x0000000006050200ull, 0x0000000006050201ull, 0x0000000605020100ull,
    0x0000000000060503ull, 0x0000000006050300ull, 0x0000000006050301ull, 0x0000000605030100ull,
    0x0000000006050302ull, 0x0000000605030200ull, 0x0000000605030201ull, 0x0000060503020100ull,
    0x0000000000060504ull, 0x0000000006050400ull, 0x0000000006050401ull, 0x0000000605040100ull,
    0x0000000006050402ull, 0x0000000605040200ull, 0x0000000605040201ull, 0x0000060504020100ull,
    0x0000000006050403ull, 0x0000000605040300ull, 0x0000000605040301ull, 0x0000060504030100ull,
    0x0000000605040302ull, 0x0000060504030200ull, 0x0000060504030201ull, 0x0006050403020100ull,
    0x0000000000000007ull, 0x0000000000000700ull, 0x0000000000000701ull, 0x0000000000070100ull,
    0x0000000000000702ull, 0x0000000000070200ull, 0x0000000000070201ull, 0x0000000007020100ull,
    0x0000000000000703ull, 0x0000000000070300ull, 0x0000000000070301ull, 0x0000000007030100ull,
    0x0000000000070302ull, 0x0000000007030200ull, 0x0000000007030201ull, 0x0000000703020100ull,
    0x0000000000000704ull, 0x0000000000070400ull, 0x0000000000070401ull, 0x0000000007040100ull,
    0x0000000000070402ull, 0x0000000007040200ull, 0x0000000007040201ull, 0x0000000704020100ull,
    0x0000000000070403ull, 0x0000000007040300ull, 0x0000000007040301ull, 0x0000000704030100ull,
    0x0000000007040302ull, 0x0000000704030200ull, 0x0000000704030201ull, 0x0000070403020100ull,
    0x0000000000000705ull, 0x0000000000070500ull, 0x0000000000070501ull, 0x0000000007050100ull,
    0x0000000000070502ull, 0x0000000007050200ull, 0x0000000007050201ull, 0x0000000705020100ull,
    0x0000000000070503ull, 0x0000000007050300ull, 0x0000000007050301ull, 0x0000000705030100ull,
    0x0000000007050302ull, 0x0000000705030200ull, 0x0000000705030201ull, 0x0000070503020100ull,
    0x0000000000070504ull, 0x0000000007050400ull, 0x0000000007050401ull, 0x0000000705040100ull,
    0x0000000007050402ull, 0x0000000705040200ull, 0x0000000705040201ull, 0x0000070504020100ull,
    0x0000000007050403ull, 0x0000000705040300ull, 0x0000000705040301ull, 0x0000070504030100ull,
    0x0000000705040302ull, 0x0000070504030200ull, 0x0000070504030201ull, 0x0007050403020100ull,
    0x0000000000000706ull, 0x0000000000070600ull, 0x0000000000070601ull, 0x0000000007060100ull,
    0x0000000000070602ull, 0x0000000007060200ull, 0x0000000007060201ull, 0x0000000706020100ull,
    0x0000000000070603ull, 0x0000000007060300ull, 0x0000000007060301ull, 0x0000000706030100ull,
    0x0000000007060302ull, 0x0000000706030200ull, 0x0000000706030201ull, 0x0000070603020100ull,
    0x0000000000070604ull, 0x0000000007060400ull, 0x0000000007060401ull, 0x0000000706040100ull,
    0x0000000007060402ull, 0x0000000706040200ull, 0x0000000706040201ull, 0x0000070604020100ull,
    0x0000000007060403ull, 0x0000000706040300ull, 0x0000000706040301ull, 0x0000070604030100ull,
    0x0000000706040302ull, 0x0000070604030200ull, 0x0000070604030201ull, 0x0007060403020100ull,
    0x0000000000070605ull, 0x0000000007060500ull, 0x0000000007060501ull, 0x0000000706050100ull,
    0x0000000007060502ull, 0x0000000706050200ull, 0x0000000706050201ull, 0x0000070605020100ull,
    0x0000000007060503ull, 0x0000000706050300ull, 0x0000000706050301ull, 0x0000070605030100ull,
    0x0000000706050302ull, 0x0000070605030200ull, 0x0000070605030201ull, 0x0007060503020100ull,
    0x0000000007060504ull, 0x0000000706050400ull, 0x0000000706050401ull, 0x0000070605040100ull,
    0x0000000706050402ull, 0x0000070605040200ull, 0x0000070605040201ull, 0x0007060504020100ull,
    0x0000000706050403ull, 0x0000070605040300ull, 0x0000070605040301ull, 0x0007060504030100ull,
    0x0000070605040302ull, 0x0007060504030200ull, 0x0007060504030201ull, 0x0706050403020100ull,
};

static int64_t compact_avx2(int32_t *id, float *x, const float *key, int64_t n, float kt, int32_t it, int keep_in,
                            int64_t s, int64_t *low) {
  const __m256 vkt = _mm256_set1_ps(kt);
  const __m256i vit = _mm256_set1_epi32(it);
  const __m256i flip = keep_in ? _mm256_setzero_si256() : _mm256_set1_epi32(-1);
  int64_t w = 0, lo = 0, i = 0;
  /* stores at w <= i only touch lanes already loaded, so in place is safe */
  for (; i + 8 <= n; i += 8) {
    __m256 k = _mm256_loadu_ps(key + i);
    __m256i vi = _mm256_loadu_si256((const __m256i *)(id + i));
    __m256 vx = _mm256_loadu_ps(x + i);
    __m256 gt = _mm256_cmp_ps(k, vkt, _CMP_GT_OQ), eq = _mm256_cmp_ps(k, vkt, _CMP_EQ_OQ);
    __m256 le = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_cmpgt_epi32(vi, vit), _mm256_set1_epi32(-1)));
    __m256 in = _mm256_or_ps(gt, _mm256_and_ps(eq, le));
    unsigned m = (unsigned)_mm256_movemask_ps(_mm256_xor_ps(in, _mm256_castsi256_ps(flip)));
    __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pack_lut[m]));
    _mm256_storeu_si256((__m256i *)(id + w), _mm256_permutevar8x32_epi32(vi, perm));
    _mm256_storeu_ps(x + w, _mm256_permutevar8x32_ps(vx, perm));
    if (i < s) {
      unsigned below = s - i >= 8 ? 0xffu : (1u << (s - i)) - 1u;
      lo += __builtin_popcount(m & below);
    }
    w += __builtin_popcount(m);
  }
  for (; i < n; i++) {
    float kk = key[i];
    int32_t v = id[i];
    float xv = x[i];
    int in = kk > kt || (kk == kt && v <= it);
    if (in == (keep_in != 0)) {
      id[w] = v;
      x[w] = xv;
      w++;
      lo += i < s;
    }
  }
  *low = lo;
  return w;
}

static void buckets_avx2(uint16_t *out, const float *x, int64_t n, float kmax, float scale, int nb) {
  const __m256 vmax = _mm256_set1_ps(kmax), vs = _mm256_set1_ps(scale), top = _mm256_set1_ps((float)nb - 0.5f);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256 f = _mm256_mul_ps(_mm256_sub_ps(vmax, v), vs);
    f = _mm256_blendv_ps(top, f, _mm256_cmp_ps(f, top, _CMP_LT_OQ));
    __m256i b = _mm256_cvttps_epi32(f);
    b = _mm256_sub_epi32(b, _mm256_castps_si256(_mm256_cmp_ps(v, ninf, _CMP_EQ_OQ)));   /* -(-1) = +1 */
    __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    _mm_storeu_si128((__m128i *)(out + i), p);
  }
  float t = (float)nb - 0.5f;
  for (; i < n; i++) {
    float f = (kmax - x[i]) * scale;
    f = f < t ? f : t;
    out[i] = (uint16_t)((int)f + (x[i] == -INFINITY));
  }
}

static int64_t collect_avx2(int32_t *pos, const uint16_t *b, int64_t n, uint16_t v) {
  const __m256i vv = _mm256_set1_epi16((short)v);
  int64_t k = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    unsigned m = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi16(_mm256_loadu_si256((const __m256i *)(b + i)), vv));
    while (m) {
      int bit = __builtin_ctz(m);
      pos[k++] = (int32_t)(i + bit / 2);
      m &= ~(3u << bit);
    }
  }
  for (; i < n; i++)
    if (b[i] == v) pos[k++] = (int32_t)i;
  return k;
}

static void scale_avx2(float *p, int64_t n, float s) {
  __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(p + i, _mm256_mul_ps(_mm256_loadu_ps(p + i), vs));
  for (; i < n; i++) p[i] *= s;
}

static void divide_avx2(float *p, int64_t n, float s) {
  __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(p + i, _mm256_div_ps(_mm256_loadu_ps(p + i), vs));
  for (; i < n; i++) p[i] /= s;
}

static void iota_avx2(int32_t *id, int64_t n) {
  __m256i v = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), step = _mm256_set1_epi32(8);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_si256((__m256i *)(id + i), v);
    v = _mm256_add_epi32(v, step);
  }
  for (; i < n; i++) id[i] = (int32_t)i;
}

const tide_sample_kernels tide_sample_avx2 = {scan_avx2,    scan_copy_avx2, expsum_avx2,  blocksum_avx2, find_avx2,  count_ge_avx2,
                                              compact_avx2, buckets_avx2, collect_avx2,  scale_avx2, divide_avx2,
                                              iota_avx2};
