/* refmodel.c - the golden reference of the whole DeepSeek-V4 forward pass.
 *
 * Straightforward scalar C, one token at a time, dense (unpaged) state, and
 * no code shared with the fast path: its own weight decoding, its own RoPE,
 * compressor, indexer, attention, mHC and MoE. It applies the quantisation
 * points of vLLM's CPU path (doc 6.21): bf16 rounding after every GEMM, after
 * RMSNorm, of q after norm+rope, of KV after rope; fp8 tiles with UE8M0
 * scales for cached KV; fp8 with power-of-two scales for the indexer; P
 * rounded to bf16 before P.V. Speed is not a goal: tests run it on tiny
 * checkpoints, and `model:use_reference()` runs it layer by layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ref/refmodel.h"

/* ---- number formats, decoded independently of kernels/convert.c ---- */
static float bf16_val(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float rbf(float x) { /* round to bf16 precision, nearest even */
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float f16_val(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m + 1024), e - 25);
  return (h & 0x8000) ? -v : v;
}
static float e4m3_val(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
  return (b & 0x80) ? -v : v;
}
static float e8m0_val(uint8_t b) { return b == 255 ? NAN : ldexpf(1.0f, (int)b - 127); }
static float e2m1_val(int c) {
  static const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
/* value -> nearest e4m3 value (ties to even), saturating at 448 */
static float e4m3_round(float x) {
  if (isnan(x)) return x;
  float a = fabsf(x);
  if (a >= 448.0f) return copysignf(448.0f, x);
  int e;
  frexpf(a, &e);                  /* a = f * 2^e, f in [0.5, 1) */
  int ex = e - 1;                 /* a in [2^ex, 2^(ex+1)) */
  if (ex < -6) ex = -6;           /* subnormal spacing 2^-9 */
  float q = ldexpf(1.0f, ex - 3); /* spacing of representable values */
  float r = nearbyintf(a / q) * q; /* default rounding mode: nearest even */
  return copysignf(r, x);
}
/* smallest power of two >= x, as exponent (ceil(log2 x)), exact */
static int ceil_log2(float x) {
  int e;
  float f = frexpf(x, &e);
  return f == 0.5f ? e - 1 : e;
}

/* ---- weights ---- */
typedef refm_w rw; /* kind: 0 f32, 1 bf16, 2 f16, 3 fp8 block, 4 mxfp4 */

static int rw_get(refm *m, const char *name, rw *out, int64_t n, int64_t k, int required) {
  memset(out, 0, sizeof *out);
  char full[240], sname[256];
  snprintf(full, sizeof full, "%s", name);
  int rc = m->get(m->ctx, full, &out->w);
  if (rc < 0) return required ? rc : 1;
  int dt = out->w.dtype;
  if (dt == TIDE_F8E4M3 || dt == TIDE_I8 || dt == TIDE_U8) {
    size_t l = strlen(full);
    if (l > 7 && !strcmp(full + l - 7, ".weight")) snprintf(sname, sizeof sname, "%.*s.scale", (int)(l - 7), full);
    else snprintf(sname, sizeof sname, "%s.scale", full);
    TIDE_CHECK(m->get(m->ctx, sname, &out->s));
  }
  out->n = n;
  out->k = k;
  switch (dt) {
    case TIDE_F32: out->kind = 0; break;
    case TIDE_BF16: out->kind = 1; break;
    case TIDE_F16: out->kind = 2; break;
    case TIDE_F8E4M3: out->kind = 3; break;
    case TIDE_I8: case TIDE_U8: out->kind = 4; break;
    default: return TIDE_ERR(TIDE_E_UNSUPPORTED, "reference: tensor %s has dtype %s", name, tide_dtype_name(dt));
  }
  int64_t wn = out->w.ndim >= 1 ? out->w.sizes[0] : 1;
  int64_t wk = out->w.ndim == 2 ? out->w.sizes[1] * (out->kind == 4 ? 2 : 1) : 1;
  if (k > 0 && (wn != n || wk != k))
    return TIDE_ERR(TIDE_E_FORMAT, "reference: %s has shape [%lld, %lld] (as weights), expected [%lld, %lld]", name,
                    (long long)wn, (long long)wk, (long long)n, (long long)k);
  return TIDE_OK;
}

static float rw_at(const rw *w, int64_t i, int64_t j) {
  const uint8_t *p = w->w.data;
  switch (w->kind) {
    case 0: return ((const float *)p)[i * w->k + j];
    case 1: return bf16_val(((const uint16_t *)p)[i * w->k + j]);
    case 2: return f16_val(((const uint16_t *)p)[i * w->k + j]);
    case 3: {
      int64_t sc = (w->k + 127) / 128;
      return e4m3_val(p[i * w->k + j]) * e8m0_val(((const uint8_t *)w->s.data)[(i / 128) * sc + j / 128]);
    }
    default: {
      uint8_t byte = p[i * (w->k / 2) + j / 2];
      return e2m1_val((j & 1) ? byte >> 4 : byte & 15) * e8m0_val(((const uint8_t *)w->s.data)[i * (w->k / 32) + j / 32]);
    }
  }
}
/* a 1-d vector of any float dtype */
static float vec_at(const tide_tensor *t, int64_t i) {
  switch (t->dtype) {
    case TIDE_F32: return ((const float *)t->data)[i];
    case TIDE_BF16: return bf16_val(((const uint16_t *)t->data)[i]);
    case TIDE_F16: return f16_val(((const uint16_t *)t->data)[i]);
    default: return NAN;
  }
}

/* Decoding every weight element on every use dominates the reference's
 * time, so each matrix is decoded once (by rw_at, the same values) into an
 * f32 copy while a process-wide budget lasts; beyond it (large models),
 * elements are decoded on the fly as before. Either way the numbers are
 * identical. */
static int64_t deq_budget = (int64_t)2 << 30;   /* bytes of decoded copies, all reference models */
static const float *rw_rows(rw *w) {
  if (w->f32) return w->f32;
  int64_t bytes = w->n * w->k * (int64_t)sizeof(float);
  if (bytes > deq_budget) return NULL;
  float *f = tide_xmalloc((size_t)bytes);
  if (!f) {
    tide_clear_error();
    return NULL;
  }
  deq_budget -= bytes;
  for (int64_t i = 0; i < w->n; i++)
    for (int64_t j = 0; j < w->k; j++) f[i * w->k + j] = rw_at(w, i, j);
  w->f32 = f;
  return f;
}
static void rw_release(rw *w) {
  if (!w->f32) return;
  deq_budget += w->n * w->k * (int64_t)sizeof(float);
  tide_xfree(w->f32);
  w->f32 = NULL;
}

/* y[n] = round_bf16(sum_k x[k] W[n,k]) (accumulated in double) */
static void gemv(rw *w, const float *x, float *y, int round) {
  const float *f = rw_rows(w);
  for (int64_t i = 0; i < w->n; i++) {
    double acc = 0;
    if (f)
      for (int64_t j = 0; j < w->k; j++) acc += (double)x[j] * f[i * w->k + j];
    else
      for (int64_t j = 0; j < w->k; j++) acc += (double)x[j] * rw_at(w, i, j);
    y[i] = round ? rbf((float)acc) : (float)acc;
  }
}

static void rmsnorm(float *x, int64_t n, const tide_tensor *w, float eps, int round) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float r = (float)(1.0 / sqrt(ss / (double)n + eps));
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] * r * (w ? vec_at(w, i) : 1.0f);
    x[i] = round ? rbf(v) : v;
  }
}

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- RoPE (GPT-J interleaved pairs) ---- */
static void rope_freqs(const refm_cfg *c, int compressed, float *f) {
  double theta = compressed ? c->compress_rope_theta : c->rope_theta;
  for (int i = 0; i < 32; i++) f[i] = (float)(1.0 / pow(theta, (double)(2 * i) / 64.0));
  if (!compressed || !c->yarn) return;
  double L0 = c->yarn_original_max, s = c->yarn_factor;
  double clo = 64.0 * log(L0 / (2 * M_PI * c->yarn_beta_fast)) / (2 * log(theta));
  double chi = 64.0 * log(L0 / (2 * M_PI * c->yarn_beta_slow)) / (2 * log(theta));
  double lo = floor(clo), hi = ceil(chi);
  if (lo < 0) lo = 0;
  if (hi > 63) hi = 63;
  if (lo == hi) hi += 0.001;
  for (int i = 0; i < 32; i++) {
    double ramp = (i - lo) / (hi - lo);
    if (ramp < 0) ramp = 0;
    if (ramp > 1) ramp = 1;
    f[i] = (float)((double)f[i] * (1 - ramp) + (double)f[i] / s * ramp);
  }
}
static void rope_cs(const float *f, int64_t p, float *cs, float *sn) {
  for (int i = 0; i < 32; i++) {
    float ang = (float)p * f[i];
    cs[i] = (float)cos((double)ang);
    sn[i] = (float)sin((double)ang);
  }
}
/* rotate 64 dims in place; inverse when inv */
static void rope64(float *x, const float *f, int64_t p, int inv) {
  float cs[32], sn[32];
  rope_cs(f, p, cs, sn);
  for (int i = 0; i < 32; i++) {
    float e = x[2 * i], o = x[2 * i + 1];
    if (!inv) {
      x[2 * i] = e * cs[i] - o * sn[i];
      x[2 * i + 1] = e * sn[i] + o * cs[i];
    } else {
      x[2 * i] = e * cs[i] + o * sn[i];
      x[2 * i + 1] = o * cs[i] - e * sn[i];
    }
  }
}

