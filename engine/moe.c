/* moe.c - the MoE block (doc 2.3): routed experts and a shared expert as
 * linear handles, and a step that groups the (token, slot) rows by expert so
 * each active expert's weights are read once, then combines every token's
 * expert outputs in slot order (the order that makes the result independent
 * of the batch and of the thread count). */
#include <math.h>
#include <stdio.h>

#include "ops_kernels.h"

/* One product y[m, :] = x[m, :] . W^T over m rows: the same fields as the
 * linear layer's batched job (tide_linear_forward_many), so the products of a
 * step can move to one batched call by changing moe_products only. */
typedef tide_linear_job moe_job;

enum { MOE_MAX_K = 64 };

struct tide_moe {
  int32_t E;              /* routed experts */
  int32_t n_set;          /* routed experts set so far */
  int64_t d, inter;       /* hidden size, routed expert width */
  int64_t sinter;         /* shared expert width (0: none) */
  float lim;              /* swiglu_limit */
  int policy;             /* linear policy of the routed experts (tide_moe_set_policy) */
  tide_linear **w;        /* [3 * E]: w1, w2, w3 of expert e at 3e, 3e+1, 3e+2 */
  tide_linear *sw[3];     /* shared w1, w2, w3 (NULL: none) */
  moe_job *jobs;          /* [2 * E + 2] */
  /* per step, grown only */
  int32_t *count;         /* [E] rows of each expert */
  int64_t *start;         /* [E + 1] first row of each expert */
  int64_t cap_rows;       /* rows the buffers below hold */
  int64_t cap_tok;        /* tokens the shared buffers hold */
  int64_t *row_of;        /* [cap_rows] (t * k + i) -> its row */
  float *xy;              /* [cap_rows, d] gathered x rows, then the w2 outputs */
  float *g, *u;           /* [cap_rows, inter] w1 (then SwiGLU) and w3 outputs */
  float *sg, *su, *sy;    /* [cap_tok, sinter] x2, [cap_tok, d] shared expert */
  int64_t scratch_bytes;
  tide_moe_stats st;
};

int tide_moe_new(tide_moe **out, int32_t n_experts, int64_t dim, int64_t inter, float swiglu_limit) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = NULL;
  if (n_experts < 1 || n_experts > (1 << 20))
    return TIDE_ERR(TIDE_E_INVALID, "n_experts = %d, expected 1..%d", n_experts, 1 << 20);
  if (dim < 1 || inter < 1) return TIDE_ERR(TIDE_E_INVALID, "dim %lld and inter %lld must be >= 1", (long long)dim, (long long)inter);
  if (!(swiglu_limit > 0)) return TIDE_ERR(TIDE_E_INVALID, "swiglu_limit %g must be > 0 (INFINITY for no clamp)", (double)swiglu_limit);
  tide_moe *m = tide_xcalloc(1, sizeof *m);
  if (!m) return TIDE_E_NOMEM;
  m->E = n_experts;
  m->d = dim;
  m->inter = inter;
  m->lim = swiglu_limit;
  m->w = tide_xcalloc((size_t)n_experts * 3, sizeof *m->w);
  m->jobs = tide_xcalloc((size_t)n_experts * 2 + 2, sizeof *m->jobs);
  m->count = tide_xcalloc((size_t)n_experts, sizeof *m->count);
  m->start = tide_xcalloc((size_t)n_experts + 1, sizeof *m->start);
  if (!m->w || !m->jobs || !m->count || !m->start) {
    tide_moe_free(m);
    return TIDE_E_NOMEM;
  }
  *out = m;
  return TIDE_OK;
}

static void free_scratch(tide_moe *m) {
  tide_xfree(m->row_of);
  tide_xfree(m->xy);
  tide_xfree(m->g);
  tide_xfree(m->u);
  tide_xfree(m->sg);
  tide_xfree(m->su);
  tide_xfree(m->sy);
  m->row_of = NULL;
  m->xy = m->g = m->u = m->sg = m->su = m->sy = NULL;
  m->cap_rows = m->cap_tok = 0;
  m->scratch_bytes = 0;
}

