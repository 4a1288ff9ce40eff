/* test_moe.c - the MoE block (tide_moe_*) and the model-level kernels in
 * context: the block against a per-token scalar computation written here
 * (MXFP4 and bf16 routed experts, FP8 and bf16 shared experts), bitwise batch,
 * order and thread invariance, duplicate picks, errors that leave the block
 * unchanged, no allocation in steady state, the step stats; then routing + the
 * block against refmodel.c's refm_moe on the same inputs, and a forward pass
 * whose mHC, norms, routing and MoE are tide's kernels (attention from the
 * reference) against refm_forward_token. */
#include "ops_testutil.h"
#include "ref/refmodel.h"

/* ---------------- test weights ---------------- */

enum { WK_F32 = 0, WK_BF16 = 1, WK_FP8 = 2, WK_MXFP4 = 3 };

typedef struct {
  tide_tensor w, s;   /* checkpoint-format weight (and scale) */
  float *dense;       /* [n, k] dequantised values, for the local reference */
  int64_t n, k;
} tweight;

static void tweight_make(tweight *tw, int kind, int64_t n, int64_t k, uint64_t seed, double std) {
  memset(tw, 0, sizeof *tw);
  tw->n = n, tw->k = k;
  tw->dense = xalloc((size_t)(n * k) * 4);
  float *v = xalloc((size_t)(n * k) * 4);
  fill_f32(v, n * k, seed, std);
  if (kind == WK_F32 || kind == WK_BF16) {
    int64_t sh[2] = {n, k};
    TT_OK(tide_tensor_new(&tw->w, kind == WK_F32 ? TIDE_F32 : TIDE_BF16, 2, sh));
    for (int64_t i = 0; i < n * k; i++) {
      if (kind == WK_F32) ((float *)tw->w.data)[i] = tw->dense[i] = v[i];
      else {
        uint16_t b = tide_f32_to_bf16(v[i]);
        ((uint16_t *)tw->w.data)[i] = b;
        tw->dense[i] = tide_bf16_to_f32(b);
      }
    }
  } else if (kind == WK_FP8) { /* 128 x 128 blocks, ragged edges */
    int64_t sr = (n + 127) / 128, sc = (k + 127) / 128, sh[2] = {n, k}, ss[2] = {sr, sc};
    TT_OK(tide_tensor_new(&tw->w, TIDE_F8E4M3, 2, sh));
    TT_OK(tide_tensor_new(&tw->s, TIDE_E8M0, 2, ss));
    uint8_t *wq = tw->w.data, *sq = tw->s.data;
    for (int64_t bi = 0; bi < sr; bi++)
      for (int64_t bj = 0; bj < sc; bj++) {
        float amax = 0;
        for (int64_t i = bi * 128; i < n && i < bi * 128 + 128; i++)
          for (int64_t j = bj * 128; j < k && j < bj * 128 + 128; j++) amax = fmaxf(amax, fabsf(v[i * k + j]));
        uint8_t e = tide_f32_to_e8m0(amax / 448.0f);
        float scale = tide_e8m0_to_f32(e);
        sq[bi * sc + bj] = e;
        for (int64_t i = bi * 128; i < n && i < bi * 128 + 128; i++)
          for (int64_t j = bj * 128; j < k && j < bj * 128 + 128; j++) {
            uint8_t c = tide_f32_to_f8e4m3(v[i * k + j] / scale);
            wq[i * k + j] = c;
            tw->dense[i * k + j] = tide_f8e4m3_to_f32(c) * scale;
          }
      }
  } else { /* MXFP4: e2m1 pairs, low nibble first, one e8m0 per 32 */
    int64_t sh[2] = {n, k / 2}, ss[2] = {n, k / 32};
    TT_OK(tide_tensor_new(&tw->w, TIDE_I8, 2, sh));
    TT_OK(tide_tensor_new(&tw->s, TIDE_E8M0, 2, ss));
    uint8_t *wq = tw->w.data, *sq = tw->s.data;
    for (int64_t i = 0; i < n; i++)
      for (int64_t b = 0; b < k / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[i * k + b * 32 + j]));
        uint8_t e = tide_f32_to_e8m0(amax / 6.0f);
        float scale = tide_e8m0_to_f32(e);
        sq[i * (k / 32) + b] = e;
        for (int j = 0; j < 32; j++) {
          int64_t col = b * 32 + j;
          uint8_t c = tide_f32_to_fp4(v[i * k + col] / scale);
          tw->dense[i * k + col] = tide_fp4_to_f32(c) * scale;
          uint8_t *byte = wq + i * (k / 2) + col / 2;
          *byte = (col & 1) ? (uint8_t)((*byte & 0x0f) | (c << 4)) : (uint8_t)((*byte & 0xf0) | c);
        }
      }
  }
  free(v);
}

static void tweight_free(tweight *tw) {
  tide_tensor_release(&tw->w);
  tide_tensor_release(&tw->s);
  free(tw->dense);
}

/* y = bf16(x . W^T) in double, the rounding points of refmodel's gemv */
static void gemv_local(const tweight *w, const float *x, float *y, int round) {
  for (int64_t i = 0; i < w->n; i++) {
    double acc = 0;
    for (int64_t j = 0; j < w->k; j++) acc += (double)x[j] * w->dense[i * w->k + j];
    y[i] = round ? bf16v((float)acc) : (float)acc;
  }
}

static void expert_local(const tweight *w /* w1, w2, w3 */, const float *x, float *y, float lim) {
  int64_t I = w[0].n;
  float *g = xalloc((size_t)I * 4), *u = xalloc((size_t)I * 4);
  gemv_local(&w[0], x, g, 1);
  gemv_local(&w[2], x, u, 1);
  for (int64_t i = 0; i < I; i++) {
    float gv = fminf(g[i], lim), uv = fminf(fmaxf(u[i], -lim), lim);
    g[i] = bf16v(gv / (1.0f + expf(-gv)) * uv);
  }
  gemv_local(&w[1], g, y, 1);
  free(g), free(u);
}