/* ---- fp8_ds_mla quantisation of a 512-vector (7 tiles of 64 + 64 bf16) ----
 * `flush`: the SWA insert kernel flushes values whose scaled magnitude is
 * below the smallest fp8 normal; the compressor keeps subnormals. The
 * result is the dequantised vector the attention reads. */
static void quant_mla(const float *in, float *out, int flush) {
  for (int t = 0; t < 7; t++) {
    float a = 0;
    for (int i = 0; i < 64; i++) a = fmaxf(a, fabsf(in[64 * t + i]));
    float s = fmaxf(a / 448.0f, 1e-4f);
    int e = ceil_log2(s);
    for (int i = 0; i < 64; i++) {
      float v = ldexpf(in[64 * t + i], -e);
      if (v > 448.0f) v = 448.0f;
      if (v < -448.0f) v = -448.0f;
      if (flush && fabsf(v) < 0.015625f) v = 0.0f;
      out[64 * t + i] = ldexpf(e4m3_round(v), e);
    }
  }
  for (int i = 448; i < 512; i++) out[i] = rbf(in[i]);
}

/* indexer key/query quantisation: one power-of-two scale for 128 dims */
static float quant_idx(const float *in, float *q8, int n) {
  float a = 1e-4f;
  for (int i = 0; i < n; i++) a = fmaxf(a, fabsf(in[i]));
  int e = ceil_log2(a / 448.0f);
  for (int i = 0; i < n; i++) {
    float v = ldexpf(in[i], -e);
    if (v > 448.0f) v = 448.0f;
    if (v < -448.0f) v = -448.0f;
    q8[i] = e4m3_round(v);
  }
  return ldexpf(1.0f, e);
}

/* ---- growable per-layer state ---- */
static int grow(float **p, int64_t *cap, int64_t need, int64_t width) {
  if (need <= *cap) return TIDE_OK;
  int64_t nc = *cap ? *cap : 64;
  while (nc < need) nc *= 2;
  float *q = tide_xrealloc(*p, (size_t)(nc * width) * sizeof(float));
  if (!q) return TIDE_E_NOMEM;
  *p = q;
  *cap = nc;
  return TIDE_OK;
}

static void layer_free(refm_layer *l) {
  rw *ws[] = {&l->wq_a, &l->wq_b, &l->wkv, &l->wo_a, &l->wo_b, &l->c_wkv, &l->c_wgate, &l->i_wq_b, &l->i_wproj,
              &l->ic_wkv, &l->ic_wgate, &l->gate, &l->sh_w1, &l->sh_w2, &l->sh_w3};
  for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
    rw_release(ws[i]);
    tide_tensor_release(&ws[i]->w);
    tide_tensor_release(&ws[i]->s);
  }
  tide_tensor *ts[] = {&l->attn_norm, &l->ffn_norm, &l->q_norm, &l->kv_norm, &l->sink, &l->hc_attn_fn, &l->hc_attn_base,
                       &l->hc_attn_scale, &l->hc_ffn_fn, &l->hc_ffn_base, &l->hc_ffn_scale, &l->c_ape, &l->c_norm,
                       &l->ic_ape, &l->ic_norm, &l->gate_bias, &l->tid2eid};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tide_tensor_release(ts[i]);
  if (l->experts) {
    for (int e = 0; e < l->n_experts; e++)
      for (int j = 0; j < 3; j++) {
        rw_release(&l->experts[3 * e + j]);
        tide_tensor_release(&l->experts[3 * e + j].w);
        tide_tensor_release(&l->experts[3 * e + j].s);
      }
    tide_xfree(l->experts);
  }
  tide_xfree(l->win);
  tide_xfree(l->cst);
  tide_xfree(l->ist);
  tide_xfree(l->ckv);
  tide_xfree(l->ik);
  tide_xfree(l->iks);
  tide_xfree(l->forced_topk);
  tide_xfree(l->forced_route);
  tide_xfree(l->last_sel);
}

