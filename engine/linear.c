/* linear.c - the linear-layer handle: validates weight formats, and routes
 * y = x . W^T (plain, grouped, or many jobs at once) to the scalar
 * reference, the invariant AVX2 kernels or oneDNN. Work is cut into row
 * chunks and spread over the threads by a cost estimate; each output row is
 * computed by exactly one kernel call whose result does not depend on the
 * split, so the thread count never changes a bit. */
#include <stdio.h>
#include <stdlib.h>

#include "convert.h"
#include "linear.h"
#include "linear_q8.h"

#ifndef TIDE_HAVE_DNNL
int tide_dnnl_sgemm_nt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                       float *y, int64_t ldy) {
  return TIDE_ERR(TIDE_E_UNSUPPORTED, "tide was built without oneDNN (TIDE_DNNL=OFF)");
}
#endif

/* ---- AVX-512 variants of the fused kernels ----
 * Chosen at run time: AVX-512 F/BW/VL/DQ, VBMI and GFNI in CPUID with the
 * zmm state enabled by the OS (gcc's checks include XGETBV), not under
 * TIDE_REF, and not switched off by TIDE_NO_AVX512=1. */
static int avx512_cpu = -1, avx512_off;

int tide_linear_avx512_ready(void) {
#if defined(TIDE_HAVE_AVX512) && defined(__x86_64__)
  int c = __atomic_load_n(&avx512_cpu, __ATOMIC_ACQUIRE);
  if (c < 0) {
    __builtin_cpu_init();
    c = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
    const char *e = getenv("TIDE_NO_AVX512");
    if (e && *e && strcmp(e, "0") != 0) c = 0;
    __atomic_store_n(&avx512_cpu, c, __ATOMIC_RELEASE);
  }
  return c && !avx512_off && tide_use_avx2();
#else
  return 0;
#endif
}

int tide_linear_avx512_force_off(int off) {
  int old = avx512_off;
  avx512_off = off ? 1 : 0;
  return old;
}

const char *tide_linear_isa(void) {
  if (!tide_use_avx2()) return "ref";
  return tide_linear_avx512_ready() ? "avx512" : "avx2";
}

static int bad_shape(const char *fn, const char *what, const tide_tensor *t, const char *want) {
  char b[96];
  return tide_errorf(TIDE_E_INVALID, fn, "%s has shape %s %s, expected %s", what, tide_shape_str(t, b, sizeof b),
                     tide_dtype_name(t->dtype), want);
}

