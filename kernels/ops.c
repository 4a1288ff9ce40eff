/* ops.c - the entry points of tide/ops.h: argument checks, the split of rows
 * over threads, and the small per-token scalar steps both kernel paths share
 * (mHC sigmoids and Sinkhorn, expert scoring and top-k). The row kernels
 * themselves are in ref/ops_ref.c and x86/ops_avx2.c. */
#include <math.h>
#include <stdio.h>

#include "ops_kernels.h"

const tide_ops_kernels *tide_ops_kernels_get(void) {
#if defined(__x86_64__)
  if (tide_use_avx2()) return &tide_ops_avx2;
#endif
  return &tide_ops_ref;
}

/* Work (in float operations, roughly) below which a call stays on one
 * thread: entering a parallel region costs about a microsecond. */
enum { PAR_MIN = 1 << 15 };

/* ---- argument helpers ---- */

/* An f32 tensor seen as rows: rows x n floats, row r at p + r * ld. */
typedef struct {
  float *p;
  int64_t rows, n, ld;
} rows_t;

static int as_rows(const char *fn, const char *what, const tide_tensor *t, int write, rows_t *out) {
  TIDE_CHECK(tide_check_tensor(fn, what, t, TIDE_DT(TIDE_F32), -1));
  char b[96];
  if (write && t->readonly) return tide_errorf(TIDE_E_INVALID, fn, "%s is read-only", what);
  int nd = t->ndim;
  out->p = t->data;
  out->n = nd ? t->sizes[nd - 1] : 1;
  out->rows = 1;
  out->ld = out->n;
  if (nd && out->n > 1 && t->strides[nd - 1] != 1)
    return tide_errorf(TIDE_E_INVALID, fn, "%s %s must have a contiguous last dim (stride %lld)", what,
                       tide_shape_str(t, b, sizeof b), (long long)t->strides[nd - 1]);
  int64_t expect = -1;
  for (int i = nd - 2; i >= 0; i--) {
    int64_t sz = t->sizes[i];
    out->rows *= sz;
    if (sz == 1) continue;
    if (expect < 0) {
      if (t->strides[i] < out->n)
        return tide_errorf(TIDE_E_INVALID, fn, "%s %s: row stride %lld is below the row length %lld", what,
                           tide_shape_str(t, b, sizeof b), (long long)t->strides[i], (long long)out->n);
      out->ld = t->strides[i];
      expect = out->ld * sz;
    } else {
      if (t->strides[i] != expect)
        return tide_errorf(TIDE_E_INVALID, fn, "%s %s: leading dims do not form rows at one stride", what,
                           tide_shape_str(t, b, sizeof b));
      expect *= sz;
    }
  }
  return TIDE_OK;
}

static int same_shape(const tide_tensor *a, const tide_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return 0;
  return 1;
}

/* A contiguous tensor of dtype in mask with exactly these sizes (ndim given). */
static int want_exact(const char *fn, const char *what, const tide_tensor *t, unsigned mask, int nd, const int64_t *sz,
                      int write) {
  TIDE_CHECK(tide_check_tensor(fn, what, t, mask, -1));
  char b[96];
  int ok = t->ndim == nd && tide_tensor_is_contiguous(t);
  for (int i = 0; ok && i < nd; i++) ok = t->sizes[i] == sz[i];
  if (!ok) {
    char w[96];
    size_t o = (size_t)snprintf(w, sizeof w, "[");
    for (int i = 0; i < nd; i++) o += (size_t)snprintf(w + o, sizeof w - o, "%s%lld", i ? ", " : "", (long long)sz[i]);
    snprintf(w + o, sizeof w - o, "]");
    return tide_errorf(TIDE_E_INVALID, fn, "%s has shape %s%s, expected %s contiguous", what,
                       tide_shape_str(t, b, sizeof b), tide_tensor_is_contiguous(t) ? "" : " (strided)", w);
  }
  if (write && t->readonly) return tide_errorf(TIDE_E_INVALID, fn, "%s is read-only", what);
  return TIDE_OK;
}

