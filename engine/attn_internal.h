/* attn_internal.h - private structures of the KV cache, batches and RoPE
 * tables (engine/kvcache.c, kernels/rope.c) and the per-unit kernel table
 * the attention kernels dispatch through (kernels/attn.c, ref/attn_ref.c,
 * x86/attn_avx2.c). Never exported to Lua. */
#ifndef TIDE_ATTN_INTERNAL_H
#define TIDE_ATTN_INTERNAL_H

#include "tide_internal.h"

enum {
  KV_D = 512,          /* head dim */
  KV_NOPE = 448,       /* fp8 part */
  KV_ROPE = 64,        /* bf16 part */
  KV_DATA = 576,       /* data bytes per token: 448 fp8 + 64 bf16 */
  KV_TOK = 584,        /* + 8 scale bytes */
  KV_ID = 128,         /* indexer head dim */
  KV_IDX = 132,        /* indexer entry bytes: 128 fp8 + f32 scale */
  KV_MAXTHREADS = 64,
  KV_TRUNC_REL = 8     /* SWA blocks a commit's roll-back record keeps */
};

struct tide_rope {
  float freq[32];
  int32_t dim;
  int64_t limit;       /* positions the table may hold */
  float *table;        /* [n][64]: cos x32 | sin x32 */
  int64_t n;           /* positions filled */
};
/* Make the table cover positions < need (up to the limit); serial code only.
 * Returns TIDE_OK or TIDE_E_NOMEM. */
int tide_rope_reserve(tide_rope *r, int64_t need);
/* Row of position p: a pointer into the table, or `tmp` filled on the fly.
 * Safe to call from many threads after tide_rope_reserve. */
const float *tide_rope_row(const tide_rope *r, int64_t p, float *tmp);

typedef struct kv_layer {
  int ratio;           /* 1, 4, 128 */
  int comp;            /* index of the main compressor state, -1 if ratio 1 */
  int icomp;           /* index of the indexer state (ratio 4), else -1 */
  int64_t E;           /* compressed entries per page (page_tokens / ratio) */
  tide_storage *swa, *main, *idx;   /* pools of this layer */
  int64_t swa_stride, main_stride, idx_stride;   /* bytes per block/page */
} kv_layer;

typedef struct kv_seq {
  int live;
  int64_t len;                       /* committed length */
  int32_t *swa; int64_t swa_cap;     /* SWA block per position block, -1 none */
  int32_t *pg; int64_t pg_cap;       /* page per page index, -1 none */
  float *state;                      /* all compressor rings of this slot */
  float *backup;                     /* same size, rows saved at prepare */
  int backed;                        /* backup holds this step's rows */
  /* roll-back record of the last committed step (tide_kvcache_seq_truncate) */
  int64_t t_p0;                      /* length before it; -1: none */
  int64_t t_epoch;                   /* cache epoch at its commit */
  int t_backed;                      /* backup holds the carried rows of t_p0 */
  int t_nrel;                        /* SWA blocks its commit released; -1: too many */
  int64_t t_rel_bi[KV_TRUNC_REL];
  int32_t t_rel_id[KV_TRUNC_REL];
} kv_seq;

/* one undo record of prepare: table entry (kind 0 SWA, 1 page) changed */
typedef struct kv_undo {
  int32_t kind, seq;
  int64_t index;
  int32_t old;
} kv_undo;

struct tide_kvcache {
  int64_t refs;                      /* atomic: the owner's plus tide_kvcache_retain's */
  tide_kvcache_config cfg;
  int32_t *ratios;
  kv_layer *layers;
  int n_comp, n_icomp;               /* compressed layers, ratio-4 layers */
  int64_t *ring_off;                 /* per comp state: offset in floats in a slot's state */
  int64_t *iring_off;
  int64_t state_floats;              /* floats of one slot's state */
  int32_t *swa_ref; int32_t *swa_free; int32_t n_swa_free;
  int32_t *pg_ref; int32_t *pg_free; int32_t n_pg_free;
  kv_seq *seqs; int32_t n_live;
  /* the step in flight */
  tide_batch *step;
  kv_undo *undo; int64_t n_undo, undo_cap;
  uint8_t *ran;                      /* per layer: bit0 compress, bit1 indexer compress */
  /* grow-only per-thread scratch for the kernels */
  float *scratch[KV_MAXTHREADS];
  int64_t scratch_cap[KV_MAXTHREADS];
  float *shared; int64_t shared_cap; /* one buffer for all threads (indexer scores) */
  int64_t epoch;                     /* bumped by anything that writes blocks or takes them from the pool */
};

struct tide_batch {
  int32_t max_tokens, n;
  int32_t *seq;
  int64_t *pos;
  int32_t n_runs;
  int32_t *run_seq, *run_t0, *run_n;
  tide_kvcache *cache;               /* set while prepared */
};

/* ring geometry of a ratio: rows kept and the first position still needed
 * after `len` positions (C4: previous complete block and the open one). */
static inline int64_t kv_ring_rows(int ratio) { return ratio == 4 ? 8 : ratio; }
static inline int64_t kv_keep_start(int ratio, int64_t len) {
  int64_t blk = len / ratio;
  if (ratio == 4) blk -= 1;
  return blk < 0 ? 0 : blk * ratio;
}
static inline int64_t kv_state_width(int ratio) { return ratio == 4 ? 2048 : 1024; }
enum { KV_ISTATE_W = 512 };