int tide_linear_new(tide_linear **out, const tide_tensor *w, const tide_tensor *scale) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = NULL;
  TIDE_CHECK(tide_check_tensor(__func__, "weight", w, 0, 2));
  if (!tide_tensor_is_contiguous(w)) return TIDE_ERR(TIDE_E_INVALID, "weight must be contiguous");
  int64_t N = w->sizes[0], K = w->sizes[1];
  int fmt;
  char want[160];
  switch (w->dtype) {
    case TIDE_F32: fmt = TIDE_W_F32; break;
    case TIDE_BF16: fmt = TIDE_W_BF16; break;
    case TIDE_F16: fmt = TIDE_W_F16; break;
    case TIDE_F8E4M3: fmt = TIDE_W_FP8; break;
    case TIDE_I8: case TIDE_U8: fmt = TIDE_W_MXFP4; K *= 2; break;
    default:
      return TIDE_ERR(TIDE_E_UNSUPPORTED, "weight dtype %s is not a linear-layer format (f32, bf16, f16, f8e4m3 + e8m0 "
                      "scale, i8/u8 MXFP4 + e8m0 scale)", tide_dtype_name(w->dtype));
  }
  if (fmt == TIDE_W_FP8 || fmt == TIDE_W_MXFP4) {
    if (!scale || !scale->data) return TIDE_ERR(TIDE_E_INVALID, "%s weight [%lld, %lld] needs a scale tensor",
                                               fmt == TIDE_W_FP8 ? "FP8" : "MXFP4", (long long)w->sizes[0], (long long)w->sizes[1]);
    TIDE_CHECK(tide_check_tensor(__func__, "scale", scale, TIDE_DT(TIDE_E8M0) | TIDE_DT(TIDE_U8), 2));
    if (!tide_tensor_is_contiguous(scale)) return TIDE_ERR(TIDE_E_INVALID, "scale must be contiguous");
    int64_t sr = fmt == TIDE_W_FP8 ? (N + 127) / 128 : N;
    int64_t sc = fmt == TIDE_W_FP8 ? (K + 127) / 128 : K / 32;
    if (fmt == TIDE_W_MXFP4 && K % 32)
      return TIDE_ERR(TIDE_E_INVALID, "MXFP4 weight has K = %lld inputs, not a multiple of 32", (long long)K);
    if (scale->sizes[0] != sr || scale->sizes[1] != sc) {
      snprintf(want, sizeof want, "[%lld, %lld] e8m0 for a weight of %lld x %lld", (long long)sr, (long long)sc,
               (long long)N, (long long)K);
      return bad_shape(__func__, "scale", scale, want);
    }
  } else if (scale && scale->data) {
    return TIDE_ERR(TIDE_E_INVALID, "a %s weight takes no scale tensor", tide_dtype_name(w->dtype));
  }
  struct tide_linear *l = tide_xcalloc(1, sizeof *l);
  if (!l) return TIDE_E_NOMEM;
  tide_tensor_ref(&l->w, w);
  if (fmt == TIDE_W_FP8 || fmt == TIDE_W_MXFP4) tide_tensor_ref(&l->scale, scale);
  l->fmt = fmt;
  l->policy = TIDE_LINEAR_INVARIANT;
  l->n = N;
  l->k = K;
  l->wbytes = tide_tensor_nbytes(w) + (l->scale.data ? tide_tensor_nbytes(&l->scale) : 0);
  l->view.fmt = fmt;
  l->view.w = l->w.data;
  l->view.s = l->scale.data;
  l->view.rows = N;
  l->view.k = K;
  l->view.row_bytes = w->sizes[1] * (tide_dtype_bits(w->dtype) / 8);
  l->view.s_ld = l->scale.data ? l->scale.sizes[1] : 0;
  if (fmt == TIDE_W_FP8) {
    l->nan8 = tide_xcalloc((size_t)(l->scale.sizes[0] * l->scale.sizes[1]), 1);
    if (!l->nan8) {
      tide_linear_free(l);
      return TIDE_ERR(TIDE_E_NOMEM, "no memory for the block flags of a %lld x %lld FP8 weight", (long long)N,
                      (long long)K);
    }
  }
  *out = l;
  return TIDE_OK;
}

void tide_linear_free(tide_linear *l) {
  if (!l) return;
  tide_tensor_release(&l->w);
  tide_tensor_release(&l->scale);
  tide_xfree(l->nan8);
  tide_xfree(l->q8w);
  tide_xfree(l->q8s);
  tide_xfree(l);
}

int tide_linear_info(const tide_linear *l, int64_t *n, int64_t *k, int *fmt) {
  if (!l) return TIDE_ERR(TIDE_E_INVALID, "NULL linear");
  if (n) *n = l->n;
  if (k) *k = l->k;
  if (fmt) *fmt = l->fmt;
  return TIDE_OK;
}

int64_t tide_linear_weight_bytes(const tide_linear *l) {
  if (!l) return 0;
  if (l->policy == TIDE_LINEAR_Q8 && l->q8w) { /* a forward reads the int8 copy instead */
    int64_t np = (l->k / 32 + 1) / 2;
    return l->n * np * (64 + (int64_t)sizeof(float));
  }
  return l->wbytes;
}

int tide_linear_set_policy(tide_linear *l, int policy) {
  if (!l) return TIDE_ERR(TIDE_E_INVALID, "NULL linear");
  if (policy != TIDE_LINEAR_INVARIANT && policy != TIDE_LINEAR_FAST && policy != TIDE_LINEAR_Q8)
    return TIDE_ERR(TIDE_E_INVALID, "bad policy %d (TIDE_LINEAR_INVARIANT = 0, TIDE_LINEAR_FAST = 1, TIDE_LINEAR_Q8 = 2)",
                    policy);
  if (policy == TIDE_LINEAR_Q8 && l->fmt != TIDE_W_MXFP4 && l->k % 32 == 0 && !l->q8w) {
    /* round the weight to int8 once (per 32-column block, the rule x gets) */
    int64_t N = l->n, K = l->k, np = (K / 32 + 1) / 2;
    int8_t *qw = tide_xmalloc((size_t)(N * np * 64));
    float *qs = tide_xmalloc((size_t)(N * np) * sizeof(float));
    if (!qw || !qs) {
      tide_xfree(qw);
      tide_xfree(qs);
      return TIDE_E_NOMEM;
    }
    l->q8w = qw;
    l->q8s = qs;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel if (N * K > (1 << 18))
#endif
    {
      float *buf = tide_xmalloc((size_t)K * sizeof(float));
      if (!buf) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
        failed = 1;
      }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
      for (int64_t n = 0; n < N; n += 64)
        if (buf) tide_q8_quantize_weight_rows(l, n, N - n < 64 ? N - n : 64, buf);
      tide_xfree(buf);
    }
    if (failed) {
      tide_xfree(l->q8w);
      tide_xfree(l->q8s);
      l->q8w = NULL;
      l->q8s = NULL;
      return TIDE_E_NOMEM;
    }
  } else if (policy != TIDE_LINEAR_Q8 && l->q8w) {
    tide_xfree(l->q8w);
    tide_xfree(l->q8s);
    l->q8w = NULL;
    l->q8s = NULL;
  }
  l->policy = policy;
  return TIDE_OK;
}