static int bad_rows(const char *fn, const char *what, const rows_t *r, int64_t rows, int64_t n) {
  return tide_errorf(TIDE_E_INVALID, fn, "%s has %lld rows of %lld, expected %lld rows of %lld", what,
                     (long long)r->rows, (long long)r->n, (long long)rows, (long long)n);
}

/* ---- RMSNorm ---- */

int tide_rmsnorm(tide_tensor *out, const tide_tensor *x, const tide_tensor *w, float eps, int flags) {
  rows_t xr, orow;
  TIDE_CHECK(as_rows(__func__, "x", x, 0, &xr));
  TIDE_CHECK(as_rows(__func__, "out", out, 1, &orow));
  if (!same_shape(x, out)) {
    char a[96], b[96];
    return TIDE_ERR(TIDE_E_INVALID, "out %s and x %s must have the same shape", tide_shape_str(out, a, sizeof a),
                    tide_shape_str(x, b, sizeof b));
  }
  if (!(eps >= 0) || isinf(eps)) return TIDE_ERR(TIDE_E_INVALID, "eps %g must be finite and >= 0", (double)eps);
  int wkind = TIDE_OPSW_NONE;
  const void *wp = NULL;
  if (w) {
    int64_t n = xr.n;
    TIDE_CHECK(want_exact(__func__, "w", w, TIDE_DT(TIDE_F32) | TIDE_DT(TIDE_BF16), 1, &n, 0));
    wkind = w->dtype == TIDE_F32 ? TIDE_OPSW_F32 : TIDE_OPSW_BF16;
    wp = w->data;
  }
  const tide_ops_kernels *K = tide_ops_kernels_get();
  int64_t R = xr.rows, n = xr.n;
  int round = (flags & TIDE_OPS_ROUND_BF16) != 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (R > 1 && R * n > PAR_MIN)
#endif
  for (int64_t r = 0; r < R; r++) {
    const float *xp = xr.p + r * xr.ld;
    float rs = (float)(1.0 / sqrt(K->sumsq(xp, n) / (double)n + eps));
    K->scale_row(orow.p + r * orow.ld, xp, rs, wp, wkind, n, round);
  }
  return TIDE_OK;
}

/* ---- rounding ---- */

static void round_any(const tide_ops_kernels *K, char *p, const tide_tensor *t, int dim) {
  if (dim == t->ndim - 1 && t->strides[dim] == 1) {
    K->round((float *)(void *)p, t->sizes[dim]);
    return;
  }
  if (dim >= t->ndim) {
    float *f = (float *)(void *)p;
    *f = tide_round_bf16(*f);
    return;
  }
  for (int64_t i = 0; i < t->sizes[dim]; i++) round_any(K, p + i * t->strides[dim] * 4, t, dim + 1);
}

int tide_ops_round_bf16(tide_tensor *t) {
  TIDE_CHECK(tide_check_tensor(__func__, "t", t, TIDE_DT(TIDE_F32), -1));
  if (t->readonly) return TIDE_ERR(TIDE_E_INVALID, "t is read-only");
  if (tide_tensor_numel(t) == 0) return TIDE_OK;
  const tide_ops_kernels *K = tide_ops_kernels_get();
  if (tide_tensor_is_contiguous(t)) {
    K->round(t->data, tide_tensor_numel(t));
    return TIDE_OK;
  }
  round_any(K, t->data, t, 0);
  return TIDE_OK;
}

/* ---- embedding ---- */

static int64_t id_at(const tide_tensor *ids, int64_t i) {
  return ids->dtype == TIDE_I64 ? ((const int64_t *)ids->data)[i] : ((const int32_t *)ids->data)[i];
}

