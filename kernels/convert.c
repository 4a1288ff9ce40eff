/* convert.c - scalar conversions between tide's dtypes (the reference
 * semantics every SIMD variant is tested against) and tide_convert(). */
#include <math.h>

#include "convert.h"
#include "tide_internal.h"

static inline uint32_t f2u(float f) {
  union { float f; uint32_t u; } v = {f};
  return v.u;
}
static inline float u2f(uint32_t u) {
  union { uint32_t u; float f; } v = {u};
  return v.f;
}

uint16_t tide_f32_to_bf16(float x) { return tide_bf16r(x); }
float tide_bf16_to_f32(uint16_t h) { return tide_bf16f(h); }

uint16_t tide_f32_to_f16(float x) {
  uint32_t u = f2u(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((u >> 13) & 0x3ffu);
  if (u >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to inf */
  if (u < 0x38800000u) {                       /* below 2^-14: subnormal f16 */
    double m = rint((double)u2f(u) * 16777216.0); /* units of 2^-24, RNE */
    return sign | (uint16_t)m;                     /* m == 1024 is the smallest normal */
  }
  u += 0xfffu + ((u >> 13) & 1u);
  return sign | (uint16_t)((u >> 13) - ((127u - 15u) << 10));
}

float tide_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
    return u2f(f2u(v) | sign);
  }
  if (e == 31) return u2f(sign | 0x7f800000u | ((m ? (m | 0x200u) : 0u) << 13)); /* NaN quieted */
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

uint8_t tide_f32_to_f8e4m3(float x) {
  uint32_t u = f2u(x);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7f;       /* NaN */
  if (u >= 0x43e00000u) return sign | 0x7e;      /* >= 448 (and inf): saturate */
  if (u < 0x3c800000u) {                          /* below 2^-6: subnormal, units 2^-9 */
    double m = rint((double)u2f(u) * 512.0);
    return sign | (uint8_t)m;                     /* m == 8 is the smallest normal */
  }
  u += 0x7ffffu + ((u >> 20) & 1u);
  uint32_t code = (u >> 20) - ((127u - 7u) << 3);
  if (code > 0x7e) code = 0x7e;
  return sign | (uint8_t)code;
}

float tide_f8e4m3_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15 && m == 7) return u2f(sign | 0x7fc00000u);
  if (e == 0) return u2f(f2u((float)m * 0.001953125f) | sign); /* m * 2^-9 */
  return u2f(sign | ((e + 120u) << 23) | (m << 20));
}

uint8_t tide_f32_to_e8m0(float x) {
  if (isnan(x) || isinf(x)) return 0xff;
  if (x <= 0.0f) return (x == 0.0f) ? 0x00 : 0xff;
  int e;
  float f = frexpf(x, &e); /* x = f * 2^e, f in [0.5, 1) */
  int l2 = (f == 0.5f) ? e - 1 : e; /* ceil(log2 x), exact */
  if (l2 < -127) return 0x00;
  if (l2 > 127) return 0xff;
  return (uint8_t)(l2 + 127);
}

float tide_e8m0_to_f32(uint8_t b) {
  if (b == 0xff) return u2f(0x7fc00000u);
  if (b == 0) return u2f(0x00400000u); /* 2^-127, an f32 subnormal */
  return u2f((uint32_t)b << 23);
}

static const float fp4_vals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint8_t tide_f32_to_fp4(float x) {
  if (isnan(x)) return 0;
  uint8_t sign = signbit(x) ? 8 : 0;
  float a = fabsf(x);
  for (int i = 0; i < 7; i++) {
    float mid = 0.5f * (fp4_vals[i] + fp4_vals[i + 1]);
    if (a < mid) return sign | (uint8_t)i;
    if (a == mid) return sign | (uint8_t)((i & 1) ? i + 1 : i);
  }
  return sign | 7;
}

float tide_fp4_to_f32(uint8_t code) {
  float v = fp4_vals[code & 7];
  return (code & 8) ? -v : v;
}

/* ---- reference table ---- */
static void ref_bf16_to_f32(float *d, const uint16_t *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = tide_bf16f(s[i]);
}
static void ref_f32_to_bf16(uint16_t *d, const float *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = tide_bf16r(s[i]);
}
static void ref_f16_to_f32(float *d, const uint16_t *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = tide_f16_to_f32(s[i]);
}
static void ref_f32_to_f16(uint16_t *d, const float *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = tide_f32_to_f16(s[i]);
}
static void ref_f8_to_f32(float *d, const uint8_t *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = tide_f8e4m3_to_f32(s[i]);
}