int tide_linear_get_policy(const tide_linear *l) { return l ? l->policy : -1; }

/* ---- work: row ranges of handles, spread over the threads ---- */

typedef struct {
  const struct tide_linear *l;
  int64_t r0, nr;      /* weight rows */
  const float *x;      /* m rows of K at stride ldx */
  int64_t ldx;
  float *y;            /* output of row r0; m rows at stride ldy */
  int64_t ldy;
  int64_t m;
  tide_q8_rows q8;     /* Q8 policy: x quantised (q NULL otherwise) */
} lin_work;

enum { KERN_REF = 0, KERN_AVX2 = 1 };

static void run_kernel(int kern, const lin_work *w, int64_t a, int64_t b, int flags) {
  const float *x = w->x;
  float *y = w->y + a;
  if (w->q8.q) {
    int iw = w->l->q8w != NULL;
#if defined(__x86_64__)
    if (kern == KERN_AVX2) {
      if (iw) tide_linear_q8w_avx2_rows(w->l, w->r0 + a, b - a, &w->q8, y, w->ldy, w->m, flags);
      else tide_linear_q8_avx2_rows(w->l, w->r0 + a, b - a, &w->q8, y, w->ldy, w->m, flags);
      return;
    }
#endif
    if (iw) tide_linear_q8w_ref_rows(w->l, w->r0 + a, b - a, &w->q8, y, w->ldy, w->m, flags);
    else tide_linear_q8_ref_rows(w->l, w->r0 + a, b - a, &w->q8, y, w->ldy, w->m, flags);
    return;
  }
#if defined(__x86_64__)
  if (kern == KERN_AVX2) {
    tide_linear_avx2_rows(w->l, w->r0 + a, b - a, x, w->ldx, y, w->ldy, w->m, flags);
    return;
  }
#endif
  tide_linear_ref_rows(w->l, w->r0 + a, b - a, x, w->ldx, y, w->ldy, w->m, flags);
}

/* Rows per chunk: a multiple of the kernel's panel height, so a thread's
 * range is whole panels. */
enum { CHUNK = 2 * TIDE_LIN_NC };

/* Cost of a chunk of `rows` rows: decode/stream work per weight byte plus
 * FMA work per (row of x, weight); only used to balance threads. */
static int64_t chunk_cost(const lin_work *w, int64_t rows) {
  int64_t bpr = w->l->wbytes / (w->l->n ? w->l->n : 1);
  return rows * (4 * bpr + w->l->k * w->m) + 1;
}

/* Q8 policy: quantise the x of every work whose handle takes it (works on
 * the same x share one copy: the MoE's w1 and w3). One heap block per call;
 * ws[j].q8 points into it. Returns the block (NULL when no work needed it,
 * or with *rc = TIDE_E_NOMEM). */