int tide_embed(tide_tensor *out, const tide_tensor *table, const tide_tensor *ids) {
  TIDE_CHECK(tide_check_tensor(__func__, "table", table, TIDE_DT(TIDE_F32) | TIDE_DT(TIDE_BF16), 2));
  TIDE_CHECK(tide_check_tensor(__func__, "ids", ids, TIDE_DT(TIDE_I32) | TIDE_DT(TIDE_I64), 1));
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, TIDE_DT(TIDE_F32), -1));
  char a[96], b[96];
  if (!tide_tensor_is_contiguous(ids)) return TIDE_ERR(TIDE_E_INVALID, "ids must be contiguous");
  int64_t V = table->sizes[0], d = table->sizes[1], T = ids->sizes[0];
  if (d > 1 && table->strides[1] != 1) return TIDE_ERR(TIDE_E_INVALID, "table rows must be contiguous");
  int64_t ldt = table->strides[0];
  if (out->ndim != 2 && out->ndim != 3)
    return TIDE_ERR(TIDE_E_INVALID, "out %s must be [T, d] or [T, hc, d]", tide_shape_str(out, a, sizeof a));
  int64_t hc = out->ndim == 3 ? out->sizes[1] : 1;
  rows_t orow;
  TIDE_CHECK(as_rows(__func__, "out", out, 1, &orow));
  if (out->sizes[0] != T || orow.n != d)
    return TIDE_ERR(TIDE_E_INVALID, "out %s does not fit %lld ids of a table %s", tide_shape_str(out, a, sizeof a),
                    (long long)T, tide_shape_str(table, b, sizeof b));
  for (int64_t t = 0; t < T; t++) {
    int64_t id = id_at(ids, t);
    if (id < 0 || id >= V)
      return TIDE_ERR(TIDE_E_RANGE, "token id %lld at position %lld is outside the vocabulary of %lld", (long long)id,
                      (long long)t, (long long)V);
  }
  const tide_ops_kernels *K = tide_ops_kernels_get();
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && T * hc * d > PAR_MIN)
#endif
  for (int64_t t = 0; t < T; t++) {
    int64_t id = id_at(ids, t);
    float *dst = orow.p + t * hc * orow.ld;
    if (table->dtype == TIDE_BF16) K->bf16_row(dst, (const uint16_t *)table->data + id * ldt, d);
    else memcpy(dst, (const float *)table->data + id * ldt, (size_t)d * sizeof(float));
    for (int64_t s = 1; s < hc; s++) memcpy(dst + s * orow.ld, dst, (size_t)d * sizeof(float));
  }
  return TIDE_OK;
}

/* ---- mHC ---- */

static float sigm(float v) { return 1.0f / (1.0f + expf(-v)); }

/* X as [T, hc, d] with contiguous streams: the token stride. */
static int hc_input(const char *fn, const char *what, const tide_tensor *X, int write, int64_t *T, int *hc,
                    int64_t *d, int64_t *ld) {
  TIDE_CHECK(tide_check_tensor(fn, what, X, TIDE_DT(TIDE_F32), 3));
  char b[96];
  if (write && X->readonly) return tide_errorf(TIDE_E_INVALID, fn, "%s is read-only", what);
  *T = X->sizes[0];
  *d = X->sizes[2];
  int64_t h = X->sizes[1];
  if (h < 2 || h > TIDE_HC_MAX)
    return tide_errorf(TIDE_E_UNSUPPORTED, fn, "%s %s: hc = %lld streams, supported 2..%d", what,
                       tide_shape_str(X, b, sizeof b), (long long)h, TIDE_HC_MAX);
  *hc = (int)h;
  if ((*d > 1 && X->strides[2] != 1) || X->strides[1] != *d)
    return tide_errorf(TIDE_E_INVALID, fn, "%s %s must hold each token's %lld x %lld values contiguously", what,
                       tide_shape_str(X, b, sizeof b), (long long)h, (long long)*d);
  *ld = *T > 1 ? X->strides[0] : h * *d;
  if (*ld < h * *d)
    return tide_errorf(TIDE_E_INVALID, fn, "%s %s: token stride %lld is below hc*d = %lld", what,
                       tide_shape_str(X, b, sizeof b), (long long)*ld, (long long)(h * *d));
  return TIDE_OK;
}

