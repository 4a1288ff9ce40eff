/* test_convert.c - dtype conversions: every fp8/e8m0/fp4 code round-trips,
 * encoders agree with a brute-force nearest-value search, bf16/f16 ties go to
 * even, overflow/subnormal/NaN rules hold, the AVX2 kernels match the scalar
 * references bit for bit over every bf16/f16 code at awkward lengths and
 * offsets, and tide_convert agrees with the element-wise strided copy. */
#include <float.h>
#include <stdint.h>

#include "convert.h"
#include "tide.h"
#include "tt.h"

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

/* Independent decoders, straight from the format definitions. */
static double e4m3_value(int code) {
  int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
static double f16_value(int h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m / 1024.0, -14) : ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}

/* Brute-force nearest encoder over a table of the non-negative finite codes
 * (ascending values, code = index): RNE with ties to the even code, values
 * beyond the largest saturate to it. */
static int nearest_code(const double *vals, int n, double x) {
  double a = fabs(x);
  if (a >= vals[n - 1]) return n - 1;
  int best = 0;
  for (int i = 1; i < n; i++) {
    double d = fabs(a - vals[i]), db = fabs(a - vals[best]);
    if (d < db || (d == db && (i & 1) == 0)) best = i;
  }
  return best;
}

/* ---- fp8 e4m3fn ---- */
static void fp8_all_codes_round_trip(void) {
  for (int c = 0; c < 256; c++) {
    float f = tide_f8e4m3_to_f32((uint8_t)c);
    if ((c & 0x7f) == 0x7f) {
      TT_CHECK(isnan(f), "code 0x%02x decodes to %g, expected NaN", c, f);
      TT_CHECK(tide_f32_to_f8e4m3(f) == (c & 0x80 ? 0xff : 0x7f), "NaN code 0x%02x re-encodes to 0x%02x", c,
               tide_f32_to_f8e4m3(f));
      continue;
    }
    TT_CHECK((double)f == e4m3_value(c), "code 0x%02x decodes to %.9g, expected %.9g", c, f, e4m3_value(c));
    TT_CHECK((signbit(f) != 0) == ((c & 0x80) != 0), "code 0x%02x lost its sign", c);
    uint8_t back = tide_f32_to_f8e4m3(f);
    TT_CHECK(back == c, "code 0x%02x -> %g -> 0x%02x", c, f, back);
  }
  TT_CHECK(tide_f8e4m3_to_f32(0x7e) == 448.0f, "max is not 448");
  TT_CHECK(tide_f8e4m3_to_f32(0x01) == ldexpf(1, -9), "min subnormal is not 2^-9");
}

static void fp8_encode_matches_nearest(void) {
  double vals[127];
  for (int i = 0; i < 127; i++) vals[i] = e4m3_value(i);
  /* every f32 bit pattern at a prime stride, plus each midpoint and its two
   * f32 neighbours */
  int bad = 0;
  for (uint64_t u = 0; u < 0x100000000ULL && bad < 5; u += 4093) {
    float x = u2f((uint32_t)u);
    if (isnan(x)) continue;
    int want = nearest_code(vals, 127, x) | (signbit(x) ? 0x80 : 0);
    int got = tide_f32_to_f8e4m3(x);
    if (got != want) {
      bad++;
      TT_CHECK(got == want, "encode(%.9g) = 0x%02x, nearest is 0x%02x", x, got, want);
    }
  }
  for (int i = 0; i < 126; i++) {
    float mid = (float)((vals[i] + vals[i + 1]) / 2); /* exact in f32 */
    int even = (i & 1) ? i + 1 : i;
    TT_CHECK(tide_f32_to_f8e4m3(mid) == even, "tie %.9g -> 0x%02x, expected 0x%02x", mid, tide_f32_to_f8e4m3(mid), even);
    TT_CHECK(tide_f32_to_f8e4m3(-mid) == (even | 0x80), "tie -%.9g lost its sign", mid);
    TT_CHECK(tide_f32_to_f8e4m3(nextafterf(mid, 0)) == i, "just below tie %.9g", mid);
    TT_CHECK(tide_f32_to_f8e4m3(nextafterf(mid, 1e9f)) == i + 1, "just above tie %.9g", mid);
  }
  /* saturation and NaN */
  TT_CHECK(tide_f32_to_f8e4m3(464.0f) == 0x7e, "464 does not saturate");
  TT_CHECK(tide_f32_to_f8e4m3(1e30f) == 0x7e, "1e30 does not saturate");
  TT_CHECK(tide_f32_to_f8e4m3(INFINITY) == 0x7e, "inf does not saturate");
  TT_CHECK(tide_f32_to_f8e4m3(-INFINITY) == 0xfe, "-inf does not saturate");
  TT_CHECK(tide_f32_to_f8e4m3(NAN) == 0x7f, "NaN");
  TT_CHECK(tide_f32_to_f8e4m3(-NAN) == 0xff, "-NaN keeps its sign");
  TT_CHECK(tide_f32_to_f8e4m3(ldexpf(1, -10)) == 0x00, "2^-10 is a tie to 0");
  TT_CHECK(tide_f32_to_f8e4m3(-0.0f) == 0x80, "-0");
}

