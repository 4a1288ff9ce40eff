/* attn.c - the DeepSeek-V4 attention kernels' public entry points: argument
 * checks, slot resolution through the prepared batch, the parallel loops, and
 * the scalar pieces every variant shares (fp8_ds_mla and indexer
 * quantisation, RMSNorm/RoPE finishing of compressed entries, top-k). The
 * heavy inner units (q rows, attention, pooling, indexer logits) dispatch to
 * ref/attn_ref.c or x86/attn_avx2.c. Parallel loops split tokens, heads,
 * entries or entry chunks, never a reduction, so results are the same for
 * any thread count and any batch composition. */
#include <math.h>
#include <stdlib.h>

#include "attn_internal.h"

const tide_attn_kernels *tide_attn_kernels_get(void) {
#if defined(__x86_64__)
  if (tide_use_avx2()) return &tide_attn_avx2;
#endif
  return &tide_attn_ref;
}

/* ---- shared scalar pieces ---- */
int tide_ceil_log2f(float x) {
  int e;
  float f = frexpf(x, &e); /* x = f * 2^e, f in [0.5, 1) */
  return f == 0.5f ? e - 1 : e;
}

void tide_mla_store(uint8_t *data, uint8_t *sc, const float *v, int flush) {
  for (int t = 0; t < 7; t++) {
    float a = 0;
    for (int i = 0; i < 64; i++) a = fmaxf(a, fabsf(v[64 * t + i]));
    float s = fmaxf(a / 448.0f, 1e-4f);
    int e = tide_ceil_log2f(s);
    for (int i = 0; i < 64; i++) {
      float x = ldexpf(v[64 * t + i], -e);
      if (x > 448.0f) x = 448.0f;
      if (x < -448.0f) x = -448.0f;
      if (flush && fabsf(x) < 0.015625f) x = 0.0f;
      data[64 * t + i] = tide_f32_to_f8e4m3(x);
    }
    sc[t] = (uint8_t)(e + 127);
  }
  sc[7] = 0;
  for (int i = 0; i < KV_ROPE; i++) {
    uint16_t h = tide_bf16r(v[KV_NOPE + i]);
    data[KV_NOPE + 2 * i] = (uint8_t)(h & 0xff);
    data[KV_NOPE + 2 * i + 1] = (uint8_t)(h >> 8);
  }
}

void tide_mla_load(float *out, const uint8_t *data, const uint8_t *sc) {
  for (int t = 0; t < 7; t++) {
    float s = sc[t] == 255 ? NAN : ldexpf(1.0f, (int)sc[t] - 127);
    for (int i = 0; i < 64; i++) out[64 * t + i] = tide_f8e4m3_to_f32(data[64 * t + i]) * s;
  }
  for (int i = 0; i < KV_ROPE; i++)
    out[KV_NOPE + i] = tide_bf16f((uint16_t)(data[KV_NOPE + 2 * i] | (data[KV_NOPE + 2 * i + 1] << 8)));
}

float tide_idx_quant(uint8_t *q8, const float *v, int64_t n) {
  float a = 1e-4f;
  for (int64_t i = 0; i < n; i++) a = fmaxf(a, fabsf(v[i]));
  int e = tide_ceil_log2f(a / 448.0f);
  for (int64_t i = 0; i < n; i++) {
    float x = ldexpf(v[i], -e);
    if (x > 448.0f) x = 448.0f;
    if (x < -448.0f) x = -448.0f;
    q8[i] = tide_f32_to_f8e4m3(x);
  }
  return ldexpf(1.0f, e);
}

