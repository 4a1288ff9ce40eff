/* test_attn.c - the DeepSeek-V4 attention kernels: every AVX2 unit against
 * its scalar reference over awkward sizes; cache bytes against an
 * independent encoder; a multi-layer, multi-step scenario (SWA, C4, C128)
 * against a dense double-precision oracle written here from doc 2.2; the
 * pitfalls of doc 6 one by one; and the invariances of docs/design.md 1
 * (one prefill = chunks = token by token = mixed batches = 1 or 2 threads,
 * fork/snapshot/restore and abort), compared bitwise. */
#include <math.h>
#include <stdint.h>

#include "attn_internal.h"
#include "tt.h"

/* ---- deterministic inputs: value i of (seed, position, layer, kind) ---- */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
static float gen(uint64_t seed, int64_t p, int layer, int kind, int64_t i) {
  uint64_t h = mix(seed ^ mix((uint64_t)p * 0x100000001b3ULL ^ mix((uint64_t)(layer * 64 + kind)) ^ mix((uint64_t)i + 7)));
  return (float)((double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float rbf(float x) { return tide_bf16_to_f32(tide_f32_to_bf16(x)); }

static uint64_t rng = 0x1234567;
static float urand(void) {
  rng = mix(rng);
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static double nmse(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return den > 0 ? num / den : num;
}

/* ---- an independent fp8_ds_mla encoder (straight from doc 3.1) ---- */
static float e4m3_round(float x) {
  float a = fabsf(x);
  if (a >= 448.0f) return copysignf(448.0f, x);
  int e;
  frexpf(a, &e);
  int ex = e - 1;
  if (ex < -6) ex = -6;
  float q = ldexpf(1.0f, ex - 3);
  return copysignf(nearbyintf(a / q) * q, x);
}
static uint8_t e4m3_code(float v) {
  for (int c = 0; c < 256; c++)
    if (c != 0x7f && c != 0xff && tide_f8e4m3_to_f32((uint8_t)c) == v && (signbit(v) ? c >= 128 : c < 128)) return (uint8_t)c;
  return 0xff;
}
static int clog2(float x) {
  int e = 0;
  while (ldexpf(1.0f, e) < x) e++;
  while (ldexpf(1.0f, e - 1) >= x) e--;
  return e;
}
static void enc_mla(uint8_t *data, uint8_t *sc, const float *v, int flush) {
  for (int t = 0; t < 7; t++) {
    float a = 0;
    for (int i = 0; i < 64; i++) a = fmaxf(a, fabsf(v[64 * t + i]));
    int e = clog2(fmaxf(a / 448.0f, 1e-4f));
    sc[t] = (uint8_t)(127 + e);
    for (int i = 0; i < 64; i++) {
      float x = ldexpf(v[64 * t + i], -e);
      x = fminf(fmaxf(x, -448.0f), 448.0f);
      if (flush && fabsf(x) < 0.015625f) x = 0;
      data[64 * t + i] = e4m3_code(e4m3_round(x));
    }
  }
  sc[7] = 0;
  for (int i = 0; i < 64; i++) {
    uint16_t h = tide_f32_to_bf16(v[448 + i]);
    data[448 + 2 * i] = (uint8_t)h;
    data[449 + 2 * i] = (uint8_t)(h >> 8);
  }
}
static void dec_mla(float *out, const uint8_t *data, const uint8_t *sc) {
  for (int t = 0; t < 7; t++)
    for (int i = 0; i < 64; i++) out[64 * t + i] = tide_f8e4m3_to_f32(data[64 * t + i]) * ldexpf(1.0f, sc[t] - 127);
  for (int i = 0; i < 64; i++) out[448 + i] = tide_bf16_to_f32((uint16_t)(data[448 + 2 * i] | data[449 + 2 * i] << 8));
}
/* quantise like the cache would and return the dequantised values */
static void qdq_mla(float *out, const float *v, int flush) {
  uint8_t d[576], s[8];
  enc_mla(d, s, v, flush);
  dec_mla(out, d, s);
}
static float qdq_idx(float *q8v, const float *v, int n) {
  float a = 1e-4f;
  for (int i = 0; i < n; i++) a = fmaxf(a, fabsf(v[i]));
  int e = clog2(a / 448.0f);
  for (int i = 0; i < n; i++) q8v[i] = e4m3_round(fminf(fmaxf(ldexpf(v[i], -e), -448.0f), 448.0f));
  return ldexpf(1.0f, e);
}
static void rope_d(float *x, const float *freq, int64_t p, int inv) {
  for (int i = 0; i < 32; i++) {
    float ang = (float)p * freq[i], c = (float)cos((double)ang), s = (float)sin((double)ang);
    float e = x[2 * i], o = x[2 * i + 1];
    if (!inv) {
      x[2 * i] = e * c - o * s;
      x[2 * i + 1] = e * s + o * c;
    } else {
      x[2 * i] = e * c + o * s;
      x[2 * i + 1] = o * c - e * s;
    }
  }
}

/* =================== unit tests: AVX2 against reference =================== */
static void fill_rand(float *x, int64_t n, float scale, int round) {
  for (int64_t i = 0; i < n; i++) x[i] = round ? rbf(urand() * scale) : urand() * scale;
}

/* indexer query bytes and the output path: AVX2 equal to the reference, bit for bit */
static void test_units_iq_unrope(void) {
#if defined(__x86_64__)
  if (!tide_kernels_avx2()) return;
  float cs[64];
  for (int i = 0; i < 32; i++) {
    float a = urand() * 100;
    cs[i] = cosf(a);
    cs[32 + i] = sinf(a);
  }
  int nis[] = {1, 3, 7, 64};
  for (int k = 0; k < 4; k++) {
    int64_t nI = nis[k];
    float *qi = tide_xmalloc((size_t)nI * 128 * 4), s1[64], s2[64];
    fill_rand(qi, nI * 128, k == 1 ? 1e-3f : 4.0f, 1);
    uint8_t *a = tide_xmalloc((size_t)nI * 128), *b = tide_xmalloc((size_t)nI * 128);
    tide_attn_ref.iq_rows(a, s1, qi, nI, cs);
    tide_attn_avx2.iq_rows(b, s2, qi, nI, cs);
    TT_CHECK(!memcmp(a, b, (size_t)nI * 128) && !memcmp(s1, s2, (size_t)nI * 4), "iq_rows nI=%lld bytes", (long long)nI);
    tide_xfree(qi);
    tide_xfree(a);
    tide_xfree(b);
  }
  int Hs[] = {1, 3, 7, 65};
  for (int k = 0; k < 4; k++) {
    int64_t H = Hs[k], n = H * 512;
    float *x = tide_xmalloc((size_t)n * 4), *y1 = tide_xmalloc((size_t)n * 4), *y2 = tide_xmalloc((size_t)n * 4);
    fill_rand(x, n, 2.0f, 1);
    tide_attn_ref.unrope_rows(y1, x, H, cs);
    tide_attn_avx2.unrope_rows(y2, x, H, cs);
    TT_CHECK(!memcmp(y1, y2, (size_t)n * 4), "unrope_rows H=%lld bits", (long long)H);
    /* inverse of the forward rotation: back to the input up to bf16 rounding */
    tide_xfree(x);
    tide_xfree(y1);
    tide_xfree(y2);
  }
#endif
}

static void test_units_q_rows(void) {
#if defined(__x86_64__)
  if (!tide_kernels_avx2()) return;
  int Hs[] = {1, 3, 7, 65};
  float cs[64];
  for (int i = 0; i < 64; i++) cs[i] = urand();
  for (size_t k = 0; k < sizeof Hs / sizeof Hs[0]; k++) {
    int64_t H = Hs[k], n = H * 512;
    float *a = tide_xmalloc((size_t)n * 4), *b = tide_xmalloc((size_t)n * 4);
    fill_rand(a, n, 3.0f, 1);
    memcpy(b, a, (size_t)n * 4);
    tide_attn_ref.q_rows(a, H, cs, 1e-6f);
    tide_attn_avx2.q_rows(b, H, cs, 1e-6f);
    double e = nmse(b, a, n);
    TT_CHECK(e <= 1e-6, "q_rows H=%lld nmse %g", (long long)H, e);
    tide_xfree(a);
    tide_xfree(b);
  }
#endif
}

/* random stored tokens for attention inputs */
static uint8_t *make_tokens(int64_t n, uint8_t ***kd, uint8_t ***ks) {
  uint8_t *buf = tide_xmalloc((size_t)n * 584);
  *kd = tide_xmalloc((size_t)n * sizeof(uint8_t *));
  *ks = tide_xmalloc((size_t)n * sizeof(uint8_t *));
  float v[512];
  for (int64_t e = 0; e < n; e++) {
    fill_rand(v, 512, 2.0f, 1);
    /* shuffled order in memory, like paged slots */
    int64_t slot = (e * 7919) % n;
    enc_mla(buf + slot * 584, buf + slot * 584 + 576, v, e & 1);
    (*kd)[e] = buf + slot * 584;
    (*ks)[e] = buf + slot * 584 + 576;
  }
  return buf;
}

static void test_units_attn(void) {
#if defined(__x86_64__)
  if (!tide_kernels_avx2()) return;
  int nhs[] = {1, 3, 7, 64};
  int nks[] = {0, 1, 3, 7, 63, 65, 129, 640};
  for (size_t a = 0; a < sizeof nhs / sizeof nhs[0]; a++)
    for (size_t k = 0; k < sizeof nks / sizeof nks[0]; k++) {
      int64_t nh = nhs[a], nk = nks[k], nwin = nk < 128 ? nk / 2 : 128;
      if (nh == 64 && nk != 640 && nk != 65) continue;
      uint8_t **kd, **ks;
      uint8_t *buf = make_tokens(nk ? nk : 1, &kd, &ks);
      float *q = tide_xmalloc((size_t)nh * 512 * 4), sink[64];
      fill_rand(q, nh * 512, 1.0f, 1);
      for (int h = 0; h < nh; h++) sink[h] = urand() * 3;
      int64_t sf = tide_attn_scratch_floats(nh, nk);
      float *scr = tide_xmalloc((size_t)sf * 4);
      float *o1 = tide_xmalloc((size_t)nh * 512 * 4), *o2 = tide_xmalloc((size_t)nh * 512 * 4);
      float st1[256], st2[256];
      tide_attn_ref.attn(o1, st1, q, nh, (const uint8_t *const *)kd, (const uint8_t *const *)ks, nk, nwin, sink, 0.0441941738f, scr);
      tide_attn_avx2.attn(o2, st2, q, nh, (const uint8_t *const *)kd, (const uint8_t *const *)ks, nk, nwin, sink, 0.0441941738f, scr);
      double e = nmse(o2, o1, nh * 512);
      TT_CHECK(e <= 1e-6, "attn nh=%lld nk=%lld nmse %g", (long long)nh, (long long)nk, e);
      if (nk > 0) {
        double es = nmse(st2, st1, nh * 4);
        TT_CHECK(es <= 1e-6, "attn stats nh=%lld nk=%lld nmse %g", (long long)nh, (long long)nk, es);
      } else {
        int zero = 1;
        for (int64_t i = 0; i < nh * 512; i++) zero &= o1[i] == 0 && o2[i] == 0;
        TT_CHECK(zero, "no key: output must be zero");
      }
      tide_xfree(buf);
      tide_xfree(kd);
      tide_xfree(ks);
      tide_xfree(q);
      tide_xfree(scr);
      tide_xfree(o1);
      tide_xfree(o2);
    }
#endif
}

static void test_units_pool_iscore(void) {
#if defined(__x86_64__)
  if (!tide_kernels_avx2()) return;
  int ns[] = {4, 8, 128};
  int dcs[] = {128, 512};
  for (size_t a = 0; a < 3; a++)
    for (size_t d = 0; d < 2; d++) {
      int64_t n = ns[a], dc = dcs[d];
      float *rows = tide_xmalloc((size_t)(n * dc * 3) * 4);
      fill_rand(rows, n * dc * 3, 4.0f, 0);
      const float *pa[128], *pb[128], *pe[128];
      for (int64_t t = 0; t < n; t++) {
        pa[t] = rows + t * dc;
        pb[t] = rows + (n + t) * dc;
        pe[t] = t & 1 ? rows + (2 * n + t) * dc : NULL;
      }
      float o1[512], o2[512];
      tide_attn_ref.pool(o1, dc, n, pa, pb, pe);
      tide_attn_avx2.pool(o2, dc, n, pa, pb, pe);
      double e = nmse(o2, o1, dc);
      TT_CHECK(e <= 1e-6, "pool n=%lld dc=%lld nmse %g", (long long)n, (long long)dc, e);
      tide_xfree(rows);
    }
  int nis[] = {1, 3, 7, 64};
  int nn[] = {1, 3, 7, 63, 65, 129};
  for (size_t a = 0; a < 4; a++)
    for (size_t k = 0; k < 6; k++) {
      int64_t nI = nis[a], n = nn[k];
      uint8_t *k8 = tide_xmalloc((size_t)n * 128);
      float ksc[129], q[64 * 128], w[64], v[128];
      for (int64_t i = 0; i < n; i++) {
        fill_rand(v, 128, 1.0f, 1);
        ksc[i] = tide_idx_quant(k8 + i * 128, v, 128);
      }
      for (int64_t i = 0; i < nI * 128; i++) q[i] = tide_f8e4m3_to_f32((uint8_t)(mix((uint64_t)i + 99) & 0x7e));
      for (int64_t i = 0; i < nI * 128; i++) q[i] = urand() > 0 ? q[i] : -q[i];
      for (int64_t h = 0; h < nI; h++) w[h] = urand();
      float o1[129], o2[129];
      tide_attn_ref.iscore(o1, n, k8, ksc, q, w, nI);
      tide_attn_avx2.iscore(o2, n, k8, ksc, q, w, nI);
      double e = nmse(o2, o1, n);
      TT_CHECK(e <= 1e-6, "iscore nI=%lld n=%lld nmse %g", (long long)nI, (long long)n, e);
      tide_xfree(k8);
    }
#endif
}

/* cache bytes: tide_mla_store and tide_idx_quant against the encoder above,
 * including the SWA flush rule and exact subnormals for the compressor */
static void test_mla_bytes(void) {
  for (int rep = 0; rep < 40; rep++) {
    float v[512];
    float scale = rep < 10 ? 1e-3f : rep < 20 ? 0.05f : rep < 30 ? 3.0f : 300.0f;
    fill_rand(v, 512, scale, 1);
    if (rep == 5) v[3] = 1e-9f; /* tiny values in a tile: subnormal or flushed */
    if (rep == 6) { v[70] = -0.0f; v[71] = -1e-30f; v[450] = NAN; v[451] = -0.0f; }
    if (rep == 7) for (int i = 0; i < 64; i++) v[128 + i] = (i & 1 ? -1.0f : 1.0f) * ldexpf(1.0f, -20 + i / 4);
    for (int flush = 0; flush < 2; flush++) {
      uint8_t d1[576], s1[8], d2[576], s2[8];
      tide_mla_store(d1, s1, v, flush);
      enc_mla(d2, s2, v, flush);
      TT_CHECK(!memcmp(d1, d2, 576) && !memcmp(s1, s2, 8), "mla bytes rep %d flush %d", rep, flush);
#if defined(__x86_64__)
      if (tide_kernels_avx2()) {
        uint8_t d3[576], s3[8];
        tide_attn_avx2.mla_store(d3, s3, v, flush);
        TT_CHECK(!memcmp(d1, d3, 576) && !memcmp(s1, s3, 8), "AVX2 mla bytes rep %d flush %d", rep, flush);
      }
#endif
    }
  }
  /* the two tile rules differ exactly on subnormal codes */
  float v[512];
  for (int i = 0; i < 512; i++) v[i] = i % 64 == 0 ? 1.0f : rbf(0.00003f * (1 + i % 5));
  uint8_t d0[576], d1[576], s[8];
  tide_mla_store(d0, s, v, 0);
  tide_mla_store(d1, s, v, 1);
  int sub = 0, flushed = 1;
  for (int i = 0; i < 448; i++) {
    if ((d0[i] & 0x78) == 0 && (d0[i] & 7)) sub++;
    if ((d1[i] & 0x78) == 0 && (d1[i] & 0x7f)) flushed = 0;
  }
  TT_CHECK(sub > 0 && flushed, "compressor keeps fp8 subnormals (%d), SWA insert flushes them", sub);
  /* indexer entry: power-of-two scale, fp8 of v / s */
  for (int rep = 0; rep < 20; rep++) {
    float x[128], xq[128];
    fill_rand(x, 128, rep < 10 ? 0.01f : 5.0f, 1);
    uint8_t q8[128];
    float s1 = tide_idx_quant(q8, x, 128), s2 = qdq_idx(xq, x, 128);
    int ok = s1 == s2;
    for (int i = 0; i < 128; i++) ok &= tide_f8e4m3_to_f32(q8[i]) == xq[i];
    TT_CHECK(ok, "indexer quantisation rep %d", rep);
  }
}

/* =================== the scenario harness =================== */
enum { MAXL = 4, MAXS = 4, MAXP = 2200, NIH = 8 };
typedef struct sim {
  int nL, H, nI, K, maxT;
  int32_t ratios[MAXL];
  tide_kvcache *c;
  tide_rope *rp, *ry;
  tide_batch *b;
  tide_tensor ape[MAXL], iape[MAXL], norm[MAXL], inorm[MAXL], sink[MAXL];
  tide_tensor q, kv, kvs, ikvs, qi, wraw, q8, w, topk, out, stats;
  uint64_t seed[8];                 /* content of each sequence slot */
  uint64_t hash[8][MAXL][MAXP];     /* per (slot, layer, position) output hash */
  float *keep;                      /* outputs of kept positions [MAXL][64][H*512] */
  int64_t keep_every, keep_from;
  uint64_t keep_seed;
} sim;

static uint64_t fnv(const void *p, size_t n) {
  const uint8_t *s = p;
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
  return h;
}

static tide_tensor mk(int dt, int nd, int64_t a, int64_t b, int64_t c) {
  tide_tensor t = {0};
  int64_t sh[3] = {a, b, c};
  tide_tensor_new(&t, dt, nd, sh);
  return t;
}

static void sim_init(sim *S, int nL, const int32_t *ratios, int H, int K, int maxT, int keep_hist, int swa_blocks,
                     int pages) {
  memset(S, 0, sizeof *S);
  S->nL = nL;
  S->H = H;
  S->nI = NIH;
  S->K = K;
  S->maxT = maxT;
  memcpy(S->ratios, ratios, (size_t)nL * 4);
  tide_kvcache_config cfg = {0};
  cfg.n_layers = nL;
  cfg.ratios = ratios;
  cfg.swa_blocks = swa_blocks;
  cfg.pages = pages;
  cfg.max_seqs = 8;
  cfg.keep_swa_history = keep_hist;
  TT_OK(tide_kvcache_new(&S->c, &cfg));
  tide_rope_config rp = {10000, 64, 0, 0, 0, 0, 0, 0};
  tide_rope_config ry = {160000, 64, 1, 16, 256, 32, 1, 0};
  TT_OK(tide_rope_new(&S->rp, &rp));
  TT_OK(tide_rope_new(&S->ry, &ry));
  TT_OK(tide_batch_new(&S->b, maxT));
  for (int L = 0; L < nL; L++) {
    int r = ratios[L] <= 1 ? 1 : ratios[L];
    S->sink[L] = mk(TIDE_F32, 1, H, 1, 1);
    for (int h = 0; h < H; h++) ((float *)S->sink[L].data)[h] = gen(99, 0, L, 9, h) * 2;
    if (r > 1) {
      int64_t cw = (r == 4 ? 2 : 1) * 512;
      S->ape[L] = mk(TIDE_F32, 2, r, cw, 1);
      for (int64_t i = 0; i < r * cw; i++) ((float *)S->ape[L].data)[i] = gen(98, 0, L, 8, i) * 0.5f;
      S->norm[L] = mk(TIDE_F32, 1, 512, 1, 1);
      for (int i = 0; i < 512; i++) ((float *)S->norm[L].data)[i] = rbf(1.0f + 0.2f * gen(97, 0, L, 7, i));
    }
    if (r == 4) {
      S->iape[L] = mk(TIDE_F32, 2, 4, 256, 1);
      for (int64_t i = 0; i < 1024; i++) ((float *)S->iape[L].data)[i] = gen(96, 0, L, 6, i) * 0.5f;
      S->inorm[L] = mk(TIDE_F32, 1, 128, 1, 1);
      for (int i = 0; i < 128; i++) ((float *)S->inorm[L].data)[i] = rbf(1.0f + 0.2f * gen(95, 0, L, 5, i));
    }
  }
  S->q = mk(TIDE_F32, 3, maxT, H, 512);
  S->out = mk(TIDE_F32, 3, maxT, H, 512);
  S->stats = mk(TIDE_F32, 3, maxT, H, 4);
  S->kv = mk(TIDE_F32, 2, maxT, 512, 1);
  S->kvs = mk(TIDE_F32, 2, maxT, 2048, 1);
  S->ikvs = mk(TIDE_F32, 2, maxT, 512, 1);
  S->qi = mk(TIDE_F32, 3, maxT, NIH, 128);
  S->wraw = mk(TIDE_F32, 2, maxT, NIH, 1);
  S->w = mk(TIDE_F32, 2, maxT, NIH, 1);
  S->q8 = mk(TIDE_U8, 3, maxT, NIH, 128);
  S->topk = mk(TIDE_I32, 2, maxT, K, 1);
}

static void sim_free(sim *S) {
  tide_kvcache_free(S->c);
  tide_rope_free(S->rp);
  tide_rope_free(S->ry);
  tide_batch_free(S->b);
  for (int L = 0; L < MAXL; L++) {
    tide_tensor_release(&S->ape[L]);
    tide_tensor_release(&S->iape[L]);
    tide_tensor_release(&S->norm[L]);
    tide_tensor_release(&S->inorm[L]);
    tide_tensor_release(&S->sink[L]);
  }
  tide_tensor *ts[] = {&S->q, &S->kv, &S->kvs, &S->ikvs, &S->qi, &S->wraw, &S->q8, &S->w, &S->topk, &S->out, &S->stats};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tide_tensor_release(ts[i]);
  tide_xfree(S->keep);
}

/* the step's input rows for layer L, from each token's (content seed, position) */
static void sim_inputs(sim *S, int L) {
  tide_batch *b = S->b;
  int n = tide_batch_tokens(b);
  int r = S->ratios[L] <= 1 ? 1 : S->ratios[L];
  int64_t cw = (r == 4 ? 2 : 1) * 512;
  for (int t = 0; t < n; t++) {
    int32_t sq;
    int64_t p;
    tide_batch_token(b, t, &sq, &p);
    uint64_t sd = S->seed[sq];
    float *q = (float *)S->q.data + (int64_t)t * S->H * 512;
    for (int64_t i = 0; i < S->H * 512; i++) q[i] = rbf(gen(sd, p, L, 0, i) * 2);
    float *kv = (float *)S->kv.data + t * 512;
    for (int i = 0; i < 512; i++) kv[i] = rbf(gen(sd, p, L, 1, i) * 1.5f);
    if (r > 1) {
      float *k = (float *)S->kvs.data + t * 2048;
      for (int64_t i = 0; i < 2 * cw; i++) k[i] = rbf(gen(sd, p, L, 2, i) * (i < cw ? 1.0f : 2.0f));
    }
    if (r == 4) {
      float *k = (float *)S->ikvs.data + t * 512;
      for (int64_t i = 0; i < 512; i++) k[i] = rbf(gen(sd, p, L, 3, i) * (i < 256 ? 1.0f : 2.0f));
      float *qi = (float *)S->qi.data + (int64_t)t * NIH * 128;
      for (int64_t i = 0; i < NIH * 128; i++) qi[i] = rbf(gen(sd, p, L, 4, i));
      float *wr = (float *)S->wraw.data + t * NIH;
      for (int i = 0; i < NIH; i++) wr[i] = rbf(gen(sd, p, L, 5, i) + 0.25f);
    }
  }
}

static tide_tensor rows_view(const tide_tensor *t, int64_t n, int64_t w) {
  tide_tensor v = {0};
  tide_tensor_narrow(&v, t, 0, 0, n);
  if (w && v.sizes[1] != w) tide_tensor_narrow(&v, &v, 1, 0, w);
  return v;
}

/* run the kernels of every layer on the prepared batch; outputs hashed */
static int sim_layers(sim *S, int stop_layer) {
  tide_batch *b = S->b;
  int n = tide_batch_tokens(b);
  for (int L = 0; L < S->nL; L++) {
    if (L == stop_layer) return 1;
    int r = S->ratios[L] <= 1 ? 1 : S->ratios[L];
    tide_rope *rope = r > 1 ? S->ry : S->rp;
    int64_t cw = (r == 4 ? 2 : 1) * 512;
    sim_inputs(S, L);
    tide_tensor q = rows_view(&S->q, n, 0), out = rows_view(&S->out, n, 0), kv = rows_view(&S->kv, n, 0);
    tide_tensor st = rows_view(&S->stats, n, 0);
    TT_OK(tide_attn_q_prep(&q, b, rope, 1e-6f));
    TT_OK(tide_attn_kv_insert(S->c, L, &kv, b, rope));
    tide_tensor tk = {0};
    if (r == 4) {
      tide_tensor qi = rows_view(&S->qi, n, 0), q8 = rows_view(&S->q8, n, 0), wr = rows_view(&S->wraw, n, 0),
                  w = rows_view(&S->w, n, 0), ik = rows_view(&S->ikvs, n, 0);
      TT_OK(tide_attn_indexer_q(&q8, &w, &qi, &wr, 1.0f / sqrtf(128.0f) / sqrtf((float)NIH), b, rope));
      TT_OK(tide_attn_compress_indexer(S->c, L, &ik, &S->iape[L], &S->inorm[L], 1e-6f, b, rope));
      tide_tensor_release(&qi);
      tide_tensor_release(&wr);
      tide_tensor_release(&ik);
      tk = rows_view(&S->topk, n, 0);
      /* compressors first (the indexer reads this step's keys) */
      tide_tensor ks = rows_view(&S->kvs, n, 2 * cw);
      TT_OK(tide_attn_compress(S->c, L, &ks, &S->ape[L], &S->norm[L], 1e-6f, b, rope));
      tide_tensor_release(&ks);
      TT_OK(tide_attn_indexer_topk(S->c, L, &q8, &w, b, &tk, NULL));
      tide_tensor_release(&q8);
      tide_tensor_release(&w);
    } else if (r == 128) {
      tide_tensor ks = rows_view(&S->kvs, n, 2 * cw);
      TT_OK(tide_attn_compress(S->c, L, &ks, &S->ape[L], &S->norm[L], 1e-6f, b, rope));
      tide_tensor_release(&ks);
    }
    TT_OK(tide_attn_sparse(&out, &q, S->c, L, b, r == 4 ? &tk : NULL, &S->sink[L], 0.0441941738f, &st));
    TT_OK(tide_attn_o_unrope(&out, &out, b, rope));
    for (int t = 0; t < n; t++) {
      int32_t sq;
      int64_t p;
      tide_batch_token(b, t, &sq, &p);
      const float *o = (const float *)out.data + (int64_t)t * S->H * 512;
      S->hash[sq][L][p] = fnv(o, (size_t)S->H * 512 * 4) ^ fnv((const float *)st.data + (int64_t)t * S->H * 4, (size_t)S->H * 16);
      int64_t kp = p - S->keep_from;
      if (S->keep && sq == 0 && kp >= 0 && kp % S->keep_every == 0 && kp / S->keep_every < 64)
        memcpy(S->keep + ((int64_t)L * 64 + kp / S->keep_every) * S->H * 512, o, (size_t)S->H * 512 * 4);
    }
    tide_tensor_release(&q);
    tide_tensor_release(&out);
    tide_tensor_release(&kv);
    tide_tensor_release(&st);
    tide_tensor_release(&tk);
  }
  return 0;
}

/* one step: runs[i] tokens of sequence seqs[i]; returns the prepare status */
static int sim_step(sim *S, int nr, const int32_t *seqs, const int32_t *counts) {
  TT_OK(tide_batch_clear(S->b));
  for (int i = 0; i < nr; i++) TT_OK(tide_batch_add(S->b, seqs[i], tide_kvcache_seq_len(S->c, seqs[i]), counts[i]));
  int rc = tide_kvcache_prepare(S->c, S->b);
  if (rc != TIDE_OK) return rc;
  sim_layers(S, -1);
  TT_OK(tide_kvcache_commit(S->c, S->b));
  return TIDE_OK;
}
/* feed sequence `id` up to length `len` in chunks of `chunk` */
static void sim_feed(sim *S, int32_t id, int64_t len, int32_t chunk) {
  while (tide_kvcache_seq_len(S->c, id) < len) {
    int64_t left = len - tide_kvcache_seq_len(S->c, id);
    int32_t n = left < chunk ? (int32_t)left : chunk;
    int rc = sim_step(S, 1, &id, &n);
    TT_CHECK(rc == TIDE_OK, "step of %d tokens at %lld -> %d (%s)", n, (long long)(len - left), rc, tide_last_error());
    if (rc != TIDE_OK) return;
  }
}

/* all bytes of a sequence's cache regions, hashed */
static uint64_t seq_bytes_hash(sim *S, int32_t id) {
  uint64_t h = 0;
  for (int L = 0; L < S->nL; L++)
    for (int kind = 0; kind <= 4; kind++) {
      int r = tide_kvcache_layer_ratio(S->c, L);
      if ((kind == 1 || kind == 3) && r == 1) continue;
      if ((kind == 2 || kind == 4) && r != 4) continue;
      int64_t f, n, rb;
      TT_OK(tide_kvcache_seq_extent(S->c, id, L, kind, &f, &n, &rb));
      if (!n) continue;
      tide_tensor t = mk(TIDE_U8, 2, n, rb, 1);
      TT_OK(tide_kvcache_seq_read(S->c, id, L, kind, &t));
      h = h * 31 + fnv(t.data, (size_t)(n * rb)) + (uint64_t)f;
      tide_tensor_release(&t);
    }
  return h;
}

/* =================== the dense oracle (doc 2.2, double precision) =================== */
typedef struct oracle {
  int r;
  float freq[32];
  float *win;     /* [p][512] dequantised window keys */
  float *cst;     /* [p][2cw] rows with ape */
  float *ist;     /* [p][512] */
  float *ckv;     /* [j][512] */
  float *ik;      /* [j][128] fp8 values */
  float *iks;     /* [j] */
} oracle;

static void opool(const float *st, int64_t row_w, int r, int64_t dc, int64_t j, float *out) {
  int ov = r == 4;
  int64_t cdc = (ov ? 2 : 1) * dc;
  for (int64_t ch = 0; ch < dc; ch++) {
    double mx = -INFINITY, z = 0, acc = 0;
    for (int pass = 0; pass < 2; pass++)
      for (int part = ov ? 0 : 1; part < 2; part++) {
        int64_t blk = j - 1 + part;
        if (blk < 0) continue;
        int64_t off = ov && part == 1 ? dc : 0;
        for (int t = 0; t < r; t++) {
          const float *row = st + (blk * r + t) * row_w;
          if (pass == 0) mx = fmax(mx, row[cdc + off + ch]);
          else {
            double w = exp((double)row[cdc + off + ch] - mx);
            z += w;
            acc += w * row[off + ch];
          }
        }
      }
    out[ch] = (float)(acc / z);
  }
}

/* advance the oracle's caches of layer L by the token at p (content seed sd) */
static void oracle_token(oracle *O, sim *S, int L, uint64_t sd, int64_t p) {
  int r = O->r;
  float kv[512];
  for (int i = 0; i < 512; i++) kv[i] = rbf(gen(sd, p, L, 1, i) * 1.5f);
  rope_d(kv + 448, O->freq, p, 0);
  for (int i = 0; i < 512; i++) kv[i] = rbf(kv[i]);
  qdq_mla(O->win + p * 512, kv, 1);
  if (r == 1) return;
  int64_t cw = (r == 4 ? 2 : 1) * 512;
  float *row = O->cst + p * 2 * cw;
  const float *ape = S->ape[L].data;
  for (int64_t i = 0; i < 2 * cw; i++) row[i] = rbf(gen(sd, p, L, 2, i) * (i < cw ? 1.0f : 2.0f));
  for (int64_t i = 0; i < cw; i++) row[cw + i] += ape[(p % r) * cw + i];
  if (r == 4) {
    float *ir = O->ist + p * 512;
    const float *iape = S->iape[L].data;
    for (int i = 0; i < 512; i++) ir[i] = rbf(gen(sd, p, L, 3, i) * (i < 256 ? 1.0f : 2.0f));
    for (int i = 0; i < 256; i++) ir[256 + i] += iape[(p % 4) * 256 + i];
  }
  if ((p + 1) % r) return;
  int64_t j = p / r;
  float e[512];
  opool(O->cst, 2 * cw, r, 512, j, e);
  const float *nw = S->norm[L].data;
  double ss = 0;
  for (int i = 0; i < 512; i++) ss += (double)e[i] * e[i];
  float rr = (float)(1.0 / sqrt(ss / 512 + 1e-6f));
  for (int i = 0; i < 512; i++) e[i] = e[i] * rr * nw[i];
  for (int i = 0; i < 448; i++) e[i] = rbf(e[i]);
  rope_d(e + 448, O->freq, j * r, 0); /* block start (pitfall 3) */
  qdq_mla(O->ckv + j * 512, e, 0);
  if (r == 4) {
    float k[128];
    opool(O->ist, 512, 4, 128, j, k);
    const float *inw = S->inorm[L].data;
    ss = 0;
    for (int i = 0; i < 128; i++) ss += (double)k[i] * k[i];
    rr = (float)(1.0 / sqrt(ss / 128 + 1e-6f));
    for (int i = 0; i < 128; i++) k[i] = k[i] * rr * inw[i];
    rope_d(k + 64, O->freq, j * 4, 0);
    for (int i = 0; i < 128; i++) k[i] = rbf(k[i]);
    O->iks[j] = qdq_idx(O->ik + j * 128, k, 128);
  }
}

/* the oracle's output of layer L at p given a selection sel[nsel]; also its
 * indexer scores into sc (when scored) */
static void oracle_attend(oracle *O, sim *S, int L, uint64_t sd, int64_t p, const int32_t *sel, int64_t nsel,
                          float *out) {
  int H = S->H;
  int64_t w0 = p - 127 < 0 ? 0 : p - 127, nw = p - w0 + 1, nk = nw + nsel;
  const float *sink = S->sink[L].data;
  double *sc = malloc((size_t)nk * sizeof(double));
  for (int h = 0; h < H; h++) {
    float q[512];
    for (int i = 0; i < 512; i++) q[i] = rbf(gen(sd, p, L, 0, (int64_t)h * 512 + i) * 2);
    double ss = 0;
    for (int i = 0; i < 512; i++) ss += (double)q[i] * q[i];
    float rr = (float)(1.0 / sqrt(ss / 512 + 1e-6f));
    for (int i = 0; i < 512; i++) q[i] *= rr;
    rope_d(q + 448, O->freq, p, 0);
    for (int i = 0; i < 512; i++) q[i] = rbf(q[i]);
    double mx = -INFINITY;
    for (int64_t e = 0; e < nk; e++) {
      const float *k = e < nw ? O->win + (w0 + e) * 512 : O->ckv + (int64_t)sel[e - nw] * 512;
      double d = 0;
      for (int i = 0; i < 512; i++) d += (double)q[i] * k[i];
      sc[e] = d / sqrt(512.0);
      mx = fmax(mx, sc[e]);
    }
    double z = 0, acc[512] = {0};
    for (int64_t e = 0; e < nk; e++) {
      const float *k = e < nw ? O->win + (w0 + e) * 512 : O->ckv + (int64_t)sel[e - nw] * 512;
      double pe = exp(sc[e] - mx);
      z += pe;
      float pb = rbf((float)pe);
      for (int i = 0; i < 512; i++) acc[i] += (double)pb * k[i];
    }
    double den = z + exp((double)sink[h] - mx); /* sink only in the denominator */
    float *o = out + (int64_t)h * 512;
    for (int i = 0; i < 512; i++) o[i] = rbf((float)(acc[i] / den));
    rope_d(o + 448, O->freq, p, 1);
    for (int i = 448; i < 512; i++) o[i] = rbf(o[i]);
  }
  free(sc);
}

static void oracle_scores(oracle *O, sim *S, int L, uint64_t sd, int64_t p, double *sc, int64_t n) {
  float q8[NIH][128], sq[NIH], wr[NIH];
  for (int h = 0; h < NIH; h++) {
    float v[128];
    for (int i = 0; i < 128; i++) v[i] = rbf(gen(sd, p, L, 4, h * 128 + i));
    rope_d(v + 64, O->freq, p, 0);
    for (int i = 64; i < 128; i++) v[i] = rbf(v[i]);
    sq[h] = qdq_idx(q8[h], v, 128);
    wr[h] = rbf(gen(sd, p, L, 5, h) + 0.25f);
  }
  double ws = 1.0 / sqrt(128.0) / sqrt((double)NIH);
  for (int64_t j = 0; j < n; j++) {
    double s = 0;
    for (int h = 0; h < NIH; h++) {
      double d = 0;
      for (int i = 0; i < 128; i++) d += (double)q8[h][i] * O->ik[j * 128 + i];
      if (d > 0) s += (double)wr[h] * sq[h] * ws * d;
    }
    sc[j] = s * O->iks[j];
  }
}

/* the whole scenario: sequence 0 fed in `chunk`-token steps up to len; every
 * `every`-th position (and the boundary ones) checked against the oracle */
static void scenario_vs_oracle(int chunk, int64_t len, int64_t every, int K, int hist, int64_t from, int64_t decode_from,
                               int H) {
  static const int32_t ratios[4] = {0, 4, 128, 4};
  sim *S = calloc(1, sizeof *S);
  sim_init(S, 4, ratios, H, K, 1024, hist, hist ? 64 : 24, 24);
  S->seed[0] = 1234;
  S->keep_every = every;
  S->keep_from = from;
  S->keep = tide_xcalloc((size_t)4 * 64 * S->H * 512, 4);
  int32_t id;
  TT_OK(tide_kvcache_seq_new(S->c, &id));
  sim_feed(S, id, decode_from, chunk);
  sim_feed(S, id, len, 1);
  /* oracle */
  oracle O[4];
  double worst[4] = {0};
  float *o = malloc((size_t)S->H * 512 * 4);
  int32_t *sel = malloc(4096 * 4);
  double *osc = malloc(sizeof(double) * 4096);
  for (int L = 0; L < 4; L++) {
    memset(&O[L], 0, sizeof O[L]);
    O[L].r = ratios[L] <= 1 ? 1 : ratios[L];
    tide_rope_freqs(O[L].r > 1 ? S->ry : S->rp, O[L].freq, 32);
    O[L].win = malloc((size_t)len * 512 * 4);
    O[L].cst = malloc((size_t)len * 2048 * 4);
    O[L].ist = malloc((size_t)len * 512 * 4);
    O[L].ckv = malloc((size_t)(len / 4 + 1) * 512 * 4);
    O[L].ik = malloc((size_t)(len / 4 + 1) * 128 * 4);
    O[L].iks = malloc((size_t)(len / 4 + 1) * 4);
  }
  int topk_bad = 0;
  for (int64_t p = 0; p < len; p++)
    for (int L = 0; L < 4; L++) {
      oracle_token(&O[L], S, L, 1234, p);
      if (p < from || (p - from) % every || (p - from) / every >= 64) continue;
      int r = O[L].r;
      int64_t n = r == 1 ? 0 : (p + 1) / r, nsel = 0;
      if (r == 128)
        for (int64_t j = 0; j < n; j++) sel[nsel++] = (int32_t)j;
      if (r == 4) {
        if (n <= K) {
          for (int64_t j = 0; j < n; j++) sel[nsel++] = (int32_t)j;
        } else {
          /* the kernel's choice must be a top-K set of the oracle's scores
           * (up to near-ties); rerun the kernel selection for this token */
          oracle_scores(&O[L], S, L, 1234, p, osc, n);
          /* selection by the oracle, ties to the smaller index */
          char *taken = calloc((size_t)(n > 0 ? n : 1), 1); /* n > K here; the guard is for -O1 range analysis */
          for (int k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t j = 0; j < n; j++)
              if (!taken[j] && (best < 0 || osc[j] > osc[best])) best = j;
            taken[best] = 1;
          }
          for (int64_t j = 0; j < n; j++)
            if (taken[j]) sel[nsel++] = (int32_t)j;
          free(taken);
        }
      }
      oracle_attend(&O[L], S, L, 1234, p, sel, nsel, o);
      const float *got = S->keep + ((int64_t)L * 64 + (p - from) / every) * S->H * 512;
      double e = nmse(got, o, S->H * 512);
      if (e > worst[L]) worst[L] = e;
      if (e > 1e-5 && topk_bad++ < 5) fprintf(stderr, "  layer %d p %lld nmse %g\n", L, (long long)p, e);
    }
  for (int L = 0; L < 4; L++) {
    TT_CHECK(worst[L] <= 1e-5, "chunk %d: layer %d (ratio %d) worst nmse vs oracle %g", chunk, L, ratios[L], worst[L]);
    free(O[L].win);
    free(O[L].cst);
    free(O[L].ist);
    free(O[L].ckv);
    free(O[L].ik);
    free(O[L].iks);
  }
  free(o);
  free(sel);
  free(osc);
  sim_free(S);
  free(S);
}

static void test_oracle_short(void) {
  /* 300 tokens: window truncates, C128 n = 2, C4 n = 75 (short path), K = 512;
   * checks every 5th position */
  scenario_vs_oracle(77, 300, 5, 512, 1, 0, 300, 4);
}
static void test_oracle_topk(void) {
  /* K = 16 makes the indexer select from p = 67 on: real top-k across many
   * pages, SWA blocks recycled (no history) */
  scenario_vs_oracle(50, 600, 9, 16, 0, 0, 550, 4);
}
static void test_oracle_decode_2047(void) {
  /* Flash K = 512: prefill 2040 in 3 chunks, then decode across p = 2047
   * (C128 entry 15, C4 entry 511) and p = 2051 (first real top-k); every
   * position from 2044 to 2055 checked */
  scenario_vs_oracle(680, 2056, 1, 512, 0, 2044, 2040, 2);
}

/* ---- invariance: one prefill = chunks = token by token = batches = threads ---- */
static void test_invariance(void) {
  static const int32_t ratios[4] = {0, 4, 128, 4};
  int nth0 = tide_threads_get();
  sim *A = calloc(1, sizeof *A), *B = calloc(1, sizeof *B);
  const int64_t len = 300;
  /* A: seq 0 in one prefill, seq 1 token by token (1 thread) */
  sim_init(A, 4, ratios, 4, 16, 512, 1, 64, 16);
  A->seed[0] = A->seed[1] = 77;
  int32_t a0, a1;
  TT_OK(tide_kvcache_seq_new(A->c, &a0));
  TT_OK(tide_kvcache_seq_new(A->c, &a1));
  tide_threads_set(1);
  sim_feed(A, a0, len, 300);
  sim_feed(A, a1, 140, 1);
  tide_threads_set(2);
  sim_feed(A, a1, len, 1);
  int same = 1;
  for (int L = 0; L < 4; L++)
    for (int64_t p = 0; p < len; p++) same &= A->hash[a0][L][p] == A->hash[a1][L][p];
  TT_CHECK(same, "one prefill vs token by token (and 1 vs 2 threads): outputs differ");
  TT_CHECK(seq_bytes_hash(A, a0) == seq_bytes_hash(A, a1), "one prefill vs token by token: cache bytes differ");
  /* B: mixed batches of three sequences (two with the same content) in odd
   * chunks, with another sequence's tokens in the same step */
  sim_init(B, 4, ratios, 4, 16, 512, 1, 64, 16);
  int32_t b0, b1, b2;
  TT_OK(tide_kvcache_seq_new(B->c, &b0));
  TT_OK(tide_kvcache_seq_new(B->c, &b1));
  TT_OK(tide_kvcache_seq_new(B->c, &b2));
  B->seed[b0] = 5;
  B->seed[b1] = 77;
  B->seed[b2] = 77;
  int32_t chunks[] = {7, 64, 3, 129, 1, 63, 65};
  int k = 0;
  while (tide_kvcache_seq_len(B->c, b1) < len) {
    int32_t seqs[3] = {b0, b1, b2};
    int32_t cnt[3];
    for (int i = 0; i < 3; i++) {
      int64_t left = len - tide_kvcache_seq_len(B->c, seqs[i]);
      int32_t want = chunks[(k + 2 * i) % 7];
      cnt[i] = left < want ? (int32_t)left : want;
    }
    k++;
    int nr = 0;
    int32_t s2[3], c2[3];
    for (int i = 0; i < 3; i++)
      if (cnt[i] > 0) {
        s2[nr] = seqs[i];
        c2[nr++] = cnt[i];
      }
    TT_OK(sim_step(B, nr, s2, c2));
  }
  same = 1;
  for (int L = 0; L < 4; L++)
    for (int64_t p = 0; p < len; p++) same &= B->hash[b1][L][p] == A->hash[a0][L][p] && B->hash[b2][L][p] == A->hash[a0][L][p];
  TT_CHECK(same, "mixed multi-sequence batches in odd chunks: outputs differ from the single prefill");
  TT_CHECK(seq_bytes_hash(B, b1) == seq_bytes_hash(A, a0), "batched: cache bytes differ");
  tide_threads_set(nth0);
  sim_free(A);
  sim_free(B);
  free(A);
  free(B);
}

/* ---- fork / snapshot / restore / abort ---- */
static void test_fork_snapshot_abort(void) {
  static const int32_t ratios[3] = {4, 128, 0};
  sim *S = calloc(1, sizeof *S);
  sim_init(S, 3, ratios, 2, 16, 256, 0, 40, 24);
  int32_t a, f, snap, ref;
  TT_OK(tide_kvcache_seq_new(S->c, &a));
  TT_OK(tide_kvcache_seq_new(S->c, &ref));
  S->seed[a] = S->seed[ref] = 42;
  sim_feed(S, a, 150, 50); /* mid-block for C128 (150 = 128 + 22), mid-page */
  TT_OK(tide_kvcache_seq_fork(S->c, a, &f));
  S->seed[f] = 42;
  TT_OK(tide_kvcache_seq_fork(S->c, a, &snap));
  S->seed[snap] = 42;
  /* the original and the fork continue identically, and like a fresh run */
  sim_feed(S, a, 270, 13);
  sim_feed(S, f, 270, 1);
  sim_feed(S, ref, 270, 135);
  int same = 1;
  for (int L = 0; L < 3; L++)
    for (int64_t p = 150; p < 270; p++) same &= S->hash[a][L][p] == S->hash[f][L][p] && S->hash[a][L][p] == S->hash[ref][L][p];
  TT_CHECK(same, "a fork continues bitwise like the original");
  TT_CHECK(seq_bytes_hash(S, a) == seq_bytes_hash(S, f), "fork: cache bytes differ");
  TT_CHECK(seq_bytes_hash(S, a) == seq_bytes_hash(S, ref), "fork vs fresh: cache bytes differ");
  /* restore: a goes back to the snapshot and regenerates the same tokens */
  uint64_t snap_bytes = seq_bytes_hash(S, snap);
  TT_OK(tide_kvcache_seq_assign(S->c, a, snap));
  TT_CHECK(tide_kvcache_seq_len(S->c, a) == 150, "restored length %lld", (long long)tide_kvcache_seq_len(S->c, a));
  TT_CHECK(seq_bytes_hash(S, a) == snap_bytes, "restore: bytes differ from the snapshot");
  uint64_t h_before[3][120];
  for (int L = 0; L < 3; L++)
    for (int p = 0; p < 120; p++) h_before[L][p] = S->hash[ref][L][150 + p];
  sim_feed(S, a, 270, 40);
  same = 1;
  for (int L = 0; L < 3; L++)
    for (int p = 0; p < 120; p++) same &= S->hash[a][L][150 + p] == h_before[L][p];
  TT_CHECK(same, "after restore the sequence regenerates bitwise");
  /* abort after partial writes (a Lua error in layer 1) leaves everything as before */
  tide_kvcache_stats st0, st1;
  TT_OK(tide_kvcache_stats_get(S->c, &st0));
  uint64_t ha = seq_bytes_hash(S, a), hs = seq_bytes_hash(S, snap);
  TT_OK(tide_batch_clear(S->b));
  TT_OK(tide_batch_add(S->b, a, 270, 200));   /* long: wraps the compressor rings */
  TT_OK(tide_batch_add(S->b, snap, 150, 3));  /* shared pages: copy-on-write */
  TT_OK(tide_kvcache_prepare(S->c, S->b));
  sim_layers(S, 1); /* layer 0 writes everything, then the "error" */
  TT_FAILS(tide_kvcache_commit(S->c, S->b), TIDE_E_STATE, "did not run");
  TT_OK(tide_kvcache_abort(S->c, S->b));
  TT_OK(tide_kvcache_stats_get(S->c, &st1));
  TT_CHECK(st0.swa_free == st1.swa_free && st0.pages_free == st1.pages_free && st0.seqs == st1.seqs && !st1.step_active, "abort: pool statistics changed (%d/%d free -> %d/%d)", st0.swa_free,
           st0.pages_free, st1.swa_free, st1.pages_free);
  TT_CHECK(seq_bytes_hash(S, a) == ha && seq_bytes_hash(S, snap) == hs, "abort: cache bytes or state changed");
  TT_CHECK(tide_kvcache_seq_len(S->c, a) == 270, "abort: length changed");
  /* and the sequence continues exactly as if the aborted step never happened */
  TT_OK(tide_kvcache_seq_assign(S->c, f, snap));
  sim_feed(S, f, 200, 50);
  sim_feed(S, snap, 200, 1);
  same = 1;
  for (int L = 0; L < 3; L++)
    for (int64_t p = 150; p < 200; p++) same &= S->hash[f][L][p] == S->hash[snap][L][p];
  TT_CHECK(same, "after abort: continuation differs");
  sim_free(S);
  free(S);
}

/* ---- session save/load: export every region, import into another cache, continue ---- */
static void test_export_continue(void) {
  static const int32_t ratios[3] = {4, 128, 0};
  sim *A = calloc(1, sizeof *A), *B = calloc(1, sizeof *B);
  sim_init(A, 3, ratios, 2, 16, 256, 0, 16, 8);
  sim_init(B, 3, ratios, 2, 16, 256, 0, 16, 8);
  int32_t a, b;
  TT_OK(tide_kvcache_seq_new(A->c, &a));
  TT_OK(tide_kvcache_seq_new(B->c, &b));
  TT_OK(tide_kvcache_seq_new(B->c, &b)); /* a different slot id than a */
  A->seed[a] = B->seed[b] = 31;
  sim_feed(A, a, 211, 100);
  TT_OK(tide_kvcache_seq_set_length(B->c, b, 211));
  for (int L = 0; L < 3; L++)
    for (int kind = 0; kind <= 4; kind++) {
      if (kind && ratios[L] == 0) continue;
      if ((kind == 2 || kind == 4) && ratios[L] != 4) continue;
      int64_t f, n, rb, f2, n2, rb2;
      TT_OK(tide_kvcache_seq_extent(A->c, a, L, kind, &f, &n, &rb));
      TT_OK(tide_kvcache_seq_extent(B->c, b, L, kind, &f2, &n2, &rb2));
      TT_CHECK(f == f2 && n == n2 && rb == rb2, "extent layer %d kind %d", L, kind);
      if (!n) continue;
      tide_tensor t = mk(TIDE_U8, 2, n, rb, 1);
      TT_OK(tide_kvcache_seq_read(A->c, a, L, kind, &t));
      TT_OK(tide_kvcache_seq_write(B->c, b, L, kind, &t));
      tide_tensor_release(&t);
    }
  sim_feed(A, a, 300, 7);
  sim_feed(B, b, 300, 1);
  int same = 1;
  for (int L = 0; L < 3; L++)
    for (int64_t p = 211; p < 300; p++) same &= A->hash[a][L][p] == B->hash[b][L][p];
  TT_CHECK(same, "an imported sequence continues bitwise like the exported one");
  TT_CHECK(seq_bytes_hash(A, a) == seq_bytes_hash(B, b), "imported: cache bytes differ after continuing");
  sim_free(A);
  sim_free(B);
  free(A);
  free(B);
}

/* ---- pitfalls of doc 6 ---- */
static void test_pitfalls_window_visibility(void) {
  static const int32_t ratios[2] = {4, 128};
  sim *S = calloc(1, sizeof *S);
  sim_init(S, 2, ratios, 2, 512, 256, 1, 16, 8);
  int32_t id;
  TT_OK(tide_kvcache_seq_new(S->c, &id));
  S->seed[id] = 3;
  /* p = 0: the only key is the token itself (window includes it) */
  int32_t one = 1;
  TT_OK(tide_batch_clear(S->b));
  TT_OK(tide_batch_add(S->b, id, 0, 1));
  TT_OK(tide_kvcache_prepare(S->c, S->b));
  sim_layers(S, -1);
  const float *st = S->stats.data;
  TT_CHECK(st[0] > 0 && st[1] == 0, "p=0: window mass %g (the current token), compressed mass %g", st[0], st[1]);
  TT_OK(tide_kvcache_commit(S->c, S->b));
  /* p = 1, 2, 3 token by token; from p = 3 on, C4 entry 0 is visible (to the
   * token that completes it too) */
  for (int p = 1; p <= 3; p++) TT_OK(sim_step(S, 1, &id, &one));
  TT_OK(tide_batch_clear(S->b));
  TT_OK(tide_batch_add(S->b, id, 4, 124));
  TT_OK(tide_kvcache_prepare(S->c, S->b));
  /* layer 0 only (C4): stats of tokens p = 4..127 */
  sim_layers(S, 1);
  st = S->stats.data;
  int ok4 = 1;
  for (int t = 0; t < 124; t++) ok4 &= st[(int64_t)t * 2 * 4 + 1] > 0;
  TT_CHECK(ok4, "C4: compressed entries visible from p = 3 on");
  tide_tensor sl = mk(TIDE_I64, 2, 124, 128, 1);
  TT_OK(tide_batch_slots(S->b, S->c, 0, TIDE_KV_SWA, &sl));
  const int64_t *slp = sl.data;
  /* token p = 127 (t = 123): window 0..127, all 128 slots valid */
  int full = 1;
  for (int i = 0; i < 128; i++) full &= slp[123 * 128 + i] >= 0;
  TT_CHECK(full && slp[0 * 128 + 5] == -1 && slp[0 * 128 + 4] >= 0, "window slot lists (p=4: 5 slots; p=127: 128)");
  tide_tensor_release(&sl);
  tide_tensor ws = mk(TIDE_I64, 1, 124, 1, 1);
  TT_OK(tide_batch_slots(S->b, S->c, 1, TIDE_KV_MAIN, &ws));
  const int64_t *wp = ws.data;
  int only = 1;
  for (int t = 0; t < 124; t++) only &= (t == 123) == (wp[t] >= 0);
  TT_CHECK(only, "C128 write slot only for p = 127");
  tide_tensor_release(&ws);
  TT_OK(tide_kvcache_abort(S->c, S->b));
  sim_free(S);
  free(S);
}

/* the C128 layer: the token at p = 127 sees entry 0 (floor((p+1)/r)), p = 126 does not */
static void test_pitfalls_c128_visible(void) {
  static const int32_t ratios[1] = {128};
  sim *S = calloc(1, sizeof *S);
  sim_init(S, 1, ratios, 2, 512, 256, 1, 16, 8);
  int32_t id;
  TT_OK(tide_kvcache_seq_new(S->c, &id));
  S->seed[id] = 3;
  int32_t n = 129;
  TT_OK(tide_batch_clear(S->b));
  TT_OK(tide_batch_add(S->b, id, 0, n));
  TT_OK(tide_kvcache_prepare(S->c, S->b));
  sim_layers(S, -1);
  const float *st = S->stats.data;
  TT_CHECK(st[(126 * 2) * 4 + 1] == 0 && st[(127 * 2) * 4 + 1] > 0 && st[(128 * 2) * 4 + 1] > 0,
           "C128 visibility at p=126/127/128: %g %g %g", st[(126 * 2) * 4 + 1], st[(127 * 2) * 4 + 1], st[(128 * 2) * 4 + 1]);
  TT_OK(tide_kvcache_commit(S->c, S->b));
  int64_t f, rows, rb;
  TT_OK(tide_kvcache_seq_extent(S->c, id, 0, TIDE_KV_MAIN, &f, &rows, &rb));
  TT_CHECK(rows == 1, "one C128 entry after 129 tokens (%lld)", (long long)rows);
  sim_free(S);
  free(S);
}

/* rope at the block start, checked directly on the stored bytes of a C4 entry */
static void test_pitfalls_block_start_rope(void) {
  static const int32_t ratios[1] = {4};
  sim *S = calloc(1, sizeof *S);
  sim_init(S, 1, ratios, 1, 512, 64, 1, 16, 8);
  int32_t id;
  TT_OK(tide_kvcache_seq_new(S->c, &id));
  S->seed[id] = 11;
  sim_feed(S, id, 12, 12);
  /* entry 2 covers positions 8..11 (block start 8) and overlaps block 1 */
  oracle O = {0};
  O.r = 4;
  tide_rope_freqs(S->ry, O.freq, 32);
  O.win = calloc(12 * 512, 4);
  O.cst = calloc(12 * 2048, 4);
  O.ist = calloc(12 * 512, 4);
  O.ckv = calloc(4 * 512, 4);
  O.ik = calloc(4 * 128, 4);
  O.iks = calloc(4, 4);
  for (int p = 0; p < 12; p++) oracle_token(&O, S, 0, 11, p);
  tide_tensor t = mk(TIDE_U8, 2, 3, 584, 1);
  TT_OK(tide_kvcache_seq_read(S->c, id, 0, TIDE_KV_MAIN, &t));
  float got[512];
  dec_mla(got, (const uint8_t *)t.data + 2 * 584, (const uint8_t *)t.data + 2 * 584 + 576);
  double e = nmse(got + 448, O.ckv + 2 * 512 + 448, 64);
  TT_CHECK(e < 1e-5, "C4 entry 2 rope dims vs rotation at the block start 8: nmse %g", e);
  /* rotating at the emit position 11 instead would be far off */
  float alt[512];
  memcpy(alt, O.ckv + 2 * 512, sizeof alt);
  rope_d(alt + 448, O.freq, 8, 1);
  rope_d(alt + 448, O.freq, 11, 0);
  TT_CHECK(nmse(got + 448, alt + 448, 64) > 1e-3, "the test can tell block start from emit position");
  tide_tensor_release(&t);
  free(O.win);
  free(O.cst);
  free(O.ist);
  free(O.ckv);
  free(O.ik);
  free(O.iks);
  sim_free(S);
  free(S);
}

/* the sink enters only the denominator: out(sink) = out(-inf) * Z / (Z + e^(sink-m)) */
static void test_pitfalls_sink(void) {
  uint8_t **kd, **ks;
  int64_t nk = 20;
  uint8_t *buf = make_tokens(nk, &kd, &ks);
  float q[512], o0[512], o1[512], st0[4], st1[4];
  fill_rand(q, 512, 1.0f, 1);
  float *scr = tide_xmalloc((size_t)tide_attn_scratch_floats(1, nk) * 4);
  const tide_attn_kernels *K = tide_attn_kernels_get();
  float s0 = -INFINITY, s1 = 1.5f;
  K->attn(o0, st0, q, 1, (const uint8_t *const *)kd, (const uint8_t *const *)ks, nk, 10, &s0, 0.0441941738f, scr);
  K->attn(o1, st1, q, 1, (const uint8_t *const *)kd, (const uint8_t *const *)ks, nk, 10, &s1, 0.0441941738f, scr);
  double f = 1.0 - st1[2]; /* Z / (Z + e^(sink - m)) */
  float exp1[512];
  for (int i = 0; i < 512; i++) exp1[i] = o0[i] * (float)f;
  TT_CHECK(st0[2] == 0 && st1[2] > 0.01, "sink mass %g / %g", st0[2], st1[2]);
  TT_CHECK(fabs(st1[0] + st1[1] + st1[2] - 1) < 1e-5, "masses sum to 1: %g", st1[0] + st1[1] + st1[2]);
  double e = nmse(o1, exp1, 512);
  TT_CHECK(e < 1e-4, "sink only rescales (nmse %g)", e);
  tide_xfree(scr);
  tide_xfree(buf);
  tide_xfree(kd);
  tide_xfree(ks);
}

/* top-k: ties to the smaller index, the short path, K = 512 and 1024, and the
 * decode boundaries p = 2047 / 2051 against the single prefill */
static void test_pitfalls_topk_decode(void) {
  static const int32_t ratios[2] = {4, 128};
  sim *S = calloc(1, sizeof *S);
  sim_init(S, 2, ratios, 1, 512, 2100, 0, 40, 24);
  int32_t a, b;
  TT_OK(tide_kvcache_seq_new(S->c, &a));
  TT_OK(tide_kvcache_seq_new(S->c, &b));
  S->seed[a] = S->seed[b] = 8;
  sim_feed(S, a, 2100, 2100);
  sim_feed(S, b, 2046, 1023);
  sim_feed(S, b, 2100, 1);
  int same = 1;
  for (int L = 0; L < 2; L++)
    for (int64_t p = 2040; p < 2100; p++) same &= S->hash[a][L][p] == S->hash[b][L][p];
  TT_CHECK(same, "decode across p = 2047 / 2051 equals the one-shot prefill");
  TT_CHECK(seq_bytes_hash(S, a) == seq_bytes_hash(S, b), "decode vs prefill: cache bytes");
  /* selections at the boundary: p = 2050 short (n = 512), p = 2051 scored */
  TT_OK(tide_batch_clear(S->b));
  TT_OK(tide_batch_add(S->b, a, 2100, 1));
  TT_OK(tide_kvcache_prepare(S->c, S->b));
  sim_layers(S, -1);
  /* ties: q8 = 0 gives every score 0: the selection must be 0..K-1 */
  tide_tensor q8 = mk(TIDE_U8, 3, 1, NIH, 128), w = mk(TIDE_F32, 2, 1, NIH, 1), tk = mk(TIDE_I32, 2, 1, 512, 1);
  tide_tensor sc = mk(TIDE_F32, 2, 1, 525, 1);
  for (int i = 0; i < NIH; i++) ((float *)w.data)[i] = 1;
  TT_OK(tide_attn_indexer_topk(S->c, 0, &q8, &w, S->b, &tk, &sc));
  int ties = 1;
  for (int i = 0; i < 512; i++) ties &= ((int32_t *)tk.data)[i] == i;
  TT_CHECK(ties && ((float *)sc.data)[3] == 0, "all-zero scores: ties go to the smaller index");
  /* the scores of one token split over threads (entry chunks) are the same bits */
  {
    tide_tensor qa = mk(TIDE_U8, 3, 1, NIH, 128), wa = mk(TIDE_F32, 2, 1, NIH, 1), ta = mk(TIDE_I32, 2, 1, 64, 1);
    tide_tensor s1 = mk(TIDE_F32, 2, 1, 525, 1), s2 = mk(TIDE_F32, 2, 1, 525, 1);
    memcpy(qa.data, S->q8.data, NIH * 128);
    memcpy(wa.data, S->w.data, NIH * 4);
    int nth0 = tide_threads_get();
    tide_threads_set(1);
    TT_OK(tide_attn_indexer_topk(S->c, 0, &qa, &wa, S->b, &ta, &s1));
    tide_threads_set(2);
    TT_OK(tide_attn_indexer_topk(S->c, 0, &qa, &wa, S->b, &ta, &s2));
    tide_threads_set(nth0);
    TT_CHECK(!memcmp(s1.data, s2.data, 525 * 4), "indexer scores: 1 vs 2 threads");
    tide_tensor_release(&qa);
    tide_tensor_release(&wa);
    tide_tensor_release(&ta);
    tide_tensor_release(&s1);
    tide_tensor_release(&s2);
  }
  /* K = 1024 (Pro) with n = 525 <= K: the short path, -1 padded */
  tide_tensor tk2 = mk(TIDE_I32, 2, 1, 1024, 1);
  TT_OK(tide_attn_indexer_topk(S->c, 0, &q8, &w, S->b, &tk2, NULL));
  const int32_t *t2 = tk2.data;
  TT_CHECK(t2[0] == 0 && t2[524] == 524 && t2[525] == -1 && t2[1023] == -1, "short path with K = 1024");
  /* a real selection: a fixed key pattern where entries j % 3 == 0 win, K = 128 */
  tide_tensor tk3 = mk(TIDE_I32, 2, 1, 128, 1);
  memcpy(q8.data, S->q8.data, NIH * 128);
  memcpy(w.data, S->w.data, NIH * 4);
  TT_OK(tide_attn_indexer_topk(S->c, 0, &q8, &w, S->b, &tk3, &sc));
  const int32_t *t3 = tk3.data;
  const float *scv = sc.data;
  float minsel = INFINITY, maxout = -INFINITY;
  char in[525] = {0};
  int asc = 1;
  for (int i = 0; i < 128; i++) {
    in[t3[i]] = 1;
    if (scv[t3[i]] < minsel) minsel = scv[t3[i]];
    if (i && t3[i] <= t3[i - 1]) asc = 0;
  }
  for (int j = 0; j < 525; j++)
    if (!in[j] && scv[j] > maxout) maxout = scv[j];
  TT_CHECK(asc && minsel >= maxout, "top-128 of 525: ascending %d, min selected %g >= max rejected %g", asc, minsel, maxout);
  TT_OK(tide_kvcache_abort(S->c, S->b));
  tide_tensor_release(&q8);
  tide_tensor_release(&w);
  tide_tensor_release(&tk);
  tide_tensor_release(&tk2);
  tide_tensor_release(&tk3);
  tide_tensor_release(&sc);
  sim_free(S);
  free(S);
}

/* Pro-like K = 1024 with n > K: 4200 positions (n = 1050) */
static void test_topk_1024(void) {
  static const int32_t ratios[1] = {4};
  tide_kvcache_config cfg = {0};
  cfg.n_layers = 1;
  cfg.ratios = ratios;
  cfg.swa_blocks = 4;
  cfg.pages = 20;
  cfg.max_seqs = 1;
  tide_kvcache *c;
  TT_OK(tide_kvcache_new(&c, &cfg));
  int32_t id;
  TT_OK(tide_kvcache_seq_new(c, &id));
  TT_OK(tide_kvcache_seq_set_length(c, id, 4200));
  /* indexer keys written directly through the import path: key j has one
   * non-zero dim whose value makes score(j) = (j * 37) % 1050, with ties */
  int64_t f, n, rb;
  TT_OK(tide_kvcache_seq_extent(c, id, 0, TIDE_KV_INDEX, &f, &n, &rb));
  TT_CHECK(n == 1050 && rb == 132, "extent %lld x %lld", (long long)n, (long long)rb);
  tide_tensor in = mk(TIDE_U8, 2, n, rb, 1);
  uint8_t *d = in.data;
  for (int64_t j = 0; j < n; j++) {
    d[j * 132] = 0x38; /* 1.0 */
    float s = (float)((j * 37) % 700); /* values repeat: ties */
    memcpy(d + j * 132 + 128, &s, 4);
  }
  TT_OK(tide_kvcache_seq_write(c, id, 0, TIDE_KV_INDEX, &in));
  tide_batch *b;
  TT_OK(tide_batch_new(&b, 1));
  TT_OK(tide_batch_add(b, id, 4200, 1));
  TT_OK(tide_kvcache_prepare(c, b));
  tide_tensor q8 = mk(TIDE_U8, 3, 1, 2, 128), w = mk(TIDE_F32, 2, 1, 2, 1), tk = mk(TIDE_I32, 2, 1, 1024, 1);
  ((uint8_t *)q8.data)[0] = 0x38;
  ((float *)w.data)[0] = 1;
  ((float *)w.data)[1] = 1;
  TT_OK(tide_attn_indexer_topk(c, 0, &q8, &w, b, &tk, NULL));
  /* expected: the 1024 largest of (j*37 % 700), ties to smaller j */
  char want[1050] = {0};
  for (int k = 0; k < 1024; k++) {
    int64_t best = -1;
    for (int64_t j = 0; j < 1050; j++)
      if (!want[j] && (best < 0 || (j * 37) % 700 > (best * 37) % 700)) best = j;
    want[best] = 1;
  }
  int ok = 1;
  const int32_t *t = tk.data;
  for (int k = 0; k < 1024; k++) ok &= t[k] >= 0 && t[k] < 1050 && want[t[k]] && (k == 0 || t[k] > t[k - 1]);
  TT_CHECK(ok, "K = 1024 selection with ties");
  TT_OK(tide_kvcache_abort(c, b));
  tide_tensor_release(&in);
  tide_tensor_release(&q8);
  tide_tensor_release(&w);
  tide_tensor_release(&tk);
  tide_batch_free(b);
  tide_kvcache_free(c);
}

/* kv insert bytes: exactly the independent encoder of RoPE + bf16 + tiles */
static void test_kv_insert_bytes(void) {
  static const int32_t ratios[1] = {0};
  sim *S = calloc(1, sizeof *S);
  sim_init(S, 1, ratios, 1, 16, 80, 1, 4, 1);
  int32_t id;
  TT_OK(tide_kvcache_seq_new(S->c, &id));
  S->seed[id] = 21;
  sim_feed(S, id, 70, 70);
  float freq[32];
  tide_rope_freqs(S->rp, freq, 32);
  tide_tensor t = mk(TIDE_U8, 2, 70, 584, 1);
  TT_OK(tide_kvcache_seq_read(S->c, id, 0, TIDE_KV_SWA, &t));
  int ok = 1;
  for (int p = 0; p < 70; p++) {
    float kv[512];
    for (int i = 0; i < 512; i++) kv[i] = rbf(gen(21, p, 0, 1, i) * 1.5f);
    rope_d(kv + 448, freq, p, 0);
    for (int i = 0; i < 512; i++) kv[i] = rbf(kv[i]);
    uint8_t d[584];
    enc_mla(d, d + 576, kv, 1);
    ok &= !memcmp(d, (uint8_t *)t.data + p * 584, 584);
  }
  TT_CHECK(ok, "SWA bytes equal the independent encoder");
  /* the byte view: position 65 lives in the second block at offset 1 */
  tide_tensor v = {0};
  TT_OK(tide_kvcache_view(S->c, 0, TIDE_KV_SWA, &v));
  tide_tensor sl = mk(TIDE_I64, 1, 1, 1, 1), lo = mk(TIDE_I64, 1, 1, 1, 1);
  ((int64_t *)lo.data)[0] = 65;
  TT_OK(tide_kvcache_map_slots(S->c, id, 0, TIDE_KV_SWA, &lo, &sl));
  int64_t slot = ((int64_t *)sl.data)[0], blk = slot / 64, off = slot % 64;
  const uint8_t *base = (const uint8_t *)v.data + blk * v.strides[0];
  TT_CHECK(!memcmp(base + off * 576, (uint8_t *)t.data + 65 * 584, 576) &&
               !memcmp(base + 64 * 576 + off * 8, (uint8_t *)t.data + 65 * 584 + 576, 8),
           "block layout [B x 576][B x 8] at slot %lld", (long long)slot);
  tide_tensor_release(&v);
  tide_tensor_release(&sl);
  tide_tensor_release(&lo);
  tide_tensor_release(&t);
  sim_free(S);
  free(S);
}

/* the reference kernels compose to the same bytes for the compressor (run
 * the short scenario with TIDE_REF forced and compare caches with AVX2) */
static void test_ref_vs_avx2_scenario(void) {
  static const int32_t ratios[3] = {4, 128, 0};
  sim *A = calloc(1, sizeof *A), *B = calloc(1, sizeof *B);
  sim_init(A, 3, ratios, 2, 16, 256, 1, 16, 8);
  sim_init(B, 3, ratios, 2, 16, 256, 1, 16, 8);
  int32_t a, b;
  TT_OK(tide_kvcache_seq_new(A->c, &a));
  TT_OK(tide_kvcache_seq_new(B->c, &b));
  A->seed[a] = B->seed[b] = 5;
  int old = tide_kernels_force_ref(1);
  sim_feed(A, a, 140, 70);
  tide_kernels_force_ref(old);
  sim_feed(B, b, 140, 70);
  /* SWA bytes identical; compressed entries differ at most by rare bf16 ties */
  for (int L = 0; L < 3; L++)
    for (int kind = 0; kind <= 2; kind++) {
      if (kind && ratios[L] == 0) continue;
      if (kind == 2 && ratios[L] != 4) continue;
      int64_t f, n, rb;
      TT_OK(tide_kvcache_seq_extent(A->c, a, L, kind, &f, &n, &rb));
      tide_tensor x = mk(TIDE_U8, 2, n, rb, 1), y = mk(TIDE_U8, 2, n, rb, 1);
      TT_OK(tide_kvcache_seq_read(A->c, a, L, kind, &x));
      TT_OK(tide_kvcache_seq_read(B->c, b, L, kind, &y));
      int64_t diff = 0;
      for (int64_t i = 0; i < n * rb; i++) diff += ((uint8_t *)x.data)[i] != ((uint8_t *)y.data)[i];
      if (kind == 0) TT_CHECK(diff == 0, "layer %d SWA bytes ref vs avx2: %lld differ", L, (long long)diff);
      else TT_CHECK(diff * 100 <= n * rb, "layer %d kind %d: %lld of %lld bytes differ", L, kind, (long long)diff, (long long)(n * rb));
      tide_tensor_release(&x);
      tide_tensor_release(&y);
    }
  sim_free(A);
  sim_free(B);
  free(A);
  free(B);
}

static void test_errors(void) {
  static const int32_t ratios[2] = {0, 4};
  sim *S = calloc(1, sizeof *S);
  sim_init(S, 2, ratios, 2, 16, 8, 1, 4, 2);
  int32_t id;
  TT_OK(tide_kvcache_seq_new(S->c, &id));
  tide_tensor kv = mk(TIDE_F32, 2, 3, 512, 1);
  TT_OK(tide_batch_add(S->b, id, 0, 3));
  TT_FAILS(tide_attn_kv_insert(S->c, 0, &kv, S->b, S->rp), TIDE_E_STATE, "not prepared");
  TT_OK(tide_kvcache_prepare(S->c, S->b));
  tide_tensor bad = mk(TIDE_F32, 2, 2, 512, 1);
  TT_FAILS(tide_attn_kv_insert(S->c, 0, &bad, S->b, S->rp), TIDE_E_INVALID, "kv has shape");
  TT_FAILS(tide_attn_compress(S->c, 0, &kv, &kv, &kv, 1e-6f, S->b, S->ry), TIDE_E_INVALID, "ratio 1");
  TT_FAILS(tide_attn_kv_insert(S->c, 5, &kv, S->b, S->rp), TIDE_E_RANGE, "layer 5");
  TT_FAILS(tide_kvcache_seq_free(S->c, id), TIDE_E_STATE, "prepared");
  TT_OK(tide_kvcache_abort(S->c, S->b));
  tide_tensor_release(&kv);
  tide_tensor_release(&bad);
  sim_free(S);
  free(S);
}

TT_RUN(TT(test_units_q_rows), TT(test_units_iq_unrope), TT(test_units_attn), TT(test_units_pool_iscore), TT(test_mla_bytes),
       TT(test_kv_insert_bytes), TT(test_oracle_short), TT(test_oracle_topk), TT(test_oracle_decode_2047), TT(test_invariance),
       TT(test_fork_snapshot_abort), TT(test_export_continue), TT(test_pitfalls_window_visibility), TT(test_pitfalls_c128_visible),
       TT(test_pitfalls_block_start_rope), TT(test_pitfalls_sink), TT(test_pitfalls_topk_decode), TT(test_topk_1024),
       TT(test_ref_vs_avx2_scenario), TT(test_errors))