/* ---- e8m0 ---- */
static void e8m0_all_codes_round_trip(void) {
  for (int c = 0; c < 256; c++) {
    float f = tide_e8m0_to_f32((uint8_t)c);
    if (c == 255) {
      TT_CHECK(isnan(f), "0xff decodes to %g, expected NaN", f);
      TT_CHECK(tide_f32_to_e8m0(f) == 0xff, "NaN re-encodes to 0x%02x", tide_f32_to_e8m0(f));
      continue;
    }
    TT_CHECK((double)f == ldexp(1.0, c - 127), "code %d decodes to %g", c, f);
    TT_CHECK(tide_f32_to_e8m0(f) == c, "code %d -> %g -> %d", c, f, tide_f32_to_e8m0(f));
  }
  /* a scale never shrinks: encoding rounds up to the next power of two */
  TT_CHECK(tide_f32_to_e8m0(1.0f) == 127, "1.0");
  TT_CHECK(tide_f32_to_e8m0(nextafterf(1.0f, 2.0f)) == 128, "just above 1 rounds up to 2");
  TT_CHECK(tide_f32_to_e8m0(0.75f) == 127, "0.75 rounds up to 1");
  TT_CHECK(tide_f32_to_e8m0(0.0f) == 0, "0 -> 0x00");
  TT_CHECK(tide_f32_to_e8m0(ldexpf(1, -140)) == 0, "tiny -> 0x00");
  TT_CHECK(tide_f32_to_e8m0(-1.0f) == 0xff, "negative -> NaN");
  TT_CHECK(tide_f32_to_e8m0(INFINITY) == 0xff, "inf -> NaN");
  TT_CHECK(tide_f32_to_e8m0(FLT_MAX) == 0xff, "above 2^127 -> NaN");
  TT_CHECK(tide_f32_to_e8m0(ldexpf(1, 127)) == 254, "2^127 -> 254");
}

/* ---- fp4 e2m1 ---- */
static void fp4_all_codes_round_trip(void) {
  static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  double vals[8];
  for (int c = 0; c < 16; c++) {
    float f = tide_fp4_to_f32((uint8_t)c);
    TT_CHECK(f == want[c] && (signbit(f) != 0) == (signbit(want[c]) != 0), "code %d decodes to %g", c, f);
    TT_CHECK(tide_f32_to_fp4(f) == c, "code %d -> %g -> %d", c, f, tide_f32_to_fp4(f));
    if (c < 8) vals[c] = f;
  }
  for (int i = 0; i < 7; i++) {
    float mid = (float)((vals[i] + vals[i + 1]) / 2);
    int even = (i & 1) ? i + 1 : i;
    TT_CHECK(tide_f32_to_fp4(mid) == even, "tie %g -> %d, expected %d", mid, tide_f32_to_fp4(mid), even);
    TT_CHECK(tide_f32_to_fp4(nextafterf(mid, 0)) == i, "below tie %g", mid);
    TT_CHECK(tide_f32_to_fp4(nextafterf(mid, 100)) == i + 1, "above tie %g", mid);
  }
  for (int k = 0; k < 20000; k++) {
    float x = ldexpf((float)(rnd32() % 100000) / 100000.0f, (int)(rnd32() % 6) - 2) * ((k & 1) ? -1 : 1);
    int w = nearest_code(vals, 8, x) | (signbit(x) ? 8 : 0);
    if (tide_f32_to_fp4(x) != w) {
      TT_CHECK(0, "encode(%.9g) = %d, nearest %d", x, tide_f32_to_fp4(x), w);
      break;
    }
  }
  TT_CHECK(tide_f32_to_fp4(7.0f) == 7 && tide_f32_to_fp4(1e9f) == 7 && tide_f32_to_fp4(-INFINITY) == 15,
           "saturation at +-6");
  TT_CHECK(tide_f32_to_fp4(NAN) == 0, "NaN -> 0");
}