static int hc_cfg_check(const char *fn, const tide_hc_cfg *cfg, int need_iters) {
  if (!cfg) return tide_errorf(TIDE_E_INVALID, fn, "NULL cfg");
  if (need_iters && (cfg->iters < 1 || cfg->iters > 1000))
    return tide_errorf(TIDE_E_INVALID, fn, "cfg.iters = %d, expected 1..1000", cfg->iters);
  if (!(cfg->rms_eps >= 0) || isinf(cfg->rms_eps) || !(cfg->hc_eps >= 0) || isinf(cfg->hc_eps))
    return tide_errorf(TIDE_E_INVALID, fn, "cfg eps values (rms %g, hc %g) must be finite and >= 0",
                       (double)cfg->rms_eps, (double)cfg->hc_eps);
  return TIDE_OK;
}

/* Per-token tail of hc_pre, from the raw products mraw[mix] and the sum of
 * squares: pre[hc], post[hc], comb[hc*hc] (doc 2.1). */
static void hc_pre_token(const float *mraw, double ss, int64_t n, int hc, const float *scale, const float *base,
                         const tide_hc_cfg *cfg, float *pre, float *post, float *comb) {
  int mix = (2 + hc) * hc;
  double rho = 1.0 / sqrt(ss / (double)n + cfg->rms_eps);
  float m[TIDE_HC_MIX_MAX];
  for (int r = 0; r < mix; r++) m[r] = (float)((double)mraw[r] * rho);
  float s0 = scale[0], s1 = scale[1], s2 = scale[2];
  for (int i = 0; i < hc; i++) {
    pre[i] = sigm(s0 * m[i] + base[i]) + cfg->hc_eps;
    post[i] = 2.0f * sigm(s1 * m[hc + i] + base[hc + i]);
  }
  /* Sinkhorn in double: row softmax + eps, column normalisation, then
   * (iters - 1) rounds of row and column normalisation */
  double C[TIDE_HC_MAX][TIDE_HC_MAX];
  double eps = cfg->hc_eps;
  for (int i = 0; i < hc; i++) {
    double mx = -INFINITY, z = 0;
    for (int j = 0; j < hc; j++) {
      C[i][j] = (double)(s2 * m[2 * hc + i * hc + j] + base[2 * hc + i * hc + j]);
      mx = fmax(mx, C[i][j]);
    }
    for (int j = 0; j < hc; j++) z += exp(C[i][j] - mx);
    for (int j = 0; j < hc; j++) C[i][j] = exp(C[i][j] - mx) / z + eps;
  }
  for (int it = 0; it < cfg->iters; it++) {
    if (it > 0)
      for (int i = 0; i < hc; i++) {
        double rs = 0;
        for (int j = 0; j < hc; j++) rs += C[i][j];
        for (int j = 0; j < hc; j++) C[i][j] /= rs + eps;
      }
    for (int j = 0; j < hc; j++) {
      double cs = 0;
      for (int i = 0; i < hc; i++) cs += C[i][j];
      for (int i = 0; i < hc; i++) C[i][j] /= cs + eps;
    }
  }
  for (int i = 0; i < hc; i++)
    for (int j = 0; j < hc; j++) comb[i * hc + j] = (float)C[i][j];
}

/* Tokens per pass of the mixing product; fn rows per work item. */
enum { HC_CHUNK = 32, HC_ROWS = 4 };

/* The shared driver of hc_pre (head = 0) and hc_head (head = 1): the mixing
 * product of a chunk of tokens, split over (row group, token pair) items, then
 * the per-token tail, all inside one parallel region. */