void tide_moe_free(tide_moe *m) {
  if (!m) return;
  if (m->w)
    for (int64_t i = 0; i < 3 * (int64_t)m->E; i++) tide_linear_free(m->w[i]);
  for (int i = 0; i < 3; i++) tide_linear_free(m->sw[i]);
  free_scratch(m);
  tide_xfree(m->w);
  tide_xfree(m->jobs);
  tide_xfree(m->count);
  tide_xfree(m->start);
  tide_xfree(m);
}

/* Three linear handles for one expert, checked against [n1, k1] (w1, w3)
 * and [k1, n1] (w2). On error nothing is kept. */
static int make_expert(const char *fn, const char *who, tide_linear *out[3], const tide_tensor *w1,
                       const tide_tensor *s1, const tide_tensor *w2, const tide_tensor *s2, const tide_tensor *w3,
                       const tide_tensor *s3, int64_t inter, int64_t d) {
  const tide_tensor *ws[3] = {w1, w2, w3}, *ss[3] = {s1, s2, s3};
  static const char *names[3] = {"w1", "w2", "w3"};
  out[0] = out[1] = out[2] = NULL;
  for (int j = 0; j < 3; j++) {
    int rc = tide_linear_new(&out[j], ws[j], ss[j]);
    if (rc < 0) {
      for (int i = 0; i < j; i++) tide_linear_free(out[i]);
      out[0] = out[1] = out[2] = NULL;
      return tide_error_wrap(rc, "%s: %s %s", fn, who, names[j]);
    }
  }
  for (int j = 0; j < 3; j++) {
    int64_t n, k;
    tide_linear_info(out[j], &n, &k, NULL);
    int64_t wn = j == 1 ? d : inter, wk = j == 1 ? inter : d;
    if (n != wn || k != wk) {
      for (int i = 0; i < 3; i++) tide_linear_free(out[i]);
      out[0] = out[1] = out[2] = NULL;
      return tide_errorf(TIDE_E_INVALID, fn, "%s %s is %lld x %lld (out x in), expected %lld x %lld", who, names[j],
                         (long long)n, (long long)k, (long long)wn, (long long)wk);
    }
  }
  return TIDE_OK;
}

int tide_moe_set_expert(tide_moe *m, int32_t e, const tide_tensor *w1, const tide_tensor *s1, const tide_tensor *w2,
                        const tide_tensor *s2, const tide_tensor *w3, const tide_tensor *s3) {
  if (!m) return TIDE_ERR(TIDE_E_INVALID, "NULL moe");
  if (e < 0 || e >= m->E) return TIDE_ERR(TIDE_E_RANGE, "expert %d outside 0..%d", e, m->E - 1);
  char who[32];
  snprintf(who, sizeof who, "expert %d", e);
  tide_linear *l[3];
  TIDE_CHECK(make_expert(__func__, who, l, w1, s1, w2, s2, w3, s3, m->inter, m->d));
  tide_linear **slot = m->w + 3 * (int64_t)e;
  if (!slot[0]) m->n_set++;
  for (int j = 0; j < 3; j++) {
    tide_linear_free(slot[j]);
    slot[j] = l[j];
    tide_linear_set_policy(slot[j], m->policy);
  }
  return TIDE_OK;
}

int tide_moe_set_policy(tide_moe *m, int routed, int shared) {
  if (!m) return TIDE_ERR(TIDE_E_INVALID, "NULL moe");
  int ps[2] = {routed, shared};
  for (int i = 0; i < 2; i++)
    if (ps[i] != TIDE_LINEAR_INVARIANT && ps[i] != TIDE_LINEAR_FAST && ps[i] != TIDE_LINEAR_Q8)
      return TIDE_ERR(TIDE_E_INVALID,
                      "bad %s policy %d (TIDE_LINEAR_INVARIANT = 0, TIDE_LINEAR_FAST = 1, TIDE_LINEAR_Q8 = 2)",
                      i ? "shared" : "routed", ps[i]);
  /* the shared expert first: its Q8 copy may fail to allocate, and then
   * nothing has changed */
  int old[3];
  for (int j = 0; j < 3; j++) old[j] = m->sw[j] ? tide_linear_get_policy(m->sw[j]) : 0;
  for (int j = 0; j < 3; j++) {
    if (!m->sw[j]) continue;
    int rc = tide_linear_set_policy(m->sw[j], shared);
    if (rc < 0) {
      for (int i = 0; i < j; i++) tide_linear_set_policy(m->sw[i], old[i]);
      return rc;
    }
  }
  m->policy = routed;
  for (int64_t j = 0; j < 3 * (int64_t)m->E; j++)
    if (m->w[j]) tide_linear_set_policy(m->w[j], routed);
  return TIDE_OK;
}