/* ---- bf16 ---- */
static void bf16_rules(void) {
  for (int h = 0; h < 65536; h++) {
    float f = tide_bf16_to_f32((uint16_t)h);
    TT_CHECK(f2u(f) == (uint32_t)h << 16, "decode 0x%04x", h);
    uint16_t back = tide_f32_to_bf16(f);
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {
      TT_CHECK(back == (h | 0x40), "NaN 0x%04x -> 0x%04x, expected quiet 0x%04x", h, back, h | 0x40);
    } else {
      TT_CHECK(back == h, "0x%04x round-trips to 0x%04x", h, back);
    }
    if (h == 0x7f7f || (h & 0x7fff) >= 0x7f80) continue;
    /* ties to even, and the neighbours of each tie */
    uint32_t mid = ((uint32_t)h << 16) | 0x8000u;
    uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    if (tide_f32_to_bf16(u2f(mid)) != even || tide_f32_to_bf16(u2f(mid - 1)) != h ||
        tide_f32_to_bf16(u2f(mid + 1)) != h + 1) {
      TT_CHECK(0, "tie around 0x%04x: %04x %04x %04x", h, tide_f32_to_bf16(u2f(mid - 1)), tide_f32_to_bf16(u2f(mid)),
               tide_f32_to_bf16(u2f(mid + 1)));
      break;
    }
  }
  TT_CHECK(tide_f32_to_bf16(FLT_MAX) == 0x7f80, "FLT_MAX rounds to inf");
  TT_CHECK(tide_f32_to_bf16(u2f(0x7f7f7fff)) == 0x7f7f, "just below the overflow tie stays finite");
  TT_CHECK(tide_f32_to_bf16(-INFINITY) == 0xff80, "-inf");
  TT_CHECK(tide_f32_to_bf16(u2f(0x00008000)) == 0x0000, "subnormal tie to even 0");
  TT_CHECK(tide_f32_to_bf16(u2f(0x00018000)) == 0x0002, "subnormal tie to even 2");
  TT_CHECK(tide_f32_to_bf16(u2f(0xff800001)) == 0xffc0, "signalling NaN becomes quiet, sign kept");
}