/* Does TIDE_BACKEND_AUTO compute this weight's products exactly like the
 * double-accumulating reference? (True while no faster kernel exists.) */
static int linear_is_ref(const tweight *w) {
  tide_linear *l;
  TT_OK(tide_linear_new(&l, &w->w, w->s.data ? &w->s : NULL));
  int64_t M = 5;
  float *x = xalloc((size_t)(M * w->k) * 4), *y1 = xalloc((size_t)(M * w->n) * 4), *y2 = xalloc((size_t)(M * w->n) * 4);
  fill_bf16(x, M * w->k, 4242, 1.0);
  tide_tensor xt = tview(x, TIDE_F32, 2, M, w->k, 0), t1 = tview(y1, TIDE_F32, 2, M, w->n, 0), t2 = tview(y2, TIDE_F32, 2, M, w->n, 0);
  TT_OK(tide_linear_forward(l, &t1, &xt, TIDE_BACKEND_AUTO));
  TT_OK(tide_linear_forward(l, &t2, &xt, TIDE_BACKEND_REF));
  int same = !memcmp(y1, y2, (size_t)(M * w->n) * 4);
  tide_linear_free(l);
  free(x), free(y1), free(y2);
  return same;
}

/* ---------------- a MoE block and its weights ---------------- */

typedef struct {
  int32_t E;
  int64_t d, inter, sinter;
  int k;
  float lim;
  tweight *ex;      /* [E][3] */
  tweight sh[3];
  tide_moe *moe;
} tmoe;

static void tmoe_make(tmoe *t, int32_t E, int64_t d, int64_t inter, int64_t sinter, int k, int rkind, int skind,
                      uint64_t seed) {
  memset(t, 0, sizeof *t);
  t->E = E, t->d = d, t->inter = inter, t->sinter = sinter, t->k = k, t->lim = 10.0f;
  t->ex = xalloc(sizeof(tweight) * 3 * (size_t)E);
  TT_OK(tide_moe_new(&t->moe, E, d, inter, t->lim));
  for (int32_t e = 0; e < E; e++) {
    tweight *w = t->ex + 3 * e;
    /* large enough that the swiglu clamps engage on some rows */
    tweight_make(&w[0], rkind, inter, d, seed + 10 * e, 3.0 / sqrt((double)d));
    tweight_make(&w[1], rkind, d, inter, seed + 10 * e + 1, 1.0 / sqrt((double)inter));
    tweight_make(&w[2], rkind, inter, d, seed + 10 * e + 2, 3.0 / sqrt((double)d));
    TT_OK(tide_moe_set_expert(t->moe, e, &w[0].w, &w[0].s, &w[1].w, &w[1].s, &w[2].w, &w[2].s));
  }
  if (sinter > 0) {
    tweight_make(&t->sh[0], skind, sinter, d, seed + 7001, 2.0 / sqrt((double)d));
    tweight_make(&t->sh[1], skind, d, sinter, seed + 7002, 1.0 / sqrt((double)sinter));
    tweight_make(&t->sh[2], skind, sinter, d, seed + 7003, 2.0 / sqrt((double)d));
    TT_OK(tide_moe_set_shared(t->moe, &t->sh[0].w, &t->sh[0].s, &t->sh[1].w, &t->sh[1].s, &t->sh[2].w, &t->sh[2].s));
  }
}

static void tmoe_free(tmoe *t) {
  tide_moe_free(t->moe);
  for (int64_t i = 0; i < 3 * (int64_t)t->E; i++) tweight_free(&t->ex[i]);
  free(t->ex);
  if (t->sinter > 0)
    for (int j = 0; j < 3; j++) tweight_free(&t->sh[j]);
}

/* the doc's formula token by token: f32 sum in slot order, then shared */
static void moe_local(const tmoe *t, const float *x, const int32_t *ids, const float *w, float *out) {
  int64_t d = t->d;
  float *y = xalloc((size_t)d * 4), *acc = xalloc((size_t)d * 4);
  for (int i = 0; i < t->k; i++) {
    expert_local(t->ex + 3 * ids[i], x, y, t->lim);
    for (int64_t j = 0; j < d; j++) acc[j] = i == 0 ? w[0] * y[j] : acc[j] + w[i] * y[j];
  }
  if (t->sinter > 0) {
    expert_local(t->sh, x, y, t->lim);
    for (int64_t j = 0; j < d; j++) acc[j] = acc[j] + y[j];
  }
  for (int64_t j = 0; j < d; j++) out[j] = bf16v(acc[j]);
  free(y), free(acc);
}

/* random routing: k distinct experts per token (or with repeats) */
static void random_route(int32_t *ids, float *w, int64_t T, int k, int32_t E, uint64_t seed, int allow_repeat) {
  trng r = {seed * 31 + 5};
  for (int64_t t = 0; t < T; t++)
    for (int i = 0; i < k; i++) {
      int32_t e;
      int dup;
      do {
        e = (int32_t)(trng_next(&r) % (uint64_t)E);
        dup = 0;
        for (int j = 0; j < i && !allow_repeat; j++) dup |= ids[t * k + j] == e;
      } while (dup);
      ids[t * k + i] = e;
      w[t * k + i] = (float)(0.1 + trng_unif(&r));
    }
}

static int moe_run(tmoe *t, float *out, const float *x, const int32_t *ids, const float *w, int64_t T) {
  tide_tensor ot = tview(out, TIDE_F32, 2, T, t->d, 0), xt = tview((void *)x, TIDE_F32, 2, T, t->d, 0);
  tide_tensor it = tview((void *)ids, TIDE_I32, 2, T, t->k, 0), wt = tview((void *)w, TIDE_F32, 2, T, t->k, 0);
  return tide_moe_forward(t->moe, &ot, &xt, &it, &wt, TIDE_OPS_ROUND_BF16);
}

/* ---------------- tests ---------------- */

typedef struct {
  const char *name;
  int32_t E;
  int64_t d, inter, sinter;
  int k, rkind, skind;
} variant;