void refm_free(refm *m) {
  if (!m) return;
  if (m->layers)
    for (int i = 0; i < m->cfg.n_layers + (m->cfg.has_mtp ? 1 : 0); i++) layer_free(&m->layers[i]);
  tide_xfree(m->layers);
  tide_tensor_release(&m->embed);
  tide_tensor_release(&m->norm);
  tide_tensor_release(&m->hc_head_fn);
  tide_tensor_release(&m->hc_head_base);
  tide_tensor_release(&m->hc_head_scale);
  rw_release(&m->head);
  tide_tensor_release(&m->head.w);
  tide_tensor *mt[] = {&m->mtp_enorm, &m->mtp_hnorm, &m->mtp_norm, &m->mtp_hc_fn, &m->mtp_hc_base, &m->mtp_hc_scale,
                       &m->mtp_e.w, &m->mtp_e.s, &m->mtp_h.w, &m->mtp_h.s};
  rw_release(&m->mtp_e);
  rw_release(&m->mtp_h);
  for (size_t i = 0; i < sizeof mt / sizeof mt[0]; i++) tide_tensor_release(mt[i]);
  tide_xfree(m->Xmain);
  tide_xfree(m->scratch);
  tide_xfree(m);
}

static int get_vec(refm *m, const char *name, tide_tensor *out, int64_t n) {
  TIDE_CHECK(m->get(m->ctx, name, out));
  if (tide_tensor_numel(out) != n)
    return TIDE_ERR(TIDE_E_FORMAT, "reference: %s has %lld elements, expected %lld", name,
                    (long long)tide_tensor_numel(out), (long long)n);
  if (!tide_tensor_is_contiguous(out)) return TIDE_ERR(TIDE_E_FORMAT, "reference: %s is not contiguous", name);
  return TIDE_OK;
}

/* Load one block's weights (prefix pre, e.g. "layers.3." or "mtp.0."). */
static int load_block(refm *m, refm_layer *l, const char *pre, int r, int hash) {
  const refm_cfg *c = &m->cfg;
  int64_t d = c->hidden, hc = c->hc_mult, H = c->n_heads, D = 512, mix = (2 + hc) * hc;
  int rc = TIDE_OK;
  char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
#define TRY(x) do { rc = (x); if (rc < 0) return rc; } while (0)
  l->ratio = r;
  TRY(get_vec(m, NAME("%sattn_norm.weight", pre), &l->attn_norm, d));
  TRY(get_vec(m, NAME("%sffn_norm.weight", pre), &l->ffn_norm, d));
  TRY(get_vec(m, NAME("%shc_attn_fn", pre), &l->hc_attn_fn, mix * hc * d));
  TRY(get_vec(m, NAME("%shc_attn_base", pre), &l->hc_attn_base, mix));
  TRY(get_vec(m, NAME("%shc_attn_scale", pre), &l->hc_attn_scale, 3));
  TRY(get_vec(m, NAME("%shc_ffn_fn", pre), &l->hc_ffn_fn, mix * hc * d));
  TRY(get_vec(m, NAME("%shc_ffn_base", pre), &l->hc_ffn_base, mix));
  TRY(get_vec(m, NAME("%shc_ffn_scale", pre), &l->hc_ffn_scale, 3));
  TRY(rw_get(m, NAME("%sattn.wq_a.weight", pre), &l->wq_a, c->q_lora, d, 1));
  TRY(get_vec(m, NAME("%sattn.q_norm.weight", pre), &l->q_norm, c->q_lora));
  TRY(rw_get(m, NAME("%sattn.wq_b.weight", pre), &l->wq_b, H * D, c->q_lora, 1));
  TRY(rw_get(m, NAME("%sattn.wkv.weight", pre), &l->wkv, D, d, 1));
  TRY(get_vec(m, NAME("%sattn.kv_norm.weight", pre), &l->kv_norm, D));
  TRY(rw_get(m, NAME("%sattn.wo_a.weight", pre), &l->wo_a, c->o_groups * c->o_lora, (H / c->o_groups) * D, 1));
  TRY(rw_get(m, NAME("%sattn.wo_b.weight", pre), &l->wo_b, d, c->o_groups * c->o_lora, 1));
  TRY(get_vec(m, NAME("%sattn.attn_sink", pre), &l->sink, H));
  if (r > 1) {
    int64_t cw = (r == 4 ? 2 : 1) * D;
    TRY(rw_get(m, NAME("%sattn.compressor.wkv.weight", pre), &l->c_wkv, cw, d, 1));
    TRY(rw_get(m, NAME("%sattn.compressor.wgate.weight", pre), &l->c_wgate, cw, d, 1));
    TRY(get_vec(m, NAME("%sattn.compressor.ape", pre), &l->c_ape, r * cw));
    TRY(get_vec(m, NAME("%sattn.compressor.norm.weight", pre), &l->c_norm, D));
  }
  if (r == 4) {
    TRY(rw_get(m, NAME("%sattn.indexer.wq_b.weight", pre), &l->i_wq_b, c->idx_heads * 128, c->q_lora, 1));
    TRY(rw_get(m, NAME("%sattn.indexer.weights_proj.weight", pre), &l->i_wproj, c->idx_heads, d, 1));
    TRY(rw_get(m, NAME("%sattn.indexer.compressor.wkv.weight", pre), &l->ic_wkv, 256, d, 1));
    TRY(rw_get(m, NAME("%sattn.indexer.compressor.wgate.weight", pre), &l->ic_wgate, 256, d, 1));
    TRY(get_vec(m, NAME("%sattn.indexer.compressor.ape", pre), &l->ic_ape, 4 * 256));
    TRY(get_vec(m, NAME("%sattn.indexer.compressor.norm.weight", pre), &l->ic_norm, 128));
  }
  TRY(rw_get(m, NAME("%sffn.gate.weight", pre), &l->gate, c->n_experts, d, 1));
  if (hash) {
    TRY(m->get(m->ctx, NAME("%sffn.gate.tid2eid", pre), &l->tid2eid));
    if (l->tid2eid.ndim != 2 || l->tid2eid.sizes[0] != c->vocab || l->tid2eid.sizes[1] != c->topk ||
        (l->tid2eid.dtype != TIDE_I64 && l->tid2eid.dtype != TIDE_I32)) {
      rc = TIDE_ERR(TIDE_E_FORMAT, "reference: %s must be i64/i32 [%lld, %d]", nm, (long long)c->vocab, c->topk);
      return rc;
    }
  } else {
    TRY(get_vec(m, NAME("%sffn.gate.bias", pre), &l->gate_bias, c->n_experts));
  }
  l->n_experts = c->n_experts;
  l->experts = tide_xcalloc((size_t)c->n_experts * 3, sizeof(rw));
  if (!l->experts) return TIDE_E_NOMEM;
  for (int e = 0; e < c->n_experts; e++) {
    TRY(rw_get(m, NAME("%sffn.experts.%d.w1.weight", pre, e), &l->experts[3 * e], c->inter, d, 1));
    TRY(rw_get(m, NAME("%sffn.experts.%d.w2.weight", pre, e), &l->experts[3 * e + 1], d, c->inter, 1));
    TRY(rw_get(m, NAME("%sffn.experts.%d.w3.weight", pre, e), &l->experts[3 * e + 2], c->inter, d, 1));
  }
  int64_t sh = (int64_t)c->inter * c->n_shared;
  if (c->n_shared > 0) {
    TRY(rw_get(m, NAME("%sffn.shared_experts.w1.weight", pre), &l->sh_w1, sh, d, 1));
    TRY(rw_get(m, NAME("%sffn.shared_experts.w2.weight", pre), &l->sh_w2, d, sh, 1));
    TRY(rw_get(m, NAME("%sffn.shared_experts.w3.weight", pre), &l->sh_w3, sh, d, 1));
  }

#undef TRY
#undef NAME
  return rc;
}

