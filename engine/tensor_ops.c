/* tensor_ops.c - small ops a script author uses at the REPL and tests use for
 * comparisons: compare (NMSE, ULP, allclose), argmax, top-k, softmax,
 * elementwise arithmetic, sum. Rows are the last dim; inputs any strides. */
#include <float.h>
#include <math.h>

#include "tide_internal.h"

/* Offset of the first element of row r (rows = all dims but the last). */
static int64_t row_offset(const tide_tensor *t, int64_t r) {
  int64_t off = 0;
  for (int d = t->ndim - 2; d >= 0; d--) {
    off += (r % t->sizes[d]) * t->strides[d];
    r /= t->sizes[d];
  }
  return off;
}
static int64_t last_dim(const tide_tensor *t) { return t->ndim ? t->sizes[t->ndim - 1] : 1; }
static int64_t last_stride(const tide_tensor *t) { return t->ndim ? t->strides[t->ndim - 1] : 1; }
static int64_t nrows(const tide_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d + 1 < t->ndim; d++) n *= t->sizes[d];
  return n;
}

static void load_row(const tide_tensor *t, int64_t r, double *buf) {
  int64_t o = row_offset(t, r), n = last_dim(t), s = last_stride(t);
  if (t->dtype == TIDE_F32 && s == 1) {
    const float *p = (const float *)t->data + o;
    for (int64_t j = 0; j < n; j++) buf[j] = p[j];
    return;
  }
  for (int64_t j = 0; j < n; j++) buf[j] = tide_load_elem(t, o + j * s);
}

static int same_shape(const tide_tensor *a, const tide_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return 0;
  return 1;
}

static int shape_err(const char *fn, const char *an, const tide_tensor *a, const char *bn, const tide_tensor *b) {
  char x[96], y[96];
  return tide_errorf(TIDE_E_INVALID, fn, "shape mismatch: %s %s vs %s %s", an, tide_shape_str(a, x, sizeof x), bn,
                     tide_shape_str(b, y, sizeof y));
}

/* ulp of |x| in a format with `mant` explicit mantissa bits and minimum
 * normal exponent `emin` */
static double ulp_of(double x, int mant, int emin) {
  x = fabs(x);
  int e;
  if (x == 0 || !isfinite(x)) return ldexp(1.0, emin - mant);
  frexp(x, &e); /* x = f * 2^e, f in [0.5, 1) => exponent e-1 */
  e -= 1;
  if (e < emin) e = emin;
  return ldexp(1.0, e - mant);
}

static void fmt_bits(int dt, int *mant, int *emin) {
  switch (dt) {
    case TIDE_BF16: *mant = 7; *emin = -126; break;
    case TIDE_F16: *mant = 10; *emin = -14; break;
    case TIDE_F8E4M3: *mant = 3; *emin = -6; break;
    case TIDE_FP4: *mant = 1; *emin = 0; break;
    case TIDE_E8M0: *mant = 0; *emin = -127; break;
    default: *mant = 23; *emin = -126; break;
  }
}

int tide_tensor_compare(const tide_tensor *a, const tide_tensor *b, double rtol, double atol, tide_compare *out) {
  TIDE_CHECK(tide_check_tensor(__func__, "a", a, 0, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "b", b, 0, -1));
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  if (!same_shape(a, b)) return shape_err(__func__, "a", a, "b", b);
  int mant, emin;
  fmt_bits(a->dtype, &mant, &emin);
  tide_compare c = {0};
  c.first_bad = -1;
  double se = 0, sb = 0, sab = 0, saa = 0;
  int64_t rows = nrows(a), n = last_dim(a);
  double *ra = tide_xmalloc((size_t)(n ? n : 1) * 16);
  if (!ra) return TIDE_E_NOMEM;
  double *rb = ra + (n ? n : 1);
  for (int64_t r = 0; r < rows; r++) {
    load_row(a, r, ra);
    load_row(b, r, rb);
    for (int64_t j = 0; j < n; j++) {
      double x = ra[j], y = rb[j];
      int64_t idx = r * n + j;
      if (isnan(x) || isnan(y)) {
        if (isnan(x) != isnan(y)) {
          c.n_nan_mismatch++;
          c.n_bad++;
          if (c.first_bad < 0) c.first_bad = idx;
        }
        continue;
      }
      if (isinf(x) || isinf(y)) {
        if (x != y) {
          c.n_bad++;
          c.max_abs = INFINITY;
          if (c.first_bad < 0) c.first_bad = idx;
        }
        continue;
      }
      double d = fabs(x - y);
      if (d > c.max_abs) c.max_abs = d;
      double rel = d / fmax(fabs(y), 1e-30);
      if (rel > c.max_rel) c.max_rel = rel;
      double u = d / ulp_of(y, mant, emin);
      if (u > c.max_ulp) c.max_ulp = u;
      se += d * d;
      sb += y * y;
      sab += x * y;
      saa += x * x;
      if (!(d <= atol + rtol * fabs(y))) {
        c.n_bad++;
        if (c.first_bad < 0) c.first_bad = idx;
      }
    }
  }
  tide_xfree(ra);
  c.nmse = sb > 0 ? se / sb : (se > 0 ? INFINITY : 0);
  c.cosine = (saa > 0 && sb > 0) ? sab / sqrt(saa * sb) : (saa == sb ? 1.0 : 0.0);
  *out = c;
  return TIDE_OK;
}

