/* test_linear.c - the linear kernels: every weight format and path against
 * the double-accumulation reference (NMSE) and against the scalar model of
 * the dot form (bitwise) on awkward shapes; batch invariance (a row alone =
 * the same row inside M = 2..33, 65, 200, 256), thread invariance, grouped vs
 * per-group handles, forward_many vs separate calls, output flags, NaN
 * weights, no allocation per call, the oneDNN opt-in, misuse errors; the
 * fused kernels and the panels at every M = 1..33 with ragged row groups, both FP8
 * decoders (MXCSR.DAZ picks the f16 one), the bounds of moving the FP8
 * block factor onto x, and the AVX-512 variants against AVX2 (skipped,
 * with a note, on CPUs without them). */
#include <stdint.h>
#include <xmmintrin.h>

#include "linear.h"
#include "tide.h"
#include "tt.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}

static const char *fmt_name[] = {"f32", "bf16", "f16", "fp8", "mxfp4"};

/* A random weight of format fmt with N outputs and K inputs. */
typedef struct {
  tide_tensor w, s;
  tide_linear *l;
} weight;

static void weight_make(weight *q, int fmt, int64_t N, int64_t K, uint64_t seed) {
  memset(q, 0, sizeof *q);
  int64_t shp[2] = {N, K};
  if (fmt <= TIDE_W_F16) {
    tide_tensor f = {0};
    TT_OK(tide_tensor_new(&f, TIDE_F32, 2, shp));
    TT_OK(tide_tensor_rand(&f, seed, TIDE_RAND_NORMAL, 0.0, 0.05));
    TT_OK(tide_tensor_clone(&q->w, &f, fmt == TIDE_W_F32 ? TIDE_F32 : fmt == TIDE_W_BF16 ? TIDE_BF16 : TIDE_F16));
    tide_tensor_release(&f);
  } else if (fmt == TIDE_W_FP8) {
    int64_t ss[2] = {(N + 127) / 128, (K + 127) / 128};
    TT_OK(tide_tensor_new(&q->w, TIDE_F8E4M3, 2, shp));
    TT_OK(tide_tensor_new(&q->s, TIDE_E8M0, 2, ss));
    uint8_t *p = q->w.data;
    for (int64_t i = 0; i < N * K; i++) {
      p[i] = (uint8_t)rnd();
      if ((p[i] & 0x7f) == 0x7f) p[i] ^= 0x10;
    }
    uint8_t *s = q->s.data;
    for (int64_t i = 0; i < ss[0] * ss[1]; i++) s[i] = (uint8_t)(112 + rnd() % 8);
  } else {
    int64_t ws[2] = {N, K / 2}, ss[2] = {N, K / 32};
    TT_OK(tide_tensor_new(&q->w, TIDE_I8, 2, ws));
    TT_OK(tide_tensor_new(&q->s, TIDE_E8M0, 2, ss));
    uint8_t *p = q->w.data;
    for (int64_t i = 0; i < N * K / 2; i++) p[i] = (uint8_t)rnd();
    uint8_t *s = q->s.data;
    for (int64_t i = 0; i < N * K / 32; i++) s[i] = (uint8_t)(118 + rnd() % 8);
  }
  TT_OK(tide_linear_new(&q->l, &q->w, q->s.data ? &q->s : NULL));
}

static void weight_free(weight *q) {
  tide_linear_free(q->l);
  tide_tensor_release(&q->w);
  tide_tensor_release(&q->s);
}

/* f32 [M, K] with bf16-valued entries, as tide's activations are */
static void x_make(tide_tensor *x, int64_t M, int64_t K, uint64_t seed) {
  int64_t shp[2] = {M, K};
  memset(x, 0, sizeof *x);
  TT_OK(tide_tensor_new(x, TIDE_F32, 2, shp));
  TT_OK(tide_tensor_rand(x, seed, TIDE_RAND_NORMAL, 0.0, 1.0));
  float *p = x->data;
  for (int64_t i = 0; i < M * K; i++) p[i] = tide_bf16_to_f32(tide_f32_to_bf16(p[i]));
}

static void y_make(tide_tensor *y, int64_t M, int64_t N) {
  int64_t shp[2] = {M, N};
  memset(y, 0, sizeof *y);
  TT_OK(tide_tensor_new(y, TIDE_F32, 2, shp));
}

static double nmse(const tide_tensor *a, const tide_tensor *b) {
  tide_compare c;
  if (tide_tensor_compare(a, b, 0, 0, &c) != TIDE_OK) return 1e30;
  return c.nmse;
}

/* Every format, awkward shapes, every M: AUTO = the dot model bitwise, and
 * close to the double reference. */
static void formats_and_shapes(void) {
  static const int64_t plain[][2] = {{37, 45}, {130, 263}, {5, 7}, {64, 1031}};
  static const int64_t fp8[][2] = {{130, 200}, {257, 129}, {64, 1100}};
  static const int64_t fp4[][2] = {{70, 96}, {33, 1088}, {130, 64}};
  static const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 65, 256};
  for (int fmt = 0; fmt < 5; fmt++) {
    const int64_t(*shapes)[2] = fmt <= TIDE_W_F16 ? plain : fmt == TIDE_W_FP8 ? fp8 : fp4;
    int nshapes = fmt <= TIDE_W_F16 ? 4 : 3;
    for (int si = 0; si < nshapes; si++) {
      int64_t N = shapes[si][0], K = shapes[si][1];
      weight q;
      weight_make(&q, fmt, N, K, 100 + fmt * 10 + si);
      for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        int64_t M = Ms[mi];
        /* keep the scalar model cheap: big M on small weights, big K on few M */
        if ((K > 512 && M != 1 && M != 4 && M != 9) || (M > 9 && N * K > 30000 && M != 65) ||
            (M == 65 && N * K > 60000))
          continue;
        tide_tensor x, y, yr, yd;
        x_make(&x, M, K, 7 + M);
        y_make(&y, M, N);
        y_make(&yr, M, N);
        y_make(&yd, M, N);
        TT_OK(tide_linear_forward_ex(q.l, &y, &x, 0));
        TT_OK(tide_linear_forward(q.l, &yr, &x, TIDE_BACKEND_REF));
        double e = nmse(&y, &yr);
        TT_CHECK(e < 1e-10, "%s N=%lld K=%lld M=%lld: NMSE %.3g vs reference", fmt_name[fmt], (long long)N,
                 (long long)K, (long long)M, e);
        if (tide_kernels_avx2()) {
          tide_linear_dot_rows(q.l, 0, N, x.data, K, yd.data, N, M, 0);
          TT_CHECK(memcmp(y.data, yd.data, (size_t)(M * N) * 4) == 0,
                   "%s N=%lld K=%lld M=%lld: AVX2 differs from the dot-form model", fmt_name[fmt], (long long)N,
                   (long long)K, (long long)M);
        }
        tide_tensor_release(&x);
        tide_tensor_release(&y);
        tide_tensor_release(&yr);
        tide_tensor_release(&yd);
      }
      weight_free(&q);
    }
  }
}