static void *q8_prepare(lin_work *ws, int nw, int kern, int *rc) {
  size_t bytes = 0;
  for (int j = 0; j < nw; j++)
    if (ws[j].m > 0 && ws[j].nr > 0 && tide_linear_q8_applies(ws[j].l))
      bytes += tide_q8_bytes(ws[j].m, ws[j].l->k) + 32;
  *rc = TIDE_OK;
  if (!bytes) return NULL;
  uint8_t *blk = tide_xmalloc(bytes);
  if (!blk) {
    *rc = TIDE_E_NOMEM;
    return NULL;
  }
  size_t off = 0;
  for (int j = 0; j < nw; j++) {
    lin_work *w = &ws[j];
    if (!(w->m > 0 && w->nr > 0 && tide_linear_q8_applies(w->l))) continue;
    int64_t K = w->l->k;
    int shared = 0;
    for (int i = 0; i < j && !shared; i++)
      if (ws[i].q8.q && ws[i].x == w->x && ws[i].ldx == w->ldx && ws[i].m == w->m && ws[i].l->k == K) {
        w->q8 = ws[i].q8;
        shared = 1;
      }
    if (shared) continue;
    tide_q8_rows r = tide_q8_layout(blk + off, w->m, K);
    off += tide_q8_bytes(w->m, K);
#if defined(__x86_64__)
    if (kern == KERN_AVX2)
      tide_q8_quantize_avx2(w->x, w->ldx, w->m, K, &r);
    else
#endif
      tide_q8_quantize_ref(w->x, w->ldx, w->m, K, &r);
    w->q8 = r;
  }
  return blk;
}

/* use_q8: the call honours the Q8 policy (AUTO paths, not the explicit
 * backends nor the grouped form) */
static int run_works(lin_work *ws, int nw, int flags, int kern, int use_q8) {
  int q8rc = TIDE_OK;
  void *q8blk = use_q8 ? q8_prepare(ws, nw, kern, &q8rc) : NULL;
  if (q8rc != TIDE_OK) return q8rc;
  int64_t total = 0;
  for (int j = 0; j < nw; j++) {
    if (ws[j].m <= 0 || ws[j].nr <= 0) continue;
    for (int64_t a = 0; a < ws[j].nr; a += CHUNK) total += chunk_cost(&ws[j], ws[j].nr - a < CHUNK ? ws[j].nr - a : CHUNK);
  }
  if (total == 0) {
    tide_xfree(q8blk);
    return TIDE_OK;
  }
  int parallel = total > (1 << 17) && tide_omp_threads() > 1;
#ifdef _OPENMP
#pragma omp parallel if (parallel)
#endif
  {
    int64_t T = 1, t = 0;
#ifdef _OPENMP
    T = omp_get_num_threads();
    t = omp_get_thread_num();
#endif
    /* chunk c belongs to thread floor(mid_c * T / total), mid_c = the
     * middle of its cost interval: contiguous, deterministic ranges */
    int64_t pos = 0;
    for (int j = 0; j < nw; j++) {
      const lin_work *w = &ws[j];
      if (w->m <= 0 || w->nr <= 0) continue;
      int64_t run_a = -1, run_b = -1;
      for (int64_t a = 0; a < w->nr; a += CHUNK) {
        int64_t b = w->nr - a < CHUNK ? w->nr : a + CHUNK, c = chunk_cost(w, b - a);
        int64_t mid = pos + c / 2;
        pos += c;
        if ((int64_t)((__int128)mid * T / total) != t) continue;
        if (run_b == a) {
          run_b = b;
        } else {
          if (run_a >= 0) run_kernel(kern, w, run_a, run_b, flags);
          run_a = a;
          run_b = b;
        }
      }
      if (run_a >= 0) run_kernel(kern, w, run_a, run_b, flags);
    }
  }
  (void)parallel;
  tide_xfree(q8blk);
  return TIDE_OK;
}

static int kern_auto(void) {
#if defined(__x86_64__)
  if (tide_use_avx2()) return KERN_AVX2;
#endif
  return KERN_REF;
}

/* oneDNN on f32 weights directly, or on dequantised panels of the others
 * (one panel buffer per call: this opt-in path is not allocation-free). */
