/* test_ops.c - the model-level kernels of tide/ops.h: each against a plain
 * double-precision computation written here from the doc (and refmodel.c's
 * rounding points), the AVX2 table against the scalar references on awkward
 * shapes, hand-checked mHC/Sinkhorn cases, clamps, routing ties and order,
 * hash-routing range errors, and bitwise batch and thread invariance. */
#include "ops_kernels.h"
#include "ops_testutil.h"

static const int64_t NS[] = {1, 3, 7, 8, 63, 65, 129, 300};
enum { NNS = sizeof NS / sizeof NS[0] };

static int have_avx2(void) {
  int old = tide_kernels_force_ref(0);
  int a = tide_kernels_avx2();
  tide_kernels_force_ref(old);
  return a;
}

/* ---------------- RMSNorm ---------------- */

/* the doc's formula with refmodel's rounding: double mean of squares, f32
 * (x * r) * w */
static void rms_local(float *y, const float *x, int64_t n, const float *w, float eps, int round) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float r = (float)(1.0 / sqrt(ss / (double)n + eps));
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] * r;
    if (w) v = v * w[i];
    y[i] = round ? bf16v(v) : v;
  }
}

static void test_rmsnorm(void) {
  int avx = have_avx2();
  for (int in = 0; in < NNS; in++) {
    int64_t n = NS[in];
    int64_t rowsv[] = {1, 3, 7, 65};
    for (int ir = 0; ir < 4; ir++) {
      int64_t R = rowsv[ir], ld = n + 5; /* padded rows */
      float *x = xalloc((size_t)(R * ld) * 4), *y = xalloc((size_t)(R * ld) * 4), *ya = xalloc((size_t)(R * ld) * 4);
      float *want = xalloc((size_t)(R * n) * 4), *wf = xalloc((size_t)n * 4);
      uint16_t *wb = xalloc((size_t)n * 2);
      fill_bf16(x, R * ld, 11 + n + R, 1.5);
      fill_bf16(wf, n, 5 + n, 0.7);
      for (int64_t i = 0; i < n; i++) wb[i] = tide_f32_to_bf16(wf[i]);
      for (int wk = 0; wk < 3; wk++)
        for (int round = 0; round < 2; round++) {
          tide_tensor xt = trows(x, R, n, ld), yt = trows(y, R, n, ld), yat = trows(ya, R, n, ld);
          tide_tensor wt = wk == 1 ? tview(wf, TIDE_F32, 1, n, 0, 0) : tview(wb, TIDE_BF16, 1, n, 0, 0);
          const tide_tensor *wp = wk == 0 ? NULL : &wt;
          for (int64_t r = 0; r < R; r++) rms_local(want + r * n, x + r * ld, n, wk ? wf : NULL, 1e-6f, round);
          tide_kernels_force_ref(1);
          TT_OK(tide_rmsnorm(&yt, &xt, wp, 1e-6f, round ? TIDE_OPS_ROUND_BF16 : 0));
          tide_kernels_force_ref(0);
          TT_OK(tide_rmsnorm(&yat, &xt, wp, 1e-6f, round ? TIDE_OPS_ROUND_BF16 : 0));
          int same = 1;
          double e = 0;
          int64_t ulp = 0;
          for (int64_t r = 0; r < R; r++) {
            same &= !memcmp(y + r * ld, want + r * n, (size_t)n * 4);
            e += nmse(ya + r * ld, want + r * n, n);
            if (round) {
              int64_t u = max_bf16_ulp(ya + r * ld, want + r * n, n);
              if (u > ulp) ulp = u;
            }
          }
          TT_CHECK(same, "reference rmsnorm differs from the formula (n %lld rows %lld w %d round %d)", (long long)n,
                   (long long)R, wk, round);
          TT_CHECK(e / R <= (round ? 1e-4 : 1e-12) && ulp <= 1, "avx2 rmsnorm: nmse %g, %lld bf16 ulp (n %lld rows %lld w %d)", e / R,
                   (long long)ulp, (long long)n, (long long)R, wk);
          /* in place */
          memcpy(ya, x, (size_t)(R * ld) * 4);
          TT_OK(tide_rmsnorm(&yat, &yat, wp, 1e-6f, round ? TIDE_OPS_ROUND_BF16 : 0));
          tide_kernels_force_ref(0);
          TT_OK(tide_rmsnorm(&yt, &xt, wp, 1e-6f, round ? TIDE_OPS_ROUND_BF16 : 0));
          same = 1;
          for (int64_t r = 0; r < R; r++) same &= !memcmp(y + r * ld, ya + r * ld, (size_t)n * 4);
          TT_CHECK(same, "in-place rmsnorm differs (n %lld)", (long long)n);
        }
      free(x), free(y), free(ya), free(want), free(wf), free(wb);
    }
  }
  (void)avx;
  /* misuse */
  float a[12], b[12];
  tide_tensor xt = tview(a, TIDE_F32, 2, 3, 4, 0), yt = tview(b, TIDE_F32, 2, 4, 3, 0), w5 = tview(a, TIDE_F32, 1, 5, 0, 0);
  TT_FAILS(tide_rmsnorm(&yt, &xt, NULL, 1e-6f, 0), TIDE_E_INVALID, "same shape");
  yt = tview(b, TIDE_F32, 2, 3, 4, 0);
  TT_FAILS(tide_rmsnorm(&yt, &xt, &w5, 1e-6f, 0), TIDE_E_INVALID, "w has shape [5]");
  TT_FAILS(tide_rmsnorm(&yt, &xt, NULL, -1.0f, 0), TIDE_E_INVALID, "eps");
  tide_tensor xi = tview(a, TIDE_I32, 2, 3, 4, 0);
  TT_FAILS(tide_rmsnorm(&yt, &xi, NULL, 1e-6f, 0), TIDE_E_INVALID, "dtype i32");
}

static void test_round(void) {
  float x[200], y[200];
  fill_f32(x, 200, 3, 10);
  x[5] = NAN;
  x[6] = INFINITY;
  x[7] = 3.0e38f;
  memcpy(y, x, sizeof x);
  tide_tensor t = tview(y, TIDE_F32, 2, 10, 20, 0);
  TT_OK(tide_ops_round_bf16(&t));
  int ok = 1;
  for (int i = 0; i < 200; i++) {
    float w = tide_bf16_to_f32(tide_f32_to_bf16(x[i]));
    ok &= isnan(w) ? isnan(y[i]) : w == y[i];
  }
  TT_CHECK(ok, "contiguous rounding differs from tide_f32_to_bf16");
  /* a strided view: only the selected columns change */
  memcpy(y, x, sizeof x);
  tide_tensor v;
  memset(&v, 0, sizeof v);
  TT_OK(tide_tensor_transpose(&v, &t, 0, 1));
  tide_tensor c = tview(y, TIDE_F32, 2, 10, 20, 0);
  TT_OK(tide_tensor_narrow(&v, &c, 1, 3, 4));
  TT_OK(tide_ops_round_bf16(&v));
  ok = 1;
  for (int r = 0; r < 10; r++)
    for (int j = 0; j < 20; j++) {
      float in = x[r * 20 + j], w = (j >= 3 && j < 7) ? tide_bf16_to_f32(tide_f32_to_bf16(in)) : in;
      ok &= isnan(w) ? isnan(y[r * 20 + j]) : w == y[r * 20 + j];
    }
  TT_CHECK(ok, "strided rounding touched the wrong elements");
  tide_tensor_release(&v);
}

/* ---------------- embedding ---------------- */