/* rows [r0, r0+m) of x computed alone = the same rows inside the full batch */
static void check_sub_batch(const weight *q, const tide_tensor *x, const tide_tensor *yfull, int64_t r0, int64_t m) {
  tide_tensor xs = {0}, y;
  TT_OK(tide_tensor_narrow(&xs, x, 0, r0, m));
  y_make(&y, m, q->l->n);
  TT_OK(tide_linear_forward_ex(q->l, &y, &xs, 0));
  TT_CHECK(memcmp(y.data, (float *)yfull->data + r0 * q->l->n, (size_t)(m * q->l->n) * 4) == 0,
           "%s: rows %lld..%lld alone differ from the batch of %lld", fmt_name[q->l->fmt], (long long)r0,
           (long long)(r0 + m - 1), (long long)x->sizes[0]);
  tide_tensor_release(&xs);
  tide_tensor_release(&y);
}

static void batch_invariance(void) {
  static const int fmts[] = {TIDE_W_FP8, TIDE_W_MXFP4, TIDE_W_BF16, TIDE_W_F32};
  for (int fi = 0; fi < 4; fi++) {
    weight q;
    weight_make(&q, fmts[fi], 300, 704, 55 + fi);
    tide_tensor x, y;
    x_make(&x, 256, 704, 99);
    y_make(&y, 256, 300);
    TT_OK(tide_linear_forward_ex(q.l, &y, &x, 0));
    for (int64_t r = 0; r < 256; r += 37) check_sub_batch(&q, &x, &y, r, 1);
    check_sub_batch(&q, &x, &y, 255, 1);
    check_sub_batch(&q, &x, &y, 9, 2);
    check_sub_batch(&q, &x, &y, 5, 3);
    check_sub_batch(&q, &x, &y, 40, 4);
    check_sub_batch(&q, &x, &y, 60, 5);
    check_sub_batch(&q, &x, &y, 100, 8);
    check_sub_batch(&q, &x, &y, 111, 9);
    check_sub_batch(&q, &x, &y, 17, 12);
    check_sub_batch(&q, &x, &y, 200, 16);
    check_sub_batch(&q, &x, &y, 31, 24);
    check_sub_batch(&q, &x, &y, 64, 33);
    check_sub_batch(&q, &x, &y, 130, 65);
    check_sub_batch(&q, &x, &y, 3, 200);
    tide_tensor_release(&x);
    tide_tensor_release(&y);
    weight_free(&q);
  }
}

static void thread_invariance(void) {
  int old = tide_threads_get();
  static const int fmts[] = {TIDE_W_FP8, TIDE_W_MXFP4, TIDE_W_F16};
  for (int fi = 0; fi < 3; fi++) {
    weight q;
    weight_make(&q, fmts[fi], 777, 1024, 3 + fi);
    static const int64_t Ms[] = {1, 3, 12, 16, 65};
    for (int mi = 0; mi < 5; mi++) {
      int64_t M = Ms[mi];
      tide_tensor x, y1, y2;
      x_make(&x, M, 1024, 5);
      y_make(&y1, M, 777);
      y_make(&y2, M, 777);
      tide_threads_set(1);
      TT_OK(tide_linear_forward_ex(q.l, &y1, &x, 0));
      tide_threads_set(2);
      TT_OK(tide_linear_forward_ex(q.l, &y2, &x, 0));
      TT_CHECK(memcmp(y1.data, y2.data, (size_t)(M * 777) * 4) == 0, "%s M=%lld: 1 vs 2 threads differ",
               fmt_name[fmts[fi]], (long long)M);
      tide_tensor_release(&x);
      tide_tensor_release(&y1);
      tide_tensor_release(&y2);
    }
    weight_free(&q);
  }
  tide_threads_set(old);
}

/* a handle on rows [r0, r0+n) of q's weight (fp8: whole 128-row blocks of
 * scales only, so r0 % 128 + n <= 128 keeps one scale row) */
static tide_linear *slice_handle(const weight *q, int64_t r0, int64_t n, tide_tensor *wv, tide_tensor *sv) {
  memset(wv, 0, sizeof *wv);
  memset(sv, 0, sizeof *sv);
  TT_OK(tide_tensor_narrow(wv, &q->w, 0, r0, n));
  if (q->l->fmt == TIDE_W_FP8) TT_OK(tide_tensor_narrow(sv, &q->s, 0, r0 / 128, 1));
  if (q->l->fmt == TIDE_W_MXFP4) TT_OK(tide_tensor_narrow(sv, &q->s, 0, r0, n));
  tide_linear *l = NULL;
  TT_OK(tide_linear_new(&l, wv, sv->data ? sv : NULL));
  return l;
}