/* ---- argument helpers ---- */
static int check_rows(const char *fn, const char *what, const tide_tensor *t, int64_t rows, int64_t width) {
  TIDE_CHECK(tide_check_tensor(fn, what, t, TIDE_DT(TIDE_F32), 2));
  if (t->sizes[0] != rows || t->sizes[1] != width || t->strides[1] != 1 || t->strides[0] < width) {
    char sb[64];
    return tide_errorf(TIDE_E_INVALID, fn, "%s has shape %s, expected [%lld, %lld] with contiguous rows", what,
                       tide_shape_str(t, sb, sizeof sb), (long long)rows, (long long)width);
  }
  return TIDE_OK;
}
static int check_3d(const char *fn, const char *what, const tide_tensor *t, unsigned dt, int64_t T, int64_t last) {
  TIDE_CHECK(tide_check_tensor(fn, what, t, dt, 3));
  if (t->sizes[0] != T || t->sizes[2] != last || !tide_tensor_is_contiguous(t)) {
    char sb[64];
    return tide_errorf(TIDE_E_INVALID, fn, "%s has shape %s, expected contiguous [%lld, H, %lld]", what,
                       tide_shape_str(t, sb, sizeof sb), (long long)T, (long long)last);
  }
  return TIDE_OK;
}
static int check_batch(const char *fn, const tide_batch *b, tide_rope *rope) {
  if (!b) return tide_errorf(TIDE_E_INVALID, fn, "batch is NULL");
  if (!rope) return tide_errorf(TIDE_E_INVALID, fn, "rope is NULL");
  int64_t mx = 0;
  for (int32_t t = 0; t < b->n; t++)
    if (b->pos[t] + 1 > mx) mx = b->pos[t] + 1;
  return tide_rope_reserve(rope, mx);
}
/* a small f32/bf16 vector into floats */
static int load_vec(const char *fn, const char *what, const tide_tensor *t, int64_t n, float *out) {
  TIDE_CHECK(tide_check_tensor(fn, what, t, TIDE_DT(TIDE_F32) | TIDE_DT(TIDE_BF16), -1));
  if (tide_tensor_numel(t) != n || !tide_tensor_is_contiguous(t))
    return tide_errorf(TIDE_E_INVALID, fn, "%s has %lld elements, expected %lld contiguous", what,
                       (long long)tide_tensor_numel(t), (long long)n);
  for (int64_t i = 0; i < n; i++)
    out[i] = t->dtype == TIDE_F32 ? ((const float *)t->data)[i] : tide_bf16f(((const uint16_t *)t->data)[i]);
  return TIDE_OK;
}

/* ---- q prep ---- */
int tide_attn_q_prep(tide_tensor *q, const tide_batch *b, tide_rope *rope, float eps) {
  TIDE_CHECK(check_batch(__func__, b, rope));
  TIDE_CHECK(check_3d(__func__, "q", q, TIDE_DT(TIDE_F32), b->n, KV_D));
  const tide_attn_kernels *K = tide_attn_kernels_get();
  int64_t H = q->sizes[1];
  float *qd = q->data;
#pragma omp parallel for schedule(static) if (b->n >= 4)
  for (int32_t t = 0; t < b->n; t++) {
    float tmp[64];
    K->q_rows(qd + (int64_t)t * H * KV_D, H, tide_rope_row(rope, b->pos[t], tmp), eps);
  }
  return TIDE_OK;
}

/* ---- KV insert ---- */
int tide_attn_kv_insert(tide_kvcache *c, int32_t layer, const tide_tensor *kv, const tide_batch *b, tide_rope *rope) {
  TIDE_CHECK(tide_kv_check_step(__func__, c, b, layer, 7));
  TIDE_CHECK(check_batch(__func__, b, rope));
  TIDE_CHECK(check_rows(__func__, "kv", kv, b->n, KV_D));
  const kv_layer *ly = &c->layers[layer];
  int64_t B = c->cfg.swa_block;
  const tide_attn_kernels *K = tide_attn_kernels_get();
#pragma omp parallel for schedule(static) if (b->n >= 16)
  for (int32_t t = 0; t < b->n; t++) {
    float v[KV_D], tmp[64];
    memcpy(v, (const float *)kv->data + t * kv->strides[0], sizeof v);
    tide_rope64(v + KV_NOPE, tide_rope_row(rope, b->pos[t], tmp), 0);
    for (int i = 0; i < KV_D; i++) v[i] = tide_round_bf16(v[i]);
    int64_t off;
    uint8_t *blk = kv_swa_block(c, ly, &c->seqs[b->seq[t]], b->pos[t], &off);
    K->mla_store(blk + off * KV_DATA, blk + B * KV_DATA + off * 8, v, 1);
  }
  return TIDE_OK;
}