static void test_embed(void) {
  int64_t V = 37, d = 65, T = 7;
  float *tf = xalloc((size_t)(V * d) * 4);
  uint16_t *tb = xalloc((size_t)(V * d) * 2);
  fill_bf16(tf, V * d, 9, 1);
  for (int64_t i = 0; i < V * d; i++) tb[i] = tide_f32_to_bf16(tf[i]);
  int32_t id32[7] = {0, 36, 5, 5, 17, 1, 30};
  int64_t id64[7] = {0, 36, 5, 5, 17, 1, 30};
  float *out = xalloc((size_t)(T * 4 * d) * 4);
  for (int ref = 0; ref < 2; ref++) {
    tide_kernels_force_ref(ref);
    for (int variant = 0; variant < 4; variant++) {
      int hc = variant >= 2 ? 3 : 1;
      tide_tensor tab = variant & 1 ? tview(tf, TIDE_F32, 2, V, d, 0) : tview(tb, TIDE_BF16, 2, V, d, 0);
      tide_tensor ids = variant & 1 ? tview(id64, TIDE_I64, 1, T, 0, 0) : tview(id32, TIDE_I32, 1, T, 0, 0);
      tide_tensor o = hc == 1 ? tview(out, TIDE_F32, 2, T, d, 0) : tview(out, TIDE_F32, 3, T, hc, d);
      memset(out, 0, (size_t)(T * 4 * d) * 4);
      TT_OK(tide_embed(&o, &tab, &ids));
      int ok = 1;
      for (int64_t t = 0; t < T; t++)
        for (int s = 0; s < hc; s++) ok &= !memcmp(out + (t * hc + s) * d, tf + id32[t] * d, (size_t)d * 4);
      TT_CHECK(ok, "embedding rows differ (variant %d, ref %d)", variant, ref);
    }
  }
  tide_kernels_force_ref(0);
  /* a bad id: error names it, nothing written */
  int32_t bad[3] = {4, 37, 2};
  tide_tensor ids = tview(bad, TIDE_I32, 1, 3, 0, 0), tab = tview(tb, TIDE_BF16, 2, V, d, 0);
  tide_tensor o = tview(out, TIDE_F32, 2, 3, d, 0);
  for (int64_t i = 0; i < 3 * d; i++) out[i] = 42.0f;
  TT_FAILS(tide_embed(&o, &tab, &ids), TIDE_E_RANGE, "token id 37 at position 1 is outside the vocabulary of 37");
  int untouched = 1;
  for (int64_t i = 0; i < 3 * d; i++) untouched &= out[i] == 42.0f;
  TT_CHECK(untouched, "a failed embed wrote its output");
  int64_t neg[1] = {-3};
  ids = tview(neg, TIDE_I64, 1, 1, 0, 0);
  o = tview(out, TIDE_F32, 2, 1, d, 0);
  TT_FAILS(tide_embed(&o, &tab, &ids), TIDE_E_RANGE, "token id -3");
  o = tview(out, TIDE_F32, 2, 1, d + 1, 0);
  ids = tview(bad, TIDE_I32, 1, 1, 0, 0);
  TT_FAILS(tide_embed(&o, &tab, &ids), TIDE_E_INVALID, "does not fit");
  free(tf), free(tb), free(out);
}

/* ---------------- mHC ---------------- */

static float sigm_l(float v) { return 1.0f / (1.0f + expf(-v)); }

/* refmodel.c's hc_pre, written out again: double products, double Sinkhorn */
static void hc_pre_local(const float *X, int hc, int64_t d, const float *fn, const float *scale, const float *base,
                         int iters, float rms_eps, float hc_eps, float *x, float *post, float *comb, int round) {
  int64_t n = hc * d, mix = (2 + hc) * hc;
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)X[i] * X[i];
  double rho = 1.0 / sqrt(ss / (double)n + rms_eps);
  float m[80], pre[8];
  for (int64_t r = 0; r < mix; r++) {
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (double)X[i] * fn[r * n + i];
    m[r] = (float)(acc * rho);
  }
  for (int i = 0; i < hc; i++) {
    pre[i] = sigm_l(scale[0] * m[i] + base[i]) + hc_eps;
    post[i] = 2.0f * sigm_l(scale[1] * m[hc + i] + base[hc + i]);
  }
  double C[8][8];
  for (int i = 0; i < hc; i++) {
    double mx = -INFINITY, z = 0;
    for (int j = 0; j < hc; j++) {
      C[i][j] = (double)(scale[2] * m[2 * hc + i * hc + j] + base[2 * hc + i * hc + j]);
      mx = fmax(mx, C[i][j]);
    }
    for (int j = 0; j < hc; j++) z += exp(C[i][j] - mx);
    for (int j = 0; j < hc; j++) C[i][j] = exp(C[i][j] - mx) / z + hc_eps;
  }
  for (int it = 0; it < iters; it++) {
    if (it > 0)
      for (int i = 0; i < hc; i++) {
        double rs = 0;
        for (int j = 0; j < hc; j++) rs += C[i][j];
        for (int j = 0; j < hc; j++) C[i][j] /= rs + hc_eps;
      }
    for (int j = 0; j < hc; j++) {
      double cs = 0;
      for (int i = 0; i < hc; i++) cs += C[i][j];
      for (int i = 0; i < hc; i++) C[i][j] /= cs + hc_eps;
    }
  }
  for (int i = 0; i < hc; i++)
    for (int j = 0; j < hc; j++) comb[i * hc + j] = (float)C[i][j];
  for (int64_t k = 0; k < d; k++) {
    double acc = 0;
    for (int i = 0; i < hc; i++) acc += (double)pre[i] * X[i * d + k];
    x[k] = round ? bf16v((float)acc) : (float)acc;
  }
}

/* hc = 2, fn = 0 (so m = 0): pre, post and comb come from base alone and
 * can be worked out by hand. comb base [[0, ln 3], [0, 0]]: the row softmax
 * is [[1/4, 3/4], [1/2, 1/2]]; one column normalisation gives [[1/3, 3/5],
 * [2/3, 2/5]]; a second round (rows, then columns) [[4/11, 12/19], [7/11,
 * 7/19]]. */