static void grouped(void) {
  /* wo_a of the tiny config: G = 2 groups of o_lora = 64 rows, FP8 */
  struct { int fmt; int64_t G, n, k, M; } cases[] = {
      {TIDE_W_FP8, 2, 64, 256, 5}, {TIDE_W_FP8, 3, 48, 136, 9}, {TIDE_W_MXFP4, 4, 20, 64, 3},
      {TIDE_W_BF16, 4, 33, 70, 70}, {TIDE_W_FP8, 2, 64, 256, 1}, {TIDE_W_FP8, 3, 48, 256, 1},
      {TIDE_W_FP8, 3, 44, 136, 2}, {TIDE_W_MXFP4, 3, 26, 64, 1}, {TIDE_W_MXFP4, 3, 26, 96, 7}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int64_t G = cases[c].G, n = cases[c].n, k = cases[c].k, M = cases[c].M;
    weight q;
    weight_make(&q, cases[c].fmt, G * n, k, 77 + c);
    tide_tensor x, y, yd, yr;
    x_make(&x, M, G * k, 11);
    y_make(&y, M, G * n);
    y_make(&yd, M, G * n);
    y_make(&yr, M, G * n);
    TT_OK(tide_linear_forward_grouped(q.l, &y, &x, G, 0));
    /* the dot model and the reference, group by group */
    for (int64_t g = 0; g < G; g++) {
      tide_linear_dot_rows(q.l, g * n, n, (const float *)x.data + g * k, G * k, (float *)yd.data + g * n, G * n, M, 0);
      tide_linear_ref_rows(q.l, g * n, n, (const float *)x.data + g * k, G * k, (float *)yr.data + g * n, G * n, M, 0);
    }
    if (tide_kernels_avx2())
      TT_CHECK(memcmp(y.data, yd.data, (size_t)(M * G * n) * 4) == 0, "case %zu: grouped differs from the dot model", c);
    TT_CHECK(nmse(&y, &yr) < 1e-10, "case %zu: grouped NMSE %.3g", c, nmse(&y, &yr));
    /* per-group handles, where a group fits one scale block row */
    int slices = cases[c].fmt != TIDE_W_FP8 || (128 % n == 0);
    for (int64_t g = 0; slices && g < G; g++) {
      tide_tensor wv, sv, xg = {0}, yg;
      tide_linear *lg = slice_handle(&q, g * n, n, &wv, &sv);
      TT_OK(tide_tensor_narrow(&xg, &x, 1, g * k, k));
      y_make(&yg, M, n);
      TT_OK(tide_linear_forward_ex(lg, &yg, &xg, 0));
      int same = 1;
      for (int64_t i = 0; i < M; i++)
        same &= memcmp((float *)yg.data + i * n, (float *)y.data + i * G * n + g * n, (size_t)n * 4) == 0;
      TT_CHECK(same, "case %zu group %lld: grouped differs from its own handle", c, (long long)g);
      tide_linear_free(lg);
      tide_tensor_release(&wv);
      tide_tensor_release(&sv);
      tide_tensor_release(&xg);
      tide_tensor_release(&yg);
    }
    tide_tensor_release(&x);
    tide_tensor_release(&y);
    tide_tensor_release(&yd);
    tide_tensor_release(&yr);
    weight_free(&q);
  }
}

static void many_jobs(void) {
  weight a, b, c;
  weight_make(&a, TIDE_W_FP8, 200, 320, 1);
  weight_make(&b, TIDE_W_MXFP4, 96, 320, 2);
  weight_make(&c, TIDE_W_BF16, 50, 64, 3);
  tide_tensor x1, x2, x3;
  x_make(&x1, 3, 320, 21);
  x_make(&x2, 17, 320, 22);
  x_make(&x3, 2, 64, 23);
  float *ys[6];
  static const int64_t rows[6] = {3, 3, 17, 0, 2, 1};
  tide_linear_job jobs[6] = {
      {a.l, x1.data, 320, NULL, 200, 3},   /* fused pair: a and b on the same x */
      {b.l, x1.data, 320, NULL, 96, 3},
      {a.l, x2.data, 320, NULL, 200, 17},  /* the same handle twice */
      {NULL, NULL, 0, NULL, 0, 0},         /* an empty job is skipped */
      {c.l, x3.data, 64, NULL, 50, 2},
      {b.l, (const float *)x2.data + 5 * 320, 320, NULL, 96, 1},
  };
  for (int j = 0; j < 6; j++) {
    ys[j] = tide_xcalloc((size_t)(rows[j] ? rows[j] : 1) * 200, 4);
    jobs[j].y = ys[j];
  }
  int old = tide_threads_get();
  for (int t = 1; t <= 2; t++) {
    tide_threads_set(t);
    for (int j = 0; j < 6; j++) memset(ys[j], 0, (size_t)(rows[j] ? rows[j] : 1) * 200 * 4);
    TT_OK(tide_linear_forward_many(jobs, 6, 0));
    for (int j = 0; j < 6; j++) {
      if (!jobs[j].m) continue;
      int64_t N = jobs[j].l->n, K = jobs[j].l->k, M = jobs[j].m;
      tide_tensor xv = {0}, yv;
      int64_t xs[2] = {M, K}, xst[2] = {jobs[j].ldx, 1};
      TT_OK(tide_tensor_wrap(&xv, (void *)jobs[j].x, TIDE_F32, 2, xs, xst, NULL));
      y_make(&yv, M, N);
      TT_OK(tide_linear_forward_ex(jobs[j].l, &yv, &xv, 0));
      TT_CHECK(memcmp(yv.data, ys[j], (size_t)(M * N) * 4) == 0, "threads %d: job %d differs from running it alone", t, j);
      tide_tensor_release(&xv);
      tide_tensor_release(&yv);
    }
  }
  tide_threads_set(old);
  /* misuse, named by job index; nothing runs */
  tide_linear_job bad[2] = {jobs[0], jobs[1]};
  bad[1].ldx = 100;
  ys[0][0] = 12345.0f;
  TT_FAILS(tide_linear_forward_many(bad, 2, 0), TIDE_E_INVALID, "job 1: ldx = 100");
  TT_CHECK(ys[0][0] == 12345.0f, "a failing call ran job 0");
  bad[1] = jobs[1];
  bad[1].l = NULL;
  TT_FAILS(tide_linear_forward_many(bad, 2, 0), TIDE_E_INVALID, "job 1: NULL linear");
  TT_FAILS(tide_linear_forward_many(jobs, 6, 8), TIDE_E_INVALID, "bad flags 0x8");
  TT_OK(tide_linear_forward_many(NULL, 0, 0));
  for (int j = 0; j < 6; j++) tide_xfree(ys[j]);
  tide_tensor_release(&x1);
  tide_tensor_release(&x2);
  tide_tensor_release(&x3);
  weight_free(&a);
  weight_free(&b);
  weight_free(&c);
}

/* same bits, or NaN on both sides */
static int same_or_nan(const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], 4) != 0 && !(isnan(a[i]) && isnan(b[i]))) return 0;
  return 1;
}

/* Extreme block scales (0, 1, 245..254) and extreme activations (huge,
 * subnormal, inf): every path still computes exactly the dot form, so a row
 * alone (the M = 1 decoder, which may move the scale onto x) = the row in a
 * batch (the panel path) = the scalar model. */