static const variant VARIANTS[] = {
    {"mxfp4 experts + fp8 shared", 16, 128, 64, 192, 6, WK_MXFP4, WK_FP8},
    {"bf16 experts + bf16 shared", 5, 100, 36, 36, 2, WK_BF16, WK_BF16},
    {"mxfp4 experts, no shared", 8, 64, 32, 0, 1, WK_MXFP4, 0},
};

static void test_moe_vs_scalar(void) {
  for (size_t v = 0; v < sizeof VARIANTS / sizeof VARIANTS[0]; v++) {
    const variant *V = &VARIANTS[v];
    tmoe t;
    tmoe_make(&t, V->E, V->d, V->inter, V->sinter, V->k, V->rkind, V->skind, 1000 + v);
    int64_t Ts[] = {1, 3, 7, 65};
    for (int it = 0; it < 4; it++) {
      int64_t T = Ts[it], d = V->d;
      float *x = xalloc((size_t)(T * d) * 4), *out = xalloc((size_t)(T * d) * 4), *want = xalloc((size_t)(T * d) * 4);
      float *w = xalloc((size_t)(T * V->k) * 4);
      int32_t *ids = xalloc((size_t)(T * V->k) * 4);
      fill_bf16(x, T * d, 50 + T + v, 1.0);
      random_route(ids, w, T, V->k, V->E, T + v, 0);
      TT_OK(moe_run(&t, out, x, ids, w, T));
      for (int64_t tk = 0; tk < T; tk++) moe_local(&t, x + tk * d, ids + tk * V->k, w + tk * V->k, want + tk * d);
      double e = nmse(out, want, T * d);
      TT_CHECK(e < 1e-5, "%s T %lld: nmse %g against the scalar computation", V->name, (long long)T, e);
      /* when the linear layers run their double-accumulating reference (as
       * the scalar computation does), the block must match it bit for bit:
       * same rounding points, same f32 sum order */
      if (linear_is_ref(&t.ex[0]) && (!V->sinter || linear_is_ref(&t.sh[0])))
        TT_CHECK(!memcmp(out, want, (size_t)(T * d) * 4), "%s T %lld: not bitwise equal to the scalar computation",
                 V->name, (long long)T);
      if (it == 3) printf("  %s: T 65 %s the scalar computation (nmse %g)\n", V->name,
                          memcmp(out, want, (size_t)(T * d) * 4) ? "close to" : "bitwise equal to", e);
      /* stats */
      tide_moe_stats st;
      int32_t rows[64];
      TT_OK(tide_moe_stats_get(t.moe, &st));
      TT_OK(tide_moe_expert_rows(t.moe, rows, 64));
      int32_t cnt[64] = {0}, act = 0, mx = 0;
      for (int64_t r = 0; r < T * V->k; r++) cnt[ids[r]]++;
      int ok = 1;
      for (int32_t e2 = 0; e2 < V->E; e2++) {
        ok &= cnt[e2] == rows[e2];
        act += cnt[e2] > 0;
        if (cnt[e2] > mx) mx = cnt[e2];
      }
      TT_CHECK(ok && st.n_active == act && st.max_rows == mx && st.rows == T * V->k && st.tokens == T,
               "stats: active %d/%d max %d/%d rows %lld", st.n_active, act, st.max_rows, mx, (long long)st.rows);
      int64_t wb = 0;
      for (int32_t e2 = 0; e2 < V->E; e2++)
        if (cnt[e2])
          for (int j = 0; j < 3; j++) wb += tide_tensor_nbytes(&t.ex[3 * e2 + j].w) + (t.ex[3 * e2 + j].s.data ? tide_tensor_nbytes(&t.ex[3 * e2 + j].s) : 0);
      if (V->sinter)
        for (int j = 0; j < 3; j++) wb += tide_tensor_nbytes(&t.sh[j].w) + (t.sh[j].s.data ? tide_tensor_nbytes(&t.sh[j].s) : 0);
      TT_CHECK(st.weight_bytes == wb, "weight bytes %lld, expected %lld", (long long)st.weight_bytes, (long long)wb);
      TT_CHECK(st.t_total >= st.t_up && st.t_up > 0, "phase times %g %g", st.t_total, st.t_up);
      free(x), free(out), free(want), free(w), free(ids);
    }
    tmoe_free(&t);
  }
}

/* a token's output is the same bits alone, in any batch, in any order, with
 * repeats of an expert, with 1 or 2 threads */