int tide_moe_set_shared(tide_moe *m, const tide_tensor *w1, const tide_tensor *s1, const tide_tensor *w2,
                        const tide_tensor *s2, const tide_tensor *w3, const tide_tensor *s3) {
  if (!m) return TIDE_ERR(TIDE_E_INVALID, "NULL moe");
  TIDE_CHECK(tide_check_tensor(__func__, "w1", w1, 0, 2));
  int64_t si = w1->sizes[0];
  if (si < 1) return TIDE_ERR(TIDE_E_INVALID, "shared w1 has no rows");
  tide_linear *l[3];
  TIDE_CHECK(make_expert(__func__, "shared expert", l, w1, s1, w2, s2, w3, s3, si, m->d));
  for (int j = 0; j < 3; j++) {
    tide_linear_free(m->sw[j]);
    m->sw[j] = l[j];
  }
  /* the shared buffers are sized by sinter: drop them, the next step
   * allocates them again */
  tide_xfree(m->sg);
  tide_xfree(m->su);
  tide_xfree(m->sy);
  m->sg = m->su = m->sy = NULL;
  m->scratch_bytes -= m->cap_tok * (2 * m->sinter + m->d) * (int64_t)sizeof(float);
  m->cap_tok = 0;
  m->sinter = si;
  return TIDE_OK;
}

int tide_moe_info(const tide_moe *m, int32_t *n_experts, int64_t *dim, int64_t *inter, int64_t *sinter,
                  int32_t *n_set) {
  if (!m) return TIDE_ERR(TIDE_E_INVALID, "NULL moe");
  if (n_experts) *n_experts = m->E;
  if (dim) *dim = m->d;
  if (inter) *inter = m->inter;
  if (sinter) *sinter = m->sinter;
  if (n_set) *n_set = m->n_set;
  return TIDE_OK;
}

int tide_moe_stats_get(const tide_moe *m, tide_moe_stats *out) {
  if (!m || !out) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  *out = m->st;
  out->scratch_bytes = m->scratch_bytes;
  return TIDE_OK;
}

int tide_moe_expert_rows(const tide_moe *m, int32_t *counts, int32_t n) {
  if (!m || (!counts && n > 0)) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  for (int32_t e = 0; e < n && e < m->E; e++) counts[e] = m->count[e];
  return TIDE_OK;
}