static int run_dnnl(const struct tide_linear *l, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t m,
                    int flags) {
  int64_t N = l->n, K = l->k;
  float *tmp = NULL;
  float *yo = y;
  int64_t ldo = ldy;
  if (flags & TIDE_LINEAR_ACCUMULATE) {
    tmp = tide_xmalloc((size_t)(m * N) * 4);
    if (!tmp) return TIDE_E_NOMEM;
    yo = tmp;
    ldo = N;
  }
  int rc = TIDE_OK;
  if (l->fmt == TIDE_W_F32) {
    rc = tide_dnnl_sgemm_nt(m, N, K, x, ldx, l->w.data, K, yo, ldo);
  } else {
    /* panels of ~16 MiB of f32: large enough for oneDNN to run well */
    int64_t pb = ((int64_t)4 << 20) / (K ? K : 1);
    if (pb < 256) pb = 256;
    if (pb > N) pb = N;
    float *panel = tide_xmalloc((size_t)(pb * K) * 4);
    if (!panel) rc = TIDE_E_NOMEM;
    const tide_dequant_kernels *kt = tide_dequant_kernels_get();
    for (int64_t n0 = 0; rc == TIDE_OK && n0 < N; n0 += pb) {
      int64_t nb = N - n0 < pb ? N - n0 : pb;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
      for (int64_t r = 0; r < nb; r += 8)
        tide_dequant_block(panel + r * K, K, &l->view, n0 + r, nb - r < 8 ? nb - r : 8, 0, K, 0, kt);
      rc = tide_dnnl_sgemm_nt(m, nb, K, x, ldx, panel, K, yo + n0, ldo);
    }
    tide_xfree(panel);
  }
  if (rc == TIDE_OK && (flags & (TIDE_LINEAR_ACCUMULATE | TIDE_LINEAR_ROUND_BF16)))
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < N; j++) {
        float v = yo[i * ldo + j];
        if (tmp) v = y[i * ldy + j] + v;
        if (flags & TIDE_LINEAR_ROUND_BF16) v = tide_round_bf16(v);
        y[i * ldy + j] = v;
      }
  tide_xfree(tmp);
  return rc;
}

/* FAST policy: oneDNN from this many rows of x on (measured: below it the
 * invariant kernels are as fast; see scripts/bench_linear.lua). */
enum { DNNL_MIN_M = 16 };

/* y = x . W^T on f32 rows with a backend choice. */
static int run(const tide_linear *l, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t m, int backend,
               int flags) {
  lin_work w = {l, 0, l->n, x, ldx, y, ldy, m, {NULL, NULL, NULL}};
  switch (backend) {
    case TIDE_BACKEND_REF: return run_works(&w, 1, flags, KERN_REF, 0);
    case TIDE_BACKEND_AVX2:
      if (kern_auto() != KERN_AVX2)
        return TIDE_ERR(TIDE_E_UNSUPPORTED, "no AVX2 kernels on this CPU/build (or TIDE_REF is set)");
      return run_works(&w, 1, flags, KERN_AVX2, 0);
    case TIDE_BACKEND_DNNL: return run_dnnl(l, x, ldx, y, ldy, m, flags);
    default: break;
  }
  if (l->policy == TIDE_LINEAR_FAST && m >= DNNL_MIN_M && kern_auto() == KERN_AVX2) {
    int rc = run_dnnl(l, x, ldx, y, ldy, m, flags);
    if (rc != TIDE_E_UNSUPPORTED) return rc;
    tide_clear_error();
  }
  return run_works(&w, 1, flags, kern_auto(), 1);
}

static int check_flags(const char *fn, int flags) {
  if (flags & ~(TIDE_LINEAR_ROUND_BF16 | TIDE_LINEAR_ACCUMULATE))
    return tide_errorf(TIDE_E_INVALID, fn, "bad flags 0x%x (TIDE_LINEAR_ROUND_BF16 = 1, TIDE_LINEAR_ACCUMULATE = 2)",
                       (unsigned)flags);
  return TIDE_OK;
}