static const unsigned FLOATS = TIDE_DT(TIDE_F32) | TIDE_DT(TIDE_BF16) | TIDE_DT(TIDE_F16);

int tide_tensor_argmax(tide_tensor *out, const tide_tensor *src) {
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, TIDE_DT(TIDE_I64) | TIDE_DT(TIDE_I32), -1));
  if (src->ndim < 1) return TIDE_ERR(TIDE_E_INVALID, "argmax needs at least 1 dim");
  int64_t rows = nrows(src), n = last_dim(src);
  if (tide_tensor_numel(out) != rows)
    return TIDE_ERR(TIDE_E_INVALID, "out has %lld elements, expected %lld", (long long)tide_tensor_numel(out), (long long)rows);
  if (n == 0) return TIDE_ERR(TIDE_E_INVALID, "argmax over an empty dim");
  if (!tide_tensor_is_contiguous(out)) return TIDE_ERR(TIDE_E_INVALID, "out must be contiguous");
  double *buf = tide_xmalloc((size_t)n * 8);
  if (!buf) return TIDE_E_NOMEM;
  for (int64_t r = 0; r < rows; r++) {
    load_row(src, r, buf);
    int64_t best = -1;
    for (int64_t j = 0; j < n; j++)
      if (!isnan(buf[j]) && (best < 0 || buf[j] > buf[best])) best = j;
    if (best < 0) best = 0;
    tide_store_elem(out, r, (double)best);
  }
  tide_xfree(buf);
  return TIDE_OK;
}

/* min-heap on (value, -index) of size k: the root is the worst kept entry */
typedef struct {
  double v;
  int64_t i;
} vi;
static inline int worse(vi a, vi b) { return a.v < b.v || (a.v == b.v && a.i > b.i); }
static void sift_down(vi *h, int64_t k, int64_t p) {
  for (;;) {
    int64_t l = 2 * p + 1, r = l + 1, m = p;
    if (l < k && worse(h[l], h[m])) m = l;
    if (r < k && worse(h[r], h[m])) m = r;
    if (m == p) return;
    vi t = h[p];
    h[p] = h[m];
    h[m] = t;
    p = m;
  }
}

int tide_tensor_topk(tide_tensor *values, tide_tensor *indices, const tide_tensor *src, int64_t k) {
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  if (src->ndim < 1) return TIDE_ERR(TIDE_E_INVALID, "topk needs at least 1 dim");
  int64_t rows = nrows(src), n = last_dim(src);
  if (k < 0 || k > n) return TIDE_ERR(TIDE_E_RANGE, "k = %lld outside 0..%lld", (long long)k, (long long)n);
  if (values) {
    TIDE_CHECK(tide_check_tensor(__func__, "values", values, FLOATS, -1));
    if (tide_tensor_numel(values) != rows * k || !tide_tensor_is_contiguous(values))
      return TIDE_ERR(TIDE_E_INVALID, "values must be contiguous with %lld elements", (long long)(rows * k));
  }
  if (indices) {
    TIDE_CHECK(tide_check_tensor(__func__, "indices", indices, TIDE_DT(TIDE_I64) | TIDE_DT(TIDE_I32), -1));
    if (tide_tensor_numel(indices) != rows * k || !tide_tensor_is_contiguous(indices))
      return TIDE_ERR(TIDE_E_INVALID, "indices must be contiguous with %lld elements", (long long)(rows * k));
  }
  double *buf = tide_xmalloc((size_t)(n + 1) * 8);
  vi *h = tide_xmalloc((size_t)(k + 1) * sizeof(vi));
  if (!buf || !h) {
    tide_xfree(buf);
    tide_xfree(h);
    return TIDE_E_NOMEM;
  }
  for (int64_t r = 0; r < rows; r++) {
    load_row(src, r, buf);
    int64_t m = 0;
    for (int64_t j = 0; j < n && k > 0; j++) {
      double v = isnan(buf[j]) ? -INFINITY : buf[j];
      vi e = {v, j};
      if (m < k) {
        h[m++] = e;
        if (m == k)
          for (int64_t p = k / 2 - 1; p >= 0; p--) sift_down(h, k, p);
      } else if (worse(h[0], e)) {
        h[0] = e;
        sift_down(h, k, 0);
      }
    }
    /* heap-sort into descending order */
    for (int64_t e = k - 1; e > 0; e--) {
      vi t = h[0];
      h[0] = h[e];
      h[e] = t;
      sift_down(h, e, 0);
    }
    for (int64_t j = 0; j < k; j++) {
      if (values) tide_store_elem(values, r * k + j, h[j].v);
      if (indices) tide_store_elem(indices, r * k + j, (double)h[j].i);
    }
  }
  tide_xfree(buf);
  tide_xfree(h);
  return TIDE_OK;
}