/* Grow (never shrink) the buffers for `rows` routed rows and T tokens. */
static int ensure_scratch(tide_moe *m, int64_t rows, int64_t T) {
  size_t f = sizeof(float);
  if (rows > m->cap_rows) {
    int64_t cap = m->cap_rows ? m->cap_rows : 8;
    while (cap < rows) cap *= 2;
    int64_t *ro = tide_xmalloc((size_t)cap * sizeof *ro);
    float *xy = tide_xmalloc((size_t)(cap * m->d) * f);
    float *g = tide_xmalloc((size_t)(cap * m->inter) * f);
    float *u = tide_xmalloc((size_t)(cap * m->inter) * f);
    if (!ro || !xy || !g || !u) {
      tide_xfree(ro);
      tide_xfree(xy);
      tide_xfree(g);
      tide_xfree(u);
      return TIDE_ERR(TIDE_E_NOMEM, "no memory for %lld expert rows of %lld + 2 x %lld floats", (long long)cap,
                      (long long)m->d, (long long)m->inter);
    }
    tide_xfree(m->row_of);
    tide_xfree(m->xy);
    tide_xfree(m->g);
    tide_xfree(m->u);
    m->row_of = ro;
    m->xy = xy;
    m->g = g;
    m->u = u;
    m->scratch_bytes += (cap - m->cap_rows) * ((int64_t)sizeof *ro + (m->d + 2 * m->inter) * (int64_t)f);
    m->cap_rows = cap;
  }
  if (m->sinter > 0 && T > m->cap_tok) {
    int64_t cap = m->cap_tok ? m->cap_tok : 4;
    while (cap < T) cap *= 2;
    float *sg = tide_xmalloc((size_t)(cap * m->sinter) * f);
    float *su = tide_xmalloc((size_t)(cap * m->sinter) * f);
    float *sy = tide_xmalloc((size_t)(cap * m->d) * f);
    if (!sg || !su || !sy) {
      tide_xfree(sg);
      tide_xfree(su);
      tide_xfree(sy);
      return TIDE_ERR(TIDE_E_NOMEM, "no memory for the shared expert of %lld tokens", (long long)cap);
    }
    tide_xfree(m->sg);
    tide_xfree(m->su);
    tide_xfree(m->sy);
    m->sg = sg;
    m->su = su;
    m->sy = sy;
    m->scratch_bytes += (cap - m->cap_tok) * (2 * m->sinter + m->d) * (int64_t)f;
    m->cap_tok = cap;
  }
  return TIDE_OK;
}

/* Every weight product of a step goes through here: `n` independent jobs
 * in one parallel region (tide_linear_forward_many balances them over the
 * threads), outputs rounded to bf16 when `round`. Each job's result is
 * bitwise what it gives alone, so grouping does not change a token. */
static int moe_products(const moe_job *jobs, int n, int round) {
  return tide_linear_forward_many(jobs, n, round ? TIDE_LINEAR_ROUND_BF16 : 0);
}

static void check_rows_t(const tide_tensor *t, int64_t *rows, int64_t *n, int64_t *ld) {
  *n = t->ndim ? t->sizes[t->ndim - 1] : 1;
  *rows = t->ndim == 2 ? t->sizes[0] : 1;
  *ld = t->ndim == 2 && t->sizes[0] > 1 ? t->strides[0] : *n;
}

static int moe_rows_arg(const char *fn, const char *what, const tide_tensor *t, int write, int64_t d, int64_t *T,
                        int64_t *ld) {
  TIDE_CHECK(tide_check_tensor(fn, what, t, TIDE_DT(TIDE_F32), -1));
  char b[96];
  int64_t rows, n;
  if (t->ndim < 1 || t->ndim > 2) return tide_errorf(TIDE_E_INVALID, fn, "%s %s must be [T, d]", what, tide_shape_str(t, b, sizeof b));
  check_rows_t(t, &rows, &n, ld);
  if (n != d || (n > 1 && t->strides[t->ndim - 1] != 1) || *ld < n)
    return tide_errorf(TIDE_E_INVALID, fn, "%s %s must be [T, %lld] with contiguous rows", what,
                       tide_shape_str(t, b, sizeof b), (long long)d);
  if (write && t->readonly) return tide_errorf(TIDE_E_INVALID, fn, "%s is read-only", what);
  *T = rows;
  return TIDE_OK;
}