int refm_new(refm **out, const refm_cfg *cfg, refm_getter get, void *ctx) {
  *out = NULL;
  refm *m = tide_xcalloc(1, sizeof *m);
  if (!m) return TIDE_E_NOMEM;
  m->cfg = *cfg;
  if (cfg->hc_mult < 1 || cfg->hc_mult > 7 || cfg->topk < 1 || cfg->topk > 64 || cfg->n_layers < 0 ||
      cfg->n_layers > 256 || cfg->n_heads % (cfg->o_groups ? cfg->o_groups : 1) || !cfg->o_groups) {
    tide_xfree(m);
    return TIDE_ERR(TIDE_E_UNSUPPORTED, "reference: unsupported config (hc_mult %d, topk %d, layers %d, heads %d, groups %d)",
                    cfg->hc_mult, cfg->topk, cfg->n_layers, cfg->n_heads, cfg->o_groups);
  }
  m->get = get;
  m->ctx = ctx;
  const refm_cfg *c = &m->cfg;
  int64_t d = c->hidden, hc = c->hc_mult;
  int rc = TIDE_OK;
#define TRY(x) do { rc = (x); if (rc < 0) goto fail; } while (0)
  TRY(get_vec(m, "embed.weight", &m->embed, c->vocab * d));
  TRY(get_vec(m, "norm.weight", &m->norm, d));
  TRY(get_vec(m, "hc_head_fn", &m->hc_head_fn, hc * hc * d));
  TRY(get_vec(m, "hc_head_base", &m->hc_head_base, hc));
  TRY(get_vec(m, "hc_head_scale", &m->hc_head_scale, 1));
  TRY(rw_get(m, "head.weight", &m->head, c->vocab, d, 1));
  m->layers = tide_xcalloc((size_t)c->n_layers + 1, sizeof(refm_layer));
  if (!m->layers) { rc = TIDE_E_NOMEM; goto fail; }
  int nblk = c->n_layers + (c->has_mtp ? 1 : 0);
  for (int L = 0; L < nblk; L++) {
    int mtp = L == c->n_layers;
    int r0 = mtp ? c->mtp_ratio : c->ratios[L];
    char pre[32];
    if (mtp) snprintf(pre, sizeof pre, "mtp.0.");
    else snprintf(pre, sizeof pre, "layers.%d.", L);
    TRY(load_block(m, &m->layers[L], pre, r0 <= 1 ? 1 : r0, !mtp && L < c->n_hash_layers));
  }
  if (c->has_mtp) {
    m->Xmain = tide_xcalloc((size_t)(hc * d), sizeof(float));
    if (!m->Xmain) { rc = TIDE_E_NOMEM; goto fail; }
    TRY(get_vec(m, "mtp.0.enorm.weight", &m->mtp_enorm, d));
    TRY(get_vec(m, "mtp.0.hnorm.weight", &m->mtp_hnorm, d));
    TRY(get_vec(m, "mtp.0.norm.weight", &m->mtp_norm, d));
    TRY(get_vec(m, "mtp.0.hc_head_fn", &m->mtp_hc_fn, hc * hc * d));
    TRY(get_vec(m, "mtp.0.hc_head_base", &m->mtp_hc_base, hc));
    TRY(get_vec(m, "mtp.0.hc_head_scale", &m->mtp_hc_scale, 1));
    TRY(rw_get(m, "mtp.0.e_proj.weight", &m->mtp_e, d, d, 1));
    TRY(rw_get(m, "mtp.0.h_proj.weight", &m->mtp_h, d, d, 1));
  }
#undef TRY
  rope_freqs(c, 0, m->freq_plain);
  rope_freqs(c, 1, m->freq_comp);
  *out = m;
  return TIDE_OK;
fail:
  refm_free(m);
  return rc;
}

void refm_reset(refm *m) {
  m->len = 0;
  for (int L = 0; L < m->cfg.n_layers + (m->cfg.has_mtp ? 1 : 0); L++) {
    refm_layer *l = &m->layers[L];
    l->n_tok = l->n_ent = 0;
  }
}

/* per-channel softmax pooling of compressor rows for entry j (doc 2.2.4):
 * rows are [a (c*dc) | b+ape (c*dc)] per position; C4 overlaps the previous
 * block (its first half) with the current block (second half). */
static void pool(const float *st, int64_t row_w, int r, int64_t dc, int64_t j, float *out) {
  int overlap = r == 4;
  int64_t cdc = (overlap ? 2 : 1) * dc;
  for (int64_t ch = 0; ch < dc; ch++) {
    double mx = -INFINITY;
    for (int part = overlap ? 0 : 1; part < 2; part++) {
      int64_t blk = j - 1 + part;
      if (blk < 0) continue;
      int64_t off = overlap ? (part == 0 ? 0 : dc) : 0;
      for (int t = 0; t < r; t++) {
        const float *row = st + (blk * r + t) * row_w;
        mx = fmax(mx, row[cdc + off + ch]);
      }
    }
    double z = 0, acc = 0;
    for (int part = overlap ? 0 : 1; part < 2; part++) {
      int64_t blk = j - 1 + part;
      if (blk < 0) continue;
      int64_t off = overlap ? (part == 0 ? 0 : dc) : 0;
      for (int t = 0; t < r; t++) {
        const float *row = st + (blk * r + t) * row_w;
        double w = exp((double)row[cdc + off + ch] - mx);
        z += w;
        acc += w * row[off + ch];
      }
    }
    out[ch] = (float)(acc / z);
  }
}