static void test_hc_hand(void) {
  float X[4] = {1, 2, 3, -4}; /* X_0 = [1, 2], X_1 = [3, -4] */
  float fn[8 * 4] = {0}, scale[3] = {1, 1, 1}, base[8] = {0, logf(3.0f), 0, logf(3.0f), 0, logf(3.0f), 0, 0};
  float x[2], post[2], comb[4];
  tide_tensor Xt = tview(X, TIDE_F32, 3, 1, 2, 2), fnt = tview(fn, TIDE_F32, 2, 8, 4, 0);
  tide_tensor st = tview(scale, TIDE_F32, 1, 3, 0, 0), bt = tview(base, TIDE_F32, 1, 8, 0, 0);
  tide_tensor xt = tview(x, TIDE_F32, 2, 1, 2, 0), pt = tview(post, TIDE_F32, 2, 1, 2, 0), ct = tview(comb, TIDE_F32, 3, 1, 2, 2);
  for (int ref = 0; ref < 2; ref++) {
    tide_kernels_force_ref(ref);
    tide_hc_cfg cfg = {1, 0, 1e-6f, 0.0f};
    TT_OK(tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, &cfg));
    /* pre = [sigma(0), sigma(ln 3)] = [1/2, 3/4]: x = X_0/2 + 3 X_1/4 */
    TT_CHECK(fabsf(x[0] - 2.75f) < 1e-6f && fabsf(x[1] - (-2.0f)) < 1e-6f, "x = %g %g", x[0], x[1]);
    /* post = 2 sigma(base) = [1, 3/2] */
    TT_CHECK(fabsf(post[0] - 1.0f) < 1e-6f && fabsf(post[1] - 1.5f) < 1e-6f, "post = %g %g", post[0], post[1]);
    float w1[4] = {1.f / 3, 3.f / 5, 2.f / 3, 2.f / 5};
    TT_CHECK(max_abs_diff(comb, w1, 4) < 1e-6, "1 iteration: comb %g %g %g %g", comb[0], comb[1], comb[2], comb[3]);
    cfg.iters = 2;
    TT_OK(tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, &cfg));
    float w2[4] = {4.f / 11, 12.f / 19, 7.f / 11, 7.f / 19};
    TT_CHECK(max_abs_diff(comb, w2, 4) < 1e-6, "2 iterations: comb %g %g %g %g", comb[0], comb[1], comb[2], comb[3]);
    /* many iterations: doubly stochastic */
    cfg.iters = 200;
    TT_OK(tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, &cfg));
    TT_CHECK(fabsf(comb[0] + comb[1] - 1) < 1e-5f && fabsf(comb[2] + comb[3] - 1) < 1e-5f &&
                 fabsf(comb[0] + comb[2] - 1) < 1e-5f && fabsf(comb[1] + comb[3] - 1) < 1e-5f,
             "200 iterations not doubly stochastic: %g %g %g %g", comb[0], comb[1], comb[2], comb[3]);
    /* hc_eps enters pre (+eps) and the denominators */
    cfg.iters = 1;
    cfg.hc_eps = 0.25f;
    TT_OK(tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, &cfg));
    TT_CHECK(fabsf(x[0] - (0.75f * 1 + 1.0f * 3)) < 1e-5f, "pre + eps: x0 = %g", x[0]);
    /* row softmax + eps = [[.5, 1], [.75, .75]], columns / (sum + eps) */
    float w3[4] = {0.5f / 1.5f, 1.0f / 2.0f, 0.75f / 1.5f, 0.75f / 2.0f};
    TT_CHECK(max_abs_diff(comb, w3, 4) < 1e-6, "eps in Sinkhorn: %g %g %g %g", comb[0], comb[1], comb[2], comb[3]);
    /* m = rho * fn . z with the rms over all hc*d values: z = X, mean z^2 =
     * 30/4, fn row 2 (post_0) picks 2 * z_3 = -8 */
    cfg.hc_eps = 0;
    fn[2 * 4 + 3] = 2.0f;
    TT_OK(tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, &cfg));
    float m2 = (float)(-8.0 / sqrt(7.5 + 1e-6));
    TT_CHECK(fabsf(post[0] - 2.0f * sigm_l(m2)) < 1e-6f, "post0 %g, want %g", post[0], 2.0f * sigm_l(m2));
    fn[2 * 4 + 3] = 0;
  }
  tide_kernels_force_ref(0);
}

typedef struct {
  int hc;
  int64_t d, T, ldX;
  float *X, *fn, *scale, *base, *x, *post, *comb;
} hcset;

static void hcset_init(hcset *s, int hc, int64_t d, int64_t T, uint64_t seed) {
  int64_t n = hc * d, mix = (2 + hc) * hc;
  s->hc = hc, s->d = d, s->T = T, s->ldX = n + 3;
  s->X = xalloc((size_t)(T * s->ldX) * 4);
  s->fn = xalloc((size_t)(mix * n) * 4);
  s->scale = xalloc(3 * 4);
  s->base = xalloc((size_t)mix * 4);
  s->x = xalloc((size_t)(T * d) * 4);
  s->post = xalloc((size_t)(T * hc) * 4);
  s->comb = xalloc((size_t)(T * hc * hc) * 4);
  fill_bf16(s->X, T * s->ldX, seed, 1.0);
  fill_f32(s->fn, mix * n, seed + 1, 2.0 / sqrt((double)n));
  fill_f32(s->base, mix, seed + 2, 0.5);
  s->scale[0] = 0.9f, s->scale[1] = 1.1f, s->scale[2] = 1.3f;
}
static void hcset_free(hcset *s) {
  free(s->X), free(s->fn), free(s->scale), free(s->base), free(s->x), free(s->post), free(s->comb);
}
static int hcset_pre(hcset *s, int64_t t0, int64_t T, const tide_hc_cfg *cfg) {
  int hc = s->hc;
  int64_t d = s->d, n = hc * d, mix = (2 + hc) * hc;
  tide_tensor Xt = tview(s->X + t0 * s->ldX, TIDE_F32, 3, T, hc, d);
  Xt.strides[0] = s->ldX;
  tide_tensor fnt = tview(s->fn, TIDE_F32, 2, mix, n, 0), st = tview(s->scale, TIDE_F32, 1, 3, 0, 0);
  tide_tensor bt = tview(s->base, TIDE_F32, 1, mix, 0, 0), xt = tview(s->x + t0 * d, TIDE_F32, 2, T, d, 0);
  tide_tensor pt = tview(s->post + t0 * hc, TIDE_F32, 2, T, hc, 0), ct = tview(s->comb + t0 * hc * hc, TIDE_F32, 3, T, hc, hc);
  return tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, cfg);
}

static void test_hc_pre_random(void) {
  int hcs[] = {4, 2, 3, 8};
  int64_t ds[] = {1, 7, 64, 100, 256};
  int64_t Ts[] = {1, 3, 7, 65};
  tide_hc_cfg cfg = {20, TIDE_OPS_ROUND_BF16, 1e-6f, 1e-6f};
  for (int ih = 0; ih < 4; ih++)
    for (int id = 0; id < 5; id++)
      for (int it = 0; it < 4; it++) {
        int hc = hcs[ih];
        int64_t d = ds[id], T = Ts[it];
        if (hc != 4 && (it == 3 || id == 4)) continue; /* keep the run short */
        hcset s;
        hcset_init(&s, hc, d, T, 100 + hc * 7 + d + T);
        float *wx = xalloc((size_t)(T * d) * 4), *wp = xalloc((size_t)(T * hc) * 4), *wc = xalloc((size_t)(T * hc * hc) * 4);
        for (int64_t t = 0; t < T; t++)
          hc_pre_local(s.X + t * s.ldX, hc, d, s.fn, s.scale, s.base, 20, 1e-6f, 1e-6f, wx + t * d, wp + t * hc,
                       wc + t * hc * hc, 1);
        for (int ref = 1; ref >= 0; ref--) {
          tide_kernels_force_ref(ref);
          TT_OK(hcset_pre(&s, 0, T, &cfg));
          double ex = nmse(s.x, wx, T * d), ep = nmse(s.post, wp, T * hc), ec = nmse(s.comb, wc, T * hc * hc);
          double lim = ref ? 1e-10 : 1e-6;
          TT_CHECK(ep <= lim && ec <= lim, "%s hc_pre hc %d d %lld T %lld: nmse post %g comb %g (x %g)",
                   ref ? "ref" : "avx2", hc, (long long)d, (long long)T, ep, ec, ex);
          TT_CHECK(close_bf16(s.x, wx, T * d), "hc_pre x off by more than rounding noise (hc %d d %lld T %lld)", hc,
                   (long long)d, (long long)T);
        }
        free(wx), free(wp), free(wc);
        hcset_free(&s);
      }
  tide_kernels_force_ref(0);
}

/* a token's hc_pre results are the same bits alone, in any batch, with 1 or
 * 2 threads, on both kernel paths */