static int forward(const char *fn, const tide_linear *l, tide_tensor *y, const tide_tensor *x, int backend, int flags) {
  if (!l) return tide_errorf(TIDE_E_INVALID, fn, "NULL linear");
  if (backend < TIDE_BACKEND_AUTO || backend > TIDE_BACKEND_DNNL)
    return tide_errorf(TIDE_E_INVALID, fn, "bad backend %d", backend);
  TIDE_CHECK(check_flags(fn, flags));
  const unsigned act = TIDE_DT(TIDE_F32) | TIDE_DT(TIDE_BF16);
  TIDE_CHECK(tide_check_tensor(fn, "x", x, act, -1));
  TIDE_CHECK(tide_check_tensor(fn, "y", y, act, -1));
  if (x->ndim < 1 || x->ndim > 2 || y->ndim != x->ndim) {
    char a[96], b[96];
    return tide_errorf(TIDE_E_INVALID, fn, "x %s and y %s must both be [M, K] / [M, N] (or 1-d)",
                       tide_shape_str(x, a, sizeof a), tide_shape_str(y, b, sizeof b));
  }
  int64_t M = x->ndim == 2 ? x->sizes[0] : 1, K = x->sizes[x->ndim - 1], N = y->sizes[y->ndim - 1];
  if (K != l->k || N != l->n || (y->ndim == 2 && y->sizes[0] != M)) {
    char a[96], b[96];
    return tide_errorf(TIDE_E_INVALID, fn, "x %s, y %s do not fit a weight of N=%lld x K=%lld",
                       tide_shape_str(x, a, sizeof a), tide_shape_str(y, b, sizeof b), (long long)l->n, (long long)l->k);
  }
  if (x->strides[x->ndim - 1] != 1 || y->strides[y->ndim - 1] != 1)
    return tide_errorf(TIDE_E_INVALID, fn, "x and y rows must be contiguous");
  if (y->readonly) return tide_errorf(TIDE_E_INVALID, fn, "y is read-only");
  if (M == 0) return TIDE_OK;
  int64_t ldx = x->ndim == 2 ? x->strides[0] : K, ldy = y->ndim == 2 ? y->strides[0] : N;
  float *xs = NULL, *ys = NULL;
  const float *xf = x->data;
  float *yf = y->data;
  if (x->dtype != TIDE_F32) {
    xs = tide_xmalloc((size_t)(M * K) * 4);
    if (!xs) return TIDE_E_NOMEM;
    for (int64_t i = 0; i < M; i++)
      tide_convert(xs + i * K, TIDE_F32, (const uint16_t *)x->data + i * ldx, TIDE_BF16, K);
    xf = xs;
    ldx = K;
  }
  int64_t ldyf = ldy;
  if (y->dtype != TIDE_F32) {
    ys = tide_xmalloc((size_t)(M * N) * 4);
    if (!ys) {
      tide_xfree(xs);
      return TIDE_E_NOMEM;
    }
    if (flags & TIDE_LINEAR_ACCUMULATE)
      for (int64_t i = 0; i < M; i++)
        tide_convert(ys + i * N, TIDE_F32, (const uint16_t *)y->data + i * ldy, TIDE_BF16, N);
    yf = ys;
    ldyf = N;
  }
  int rc = run(l, yf, ldyf, xf, ldx, M, backend, flags);
  if (rc == TIDE_OK && ys)
    for (int64_t i = 0; i < M; i++) tide_convert((uint16_t *)y->data + i * ldy, TIDE_BF16, ys + i * N, TIDE_F32, N);
  tide_xfree(xs);
  tide_xfree(ys);
  return rc;
}

int tide_linear_forward(const tide_linear *l, tide_tensor *y, const tide_tensor *x, int backend) {
  return forward(__func__, l, y, x, backend, 0);
}

int tide_linear_forward_ex(const tide_linear *l, tide_tensor *y, const tide_tensor *x, int flags) {
  return forward(__func__, l, y, x, TIDE_BACKEND_AUTO, flags);
}