int tide_moe_forward(tide_moe *m, tide_tensor *out, const tide_tensor *x, const tide_tensor *ids,
                     const tide_tensor *weights, int flags) {
  double t0 = tide_time();
  if (!m) return TIDE_ERR(TIDE_E_INVALID, "NULL moe");
  int64_t T, To, ldx, ldo;
  TIDE_CHECK(moe_rows_arg(__func__, "x", x, 0, m->d, &T, &ldx));
  TIDE_CHECK(moe_rows_arg(__func__, "out", out, 1, m->d, &To, &ldo));
  char b[96];
  if (To != T) return TIDE_ERR(TIDE_E_INVALID, "out has %lld rows, x has %lld", (long long)To, (long long)T);
  TIDE_CHECK(tide_check_tensor(__func__, "ids", ids, TIDE_DT(TIDE_I32), 2));
  TIDE_CHECK(tide_check_tensor(__func__, "weights", weights, TIDE_DT(TIDE_F32), 2));
  int64_t k = ids->sizes[1];
  if (ids->sizes[0] != T || !tide_tensor_is_contiguous(ids))
    return TIDE_ERR(TIDE_E_INVALID, "ids %s must be [%lld, k] contiguous", tide_shape_str(ids, b, sizeof b), (long long)T);
  if (weights->sizes[0] != T || weights->sizes[1] != k || !tide_tensor_is_contiguous(weights))
    return TIDE_ERR(TIDE_E_INVALID, "weights %s must be [%lld, %lld] contiguous like ids",
                    tide_shape_str(weights, b, sizeof b), (long long)T, (long long)k);
  if (k < 1 || k > MOE_MAX_K) return TIDE_ERR(TIDE_E_UNSUPPORTED, "k = %lld experts per token, supported 1..%d", (long long)k, MOE_MAX_K);
  const int32_t *id = ids->data;
  const float *wt = weights->data;
  int64_t R = T * k;
  for (int64_t r = 0; r < R; r++) {
    int32_t e = id[r];
    if (e < 0 || e >= m->E)
      return TIDE_ERR(TIDE_E_RANGE, "token %lld slot %lld selects expert %d, outside 0..%d", (long long)(r / k),
                      (long long)(r % k), e, m->E - 1);
    if (!m->w[3 * (int64_t)e])
      return TIDE_ERR(TIDE_E_STATE, "token %lld slot %lld selects expert %d, which was never set", (long long)(r / k),
                      (long long)(r % k), e);
  }
  if (T == 0) return TIDE_OK;
  TIDE_CHECK(ensure_scratch(m, R, T));
  const tide_ops_kernels *K = tide_ops_kernels_get();
  int64_t d = m->d, I = m->inter, SI = m->sinter;
  const float *xp = x->data;
  float *op = out->data;
  int shared = m->sw[0] != NULL;

  /* 1. group the rows by expert: counting sort, rows of an expert in (t, i)
   * order */
  memset(m->count, 0, (size_t)m->E * sizeof *m->count);
  for (int64_t r = 0; r < R; r++) m->count[id[r]]++;
  int32_t active = 0, maxr = 0;
  int64_t wbytes = 0;
  m->start[0] = 0;
  for (int32_t e = 0; e < m->E; e++) {
    m->start[e + 1] = m->start[e] + m->count[e];
    if (m->count[e]) {
      active++;
      if (m->count[e] > maxr) maxr = m->count[e];
      for (int j = 0; j < 3; j++) wbytes += tide_linear_weight_bytes(m->w[3 * (int64_t)e + j]);
    }
  }
  if (shared)
    for (int j = 0; j < 3; j++) wbytes += tide_linear_weight_bytes(m->sw[j]);
  {
    int64_t *fill = m->start; /* reuse start as a cursor, restored below */
    for (int64_t r = 0; r < R; r++) m->row_of[r] = fill[id[r]]++;
    for (int32_t e = m->E; e > 0; e--) m->start[e] = m->start[e - 1];
    m->start[0] = 0;
  }
  float *xy = m->xy;
  const int64_t *row_of = m->row_of;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (R > 1 && R * d > (1 << 16))
#endif
  for (int64_t r = 0; r < R; r++) memcpy(xy + row_of[r] * d, xp + (r / k) * ldx, (size_t)d * sizeof(float));
  double t1 = tide_time();

  /* 2. w1 and w3 of every active expert (and the shared expert), bf16 */
  moe_job *jobs = m->jobs;
  int nj = 0;
  for (int32_t e = 0; e < m->E; e++) {
    if (!m->count[e]) continue;
    int64_t s = m->start[e];
    jobs[nj++] = (moe_job){m->w[3 * (int64_t)e], xy + s * d, d, m->g + s * I, I, m->count[e]};
    jobs[nj++] = (moe_job){m->w[3 * (int64_t)e + 2], xy + s * d, d, m->u + s * I, I, m->count[e]};
  }
  if (shared) {
    jobs[nj++] = (moe_job){m->sw[0], xp, ldx, m->sg, SI, T};
    jobs[nj++] = (moe_job){m->sw[2], xp, ldx, m->su, SI, T};
  }
  TIDE_CHECK(moe_products(jobs, nj, 1));
  double t2 = tide_time();

  /* 3. SwiGLU over all routed rows (they are contiguous), then the shared
   * rows, in place into g / sg */
  float lim = m->lim;
  float *g = m->g, *u = m->u, *sg = m->sg, *su = m->su;
  int64_t nrow = R + (shared ? T : 0);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (nrow > 1 && nrow * I > (1 << 15))
#endif
  for (int64_t r = 0; r < nrow; r++) {
    if (r < R) K->swiglu(g + r * I, g + r * I, u + r * I, I, lim, 1);
    else K->swiglu(sg + (r - R) * SI, sg + (r - R) * SI, su + (r - R) * SI, SI, lim, 1);
  }
  double t3 = tide_time();

  /* 4. w2: the routed outputs overwrite the gathered inputs (no longer
   * needed), bf16 */
  nj = 0;
  for (int32_t e = 0; e < m->E; e++) {
    if (!m->count[e]) continue;
    int64_t s = m->start[e];
    jobs[nj++] = (moe_job){m->w[3 * (int64_t)e + 1], m->g + s * I, I, xy + s * d, d, m->count[e]};
  }
  if (shared) jobs[nj++] = (moe_job){m->sw[1], m->sg, SI, m->sy, d, T};
  TIDE_CHECK(moe_products(jobs, nj, 1));
  double t4 = tide_time();

  /* 5. per token, in slot order, then the shared expert */
  int round = (flags & TIDE_OPS_ROUND_BF16) != 0;
  const float *sy = shared ? m->sy : NULL;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && T * k * d > (1 << 16))