/* ---- compressors ---- */
typedef struct comp_args {
  tide_kvcache *c;
  const kv_layer *ly;
  const tide_batch *b;
  const float *kvs;
  int64_t kstride;   /* floats between rows of kvs */
  const float *ape;
  const float *norm;
  float eps;
  tide_rope *rope;
  int indexer;
  int64_t dc, cw;    /* channels, c*dc */
} comp_args;

/* pool, normalise, rotate and store entry j of run r */
static void comp_entry(const comp_args *A, const tide_attn_kernels *K, int r, int64_t j, float *out) {
  const tide_batch *b = A->b;
  kv_seq *s = &A->c->seqs[b->run_seq[r]];
  int ratio = A->indexer ? 4 : A->ly->ratio;
  int64_t L0 = s->len, t0 = b->run_t0[r], R = kv_ring_rows(ratio);
  int64_t width = 2 * A->cw, dc = A->dc;
  const float *ring = kv_ring(A->c, s, A->ly, A->indexer);
  const float *pa[256], *pb[256], *pe[256];
  int64_t n = 0;
  for (int part = ratio == 4 ? 0 : 1; part < 2; part++) {
    int64_t blk = j - 1 + part;
    if (blk < 0) continue;
    int64_t off = ratio == 4 && part == 1 ? dc : 0;
    for (int64_t i = 0; i < ratio; i++) {
      int64_t q = blk * ratio + i;
      if (q >= L0) {
        const float *row = A->kvs + (t0 + q - L0) * A->kstride;
        pa[n] = row + off;
        pb[n] = row + A->cw + off;
        pe[n] = A->ape + (q % ratio) * A->cw + off;
      } else {
        const float *row = ring + (q % R) * width;
        pa[n] = row + off;
        pb[n] = row + A->cw + off;
        pe[n] = NULL;
      }
      n++;
    }
  }
  K->pool(out, dc, n, pa, pb, pe);
  /* RMSNorm with weight, as the reference: x * r * w in f32 */
  double ss = 0;
  for (int64_t i = 0; i < dc; i++) ss += (double)out[i] * out[i];
  float rr = (float)(1.0 / sqrt(ss / (double)dc + A->eps));
  for (int64_t i = 0; i < dc; i++) out[i] = out[i] * rr * A->norm[i];
  float tmp[64];
  const float *cs = tide_rope_row(A->rope, j * ratio, tmp);
  const kv_layer *ly = A->ly;
  int64_t off;
  uint8_t *blk = kv_entry_block(A->c, ly, s, j, A->indexer, &off);
  if (!A->indexer) {
    for (int i = 0; i < KV_NOPE; i++) out[i] = tide_round_bf16(out[i]);
    tide_rope64(out + KV_NOPE, cs, 0);
    K->mla_store(blk + off * KV_DATA, blk + ly->E * KV_DATA + off * 8, out, 0);
  } else {
    tide_rope64(out + 64, cs, 0);
    for (int i = 0; i < KV_ID; i++) out[i] = tide_round_bf16(out[i]);
    float sc = tide_idx_quant(blk + off * KV_ID, out, KV_ID);
    memcpy(blk + ly->E * KV_ID + off * 4, &sc, 4);
  }
}