/* Byte address of SWA position q of a sequence in a layer, or NULL. */
static inline uint8_t *kv_swa_block(const tide_kvcache *c, const kv_layer *ly, const kv_seq *s,
                                    int64_t q, int64_t *off) {
  int64_t B = c->cfg.swa_block, bi = q / B;
  *off = 0;
  if (q < 0 || bi >= s->swa_cap || s->swa[bi] < 0) return NULL;
  *off = q % B;
  return (uint8_t *)tide_storage_data(ly->swa) + (int64_t)s->swa[bi] * ly->swa_stride;
}
/* Block base of compressed entry j of ratio r (entry offset in *off). */
static inline uint8_t *kv_entry_block(const tide_kvcache *c, const kv_layer *ly, const kv_seq *s,
                                      int64_t j, int idx, int64_t *off) {
  int64_t pi = j / ly->E;
  *off = 0;
  if (j < 0 || pi >= s->pg_cap || s->pg[pi] < 0) return NULL;
  *off = j % ly->E;
  if (idx) return (uint8_t *)tide_storage_data(ly->idx) + (int64_t)s->pg[pi] * ly->idx_stride;
  return (uint8_t *)tide_storage_data(ly->main) + (int64_t)s->pg[pi] * ly->main_stride;
}
static inline float *kv_ring(const tide_kvcache *c, const kv_seq *s, const kv_layer *ly, int indexer) {
  return s->state + (indexer ? c->iring_off[ly->icomp] : c->ring_off[ly->comp]);
}

/* Check that b is prepared on c and layer is valid with a ratio allowed by mask
 * (bit 0: ratio 1, bit 1: ratio 4, bit 2: ratio 128). */
int tide_kv_check_step(const char *fn, const tide_kvcache *c, const tide_batch *b, int32_t layer,
                       unsigned ratio_mask);
/* Grow thread t's scratch to n floats (serial code only). */
int tide_kv_scratch(tide_kvcache *c, int t, int64_t n);

/* ---- kernel pieces (kernels/attn.c, ref/attn_ref.c, x86/attn_avx2.c) ---- */
typedef struct tide_attn_kernels {
  /* one token's q: H heads of 512, norm + rope(cs) + bf16, in place */
  void (*q_rows)(float *q, int64_t H, const float *cs, float eps);
  /* attention of nh heads of one token over nk keys (the first nwin are
   * window keys): kd[e] = 576 data bytes, ks[e] = 8 scale bytes. out [nh,512]
   * bf16-rounded; stats [nh,4] or NULL; scratch >= attn_scratch(nh, nk). */
  void (*attn)(float *out, float *stats, const float *q, int64_t nh, const uint8_t *const *kd,
               const uint8_t *const *ks, int64_t nk, int64_t nwin, const float *sink, float scale,
               float *scratch);
  /* per-channel softmax pooling over n rows: out[ch] = sum_t w_t a_t[ch],
   * w = softmax_t(b_t[ch] + (ape_t ? ape_t[ch] : 0)) */
  void (*pool)(float *out, int64_t dc, int64_t n, const float *const *a, const float *const *b,
               const float *const *ape);
  /* indexer logits of n entries of one page block: out[i] = ks[i] * sum_h
   * w[h] * relu(q[h] . k8[i]) (q: fp8 values decoded to f32, [nI,128]) */
  void (*iscore)(float *out, int64_t n, const uint8_t *k8, const float *ks, const float *q,
                 const float *w, int64_t nI);
  /* fp8_ds_mla store of one 512-vector (see tide_mla_store): same bytes */
  void (*mla_store)(uint8_t *data, uint8_t *sc, const float *v, int flush);
  /* one token's indexer query: nI heads of 128, RoPE on 64..127, rotated
   * dims bf16, fp8 with a power-of-two scale per head -> q8, scales[nI] */
  void (*iq_rows)(uint8_t *q8, float *scales, const float *qi, int64_t nI, const float *cs);
  /* one token's output path: H heads, dims 448..511 inverse-rotated and
   * rounded to bf16, others copied (out may be in) */
  void (*unrope_rows)(float *out, const float *in, int64_t H, const float *cs);
} tide_attn_kernels;

int64_t tide_attn_scratch_floats(int64_t nh, int64_t nk);
const tide_attn_kernels *tide_attn_kernels_get(void);
extern const tide_attn_kernels tide_attn_ref;
#if defined(__x86_64__)
extern const tide_attn_kernels tide_attn_avx2;
#endif

/* shared scalar pieces (kernels/attn.c) */
/* GPT-J rotation of 64 dims with a table row cs = [cos x32 | sin x32]. */
void tide_rope64(float *x, const float *cs, int inverse);
/* ceil(log2 x) for x > 0, exact from the bits */
int tide_ceil_log2f(float x);
/* fp8_ds_mla store of a 512-vector v (rope dims f32, rounded to bf16 here;
 * nope dims expected bf16-valued): data[576], sc[8]. flush: SWA rule. */
void tide_mla_store(uint8_t *data, uint8_t *sc, const float *v, int flush);
/* dequantise one stored token into 512 floats */
void tide_mla_load(float *out, const uint8_t *data, const uint8_t *sc);
/* fp8 with a power-of-two scale over n dims; returns the scale */
float tide_idx_quant(uint8_t *q8, const float *v, int64_t n);

#endif