static void test_hc_invariance(void) {
  int64_t T = 37, d = 96;
  int hc = 4;
  tide_hc_cfg cfg = {20, TIDE_OPS_ROUND_BF16, 1e-6f, 1e-6f};
  hcset s;
  hcset_init(&s, hc, d, T, 77);
  size_t bx = (size_t)(T * d) * 4, bp = (size_t)(T * hc) * 4, bc = (size_t)(T * hc * hc) * 4;
  float *x0 = xalloc(bx), *p0 = xalloc(bp), *c0 = xalloc(bc);
  int nthr = tide_threads_get();
  for (int ref = 0; ref < 2; ref++) {
    tide_kernels_force_ref(ref);
    tide_threads_set(2);
    TT_OK(hcset_pre(&s, 0, T, &cfg));
    memcpy(x0, s.x, bx), memcpy(p0, s.post, bp), memcpy(c0, s.comb, bc);
    memset(s.x, 0, bx), memset(s.post, 0, bp), memset(s.comb, 0, bc);
    tide_threads_set(1);
    TT_OK(hcset_pre(&s, 0, T, &cfg));
    TT_CHECK(!memcmp(x0, s.x, bx) && !memcmp(p0, s.post, bp) && !memcmp(c0, s.comb, bc),
             "hc_pre differs between 1 and 2 threads (ref %d)", ref);
    tide_threads_set(2);
    memset(s.x, 0, bx), memset(s.post, 0, bp), memset(s.comb, 0, bc);
    /* tokens one at a time, then in uneven chunks */
    for (int64_t t = 0; t < T; t++) TT_OK(hcset_pre(&s, t, 1, &cfg));
    TT_CHECK(!memcmp(x0, s.x, bx) && !memcmp(p0, s.post, bp) && !memcmp(c0, s.comb, bc),
             "hc_pre of single tokens differs from the batch (ref %d)", ref);
    memset(s.x, 0, bx), memset(s.post, 0, bp), memset(s.comb, 0, bc);
    int64_t cuts[] = {0, 3, 4, 11, 36, 37};
    for (int c = 0; c + 1 < 6; c++) TT_OK(hcset_pre(&s, cuts[c], cuts[c + 1] - cuts[c], &cfg));
    TT_CHECK(!memcmp(x0, s.x, bx) && !memcmp(p0, s.post, bp) && !memcmp(c0, s.comb, bc),
             "hc_pre in chunks differs from the batch (ref %d)", ref);
  }
  tide_threads_set(nthr);
  tide_kernels_force_ref(0);
  free(x0), free(p0), free(c0);
  hcset_free(&s);
}

/* the mixing kernel: any tile shape gives the same bits per (token, row) */
static void test_mix_tiles(void) {
  if (!have_avx2()) return;
  int64_t ns[] = {1, 5, 8, 13, 64, 1027};
  for (int in = 0; in < 6; in++) {
    int64_t n = ns[in];
    float *z = xalloc((size_t)(5 * n) * 4), *fn = xalloc((size_t)(24 * n) * 4);
    float all[5 * 24], one[24], want[5 * 24];
    fill_bf16(z, 5 * n, 1 + n, 1);
    fill_f32(fn, 24 * n, 2 + n, 0.1);
    tide_ops_avx2.mix(all, 24, z, n, 5, fn, n, 24, n);
    tide_ops_ref.mix(want, 24, z, n, 5, fn, n, 24, n);
    int ok = 1;
    for (int t = 0; t < 5; t++)
      for (int r0 = 0; r0 < 24; r0 += 5) {
        int nr = 24 - r0 < 5 ? 24 - r0 : 5;
        tide_ops_avx2.mix(one, 24, z + t * n, n, 1, fn + r0 * n, n, nr, n);
        ok &= !memcmp(one, all + t * 24 + r0, (size_t)nr * 4);
      }
    TT_CHECK(ok, "mix tile shape changes results (n %lld)", (long long)n);
    TT_CHECK(nmse(all, want, 5 * 24) < 1e-10, "mix avx2 vs ref nmse %g (n %lld)", nmse(all, want, 5 * 24), (long long)n);
    free(z), free(fn);
  }
}

static void hc_post_local(float *out, const float *a, const float *X, const float *post, const float *comb, int hc,
                          int64_t d, int round) {
  for (int j = 0; j < hc; j++)
    for (int64_t k = 0; k < d; k++) {
      double acc = (double)post[j] * a[k];
      for (int i = 0; i < hc; i++) acc += (double)comb[i * hc + j] * X[i * d + k];
      out[j * d + k] = round ? bf16v((float)acc) : (float)acc;
    }
}

static void test_hc_post(void) {
  int64_t ds[] = {1, 7, 9, 64, 129};
  for (int hc = 2; hc <= 8; hc++)
    for (int id = 0; id < 5; id++) {
      int64_t d = ds[id], T = 5, n = hc * d;
      float *a = xalloc((size_t)(T * d) * 4), *X = xalloc((size_t)(T * n) * 4), *post = xalloc((size_t)(T * hc) * 4);
      float *comb = xalloc((size_t)(T * hc * hc) * 4), *o1 = xalloc((size_t)(T * n) * 4), *o2 = xalloc((size_t)(T * n) * 4);
      float *w = xalloc((size_t)(T * n) * 4);
      fill_bf16(a, T * d, 1 + d, 1);
      fill_bf16(X, T * n, 2 + d, 1);
      fill_f32(post, T * hc, 3, 1);
      fill_f32(comb, T * hc * hc, 4, 0.4);
      for (int64_t t = 0; t < T; t++) hc_post_local(w + t * n, a + t * d, X + t * n, post + t * hc, comb + t * hc * hc, hc, d, 1);
      tide_tensor at = tview(a, TIDE_F32, 2, T, d, 0), Xt = tview(X, TIDE_F32, 3, T, hc, d);
      tide_tensor pt = tview(post, TIDE_F32, 2, T, hc, 0), ct = tview(comb, TIDE_F32, 3, T, hc, hc);
      tide_tensor ot1 = tview(o1, TIDE_F32, 3, T, hc, d), ot2 = tview(o2, TIDE_F32, 3, T, hc, d);
      tide_kernels_force_ref(1);
      TT_OK(tide_hc_post(&ot1, &at, &Xt, &pt, &ct, TIDE_OPS_ROUND_BF16));
      tide_kernels_force_ref(0);
      TT_OK(tide_hc_post(&ot2, &at, &Xt, &pt, &ct, TIDE_OPS_ROUND_BF16));
      TT_CHECK(!memcmp(o1, o2, (size_t)(T * n) * 4), "hc_post avx2 != ref bitwise (hc %d d %lld)", hc, (long long)d);
      TT_CHECK(close_bf16(o1, w, T * n), "hc_post vs double: nmse %g (hc %d d %lld)",
               nmse(o1, w, T * n), hc, (long long)d);
      /* in place into X */
      TT_OK(tide_hc_post(&Xt, &at, &Xt, &pt, &ct, TIDE_OPS_ROUND_BF16));
      TT_CHECK(!memcmp(X, o2, (size_t)(T * n) * 4), "in-place hc_post differs (hc %d d %lld)", hc, (long long)d);
      free(a), free(X), free(post), free(comb), free(o1), free(o2), free(w);
    }
  float buf[64];
  tide_tensor X1 = tview(buf, TIDE_F32, 3, 1, 1, 8), a1 = tview(buf, TIDE_F32, 2, 1, 8, 0);
  TT_FAILS(tide_hc_post(&X1, &a1, &X1, &a1, &a1, 0), TIDE_E_UNSUPPORTED, "hc = 1");
}