static int compress_common(const char *fn, tide_kvcache *c, int32_t layer, const tide_tensor *kvs,
                           const tide_tensor *ape, const tide_tensor *norm, float eps, const tide_batch *b,
                           tide_rope *rope, int indexer) {
  TIDE_CHECK(tide_kv_check_step(fn, c, b, layer, indexer ? 2u : 6u));
  TIDE_CHECK(check_batch(fn, b, rope));
  const kv_layer *ly = &c->layers[layer];
  int ratio = indexer ? 4 : ly->ratio;
  int64_t dc = indexer ? KV_ID : KV_D, cw = (ratio == 4 ? 2 : 1) * dc;
  TIDE_CHECK(check_rows(fn, "kvs", kvs, b->n, 2 * cw));
  TIDE_CHECK(tide_check_tensor(fn, "ape", ape, TIDE_DT(TIDE_F32), 2));
  if (ape->sizes[0] != ratio || ape->sizes[1] != cw || !tide_tensor_is_contiguous(ape)) {
    char sb[64];
    return tide_errorf(TIDE_E_INVALID, fn, "ape has shape %s, expected [%d, %lld]", tide_shape_str(ape, sb, sizeof sb),
                       ratio, (long long)cw);
  }
  float nw[KV_D];
  TIDE_CHECK(load_vec(fn, "norm", norm, dc, nw));
  unsigned bit = indexer ? 2u : 1u;
  if (c->ran[layer] & bit)
    return tide_errorf(TIDE_E_STATE, fn, "layer %d: the %s compressor already ran in this step", layer,
                       indexer ? "indexer" : "main");
  comp_args A = {c, ly, b, kvs->data, kvs->strides[0], ape->data, nw, eps, rope, indexer, dc, cw};
  const tide_attn_kernels *K = tide_attn_kernels_get();
  int64_t R = kv_ring_rows(ratio), width = 2 * cw;
  for (int r = 0; r < b->n_runs; r++) {
    kv_seq *s = &c->seqs[b->run_seq[r]];
    int64_t L0 = s->len, L1 = L0 + b->run_n[r];
    int64_t j0 = (L0 + 1 + ratio - 1) / ratio - 1; /* first j with (j+1)r-1 >= L0 */
    int64_t j1 = L1 / ratio;                       /* entries 0..j1-1 complete after the step */
    if (j0 < 0) j0 = 0;
#pragma omp parallel for schedule(dynamic, 1) if (j1 - j0 > 1)
    for (int64_t j = j0; j < j1; j++) {
      float out[KV_D];
      comp_entry(&A, K, r, j, out);
    }
    /* the step's last R rows join the ring (after pooling read it): the rows
     * still needed after the step, and those a roll-back to a shorter length
     * within the step needs (tide_kvcache_seq_truncate) */
    float *ring = kv_ring(c, s, ly, indexer);
    int64_t ks = L1 - R;
    for (int64_t q = ks > L0 ? ks : L0; q < L1; q++) {
      const float *src = A.kvs + (b->run_t0[r] + q - L0) * A.kstride;
      float *dst = ring + (q % R) * width;
      const float *ap = A.ape + (q % ratio) * cw;
      for (int64_t i = 0; i < cw; i++) dst[i] = src[i];
      for (int64_t i = 0; i < cw; i++) dst[cw + i] = src[cw + i] + ap[i];
    }
  }
  c->ran[layer] |= (uint8_t)bit;
  return TIDE_OK;
}

int tide_attn_compress(tide_kvcache *c, int32_t layer, const tide_tensor *kvs, const tide_tensor *ape,
                       const tide_tensor *norm, float eps, const tide_batch *b, tide_rope *rope) {
  return compress_common(__func__, c, layer, kvs, ape, norm, eps, b, rope, 0);
}
int tide_attn_compress_indexer(tide_kvcache *c, int32_t layer, const tide_tensor *kvs, const tide_tensor *ape,
                               const tide_tensor *norm, float eps, const tide_batch *b, tide_rope *rope) {
  return compress_common(__func__, c, layer, kvs, ape, norm, eps, b, rope, 1);
}