static void hc_run(int head, const float *X, int64_t ldX, int64_t T, int hc, int64_t d, const float *fn,
                   const float *scale, const float *base, const tide_hc_cfg *cfg, float *x, int64_t ldx, float *post,
                   float *comb) {
  const tide_ops_kernels *K = tide_ops_kernels_get();
  int64_t n = (int64_t)hc * d;
  int mix = head ? hc : (2 + hc) * hc;
  int round = (cfg->flags & TIDE_OPS_ROUND_BF16) != 0;
  float mbuf[HC_CHUNK * TIDE_HC_MIX_MAX];
  int ngroup = (mix + HC_ROWS - 1) / HC_ROWS;
#ifdef _OPENMP
#pragma omp parallel if (T * n * mix > 4 * PAR_MIN)
#endif
  for (int64_t c0 = 0; c0 < T; c0 += HC_CHUNK) {
    int nt = (int)(T - c0 < HC_CHUNK ? T - c0 : HC_CHUNK);
    int ntile = (nt + 1) / 2;
    int64_t items = (int64_t)ngroup * ntile;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t it = 0; it < items; it++) {
      int g = (int)(it / ntile), tl = (int)(it % ntile);
      int t0 = 2 * tl, tn = nt - t0 < 2 ? nt - t0 : 2;
      int r0 = g * HC_ROWS, rn = mix - r0 < HC_ROWS ? mix - r0 : HC_ROWS;
      K->mix(mbuf + t0 * TIDE_HC_MIX_MAX + r0, TIDE_HC_MIX_MAX, X + (c0 + t0) * ldX, ldX, tn, fn + r0 * n, n, rn, n);
    }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int t = 0; t < nt; t++) {
      const float *z = X + (c0 + t) * ldX;
      double ss = K->sumsq(z, n);
      float *xt = x + (c0 + t) * ldx;
      if (!head) {
        float pre[TIDE_HC_MAX];
        hc_pre_token(mbuf + t * TIDE_HC_MIX_MAX, ss, n, hc, scale, base, cfg, pre, post + (c0 + t) * hc,
                     comb + (c0 + t) * hc * hc);
        K->wsum(xt, z, pre, hc, d, round);
      } else {
        double rho = 1.0 / sqrt(ss / (double)n + cfg->rms_eps);
        float g[TIDE_HC_MAX];
        for (int i = 0; i < hc; i++)
          g[i] = sigm(scale[0] * (float)((double)mbuf[t * TIDE_HC_MIX_MAX + i] * rho) + base[i]) + cfg->hc_eps;
        K->wsum(xt, z, g, hc, d, round);
      }
    }
  }
}

int tide_hc_pre(tide_tensor *x, tide_tensor *post, tide_tensor *comb, const tide_tensor *X, const tide_tensor *fn,
                const tide_tensor *scale, const tide_tensor *base, const tide_hc_cfg *cfg) {
  int64_t T, d, ldX;
  int hc;
  TIDE_CHECK(hc_cfg_check(__func__, cfg, 1));
  TIDE_CHECK(hc_input(__func__, "X", X, 0, &T, &hc, &d, &ldX));
  int64_t mix = (2 + hc) * hc, n = hc * d;
  const unsigned f32 = TIDE_DT(TIDE_F32);
  int64_t s_fn[2] = {mix, n}, s3 = 3, s_post[2] = {T, hc}, s_comb[3] = {T, hc, hc};
  TIDE_CHECK(want_exact(__func__, "fn", fn, f32, 2, s_fn, 0));
  TIDE_CHECK(want_exact(__func__, "scale", scale, f32, 1, &s3, 0));
  TIDE_CHECK(want_exact(__func__, "base", base, f32, 1, &mix, 0));
  TIDE_CHECK(want_exact(__func__, "post", post, f32, 2, s_post, 1));
  TIDE_CHECK(want_exact(__func__, "comb", comb, f32, 3, s_comb, 1));
  rows_t xr;
  TIDE_CHECK(as_rows(__func__, "x", x, 1, &xr));
  if (xr.rows != T || xr.n != d) return bad_rows(__func__, "x", &xr, T, d);
  if (T == 0) return TIDE_OK;
  hc_run(0, X->data, ldX, T, hc, d, fn->data, scale->data, base->data, cfg, xr.p, xr.ld, post->data, comb->data);
  return TIDE_OK;
}