/* ---- one attention layer for one token ---- */
static int attn_layer(refm *m, int L, const float *x, int64_t p, float *out) {
  const refm_cfg *c = &m->cfg;
  refm_layer *l = &m->layers[L];
  int64_t H = c->n_heads, D = 512, ql = c->q_lora;
  int r = l->ratio;
  const float *freq = r > 1 ? m->freq_comp : m->freq_plain;
  float *qr = m->scratch, *kv = qr + ql, *q = kv + D, *tmp = q + H * D;
  /* 1. projections and norms */
  gemv(&l->wq_a, x, qr, 1);
  gemv(&l->wkv, x, kv, 1);
  rmsnorm(qr, ql, &l->q_norm, c->eps, 1);
  rmsnorm(kv, D, &l->kv_norm, c->eps, 1);
  gemv(&l->wq_b, qr, q, 1);
  for (int64_t h = 0; h < H; h++) {
    float *qh = q + h * D;
    rmsnorm(qh, D, NULL, c->eps, 0);
    rope64(qh + 448, freq, p, 0);
    for (int64_t i = 0; i < D; i++) qh[i] = rbf(qh[i]);
  }
  /* 2. KV into the window store (dequantised view of what the cache holds) */
  rope64(kv + 448, freq, p, 0);
  for (int64_t i = 0; i < D; i++) kv[i] = rbf(kv[i]);
  TIDE_CHECK(grow(&l->win, &l->win_cap, p + 1, D));
  quant_mla(kv, l->win + p * D, 1);
  l->n_tok = p + 1;
  /* 3. compressors (save state rows; emit an entry when a block completes) */
  int64_t n_vis = 0;
  if (r > 1) {
    int64_t cw = (r == 4 ? 2 : 1) * D, rw_ = 2 * cw;
    TIDE_CHECK(grow(&l->cst, &l->cst_cap, p + 1, rw_));
    float *row = l->cst + p * rw_;
    gemv(&l->c_wkv, x, row, 1);
    gemv(&l->c_wgate, x, row + cw, 1);
    for (int64_t i = 0; i < cw; i++) row[cw + i] += vec_at(&l->c_ape, (p % r) * cw + i);
    if (r == 4) {
      int64_t iw = 2 * 256;
      TIDE_CHECK(grow(&l->ist, &l->ist_cap, p + 1, iw));
      float *irow = l->ist + p * iw;
      gemv(&l->ic_wkv, x, irow, 1);
      gemv(&l->ic_wgate, x, irow + 256, 1);
      for (int64_t i = 0; i < 256; i++) irow[256 + i] += vec_at(&l->ic_ape, (p % 4) * 256 + i);
    }
    if ((p + 1) % r == 0) {
      int64_t j = p / r;
      TIDE_CHECK(grow(&l->ckv, &l->ckv_cap, j + 1, D));
      float *e = tmp;
      pool(l->cst, rw_, r, D, j, e);
      rmsnorm(e, D, &l->c_norm, c->eps, 0);
      for (int64_t i = 0; i < 448; i++) e[i] = rbf(e[i]);
      rope64(e + 448, freq, j * r, 0);
      quant_mla(e, l->ckv + j * D, 0);
      if (r == 4) {
        TIDE_CHECK(grow(&l->ik, &l->ik_cap, j + 1, 128));
        TIDE_CHECK(grow(&l->iks, &l->iks_cap, j + 1, 1));
        float *k = tmp;
        pool(l->ist, 512, 4, 128, j, k);
        rmsnorm(k, 128, &l->ic_norm, c->eps, 0);
        rope64(k + 64, freq, j * r, 0);
        for (int i = 0; i < 128; i++) k[i] = rbf(k[i]);
        l->iks[j] = quant_idx(k, l->ik + j * 128, 128);
      }
      l->n_ent = j + 1;
    }
    n_vis = (p + 1) / r;
  }
  /* 4. which compressed entries this token attends to */
  int64_t *sel = m->sel;
  int64_t nsel = 0;
  if (r == 128) {
    for (int64_t j = 0; j < n_vis; j++) sel[nsel++] = j;
  } else if (r == 4) {
    int64_t K = c->index_topk;
    int32_t *forced = (l->forced_topk && p < l->forced_cap && l->forced_topk[p * (K + 1)] >= 0) ? l->forced_topk + p * (K + 1) : NULL;
    if (forced) {
      nsel = forced[0];
      for (int64_t i = 0; i < nsel; i++) sel[i] = forced[1 + i];
    } else if (n_vis <= K) {
      for (int64_t j = 0; j < n_vis; j++) sel[nsel++] = j;
    } else {
      int64_t nI = c->idx_heads;
      float *qi = tmp, *wr = qi + nI * 128, *q8 = wr + nI, *sq = q8 + nI * 128;
      gemv(&l->i_wq_b, qr, qi, 1);
      gemv(&l->i_wproj, x, wr, 1);
      for (int64_t h = 0; h < nI; h++) {
        float *qh = qi + h * 128;
        rope64(qh + 64, freq, p, 0);
        for (int i = 64; i < 128; i++) qh[i] = rbf(qh[i]);
        sq[h] = quant_idx(qh, q8 + h * 128, 128);
      }
      double wscale = 1.0 / sqrt(128.0) / sqrt((double)nI);
      float *score = m->score;
      for (int64_t j = 0; j < n_vis; j++) {
        double s = 0;
        for (int64_t h = 0; h < nI; h++) {
          double dot = 0;
          for (int i = 0; i < 128; i++) dot += (double)q8[h * 128 + i] * l->ik[j * 128 + i];
          if (dot > 0) s += (double)wr[h] * sq[h] * wscale * dot;
        }
        score[j] = (float)(s * l->iks[j]);
      }
      /* top-K by repeated selection: larger score first, ties to the smaller index */
      char *taken = (char *)(score + n_vis);
      memset(taken, 0, (size_t)n_vis);
      for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n_vis; j++)
          if (!taken[j] && (best < 0 || score[j] > score[best])) best = j;
        taken[best] = 1;
        sel[nsel++] = best;
      }
      /* report sorted, like the dumps */
      for (int64_t i = 1; i < nsel; i++)
        for (int64_t k = i; k > 0 && sel[k - 1] > sel[k]; k--) {
          int64_t t = sel[k];
          sel[k] = sel[k - 1];
          sel[k - 1] = t;
        }
    }
  }
  m->last_nsel = nsel;
  if (r == 4) {
    if (nsel > l->last_sel_cap) {
      int32_t *q = tide_xrealloc(l->last_sel, (size_t)nsel * sizeof(int32_t));
      if (!q) return TIDE_E_NOMEM;
      l->last_sel = q;
      l->last_sel_cap = nsel;
    }
    for (int64_t i = 0; i < nsel; i++) l->last_sel[i] = (int32_t)sel[i];
    l->last_nsel = nsel;
  }
  /* 5. attention over window + selected compressed entries, sink in the denominator */
  int64_t w0 = p - c->window + 1 < 0 ? 0 : p - c->window + 1, nw = p - w0 + 1;
  int64_t nk = nw + nsel;
  float *o = tmp; /* [H, D] */
  float *sc = m->score;
  double scale = 1.0 / sqrt((double)D);
  for (int64_t h = 0; h < H; h++) {
    const float *qh = q + h * D;
    double mx = -INFINITY;
    for (int64_t e = 0; e < nk; e++) {
      const float *k = e < nw ? l->win + (w0 + e) * D : l->ckv + sel[e - nw] * D;
      double dot = 0;
      for (int64_t i = 0; i < D; i++) dot += (double)qh[i] * k[i];
      sc[e] = (float)(dot * scale);
      mx = fmax(mx, sc[e]);
    }
    double z = 0;
    double acc[512];
    for (int64_t i = 0; i < D; i++) acc[i] = 0;
    for (int64_t e = 0; e < nk; e++) {
      float pe = expf(sc[e] - (float)mx);
      z += pe;
      float pb = rbf(pe);
      const float *k = e < nw ? l->win + (w0 + e) * D : l->ckv + sel[e - nw] * D;
      for (int64_t i = 0; i < D; i++) acc[i] += (double)pb * k[i];
    }
    double den = z + exp((double)vec_at(&l->sink, h) - mx);
    float *oh = o + h * D;
    for (int64_t i = 0; i < D; i++) oh[i] = rbf((float)(acc[i] / den));
    /* 6. inverse RoPE at the query position, then bf16 */
    rope64(oh + 448, freq, p, 1);
    for (int64_t i = 448; i < D; i++) oh[i] = rbf(oh[i]);
  }
  /* 7. grouped wo_a, then wo_b */
  int64_t G = c->o_groups, hpg = H / G, kg = hpg * D;
  float *z = m->score; /* [G * o_lora] */
  for (int64_t g = 0; g < G; g++)
    for (int64_t i = 0; i < c->o_lora; i++) {
      double acc = 0;
      int64_t row = g * c->o_lora + i;
      for (int64_t k = 0; k < kg; k++) acc += (double)o[g * kg + k] * rw_at(&l->wo_a, row, k);
      z[row] = rbf((float)acc);
    }
  gemv(&l->wo_b, z, out, 1);
  return TIDE_OK;
}