/* ---- f16 ---- */
static void f16_rules(void) {
  for (int h = 0; h < 65536; h++) {
    float f = tide_f16_to_f32((uint16_t)h);
    int e = (h >> 10) & 31;
    if (e == 31) {
      if (h & 1023) {
        TT_CHECK(isnan(f) && (f2u(f) & 0x00400000u), "0x%04x must decode to a quiet NaN", h);
        uint16_t back = tide_f32_to_f16(f);
        TT_CHECK(back == (h | 0x200), "NaN 0x%04x -> 0x%04x", h, back);
      } else {
        TT_CHECK(isinf(f) && (signbit(f) != 0) == (h >> 15), "0x%04x must decode to inf", h);
        TT_CHECK(tide_f32_to_f16(f) == h, "inf round trip");
      }
      continue;
    }
    TT_CHECK((double)f == f16_value(h), "0x%04x decodes to %.9g, expected %.9g", h, f, f16_value(h));
    TT_CHECK(tide_f32_to_f16(f) == h, "0x%04x round-trips to 0x%04x", h, tide_f32_to_f16(f));
    if ((h & 0x7fff) >= 0x7bff) continue;
    double mid = (f16_value(h) + f16_value(h + 1)) / 2; /* exact in f32 */
    float m = (float)mid;
    uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    if ((h & 0x8000) == 0 &&
        (tide_f32_to_f16(m) != even || tide_f32_to_f16(nextafterf(m, 0)) != h ||
         tide_f32_to_f16(nextafterf(m, INFINITY)) != h + 1)) {
      TT_CHECK(0, "tie around 0x%04x: %04x %04x %04x", h, tide_f32_to_f16(nextafterf(m, 0)), tide_f32_to_f16(m),
               tide_f32_to_f16(nextafterf(m, INFINITY)));
      break;
    }
  }
  TT_CHECK(tide_f32_to_f16(65504.0f) == 0x7bff, "max");
  TT_CHECK(tide_f32_to_f16(65519.99f) == 0x7bff, "just below the overflow tie");
  TT_CHECK(tide_f32_to_f16(65520.0f) == 0x7c00, "65520 ties up to inf");
  TT_CHECK(tide_f32_to_f16(-1e10f) == 0xfc00, "-1e10 -> -inf");
  TT_CHECK(tide_f32_to_f16(ldexpf(1, -25)) == 0x0000, "2^-25 ties to 0");
  TT_CHECK(tide_f32_to_f16(ldexpf(3, -25)) == 0x0002, "3*2^-25 ties to 2");
  TT_CHECK(tide_f32_to_f16(ldexpf(1, -26)) == 0x0000, "2^-26 underflows");
  TT_CHECK(tide_f32_to_f16(-ldexpf(1, -26)) == 0x8000, "-2^-26 underflows to -0");
  TT_CHECK(tide_f32_to_f16(ldexpf(2047, -25)) == 0x0400, "largest subnormal tie goes to the smallest normal");
}

/* ---- AVX2 kernels against the references ---- */
#define NCODES 65536
static void check_u16(const char *what, const uint16_t *a, const uint16_t *b, int64_t n, const float *in) {
  for (int64_t i = 0; i < n; i++)
    if (a[i] != b[i]) {
      TT_CHECK(0, "%s[%lld]: avx2 0x%04x, ref 0x%04x (input bits 0x%08x)", what, (long long)i, a[i], b[i],
               in ? f2u(in[i]) : 0);
      return;
    }
}
static void check_f32(const char *what, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (f2u(a[i]) != f2u(b[i])) {
      TT_CHECK(0, "%s[%lld]: avx2 0x%08x, ref 0x%08x", what, (long long)i, f2u(a[i]), f2u(b[i]));
      return;
    }
}