#endif
  for (int64_t t = 0; t < T; t++) {
    const float *ys[MOE_MAX_K];
    for (int64_t i = 0; i < k; i++) ys[i] = xy + row_of[t * k + i] * d;
    K->combine(op + t * ldo, ys, wt + t * k, (int)k, sy ? sy + t * d : NULL, d, round);
  }
  double t5 = tide_time();

  tide_moe_stats *st = &m->st;
  st->tokens = T;
  st->rows = R;
  st->n_active = active;
  st->max_rows = maxr;
  st->weight_bytes = wbytes;
  st->t_gather = t1 - t0;
  st->t_up = t2 - t1;
  st->t_act = t3 - t2;
  st->t_down = t4 - t3;
  st->t_combine = t5 - t4;
  st->t_total = t5 - t0;
  return TIDE_OK;
}

/* ---- the pieces of a step, for expert parallelism (engine/mpi/) ----
 * tide_moe_forward's products, run on rows another process gathered: the
 * same kernels on the same rows give the same bits whatever the other rows
 * (each product and the SwiGLU are per row), so a row computed here equals
 * the row tide_moe_forward computes for it. */
int tide_moe_rows(tide_moe *m, float *y, const float *x, const int32_t *ids, int64_t n) {
  if (!m) return TIDE_ERR(TIDE_E_INVALID, "NULL moe");
  if (n < 0 || (n > 0 && (!y || !x || !ids))) return TIDE_ERR(TIDE_E_INVALID, "NULL rows or n = %lld < 0", (long long)n);
  for (int64_t r = 0; r < n; r++) {
    int32_t e = ids[r];
    if (e < 0 || e >= m->E) return TIDE_ERR(TIDE_E_RANGE, "row %lld selects expert %d, outside 0..%d", (long long)r, e, m->E - 1);
    if (!m->w[3 * (int64_t)e])
      return TIDE_ERR(TIDE_E_STATE, "row %lld selects expert %d, which this block does not hold", (long long)r, e);
  }
  if (n == 0) return TIDE_OK;
  TIDE_CHECK(ensure_scratch(m, n, 0));
  const tide_ops_kernels *K = tide_ops_kernels_get();
  int64_t d = m->d, I = m->inter;
  memset(m->count, 0, (size_t)m->E * sizeof *m->count);
  for (int64_t r = 0; r < n; r++) m->count[ids[r]]++;
  m->start[0] = 0;
  for (int32_t e = 0; e < m->E; e++) m->start[e + 1] = m->start[e] + m->count[e];
  int64_t *fill = m->start;
  for (int64_t r = 0; r < n; r++) m->row_of[r] = fill[ids[r]]++;
  for (int32_t e = m->E; e > 0; e--) m->start[e] = m->start[e - 1];
  m->start[0] = 0;
  float *xy = m->xy;
  const int64_t *row_of = m->row_of;
  for (int64_t r = 0; r < n; r++) memcpy(xy + row_of[r] * d, x + r * d, (size_t)d * sizeof(float));
  moe_job *jobs = m->jobs;
  int nj = 0;
  for (int32_t e = 0; e < m->E; e++) {
    if (!m->count[e]) continue;
    int64_t s = m->start[e];
    jobs[nj++] = (moe_job){m->w[3 * (int64_t)e], xy + s * d, d, m->g + s * I, I, m->count[e]};
    jobs[nj++] = (moe_job){m->w[3 * (int64_t)e + 2], xy + s * d, d, m->u + s * I, I, m->count[e]};
  }
  TIDE_CHECK(moe_products(jobs, nj, 1));
  float lim = m->lim;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 1 && n * I > (1 << 15))