int tide_linear_forward_grouped(const tide_linear *l, tide_tensor *y, const tide_tensor *x, int64_t groups, int flags) {
  if (!l) return TIDE_ERR(TIDE_E_INVALID, "NULL linear");
  TIDE_CHECK(check_flags(__func__, flags));
  if (groups <= 0 || l->n % groups)
    return TIDE_ERR(TIDE_E_INVALID, "groups = %lld must be > 0 and divide the weight's N = %lld", (long long)groups,
                    (long long)l->n);
  TIDE_CHECK(tide_check_tensor(__func__, "x", x, TIDE_DT(TIDE_F32), -1));
  TIDE_CHECK(tide_check_tensor(__func__, "y", y, TIDE_DT(TIDE_F32), -1));
  char a[96], b[96];
  int64_t n = l->n / groups, k = l->k;
  if (x->ndim < 1 || x->ndim > 2 || y->ndim != x->ndim)
    return TIDE_ERR(TIDE_E_INVALID, "x %s and y %s must both be [M, G*k] / [M, G*n] (or 1-d)",
                    tide_shape_str(x, a, sizeof a), tide_shape_str(y, b, sizeof b));
  int64_t M = x->ndim == 2 ? x->sizes[0] : 1;
  if (x->sizes[x->ndim - 1] != groups * k || y->sizes[y->ndim - 1] != l->n || (y->ndim == 2 && y->sizes[0] != M))
    return TIDE_ERR(TIDE_E_INVALID, "x %s, y %s do not fit %lld groups of a [%lld, %lld] weight (x [M, %lld], y [M, %lld])",
                    tide_shape_str(x, a, sizeof a), tide_shape_str(y, b, sizeof b), (long long)groups,
                    (long long)l->n, (long long)k, (long long)(groups * k), (long long)l->n);
  if (x->strides[x->ndim - 1] != 1 || y->strides[y->ndim - 1] != 1)
    return TIDE_ERR(TIDE_E_INVALID, "x and y rows must be contiguous");
  if (y->readonly) return TIDE_ERR(TIDE_E_INVALID, "y is read-only");
  if (M == 0) return TIDE_OK;
  int64_t ldx = x->ndim == 2 ? x->strides[0] : groups * k, ldy = y->ndim == 2 ? y->strides[0] : l->n;
  enum { STACK_GROUPS = 64 };
  lin_work stack_ws[STACK_GROUPS];
  lin_work *ws = stack_ws;
  if (groups > STACK_GROUPS) {
    ws = tide_xmalloc(sizeof *ws * (size_t)groups);
    if (!ws) return TIDE_E_NOMEM;
  }
  for (int64_t g = 0; g < groups; g++)
    ws[g] = (lin_work){l, g * n, n, (const float *)x->data + g * k, ldx, (float *)y->data + g * n, ldy, M, {NULL, NULL, NULL}};
  int rc = run_works(ws, (int)groups, flags, kern_auto(), 1);
  if (ws != stack_ws) tide_xfree(ws);
  return rc;
}

int tide_linear_forward_many(const tide_linear_job *jobs, int n_jobs, int flags) {
  TIDE_CHECK(check_flags(__func__, flags));
  if (n_jobs < 0 || (n_jobs > 0 && !jobs)) return TIDE_ERR(TIDE_E_INVALID, "bad job list (%d jobs)", n_jobs);
  for (int j = 0; j < n_jobs; j++) {
    const tide_linear_job *q = &jobs[j];
    if (q->m < 0) return TIDE_ERR(TIDE_E_INVALID, "job %d: m = %lld < 0", j, (long long)q->m);
    if (q->m == 0) continue;
    if (!q->l) return TIDE_ERR(TIDE_E_INVALID, "job %d: NULL linear", j);
    if (!q->x || !q->y) return TIDE_ERR(TIDE_E_INVALID, "job %d: NULL x or y", j);
    if (q->ldx < q->l->k || q->ldy < q->l->n)
      return TIDE_ERR(TIDE_E_INVALID, "job %d: ldx = %lld, ldy = %lld below the weight's K = %lld, N = %lld", j,
                      (long long)q->ldx, (long long)q->ldy, (long long)q->l->k, (long long)q->l->n);
  }
  enum { STACK_JOBS = 64 };
  lin_work stack_ws[STACK_JOBS];
  lin_work *ws = stack_ws;
  if (n_jobs > STACK_JOBS) {
    ws = tide_xmalloc(sizeof *ws * (size_t)n_jobs);
    if (!ws) return TIDE_E_NOMEM;
  }
  for (int j = 0; j < n_jobs; j++) {
    const tide_linear_job *q = &jobs[j];
    ws[j] = (lin_work){q->l, 0, q->m ? q->l->n : 0, q->x, q->ldx, q->y, q->ldy, q->m, {NULL, NULL, NULL}};
  }
  int rc = run_works(ws, n_jobs, flags, kern_auto(), 1);
  if (ws != stack_ws) tide_xfree(ws);
  return rc;
}

int tide_matmul(tide_tensor *y, const tide_tensor *x, const tide_tensor *w, int backend) {
  TIDE_CHECK(tide_check_tensor(__func__, "w", w, TIDE_DT(TIDE_F32) | TIDE_DT(TIDE_BF16) | TIDE_DT(TIDE_F16), 2));
  tide_tensor wc;
  memset(&wc, 0, sizeof wc);
  const tide_tensor *wp = w;
  if (!tide_tensor_is_contiguous(w)) {
    TIDE_CHECK(tide_tensor_clone(&wc, w, -1));
    wp = &wc;
  }
  tide_linear *l;
  int rc = tide_linear_new(&l, wp, NULL);
  if (rc == TIDE_OK) {
    rc = tide_linear_forward(l, y, x, backend);
    tide_linear_free(l);
  }
  tide_tensor_release(&wc);
  return rc;
}
