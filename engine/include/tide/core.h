/* tide/core.h - status codes, errors, allocation counters, threads, CPU
 * features. Part of tide.h; include tide.h, not this file. */

/* Status codes. Negative = error, 0 = ok, positive = recoverable state. */
enum {
  TIDE_OK = 0,
  TIDE_FULL = 1,               /* a pool or cache has no room; nothing changed */
  TIDE_E_INVALID = -1,         /* bad argument: shape, dtype, NULL, misuse */
  TIDE_E_NOMEM = -2,           /* allocation failed */
  TIDE_E_IO = -3,              /* open/read/mmap/write failed */
  TIDE_E_FORMAT = -4,          /* malformed file or data */
  TIDE_E_UNSUPPORTED = -5,     /* valid but not supported by tide */
  TIDE_E_RANGE = -6,           /* index, token id or position out of range */
  TIDE_E_STATE = -7,           /* object in the wrong state for the call */
  TIDE_E_INTERNAL = -8         /* broken invariant: a bug in tide */
};

/* Library version, e.g. "0.1.0". Static storage. */
const char *tide_version(void);

/* The FFI declarations of this header, generated at build time. Static. */
const char *tide_cdef(void);

/* The layout of every struct and union declared in tide.h as this C compiler
 * lays it out, generated at build time next to the declarations: one row per
 * struct (field = NULL: size and alignment of the whole) followed by one row
 * per member (offset and size; bit-fields are left out, a flexible array
 * member has size -1). The Lua specs compare it with ffi.sizeof, ffi.alignof
 * and ffi.offsetof, so a struct added to any section header is checked with
 * no test to write. Static storage; *n gets the number of rows. */
typedef struct tide_abi_row {
  const char *type;     /* as the cdef names it: "tide_tensor" or "struct foo" */
  const char *field;    /* member name, NULL for the row of the whole struct */
  int64_t offset;       /* offsetof(type, field); 0 for the whole-struct row */
  int64_t size;         /* sizeof the member or of the struct */
  int64_t align;        /* alignment of the struct (whole-struct row), else 0 */
} tide_abi_row;
const tide_abi_row *tide_abi_layout(int *n);

/* The message of the last failing call on this thread ("" if none): names the
 * function and the offending value, file or tensor. Valid until the next tide
 * call on this thread. */
const char *tide_last_error(void);
/* The status code that went with tide_last_error(). */
int tide_last_status(void);
void tide_clear_error(void);
/* A short name for a status code ("TIDE_E_RANGE"). Static storage. */
const char *tide_status_name(int status);

/* Live allocation counters over every allocation tide makes (tensors,
 * weights, caches, handles). Tests read them to check nothing leaks. */
typedef struct tide_alloc_stats {
  int64_t live_allocs;     /* blocks currently allocated */
  int64_t live_bytes;      /* bytes currently allocated */
  int64_t total_allocs;    /* allocations since start */
  int64_t peak_bytes;      /* high-water mark of live_bytes */
  int64_t live_storages;   /* tensor storages alive (owned, mmap, borrowed) */
  int64_t live_maps;       /* mmap'd files alive */
  int64_t mapped_bytes;    /* bytes of those mappings */
} tide_alloc_stats;
void tide_alloc_stats_get(tide_alloc_stats *out);

/* Threads: one OpenMP pool shared with oneDNN. n <= 0 restores the default
 * (OMP_NUM_THREADS, or the number of cores). Returns the count now in use. */
int tide_threads_set(int n);
int tide_threads_get(void);

/* Kernel selection. Optimised variants are chosen once from CPUID; setting
 * TIDE_REF=1 in the environment, or calling tide_kernels_force_ref(1), makes
 * every dispatched kernel use its scalar reference. Returns the old value. */
int tide_kernels_force_ref(int on);
/* e.g. "avx2 fma f16c" (what this CPU offers and tide uses). Static. */
const char *tide_cpu_features(void);
/* 1 if AVX2 kernels are in use (detected and not forced to reference). */
int tide_kernels_avx2(void);

/* Monotonic clock in seconds, for benchmarks and tokens/s reports. */
double tide_time(void);

/* Measure the read bandwidth of this machine in GB/s: sums `bytes` of memory
 * `reps` times with all threads and returns the best rate (bytes <= 0 picks
 * 512 MiB). Used by benchmarks to report ratios taken in the same run. */
double tide_bench_read_bw(int64_t bytes, int reps, int threads);

/* Measure this machine's f32 multiply-add throughput in GFLOP/s (2 flops
 * per FMA, every vector lane: 8 with AVX2, 1 without) with `threads`
 * threads (<= 0: the current count) over about `seconds` (<= 0: 0.2): the
 * FLOP roofline benchmarks take ratios against, measured in the same run. */
double tide_bench_fma_peak(double seconds, int threads);

/* An empty OpenMP parallel region, to measure its cost from benchmarks. */
void tide_bench_empty_parallel(void);
/* An FFI no-op, to measure the cost of one call from Lua. */
int tide_bench_noop(int x);

/* Free memory that a tide function documented as "caller frees with
 * tide_free". NULL-safe. */
void tide_free(void *p);