static void test_moe_invariance(void) {
  tmoe t;
  tmoe_make(&t, 16, 128, 64, 192, 6, WK_MXFP4, WK_FP8, 77);
  int64_t T = 23, d = 128;
  int k = 6;
  float *x = xalloc((size_t)(T * d) * 4), *out = xalloc((size_t)(T * d) * 4), *o2 = xalloc((size_t)(T * d) * 4);
  float *w = xalloc((size_t)(T * k) * 4), *xp = xalloc((size_t)(T * d) * 4), *wp = xalloc((size_t)(T * k) * 4);
  int32_t *ids = xalloc((size_t)(T * k) * 4), *ip = xalloc((size_t)(T * k) * 4);
  fill_bf16(x, T * d, 3, 1.0);
  random_route(ids, w, T, k, 16, 9, 1); /* repeats allowed: hash tables may list an expert twice */
  int nthr = tide_threads_get();
  tide_threads_set(2);
  TT_OK(moe_run(&t, out, x, ids, w, T));
  int ok = 1;
  for (int64_t tk = 0; tk < T; tk++) {
    TT_OK(moe_run(&t, o2, x + tk * d, ids + tk * k, w + tk * k, 1));
    ok &= !memcmp(o2, out + tk * d, (size_t)d * 4);
  }
  TT_CHECK(ok, "a token alone differs from the same token in the batch");
  /* reversed order, other neighbours */
  for (int64_t tk = 0; tk < T; tk++) {
    memcpy(xp + tk * d, x + (T - 1 - tk) * d, (size_t)d * 4);
    memcpy(ip + tk * k, ids + (T - 1 - tk) * k, (size_t)k * 4);
    memcpy(wp + tk * k, w + (T - 1 - tk) * k, (size_t)k * 4);
  }
  TT_OK(moe_run(&t, o2, xp, ip, wp, T));
  ok = 1;
  for (int64_t tk = 0; tk < T; tk++) ok &= !memcmp(o2 + tk * d, out + (T - 1 - tk) * d, (size_t)d * 4);
  TT_CHECK(ok, "reordering the batch changes a token's output");
  /* chunks */
  memset(o2, 0, (size_t)(T * d) * 4);
  int64_t cuts[] = {0, 2, 9, 10, 23};
  for (int c = 0; c < 4; c++)
    TT_OK(moe_run(&t, o2 + cuts[c] * d, x + cuts[c] * d, ids + cuts[c] * k, w + cuts[c] * k, cuts[c + 1] - cuts[c]));
  TT_CHECK(!memcmp(o2, out, (size_t)(T * d) * 4), "chunked steps differ from one step");
  tide_threads_set(1);
  TT_OK(moe_run(&t, o2, x, ids, w, T));
  TT_CHECK(!memcmp(o2, out, (size_t)(T * d) * 4), "1 thread differs from 2 threads");
  tide_threads_set(nthr);
  /* in place: out = x */
  memcpy(o2, x, (size_t)(T * d) * 4);
  TT_OK(moe_run(&t, o2, o2, ids, w, T));
  TT_CHECK(!memcmp(o2, out, (size_t)(T * d) * 4), "out = x differs");
  /* with repeats the scalar computation still agrees */
  float *want = xalloc((size_t)(T * d) * 4);
  for (int64_t tk = 0; tk < T; tk++) moe_local(&t, x + tk * d, ids + tk * k, w + tk * k, want + tk * d);
  TT_CHECK(nmse(out, want, T * d) < 1e-5, "repeats: nmse %g", nmse(out, want, T * d));
  free(x), free(out), free(o2), free(w), free(xp), free(wp), free(ids), free(ip), free(want);
  tmoe_free(&t);
}

/* steady state allocates nothing; scratch only grows */
static void test_moe_no_alloc(void) {
  tmoe t;
  tmoe_make(&t, 8, 64, 32, 64, 3, WK_MXFP4, WK_BF16, 5);
  int64_t T = 40, d = 64;
  float *x = xalloc((size_t)(T * d) * 4), *out = xalloc((size_t)(T * d) * 4), *w = xalloc((size_t)(T * 3) * 4);
  int32_t *ids = xalloc((size_t)(T * 3) * 4);
  fill_bf16(x, T * d, 8, 1);
  random_route(ids, w, T, 3, 8, 2, 0);
  TT_OK(moe_run(&t, out, x, ids, w, T));
  tide_alloc_stats a, b;
  tide_moe_stats st;
  TT_OK(tide_moe_stats_get(t.moe, &st));
  int64_t sb = st.scratch_bytes;
  tide_alloc_stats_get(&a);
  for (int64_t Ts = 1; Ts <= T; Ts += 13) TT_OK(moe_run(&t, out, x, ids, w, Ts));
  TT_OK(moe_run(&t, out, x, ids, w, T));
  tide_alloc_stats_get(&b);
  TT_CHECK(b.total_allocs == a.total_allocs, "%lld allocations in steady state", (long long)(b.total_allocs - a.total_allocs));
  TT_OK(tide_moe_stats_get(t.moe, &st));
  TT_CHECK(st.scratch_bytes == sb && sb > 0, "scratch changed %lld -> %lld", (long long)sb, (long long)st.scratch_bytes);
  free(x), free(out), free(w), free(ids);
  tmoe_free(&t);
}

static void test_moe_errors(void) {
  tmoe t;
  tmoe_make(&t, 4, 64, 32, 0, 2, WK_BF16, 0, 6);
  int64_t d = 64;
  float x[2 * 64], out[2 * 64], o2[2 * 64], w[4] = {1, 1, 1, 1};
  fill_bf16(x, 2 * d, 1, 1);
  int32_t ids[4] = {0, 1, 3, 4};
  for (int i = 0; i < 2 * 64; i++) out[i] = 7;
  TT_FAILS(moe_run(&t, out, x, ids, w, 2), TIDE_E_RANGE, "token 1 slot 1 selects expert 4, outside 0..3");
  int ok = 1;
  for (int i = 0; i < 2 * 64; i++) ok &= out[i] == 7;
  TT_CHECK(ok, "a failed step wrote its output");
  ids[3] = -1;
  TT_FAILS(moe_run(&t, out, x, ids, w, 2), TIDE_E_RANGE, "expert -1");
  ids[3] = 2;
  TT_OK(moe_run(&t, out, x, ids, w, 2));
  /* a wrong shape for an expert: rejected, the old expert stays */
  tweight bad[3];
  tweight_make(&bad[0], WK_BF16, 32, 64, 1, 0.1);
  tweight_make(&bad[1], WK_BF16, 64, 33, 2, 0.1);
  tweight_make(&bad[2], WK_BF16, 32, 64, 3, 0.1);
  TT_FAILS(tide_moe_set_expert(t.moe, 1, &bad[0].w, NULL, &bad[1].w, NULL, &bad[2].w, NULL), TIDE_E_INVALID,
           "expert 1 w2 is 64 x 33 (out x in), expected 64 x 32");
  TT_FAILS(tide_moe_set_expert(t.moe, 4, &bad[0].w, NULL, &bad[1].w, NULL, &bad[2].w, NULL), TIDE_E_RANGE, "expert 4");
  tweight q;
  tweight_make(&q, WK_MXFP4, 32, 64, 4, 0.1);
  TT_FAILS(tide_moe_set_expert(t.moe, 1, &q.w, NULL, &bad[1].w, NULL, &bad[2].w, NULL), TIDE_E_INVALID, "needs a scale");
  TT_OK(moe_run(&t, o2, x, ids, w, 2));
  TT_CHECK(!memcmp(o2, out, sizeof out), "a rejected set_expert changed the block");
  int32_t n_set, E;
  int64_t dim, inter, sinter;
  TT_OK(tide_moe_info(t.moe, &E, &dim, &inter, &sinter, &n_set));
  TT_CHECK(E == 4 && dim == 64 && inter == 32 && sinter == 0 && n_set == 4, "info %d %lld %lld %lld %d", E, (long long)dim,
           (long long)inter, (long long)sinter, n_set);
  /* an expert never set */
  tide_moe *m2;
  TT_OK(tide_moe_new(&m2, 3, 64, 32, 10.0f));
  TT_OK(tide_moe_set_expert(m2, 0, &t.ex[0].w, NULL, &t.ex[1].w, NULL, &t.ex[2].w, NULL));
  int32_t ids2[2] = {0, 2};
  tide_tensor ot = tview(out, TIDE_F32, 2, 1, d, 0), xt = tview(x, TIDE_F32, 2, 1, d, 0);
  tide_tensor it = tview(ids2, TIDE_I32, 2, 1, 2, 0), wt = tview(w, TIDE_F32, 2, 1, 2, 0);
  TT_FAILS(tide_moe_forward(m2, &ot, &xt, &it, &wt, 0), TIDE_E_STATE, "expert 2, which was never set");
  tide_tensor wt3 = tview(w, TIDE_F32, 2, 1, 3, 0);
  TT_FAILS(tide_moe_forward(m2, &ot, &xt, &it, &wt3, 0), TIDE_E_INVALID, "weights [1, 3]");
  tide_tensor xt2 = tview(x, TIDE_F32, 2, 1, 63, 0);
  TT_FAILS(tide_moe_forward(m2, &ot, &xt2, &it, &wt, 0), TIDE_E_INVALID, "x [1, 63] must be [T, 64]");
  tide_moe_free(m2);
  TT_FAILS(tide_moe_new(&m2, 0, 64, 32, 10.0f), TIDE_E_INVALID, "n_experts = 0");
  TT_FAILS(tide_moe_new(&m2, 2, 64, 32, 0.0f), TIDE_E_INVALID, "swiglu_limit");
  for (int j = 0; j < 3; j++) tweight_free(&bad[j]);
  tweight_free(&q);
  tmoe_free(&t);
}