#endif
  for (int64_t r = 0; r < n; r++) K->swiglu(m->g + r * I, m->g + r * I, m->u + r * I, I, lim, 1);
  nj = 0;
  for (int32_t e = 0; e < m->E; e++) {
    if (!m->count[e]) continue;
    int64_t s = m->start[e];
    jobs[nj++] = (moe_job){m->w[3 * (int64_t)e + 1], m->g + s * I, I, xy + s * d, d, m->count[e]};
  }
  TIDE_CHECK(moe_products(jobs, nj, 1));
  for (int64_t r = 0; r < n; r++) memcpy(y + r * d, xy + row_of[r] * d, (size_t)d * sizeof(float));
  return TIDE_OK;
}

int tide_moe_shared_rows(tide_moe *m, float *y, const float *x, int64_t ldx, int64_t T) {
  if (!m) return TIDE_ERR(TIDE_E_INVALID, "NULL moe");
  if (!m->sw[0]) return TIDE_ERR(TIDE_E_STATE, "this block holds no shared expert");
  if (T < 0 || (T > 0 && (!y || !x)) || ldx < m->d) return TIDE_ERR(TIDE_E_INVALID, "bad rows (T = %lld, ldx = %lld)", (long long)T, (long long)ldx);
  if (T == 0) return TIDE_OK;
  TIDE_CHECK(ensure_scratch(m, 1, T));
  const tide_ops_kernels *K = tide_ops_kernels_get();
  int64_t SI = m->sinter;
  moe_job jobs[2] = {{m->sw[0], x, ldx, m->sg, SI, T}, {m->sw[2], x, ldx, m->su, SI, T}};
  TIDE_CHECK(moe_products(jobs, 2, 1));
  float lim = m->lim;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && T * SI > (1 << 15))
#endif
  for (int64_t t = 0; t < T; t++) K->swiglu(m->sg + t * SI, m->sg + t * SI, m->su + t * SI, SI, lim, 1);
  jobs[0] = (moe_job){m->sw[1], m->sg, SI, y, m->d, T};
  return moe_products(jobs, 1, 1);
}

void tide_moe_combine_rows(float *out, const float *const *ys, const float *w, int k, const float *shared, int64_t d,
                           int flags) {
  tide_ops_kernels_get()->combine(out, ys, w, k, shared, d, (flags & TIDE_OPS_ROUND_BF16) != 0);
}
