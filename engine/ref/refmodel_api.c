/* refmodel_api.c - the public face of the golden reference (tide/refmodel.h):
 * its config comes from the checkpoint's parsed config, its weights from the
 * checkpoint's tensor views. Everything numeric stays in refmodel.c. */
#include <stdio.h>
#include <string.h>

#include "ref/refmodel.h"

/* Holds no pointer to the checkpoint: the weights are tensor views that keep
 * their shard mappings alive, and the config is copied into refm_cfg, so the
 * checkpoint may be freed before or after the reference model. */
struct tide_refmodel {
  refm *m;
};

static int get_tensor(void *ctx, const char *name, tide_tensor *out) {
  return tide_ckpt_tensor((const tide_ckpt *)ctx, name, out);
}

int tide_refmodel_new(tide_refmodel **out, const tide_ckpt *ck) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = NULL;
  if (!ck) return TIDE_ERR(TIDE_E_INVALID, "NULL checkpoint");
  const tide_config *c = tide_ckpt_config(ck);
  if (!c) return TIDE_ERR(TIDE_E_INVALID, "the checkpoint has no config.json");
  if (c->num_hidden_layers > 256) return TIDE_ERR(TIDE_E_UNSUPPORTED, "reference: %d layers (at most 256)", c->num_hidden_layers);
  refm_cfg rc;
  memset(&rc, 0, sizeof rc);
  rc.vocab = c->vocab_size;
  rc.hidden = c->hidden_size;
  rc.max_pos = c->max_position_embeddings;
  rc.n_layers = c->num_hidden_layers;
  rc.n_heads = c->num_attention_heads;
  rc.q_lora = c->q_lora_rank;
  rc.o_lora = c->o_lora_rank;
  rc.o_groups = c->o_groups;
  rc.window = c->sliding_window;
  for (int L = 0; L < c->num_hidden_layers; L++) rc.ratios[L] = tide_config_layer_ratio(c, L);
  rc.rope_theta = c->rope_theta;
  rc.compress_rope_theta = c->compress_rope_theta;
  rc.yarn = c->rope_scaling ? 1 : 0;
  rc.yarn_factor = c->rope_factor;
  rc.yarn_original_max = c->rope_original_max_position_embeddings;
  rc.yarn_beta_fast = c->rope_beta_fast;
  rc.yarn_beta_slow = c->rope_beta_slow;
  rc.idx_heads = c->index_n_heads;
  rc.index_topk = c->index_topk;
  rc.n_experts = c->n_routed_experts;
  rc.topk = c->num_experts_per_tok;
  rc.n_shared = c->n_shared_experts;
  rc.inter = c->moe_intermediate_size;
  rc.n_hash_layers = c->num_hash_layers;
  rc.scoring = c->scoring;
  rc.norm_topk = c->norm_topk_prob ? 1 : 0;
  rc.routed_scale = (float)c->routed_scaling_factor;
  rc.swiglu_limit = (float)c->swiglu_limit;
  rc.hc_mult = c->hc_mult;
  rc.sinkhorn_iters = c->hc_sinkhorn_iters;
  rc.hc_eps = (float)c->hc_eps;
  rc.eps = (float)c->rms_norm_eps;
  /* the MTP block when the config has one and the checkpoint carries it */
  if (c->num_nextn_predict_layers >= 1 && tide_ckpt_find(ck, "mtp.0.e_proj.weight") >= 0) {
    rc.has_mtp = 1;
    rc.mtp_ratio = tide_config_layer_ratio(c, c->num_hidden_layers);
  }
  tide_refmodel *r = tide_xcalloc(1, sizeof *r);
  if (!r) return TIDE_E_NOMEM;
  int rc2 = refm_new(&r->m, &rc, get_tensor, (void *)ck);
  if (rc2 < 0) {
    tide_xfree(r);
    return rc2;
  }
  r->m->ctx = NULL;   /* the getter is not used after construction */
  *out = r;
  return TIDE_OK;
}

void tide_refmodel_free(tide_refmodel *r) {
  if (!r) return;
  refm_free(r->m);
  tide_xfree(r);
}

int tide_refmodel_reset(tide_refmodel *r) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  refm_reset(r->m);
  return TIDE_OK;
}

int64_t tide_refmodel_length(const tide_refmodel *r) { return r ? r->m->len : -1; }