/* ---- MoE for one token ---- */
static float sqrt_softplus(float v) {
  double sp = v > 20 ? v : log1p(exp((double)v));
  return (float)sqrt(sp);
}

static void expert(rw *w1, rw *w2, rw *w3, const float *x, float *h, float *g, float *y, float lim) {
  gemv(w1, x, g, 1);
  gemv(w3, x, h, 1);
  for (int64_t i = 0; i < w1->n; i++) {
    float gv = g[i], uv = h[i];
    if (lim > 0) { /* swiglu_limit <= 0 means no clamp, as in DeepSeek's reference */
      gv = fminf(gv, lim);
      uv = fminf(fmaxf(uv, -lim), lim);
    }
    h[i] = rbf(gv / (1.0f + expf(-gv)) * uv);
  }
  gemv(w2, h, y, 1);
}

static int moe_layer(refm *m, int L, const float *x, int64_t id, int64_t p, float *out) {
  const refm_cfg *c = &m->cfg;
  refm_layer *l = &m->layers[L];
  int64_t d = c->hidden, E = c->n_experts, k = c->topk;
  float *logit = m->score, *sc = logit + E;
  gemv(&l->gate, x, logit, 0);
  for (int64_t e = 0; e < E; e++) {
    if (c->scoring == 1) sc[e] = sigm(logit[e]);
    else sc[e] = sqrt_softplus(logit[e]);
  }
  if (c->scoring == 2) { /* softmax */
    float mx = -INFINITY;
    double zz = 0;
    for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, logit[e]);
    for (int64_t e = 0; e < E; e++) zz += exp((double)logit[e] - mx);
    for (int64_t e = 0; e < E; e++) sc[e] = (float)(exp((double)logit[e] - mx) / zz);
  }
  int64_t ids[64];
  int32_t *forced = (l->forced_route && p < l->forced_rcap && l->forced_route[p * k] >= 0) ? l->forced_route + p * k : NULL;
  if (forced) {
    for (int64_t i = 0; i < k; i++) ids[i] = forced[i];
  } else if (L < c->n_hash_layers) {
    if (id < 0 || id >= c->vocab) return TIDE_ERR(TIDE_E_RANGE, "reference: token id %lld out of range", (long long)id);
    for (int64_t i = 0; i < k; i++) {
      int64_t v = l->tid2eid.dtype == TIDE_I64 ? ((const int64_t *)l->tid2eid.data)[id * k + i]
                                               : ((const int32_t *)l->tid2eid.data)[id * k + i];
      if (v < 0 || v >= E) return TIDE_ERR(TIDE_E_FORMAT, "reference: tid2eid[%lld] = %lld out of range", (long long)id, (long long)v);
      ids[i] = v;
    }
  } else {
    float *biased = sc + E;
    for (int64_t e = 0; e < E; e++) biased[e] = sc[e] + vec_at(&l->gate_bias, e);
    for (int64_t i = 0; i < k; i++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++) {
        int used = 0;
        for (int64_t t = 0; t < i; t++) used |= ids[t] == e;
        if (!used && (best < 0 || biased[e] > biased[best])) best = e;
      }
      ids[i] = best;
    }
  }
  double wsum = 0;
  for (int64_t i = 0; i < k; i++) wsum += sc[ids[i]];
  float wts[64];
  for (int64_t i = 0; i < k; i++)
    wts[i] = (float)((c->norm_topk ? sc[ids[i]] / wsum : sc[ids[i]]) * c->routed_scale);
  for (int64_t i = 0; i < k; i++) {
    m->last_route[i] = (int32_t)ids[i];
    m->last_wts[i] = wts[i];
    l->last_route[i] = (int32_t)ids[i];
    l->last_wts[i] = wts[i];
  }
  double *acc = m->dacc;
  for (int64_t i = 0; i < d; i++) acc[i] = 0;
  float *h = m->hbuf, *g = h + c->inter * (c->n_shared > 1 ? c->n_shared : 1), *y = g + c->inter * (c->n_shared > 1 ? c->n_shared : 1);
  for (int64_t i = 0; i < k; i++) {
    rw *ex = &l->experts[3 * ids[i]];
    expert(&ex[0], &ex[1], &ex[2], x, h, g, y, c->swiglu_limit);
    for (int64_t j = 0; j < d; j++) acc[j] += (double)wts[i] * y[j];
  }
  if (c->n_shared > 0) {
    expert(&l->sh_w1, &l->sh_w2, &l->sh_w3, x, h, g, y, c->swiglu_limit);
    for (int64_t j = 0; j < d; j++) acc[j] += y[j];
  }
  for (int64_t j = 0; j < d; j++) out[j] = rbf((float)acc[j]);
  return TIDE_OK;
}