int tide_hc_head(tide_tensor *y, const tide_tensor *X, const tide_tensor *fn, const tide_tensor *scale,
                 const tide_tensor *base, const tide_hc_cfg *cfg) {
  int64_t T, d, ldX;
  int hc;
  TIDE_CHECK(hc_cfg_check(__func__, cfg, 0));
  TIDE_CHECK(hc_input(__func__, "X", X, 0, &T, &hc, &d, &ldX));
  int64_t n = hc * d, h = hc, s1 = 1;
  const unsigned f32 = TIDE_DT(TIDE_F32);
  int64_t s_fn[2] = {hc, n};
  TIDE_CHECK(want_exact(__func__, "fn", fn, f32, 2, s_fn, 0));
  TIDE_CHECK(want_exact(__func__, "scale", scale, f32, 1, &s1, 0));
  TIDE_CHECK(want_exact(__func__, "base", base, f32, 1, &h, 0));
  rows_t yr;
  TIDE_CHECK(as_rows(__func__, "y", y, 1, &yr));
  if (yr.rows != T || yr.n != d) return bad_rows(__func__, "y", &yr, T, d);
  if (T == 0) return TIDE_OK;
  hc_run(1, X->data, ldX, T, hc, d, fn->data, scale->data, base->data, cfg, yr.p, yr.ld, NULL, NULL);
  return TIDE_OK;
}

int tide_hc_post(tide_tensor *out, const tide_tensor *a, const tide_tensor *X, const tide_tensor *post,
                 const tide_tensor *comb, int flags) {
  int64_t T, d, ldX, To, dO, ldO;
  int hc, hco;
  TIDE_CHECK(hc_input(__func__, "X", X, 0, &T, &hc, &d, &ldX));
  TIDE_CHECK(hc_input(__func__, "out", out, 1, &To, &hco, &dO, &ldO));
  char b1[96], b2[96];
  if (To != T || hco != hc || dO != d)
    return TIDE_ERR(TIDE_E_INVALID, "out %s and X %s must have the same shape", tide_shape_str(out, b1, sizeof b1),
                    tide_shape_str(X, b2, sizeof b2));
  const unsigned f32 = TIDE_DT(TIDE_F32);
  int64_t s_post[2] = {T, hc}, s_comb[3] = {T, hc, hc};
  TIDE_CHECK(want_exact(__func__, "post", post, f32, 2, s_post, 0));
  TIDE_CHECK(want_exact(__func__, "comb", comb, f32, 3, s_comb, 0));
  rows_t ar;
  TIDE_CHECK(as_rows(__func__, "a", a, 0, &ar));
  if (ar.rows != T || ar.n != d) return bad_rows(__func__, "a", &ar, T, d);
  const tide_ops_kernels *K = tide_ops_kernels_get();
  int round = (flags & TIDE_OPS_ROUND_BF16) != 0;
  float *op = out->data;
  const float *xp = X->data, *pp = post->data, *cp = comb->data;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && T * hc * d > PAR_MIN)
#endif
  for (int64_t t = 0; t < T; t++)
    K->post(op + t * ldO, ar.p + t * ar.ld, xp + t * ldX, pp + t * hc, cp + t * hc * hc, hc, d, round);
  return TIDE_OK;
}

/* ---- routing ---- */

enum { ROUTE_MAX_E = 4096, ROUTE_MAX_K = 64 };

/* s_e = score(l_e) for one token, in double and stored f32. */
static void route_scores(float *sc, const float *l, int64_t E, int scoring) {
  if (scoring == TIDE_SCORE_SOFTMAX) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
    double z = 0;
    for (int64_t e = 0; e < E; e++) z += exp((double)l[e] - mx);
    for (int64_t e = 0; e < E; e++) sc[e] = (float)(exp((double)l[e] - mx) / z);
  } else if (scoring == TIDE_SCORE_SIGMOID) {
    for (int64_t e = 0; e < E; e++) sc[e] = sigm(l[e]);
  } else {
    for (int64_t e = 0; e < E; e++) {
      double v = l[e];
      double sp = v > 20 ? v : log1p(exp(v));
      sc[e] = (float)sqrt(sp);
    }
  }
}

