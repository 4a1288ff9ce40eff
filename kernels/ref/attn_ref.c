/* attn_ref.c - scalar references of the attention kernels' inner units (one
 * token's q rows, one token's attention, one compressed entry's pooling, one
 * block of indexer logits). Written to be checked against doc 2.2 line by
 * line: double accumulation, libm exp, no tiling. The AVX2 variants in
 * x86/attn_avx2.c are compared with these. */
#include <math.h>

#include "attn_internal.h"

static void q_rows_ref(float *q, int64_t H, const float *cs, float eps) {
  for (int64_t h = 0; h < H; h++) {
    float *x = q + h * KV_D;
    double ss = 0;
    for (int i = 0; i < KV_D; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / KV_D + eps));
    for (int i = 0; i < KV_D; i++) x[i] = x[i] * r;
    tide_rope64(x + KV_NOPE, cs, 0);
    for (int i = 0; i < KV_D; i++) x[i] = tide_round_bf16(x[i]);
  }
}

int64_t tide_attn_scratch_floats(int64_t nh, int64_t nk) {
  /* ref: keys [nk][512] + scores [nk]; avx2: scores [nh][nk+8] + tiles */
  int64_t a = nk * KV_D + nk + 64;
  int64_t b = nh * (nk + 16) + 2 * 16 * KV_D + nh * (KV_D + 3) + 256;
  return a > b ? a : b;
}

static void attn_ref(float *out, float *stats, const float *q, int64_t nh, const uint8_t *const *kd,
                     const uint8_t *const *ks, int64_t nk, int64_t nwin, const float *sink, float scale,
                     float *scratch) {
  float *keys = scratch, *sc = scratch + nk * KV_D;
  for (int64_t e = 0; e < nk; e++) tide_mla_load(keys + e * KV_D, kd[e], ks[e]);
  for (int64_t h = 0; h < nh; h++) {
    const float *qh = q + h * KV_D;
    float *oh = out + h * KV_D;
    if (nk == 0) {
      for (int i = 0; i < KV_D; i++) oh[i] = 0;
      if (stats) {
        stats[h * 4 + 0] = stats[h * 4 + 1] = 0;
        stats[h * 4 + 2] = 1;
        stats[h * 4 + 3] = -INFINITY;
      }
      continue;
    }
    float mx = -INFINITY;
    for (int64_t e = 0; e < nk; e++) {
      double dot = 0;
      for (int i = 0; i < KV_D; i++) dot += (double)qh[i] * keys[e * KV_D + i];
      sc[e] = (float)dot * scale;
      if (sc[e] > mx) mx = sc[e];
    }
    double z = 0, zw = 0, acc[KV_D];
    for (int i = 0; i < KV_D; i++) acc[i] = 0;
    for (int64_t e = 0; e < nk; e++) {
      float pe = expf(sc[e] - mx);
      z += pe;
      if (e < nwin) zw += pe;
      float pb = tide_round_bf16(pe);
      for (int i = 0; i < KV_D; i++) acc[i] += (double)pb * keys[e * KV_D + i];
    }
    double es = exp((double)sink[h] - mx), den = z + es;
    for (int i = 0; i < KV_D; i++) oh[i] = tide_round_bf16((float)(acc[i] / den));
    if (stats) {
      stats[h * 4 + 0] = (float)(zw / den);
      stats[h * 4 + 1] = (float)((z - zw) / den);
      stats[h * 4 + 2] = (float)(es / den);
      stats[h * 4 + 3] = (float)(mx + log(z));
    }
  }
}

static void pool_ref(float *out, int64_t dc, int64_t n, const float *const *a, const float *const *b,
                     const float *const *ape) {
  for (int64_t ch = 0; ch < dc; ch++) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
      float s = ape[t] ? b[t][ch] + ape[t][ch] : b[t][ch];
      if (s > mx) mx = s;
    }
    double z = 0, acc = 0;
    for (int64_t t = 0; t < n; t++) {
      float s = ape[t] ? b[t][ch] + ape[t][ch] : b[t][ch];
      double w = exp((double)s - mx);
      z += w;
      acc += w * a[t][ch];
    }
    out[ch] = (float)(acc / z);
  }
}

static void iscore_ref(float *out, int64_t n, const uint8_t *k8, const float *ks, const float *q, const float *w,
                       int64_t nI) {
  for (int64_t i = 0; i < n; i++) {
    float k[KV_ID];
    for (int d = 0; d < KV_ID; d++) k[d] = tide_f8e4m3_to_f32(k8[i * KV_ID + d]);
    double s = 0;
    for (int64_t h = 0; h < nI; h++) {
      double dot = 0;
      for (int d = 0; d < KV_ID; d++) dot += (double)q[h * KV_ID + d] * k[d];
      if (dot > 0) s += (double)w[h] * dot;
    }
    out[i] = (float)(s * ks[i]);
  }
}

static void iq_rows_ref(uint8_t *q8, float *scales, const float *qi, int64_t nI, const float *cs) {
  for (int64_t h = 0; h < nI; h++) {
    float v[KV_ID];
    memcpy(v, qi + h * KV_ID, sizeof v);
    tide_rope64(v + 64, cs, 0);
    for (int i = 64; i < KV_ID; i++) v[i] = tide_round_bf16(v[i]);
    scales[h] = tide_idx_quant(q8 + h * KV_ID, v, KV_ID);
  }
}

static void unrope_rows_ref(float *out, const float *in, int64_t H, const float *cs) {
  for (int64_t h = 0; h < H; h++) {
    const float *x = in + h * KV_D;
    float *y = out + h * KV_D, v[KV_ROPE];
    if (y != x) memcpy(y, x, KV_NOPE * sizeof(float));
    memcpy(v, x + KV_NOPE, sizeof v);
    tide_rope64(v, cs, 1);
    for (int i = 0; i < KV_ROPE; i++) y[KV_NOPE + i] = tide_round_bf16(v[i]);
  }
}

const tide_attn_kernels tide_attn_ref = {q_rows_ref, attn_ref, pool_ref, iscore_ref, tide_mla_store, iq_rows_ref,
                                         unrope_rows_ref};