/* ---- mHC ---- */
static void hc_pre(refm *m, const float *X, const tide_tensor *fn, const tide_tensor *base, const tide_tensor *scale,
                   float *x, float *post, float *comb) {
  const refm_cfg *c = &m->cfg;
  int64_t hc = c->hc_mult, d = c->hidden, n = hc * d, mix = (2 + hc) * hc;
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)X[i] * X[i];
  double rho = 1.0 / sqrt(ss / (double)n + c->eps);
  float mx[64];
  for (int64_t r = 0; r < mix; r++) {
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (double)X[i] * vec_at(fn, r * n + i);
    mx[r] = (float)(acc * rho);
  }
  float s0 = vec_at(scale, 0), s1 = vec_at(scale, 1), s2 = vec_at(scale, 2);
  float pre[16];
  for (int64_t i = 0; i < hc; i++) {
    pre[i] = sigm(s0 * mx[i] + vec_at(base, i)) + c->hc_eps;
    post[i] = 2.0f * sigm(s1 * mx[hc + i] + vec_at(base, hc + i));
  }
  double C[16][16];
  for (int64_t i = 0; i < hc; i++) {
    double rmax = -INFINITY, z = 0;
    for (int64_t j = 0; j < hc; j++) {
      C[i][j] = (double)(s2 * mx[2 * hc + i * hc + j] + vec_at(base, 2 * hc + i * hc + j));
      rmax = fmax(rmax, C[i][j]);
    }
    for (int64_t j = 0; j < hc; j++) z += exp(C[i][j] - rmax);
    for (int64_t j = 0; j < hc; j++) C[i][j] = exp(C[i][j] - rmax) / z + c->hc_eps;
  }
  for (int it = 0; it < c->sinkhorn_iters; it++) {
    if (it > 0)
      for (int64_t i = 0; i < hc; i++) {
        double rs = 0;
        for (int64_t j = 0; j < hc; j++) rs += C[i][j];
        for (int64_t j = 0; j < hc; j++) C[i][j] /= rs + c->hc_eps;
      }
    for (int64_t j = 0; j < hc; j++) {
      double cs = 0;
      for (int64_t i = 0; i < hc; i++) cs += C[i][j];
      for (int64_t i = 0; i < hc; i++) C[i][j] /= cs + c->hc_eps;
    }
  }
  for (int64_t i = 0; i < hc; i++)
    for (int64_t j = 0; j < hc; j++) comb[i * hc + j] = (float)C[i][j];
  for (int64_t k = 0; k < d; k++) {
    double acc = 0;
    for (int64_t i = 0; i < hc; i++) acc += (double)pre[i] * X[i * d + k];
    x[k] = rbf((float)acc);
  }
}

static void hc_post(refm *m, const float *a, float *X, const float *post, const float *comb) {
  int64_t hc = m->cfg.hc_mult, d = m->cfg.hidden;
  float *old = m->xold;
  memcpy(old, X, (size_t)(hc * d) * sizeof(float));
  for (int64_t j = 0; j < hc; j++)
    for (int64_t k = 0; k < d; k++) {
      double acc = (double)post[j] * a[k];
      for (int64_t i = 0; i < hc; i++) acc += (double)comb[i * hc + j] * old[i * d + k];
      X[j * d + k] = rbf((float)acc);
    }
}

static void hc_head(refm *m, const float *X, float *y, const tide_tensor *fn, const tide_tensor *base,
                    const tide_tensor *scale) {
  const refm_cfg *c = &m->cfg;
  int64_t hc = c->hc_mult, d = c->hidden, n = hc * d;
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)X[i] * X[i];
  double rho = 1.0 / sqrt(ss / (double)n + c->eps);
  float g[16];
  float s = vec_at(scale, 0);
  for (int64_t r = 0; r < hc; r++) {
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (double)X[i] * vec_at(fn, r * n + i);
    g[r] = sigm(s * (float)(acc * rho) + vec_at(base, r)) + c->hc_eps;
  }
  for (int64_t k = 0; k < d; k++) {
    double acc = 0;
    for (int64_t i = 0; i < hc; i++) acc += (double)g[i] * X[i * d + k];
    y[k] = rbf((float)acc);
  }
}

static int ensure_scratch(refm *m) {
  if (m->scratch) return TIDE_OK;
  const refm_cfg *c = &m->cfg;
  int64_t H = c->n_heads, D = 512, d = c->hidden, hc = c->hc_mult;
  int64_t maxent = (c->max_pos + 3) / 4 + 16;
#define UP16(v) (((v) + 15) / 16 * 16)
  int64_t attn = UP16(c->q_lora + D + 2 * H * D + (int64_t)c->idx_heads * (128 * 2 + 2) + 4 * D);
  int64_t sc = UP16(maxent * 2 + c->window + 4 * c->n_experts + (int64_t)c->o_groups * c->o_lora + 64);
  int64_t ffn = UP16(3 * (int64_t)c->inter * (c->n_shared > 1 ? c->n_shared : 1) + d);
  d = UP16(d);
#undef UP16
  int64_t total = attn + sc + ffn + 6 * hc * d + 4 * d + 2 * d /* dacc as doubles */ + 2 * maxent /* sel */;
  m->scratch = tide_xcalloc((size_t)total, sizeof(float));
  if (!m->scratch) return TIDE_E_NOMEM;
  float *p = m->scratch + attn;
  m->score = p; p += sc;
  m->hbuf = p; p += ffn;
  m->X = p; p += hc * d;
  m->xold = p; p += hc * d;
  m->xin = p; p += d;
  m->aout = p; p += d;
  m->dacc = (double *)(void *)p; p += 2 * d;
  m->sel = (int64_t *)(void *)p;
  return TIDE_OK;
}

int refm_attn(refm *m, int L, const float *x, int64_t p, float *out) {
  TIDE_CHECK(ensure_scratch(m));
  if (L < 0 || L >= m->cfg.n_layers) return TIDE_ERR(TIDE_E_RANGE, "reference: layer %d out of range", L);
  if (p != m->layers[L].n_tok)
    return TIDE_ERR(TIDE_E_STATE, "reference layer %d expects position %lld next, got %lld", L,
                    (long long)m->layers[L].n_tok, (long long)p);
  return attn_layer(m, L, x, p, out);
}

int refm_moe(refm *m, int L, const float *x, int64_t id, int64_t p, float *out) {
  TIDE_CHECK(ensure_scratch(m));
  if (L < 0 || L >= m->cfg.n_layers) return TIDE_ERR(TIDE_E_RANGE, "reference: layer %d out of range", L);
  return moe_layer(m, L, x, id, p, out);
}

int refm_forward_token(refm *m, int64_t id, float *logits) {
  const refm_cfg *c = &m->cfg;
  TIDE_CHECK(ensure_scratch(m));
  if (id < 0 || id >= c->vocab)
    return TIDE_ERR(TIDE_E_RANGE, "reference: token id %lld outside the vocabulary (0..%lld)", (long long)id,
                    (long long)c->vocab - 1);
  int64_t p = m->len, d = c->hidden, hc = c->hc_mult;
  if (p >= c->max_pos) return TIDE_ERR(TIDE_E_RANGE, "reference: position %lld beyond max_position_embeddings", (long long)p);
  float *X = m->X, *x = m->xin, *a = m->aout;
  for (int64_t k = 0; k < d; k++) x[k] = vec_at(&m->embed, id * d + k);
  for (int64_t i = 0; i < hc; i++) memcpy(X + i * d, x, (size_t)d * sizeof(float));
  float post[16], comb[256];
  for (int L = 0; L < c->n_layers; L++) {
    refm_layer *l = &m->layers[L];
    hc_pre(m, X, &l->hc_attn_fn, &l->hc_attn_base, &l->hc_attn_scale, x, post, comb);
    rmsnorm(x, d, &l->attn_norm, c->eps, 1);
    TIDE_CHECK(attn_layer(m, L, x, p, a));
    hc_post(m, a, X, post, comb);
    hc_pre(m, X, &l->hc_ffn_fn, &l->hc_ffn_base, &l->hc_ffn_scale, x, post, comb);
    rmsnorm(x, d, &l->ffn_norm, c->eps, 1);
    TIDE_CHECK(moe_layer(m, L, x, id, p, a));
    hc_post(m, a, X, post, comb);
  }
  if (m->Xmain) memcpy(m->Xmain, X, (size_t)(hc * d) * sizeof(float));
  hc_head(m, X, x, &m->hc_head_fn, &m->hc_head_base, &m->hc_head_scale);
  rmsnorm(x, d, &m->norm, c->eps, 1);
  if (logits) gemv(&m->head, x, logits, 0);
  m->len = p + 1;
  return TIDE_OK;
}