/* ---------------- against refmodel.c ---------------- */

enum { MAXT = 256 };
typedef struct {
  int n;
  char name[MAXT][128];
  tide_tensor t[MAXT];
} tstore;

static int store_get(void *ctx, const char *name, tide_tensor *out) {
  tstore *s = ctx;
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->name[i], name)) return tide_tensor_ref(out, &s->t[i]);
  return TIDE_ERR(TIDE_E_IO, "test store has no tensor %s", name);
}
static tide_tensor *store_add(tstore *s, const char *name) {
  snprintf(s->name[s->n], sizeof s->name[0], "%s", name);
  memset(&s->t[s->n], 0, sizeof s->t[0]);
  return &s->t[s->n++];
}
static void store_vec(tstore *s, const char *name, int dtype, int nd, int64_t a, int64_t b, uint64_t seed, double mean,
                      double std) {
  tide_tensor *t = store_add(s, name);
  int64_t sh[2] = {a, b};
  TT_OK(tide_tensor_new(t, dtype, nd, sh));
  TT_OK(tide_tensor_rand(t, seed, TIDE_RAND_NORMAL, mean, std));
}
static void store_weight(tstore *s, const char *name, int kind, int64_t n, int64_t k, uint64_t seed, double std,
                         tweight *keep) {
  tweight w;
  tweight_make(&w, kind, n, k, seed, std);
  char nm[96];
  snprintf(nm, sizeof nm, "%s.weight", name);
  tide_tensor_ref(store_add(s, nm), &w.w);
  if (w.s.data) {
    snprintf(nm, sizeof nm, "%s.scale", name);
    tide_tensor_ref(store_add(s, nm), &w.s);
  }
  if (keep) *keep = w;
  else tweight_free(&w);
}
static tide_tensor *store_find(tstore *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->name[i], name)) return &s->t[i];
  return NULL;
}
static void store_free(tstore *s) {
  for (int i = 0; i < s->n; i++) tide_tensor_release(&s->t[i]);
}

/* A tiny 2-layer model: layer 0 routes by hash, layer 1 by score + bias;
 * MXFP4 routed experts, FP8 shared expert, SWA-only bf16 attention. */
typedef struct {
  refm_cfg cfg;
  tstore st;
  tide_moe *moe[2];
  tide_linear *gate[2], *head;
} tmodel;

