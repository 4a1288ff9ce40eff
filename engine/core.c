/* core.c - errors, counted allocation, threads, CPU feature detection and the
 * small timing helpers benchmarks use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tide_internal.h"

#ifndef TIDE_VERSION_STRING
#define TIDE_VERSION_STRING "0.0.0"
#endif

const char *tide_version(void) { return TIDE_VERSION_STRING; }

/* ---- errors ---- */
static _Thread_local char tl_msg[2048];
static _Thread_local int tl_status;

int tide_errorf(int status, const char *fn, const char *fmt, ...) {
  va_list ap;
  int n = snprintf(tl_msg, sizeof tl_msg, "%s: ", fn ? fn : "tide");
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof tl_msg) n = (int)sizeof tl_msg - 1;
  va_start(ap, fmt);
  vsnprintf(tl_msg + n, sizeof tl_msg - (size_t)n, fmt, ap);
  va_end(ap);
  tl_status = status;
  return status;
}

int tide_error_wrap(int status, const char *fmt, ...) {
  char prefix[512], old[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  snprintf(old, sizeof old, "%.1500s", tl_msg);
  snprintf(tl_msg, sizeof tl_msg, "%.500s: %.1500s", prefix, old);
  tl_status = status;
  return status;
}

const char *tide_last_error(void) { return tl_msg; }
int tide_last_status(void) { return tl_status; }
void tide_clear_error(void) {
  tl_msg[0] = 0;
  tl_status = 0;
}

const char *tide_status_name(int s) {
  switch (s) {
    case TIDE_OK: return "TIDE_OK";
    case TIDE_FULL: return "TIDE_FULL";
    case TIDE_E_INVALID: return "TIDE_E_INVALID";
    case TIDE_E_NOMEM: return "TIDE_E_NOMEM";
    case TIDE_E_IO: return "TIDE_E_IO";
    case TIDE_E_FORMAT: return "TIDE_E_FORMAT";
    case TIDE_E_UNSUPPORTED: return "TIDE_E_UNSUPPORTED";
    case TIDE_E_RANGE: return "TIDE_E_RANGE";
    case TIDE_E_STATE: return "TIDE_E_STATE";
    case TIDE_E_INTERNAL: return "TIDE_E_INTERNAL";
    default: return "TIDE_E_UNKNOWN";
  }
}

/* ---- counted allocation ----
 * Each block carries a 64-byte header holding its size, so frees can update
 * the byte counters and the payload stays 64-byte aligned. */
enum { HDR = 64 };
static int64_t st_live_allocs, st_live_bytes, st_total, st_peak, st_storages, st_maps, st_mapped;

static void stats_add(int64_t nalloc, int64_t bytes) {
  __atomic_add_fetch(&st_live_allocs, nalloc, __ATOMIC_RELAXED);
  int64_t now = __atomic_add_fetch(&st_live_bytes, bytes, __ATOMIC_RELAXED);
  if (nalloc > 0) __atomic_add_fetch(&st_total, nalloc, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&st_peak, __ATOMIC_RELAXED);
  while (now > peak &&
         !__atomic_compare_exchange_n(&st_peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

void *tide_xmalloc(size_t bytes) {
  void *p = NULL;
  if (bytes > ((size_t)1 << 50) || posix_memalign(&p, HDR, bytes + HDR) != 0 || !p) {
    TIDE_ERR(TIDE_E_NOMEM, "cannot allocate %zu bytes", bytes);
    return NULL;
  }
  *(size_t *)p = bytes;
  stats_add(1, (int64_t)bytes);
  return (char *)p + HDR;
}

void *tide_xcalloc(size_t n, size_t size) {
  if (size && n > ((size_t)1 << 50) / size) {
    TIDE_ERR(TIDE_E_NOMEM, "cannot allocate %zu x %zu bytes", n, size);
    return NULL;
  }
  void *p = tide_xmalloc(n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

void tide_xfree(void *p) {
  if (!p) return;
  char *base = (char *)p - HDR;
  stats_add(-1, -(int64_t) * (size_t *)base);
  free(base);
}

void *tide_xrealloc(void *p, size_t bytes) {
  if (!p) return tide_xmalloc(bytes);
  size_t old = *(size_t *)((char *)p - HDR);
  void *q = tide_xmalloc(bytes);
  if (!q) return NULL;
  memcpy(q, p, old < bytes ? old : bytes);
  tide_xfree(p);
  return q;
}

char *tide_xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = tide_xmalloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

void tide_free(void *p) { tide_xfree(p); }

void tide_stats_storage(int delta) { __atomic_add_fetch(&st_storages, delta, __ATOMIC_RELAXED); }
void tide_stats_map(int delta, int64_t bytes) {
  __atomic_add_fetch(&st_maps, delta, __ATOMIC_RELAXED);
  __atomic_add_fetch(&st_mapped, delta * bytes, __ATOMIC_RELAXED);
}

void tide_alloc_stats_get(tide_alloc_stats *out) {
  if (!out) return;
  out->live_allocs = __atomic_load_n(&st_live_allocs, __ATOMIC_RELAXED);
  out->live_bytes = __atomic_load_n(&st_live_bytes, __ATOMIC_RELAXED);
  out->total_allocs = __atomic_load_n(&st_total, __ATOMIC_RELAXED);
  out->peak_bytes = __atomic_load_n(&st_peak, __ATOMIC_RELAXED);
  out->live_storages = __atomic_load_n(&st_storages, __ATOMIC_RELAXED);
  out->live_maps = __atomic_load_n(&st_maps, __ATOMIC_RELAXED);
  out->mapped_bytes = __atomic_load_n(&st_mapped, __ATOMIC_RELAXED);
}

/* ---- threads ---- */
static int default_threads(void) {
  const char *e = getenv("OMP_NUM_THREADS");
  if (e && atoi(e) > 0) return atoi(e);
#ifdef _OPENMP
  return omp_get_num_procs();
#else
  return 1;
#endif
}

int tide_threads_set(int n) {
  if (n <= 0) n = default_threads();
  if (n > 1024) n = 1024;
#ifdef _OPENMP
  omp_set_num_threads(n);
  return omp_get_max_threads();
#else
  (void)n;
  return 1;
#endif
}

int tide_threads_get(void) { return tide_omp_threads(); }

/* ---- CPU features and kernel selection ---- */
static int cpu_init_done, cpu_avx2, force_ref;

static void cpu_init(void) {
  if (__atomic_load_n(&cpu_init_done, __ATOMIC_ACQUIRE)) return;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  /* F16C has no __builtin_cpu_supports name on older gcc; check CPUID 1:ECX.29 */
  {
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    if (!(c & (1u << 29))) cpu_avx2 = 0;
  }
#endif
  const char *e = getenv("TIDE_REF");
  if (e && *e && strcmp(e, "0") != 0) force_ref = 1;
  __atomic_store_n(&cpu_init_done, 1, __ATOMIC_RELEASE);
}

int tide_use_avx2(void) {
  cpu_init();
  return cpu_avx2 && !force_ref;
}
int tide_kernels_avx2(void) { return tide_use_avx2(); }

int tide_kernels_force_ref(int on) {
  cpu_init();
  int old = force_ref;
  force_ref = on ? 1 : 0;
  return old;
}

const char *tide_cpu_features(void) {
  cpu_init();
  return cpu_avx2 ? "avx2 fma f16c" : "generic";
}

double tide_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tide_bench_noop(int x) { return x + 1; }

void tide_bench_empty_parallel(void) {
#ifdef _OPENMP
#pragma omp parallel
  { __asm__ volatile("" ::: "memory"); }
#endif
}