const tide_convert_kernels tide_convert_ref = {ref_bf16_to_f32, ref_f32_to_bf16, ref_f16_to_f32,
                                               ref_f32_to_f16, ref_f8_to_f32,   ref_bf16_to_f32,
                                               ref_f16_to_f32, ref_f8_to_f32};

float tide_f8_lut[256];
static int f8_lut_done;
void tide_f8_lut_init(void) {
  if (__atomic_load_n(&f8_lut_done, __ATOMIC_ACQUIRE)) return;
  for (int i = 0; i < 256; i++) tide_f8_lut[i] = tide_f8e4m3_to_f32((uint8_t)i);
  __atomic_store_n(&f8_lut_done, 1, __ATOMIC_RELEASE);
}

const tide_convert_kernels *tide_convert_kernels_get(void) {
#if defined(__x86_64__)
  if (tide_use_avx2()) return &tide_convert_avx2;
#endif
  return &tide_convert_ref;
}

/* ---- generic element-wise conversion through f32 / i64 blocks ---- */
static int is_int(int dt) { return dt == TIDE_I8 || dt == TIDE_U8 || dt == TIDE_I32 || dt == TIDE_I64; }

static void load_f32(float *o, const void *src, int dt, int64_t s, int64_t n) {
  const uint8_t *b = src;
  switch (dt) {
    case TIDE_F32: memcpy(o, (const float *)src + s, (size_t)n * 4); break;
    case TIDE_BF16: tide_convert_kernels_get()->bf16_to_f32(o, (const uint16_t *)src + s, n); break;
    case TIDE_F16: tide_convert_kernels_get()->f16_to_f32(o, (const uint16_t *)src + s, n); break;
    case TIDE_F8E4M3: tide_convert_kernels_get()->f8_to_f32(o, b + s, n); break;
    case TIDE_E8M0: for (int64_t i = 0; i < n; i++) o[i] = tide_e8m0_to_f32(b[s + i]); break;
    case TIDE_FP4:
      for (int64_t i = 0; i < n; i++) {
        int64_t k = s + i;
        o[i] = tide_fp4_to_f32((uint8_t)((b[k >> 1] >> ((k & 1) * 4)) & 15));
      }
      break;
    case TIDE_I8: for (int64_t i = 0; i < n; i++) o[i] = (float)((const int8_t *)src)[s + i]; break;
    case TIDE_U8: for (int64_t i = 0; i < n; i++) o[i] = (float)b[s + i]; break;
    case TIDE_I32: for (int64_t i = 0; i < n; i++) o[i] = (float)((const int32_t *)src)[s + i]; break;
    case TIDE_I64: for (int64_t i = 0; i < n; i++) o[i] = (float)((const int64_t *)src)[s + i]; break;
  }
}

static int64_t sat_i64(double v, double lo, double hi) {
  if (isnan(v)) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v; /* truncation toward zero */
}

static void store_f32(void *dst, int dt, int64_t s, const float *in, int64_t n) {
  uint8_t *b = dst;
  switch (dt) {
    case TIDE_F32: memcpy((float *)dst + s, in, (size_t)n * 4); break;
    case TIDE_BF16: tide_convert_kernels_get()->f32_to_bf16((uint16_t *)dst + s, in, n); break;
    case TIDE_F16: tide_convert_kernels_get()->f32_to_f16((uint16_t *)dst + s, in, n); break;
    case TIDE_F8E4M3: for (int64_t i = 0; i < n; i++) b[s + i] = tide_f32_to_f8e4m3(in[i]); break;
    case TIDE_E8M0: for (int64_t i = 0; i < n; i++) b[s + i] = tide_f32_to_e8m0(in[i]); break;
    case TIDE_FP4:
      for (int64_t i = 0; i < n; i++) {
        int64_t k = s + i;
        int sh = (int)(k & 1) * 4;
        b[k >> 1] = (uint8_t)((b[k >> 1] & ~(15 << sh)) | (tide_f32_to_fp4(in[i]) << sh));
      }
      break;
    case TIDE_I8: for (int64_t i = 0; i < n; i++) ((int8_t *)dst)[s + i] = (int8_t)sat_i64(in[i], -128, 127); break;
    case TIDE_U8: for (int64_t i = 0; i < n; i++) b[s + i] = (uint8_t)sat_i64(in[i], 0, 255); break;
    case TIDE_I32:
      for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[s + i] = (int32_t)sat_i64(in[i], -2147483648.0, 2147483647.0);
      break;
    case TIDE_I64:
      for (int64_t i = 0; i < n; i++)
        ((int64_t *)dst)[s + i] = sat_i64(in[i], -9223372036854775808.0, 9223372036854774784.0);
      break;
  }
}