static void tmodel_make(tmodel *M) {
  memset(M, 0, sizeof *M);
  refm_cfg *c = &M->cfg;
  c->vocab = 40, c->hidden = 64, c->max_pos = 64, c->n_layers = 2, c->n_heads = 2, c->q_lora = 32, c->o_lora = 32;
  c->o_groups = 1, c->window = 128, c->rope_theta = 10000, c->compress_rope_theta = 160000, c->index_topk = 512;
  c->n_experts = 8, c->topk = 3, c->n_shared = 1, c->inter = 32, c->n_hash_layers = 1, c->scoring = 0, c->norm_topk = 1;
  c->routed_scale = 1.5f, c->swiglu_limit = 10.0f, c->hc_mult = 4, c->sinkhorn_iters = 20, c->hc_eps = 1e-6f, c->eps = 1e-6f;
  int64_t d = c->hidden, hc = c->hc_mult, mix = (2 + hc) * hc, V = c->vocab, E = c->n_experts;
  tstore *s = &M->st;
  uint64_t seed = 1;
  store_vec(s, "embed.weight", TIDE_BF16, 2, V, d, seed++, 0, 1);
  store_vec(s, "norm.weight", TIDE_BF16, 1, d, 0, seed++, 1, 0.1);
  store_vec(s, "hc_head_fn", TIDE_F32, 2, hc, hc * d, seed++, 0, 0.05);
  store_vec(s, "hc_head_base", TIDE_F32, 1, hc, 0, seed++, 0, 0.5);
  store_vec(s, "hc_head_scale", TIDE_F32, 1, 1, 0, seed++, 1, 0.1);
  store_weight(s, "head", WK_BF16, V, d, seed++, 0.2, NULL);
  char nm[128];
  for (int L = 0; L < 2; L++) {
#define N(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    store_vec(s, N("layers.%d.attn_norm.weight", L), TIDE_BF16, 1, d, 0, seed++, 1, 0.1);
    store_vec(s, N("layers.%d.ffn_norm.weight", L), TIDE_BF16, 1, d, 0, seed++, 1, 0.1);
    const char *site[2] = {"attn", "ffn"};
    for (int j = 0; j < 2; j++) {
      store_vec(s, N("layers.%d.hc_%s_fn", L, site[j]), TIDE_F32, 2, mix, hc * d, seed++, 0, 0.05);
      store_vec(s, N("layers.%d.hc_%s_base", L, site[j]), TIDE_F32, 1, mix, 0, seed++, 0, 0.5);
      store_vec(s, N("layers.%d.hc_%s_scale", L, site[j]), TIDE_F32, 1, 3, 0, seed++, 1, 0.2);
    }
    store_weight(s, N("layers.%d.attn.wq_a", L), WK_BF16, c->q_lora, d, seed++, 0.15, NULL);
    store_vec(s, N("layers.%d.attn.q_norm.weight", L), TIDE_BF16, 1, c->q_lora, 0, seed++, 1, 0.1);
    store_weight(s, N("layers.%d.attn.wq_b", L), WK_BF16, 2 * 512, c->q_lora, seed++, 0.2, NULL);
    store_weight(s, N("layers.%d.attn.wkv", L), WK_BF16, 512, d, seed++, 0.15, NULL);
    store_vec(s, N("layers.%d.attn.kv_norm.weight", L), TIDE_BF16, 1, 512, 0, seed++, 1, 0.1);
    store_weight(s, N("layers.%d.attn.wo_a", L), WK_BF16, 32, 1024, seed++, 0.03, NULL);
    store_weight(s, N("layers.%d.attn.wo_b", L), WK_BF16, d, 32, seed++, 0.2, NULL);
    store_vec(s, N("layers.%d.attn.attn_sink", L), TIDE_F32, 1, 2, 0, seed++, 0, 1);
    tweight gw;
    store_weight(s, N("layers.%d.ffn.gate", L), WK_BF16, E, d, seed++, 0.3, &gw);
    TT_OK(tide_linear_new(&M->gate[L], &gw.w, NULL));
    tweight_free(&gw);
    if (L == 0) {
      tide_tensor *t = store_add(s, N("layers.%d.ffn.gate.tid2eid", L));
      int64_t sh[2] = {V, c->topk};
      TT_OK(tide_tensor_new(t, TIDE_I64, 2, sh));
      for (int64_t i = 0; i < V; i++)
        for (int j = 0; j < c->topk; j++) ((int64_t *)t->data)[i * c->topk + j] = (i * 5 + j * 3) % E;
    } else {
      store_vec(s, N("layers.%d.ffn.gate.bias", L), TIDE_F32, 1, E, 0, seed++, 0, 0.1);
    }
    TT_OK(tide_moe_new(&M->moe[L], (int32_t)E, d, c->inter, c->swiglu_limit));
    for (int e = 0; e < E; e++) {
      tweight w[3];
      store_weight(s, N("layers.%d.ffn.experts.%d.w1", L, e), WK_MXFP4, c->inter, d, seed++, 0.4, &w[0]);
      store_weight(s, N("layers.%d.ffn.experts.%d.w2", L, e), WK_MXFP4, d, c->inter, seed++, 0.3, &w[1]);
      store_weight(s, N("layers.%d.ffn.experts.%d.w3", L, e), WK_MXFP4, c->inter, d, seed++, 0.4, &w[2]);
      TT_OK(tide_moe_set_expert(M->moe[L], e, &w[0].w, &w[0].s, &w[1].w, &w[1].s, &w[2].w, &w[2].s));
      for (int j = 0; j < 3; j++) tweight_free(&w[j]);
    }
    tweight w[3];
    store_weight(s, N("layers.%d.ffn.shared_experts.w1", L), WK_FP8, c->inter, d, seed++, 0.3, &w[0]);
    store_weight(s, N("layers.%d.ffn.shared_experts.w2", L), WK_FP8, d, c->inter, seed++, 0.3, &w[1]);
    store_weight(s, N("layers.%d.ffn.shared_experts.w3", L), WK_FP8, c->inter, d, seed++, 0.3, &w[2]);
    TT_OK(tide_moe_set_shared(M->moe[L], &w[0].w, &w[0].s, &w[1].w, &w[1].s, &w[2].w, &w[2].s));
    for (int j = 0; j < 3; j++) tweight_free(&w[j]);
#undef N
  }
  TT_OK(tide_linear_new(&M->head, store_find(s, "head.weight"), NULL));
}

static void tmodel_free(tmodel *M) {
  for (int L = 0; L < 2; L++) {
    tide_moe_free(M->moe[L]);
    tide_linear_free(M->gate[L]);
  }
  tide_linear_free(M->head);
  store_free(&M->st);
}

/* routing + MoE of layer L for one token with tide's kernels */
static void tide_ffn(tmodel *M, int L, const float *x, int64_t id, float *out, int32_t *ids, float *wts) {
  refm_cfg *c = &M->cfg;
  int64_t d = c->hidden, E = c->n_experts;
  int k = c->topk;
  float logits[64];
  tide_tensor xt = tview((void *)x, TIDE_F32, 2, 1, d, 0), lt = tview(logits, TIDE_F32, 2, 1, E, 0);
  TT_OK(tide_linear_forward(M->gate[L], &lt, &xt, TIDE_BACKEND_AUTO));
  tide_tensor it = tview(ids, TIDE_I32, 2, 1, k, 0), wt = tview(wts, TIDE_F32, 2, 1, k, 0);
  tide_route_cfg rc = {c->scoring, c->norm_topk, c->routed_scale, 0};
  char nm[96];
  if (L < c->n_hash_layers) {
    snprintf(nm, sizeof nm, "layers.%d.ffn.gate.tid2eid", L);
    tide_tensor tok = tview(&id, TIDE_I64, 1, 1, 0, 0);
    TT_OK(tide_route_hash(&it, &wt, &lt, &tok, store_find(&M->st, nm), &rc));
  } else {
    snprintf(nm, sizeof nm, "layers.%d.ffn.gate.bias", L);
    TT_OK(tide_route_topk(&it, &wt, &lt, store_find(&M->st, nm), &rc));
  }
  tide_tensor ot = tview(out, TIDE_F32, 2, 1, d, 0);
  TT_OK(tide_moe_forward(M->moe[L], &ot, &xt, &it, &wt, TIDE_OPS_ROUND_BF16));
}