static void hc_head_local(float *y, const float *X, int hc, int64_t d, const float *fn, float s, const float *base,
                          float rms_eps, float hc_eps) {
  int64_t n = hc * d;
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)X[i] * X[i];
  double rho = 1.0 / sqrt(ss / (double)n + rms_eps);
  float g[8];
  for (int r = 0; r < hc; r++) {
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (double)X[i] * fn[r * n + i];
    g[r] = sigm_l(s * (float)(acc * rho) + base[r]) + hc_eps;
  }
  for (int64_t k = 0; k < d; k++) {
    double acc = 0;
    for (int i = 0; i < hc; i++) acc += (double)g[i] * X[i * d + k];
    y[k] = bf16v((float)acc);
  }
}

static void test_hc_head(void) {
  int64_t ds[] = {1, 7, 64, 257};
  for (int id = 0; id < 4; id++)
    for (int hc = 2; hc <= 5; hc += 2) {
      int64_t d = ds[id], T = 7, n = hc * d;
      float *X = xalloc((size_t)(T * n) * 4), *fn = xalloc((size_t)(hc * n) * 4), base[8], s = 0.8f;
      float *y = xalloc((size_t)(T * d) * 4), *w = xalloc((size_t)(T * d) * 4), *y1 = xalloc((size_t)(T * d) * 4);
      fill_bf16(X, T * n, 5 + d, 1);
      fill_f32(fn, hc * n, 6 + d, 2 / sqrt((double)n));
      fill_f32(base, hc, 7, 0.5);
      for (int64_t t = 0; t < T; t++) hc_head_local(w + t * d, X + t * n, hc, d, fn, s, base, 1e-6f, 1e-6f);
      tide_tensor Xt = tview(X, TIDE_F32, 3, T, hc, d), fnt = tview(fn, TIDE_F32, 2, hc, n, 0);
      tide_tensor st = tview(&s, TIDE_F32, 1, 1, 0, 0), bt = tview(base, TIDE_F32, 1, hc, 0, 0);
      tide_tensor yt = tview(y, TIDE_F32, 2, T, d, 0);
      tide_hc_cfg cfg = {0, TIDE_OPS_ROUND_BF16, 1e-6f, 1e-6f};
      for (int ref = 1; ref >= 0; ref--) {
        tide_kernels_force_ref(ref);
        TT_OK(tide_hc_head(&yt, &Xt, &fnt, &st, &bt, &cfg));
        TT_CHECK(close_bf16(y, w, T * d), "hc_head %s nmse %g (hc %d d %lld)",
                 ref ? "ref" : "avx2", nmse(y, w, T * d), hc, (long long)d);
      }
      /* a single token equals its row of the batch */
      tide_tensor X1 = tview(X + 3 * n, TIDE_F32, 3, 1, hc, d), y1t = tview(y1, TIDE_F32, 2, 1, d, 0);
      TT_OK(tide_hc_head(&y1t, &X1, &fnt, &st, &bt, &cfg));
      TT_CHECK(!memcmp(y1, y + 3 * d, (size_t)d * 4), "hc_head of one token differs from the batch");
      free(X), free(fn), free(y), free(w), free(y1);
    }
  tide_kernels_force_ref(0);
}

static void test_hc_errors(void) {
  hcset s;
  hcset_init(&s, 4, 8, 2, 1);
  tide_hc_cfg cfg = {20, 0, 1e-6f, 1e-6f};
  tide_tensor Xt = tview(s.X, TIDE_F32, 3, 2, 4, 8), fnt = tview(s.fn, TIDE_F32, 2, 24, 31, 0);
  tide_tensor st = tview(s.scale, TIDE_F32, 1, 3, 0, 0), bt = tview(s.base, TIDE_F32, 1, 24, 0, 0);
  tide_tensor xt = tview(s.x, TIDE_F32, 2, 2, 8, 0), pt = tview(s.post, TIDE_F32, 2, 2, 4, 0), ct = tview(s.comb, TIDE_F32, 3, 2, 4, 4);
  TT_FAILS(tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, &cfg), TIDE_E_INVALID, "fn has shape [24, 31]");
  fnt = tview(s.fn, TIDE_F32, 2, 24, 32, 0);
  cfg.iters = 0;
  TT_FAILS(tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, &cfg), TIDE_E_INVALID, "iters = 0");
  cfg.iters = 20;
  tide_tensor X9 = tview(s.X, TIDE_F32, 3, 1, 9, 1);
  TT_FAILS(tide_hc_pre(&xt, &pt, &ct, &X9, &fnt, &st, &bt, &cfg), TIDE_E_UNSUPPORTED, "hc = 9");
  tide_tensor p3 = tview(s.post, TIDE_F32, 2, 2, 3, 0);
  TT_FAILS(tide_hc_pre(&xt, &p3, &ct, &Xt, &fnt, &st, &bt, &cfg), TIDE_E_INVALID, "post has shape [2, 3]");
  tide_tensor x3 = tview(s.x, TIDE_F32, 2, 3, 8, 0);
  TT_FAILS(tide_hc_pre(&x3, &pt, &ct, &Xt, &fnt, &st, &bt, &cfg), TIDE_E_INVALID, "x has 3 rows");
  TT_FAILS(tide_hc_pre(&xt, &pt, &ct, &Xt, &fnt, &st, &bt, NULL), TIDE_E_INVALID, "NULL cfg");
  hcset_free(&s);
}

/* ---------------- routing ---------------- */

static float score_local(float l, int scoring) {
  if (scoring == TIDE_SCORE_SIGMOID) return sigm_l(l);
  double sp = l > 20 ? l : log1p(exp((double)l));
  return (float)sqrt(sp);
}

typedef struct { float v; int e; } cand;
static int cand_cmp(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->v != y->v) return x->v > y->v ? -1 : 1;
  return x->e - y->e;
}

/* selection by a full sort (descending, ties to the smaller index) */
static void route_local(const float *l, const float *bias, int64_t E, int k, const tide_route_cfg *cfg, int32_t *ids,
                        float *w) {
  float sc[512];
  cand c[512];
  if (cfg->scoring == TIDE_SCORE_SOFTMAX) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
    double z = 0;
    for (int64_t e = 0; e < E; e++) z += exp((double)l[e] - mx);
    for (int64_t e = 0; e < E; e++) sc[e] = (float)(exp((double)l[e] - mx) / z);
  } else {
    for (int64_t e = 0; e < E; e++) sc[e] = score_local(l[e], cfg->scoring);
  }
  for (int64_t e = 0; e < E; e++) c[e] = (cand){bias ? sc[e] + bias[e] : sc[e], (int)e};
  qsort(c, (size_t)E, sizeof *c, cand_cmp);
  double s = 0;
  for (int i = 0; i < k; i++) {
    ids[i] = c[i].e;
    s += sc[c[i].e];
  }
  for (int i = 0; i < k; i++) w[i] = (float)((cfg->norm_topk ? sc[ids[i]] / s : sc[ids[i]]) * cfg->routed_scale);
}