static int64_t load_int(const void *src, int dt, int64_t i) {
  switch (dt) {
    case TIDE_I8: return ((const int8_t *)src)[i];
    case TIDE_U8: return ((const uint8_t *)src)[i];
    case TIDE_I32: return ((const int32_t *)src)[i];
    default: return ((const int64_t *)src)[i];
  }
}
static void store_int(void *dst, int dt, int64_t i, int64_t v) {
  switch (dt) {
    case TIDE_I8: ((int8_t *)dst)[i] = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); break;
    case TIDE_U8: ((uint8_t *)dst)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); break;
    case TIDE_I32: ((int32_t *)dst)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v); break;
    default: ((int64_t *)dst)[i] = v; break;
  }
}

static void convert_range(void *dst, int ddt, const void *src, int sdt, int64_t s, int64_t n, int stream) {
  const tide_convert_kernels *k = tide_convert_kernels_get();
  if (stream && ddt == TIDE_F32) {
    if (sdt == TIDE_BF16) { k->bf16_to_f32_stream((float *)dst + s, (const uint16_t *)src + s, n); return; }
    if (sdt == TIDE_F16) { k->f16_to_f32_stream((float *)dst + s, (const uint16_t *)src + s, n); return; }
    if (sdt == TIDE_F8E4M3) { k->f8_to_f32_stream((float *)dst + s, (const uint8_t *)src + s, n); return; }
  }
  if (ddt == sdt) {
    int bits = tide_dtype_bits(ddt);
    memcpy((uint8_t *)dst + s * bits / 8, (const uint8_t *)src + s * bits / 8, (size_t)(n * bits / 8));
    return;
  }
  if (ddt == TIDE_F32 && sdt == TIDE_BF16) { k->bf16_to_f32((float *)dst + s, (const uint16_t *)src + s, n); return; }
  if (ddt == TIDE_BF16 && sdt == TIDE_F32) { k->f32_to_bf16((uint16_t *)dst + s, (const float *)src + s, n); return; }
  if (ddt == TIDE_F32 && sdt == TIDE_F16) { k->f16_to_f32((float *)dst + s, (const uint16_t *)src + s, n); return; }
  if (ddt == TIDE_F16 && sdt == TIDE_F32) { k->f32_to_f16((uint16_t *)dst + s, (const float *)src + s, n); return; }
  if (ddt == TIDE_F32 && sdt == TIDE_F8E4M3) { k->f8_to_f32((float *)dst + s, (const uint8_t *)src + s, n); return; }
  if (is_int(ddt) && is_int(sdt)) {
    for (int64_t i = s; i < s + n; i++) store_int(dst, ddt, i, load_int(src, sdt, i));
    return;
  }
  if (is_int(sdt) && sdt == TIDE_I64 && !is_int(ddt)) {
    /* i64 -> float through double to avoid losing more than the target's precision */
    float buf[1];
    for (int64_t i = s; i < s + n; i++) {
      buf[0] = (float)(double)((const int64_t *)src)[i];
      store_f32(dst, ddt, i, buf, 1);
    }
    return;
  }
  float buf[512];
  for (int64_t i = 0; i < n; i += 512) {
    int64_t m = n - i < 512 ? n - i : 512;
    load_f32(buf, src, sdt, s + i, m);
    store_f32(dst, ddt, s + i, buf, m);
  }
}

int tide_convert(void *dst, int ddt, const void *src, int sdt, int64_t n) {
  if (!tide_dtype_valid(ddt) || !tide_dtype_valid(sdt))
    return TIDE_ERR(TIDE_E_INVALID, "bad dtype %d -> %d", sdt, ddt);
  if (n < 0) return TIDE_ERR(TIDE_E_INVALID, "negative count %lld", (long long)n);
  if (n == 0) return TIDE_OK;
  if (!dst || !src) return TIDE_ERR(TIDE_E_INVALID, "NULL buffer");
  if ((ddt == TIDE_FP4 || sdt == TIDE_FP4) && (n & 1))
    return TIDE_ERR(TIDE_E_INVALID, "fp4 conversion needs an even count, got %lld", (long long)n);
  const int64_t chunk = 8192;
  if (n < 4 * chunk) {
    convert_range(dst, ddt, src, sdt, 0, n, 0);
    return TIDE_OK;
  }
  int stream = n * (tide_dtype_bits(ddt) / 8) >= TIDE_CONVERT_STREAM_BYTES;
  int64_t nchunks = (n + chunk - 1) / chunk;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t c = 0; c < nchunks; c++) {
    int64_t s = c * chunk, m = n - s < chunk ? n - s : chunk;
    convert_range(dst, ddt, src, sdt, s, m, stream);
  }
  return TIDE_OK;
}
