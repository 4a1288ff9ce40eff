/* tide/refmodel.h - the golden reference model: the whole DeepSeek-V4 forward
 * pass in straightforward scalar C, one token at a time, sharing no code with
 * the fast path (engine/ref/refmodel.c). Tests compare the fast path with it;
 * `model:use_reference()` switches layers (or the whole model) to it so a user
 * can measure the fast path's error on their own prompt. It is slow by design.
 * Part of tide.h; include tide.h, not this file.
 *
 * One tide_refmodel follows one sequence (dense, unpaged state) from position
 * 0: tokens are fed in order. */

typedef struct tide_refmodel tide_refmodel;   /* opaque */

/* A reference model over the weights of an open checkpoint (views are kept;
 * the checkpoint handle may be freed afterwards). Fails with the checkpoint's
 * missing tensor or an unsupported config, naming it. */
int tide_refmodel_new(tide_refmodel **out, const tide_ckpt *ck);
void tide_refmodel_free(tide_refmodel *r);                /* NULL-safe */
/* Forget the sequence (length 0); forced decisions are kept. */
int tide_refmodel_reset(tide_refmodel *r);
/* Tokens processed so far (the next token's position). */
int64_t tide_refmodel_length(const tide_refmodel *r);

/* Process the next token of the sequence (at position tide_refmodel_length):
 * logits f32 [vocab] (contiguous) or NULL. TIDE_E_RANGE for a token id
 * outside the vocabulary or a position past max_position_embeddings (nothing
 * changes). */
int tide_refmodel_step(tide_refmodel *r, int64_t token, tide_tensor *logits);

/* The MTP block (doc 2.4; checkpoints with mtp.0.*, else TIDE_E_STATE).
 * tide_refmodel_hidden: the main model's residual streams [hc, d] (f32,
 * before its hc_head) of the last token tide_refmodel_step processed.
 * tide_refmodel_mtp: the block at the next position of its own dense state
 * (from 0, one per call) on the streams `hidden` [hc, d] and the next token;
 * logits [vocab] and hidden_out [hc, d] (its output streams, for drafting
 * recursively) may be NULL. */
int tide_refmodel_hidden(const tide_refmodel *r, tide_tensor *out);
int tide_refmodel_mtp(tide_refmodel *r, const tide_tensor *hidden, int64_t token, tide_tensor *logits,
                      tide_tensor *hidden_out);

/* One layer alone, for per-layer reference switching: the attention (or MoE)
 * sub-layer of `layer` for the token at position pos, on the sub-layer input x
 * f32 [d] (after its RMSNorm) -> out f32 [d]. The attention keeps its own
 * dense cache, so a layer's positions must be fed in order from 0 (error
 * otherwise). `token` is the input id (hash-routed MoE layers use it). */
int tide_refmodel_attn(tide_refmodel *r, int32_t layer, const tide_tensor *x, int64_t pos, tide_tensor *out);
int tide_refmodel_moe(tide_refmodel *r, int32_t layer, const tide_tensor *x, int64_t token, int64_t pos,
                      tide_tensor *out);

/* Replay another implementation's discrete decisions (doc section 8: near-ties
 * legitimately differ). Force the compressed entries a ratio-4 layer attends
 * to at position pos (ids [n], each visible at pos; n < 0 clears), or the k
 * routed experts of a layer at pos (ids [k]; NULL clears). */
int tide_refmodel_force_topk(tide_refmodel *r, int32_t layer, int64_t pos, const int32_t *ids, int32_t n);
int tide_refmodel_force_route(tide_refmodel *r, int32_t layer, int64_t pos, const int32_t *ids);

/* Decisions of the last token a layer processed: the compressed entries a
 * ratio-4 layer attended (ascending; returns their count, writes at most cap),
 * and the routed experts in slot order with their weights (k of each; weights
 * may be NULL; returns k). */
int tide_refmodel_last_topk(const tide_refmodel *r, int32_t layer, int32_t *ids, int32_t cap);
int tide_refmodel_last_route(const tide_refmodel *r, int32_t layer, int32_t *ids, float *weights);