static void avx2_matches_reference(void) {
#if defined(__x86_64__)
  if (!tide_kernels_avx2()) {
    printf("note: this CPU has no AVX2/F16C; only the reference kernels exist here\n");
    return;
  }
  const tide_convert_kernels *A = &tide_convert_avx2, *R = &tide_convert_ref;
  enum { NIN = 7 * NCODES + 64 };
  uint16_t *h = malloc(sizeof(uint16_t) * (NCODES + 64));
  float *f = malloc(sizeof(float) * NIN), *fa = malloc(sizeof(float) * NIN), *fr = malloc(sizeof(float) * NIN);
  uint16_t *ha = malloc(sizeof(uint16_t) * NIN), *hr = malloc(sizeof(uint16_t) * NIN);
  uint8_t *b = malloc(256 + 64);
  /* every code, at every alignment 0..3 and the lengths around the vector
   * widths */
  for (int i = 0; i < NCODES + 64; i++) h[i] = (uint16_t)i;
  for (int off = 0; off < 4; off++) {
    A->bf16_to_f32(fa, h + off, NCODES);
    R->bf16_to_f32(fr, h + off, NCODES);
    check_f32("bf16_to_f32", fa, fr, NCODES);
    A->f16_to_f32(fa, h + off, NCODES);
    R->f16_to_f32(fr, h + off, NCODES);
    check_f32("f16_to_f32", fa, fr, NCODES);
    /* the streaming variants, with the destination at every alignment */
    A->bf16_to_f32_stream(fa + 3 - off, h + off, NCODES);
    R->bf16_to_f32(fr, h + off, NCODES);
    check_f32("bf16_to_f32_stream", fa + 3 - off, fr, NCODES);
    A->f16_to_f32_stream(fa + 3 - off, h + off, NCODES);
    R->f16_to_f32(fr, h + off, NCODES);
    check_f32("f16_to_f32_stream", fa + 3 - off, fr, NCODES);
  }
  /* f32 inputs: each bf16 code with the low half 0, 0x7fff, 0x8000 (tie),
   * 0x8001, 0xffff or random; each f16 code, its midpoints and their
   * neighbours (ties for f32 -> f16); random bits */
  int64_t n = 0;
  for (int i = 0; i < NCODES; i++) {
    uint32_t hi = (uint32_t)i << 16;
    f[n++] = u2f(hi);
    f[n++] = u2f(hi | 0x7fff);
    f[n++] = u2f(hi | 0x8000);
    f[n++] = u2f(hi | 0x8001);
    f[n++] = u2f(hi | (rnd32() & 0xffff));
    if ((i & 0x7c00) != 0x7c00) {
      float m = (float)((f16_value(i) + f16_value((i & 0x7fff) == 0x7bff ? i : i + 1)) / 2);
      f[n++] = m;
      f[n++] = nextafterf(m, INFINITY);
    } else {
      f[n++] = u2f(rnd32());
      f[n++] = u2f(rnd32());
    }
  }
  while (n < NIN) f[n++] = u2f(rnd32());
  for (int off = 0; off < 3; off++) {
    A->f32_to_bf16(ha, f + off, n - off);
    R->f32_to_bf16(hr, f + off, n - off);
    check_u16("f32_to_bf16", ha, hr, n - off, f + off);
    A->f32_to_f16(ha, f + off, n - off);
    R->f32_to_f16(hr, f + off, n - off);
    check_u16("f32_to_f16", ha, hr, n - off, f + off);
  }
  for (int i = 0; i < 256 + 64; i++) b[i] = (uint8_t)i;
  for (int off = 0; off < 17; off++) {
    A->f8_to_f32(fa, b + off, 256);
    R->f8_to_f32(fr, b + off, 256);
    check_f32("f8_to_f32", fa, fr, 256);
    A->f8_to_f32_stream(fa + off, b + off, 256);
    check_f32("f8_to_f32_stream", fa + off, fr, 256);
  }
  /* awkward lengths: the vector loop plus every tail, and nothing written
   * past the end */
  for (int64_t len = 0; len <= 70; len++) {
    for (int i = 0; i < 80; i++) fa[i] = fr[i] = -7.0f, ha[i] = hr[i] = 0xdead;
    A->bf16_to_f32(fa, h + 0x3f00, len);
    R->bf16_to_f32(fr, h + 0x3f00, len);
    check_f32("bf16_to_f32 len", fa, fr, 80);
    A->f16_to_f32(fa, h + 0x3a00, len);
    R->f16_to_f32(fr, h + 0x3a00, len);
    check_f32("f16_to_f32 len", fa, fr, 80);
    A->f8_to_f32(fa, b + 3, len);
    R->f8_to_f32(fr, b + 3, len);
    check_f32("f8_to_f32 len", fa, fr, 80);
    for (int i = 0; i < 80; i++) fa[i] = -7.0f;
    A->f8_to_f32_stream(fa + 1, b + 3, len);
    check_f32("f8_to_f32_stream len", fa + 1, fr, len);
    TT_CHECK(fa[0] == -7.0f && fa[len + 1] == -7.0f, "stream wrote outside [1, %lld]", (long long)len);
    for (int i = 0; i < 80; i++) fa[i] = -7.0f;
    A->bf16_to_f32_stream(fa + 2, h + 0x3f00, len);
    R->bf16_to_f32(fr, h + 0x3f00, len);
    check_f32("bf16_to_f32_stream len", fa + 2, fr, len);
    TT_CHECK(fa[1] == -7.0f && fa[len + 2] == -7.0f, "stream wrote outside [2, %lld]", (long long)len);
    for (int i = 0; i < 80; i++) fa[i] = -7.0f;
    A->f16_to_f32_stream(fa, h + 0x3a00, len);
    R->f16_to_f32(fr, h + 0x3a00, len);
    check_f32("f16_to_f32_stream len", fa, fr, len);
    TT_CHECK(fa[len] == -7.0f, "stream wrote past %lld", (long long)len);
    A->f32_to_bf16(ha, f + 5, len);
    R->f32_to_bf16(hr, f + 5, len);
    check_u16("f32_to_bf16 len", ha, hr, 80, NULL);
    A->f32_to_f16(ha, f + 5, len);
    R->f32_to_f16(hr, f + 5, len);
    check_u16("f32_to_f16 len", ha, hr, 80, NULL);
    TT_CHECK(fa[len] == -7.0f && ha[len] == 0xdead, "wrote past the end at len %lld", (long long)len);
  }
  free(h), free(f), free(fa), free(fr), free(ha), free(hr), free(b);
#endif
}