static float one_product(uint8_t code, uint8_t scale, float xv) {
  weight q;
  weight_make(&q, TIDE_W_FP8, 1, 128, 1);
  memset(q.w.data, 0, 128);
  ((uint8_t *)q.w.data)[0] = code;
  ((uint8_t *)q.s.data)[0] = scale;
  tide_tensor x, y;
  x_make(&x, 1, 128, 1);
  memset(x.data, 0, 128 * 4);
  ((float *)x.data)[0] = xv;
  y_make(&y, 1, 1);
  TT_OK(tide_linear_forward_ex(q.l, &y, &x, 0));
  float v = ((float *)y.data)[0];
  tide_tensor_release(&x);
  tide_tensor_release(&y);
  weight_free(&q);
  return v;
}

static void extreme_values(void) {
  /* the two ways moving the scale onto x could round differently, one
   * product each: x * 2^(110-119) = 1.6 subnormal units rounds to 2 (times
   * 1.5 = 3) where x * w = 2.4 units rounds to 2; and x * 2^(240-119)
   * overflows where x * w = 2^116 does not */
  float v = one_product(0x7c, 110, 819 * 0x1p-149f); /* fp8 0x7C = 384 */
  TT_CHECK(v == 2 * 0x1p-149f, "subnormal x: %a, expected 2 * 2^-149", v);
  v = one_product(0x08, 240, 0x1p9f); /* fp8 0x08 = 2^-6 */
  TT_CHECK(v == 0x1p116f, "large x: %a, expected 2^116", v);
  /* the f32-pattern decoder's factor 2^(s - 7): x * 2^110 overflows for
   * x = 2^18 (x * w = 4 does not), and 2^(140 - 7) is not a float */
  v = one_product(0x08, 117, 0x1p18f);
  TT_CHECK(v == 4.0f, "x = 2^18, scale 2^-10: %a, expected 4", v);
  v = one_product(0x7e, 140, 1.0f); /* 448 * 2^13 */
  TT_CHECK(v == 448.0f * 0x1p13f, "scale 2^13: %a, expected 448 * 2^13", v);

  static const uint8_t scales[] = {0,   1,   2,   5,   60,  100, 110, 115, 118, 119, 120, 200,
                                   235, 238, 240, 245, 246, 247, 250, 252, 253, 254, 255};
  const int64_t N = 260, K = 640, M = 6;
  for (int fmt = TIDE_W_FP8; fmt <= TIDE_W_MXFP4; fmt++) {
    weight q;
    weight_make(&q, fmt, N, K, 404);
    uint8_t *sp = q.s.data, *wp = q.w.data;
    for (int64_t i = 0; i < tide_tensor_nbytes(&q.s); i++) sp[i] = scales[rnd() % sizeof scales];
    if (fmt == TIDE_W_FP8) /* small codes under big scales, so x * W stays finite while x * scale may not */
      for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
          if (sp[(n / 128) * q.s.sizes[1] + k / 128] >= 200) wp[n * K + k] &= 0x9f;
    tide_tensor x, y, y1, yd;
    x_make(&x, M, K, 12);
    float *xp = x.data;
    for (int64_t k = 0; k < K; k++) {
      xp[1 * K + k] *= 0x1p9f;   /* x * 2^(sc-119) overflows for sc near 240, x * W does not */
      xp[2 * K + k] *= 0x1p-130f; /* subnormal */
      xp[3 * K + k] = k % 3 ? xp[3 * K + k] * 0x1p-60f : xp[3 * K + k] * 0x1p60f; /* wide range */
      xp[4 * K + k] *= 0x1p-120f; /* x * 2^(sc-119) becomes subnormal for sc near 110 */
    }
    xp[5 * K + 17] = INFINITY;
    xp[5 * K + 3] = 0x1p-149f; /* the smallest subnormal */
    y_make(&y, M, N);
    y_make(&y1, 1, N);
    y_make(&yd, M, N);
    TT_OK(tide_linear_forward_ex(q.l, &y, &x, 0));
    tide_linear_dot_rows(q.l, 0, N, xp, K, yd.data, N, M, 0);
    if (tide_kernels_avx2()) TT_CHECK(same_or_nan(y.data, yd.data, M * N), "%s: batch differs from the model", fmt_name[fmt]);
    /* one row and two rows of x alone (MXFP4: the row-pair kernel, then the vpermps one) */
    for (int pairs = 1; pairs >= (fmt == TIDE_W_MXFP4 && tide_kernels_avx2() ? 0 : 1); pairs--) {
      if (tide_kernels_avx2()) tide_linear_avx2_mxp(pairs);
      for (int64_t i = 0; i < M; i++) {
        tide_tensor xi = {0};
        TT_OK(tide_tensor_narrow(&xi, &x, 0, i, 1));
        TT_OK(tide_linear_forward_ex(q.l, &y1, &xi, 0));
        TT_CHECK(same_or_nan(y1.data, (float *)y.data + i * N, N), "%s row %lld (pairs %d): alone differs from the batch",
                 fmt_name[fmt], (long long)i, pairs);
        tide_tensor_release(&xi);
      }
      for (int64_t i = 0; i + 2 <= M; i += 2) {
        tide_tensor xi = {0}, y2 = {0};
        TT_OK(tide_tensor_narrow(&xi, &x, 0, i, 2));
        y_make(&y2, 2, N);
        TT_OK(tide_linear_forward_ex(q.l, &y2, &xi, 0));
        TT_CHECK(same_or_nan(y2.data, (float *)y.data + i * N, 2 * N), "%s rows %lld, %lld (pairs %d): differ from the batch",
                 fmt_name[fmt], (long long)i, (long long)i + 1, pairs);
        tide_tensor_release(&xi);
        tide_tensor_release(&y2);
      }
    }
    if (tide_kernels_avx2()) tide_linear_avx2_mxp(1);
    tide_tensor_release(&x);
    tide_tensor_release(&y);
    tide_tensor_release(&y1);
    tide_tensor_release(&yd);
    weight_free(&q);
  }
}