/* ---- indexer ---- */
int tide_attn_indexer_q(tide_tensor *q8, tide_tensor *w, const tide_tensor *qi, const tide_tensor *w_raw,
                        float wscale, const tide_batch *b, tide_rope *rope) {
  TIDE_CHECK(check_batch(__func__, b, rope));
  TIDE_CHECK(check_3d(__func__, "qi", qi, TIDE_DT(TIDE_F32), b->n, KV_ID));
  int64_t nI = qi->sizes[1];
  TIDE_CHECK(check_3d(__func__, "q8", q8, TIDE_DT(TIDE_U8) | TIDE_DT(TIDE_F8E4M3), b->n, KV_ID));
  if (q8->sizes[1] != nI) return TIDE_ERR(TIDE_E_INVALID, "q8 has %lld heads, qi %lld", (long long)q8->sizes[1], (long long)nI);
  TIDE_CHECK(check_rows(__func__, "w_raw", w_raw, b->n, nI));
  TIDE_CHECK(check_rows(__func__, "w", w, b->n, nI));
  const float *qd = qi->data;
  uint8_t *o8 = q8->data;
  const tide_attn_kernels *K = tide_attn_kernels_get();
#pragma omp parallel for schedule(static) if (b->n >= 16)
  for (int32_t t = 0; t < b->n; t++) {
    float tmp[64], sc[256];
    const float *cs = tide_rope_row(rope, b->pos[t], tmp);
    for (int64_t h0 = 0; h0 < nI; h0 += 256) {
      int64_t nh = nI - h0 < 256 ? nI - h0 : 256;
      K->iq_rows(o8 + ((int64_t)t * nI + h0) * KV_ID, sc, qd + ((int64_t)t * nI + h0) * KV_ID, nh, cs);
      const float *wr = (const float *)w_raw->data + t * w_raw->strides[0] + h0;
      float *wo = (float *)w->data + t * w->strides[0] + h0;
      for (int64_t h = 0; h < nh; h++) wo[h] = wr[h] * sc[h] * wscale;
    }
  }
  return TIDE_OK;
}

/* top-k with ties to the smaller index: a min-heap keyed (score, -index) */
typedef struct { float s; int32_t j; } sel_item;
static int worse(sel_item a, sel_item b) { return a.s < b.s || (a.s == b.s && a.j > b.j); }
static void sift(sel_item *h, int64_t n, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, m = i;
    if (l < n && worse(h[l], h[m])) m = l;
    if (l + 1 < n && worse(h[l + 1], h[m])) m = l + 1;
    if (m == i) return;
    sel_item t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}
static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}
/* the K best of sc[0..n) (n > K) into out[0..K) ascending; heap = K items */
static void select_topk(int32_t *out, const float *sc, int64_t n, int64_t K, sel_item *heap) {
  for (int64_t j = 0; j < K; j++) heap[j] = (sel_item){isnan(sc[j]) ? -INFINITY : sc[j], (int32_t)j};
  for (int64_t i = K / 2 - 1; i >= 0; i--) sift(heap, K, i);
  for (int64_t j = K; j < n; j++) {
    sel_item it = {isnan(sc[j]) ? -INFINITY : sc[j], (int32_t)j};
    if (worse(heap[0], it)) {
      heap[0] = it;
      sift(heap, K, 0);
    }
  }
  for (int64_t i = 0; i < K; i++) out[i] = heap[i].j;
  qsort(out, (size_t)K, sizeof(int32_t), cmp_i32);
}

enum { ISCORE_BUDGET = 1 << 24 };