int tide_tensor_softmax(tide_tensor *out, const tide_tensor *src) {
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, FLOATS, -1));
  if (!same_shape(out, src)) return shape_err(__func__, "out", out, "src", src);
  if (out->readonly) return TIDE_ERR(TIDE_E_INVALID, "out is read-only");
  if (src->ndim < 1) return TIDE_ERR(TIDE_E_INVALID, "softmax needs at least 1 dim");
  int64_t rows = nrows(src), n = last_dim(src);
  double *buf = tide_xmalloc((size_t)(n ? n : 1) * 8);
  if (!buf) return TIDE_E_NOMEM;
  for (int64_t r = 0; r < rows; r++) {
    load_row(src, r, buf);
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < n; j++)
      if (buf[j] > mx) mx = buf[j];
    for (int64_t j = 0; j < n; j++) {
      buf[j] = (mx == -INFINITY) ? 0.0 : exp(buf[j] - mx);
      z += buf[j];
    }
    int64_t o = row_offset(out, r), s = last_stride(out);
    for (int64_t j = 0; j < n; j++) tide_store_elem(out, o + j * s, z > 0 ? buf[j] / z : NAN);
  }
  tide_xfree(buf);
  return TIDE_OK;
}

int tide_tensor_binary(tide_tensor *out, const tide_tensor *a, const tide_tensor *b, int op) {
  TIDE_CHECK(tide_check_tensor(__func__, "a", a, 0, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "b", b, 0, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, 0, -1));
  if (op < TIDE_OP_ADD || op > TIDE_OP_DIV) return TIDE_ERR(TIDE_E_INVALID, "bad op %d", op);
  if (!same_shape(out, a)) return shape_err(__func__, "out", out, "a", a);
  int scalar_b = tide_tensor_numel(b) == 1;
  if (!scalar_b && !same_shape(a, b)) return shape_err(__func__, "a", a, "b", b);
  if (out->readonly) return TIDE_ERR(TIDE_E_INVALID, "out is read-only");
  int64_t rows = nrows(a), n = last_dim(a);
  double bs = scalar_b ? tide_load_elem(b, 0) : 0;
  double *ra = tide_xmalloc((size_t)(n ? n : 1) * 16);
  if (!ra) return TIDE_E_NOMEM;
  double *rb = ra + (n ? n : 1);
  for (int64_t r = 0; r < rows; r++) {
    load_row(a, r, ra);
    if (!scalar_b) load_row(b, r, rb);
    int64_t o = row_offset(out, r), s = last_stride(out);
    for (int64_t j = 0; j < n; j++) {
      float x = (float)ra[j], y = (float)(scalar_b ? bs : rb[j]), z;
      switch (op) {
        case TIDE_OP_ADD: z = x + y; break;
        case TIDE_OP_SUB: z = x - y; break;
        case TIDE_OP_MUL: z = x * y; break;
        default: z = x / y; break;
      }
      tide_store_elem(out, o + j * s, z);
    }
  }
  tide_xfree(ra);
  return TIDE_OK;
}

int tide_tensor_affine(tide_tensor *out, const tide_tensor *a, double alpha, double beta) {
  TIDE_CHECK(tide_check_tensor(__func__, "a", a, 0, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, 0, -1));
  if (!same_shape(out, a)) return shape_err(__func__, "out", out, "a", a);
  if (out->readonly) return TIDE_ERR(TIDE_E_INVALID, "out is read-only");
  int64_t rows = nrows(a), n = last_dim(a);
  double *ra = tide_xmalloc((size_t)(n ? n : 1) * 8);
  if (!ra) return TIDE_E_NOMEM;
  for (int64_t r = 0; r < rows; r++) {
    load_row(a, r, ra);
    int64_t o = row_offset(out, r), s = last_stride(out);
    for (int64_t j = 0; j < n; j++) tide_store_elem(out, o + j * s, (float)((float)ra[j] * (float)alpha + (float)beta));
  }
  tide_xfree(ra);
  return TIDE_OK;
}

int tide_tensor_sum(const tide_tensor *t, double *out) {
  TIDE_CHECK(tide_check_tensor(__func__, "tensor", t, 0, -1));
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  int64_t rows = nrows(t), n = last_dim(t);
  double s = 0;
  double *ra = tide_xmalloc((size_t)(n ? n : 1) * 8);
  if (!ra) return TIDE_E_NOMEM;
  for (int64_t r = 0; r < rows; r++) {
    load_row(t, r, ra);
    for (int64_t j = 0; j < n; j++) s += ra[j];
  }
  tide_xfree(ra);
  *out = s;
  return TIDE_OK;
}