static void output_flags(void) {
  weight q;
  weight_make(&q, TIDE_W_FP8, 140, 256, 8);
  tide_tensor x, y0, y1, y2;
  x_make(&x, 9, 256, 4);
  y_make(&y0, 9, 140);
  y_make(&y1, 9, 140);
  y_make(&y2, 9, 140);
  TT_OK(tide_linear_forward_ex(q.l, &y0, &x, 0));
  TT_OK(tide_linear_forward_ex(q.l, &y1, &x, TIDE_LINEAR_ROUND_BF16));
  float *a = y0.data, *b = y1.data, *c = y2.data;
  int bad = 0;
  for (int i = 0; i < 9 * 140; i++) bad += tide_bf16_to_f32(tide_f32_to_bf16(a[i])) != b[i];
  TT_CHECK(bad == 0, "ROUND_BF16: %d outputs not the rounded plain result", bad);
  for (int i = 0; i < 9 * 140; i++) c[i] = (float)(i % 7) - 3.0f;
  TT_OK(tide_linear_forward_ex(q.l, &y2, &x, TIDE_LINEAR_ACCUMULATE | TIDE_LINEAR_ROUND_BF16));
  bad = 0;
  for (int i = 0; i < 9 * 140; i++) bad += tide_bf16_to_f32(tide_f32_to_bf16(((float)(i % 7) - 3.0f) + a[i])) != c[i];
  TT_CHECK(bad == 0, "ACCUMULATE: %d outputs differ from y_old + x.W^T", bad);
  /* bf16 output tensor = the rounded f32 result */
  tide_tensor yb = {0};
  int64_t shp[2] = {9, 140};
  TT_OK(tide_tensor_new(&yb, TIDE_BF16, 2, shp));
  TT_OK(tide_linear_forward_ex(q.l, &yb, &x, 0));
  bad = 0;
  for (int i = 0; i < 9 * 140; i++) bad += tide_bf16_to_f32(((uint16_t *)yb.data)[i]) != b[i];
  TT_CHECK(bad == 0, "bf16 y: %d outputs differ", bad);
  tide_tensor_release(&yb);
  tide_tensor_release(&x);
  tide_tensor_release(&y0);
  tide_tensor_release(&y1);
  tide_tensor_release(&y2);
  weight_free(&q);
}

/* An fp8 NaN code makes its output row NaN, a NaN block scale its block's
 * rows; every other row keeps its bits. */
static void nan_weights(void) {
  weight q, p;
  rng = 0x9e3779b97f4a7c15ULL;
  weight_make(&q, TIDE_W_FP8, 200, 300, 31);
  rng = 0x9e3779b97f4a7c15ULL;
  weight_make(&p, TIDE_W_FP8, 200, 300, 31);
  TT_CHECK(memcmp(q.w.data, p.w.data, 200 * 300) == 0, "weights not reproducible");
  ((uint8_t *)p.w.data)[3 * 300 + 5] = 0xff;   /* row 3 */
  ((uint8_t *)p.w.data)[60 * 300 + 299] = 0x7f; /* row 60, in the ragged last block */
  ((uint8_t *)p.s.data)[1 * 3 + 2] = 0xff;    /* rows 128.., cols 256.. */
  static const int64_t nan_ms[] = {1, 2, 5, 8, 65};
  for (int mi = 0; mi < 5; mi++) {
    int64_t M = nan_ms[mi];
    tide_tensor x, yq, yp;
    x_make(&x, M, 300, 2);
    y_make(&yq, M, 200);
    y_make(&yp, M, 200);
    TT_OK(tide_linear_forward_ex(q.l, &yq, &x, 0));
    TT_OK(tide_linear_forward_ex(p.l, &yp, &x, 0));
    int bad = 0;
    for (int64_t i = 0; i < M; i++)
      for (int64_t n = 0; n < 200; n++) {
        float a = ((float *)yq.data)[i * 200 + n], b = ((float *)yp.data)[i * 200 + n];
        int want_nan = n == 3 || n == 60 || n >= 128;
        bad += want_nan ? !isnan(b) : memcmp(&a, &b, 4) != 0;
      }
    TT_CHECK(bad == 0, "M=%lld: %d outputs wrong around NaN weights", (long long)M, bad);
    tide_tensor_release(&x);
    tide_tensor_release(&yq);
    tide_tensor_release(&yp);
  }
  weight_free(&q);
  weight_free(&p);
}

/* the weights are not copied, and a forward allocates nothing */
static void zero_copy_no_alloc(void) {
  weight q;
  weight_make(&q, TIDE_W_MXFP4, 512, 1024, 4);
  tide_alloc_stats a, b;
  tide_alloc_stats_get(&a);
  tide_linear *l2;
  TT_OK(tide_linear_new(&l2, &q.w, &q.s));
  tide_alloc_stats_get(&b);
  TT_CHECK(b.live_bytes - a.live_bytes < 1024, "tide_linear_new allocated %lld bytes", (long long)(b.live_bytes - a.live_bytes));
  tide_tensor x, y, xg, yg;
  x_make(&x, 70, 1024, 1);
  y_make(&y, 70, 512);
  x_make(&xg, 70, 4 * 256, 1);
  y_make(&yg, 70, 512);
  weight g;
  weight_make(&g, TIDE_W_FP8, 512, 256, 5);
  tide_linear_job jobs[2] = {{l2, x.data, 1024, y.data, 512, 70}, {q.l, x.data, 1024, y.data, 512, 1}};
  tide_alloc_stats_get(&a);
  for (int64_t M = 1; M <= 70; M += 69) {
    x.sizes[0] = y.sizes[0] = M;
    TT_OK(tide_linear_forward_ex(l2, &y, &x, TIDE_LINEAR_ROUND_BF16));
    TT_OK(tide_linear_forward(l2, &y, &x, TIDE_BACKEND_AUTO));
  }
  TT_OK(tide_linear_forward_grouped(g.l, &yg, &xg, 4, 0));
  TT_OK(tide_linear_forward_many(jobs, 1, 0));
  tide_alloc_stats_get(&b);
  TT_CHECK(b.total_allocs == a.total_allocs, "forwards allocated %lld times", (long long)(b.total_allocs - a.total_allocs));
  x.sizes[0] = y.sizes[0] = 70;
  tide_linear_free(l2);
  weight_free(&g);
  weight_free(&q);
  tide_tensor_release(&x);
  tide_tensor_release(&y);
  tide_tensor_release(&xg);
  tide_tensor_release(&yg);
}

