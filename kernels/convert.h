/* convert.h - contiguous dtype conversion kernels: scalar references and
 * AVX2 variants behind one table filled from CPUID.
 * Shapes: n contiguous elements; no alignment required. */
#ifndef TIDE_KERNELS_CONVERT_H
#define TIDE_KERNELS_CONVERT_H

#include <stdint.h>

typedef struct tide_convert_kernels {
  void (*bf16_to_f32)(float *dst, const uint16_t *src, int64_t n);
  void (*f32_to_bf16)(uint16_t *dst, const float *src, int64_t n);
  void (*f16_to_f32)(float *dst, const uint16_t *src, int64_t n);
  void (*f32_to_f16)(uint16_t *dst, const float *src, int64_t n);
  void (*f8_to_f32)(float *dst, const uint8_t *src, int64_t n);
  /* The same widening conversions with non-temporal stores, for outputs far
   * larger than the caches: the f32 result bypasses them, which saves the
   * read-for-ownership of every destination line. Same results. */
  void (*bf16_to_f32_stream)(float *dst, const uint16_t *src, int64_t n);
  void (*f16_to_f32_stream)(float *dst, const uint16_t *src, int64_t n);
  void (*f8_to_f32_stream)(float *dst, const uint8_t *src, int64_t n);
} tide_convert_kernels;

/* tide_convert streams its f32 output when it writes at least this many
 * bytes (beyond the last-level cache, so the output cannot stay cached). */
enum { TIDE_CONVERT_STREAM_BYTES = 32 << 20 };

/* The active table (AVX2 when available and TIDE_REF is not set). */
const tide_convert_kernels *tide_convert_kernels_get(void);
/* The scalar references, always available. */
extern const tide_convert_kernels tide_convert_ref;
#if defined(__x86_64__)
extern const tide_convert_kernels tide_convert_avx2;
#endif

/* fp8 e4m3fn decode table (256 floats), shared by kernels that want a LUT. */
extern float tide_f8_lut[256];
void tide_f8_lut_init(void);

#endif
