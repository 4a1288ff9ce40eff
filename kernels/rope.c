/* rope.c - RoPE frequency tables (plain and YaRN-ramped, doc 2.2.2) and the
 * lazily grown cos/sin table the attention kernels read. Every row is
 * [cos(a_0..31) | sin(a_0..31)] with a_i = (float)p * f_i computed in f32 and
 * cos/sin taken in double, so a row computed on the fly beyond the table has
 * the same bits as a stored one. */
#include <math.h>

#include "attn_internal.h"

int tide_rope_new(tide_rope **out, const tide_rope_config *cfg) {
  if (!out || !cfg) return TIDE_ERR(TIDE_E_INVALID, "out or cfg is NULL");
  *out = NULL;
  int dim = cfg->dim ? cfg->dim : 64;
  if (dim != 64) return TIDE_ERR(TIDE_E_UNSUPPORTED, "rope dim %d (only 64)", dim);
  if (!(cfg->theta > 1.0)) return TIDE_ERR(TIDE_E_INVALID, "theta %g", cfg->theta);
  if (cfg->yarn && !(cfg->yarn_factor > 0 && cfg->yarn_original_max > 0 && cfg->yarn_beta_fast > 0 && cfg->yarn_beta_slow > 0))
    return TIDE_ERR(TIDE_E_INVALID, "yarn factor %g original_max %g beta_fast %g beta_slow %g", cfg->yarn_factor,
                    cfg->yarn_original_max, cfg->yarn_beta_fast, cfg->yarn_beta_slow);
  if (cfg->table_positions < 0) return TIDE_ERR(TIDE_E_INVALID, "table_positions %lld", (long long)cfg->table_positions);
  tide_rope *r = tide_xcalloc(1, sizeof *r);
  if (!r) return TIDE_E_NOMEM;
  r->dim = dim;
  r->limit = cfg->table_positions ? cfg->table_positions : 65536;
  double theta = cfg->theta;
  for (int i = 0; i < 32; i++) r->freq[i] = (float)(1.0 / pow(theta, (double)(2 * i) / 64.0));
  if (cfg->yarn) {
    double L0 = cfg->yarn_original_max, s = cfg->yarn_factor;
    double clo = 64.0 * log(L0 / (2 * M_PI * cfg->yarn_beta_fast)) / (2 * log(theta));
    double chi = 64.0 * log(L0 / (2 * M_PI * cfg->yarn_beta_slow)) / (2 * log(theta));
    double lo = floor(clo), hi = ceil(chi);
    if (lo < 0) lo = 0;
    if (hi > 63) hi = 63;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < 32; i++) {
      double ramp = (i - lo) / (hi - lo);
      ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
      r->freq[i] = (float)((double)r->freq[i] * (1 - ramp) + (double)r->freq[i] / s * ramp);
    }
  }
  *out = r;
  return TIDE_OK;
}

void tide_rope_free(tide_rope *r) {
  if (!r) return;
  tide_xfree(r->table);
  tide_xfree(r);
}

static void row_compute(const tide_rope *r, int64_t p, float *cs) {
  for (int i = 0; i < 32; i++) {
    float ang = (float)p * r->freq[i];
    cs[i] = (float)cos((double)ang);
    cs[32 + i] = (float)sin((double)ang);
  }
}

int tide_rope_reserve(tide_rope *r, int64_t need) {
  if (need > r->limit) need = r->limit;
  if (need <= r->n) return TIDE_OK;
  int64_t nc = r->n ? r->n : 4096;
  while (nc < need) nc *= 2;
  if (nc > r->limit) nc = r->limit;
  float *t = tide_xrealloc(r->table, (size_t)nc * 64 * sizeof(float));
  if (!t) return TIDE_ERR(TIDE_E_NOMEM, "rope table of %lld positions", (long long)nc);
  for (int64_t p = r->n; p < nc; p++) row_compute(r, p, t + p * 64);
  r->table = t;
  r->n = nc;
  return TIDE_OK;
}

const float *tide_rope_row(const tide_rope *r, int64_t p, float *tmp) {
  if (p < r->n) return r->table + p * 64;
  row_compute(r, p, tmp);
  return tmp;
}

int tide_rope_freqs(const tide_rope *r, float *freqs, int32_t n) {
  if (!r || !freqs) return TIDE_ERR(TIDE_E_INVALID, "rope or freqs is NULL");
  if (n < 32) return TIDE_ERR(TIDE_E_INVALID, "freqs has %d floats, needs 32", n);
  memcpy(freqs, r->freq, sizeof r->freq);
  return TIDE_OK;
}

int tide_rope_cos_sin(tide_rope *r, int64_t p, float *cs, int32_t n) {
  if (!r || !cs) return TIDE_ERR(TIDE_E_INVALID, "rope or cs is NULL");
  if (n < 64) return TIDE_ERR(TIDE_E_INVALID, "cs has %d floats, needs 64", n);
  if (p < 0) return TIDE_ERR(TIDE_E_RANGE, "position %lld", (long long)p);
  float tmp[64];
  memcpy(cs, tide_rope_row(r, p, tmp), 64 * sizeof(float));
  return TIDE_OK;
}

void tide_rope64(float *x, const float *cs, int inverse) {
  for (int i = 0; i < 32; i++) {
    float e = x[2 * i], o = x[2 * i + 1], c = cs[i], s = cs[32 + i];
    if (!inverse) {
      x[2 * i] = e * c - o * s;
      x[2 * i + 1] = e * s + o * c;
    } else {
      x[2 * i] = e * c + o * s;
      x[2 * i + 1] = o * c - e * s;
    }
  }
}

int tide_rope_apply(tide_rope *r, tide_tensor *x, const tide_tensor *pos, int inverse) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "rope is NULL");
  TIDE_CHECK(tide_check_tensor(__func__, "x", x, TIDE_DT(TIDE_F32), -1));
  TIDE_CHECK(tide_check_tensor(__func__, "pos", pos, TIDE_DT(TIDE_I64), -1));
  if (x->ndim < 1 || x->sizes[x->ndim - 1] != 64 || !tide_tensor_is_contiguous(x) || !tide_tensor_is_contiguous(pos))
    return TIDE_ERR(TIDE_E_INVALID, "x must be contiguous with last dim 64, pos contiguous");
  int64_t rows = tide_tensor_numel(x) / 64;
  if (tide_tensor_numel(pos) != rows)
    return TIDE_ERR(TIDE_E_INVALID, "pos has %lld elements for %lld rows", (long long)tide_tensor_numel(pos), (long long)rows);
  const int64_t *pp = pos->data;
  for (int64_t i = 0; i < rows; i++)
    if (pp[i] < 0) return TIDE_ERR(TIDE_E_RANGE, "position %lld at row %lld", (long long)pp[i], (long long)i);
  float tmp[64];
  for (int64_t i = 0; i < rows; i++) tide_rope64((float *)x->data + i * 64, tide_rope_row(r, pp[i], tmp), inverse);
  return TIDE_OK;
}