/* TIDE_BACKEND_DNNL and the FAST policy: close to the reference; AUTO under
 * the reference switch is the reference */
static void backends_and_policy(void) {
  weight q;
  weight_make(&q, TIDE_W_FP8, 300, 384, 6);
  tide_tensor x, y, yr;
  x_make(&x, 40, 384, 3);
  y_make(&y, 40, 300);
  y_make(&yr, 40, 300);
  TT_OK(tide_linear_forward(q.l, &yr, &x, TIDE_BACKEND_REF));
  int rc = tide_linear_forward(q.l, &y, &x, TIDE_BACKEND_DNNL);
  if (rc != TIDE_E_UNSUPPORTED) {
    TT_OK(rc);
    TT_CHECK(nmse(&y, &yr) < 1e-10, "oneDNN on fp8 panels: NMSE %.3g", nmse(&y, &yr));
    TT_CHECK(tide_linear_get_policy(q.l) == TIDE_LINEAR_INVARIANT, "default policy is not invariant");
    TT_OK(tide_linear_set_policy(q.l, TIDE_LINEAR_FAST));
    memset(y.data, 0, 40 * 300 * 4);
    TT_OK(tide_linear_forward_ex(q.l, &y, &x, TIDE_LINEAR_ROUND_BF16));
    tide_tensor y2;
    y_make(&y2, 40, 300);
    TT_OK(tide_linear_forward_ex(q.l, &y2, &x, 0));
    TT_CHECK(nmse(&y2, &yr) < 1e-10, "FAST policy: NMSE %.3g", nmse(&y2, &yr));
    int bad = 0;
    for (int i = 0; i < 40 * 300; i++) bad += tide_round_bf16(((float *)y2.data)[i]) != ((float *)y.data)[i];
    TT_CHECK(bad == 0, "FAST policy ROUND_BF16: %d", bad);
    tide_tensor_release(&y2);
    TT_OK(tide_linear_set_policy(q.l, TIDE_LINEAR_INVARIANT));
  }
  TT_FAILS(tide_linear_set_policy(q.l, 7), TIDE_E_INVALID, "bad policy 7");
  int old = tide_kernels_force_ref(1);
  TT_OK(tide_linear_forward_ex(q.l, &y, &x, 0));
  TT_CHECK(memcmp(y.data, yr.data, 40 * 300 * 4) == 0, "AUTO under TIDE_REF is not the reference");
  TT_FAILS(tide_linear_forward(q.l, &y, &x, TIDE_BACKEND_AVX2), TIDE_E_UNSUPPORTED, "no AVX2 kernels");
  tide_kernels_force_ref(old);
  tide_tensor_release(&x);
  tide_tensor_release(&y);
  tide_tensor_release(&yr);
  weight_free(&q);
}

static void misuse(void) {
  weight q;
  weight_make(&q, TIDE_W_FP8, 130, 200, 9);
  tide_tensor x, y, xb;
  x_make(&x, 3, 200, 1);
  y_make(&y, 3, 131);
  x_make(&xb, 3, 199, 1);
  TT_FAILS(tide_linear_forward_ex(q.l, &y, &x, 0), TIDE_E_INVALID, "do not fit a weight of N=130 x K=200");
  tide_tensor_release(&y);
  y_make(&y, 3, 130);
  TT_FAILS(tide_linear_forward_ex(q.l, &y, &xb, 0), TIDE_E_INVALID, "x [3, 199]");
  TT_FAILS(tide_linear_forward_ex(q.l, &y, &x, 4), TIDE_E_INVALID, "bad flags 0x4");
  TT_FAILS(tide_linear_forward_ex(NULL, &y, &x, 0), TIDE_E_INVALID, "NULL linear");
  TT_FAILS(tide_linear_forward(q.l, &y, &x, 9), TIDE_E_INVALID, "bad backend 9");
  TT_FAILS(tide_linear_forward_grouped(q.l, &y, &x, 3, 0), TIDE_E_INVALID, "groups = 3 must be > 0 and divide");
  TT_FAILS(tide_linear_forward_grouped(q.l, &y, &x, 2, 0), TIDE_E_INVALID, "do not fit 2 groups");
  TT_FAILS(tide_linear_forward_grouped(q.l, &y, &x, 1, 16), TIDE_E_INVALID, "bad flags 0x10");
  /* a bad weight/scale pairing names the expected scale shape */
  tide_linear *l;
  TT_FAILS(tide_linear_new(&l, &q.w, NULL), TIDE_E_INVALID, "needs a scale tensor");
  tide_tensor s2 = {0};
  TT_OK(tide_tensor_narrow(&s2, &q.s, 0, 0, 1));
  TT_FAILS(tide_linear_new(&l, &q.w, &s2), TIDE_E_INVALID, "[2, 2] e8m0 for a weight of 130 x 200");
  tide_tensor_release(&s2);
  tide_tensor_release(&x);
  tide_tensor_release(&xb);
  tide_tensor_release(&y);
  weight_free(&q);
}

/* AUTO vs the dot model on x (M rows), bitwise (NaN = NaN) */
static void check_model(const weight *q, const tide_tensor *x, const char *what) {
  int64_t M = x->sizes[0], N = q->l->n, K = q->l->k;
  tide_tensor y, yd;
  y_make(&y, M, N);
  y_make(&yd, M, N);
  TT_OK(tide_linear_forward_ex(q->l, &y, x, 0));
  tide_linear_dot_rows(q->l, 0, N, x->data, K, yd.data, N, M, 0);
  TT_CHECK(same_or_nan(y.data, yd.data, M * N), "%s %s N=%lld K=%lld M=%lld: differs from the dot-form model", what,
           fmt_name[q->l->fmt], (long long)N, (long long)K, (long long)M);
  tide_tensor_release(&y);
  tide_tensor_release(&yd);
}

/* FP8 NaN codes through the block flags: the first forward records which
 * 128 x 128 blocks hold one (ragged blocks included), later forwards skip the
 * per-group test on the clean blocks; both give the dot model's bits. */
