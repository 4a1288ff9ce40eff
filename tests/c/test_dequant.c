/* test_dequant.c - the weight decoders: every fp8 code under every e8m0
 * scale and every MXFP4 byte under every scale, AVX2 against the scalar
 * reference bit for bit and both against values computed here from the
 * format definitions (subnormals, -0, scale 0x00 and 0xFF, NaN codes); odd
 * offsets and lengths; i32/i64 rounding; exactness with DAZ/FTZ set; and
 * tide_dequant on whole tensors and row ranges, thread counts, misuse. */
#include <float.h>
#include <stdint.h>
#include <xmmintrin.h>

#include "dequant.h"
#include "tide.h"
#include "tt.h"

static uint64_t rng = 0x243f6a8885a308d3ULL;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}
static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* the definitions, in double */
static double e4m3_def(int c) {
  int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
static double e2m1_def(int c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
/* expected f32 bits of a scaled value (both factors exact; one rounding) */
static uint32_t want_bits(double v, int s, int is_nan) {
  if (s == 0xff) return 0x7fc00000u;
  if (is_nan) return v < 0 ? 0xffc00000u : 0x7fc00000u;
  float f = (float)(v * ldexp(1.0, s - 127)); /* exact in double, rounded once to f32 */
  return f2u(f);
}

static int have_avx2(void) { return tide_kernels_avx2(); }

static void fp8_every_code_every_scale(void) {
  uint8_t row[256], srow[2];
  float a[256], b[256];
  for (int c = 0; c < 256; c++) row[c] = (uint8_t)c;
  int bad = 0;
  for (int s = 0; s < 256; s++) {
    srow[0] = srow[1] = (uint8_t)s;
    tide_dequant_ref.fp8(a, row, srow, 0, 256);
    if (have_avx2()) tide_dequant_avx2.fp8(b, row, srow, 0, 256);
    else memcpy(b, a, sizeof a);
    for (int c = 0; c < 256; c++) {
      int nan = (c & 0x7f) == 0x7f;
      /* codes c and c|0x80 share srow[c/128]: both see scale s */
      uint32_t want = want_bits(nan ? ((c & 0x80) ? -1.0 : 1.0) : e4m3_def(c), s, nan);
      if (f2u(a[c]) != want && bad++ < 5)
        TT_CHECK(0, "ref fp8 0x%02x scale 0x%02x: 0x%08x, expected 0x%08x", c, s, f2u(a[c]), want);
      if (f2u(b[c]) != f2u(a[c]) && bad++ < 10)
        TT_CHECK(0, "avx2 fp8 0x%02x scale 0x%02x: 0x%08x, ref 0x%08x", c, s, f2u(b[c]), f2u(a[c]));
    }
  }
  TT_CHECK(bad == 0, "%d fp8 mismatches", bad);
  /* spot checks of the rules */
  TT_CHECK(tide_dequant_fp8_at(0x01, 127) == ldexpf(1, -9), "min subnormal");
  TT_CHECK(signbit(tide_dequant_fp8_at(0x80, 127)) && tide_dequant_fp8_at(0x80, 127) == 0, "-0 kept");
  TT_CHECK(f2u(tide_dequant_fp8_at(0x01, 0)) == f2u(ldexpf(1, -136)), "scale 0x00 = 2^-127");
  TT_CHECK(f2u(tide_dequant_fp8_at(0x38, 0xff)) == 0x7fc00000u, "scale 0xFF is NaN");
}

static void mxfp4_every_byte_every_scale(void) {
  uint8_t row[256];
  uint8_t srow[16];
  float a[512], b[512];
  for (int c = 0; c < 256; c++) row[c] = (uint8_t)c;
  int bad = 0;
  for (int s = 0; s < 256; s++) {
    memset(srow, s, sizeof srow);
    tide_dequant_ref.mxfp4(a, row, srow, 0, 512);
    if (have_avx2()) tide_dequant_avx2.mxfp4(b, row, srow, 0, 512);
    else memcpy(b, a, sizeof a);
    for (int k = 0; k < 512; k++) {
      int code = (k & 1) ? row[k / 2] >> 4 : row[k / 2] & 15;
      uint32_t want = want_bits(e2m1_def(code), s, 0);
      if (f2u(a[k]) != want && bad++ < 5)
        TT_CHECK(0, "ref fp4 k=%d code %d scale 0x%02x: 0x%08x, expected 0x%08x", k, code, s, f2u(a[k]), want);
      if (f2u(b[k]) != f2u(a[k]) && bad++ < 10)
        TT_CHECK(0, "avx2 fp4 k=%d code %d scale 0x%02x: 0x%08x, ref 0x%08x", k, code, s, f2u(b[k]), f2u(a[k]));
    }
  }
  TT_CHECK(bad == 0, "%d mxfp4 mismatches", bad);
  TT_CHECK(signbit(tide_dequant_fp4_at(8, 127)), "fp4 code 8 is -0");
}

/* random codes and scales (NaN codes, scales 0x00/0xF7+/0xFF included) at
 * every start offset and length up to a few blocks */
static void odd_offsets_and_lengths(void) {
  if (!have_avx2()) return;
  enum { K = 700 };
  uint8_t w[K], s8[(K + 127) / 128], s4[K / 32 + 1];
  float a[K + 8], b[K + 8];
  int bad = 0;
  for (int trial = 0; trial < 400; trial++) {
    for (int i = 0; i < K; i++) w[i] = (uint8_t)rnd();
    if (trial % 3) /* mostly NaN-free so the fast blocks run */
      for (int i = 0; i < K; i++)
        if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1;
    static const uint8_t special[] = {0, 1, 17, 119, 127, 246, 247, 254, 255};
    for (size_t i = 0; i < sizeof s8; i++) s8[i] = rnd() % 4 ? (uint8_t)(100 + rnd() % 40) : special[rnd() % 9];
    for (size_t i = 0; i < sizeof s4; i++) s4[i] = rnd() % 4 ? (uint8_t)(100 + rnd() % 40) : special[rnd() % 9];
    int64_t k0 = rnd() % 300, n = rnd() % (K - k0 + 1);
    for (int i = 0; i < K + 8; i++) a[i] = b[i] = -7.0f;
    tide_dequant_ref.fp8(a, w, s8, k0, n);
    tide_dequant_avx2.fp8(b, w, s8, k0, n);
    if (memcmp(a, b, sizeof a) && bad++ < 5) TT_CHECK(0, "fp8 k0=%lld n=%lld differs", (long long)k0, (long long)n);
    k0 &= ~(int64_t)1;
    n = (rnd() % ((K - k0) / 2 + 1)) * 2;
    for (int i = 0; i < K + 8; i++) a[i] = b[i] = -7.0f;
    tide_dequant_ref.mxfp4(a, w, s4, k0, n);
    tide_dequant_avx2.mxfp4(b, w, s4, k0, n);
    if (memcmp(a, b, sizeof a) && bad++ < 5) TT_CHECK(0, "mxfp4 k0=%lld n=%lld differs", (long long)k0, (long long)n);
  }
  TT_CHECK(bad == 0, "%d offset/length mismatches", bad);
}

static void integers_round_to_nearest(void) {
  enum { N = 203 };
  int32_t a32[N];
  int64_t a64[N];
  float r[N], v[N];
  static const int64_t edge[] = {0, 1, -1, 16777217, -16777217, 16777219, (1LL << 51) - 1, -(1LL << 51),
                                 1LL << 51, (1LL << 53) + 1, INT64_MAX, INT64_MIN, 2147483647, -2147483647 - 1};
  for (int i = 0; i < N; i++) {
    a64[i] = i < (int)(sizeof edge / sizeof edge[0]) ? edge[i] : (int64_t)(((uint64_t)rnd() << 32 | rnd()) >> (rnd() % 63));
    if (i >= (int)(sizeof edge / sizeof edge[0]) && i % 5 == 0) a64[i] = -a64[i];
    a32[i] = (int32_t)(rnd() ^ (rnd() << 16));
  }
  tide_dequant_ref.i32(r, a32, N);
  const tide_dequant_kernels *kt = tide_dequant_kernels_get();
  kt->i32(v, a32, N);
  for (int i = 0; i < N; i++) TT_CHECK(r[i] == (float)a32[i] && f2u(v[i]) == f2u(r[i]), "i32 %d", a32[i]);
  tide_dequant_ref.i64(r, a64, N);
  kt->i64(v, a64, N);
  for (int i = 0; i < N; i++)
    TT_CHECK(r[i] == (float)a64[i] && f2u(v[i]) == f2u(r[i]), "i64 %lld -> %.9g, ref %.9g", (long long)a64[i], v[i],
             r[i]);
  TT_CHECK(r[3] == 16777216.0f, "2^24+1 rounds to even");
}

/* fp8 subnormal codes decode exactly even with DAZ and FTZ on: no f32
 * subnormal is ever an operand of the fast path */
static void exact_with_daz_ftz(void) {
  if (!have_avx2()) return;
  uint8_t row[256], srow[2] = {127, 127};
  float want[256], got[256];
  for (int c = 0; c < 256; c++) row[c] = (uint8_t)c;
  tide_dequant_ref.fp8(want, row, srow, 0, 256);
  unsigned old = _mm_getcsr();
  _mm_setcsr(old | 0x8040); /* FTZ | DAZ */
  tide_dequant_avx2.fp8(got, row, srow, 0, 256);
  _mm_setcsr(old);
  TT_CHECK(memcmp(want, got, sizeof want) == 0, "fp8 decode changes under DAZ/FTZ");
  TT_CHECK(got[1] == ldexpf(1, -9) && got[0x81] == -ldexpf(1, -9), "subnormal codes: %g %g", got[1], got[0x81]);
}

/* ---- tide_dequant ---- */
static void fill_bytes(tide_tensor *t) {
  uint8_t *p = t->data;
  for (int64_t i = 0; i < tide_tensor_nbytes(t); i++) p[i] = (uint8_t)rnd();
}

static void dequant_tensors(void) {
  int64_t shp[2] = {130, 200};
  tide_tensor w = {0}, s = {0}, out = {0}, one = {0}, ref = {0};
  /* FP8 with ragged edges */
  TT_OK(tide_tensor_new(&w, TIDE_F8E4M3, 2, shp));
  fill_bytes(&w);
  int64_t ss[2] = {2, 2};
  TT_OK(tide_tensor_new(&s, TIDE_E8M0, 2, ss));
  uint8_t *sp = s.data;
  sp[0] = 120, sp[1] = 127, sp[2] = 0xff, sp[3] = 130;
  TT_OK(tide_tensor_new(&out, TIDE_F32, 2, shp));
  TT_OK(tide_dequant(&out, &w, &s, 0));
  int bad = 0;
  const uint8_t *wp = w.data;
  for (int64_t n = 0; n < 130; n++)
    for (int64_t k = 0; k < 200; k++) {
      float e = tide_dequant_fp8_at(wp[n * 200 + k], sp[(n / 128) * 2 + k / 128]);
      float g = ((float *)out.data)[n * 200 + k];
      if (f2u(e) != f2u(g) && bad++ < 3) TT_CHECK(0, "fp8 [%lld, %lld]: %g vs %g", (long long)n, (long long)k, g, e);
    }
  TT_CHECK(bad == 0, "%d fp8 tensor mismatches", bad);
  /* a row range, into a 1-d output */
  int64_t k200 = 200;
  TT_OK(tide_tensor_new(&one, TIDE_F32, 1, &k200));
  TT_OK(tide_dequant(&one, &w, &s, 129));
  TT_CHECK(memcmp(one.data, (float *)out.data + 129 * 200, 800) == 0, "row 129 differs");
  /* thread counts give the same bytes */
  TT_OK(tide_tensor_new(&ref, TIDE_F32, 2, shp));
  int old = tide_threads_get();
  tide_threads_set(1);
  TT_OK(tide_dequant(&ref, &w, &s, 0));
  tide_threads_set(2);
  TT_OK(tide_dequant(&out, &w, &s, 0));
  tide_threads_set(old);
  TT_CHECK(memcmp(ref.data, out.data, 130 * 200 * 4) == 0, "threads change the result");
  /* misuse */
  TT_FAILS(tide_dequant(&out, &w, NULL, 0), TIDE_E_INVALID, "needs a scale tensor");
  TT_FAILS(tide_dequant(&out, &w, &s, 1), TIDE_E_RANGE, "rows 1..130 outside the 130 rows");
  TT_FAILS(tide_dequant(&one, &w, &s, 130), TIDE_E_RANGE, "outside the 130 rows");
  tide_tensor_release(&s);
  int64_t sbad[2] = {1, 2};
  TT_OK(tide_tensor_new(&s, TIDE_E8M0, 2, sbad));
  TT_FAILS(tide_dequant(&out, &w, &s, 0), TIDE_E_INVALID, "expected [2, 2] for a FP8 weight of 130 x 200");
  tide_tensor_release(&s);
  tide_tensor_release(&w);
  tide_tensor_release(&one);
  tide_tensor_release(&ref);

  /* MXFP4: [N, K/2] bytes, scale [N, K/32] */
  int64_t ms[2] = {7, 48}, mss[2] = {7, 3}, mo[2] = {7, 96};
  TT_OK(tide_tensor_new(&w, TIDE_I8, 2, ms));
  fill_bytes(&w);
  TT_OK(tide_tensor_new(&s, TIDE_E8M0, 2, mss));
  fill_bytes(&s);
  tide_tensor_release(&out);
  TT_OK(tide_tensor_new(&out, TIDE_F32, 2, mo));
  TT_OK(tide_dequant(&out, &w, &s, 0));
  bad = 0;
  for (int64_t n = 0; n < 7; n++)
    for (int64_t k = 0; k < 96; k++) {
      uint8_t byte = ((uint8_t *)w.data)[n * 48 + k / 2];
      float e = tide_dequant_fp4_at((k & 1) ? byte >> 4 : byte & 15, ((uint8_t *)s.data)[n * 3 + k / 32]);
      if (f2u(e) != f2u(((float *)out.data)[n * 96 + k]) && bad++ < 3) TT_CHECK(0, "fp4 [%lld, %lld]", (long long)n, (long long)k);
    }
  TT_CHECK(bad == 0, "%d mxfp4 tensor mismatches", bad);
  TT_FAILS(tide_dequant(&out, &w, NULL, 0), TIDE_E_INVALID, "MXFP4 weight [7, 48] needs a scale tensor");
  tide_tensor_release(&w);
  tide_tensor_release(&s);
  tide_tensor_release(&out);

  /* plain formats: bf16 / f16 every bit pattern, i64 of a 3-d tensor */
  int64_t ps[2] = {256, 256};
  TT_OK(tide_tensor_new(&out, TIDE_F32, 2, ps));
  for (int dt = TIDE_BF16; dt <= TIDE_F16; dt++) {
    TT_OK(tide_tensor_new(&w, dt, 2, ps));
    for (int i = 0; i < 65536; i++) ((uint16_t *)w.data)[i] = (uint16_t)i;
    TT_OK(tide_dequant(&out, &w, NULL, 0));
    bad = 0;
    for (int i = 0; i < 65536; i++) {
      float e = dt == TIDE_BF16 ? tide_bf16_to_f32((uint16_t)i) : tide_f16_to_f32((uint16_t)i);
      if (f2u(e) != f2u(((float *)out.data)[i]) && bad++ < 3) TT_CHECK(0, "%s 0x%04x", tide_dtype_name(dt), i);
    }
    TT_CHECK(bad == 0, "%s: %d mismatches", tide_dtype_name(dt), bad);
    TT_FAILS(tide_dequant(&out, &w, &w, 0), TIDE_E_INVALID, "takes no scale");
    tide_tensor_release(&w);
  }
  tide_tensor_release(&out);
  int64_t s3[3] = {2, 3, 5}, o2[2] = {4, 5};
  TT_OK(tide_tensor_new(&w, TIDE_I64, 3, s3));
  for (int i = 0; i < 30; i++) ((int64_t *)w.data)[i] = (int64_t)i * 1000003 - 7;
  TT_OK(tide_tensor_new(&out, TIDE_F32, 2, o2));
  TT_OK(tide_dequant(&out, &w, NULL, 2)); /* rows 2..5 of the 6 */
  for (int i = 0; i < 20; i++)
    TT_CHECK(((float *)out.data)[i] == (float)((int64_t)(i + 10) * 1000003 - 7), "i64 element %d", i + 10);
  int64_t o3[2] = {4, 6};
  tide_tensor_release(&out);
  TT_OK(tide_tensor_new(&out, TIDE_F32, 2, o3));
  TT_FAILS(tide_dequant(&out, &w, NULL, 0), TIDE_E_INVALID, "must be [R, 5]");
  tide_tensor_release(&w);
  TT_OK(tide_tensor_new(&w, TIDE_E8M0, 2, o2));
  TT_FAILS(tide_dequant(&out, &w, NULL, 0), TIDE_E_UNSUPPORTED, "cannot dequantise e8m0");
  tide_tensor_release(&w);
  tide_tensor_release(&out);
}

TT_RUN(TT(fp8_every_code_every_scale), TT(mxfp4_every_byte_every_scale), TT(odd_offsets_and_lengths),
       TT(integers_round_to_nearest), TT(exact_with_daz_ftz), TT(dequant_tensors))