/* w_i = s_{e_i} (/ sum) * scale, in double */
static void route_weights(float *w, const int32_t *ids, const float *sc, int k, const tide_route_cfg *cfg) {
  double sum = 0;
  for (int i = 0; i < k; i++) sum += sc[ids[i]];
  for (int i = 0; i < k; i++)
    w[i] = (float)((cfg->norm_topk ? sc[ids[i]] / sum : (double)sc[ids[i]]) * cfg->routed_scale);
}

static int route_common(const char *fn, tide_tensor *ids, tide_tensor *weights, const tide_tensor *logits,
                        const tide_route_cfg *cfg, rows_t *lr, int64_t *k) {
  if (!cfg) return tide_errorf(TIDE_E_INVALID, fn, "NULL cfg");
  if (cfg->scoring < TIDE_SCORE_SQRTSOFTPLUS || cfg->scoring > TIDE_SCORE_SOFTMAX)
    return tide_errorf(TIDE_E_INVALID, fn, "cfg.scoring = %d is not a TIDE_SCORE_* value", cfg->scoring);
  if (!isfinite(cfg->routed_scale)) return tide_errorf(TIDE_E_INVALID, fn, "cfg.routed_scale is not finite");
  TIDE_CHECK(as_rows(fn, "logits", logits, 0, lr));
  TIDE_CHECK(tide_check_tensor(fn, "ids", ids, TIDE_DT(TIDE_I32), 2));
  int64_t T = lr->rows, E = lr->n;
  *k = ids->sizes[1];
  if (E > ROUTE_MAX_E) return tide_errorf(TIDE_E_UNSUPPORTED, fn, "%lld experts, at most %d", (long long)E, ROUTE_MAX_E);
  if (*k < 1 || *k > E || *k > ROUTE_MAX_K)
    return tide_errorf(TIDE_E_INVALID, fn, "k = %lld experts per token, expected 1..%lld", (long long)*k,
                       (long long)(E < ROUTE_MAX_K ? E : ROUTE_MAX_K));
  int64_t s[2] = {T, *k};
  TIDE_CHECK(want_exact(fn, "ids", ids, TIDE_DT(TIDE_I32), 2, s, 1));
  TIDE_CHECK(want_exact(fn, "weights", weights, TIDE_DT(TIDE_F32), 2, s, 1));
  return TIDE_OK;
}

/* a > b for selection: NaN is below everything */
static int score_gt(float a, float b) { return !isnan(a) && (isnan(b) || a > b); }

int tide_route_topk(tide_tensor *ids, tide_tensor *weights, const tide_tensor *logits, const tide_tensor *bias,
                    const tide_route_cfg *cfg) {
  rows_t lr;
  int64_t k;
  TIDE_CHECK(route_common(__func__, ids, weights, logits, cfg, &lr, &k));
  int64_t T = lr.rows, E = lr.n;
  const float *bp = NULL;
  if (bias) {
    TIDE_CHECK(want_exact(__func__, "bias", bias, TIDE_DT(TIDE_F32), 1, &E, 0));
    bp = bias->data;
  }
  int32_t *idp = ids->data;
  float *wp = weights->data;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && T * E > 2048)
#endif
  for (int64_t t = 0; t < T; t++) {
    float sc[ROUTE_MAX_E], biased[ROUTE_MAX_E];
    unsigned char taken[ROUTE_MAX_E];
    route_scores(sc, lr.p + t * lr.ld, E, cfg->scoring);
    for (int64_t e = 0; e < E; e++) {
      biased[e] = bp ? sc[e] + bp[e] : sc[e];
      taken[e] = 0;
    }
    int32_t *it = idp + t * k;
    for (int64_t i = 0; i < k; i++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++)
        if (!taken[e] && (best < 0 || score_gt(biased[e], biased[best]))) best = e;
      taken[best] = 1;
      it[i] = (int32_t)best;
    }
    route_weights(wp + t * k, it, sc, (int)k, cfg);
  }
  return TIDE_OK;
}