/* The table in use follows tide_kernels_force_ref / TIDE_REF. */
static void dispatch_follows_force_ref(void) {
  int old = tide_kernels_force_ref(1);
  TT_CHECK(tide_convert_kernels_get() == &tide_convert_ref, "force_ref(1) must select the references");
  TT_CHECK(tide_kernels_avx2() == 0, "tide_kernels_avx2() must report 0 when forced to reference");
  tide_kernels_force_ref(old);
#if defined(__x86_64__)
  if (tide_kernels_avx2()) TT_CHECK(tide_convert_kernels_get() == &tide_convert_avx2, "AVX2 table not selected");
#endif
}

/* ---- tide_convert against the element-wise strided copy ---- */
static void convert_agrees_with_strided_copy(void) {
  static const int64_t lens[] = {2, 8, 62, 64, 130, 1000, 40002};
  for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
    int64_t n = lens[li];
    for (int sd = 0; sd < TIDE_NDTYPES; sd++) {
      for (int dd = 0; dd < TIDE_NDTYPES; dd++) {
        if (n > 1000 && !(sd <= TIDE_F8E4M3 || dd <= TIDE_F8E4M3)) continue;
        int64_t sbytes = n * tide_dtype_bits(sd) / 8, dbytes = n * tide_dtype_bits(dd) / 8;
        uint8_t *src = malloc((size_t)sbytes);
        for (int64_t i = 0; i < sbytes; i++) src[i] = (uint8_t)rnd32();
        /* fast path: contiguous tide_convert */
        uint8_t *fast = calloc(1, (size_t)dbytes);
        TT_OK(tide_convert(fast, dd, src, sd, n));
        /* slow path: the same values through a strided destination (every
         * other element of a [n, 2] tensor), i.e. per-element load/store */
        tide_tensor s, d2, dv, dc;
        memset(&s, 0, sizeof s), memset(&d2, 0, sizeof d2), memset(&dv, 0, sizeof dv), memset(&dc, 0, sizeof dc);
        int64_t shp[2] = {n, 2};
        TT_OK(tide_tensor_wrap(&s, src, sd, 1, &n, NULL, NULL));
        TT_OK(tide_tensor_new(&d2, dd, 2, shp));
        TT_OK(tide_tensor_select(&dv, &d2, 1, 1));
        TT_CHECK(!tide_tensor_is_contiguous(&dv), "strided view expected");
        TT_OK(tide_tensor_copy(&dv, &s));
        TT_OK(tide_tensor_clone(&dc, &dv, dd));
        const uint8_t *slow = dc.data;
        tide_tensor tf;
        memset(&tf, 0, sizeof tf);
        TT_OK(tide_tensor_wrap(&tf, fast, dd, 1, &n, NULL, NULL));
        int bad = 0, bits = tide_dtype_bits(dd);
        for (int64_t i = 0; i < n && !bad; i++) {
          double x, y;
          int64_t ix[1] = {i};
          tide_tensor_get(&tf, ix, &x);
          tide_tensor_get(&dc, ix, &y);
          int eq;
          if (bits >= 8 && !(isnan(x) && isnan(y)))
            eq = !memcmp(fast + i * bits / 8, slow + i * bits / 8, (size_t)bits / 8);
          else
            eq = (isnan(x) && isnan(y)) || x == y;
          if (!eq) {
            bad = 1;
            TT_CHECK(0, "%s -> %s, n=%lld, element %lld: tide_convert %.9g, strided copy %.9g", tide_dtype_name(sd),
                     tide_dtype_name(dd), (long long)n, (long long)i, x, y);
          }
        }
        tide_tensor_release(&tf);
        tide_tensor_release(&s), tide_tensor_release(&d2), tide_tensor_release(&dv), tide_tensor_release(&dc);
        free(src);
        free(fast);
      }
    }
  }
}