static void test_route_topk(void) {
  int64_t Es[] = {8, 64, 256, 384};
  int ks[] = {1, 6, 8};
  for (int ie = 0; ie < 4; ie++)
    for (int ik = 0; ik < 3; ik++)
      for (int scoring = 0; scoring < 3; scoring++) {
        int64_t E = Es[ie], T = 9;
        int k = ks[ik];
        float *l = xalloc((size_t)(T * E) * 4), *bias = xalloc((size_t)E * 4), w[9 * 8], ww[9 * 8];
        int32_t ids[9 * 8], wid[9 * 8];
        fill_f32(l, T * E, E + k, 2.0);
        fill_f32(bias, E, 3 + E, 0.1);
        /* exact ties in the logits: quantise some to a coarse grid */
        for (int64_t i = 0; i < T * E; i += 3) l[i] = roundf(l[i]);
        tide_route_cfg cfg = {scoring, scoring != 2, 1.5f, 0};
        tide_tensor lt = tview(l, TIDE_F32, 2, T, E, 0), bt = tview(bias, TIDE_F32, 1, E, 0, 0);
        tide_tensor it = tview(ids, TIDE_I32, 2, T, k, 0), wt = tview(w, TIDE_F32, 2, T, k, 0);
        for (int withb = 0; withb < 2; withb++) {
          TT_OK(tide_route_topk(&it, &wt, &lt, withb ? &bt : NULL, &cfg));
          for (int64_t t = 0; t < T; t++) route_local(l + t * E, withb ? bias : NULL, E, k, &cfg, wid + t * k, ww + t * k);
          TT_CHECK(!memcmp(ids, wid, (size_t)(T * k) * 4), "ids differ (E %lld k %d scoring %d bias %d)", (long long)E, k,
                   scoring, withb);
          TT_CHECK(!memcmp(w, ww, (size_t)(T * k) * 4), "weights differ (E %lld k %d scoring %d bias %d)", (long long)E, k,
                   scoring, withb);
        }
        free(l), free(bias);
      }
  /* ties go to the smaller index; order is by descending biased score */
  float l[8] = {0, 1, 3, 1, 3, -2, 3, 0};
  int32_t ids[4];
  float w[4];
  tide_route_cfg cfg = {TIDE_SCORE_SQRTSOFTPLUS, 1, 1.0f, 0};
  tide_tensor lt = tview(l, TIDE_F32, 2, 1, 8, 0), it = tview(ids, TIDE_I32, 2, 1, 4, 0), wt = tview(w, TIDE_F32, 2, 1, 4, 0);
  TT_OK(tide_route_topk(&it, &wt, &lt, NULL, &cfg));
  TT_CHECK(ids[0] == 2 && ids[1] == 4 && ids[2] == 6 && ids[3] == 1, "tie order: %d %d %d %d", ids[0], ids[1], ids[2], ids[3]);
  /* the bias selects but does not weigh: expert 5 (score of -2) wins with a
   * bias, its weight stays sqrt(softplus(-2)) / sum */
  float bias[8] = {0, 0, 0, 0, 0, 10, 0, 0};
  tide_tensor bt = tview(bias, TIDE_F32, 1, 8, 0, 0);
  TT_OK(tide_route_topk(&it, &wt, &lt, &bt, &cfg));
  TT_CHECK(ids[0] == 5 && ids[1] == 2 && ids[2] == 4 && ids[3] == 6, "bias order: %d %d %d %d", ids[0], ids[1], ids[2], ids[3]);
  double s5 = sqrt(log1p(exp(-2.0))), s3 = sqrt(log1p(exp(3.0)));
  TT_CHECK(fabs(w[0] - s5 / (s5 + 3 * s3)) < 1e-6 && fabs(w[1] - s3 / (s5 + 3 * s3)) < 1e-6, "weights %g %g", w[0], w[1]);
  double sum = w[0] + w[1] + w[2] + w[3];
  TT_CHECK(fabs(sum - 1.0) < 1e-6, "renormalised weights sum to %g", sum);
  /* routed_scale multiplies, norm_topk off keeps raw scores */
  cfg.routed_scale = 2.5f;
  cfg.norm_topk = 0;
  TT_OK(tide_route_topk(&it, &wt, &lt, &bt, &cfg));
  TT_CHECK(fabs(w[0] - s5 * 2.5) < 1e-5 && fabs(w[1] - s3 * 2.5) < 1e-5, "raw weights %g %g", w[0], w[1]);
  /* NaN never wins */
  float ln[8] = {NAN, 0, 1, NAN, -1, 2, NAN, 3};
  tide_tensor lnt = tview(ln, TIDE_F32, 2, 1, 8, 0);
  TT_OK(tide_route_topk(&it, &wt, &lnt, NULL, &cfg));
  TT_CHECK(ids[0] == 7 && ids[1] == 5 && ids[2] == 2 && ids[3] == 1, "NaN order: %d %d %d %d", ids[0], ids[1], ids[2], ids[3]);
  /* misuse */
  tide_tensor i9 = tview(ids, TIDE_I32, 2, 1, 9, 0);
  float wb[9];
  int32_t ib[9];
  i9.data = ib;
  tide_tensor w9 = tview(wb, TIDE_F32, 2, 1, 9, 0);
  TT_FAILS(tide_route_topk(&i9, &w9, &lt, NULL, &cfg), TIDE_E_INVALID, "k = 9");
  cfg.scoring = 7;
  TT_FAILS(tide_route_topk(&it, &wt, &lt, NULL, &cfg), TIDE_E_INVALID, "scoring = 7");
}

static void test_route_hash(void) {
  int64_t V = 11, E = 16, T = 5;
  int k = 3;
  int64_t t2e64[11 * 3];
  int32_t t2e32[11 * 3];
  for (int i = 0; i < V * k; i++) t2e64[i] = t2e32[i] = (int32_t)((i * 7 + 3) % E);
  float l[5 * 16];
  fill_f32(l, T * E, 4, 1.5);
  int64_t tok[5] = {0, 10, 4, 4, 7};
  int32_t ids[15];
  float w[15];
  tide_route_cfg cfg = {TIDE_SCORE_SQRTSOFTPLUS, 1, 1.5f, 0};
  tide_tensor lt = tview(l, TIDE_F32, 2, T, E, 0), it = tview(ids, TIDE_I32, 2, T, k, 0), wt = tview(w, TIDE_F32, 2, T, k, 0);
  tide_tensor tt = tview(tok, TIDE_I64, 1, T, 0, 0);
  for (int v = 0; v < 2; v++) {
    tide_tensor map = v ? tview(t2e32, TIDE_I32, 2, V, k, 0) : tview(t2e64, TIDE_I64, 2, V, k, 0);
    TT_OK(tide_route_hash(&it, &wt, &lt, &tt, &map, &cfg));
    int ok = 1;
    for (int64_t t = 0; t < T; t++) {
      double s = 0;
      for (int i = 0; i < k; i++) {
        ok &= ids[t * k + i] == t2e32[tok[t] * k + i];
        s += score_local(l[t * E + ids[t * k + i]], 0);
      }
      for (int i = 0; i < k; i++) {
        float want = (float)(score_local(l[t * E + ids[t * k + i]], 0) / s * 1.5f);
        ok &= w[t * k + i] == want;
      }
    }
    TT_CHECK(ok, "hash routing ids/weights wrong (tid2eid %s)", v ? "i32" : "i64");
  }
  /* errors: nothing written */
  for (int i = 0; i < 15; i++) ids[i] = -5, w[i] = -5;
  tide_tensor map = tview(t2e64, TIDE_I64, 2, V, k, 0);
  int64_t badtok[5] = {0, 1, 11, 2, 3};
  tide_tensor bt = tview(badtok, TIDE_I64, 1, T, 0, 0);
  TT_FAILS(tide_route_hash(&it, &wt, &lt, &bt, &map, &cfg), TIDE_E_RANGE, "token id 11 at position 2");
  t2e64[4 * 3 + 1] = 16;
  TT_FAILS(tide_route_hash(&it, &wt, &lt, &tt, &map, &cfg), TIDE_E_FORMAT, "tid2eid[4][1] = 16");
  t2e64[4 * 3 + 1] = -1;
  TT_FAILS(tide_route_hash(&it, &wt, &lt, &tt, &map, &cfg), TIDE_E_FORMAT, "tid2eid[4][1] = -1");
  int untouched = 1;
  for (int i = 0; i < 15; i++) untouched &= ids[i] == -5 && w[i] == -5;
  TT_CHECK(untouched, "a failed hash routing wrote its outputs");
  tide_tensor map2 = tview(t2e64, TIDE_I64, 2, V, 2, 0);
  TT_FAILS(tide_route_hash(&it, &wt, &lt, &tt, &map2, &cfg), TIDE_E_INVALID, "tid2eid has shape [11, 2]");
}