static int vec_arg(const char *what, const tide_tensor *t, int64_t n, int writable) {
  if (!t || !t->data) return TIDE_ERR(TIDE_E_INVALID, "%s is NULL or empty", what);
  if (t->dtype != TIDE_F32 || tide_tensor_numel(t) != n || !tide_tensor_is_contiguous(t))
    return TIDE_ERR(TIDE_E_INVALID, "%s must be a contiguous f32 tensor of %lld elements", what, (long long)n);
  if (writable && t->readonly) return TIDE_ERR(TIDE_E_INVALID, "%s is read-only", what);
  return TIDE_OK;
}

int tide_refmodel_step(tide_refmodel *r, int64_t token, tide_tensor *logits) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  if (logits) TIDE_CHECK(vec_arg("logits", logits, r->m->cfg.vocab, 1));
  return refm_forward_token(r->m, token, logits ? (float *)logits->data : NULL);
}

int tide_refmodel_attn(tide_refmodel *r, int32_t layer, const tide_tensor *x, int64_t pos, tide_tensor *out) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  TIDE_CHECK(vec_arg("x", x, r->m->cfg.hidden, 0));
  TIDE_CHECK(vec_arg("out", out, r->m->cfg.hidden, 1));
  return refm_attn(r->m, layer, x->data, pos, out->data);
}

int tide_refmodel_moe(tide_refmodel *r, int32_t layer, const tide_tensor *x, int64_t token, int64_t pos,
                      tide_tensor *out) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  TIDE_CHECK(vec_arg("x", x, r->m->cfg.hidden, 0));
  TIDE_CHECK(vec_arg("out", out, r->m->cfg.hidden, 1));
  return refm_moe(r->m, layer, x->data, token, pos, out->data);
}

int tide_refmodel_force_topk(tide_refmodel *r, int32_t layer, int64_t pos, const int32_t *ids, int32_t n) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  if (n > 0 && !ids) return TIDE_ERR(TIDE_E_INVALID, "NULL ids");
  return refm_force_topk(r->m, layer, pos, ids, n);
}

int tide_refmodel_force_route(tide_refmodel *r, int32_t layer, int64_t pos, const int32_t *ids) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  return refm_force_route(r->m, layer, pos, ids);
}

int tide_refmodel_last_topk(const tide_refmodel *r, int32_t layer, int32_t *ids, int32_t cap) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  if (layer < 0 || layer >= r->m->cfg.n_layers) return TIDE_ERR(TIDE_E_RANGE, "layer %d out of range", layer);
  const refm_layer *l = &r->m->layers[layer];
  int64_t n = l->last_nsel;
  for (int64_t i = 0; i < n && i < cap; i++) ids[i] = l->last_sel[i];
  return (int)n;
}

int tide_refmodel_last_route(const tide_refmodel *r, int32_t layer, int32_t *ids, float *weights) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  if (layer < 0 || layer >= r->m->cfg.n_layers) return TIDE_ERR(TIDE_E_RANGE, "layer %d out of range", layer);
  const refm_layer *l = &r->m->layers[layer];
  int k = r->m->cfg.topk;
  for (int i = 0; i < k; i++) {
    if (ids) ids[i] = l->last_route[i];
    if (weights) weights[i] = l->last_wts[i];
  }
  return k;
}

int tide_refmodel_hidden(const tide_refmodel *r, tide_tensor *out) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  if (!r->m->cfg.has_mtp) return TIDE_ERR(TIDE_E_STATE, "reference: the checkpoint has no MTP block");
  TIDE_CHECK(vec_arg("out", out, (int64_t)r->m->cfg.hc_mult * r->m->cfg.hidden, 1));
  memcpy(out->data, r->m->Xmain, (size_t)tide_tensor_numel(out) * sizeof(float));
  return TIDE_OK;
}

int tide_refmodel_mtp(tide_refmodel *r, const tide_tensor *hidden, int64_t token, tide_tensor *logits,
                      tide_tensor *hidden_out) {
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "NULL reference model");
  int64_t n = (int64_t)r->m->cfg.hc_mult * r->m->cfg.hidden;
  TIDE_CHECK(vec_arg("hidden", hidden, n, 0));
  if (logits) TIDE_CHECK(vec_arg("logits", logits, r->m->cfg.vocab, 1));
  if (hidden_out) TIDE_CHECK(vec_arg("hidden_out", hidden_out, n, 1));
  return refm_mtp_token(r->m, hidden->data, token, logits ? (float *)logits->data : NULL,
                        hidden_out ? (float *)hidden_out->data : NULL);
}