/* Outputs beyond TIDE_CONVERT_STREAM_BYTES take the streaming kernels
 * inside tide_convert: same values as the reference, to the last element. */
static void large_conversions_stream(void) {
  int64_t n = TIDE_CONVERT_STREAM_BYTES / 4 + 12345;
  uint16_t *h = malloc((size_t)n * 2);
  uint8_t *b = malloc((size_t)n);
  float *got = malloc((size_t)n * 4 + 4), *want = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)rnd32(), b[i] = (uint8_t)rnd32();
  static const int src_dt[3] = {TIDE_BF16, TIDE_F16, TIDE_F8E4M3};
  for (int k = 0; k < 3; k++) {
    const void *src = src_dt[k] == TIDE_F8E4M3 ? (const void *)b : (const void *)h;
    TT_OK(tide_convert(got + 1, TIDE_F32, src, src_dt[k], n)); /* dst 4 bytes off alignment */
    if (src_dt[k] == TIDE_BF16) tide_convert_ref.bf16_to_f32(want, h, n);
    if (src_dt[k] == TIDE_F16) tide_convert_ref.f16_to_f32(want, h, n);
    if (src_dt[k] == TIDE_F8E4M3) tide_convert_ref.f8_to_f32(want, b, n);
    TT_CHECK(!memcmp(got + 1, want, (size_t)n * 4), "large %s -> f32 differs from the reference",
             tide_dtype_name(src_dt[k]));
  }
  free(h), free(b), free(got), free(want);
}

static void convert_misuse(void) {
  float f[4] = {0};
  uint8_t b[4] = {0};
  TT_FAILS(tide_convert(b, TIDE_FP4, f, TIDE_F32, 3), TIDE_E_INVALID, "even count");
  TT_FAILS(tide_convert(b, 42, f, TIDE_F32, 2), TIDE_E_INVALID, "bad dtype");
  TT_FAILS(tide_convert(b, TIDE_U8, f, TIDE_F32, -1), TIDE_E_INVALID, "negative count");
  TT_FAILS(tide_convert(NULL, TIDE_U8, f, TIDE_F32, 2), TIDE_E_INVALID, "NULL buffer");
  TT_OK(tide_convert(NULL, TIDE_U8, NULL, TIDE_F32, 0));
  TT_CHECK(tide_dtype_from_name("F8_E4M3") == TIDE_F8E4M3 && tide_dtype_from_name("bfloat16") == TIDE_BF16 &&
               tide_dtype_from_name("F8_E8M0") == TIDE_E8M0 && tide_dtype_from_name("nope") == -1,
           "dtype names");
  TT_CHECK(!strcmp(tide_dtype_name(TIDE_FP4), "fp4") && !strcmp(tide_dtype_name(77), "?"), "dtype_name");
}

TT_RUN(TT(fp8_all_codes_round_trip), TT(fp8_encode_matches_nearest), TT(e8m0_all_codes_round_trip),
       TT(fp4_all_codes_round_trip), TT(bf16_rules), TT(f16_rules), TT(avx2_matches_reference),
       TT(dispatch_follows_force_ref), TT(convert_agrees_with_strided_copy), TT(large_conversions_stream),
       TT(convert_misuse))