/* ---------------- SwiGLU ---------------- */

static void test_swiglu(void) {
  /* hand values: the gate clamps above only, the up projection both ways */
  float g[6] = {20, 10, -30, 1, 0.5f, NAN}, u[6] = {1, -30, 2, 25, -0.5f, 1}, h[6];
  tide_tensor gt = tview(g, TIDE_F32, 1, 6, 0, 0), ut = tview(u, TIDE_F32, 1, 6, 0, 0), ht = tview(h, TIDE_F32, 1, 6, 0, 0);
  float s10 = 10.0f / (1.0f + expf(-10.0f));
  for (int ref = 0; ref < 2; ref++) {
    tide_kernels_force_ref(ref);
    TT_OK(tide_swiglu(&ht, &gt, &ut, 10.0f, 0));
    TT_CHECK(fabsf(h[0] - s10) < 1e-5f, "gate 20 clamps to 10: %g", h[0]);
    TT_CHECK(fabsf(h[1] - -10 * s10) < 1e-4f, "up -30 clamps to -10: %g", h[1]);
    float sm30 = -30.0f / (1.0f + expf(30.0f));
    TT_CHECK(fabsf(h[2] - 2 * sm30) < 1e-12f, "gate -30 is not clamped below: %g vs %g", h[2], 2 * sm30);
    TT_CHECK(fabsf(h[3] - 10 * (1.0f / (1.0f + expf(-1.0f)))) < 1e-5f, "up 25 clamps to 10: %g", h[3]);
    TT_CHECK(fabsf(h[4] - -0.5f * 0.5f / (1.0f + expf(-0.5f))) < 1e-7f, "unclamped: %g", h[4]);
    TT_CHECK(fabsf(h[5] - s10) < 1e-5f, "a NaN gate takes the limit like fminf: %g", h[5]);
    TT_OK(tide_swiglu(&ht, &gt, &ut, INFINITY, 0));
    TT_CHECK(fabsf(h[0] - 20.0f / (1.0f + expf(-20.0f))) < 1e-4f && fabsf(h[3] - 25 / (1.0f + expf(-1.0f))) < 1e-4f,
             "no clamp with an infinite limit: %g %g", h[0], h[3]);
  }
  /* AVX2 vs reference over a wide range, fused gate|up halves, in place */
  for (int in = 0; in < NNS; in++) {
    int64_t n = NS[in], R = 7;
    float *gu = xalloc((size_t)(R * 2 * n) * 4), *o1 = xalloc((size_t)(R * n) * 4), *o2 = xalloc((size_t)(R * n) * 4);
    fill_bf16(gu, R * 2 * n, 8 + n, 6.0);
    for (int64_t i = 0; i < R * 2 * n; i += 11) gu[i] *= 20; /* beyond the limit, and very negative gates */
    tide_tensor g2 = trows(gu, R, n, 2 * n), u2 = trows(gu + n, R, n, 2 * n);
    tide_tensor ot1 = tview(o1, TIDE_F32, 2, R, n, 0), ot2 = tview(o2, TIDE_F32, 2, R, n, 0);
    tide_kernels_force_ref(1);
    TT_OK(tide_swiglu(&ot1, &g2, &u2, 10.0f, TIDE_OPS_ROUND_BF16));
    tide_kernels_force_ref(0);
    TT_OK(tide_swiglu(&ot2, &g2, &u2, 10.0f, TIDE_OPS_ROUND_BF16));
    TT_CHECK(close_bf16(o2, o1, R * n), "swiglu avx2 vs ref: nmse %g, %lld ulp (n %lld)",
             nmse(o2, o1, R * n), (long long)max_bf16_ulp(o2, o1, R * n), (long long)n);
    TT_OK(tide_swiglu(&g2, &g2, &u2, 10.0f, TIDE_OPS_ROUND_BF16)); /* into the gate half */
    int ok = 1;
    for (int64_t r = 0; r < R; r++) ok &= !memcmp(gu + r * 2 * n, o2 + r * n, (size_t)n * 4);
    TT_CHECK(ok, "in-place swiglu differs (n %lld)", (long long)n);
    free(gu), free(o1), free(o2);
  }
  /* the vectorised exp across its range: |rel err| of silu below 4 ulp */
  if (have_avx2()) {
    int64_t n = 20000;
    float *gg = xalloc((size_t)n * 4), *uu = xalloc((size_t)n * 4), *a = xalloc((size_t)n * 4), *b = xalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) gg[i] = -100.0f + 110.0f * (float)i / (float)n, uu[i] = 1.0f;
    tide_ops_avx2.swiglu(a, gg, uu, n, INFINITY, 0);
    tide_ops_ref.swiglu(b, gg, uu, n, INFINITY, 0);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
      double rel = b[i] == 0 ? fabs(a[i]) : fabs((double)a[i] - b[i]) / fabs(b[i]);
      if (rel > worst) worst = rel;
    }
    TT_CHECK(worst < 4 * 1.2e-7, "vectorised silu relative error %g", worst);
    free(gg), free(uu), free(a), free(b);
  }
  tide_kernels_force_ref(0);
  TT_FAILS(tide_swiglu(&ht, &gt, &ut, 0.0f, 0), TIDE_E_INVALID, "limit");
  tide_tensor u5 = tview(u, TIDE_F32, 1, 5, 0, 0);
  TT_FAILS(tide_swiglu(&ht, &gt, &u5, 10.0f, 0), TIDE_E_INVALID, "up has 1 rows of 5");
}

/* every kernel writes its tail: the elementwise AVX2 kernels equal the
 * references bit for bit on awkward lengths */
static void test_elementwise_bitwise(void) {
  if (!have_avx2()) return;
  for (int in = 0; in < NNS; in++) {
    int64_t n = NS[in];
    float *a = xalloc((size_t)(8 * n) * 4), *b = xalloc((size_t)(8 * n) * 4), *o1 = xalloc((size_t)(8 * n) * 4);
    float *o2 = xalloc((size_t)(8 * n) * 4), c[8];
    fill_bf16(a, 8 * n, 31 + n, 1);
    fill_bf16(b, 8 * n, 32 + n, 1);
    fill_f32(c, 8, 33, 1);
    const float *ys[8];
    for (int i = 0; i < 8; i++) ys[i] = a + i * n;
    for (int k = 1; k <= 8; k += 3) {
      tide_ops_ref.combine(o1, ys, c, k, k == 4 ? NULL : b, n, 1);
      tide_ops_avx2.combine(o2, ys, c, k, k == 4 ? NULL : b, n, 1);
      TT_CHECK(!memcmp(o1, o2, (size_t)n * 4), "combine differs (n %lld k %d)", (long long)n, k);
    }
    for (int hc = 2; hc <= 8; hc++) {
      tide_ops_ref.wsum(o1, a, c, hc, n, 1);
      tide_ops_avx2.wsum(o2, a, c, hc, n, 1);
      TT_CHECK(!memcmp(o1, o2, (size_t)n * 4), "wsum differs (n %lld hc %d)", (long long)n, hc);
    }
    tide_ops_ref.scale_row(o1, a, 0.37f, b, TIDE_OPSW_F32, n, 1);
    tide_ops_avx2.scale_row(o2, a, 0.37f, b, TIDE_OPSW_F32, n, 1);
    TT_CHECK(!memcmp(o1, o2, (size_t)n * 4), "scale_row differs (n %lld)", (long long)n);
    double s1 = tide_ops_ref.sumsq(a, n), s2 = tide_ops_avx2.sumsq(a, n);
    TT_CHECK(fabs(s1 - s2) <= 1e-13 * s1, "sumsq %.17g vs %.17g (n %lld)", s1, s2, (long long)n);
    free(a), free(b), free(o1), free(o2);
  }
}