/* refm_moe and tide's routing + block on the same inputs: the same expert
 * ids, the same weights, the same outputs up to f32-vs-double noise */
static void test_moe_vs_refmodel(void) {
  tmodel M;
  tmodel_make(&M);
  refm *rm;
  TT_OK(refm_new(&rm, &M.cfg, store_get, &M.st));
  if (!rm) {
    tmodel_free(&M);
    return;
  }
  int64_t d = M.cfg.hidden;
  int k = M.cfg.topk;
  float x[64], a[64], b[64], wts[8];
  int32_t ids[8];
  int same_ids = 0, n = 0;
  double worst = 0, wdiff = 0;
  for (int L = 0; L < 2; L++)
    for (int t = 0; t < 24; t++) {
      fill_bf16(x, d, 900 + 31 * L + t, 1.0);
      int64_t tok = (t * 7) % M.cfg.vocab;
      TT_OK(refm_moe(rm, L, x, tok, t, a));
      tide_ffn(&M, L, x, tok, b, ids, wts);
      n++;
      same_ids += !memcmp(ids, rm->last_route, (size_t)k * 4);
      for (int i = 0; i < k; i++) wdiff = fmax(wdiff, fabs(wts[i] - rm->last_wts[i]));
      double e = nmse(b, a, d);
      if (e > worst) worst = e;
    }
  TT_CHECK(same_ids == n, "expert ids agree on %d of %d tokens", same_ids, n);
  TT_CHECK(wdiff <= 1e-6, "weights differ by %g", wdiff);
  TT_CHECK(worst < 1e-5, "MoE output nmse up to %g against refm_moe", worst);
  printf("  refm_moe: ids equal on %d/%d tokens, weights within %g, output nmse <= %g\n", same_ids, n, wdiff, worst);
  refm_free(rm);
  tmodel_free(&M);
}

/* A forward pass with tide's embed, hc_pre, rmsnorm, hc_post, routing, MoE
 * and hc_head around the reference attention, against refm_forward_token. */
static void test_forward_vs_refmodel(void) {
  tmodel M;
  tmodel_make(&M);
  refm *r1, *r2;
  TT_OK(refm_new(&r1, &M.cfg, store_get, &M.st));
  TT_OK(refm_new(&r2, &M.cfg, store_get, &M.st));
  const refm_cfg *c = &M.cfg;
  int64_t d = c->hidden, hc = c->hc_mult, V = c->vocab;
  int k = c->topk;
  float X[4 * 64], x[64], a[64], ref_out[64], post[4], comb[16], logits[40], want[40], wts[8];
  int32_t ids[8];
  tide_tensor Xt = tview(X, TIDE_F32, 3, 1, hc, d), xt = tview(x, TIDE_F32, 2, 1, d, 0), at = tview(a, TIDE_F32, 2, 1, d, 0);
  tide_tensor pt = tview(post, TIDE_F32, 2, 1, hc, 0), ct = tview(comb, TIDE_F32, 3, 1, hc, hc);
  tide_hc_cfg hcfg = {c->sinkhorn_iters, TIDE_OPS_ROUND_BF16, c->eps, c->hc_eps};
  char nm[96];
  int64_t tokens[6] = {3, 17, 5, 39, 0, 17};
  double worst_cos = 1, worst_moe = 0;
  int same = 0, nroute = 0;
  for (int p = 0; p < 6; p++) {
    int64_t id = tokens[p];
    TT_OK(refm_forward_token(r1, id, want));
    tide_tensor idt = tview(&id, TIDE_I64, 1, 1, 0, 0);
    TT_OK(tide_embed(&Xt, store_find(&M.st, "embed.weight"), &idt));
    for (int L = 0; L < 2; L++) {
      for (int site = 0; site < 2; site++) {
        const char *sn = site ? "ffn" : "attn";
        snprintf(nm, sizeof nm, "layers.%d.hc_%s_fn", L, sn);
        tide_tensor *fn = store_find(&M.st, nm);
        snprintf(nm, sizeof nm, "layers.%d.hc_%s_scale", L, sn);
        tide_tensor *sc = store_find(&M.st, nm);
        snprintf(nm, sizeof nm, "layers.%d.hc_%s_base", L, sn);
        TT_OK(tide_hc_pre(&xt, &pt, &ct, &Xt, fn, sc, store_find(&M.st, nm), &hcfg));
        snprintf(nm, sizeof nm, "layers.%d.%s_norm.weight", L, sn);
        TT_OK(tide_rmsnorm(&xt, &xt, store_find(&M.st, nm), c->eps, TIDE_OPS_ROUND_BF16));
        if (!site) {
          TT_OK(refm_attn(r2, L, x, p, a));
        } else {
          tide_ffn(&M, L, x, id, a, ids, wts);
          TT_OK(refm_moe(r2, L, x, id, p, ref_out)); /* the reference on tide's own input */
          nroute++;
          same += !memcmp(ids, r2->last_route, (size_t)k * 4);
          double e = nmse(a, ref_out, d);
          if (e > worst_moe) worst_moe = e;
        }
        TT_OK(tide_hc_post(&Xt, &at, &Xt, &pt, &ct, TIDE_OPS_ROUND_BF16));
      }
    }
    TT_OK(tide_hc_head(&xt, &Xt, store_find(&M.st, "hc_head_fn"), store_find(&M.st, "hc_head_scale"), store_find(&M.st, "hc_head_base"), &hcfg));
    TT_OK(tide_rmsnorm(&xt, &xt, store_find(&M.st, "norm.weight"), c->eps, TIDE_OPS_ROUND_BF16));
    tide_tensor lt = tview(logits, TIDE_F32, 2, 1, V, 0);
    TT_OK(tide_linear_forward(M.head, &lt, &xt, TIDE_BACKEND_AUTO));
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < V; i++) dot += (double)logits[i] * want[i], na += (double)logits[i] * logits[i], nb += (double)want[i] * want[i];
    double cs = dot / sqrt(na * nb);
    if (cs < worst_cos) worst_cos = cs;
  }
  TT_CHECK(same == nroute, "routing agrees with refm_moe on %d of %d (token, layer) pairs", same, nroute);
  TT_CHECK(worst_moe < 1e-5, "MoE nmse %g against refm_moe in the forward pass", worst_moe);
  TT_CHECK(worst_cos > 0.99999, "logits cosine %.6f against refm_forward_token", worst_cos);
  printf("  forward with tide's mHC/norm/routing/MoE: logits cosine >= %.7f against refm_forward_token\n", worst_cos);
  refm_free(r1);
  refm_free(r2);
  tmodel_free(&M);
}