static void fp8_nan_flags(void) {
  weight q;
  const int64_t N = 300, K = 520;
  weight_make(&q, TIDE_W_FP8, N, K, 41);
  uint8_t *w = q.w.data;
  w[5 * K + 200] = 0x7f;   /* block (0, 1) */
  w[290 * K + 400] = 0xff; /* block (2, 3), the ragged row block */
  w[130 * K + 515] = 0x7f; /* block (1, 4), the ragged column block */
  const int64_t nb = (K + 127) / 128;
  for (int64_t i = 0; i < 3 * nb; i++) TT_CHECK(q.l->nan8[i] == 0, "block %lld flagged before any forward", (long long)i);
  for (int pass = 0; pass < 2; pass++)
    for (int64_t M = 1; M <= 9; M++) {
      tide_tensor x;
      x_make(&x, M, K, 50 + M);
      check_model(&q, &x, pass ? "flags set" : "first forward");
      tide_tensor_release(&x);
    }
  for (int64_t b = 0; b < 3; b++)
    for (int64_t kb = 0; kb < nb; kb++) {
      int want = (b == 0 && kb == 1) || (b == 2 && kb == 3) || (b == 1 && kb == 4) ? 2 : 1;
      TT_CHECK(q.l->nan8[b * nb + kb] == want, "block (%lld, %lld) flagged %d, expected %d", (long long)b,
               (long long)kb, q.l->nan8[b * nb + kb], want);
    }
  weight_free(&q);
}

/* AUTO vs the model already in yd (M rows of x), bitwise (NaN = NaN) */
static void check_against(const weight *q, const tide_tensor *x, const tide_tensor *yd, const char *what, int cfg) {
  int64_t M = x->sizes[0], N = q->l->n, K = q->l->k;
  tide_tensor y;
  y_make(&y, M, N);
  TT_OK(tide_linear_forward_ex(q->l, &y, x, 0));
  TT_CHECK(same_or_nan(y.data, yd->data, M * N), "%s (path %d) %s N=%lld K=%lld M=%lld: differs from the dot-form model",
           what, cfg, fmt_name[q->l->fmt], (long long)N, (long long)K, (long long)M);
  tide_tensor_release(&y);
}

/* The fused kernels and the panels at every M = 1..33, each against the dot
 * model: the default choice of path, every M through the panels, and every
 * M through the fused kernels in passes of at most 3..8 rows of x (row
 * groups of 1..8 rows with ragged ends, FP8 groups that would straddle a
 * 128-row scale block, K tails, more than 16 MXFP4 scale blocks per row);
 * FP8 at M = 1 with x small (the block factor on x) and large (refused: the
 * weights take it). */
static void fused_every_m(void) {
  if (!tide_kernels_avx2()) return;
  static const struct { int fmt; int64_t n, k; } cases[] = {
      {TIDE_W_FP8, 141, 392}, {TIDE_W_FP8, 37, 1029},  {TIDE_W_FP8, 24, 100},  {TIDE_W_MXFP4, 139, 576},
      {TIDE_W_MXFP4, 21, 64}, {TIDE_W_MXFP4, 17, 32},  {TIDE_W_BF16, 45, 200}, {TIDE_W_BF16, 29, 203},
      {TIDE_W_F32, 19, 72},   {TIDE_W_F32, 13, 37},    {TIDE_W_F16, 23, 136},  {TIDE_W_F16, 11, 1001}};
  /* {largest fused M, most rows per pass}; -1 keeps the default */
  static const int cfgs[][2] = {{-1, -1}, {0, -1}, {64, 3}, {64, 4}, {64, 5}, {64, 6}, {64, 7}, {64, 8}};
  const int ncfg = sizeof cfgs / sizeof cfgs[0];
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    weight q;
    const int64_t N = cases[c].n, K = cases[c].k;
    int def_m = -1, def_p = -1;
    tide_linear_avx2_fused_tune(cases[c].fmt, &def_m, &def_p);
    weight_make(&q, cases[c].fmt, N, K, 900 + c);
    for (int64_t M = 1; M <= 33; M++) {
      tide_tensor x, yd;
      x_make(&x, M, K, 40 + M);
      y_make(&yd, M, N);
      for (int big = 0; big < (M == 1 ? 2 : 1); big++) {
        if (big) {
          float *xp = x.data;
          for (int64_t k = 0; k < K; k++) xp[k] *= 0x1p20f;
        }
        tide_linear_dot_rows(q.l, 0, N, x.data, K, yd.data, N, M, 0);
        for (int ci = 0; ci < ncfg; ci++) {
          int tm = cfgs[ci][0] < 0 ? def_m : cfgs[ci][0], tp = cfgs[ci][1] < 0 ? def_p : cfgs[ci][1];
          tide_linear_avx2_fused_tune(cases[c].fmt, &tm, &tp);
          check_against(&q, &x, &yd, big ? "large x" : "fused/panels", ci);
        }
        if (cases[c].fmt == TIDE_W_MXFP4 && M <= 2) { /* the vpermps kernels where the row pairs run */
          int tm = def_m, tp = def_p;
          tide_linear_avx2_fused_tune(cases[c].fmt, &tm, &tp);
          tide_linear_avx2_mxp(0);
          check_against(&q, &x, &yd, big ? "large x, no row pairs" : "no row pairs", 0);
          tide_linear_avx2_mxp(1);
        }
        int tm = def_m, tp = def_p;
        tide_linear_avx2_fused_tune(cases[c].fmt, &tm, &tp);
      }
      tide_tensor_release(&x);
      tide_tensor_release(&yd);
    }
    weight_free(&q);
  }
}

/* With MXCSR.DAZ set the FP8 decoder must not feed f32 subnormals (the
 * pattern fp8 * 2^-120 of a subnormal fp8 code is one) to the FMAs: the
 * kernel switches to the f16 decoder and the bits stay those of the model
 * (computed without DAZ; nothing here is subnormal except those
 * patterns). Also scales on both sides of 134, where the f32 pattern's
 * factor 2^(s - 7) stops being a normal float. DAZ is set on the calling
 * thread only, so the other thread's rows also check the plain case. */