int tide_attn_indexer_topk(tide_kvcache *c, int32_t layer, const tide_tensor *q8, const tide_tensor *w,
                           const tide_batch *b, tide_tensor *topk, tide_tensor *scores) {
  TIDE_CHECK(tide_kv_check_step(__func__, c, b, layer, 2u));
  TIDE_CHECK(check_3d(__func__, "q8", q8, TIDE_DT(TIDE_U8) | TIDE_DT(TIDE_F8E4M3), b->n, KV_ID));
  int64_t nI = q8->sizes[1];
  TIDE_CHECK(check_rows(__func__, "w", w, b->n, nI));
  TIDE_CHECK(tide_check_tensor(__func__, "topk", topk, TIDE_DT(TIDE_I32), 2));
  if (topk->sizes[0] != b->n || !tide_tensor_is_contiguous(topk) || topk->sizes[1] < 1)
    return TIDE_ERR(TIDE_E_INVALID, "topk must be contiguous [%d, K]", b->n);
  int64_t K = topk->sizes[1], S = 0;
  if (scores) {
    TIDE_CHECK(check_rows(__func__, "scores", scores, b->n, scores->sizes[1]));
    S = scores->sizes[1];
  }
  const kv_layer *ly = &c->layers[layer];
  int32_t *tk = topk->data;
  /* the short path, and the list of tokens that need scoring */
  int64_t max_n = 0, n_scored = 0;
  for (int32_t t = 0; t < b->n; t++) {
    int64_t n = (b->pos[t] + 1) / 4;
    if (n <= K) {
      for (int64_t i = 0; i < K; i++) tk[t * K + i] = i < n ? (int32_t)i : -1;
    } else {
      n_scored++;
      if (n > max_n) max_n = n;
    }
  }
  if (!n_scored) return TIDE_OK;
  /* tokens scored together: as many as fit the score buffer budget */
  int64_t group = ISCORE_BUDGET / max_n;
  if (group < 1) group = 1;
  if (group > n_scored) group = n_scored;
  if (c->shared_cap < group * max_n) {
    int64_t cap = group * max_n + group * max_n / 2; /* grow-only, geometric */
    float *p = tide_xrealloc(c->shared, (size_t)cap * sizeof(float));
    if (!p) return TIDE_ERR(TIDE_E_NOMEM, "indexer scores of %lld floats", (long long)cap);
    c->shared = p;
    c->shared_cap = cap;
  }
  int nth = tide_omp_threads();
  if (nth > KV_MAXTHREADS) nth = KV_MAXTHREADS;
  int64_t per = nI * KV_ID + (K * (int64_t)sizeof(sel_item) + 3) / 4 + 16;
  for (int i = 0; i < nth; i++) TIDE_CHECK(tide_kv_scratch(c, i, per));
  const tide_attn_kernels *K_ = tide_attn_kernels_get();
  const uint8_t *q8d = q8->data;
  int32_t t_next = 0;
  while (t_next < b->n) {
    /* gather the next group of scored tokens */
    int32_t gt[256];
    int64_t gn = 0;
    for (; t_next < b->n && gn < group && gn < 256; t_next++)
      if ((b->pos[t_next] + 1) / 4 > K) gt[gn++] = t_next;
    if (!gn) break;
    /* entry chunks: enough work items for every thread even for one token
     * (each logit is computed on its own, so the split changes no bit) */
    int64_t chunk = (max_n * gn + 4 * nth - 1) / (4 * nth) / gn;
    chunk = chunk < 256 ? 256 : chunk > 8192 ? 8192 : (chunk + 63) / 64 * 64;
    int64_t nchunks = (max_n + chunk - 1) / chunk;
    float *sc = c->shared;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t it = 0; it < gn * nchunks; it++) {
      int64_t gi = it / nchunks, ch = it % nchunks;
      int32_t t = gt[gi];
      int64_t n = (b->pos[t] + 1) / 4, j0 = ch * chunk, j1 = j0 + chunk;
      if (j1 > n) j1 = n;
      if (j0 >= j1) continue;
      float *qf = c->scratch[tide_omp_tid()];
      for (int64_t i = 0; i < nI * KV_ID; i++) qf[i] = tide_f8e4m3_to_f32(q8d[(int64_t)t * nI * KV_ID + i]);
      const float *wt = (const float *)w->data + t * w->strides[0];
      const kv_seq *s = &c->seqs[b->seq[t]];
      for (int64_t j = j0; j < j1;) {
        int64_t off;
        const uint8_t *blk = kv_entry_block(c, ly, s, j, 1, &off);
        int64_t cnt = ly->E - off;
        if (cnt > j1 - j) cnt = j1 - j;
        K_->iscore(sc + gi * max_n + j, cnt, blk + off * KV_ID, (const float *)(blk + ly->E * KV_ID) + off, qf, wt, nI);
        j += cnt;
      }
    }
#pragma omp parallel for schedule(dynamic, 1) if (gn > 1)
    for (int64_t gi = 0; gi < gn; gi++) {
      int32_t t = gt[gi];
      int64_t n = (b->pos[t] + 1) / 4;
      sel_item *heap = (sel_item *)(c->scratch[tide_omp_tid()] + nI * KV_ID + 8);
      select_topk(tk + t * K, sc + gi * max_n, n, K, heap);
      if (scores) {
        float *so = (float *)scores->data + t * scores->strides[0];
        memcpy(so, sc + gi * max_n, (size_t)(n < S ? n : S) * sizeof(float));
      }
    }
  }
  return TIDE_OK;
}

