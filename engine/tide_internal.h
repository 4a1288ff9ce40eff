/* tide_internal.h - helpers shared by the C core and kernels, never exported
 * to Lua: error reporting, counted allocation, storage internals, element
 * addressing and the OpenMP shims. */
#ifndef TIDE_INTERNAL_H
#define TIDE_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tide.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- errors ---- */
/* Record `status` and a printf-style message prefixed with the function name
 * in the thread-local error slot; returns status so callers can
 * `return TIDE_ERR(TIDE_E_INVALID, "...")`. */
int tide_errorf(int status, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define TIDE_ERR(status, ...) tide_errorf((status), __func__, __VA_ARGS__)
/* Prefix the current message with more context ("layer 3: ..."). */
int tide_error_wrap(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TIDE_CHECK(expr)            \
  do {                              \
    int tide_rc_ = (expr);          \
    if (tide_rc_ < 0) return tide_rc_; \
  } while (0)

/* ---- counted allocation (64-byte aligned) ---- */
void *tide_xmalloc(size_t bytes);            /* NULL on failure, error set */
void *tide_xcalloc(size_t n, size_t size);   /* zero-filled */
void *tide_xrealloc(void *p, size_t bytes);  /* alignment kept */
void tide_xfree(void *p);                    /* NULL-safe */
char *tide_xstrdup(const char *s);
void tide_stats_storage(int delta);
void tide_stats_map(int delta, int64_t bytes);

/* ---- storages ---- */
struct tide_storage {
  int64_t refs;            /* atomic */
  int kind;                /* tide_storage_kind */
  int readonly;
  void *data;
  int64_t bytes;
  tide_storage *owner;     /* borrowed: kept alive */
  void *map_base;          /* mmap: whole mapping */
  size_t map_len;
  char *path;              /* mmap: file path */
};

/* ---- tensors ---- */
int tide_dtype_valid(int dtype);
/* Byte pointer and nibble of the element at linear offset `off` (elements,
 * from element 0). */
static inline uint8_t *tide_elem_ptr(const tide_tensor *t, int64_t off, int *nib) {
  if (t->dtype == TIDE_FP4) {
    int64_t tot = t->nib + off;
    *nib = (int)(tot & 1);
    return (uint8_t *)t->data + (tot >> 1);
  }
  *nib = 0;
  return (uint8_t *)t->data + off * (tide_dtype_bits(t->dtype) / 8);
}
double tide_load_elem(const tide_tensor *t, int64_t off);
void tide_store_elem(tide_tensor *t, int64_t off, double v);
/* Check a tensor argument: non-NULL, non-empty, dtype in `dtype_mask`
 * (bit per dtype, 0 = any), ndim as given (-1 = any). `what` names it. */
int tide_check_tensor(const char *fn, const char *what, const tide_tensor *t, unsigned dtype_mask,
                      int ndim);
#define TIDE_DT(d) (1u << (d))
/* Human-readable shape "[3, 4]" into buf. */
const char *tide_shape_str(const tide_tensor *t, char *buf, size_t n);

/* ---- kernels config ---- */
int tide_use_avx2(void);                 /* AVX2 available and not forced off */

/* ---- OpenMP shims: work with and without OpenMP ---- */
static inline int tide_omp_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
static inline int tide_omp_tid(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

static inline float tide_bf16f(uint16_t h) {
  union { uint32_t u; float f; } v = {(uint32_t)h << 16};
  return v.f;
}
static inline uint16_t tide_bf16r(float x) {
  union { float f; uint32_t u; } v = {x};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
  v.u += 0x7fffu + ((v.u >> 16) & 1u);
  return (uint16_t)(v.u >> 16);
}
/* Round an f32 value to bf16 precision and back. */
static inline float tide_round_bf16(float x) { return tide_bf16f(tide_bf16r(x)); }

#endif /* TIDE_INTERNAL_H */