static void fp8_daz_routes(void) {
  if (!tide_kernels_avx2()) return;
  weight q;
  weight_make(&q, TIDE_W_FP8, 141, 392, 77);
  /* rows 0..127: scales 2^-15..2^-8 (the f32 pattern everywhere, so the
   * products of subnormal codes are within a few bits of the others and
   * show in the sums); rows 128..140: 133..136, both decoders */
  uint8_t *sp = q.s.data;
  for (int64_t i = 0; i < tide_tensor_nbytes(&q.s); i++)
    sp[i] = (uint8_t)(i < q.s.sizes[1] ? 112 + rnd() % 8 : 133 + rnd() % 4);
  static const int64_t Ms[] = {1, 2, 5, 8};
  for (int mi = 0; mi < 4; mi++) {
    int64_t M = Ms[mi];
    tide_tensor x, y, yz, yd;
    x_make(&x, M, 392, 3);
    y_make(&y, M, 141);
    y_make(&yz, M, 141);
    y_make(&yd, M, 141);
    TT_OK(tide_linear_forward_ex(q.l, &y, &x, 0));
    tide_linear_dot_rows(q.l, 0, 141, x.data, 392, yd.data, 141, M, 0);
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x0040); /* DAZ */
    int rc = tide_linear_forward_ex(q.l, &yz, &x, 0);
    _mm_setcsr(old);
    TT_OK(rc);
    TT_CHECK(memcmp(y.data, yd.data, (size_t)(M * 141) * 4) == 0, "M=%lld: differs from the model", (long long)M);
    TT_CHECK(memcmp(yz.data, yd.data, (size_t)(M * 141) * 4) == 0, "M=%lld: differs from the model under DAZ",
             (long long)M);
    tide_tensor_release(&x);
    tide_tensor_release(&y);
    tide_tensor_release(&yz);
    tide_tensor_release(&yd);
  }
  weight_free(&q);
}

/* The AVX-512 kernels give the AVX2 kernel's bits (and the model's) for
 * every M <= 8, extreme and NaN scales, NaN codes, ragged rows and K, x
 * that takes the FP8 block factor or not, and under DAZ (MXFP4; FP8 leaves
 * to AVX2 there). Skipped, saying so, where the CPU lacks them. */
static void avx512_same_bits(void) {
  if (!tide_linear_avx512_ready()) {
    fprintf(stderr, "avx512_same_bits: SKIPPED: no AVX-512 F/BW/VL/DQ + VBMI + GFNI on this CPU (or TIDE_NO_AVX512 is set)\n");
    return;
  }
  static const struct { int fmt; int64_t n, k; } cases[] = {
      {TIDE_W_FP8, 136, 200},  {TIDE_W_FP8, 260, 1100},   {TIDE_W_FP8, 48, 384},   {TIDE_W_FP8, 24, 100},
      {TIDE_W_MXFP4, 72, 96}, {TIDE_W_MXFP4, 264, 1088}, {TIDE_W_MXFP4, 42, 544}, {TIDE_W_MXFP4, 16, 32}};
  static const uint8_t fp8_sc[] = {0, 1, 100, 110, 119, 127, 133, 134, 135, 140, 246, 247, 255};
  static const uint8_t fp4_sc[] = {0, 1, 2, 100, 118, 121, 125, 127, 200, 253, 254, 255};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int64_t N = cases[c].n, K = cases[c].k;
    weight q;
    weight_make(&q, cases[c].fmt, N, K, 500 + c);
    uint8_t *sp = q.s.data, *wp = q.w.data;
    const int64_t ns = tide_tensor_nbytes(&q.s);
    for (int64_t i = 0; i < ns; i++) {
      if (rnd() % 4) continue; /* a quarter of the blocks get extreme scales */
      sp[i] = cases[c].fmt == TIDE_W_FP8 ? fp8_sc[rnd() % sizeof fp8_sc] : fp4_sc[rnd() % sizeof fp4_sc];
    }
    if (cases[c].fmt == TIDE_W_FP8 && N > 100) wp[97 * K + 3] = 0x7f; /* a NaN code: row 97 only */
    for (int64_t M = 1; M <= 8; M++) {
      for (int big = 0; big <= (M == 1); big++) {
        tide_tensor x, ya, yb, yd;
        x_make(&x, M, K, 60 + M);
        if (big)
          for (int64_t k = 0; k < K; k++) ((float *)x.data)[k] *= 0x1p20f;
        y_make(&ya, M, N);
        y_make(&yb, M, N);
        y_make(&yd, M, N);
        TT_OK(tide_linear_forward_ex(q.l, &ya, &x, 0));
        int old = tide_linear_avx512_force_off(1);
        TT_OK(tide_linear_forward_ex(q.l, &yb, &x, 0));
        tide_linear_avx512_force_off(old);
        tide_linear_dot_rows(q.l, 0, N, x.data, K, yd.data, N, M, 0);
        TT_CHECK(same_or_nan(ya.data, yb.data, M * N), "%s N=%lld K=%lld M=%lld%s: AVX-512 differs from AVX2",
                 fmt_name[q.l->fmt], (long long)N, (long long)K, (long long)M, big ? " (large x)" : "");
        TT_CHECK(same_or_nan(ya.data, yd.data, M * N), "%s N=%lld K=%lld M=%lld%s: AVX-512 differs from the model",
                 fmt_name[q.l->fmt], (long long)N, (long long)K, (long long)M, big ? " (large x)" : "");
        if (cases[c].fmt == TIDE_W_MXFP4 && (M == 1 || M == 5)) {
          unsigned csr = _mm_getcsr();
          _mm_setcsr(csr | 0x0040); /* DAZ */
          TT_OK(tide_linear_forward_ex(q.l, &ya, &x, 0));
          old = tide_linear_avx512_force_off(1);
          TT_OK(tide_linear_forward_ex(q.l, &yb, &x, 0));
          tide_linear_avx512_force_off(old);
          _mm_setcsr(csr);
          TT_CHECK(same_or_nan(ya.data, yb.data, M * N), "mxfp4 N=%lld M=%lld: AVX-512 differs from AVX2 under DAZ",
                   (long long)N, (long long)M);
        }
        tide_tensor_release(&x);
        tide_tensor_release(&ya);
        tide_tensor_release(&yb);
        tide_tensor_release(&yd);
      }
    }
    weight_free(&q);
  }
}

TT_RUN(TT(formats_and_shapes), TT(batch_invariance), TT(thread_invariance), TT(grouped), TT(many_jobs),
       TT(extreme_values), TT(output_flags), TT(nan_weights), TT(fp8_nan_flags), TT(zero_copy_no_alloc), TT(backends_and_policy), TT(misuse),
       TT(fused_every_m), TT(fp8_daz_routes), TT(avx512_same_bits))
