/* refmodel.h - internals of the golden reference model (refmodel.c). */
#ifndef TIDE_REFMODEL_H
#define TIDE_REFMODEL_H

#include "tide_internal.h"

typedef struct refm_cfg {
  int64_t vocab, hidden, max_pos;
  int n_layers, n_heads, q_lora, o_lora, o_groups, window;
  int ratios[256];           /* per main layer, 0/1 = SWA only */
  double rope_theta, compress_rope_theta;
  int yarn;                  /* rope_scaling present (type yarn) */
  double yarn_factor, yarn_original_max, yarn_beta_fast, yarn_beta_slow;
  int idx_heads, index_topk;
  int n_experts, topk, n_shared, inter, n_hash_layers;
  int scoring;               /* 0 sqrtsoftplus, 1 sigmoid, 2 softmax */
  int norm_topk;
  float routed_scale, swiglu_limit;
  int hc_mult, sinkhorn_iters;
  float hc_eps, eps;
  int has_mtp;               /* load the MTP block (mtp.0.*) as layer n_layers */
  int mtp_ratio;             /* its compress ratio (0/1 = SWA only) */
} refm_cfg;

/* a weight matrix in any checkpoint format */
typedef struct {
  tide_tensor w, s;
  int kind;
  int64_t n, k;
  float *f32;                /* the decoded matrix [n, k], made on first use while the budget lasts */
} refm_w;

typedef struct refm_layer {
  int ratio;
  tide_tensor attn_norm, ffn_norm, q_norm, kv_norm, sink;
  tide_tensor hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  refm_w wq_a, wq_b, wkv, wo_a, wo_b;
  refm_w c_wkv, c_wgate;
  tide_tensor c_ape, c_norm;
  refm_w i_wq_b, i_wproj, ic_wkv, ic_wgate;
  tide_tensor ic_ape, ic_norm;
  refm_w gate;
  tide_tensor gate_bias, tid2eid;
  refm_w *experts;           /* [E][w1, w2, w3] */
  int n_experts;
  refm_w sh_w1, sh_w2, sh_w3;
  /* dense state for one sequence */
  int64_t n_tok, n_ent;
  float *win; int64_t win_cap;   /* [tokens, 512] dequantised window KV */
  float *cst; int64_t cst_cap;   /* [tokens, 2*c*512] compressor rows */
  float *ist; int64_t ist_cap;   /* [tokens, 512] indexer compressor rows */
  float *ckv; int64_t ckv_cap;   /* [entries, 512] dequantised compressed KV */
  float *ik; int64_t ik_cap;     /* [entries, 128] indexer keys (fp8 values) */
  float *iks; int64_t iks_cap;   /* [entries] indexer key scales */
  /* decisions forced by a caller (replaying another implementation's choices) */
  int32_t *forced_topk; int64_t forced_cap;   /* [pos][1 + K]: count then ids; count < 0 = not forced */
  int32_t *forced_route; int64_t forced_rcap; /* [pos][k]; first < 0 = not forced */
  /* decisions of the last token this layer processed (for dumps and inspection) */
  int32_t *last_sel; int64_t last_sel_cap, last_nsel; /* C4: compressed entries attended, ascending */
  int32_t last_route[64]; float last_wts[64];          /* routed experts in slot order, their weights */
} refm_layer;

typedef int (*refm_getter)(void *ctx, const char *name, tide_tensor *out);

typedef struct refm {
  refm_cfg cfg;
  refm_getter get;
  void *ctx;
  tide_tensor embed, norm, hc_head_fn, hc_head_base, hc_head_scale;
  refm_w head;
  refm_layer *layers;        /* n_layers main blocks, then the MTP block when has_mtp */
  tide_tensor mtp_enorm, mtp_hnorm, mtp_norm, mtp_hc_fn, mtp_hc_base, mtp_hc_scale;
  refm_w mtp_e, mtp_h;
  float *Xmain;              /* [hc, d] main residual streams of the last token (before hc_head) */
  float freq_plain[32], freq_comp[32];
  int64_t len;
  /* scratch */
  float *scratch, *score, *hbuf, *X, *xold, *xin, *aout;
  double *dacc;
  int64_t *sel;
  int64_t last_nsel;
  int32_t last_route[64];
  float last_wts[64];
} refm;

int refm_new(refm **out, const refm_cfg *cfg, refm_getter get, void *ctx);
void refm_free(refm *m);
void refm_reset(refm *m);
/* Process the next token of the sequence (position m->len); logits [vocab] may be NULL. */
int refm_forward_token(refm *m, int64_t id, float *logits);
/* The MTP block (doc 2.4) for the next entry of its own sequence: Hin [hc, d]
 * the streams at that position (main model's, or the block's own output when
 * drafting), id the next token; logits [vocab] may be NULL; Hout [hc, d] the
 * block's output streams (may be NULL). */
int refm_mtp_token(refm *m, const float *Hin, int64_t id, float *logits, float *Hout);
/* One layer's attention / MoE for the token at position p (per-layer use). */
int refm_attn(refm *m, int layer, const float *x, int64_t p, float *out);
int refm_moe(refm *m, int layer, const float *x, int64_t id, int64_t p, float *out);
/* Force the decisions of layer L at position p (replaying another implementation's choices):
 * the n compressed entries attention uses (n < 0 clears), or the k routed experts (NULL clears). */
int refm_force_topk(refm *m, int layer, int64_t p, const int32_t *ids, int64_t n);
int refm_force_route(refm *m, int layer, int64_t p, const int32_t *ids);

#endif