/* The pieces expert parallelism runs (engine/mpi/): the routed rows in any
 * grouping (tide_moe_rows, on a block holding only some experts), the shared
 * expert alone and the per-token combine give tide_moe_forward bit for bit. */
static void test_moe_split(void) {
  for (size_t v = 0; v < sizeof VARIANTS / sizeof VARIANTS[0]; v++) {
    const variant *V = &VARIANTS[v];
    tmoe t;
    tmoe_make(&t, V->E, V->d, V->inter, V->sinter, V->k, V->rkind, V->skind, 300 + v);
    int64_t T = 23, d = V->d, k = V->k, R = T * k;
    float *x = xalloc((size_t)(T * d) * 4), *out = xalloc((size_t)(T * d) * 4), *got = xalloc((size_t)(T * d) * 4);
    float *rows = xalloc((size_t)(R * d) * 4), *xr = xalloc((size_t)(R * d) * 4), *sy = xalloc((size_t)(T * d) * 4);
    int32_t *ids = xalloc((size_t)R * 4), *rid = xalloc((size_t)R * 4);
    float *w = xalloc((size_t)R * 4);
    trng r = {77 + v};
    for (int64_t i = 0; i < T * d; i++) x[i] = bf16v((float)(trng_unif(&r) * 2 - 1));
    random_route(ids, w, T, (int)k, V->E, 900 + v, 0);
    TT_OK(moe_run(&t, out, x, ids, w, T));
    /* a second block holding only the odd experts computes the odd rows,
     * the full block the even ones, each in reverse (t, i) order */
    tide_moe *odd = NULL;
    TT_OK(tide_moe_new(&odd, V->E, d, V->inter, t.lim));
    for (int32_t e = 1; e < V->E; e += 2) {
      tweight *q = t.ex + 3 * e;
      TT_OK(tide_moe_set_expert(odd, e, &q[0].w, &q[0].s, &q[1].w, &q[1].s, &q[2].w, &q[2].s));
    }
    for (int par = 0; par < 2; par++) {
      int64_t n = 0;
      for (int64_t j = R - 1; j >= 0; j--)
        if (ids[j] % 2 == par) {
          memcpy(xr + n * d, x + (j / k) * d, (size_t)d * 4);
          rid[n++] = ids[j];
        }
      TT_OK(tide_moe_rows(par ? odd : t.moe, xr, xr, rid, n));
      for (int64_t j = R - 1, c = 0; j >= 0; j--)
        if (ids[j] % 2 == par) memcpy(rows + j * d, xr + (c++) * d, (size_t)d * 4);
    }
    if (V->sinter > 0) TT_OK(tide_moe_shared_rows(t.moe, sy, x, d, T));
    for (int64_t tk = 0; tk < T; tk++) {
      const float *ys[64];
      for (int64_t i = 0; i < k; i++) ys[i] = rows + (tk * k + i) * d;
      tide_moe_combine_rows(got + tk * d, ys, w + tk * k, (int)k, V->sinter > 0 ? sy + tk * d : NULL, d,
                            TIDE_OPS_ROUND_BF16);
    }
    TT_CHECK(!memcmp(got, out, (size_t)(T * d) * 4), "%s: rows + shared + combine differ from tide_moe_forward", V->name);
    /* a row of an expert the block does not hold, and a bad id */
    int32_t bad = 0;
    TT_FAILS(tide_moe_rows(odd, xr, x, &bad, 1), TIDE_E_STATE, "expert 0, which this block does not hold");
    bad = V->E;
    TT_FAILS(tide_moe_rows(odd, xr, x, &bad, 1), TIDE_E_RANGE, "outside");
    if (V->sinter == 0) TT_FAILS(tide_moe_shared_rows(t.moe, sy, x, d, T), TIDE_E_STATE, "no shared expert");
    TT_OK(tide_moe_rows(odd, xr, x, rid, 0));
    tide_moe_free(odd);
    free(x), free(out), free(got), free(rows), free(xr), free(sy), free(ids), free(rid), free(w);
    tmoe_free(&t);
  }
}

static void test_no_leaks(void) {
  tide_alloc_stats st;
  tide_alloc_stats_get(&st);
  TT_CHECK(st.live_allocs == 0 && st.live_storages == 0, "%lld allocations, %lld storages still live",
           (long long)st.live_allocs, (long long)st.live_storages);
}

TT_RUN(TT(test_moe_vs_scalar), TT(test_moe_invariance), TT(test_moe_no_alloc), TT(test_moe_errors), TT(test_moe_split),
       TT(test_moe_vs_refmodel), TT(test_forward_vs_refmodel), TT(test_no_leaks))