int tide_route_hash(tide_tensor *ids, tide_tensor *weights, const tide_tensor *logits, const tide_tensor *tokens,
                    const tide_tensor *tid2eid, const tide_route_cfg *cfg) {
  rows_t lr;
  int64_t k;
  TIDE_CHECK(route_common(__func__, ids, weights, logits, cfg, &lr, &k));
  int64_t T = lr.rows, E = lr.n;
  const unsigned idt = TIDE_DT(TIDE_I32) | TIDE_DT(TIDE_I64);
  TIDE_CHECK(want_exact(__func__, "tokens", tokens, idt, 1, &T, 0));
  TIDE_CHECK(tide_check_tensor(__func__, "tid2eid", tid2eid, idt, 2));
  int64_t V = tid2eid->sizes[0];
  int64_t s[2] = {V, k};
  TIDE_CHECK(want_exact(__func__, "tid2eid", tid2eid, idt, 2, s, 0));
  for (int64_t t = 0; t < T; t++) {
    int64_t tok = id_at(tokens, t);
    if (tok < 0 || tok >= V)
      return TIDE_ERR(TIDE_E_RANGE, "token id %lld at position %lld is outside tid2eid's %lld rows", (long long)tok,
                      (long long)t, (long long)V);
    for (int64_t i = 0; i < k; i++) {
      int64_t e = id_at(tid2eid, tok * k + i);
      if (e < 0 || e >= E)
        return TIDE_ERR(TIDE_E_FORMAT, "tid2eid[%lld][%lld] = %lld is not an expert id (0..%lld)", (long long)tok,
                        (long long)i, (long long)e, (long long)(E - 1));
    }
  }
  int32_t *idp = ids->data;
  float *wp = weights->data;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && T * E > 2048)
#endif
  for (int64_t t = 0; t < T; t++) {
    float sc[ROUTE_MAX_E];
    route_scores(sc, lr.p + t * lr.ld, E, cfg->scoring);
    int64_t tok = id_at(tokens, t);
    int32_t *it = idp + t * k;
    for (int64_t i = 0; i < k; i++) it[i] = (int32_t)id_at(tid2eid, tok * k + i);
    route_weights(wp + t * k, it, sc, (int)k, cfg);
  }
  return TIDE_OK;
}

/* ---- SwiGLU ---- */

int tide_swiglu(tide_tensor *out, const tide_tensor *gate, const tide_tensor *up, float limit, int flags) {
  rows_t gr, ur, orow;
  TIDE_CHECK(as_rows(__func__, "gate", gate, 0, &gr));
  TIDE_CHECK(as_rows(__func__, "up", up, 0, &ur));
  TIDE_CHECK(as_rows(__func__, "out", out, 1, &orow));
  if (ur.rows != gr.rows || ur.n != gr.n) return bad_rows(__func__, "up", &ur, gr.rows, gr.n);
  if (orow.rows != gr.rows || orow.n != gr.n) return bad_rows(__func__, "out", &orow, gr.rows, gr.n);
  if (!(limit > 0)) return TIDE_ERR(TIDE_E_INVALID, "limit %g must be > 0 (INFINITY for no clamp)", (double)limit);
  const tide_ops_kernels *K = tide_ops_kernels_get();
  int round = (flags & TIDE_OPS_ROUND_BF16) != 0;
  int64_t R = gr.rows, n = gr.n;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (R > 1 && R * n > PAR_MIN)
#endif
  for (int64_t r = 0; r < R; r++) K->swiglu(orow.p + r * orow.ld, gr.p + r * gr.ld, ur.p + r * ur.ld, n, limit, round);
  return TIDE_OK;
}