/* The MTP block (doc 2.4) at the next position of its own layer state. The
 * rounding points are the fast path's (lua/tide/models/deepseek_v4_mtp.lua):
 * e = bf16(RMSNorm(embed[id]; enorm)), E = bf16(e.e_proj^T); per stream
 * h_i = bf16(RMSNorm(Hin_i; hnorm)), P_i = bf16(h_i.h_proj^T); X0_i = bf16(E + P_i). */
int refm_mtp_token(refm *m, const float *Hin, int64_t id, float *logits, float *Hout) {
  const refm_cfg *c = &m->cfg;
  if (!c->has_mtp) return TIDE_ERR(TIDE_E_STATE, "reference: the checkpoint has no MTP block");
  TIDE_CHECK(ensure_scratch(m));
  if (id < 0 || id >= c->vocab)
    return TIDE_ERR(TIDE_E_RANGE, "reference: token id %lld outside the vocabulary (0..%lld)", (long long)id,
                    (long long)c->vocab - 1);
  int L = c->n_layers;
  refm_layer *l = &m->layers[L];
  int64_t p = l->n_tok, d = c->hidden, hc = c->hc_mult;
  if (p >= c->max_pos) return TIDE_ERR(TIDE_E_RANGE, "reference: MTP position %lld beyond max_position_embeddings", (long long)p);
  float *X = m->X, *x = m->xin, *a = m->aout;
  /* E = e . e_proj^T into a */
  for (int64_t k = 0; k < d; k++) x[k] = vec_at(&m->embed, id * d + k);
  rmsnorm(x, d, &m->mtp_enorm, c->eps, 1);
  gemv(&m->mtp_e, x, a, 1);
  for (int64_t i = 0; i < hc; i++) {
    memcpy(x, Hin + i * d, (size_t)d * sizeof(float));
    rmsnorm(x, d, &m->mtp_hnorm, c->eps, 1);
    gemv(&m->mtp_h, x, X + i * d, 1);
    for (int64_t k = 0; k < d; k++) X[i * d + k] = rbf(a[k] + X[i * d + k]);
  }
  float post[16], comb[256];
  hc_pre(m, X, &l->hc_attn_fn, &l->hc_attn_base, &l->hc_attn_scale, x, post, comb);
  rmsnorm(x, d, &l->attn_norm, c->eps, 1);
  TIDE_CHECK(attn_layer(m, L, x, p, a));
  hc_post(m, a, X, post, comb);
  hc_pre(m, X, &l->hc_ffn_fn, &l->hc_ffn_base, &l->hc_ffn_scale, x, post, comb);
  rmsnorm(x, d, &l->ffn_norm, c->eps, 1);
  TIDE_CHECK(moe_layer(m, L, x, id, p, a));
  hc_post(m, a, X, post, comb);
  if (Hout) memcpy(Hout, X, (size_t)(hc * d) * sizeof(float));
  hc_head(m, X, x, &m->mtp_hc_fn, &m->mtp_hc_base, &m->mtp_hc_scale);
  rmsnorm(x, d, &m->mtp_norm, c->eps, 1);
  if (logits) gemv(&m->head, x, logits, 0);
  return TIDE_OK;
}

/* ---- forced decisions ---- */
static int grow_i32(int32_t **p, int64_t *cap, int64_t need, int64_t width) {
  if (need <= *cap) return TIDE_OK;
  int64_t nc = *cap ? *cap : 64;
  while (nc < need) nc *= 2;
  int32_t *q = tide_xrealloc(*p, (size_t)(nc * width) * sizeof(int32_t));
  if (!q) return TIDE_E_NOMEM;
  for (int64_t i = *cap * width; i < nc * width; i++) q[i] = -1;
  *p = q;
  *cap = nc;
  return TIDE_OK;
}

int refm_force_topk(refm *m, int L, int64_t p, const int32_t *ids, int64_t n) {
  if (L < 0 || L >= m->cfg.n_layers) return TIDE_ERR(TIDE_E_RANGE, "reference: layer %d out of range", L);
  if (p < 0 || p >= m->cfg.max_pos) return TIDE_ERR(TIDE_E_RANGE, "reference: position %lld out of range", (long long)p);
  refm_layer *l = &m->layers[L];
  int64_t K = m->cfg.index_topk;
  if (l->ratio != 4) return TIDE_ERR(TIDE_E_INVALID, "reference: layer %d has ratio %d, no indexer selection", L, l->ratio);
  if (n > K) return TIDE_ERR(TIDE_E_INVALID, "reference: %lld forced entries exceed index_topk %lld", (long long)n, (long long)K);
  if (n < 0) {
    if (l->forced_topk && p < l->forced_cap) l->forced_topk[p * (K + 1)] = -1;
    return TIDE_OK;
  }
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= (p + 1) / 4)
      return TIDE_ERR(TIDE_E_RANGE, "reference: forced entry %d is not visible at position %lld (%lld entries)", ids[i],
                      (long long)p, (long long)((p + 1) / 4));
  TIDE_CHECK(grow_i32(&l->forced_topk, &l->forced_cap, p + 1, K + 1));
  int32_t *row = l->forced_topk + p * (K + 1);
  row[0] = (int32_t)n;
  for (int64_t i = 0; i < n; i++) row[1 + i] = ids[i];
  return TIDE_OK;
}

int refm_force_route(refm *m, int L, int64_t p, const int32_t *ids) {
  if (L < 0 || L >= m->cfg.n_layers) return TIDE_ERR(TIDE_E_RANGE, "reference: layer %d out of range", L);
  if (p < 0 || p >= m->cfg.max_pos) return TIDE_ERR(TIDE_E_RANGE, "reference: position %lld out of range", (long long)p);
  refm_layer *l = &m->layers[L];
  int64_t k = m->cfg.topk;
  if (!ids) {
    if (l->forced_route && p < l->forced_rcap) l->forced_route[p * k] = -1;
    return TIDE_OK;
  }
  for (int64_t i = 0; i < k; i++)
    if (ids[i] < 0 || ids[i] >= m->cfg.n_experts)
      return TIDE_ERR(TIDE_E_RANGE, "reference: forced expert %d out of range (0..%d)", ids[i], m->cfg.n_experts - 1);
  TIDE_CHECK(grow_i32(&l->forced_route, &l->forced_rcap, p + 1, k));
  for (int64_t i = 0; i < k; i++) l->forced_route[p * k + i] = ids[i];
  return TIDE_OK;
}