/* ---- sparse attention ---- */
int tide_attn_sparse(tide_tensor *out, const tide_tensor *q, tide_kvcache *c, int32_t layer, const tide_batch *b,
                     const tide_tensor *topk, const tide_tensor *sink, float scale, tide_tensor *stats) {
  TIDE_CHECK(tide_kv_check_step(__func__, c, b, layer, 7u));
  TIDE_CHECK(check_3d(__func__, "q", q, TIDE_DT(TIDE_F32), b->n, KV_D));
  int64_t H = q->sizes[1];
  TIDE_CHECK(check_3d(__func__, "out", out, TIDE_DT(TIDE_F32), b->n, KV_D));
  if (out->sizes[1] != H) return TIDE_ERR(TIDE_E_INVALID, "out has %lld heads, q %lld", (long long)out->sizes[1], (long long)H);
  TIDE_CHECK(tide_check_tensor(__func__, "sink", sink, TIDE_DT(TIDE_F32), 1));
  if (sink->sizes[0] != H || !tide_tensor_is_contiguous(sink))
    return TIDE_ERR(TIDE_E_INVALID, "sink has %lld elements, expected %lld", (long long)sink->sizes[0], (long long)H);
  const kv_layer *ly = &c->layers[layer];
  int r = ly->ratio;
  int64_t K = 0;
  if (topk) {
    if (r != 4) return TIDE_ERR(TIDE_E_INVALID, "layer %d has ratio %d: topk is only for ratio-4 layers", layer, r);
    TIDE_CHECK(tide_check_tensor(__func__, "topk", topk, TIDE_DT(TIDE_I32), 2));
    if (topk->sizes[0] != b->n || !tide_tensor_is_contiguous(topk))
      return TIDE_ERR(TIDE_E_INVALID, "topk must be contiguous [%d, K]", b->n);
    K = topk->sizes[1];
  }
  if (stats) {
    TIDE_CHECK(check_3d(__func__, "stats", stats, TIDE_DT(TIDE_F32), b->n, 4));
    if (stats->sizes[1] != H) return TIDE_ERR(TIDE_E_INVALID, "stats must be [%d, %lld, 4]", b->n, (long long)H);
  }
  int64_t W = c->cfg.window, B = c->cfg.swa_block, nk_max = 0;
  for (int32_t t = 0; t < b->n; t++) {
    int64_t nc = r == 1 ? 0 : topk ? K : (b->pos[t] + 1) / r;
    /* the full window, so that decode sizes its scratch once */
    if (W + nc > nk_max) nk_max = W + nc;
  }
  int nth = tide_omp_threads();
  if (nth > KV_MAXTHREADS) nth = KV_MAXTHREADS;
  /* heads per work item: whole tokens when there are enough of them */
  int64_t hb = H;
  if (b->n < nth) {
    int64_t parts = (nth + b->n - 1) / b->n;
    hb = (H + parts - 1) / parts;
    hb = (hb + 3) / 4 * 4;
    if (hb > H) hb = H;
  }
  int64_t nhb = (H + hb - 1) / hb;
  int64_t per = tide_attn_scratch_floats(hb, nk_max) + nk_max * 4 + 16; /* + two pointer lists */
  for (int i = 0; i < nth; i++) TIDE_CHECK(tide_kv_scratch(c, i, per));
  const tide_attn_kernels *KK = tide_attn_kernels_get();
  const float *qd = q->data, *sk = sink->data;
  float *od = out->data, *st = stats ? stats->data : NULL;
  const int32_t *tkd = topk ? topk->data : NULL;
#pragma omp parallel for schedule(dynamic, 1) if ((int64_t)b->n * nhb > 1)
  for (int64_t it = 0; it < (int64_t)b->n * nhb; it++) {
    int32_t t = (int32_t)(it / nhb);
    int64_t h0 = (it % nhb) * hb, nh = H - h0 < hb ? H - h0 : hb;
    float *scr = c->scratch[tide_omp_tid()];
    const uint8_t **kd = (const uint8_t **)scr, **ks = kd + nk_max;
    float *work = scr + nk_max * 4 + 16;
    const kv_seq *s = &c->seqs[b->seq[t]];
    int64_t p = b->pos[t], w0 = p - W + 1 < 0 ? 0 : p - W + 1, nk = 0;
    for (int64_t u = w0; u <= p; u++) {
      int64_t off;
      uint8_t *blk = kv_swa_block(c, ly, s, u, &off);
      if (!blk) continue;
      kd[nk] = blk + off * KV_DATA;
      ks[nk] = blk + B * KV_DATA + off * 8;
      nk++;
    }
    int64_t nwin = nk;
    if (r > 1) {
      int64_t nvis = (p + 1) / r, cnt = tkd ? K : nvis;
      for (int64_t i = 0; i < cnt; i++) {
        int64_t j = tkd ? tkd[(int64_t)t * K + i] : i;
        if (j < 0 || j >= nvis) continue;
        int64_t off;
        uint8_t *blk = kv_entry_block(c, ly, s, j, 0, &off);
        if (!blk) continue;
        kd[nk] = blk + off * KV_DATA;
        ks[nk] = blk + ly->E * KV_DATA + off * 8;
        nk++;
      }
    }
    KK->attn(od + ((int64_t)t * H + h0) * KV_D, st ? st + ((int64_t)t * H + h0) * 4 : NULL,
             qd + ((int64_t)t * H + h0) * KV_D, nh, kd, ks, nk, nwin, sk + h0, scale, work);
  }
  return TIDE_OK;
}

/* ---- output path ---- */
int tide_attn_o_unrope(tide_tensor *out, const tide_tensor *in, const tide_batch *b, tide_rope *rope) {
  TIDE_CHECK(check_batch(__func__, b, rope));
  TIDE_CHECK(check_3d(__func__, "in", in, TIDE_DT(TIDE_F32), b->n, KV_D));
  TIDE_CHECK(check_3d(__func__, "out", out, TIDE_DT(TIDE_F32), b->n, KV_D));
  int64_t H = in->sizes[1];
  if (out->sizes[1] != H) return TIDE_ERR(TIDE_E_INVALID, "out has %lld heads, in %lld", (long long)out->sizes[1], (long long)H);
  const float *id = in->data;
  float *od = out->data;
  const tide_attn_kernels *K = tide_attn_kernels_get();
#pragma omp parallel for schedule(static) if (b->n >= 16)
  for (int32_t t = 0; t < b->n; t++) {
    float tmp[64];
    K->unrope_rows(od + (int64_t)t * H * KV_D, id + (int64_t)t * H * KV_D, H, tide_rope_row(rope, b->pos[t], tmp));
  }
  return TIDE_OK;
}