/* every per-token kernel gives the same bits with 1 and 2 threads, and for a
 * token alone (T large enough that the calls do split over threads) */
static void test_thread_invariance(void) {
  int64_t T = 65, d = 1000, hc = 4, E = 256, V = 300;
  int k = 6;
  size_t nX = (size_t)(T * hc * d), nx = (size_t)(T * d);
  float *X = xalloc(nX * 4), *a = xalloc(nx * 4), *post = xalloc((size_t)(T * hc) * 4);
  float *comb = xalloc((size_t)(T * hc * hc) * 4), *fn = xalloc((size_t)(hc * hc * d) * 4), base[4] = {0.1f, -0.2f, 0.3f, 0};
  float *lg = xalloc((size_t)(T * E) * 4), *bias = xalloc((size_t)E * 4), s1 = 0.7f;
  float *out[2], *wts[2];
  int32_t *ids[2];
  uint16_t *tab = xalloc((size_t)(V * d) * 2);
  int64_t tok[65];
  fill_bf16(X, (int64_t)nX, 1, 1);
  fill_bf16(a, (int64_t)nx, 2, 1);
  fill_f32(post, T * hc, 3, 1);
  fill_f32(comb, T * hc * hc, 4, 0.3);
  fill_f32(fn, hc * hc * d, 5, 0.02);
  fill_f32(lg, T * E, 6, 2);
  fill_f32(bias, E, 7, 0.1);
  for (int64_t i = 0; i < V * d; i++) tab[i] = (uint16_t)(i * 2654435761u >> 17);
  for (int64_t t = 0; t < T; t++) tok[t] = (t * 37) % V;
  for (int i = 0; i < 2; i++) {
    out[i] = xalloc(nX * 4);
    wts[i] = xalloc((size_t)(T * k) * 4);
    ids[i] = xalloc((size_t)(T * k) * 4);
  }
  int nthr = tide_threads_get();
  for (int ref = 0; ref < 2; ref++) {
    tide_kernels_force_ref(ref);
    for (int op = 0; op < 6; op++) {
      for (int th = 0; th < 3; th++) { /* 2 threads, 1 thread, token by token */
        tide_threads_set(th == 1 ? 1 : 2);
        int64_t t0 = 0, t1 = th == 2 ? 1 : T;
        float *o = out[th ? 1 : 0];
        for (; t0 < T; t0 = t1, t1 = th == 2 ? t0 + 1 : T) {
          int64_t n = t1 - t0;
          tide_tensor xt = tview(a + t0 * d, TIDE_F32, 2, n, d, 0), ot = tview(o + t0 * d, TIDE_F32, 2, n, d, 0);
          tide_tensor Xt = tview(X + t0 * hc * d, TIDE_F32, 3, n, hc, d), Ot = tview(o + t0 * hc * d, TIDE_F32, 3, n, hc, d);
          tide_tensor pt = tview(post + t0 * hc, TIDE_F32, 2, n, hc, 0), ct = tview(comb + t0 * hc * hc, TIDE_F32, 3, n, hc, hc);
          tide_tensor lt = tview(lg + t0 * E, TIDE_F32, 2, n, E, 0), bt = tview(bias, TIDE_F32, 1, E, 0, 0);
          tide_tensor it = tview(ids[th ? 1 : 0] + t0 * k, TIDE_I32, 2, n, k, 0), wt = tview(wts[th ? 1 : 0] + t0 * k, TIDE_F32, 2, n, k, 0);
          tide_tensor tbt = tview(tab, TIDE_BF16, 2, V, d, 0), tkt = tview(tok + t0, TIDE_I64, 1, n, 0, 0);
          tide_tensor fnt = tview(fn, TIDE_F32, 2, hc, hc * d, 0), st = tview(&s1, TIDE_F32, 1, 1, 0, 0), bst = tview(base, TIDE_F32, 1, hc, 0, 0);
          tide_tensor gt = tview(X + t0 * 2 * d, TIDE_F32, 2, n, d, 0), ut = tview(X + t0 * 2 * d + d, TIDE_F32, 2, n, d, 0);
          gt.strides[0] = ut.strides[0] = 2 * d;
          tide_hc_cfg cfg = {20, TIDE_OPS_ROUND_BF16, 1e-6f, 1e-6f};
          tide_route_cfg rc = {TIDE_SCORE_SQRTSOFTPLUS, 1, 1.5f, 0};
          switch (op) {
            case 0: TT_OK(tide_rmsnorm(&ot, &xt, NULL, 1e-6f, TIDE_OPS_ROUND_BF16)); break;
            case 1: TT_OK(tide_embed(&Ot, &tbt, &tkt)); break;
            case 2: TT_OK(tide_hc_post(&Ot, &xt, &Xt, &pt, &ct, TIDE_OPS_ROUND_BF16)); break;
            case 3: TT_OK(tide_hc_head(&ot, &Xt, &fnt, &st, &bst, &cfg)); break;
            case 4: TT_OK(tide_route_topk(&it, &wt, &lt, &bt, &rc)); break;
            default: TT_OK(tide_swiglu(&ot, &gt, &ut, 10.0f, TIDE_OPS_ROUND_BF16)); break;
          }
        }
        if (th == 0) continue;
        size_t bytes = (op == 1 || op == 2) ? nX * 4 : nx * 4;
        int same = op == 4 ? !memcmp(ids[0], ids[1], (size_t)(T * k) * 4) && !memcmp(wts[0], wts[1], (size_t)(T * k) * 4)
                           : !memcmp(out[0], out[1], bytes);
        TT_CHECK(same, "op %d (ref %d): %s differs from 2 threads", op, ref, th == 1 ? "1 thread" : "token by token");
      }
    }
  }
  tide_threads_set(nthr);
  tide_kernels_force_ref(0);
  for (int i = 0; i < 2; i++) free(out[i]), free(wts[i]), free(ids[i]);
  free(X), free(a), free(post), free(comb), free(fn), free(lg), free(bias), free(tab);
}

static void test_no_leaks(void) {
  tide_alloc_stats st;
  tide_alloc_stats_get(&st);
  TT_CHECK(st.live_allocs == 0, "%lld allocations still live", (long long)st.live_allocs);
}

TT_RUN(TT(test_rmsnorm), TT(test_round), TT(test_embed), TT(test_hc_hand), TT(test_hc_pre_random),
       TT(test_hc_invariance), TT(test_mix_tiles), TT(test_hc_post), TT(test_hc_head), TT(test_hc_errors),
       TT(test_route_topk), TT(test_route_hash), TT(test_swiglu), TT(test_elementwise_bitwise), TT(test_thread_invariance),
       TT(test_no_leaks))
