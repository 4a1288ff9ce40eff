/* tide/ops.h - model-level ops: RMSNorm, embedding, mHC, MoE routing and experts.
 * Part of tide.h; include tide.h, not this file.
 *
 * Conventions of this section (doc deepseek-v4.md 2.0-2.3):
 *  - Activations are f32 tensors holding bf16-valued numbers; a kernel that
 *    ends where vLLM's CPU path rounds to bf16 rounds its f32 output in place
 *    when TIDE_OPS_ROUND_BF16 is in `flags` (round to nearest even).
 *  - "[T, n] rows": a 1-d [n] tensor (one row) or an [.., n] tensor whose
 *    last dim is contiguous and whose leading dims form rows at one stride
 *    (row padding allowed). Outputs are written, never allocated.
 *  - Every token (row) is computed independently in a fixed order, so results
 *    are bitwise the same whatever the thread count and whatever other tokens
 *    share the call (docs/design.md section 1).
 *  - AVX2 variants are used when the CPU has them; TIDE_REF=1 (or
 *    tide_kernels_force_ref(1)) selects the scalar references instead.
 *  - On error nothing is written and the message names the value. */

enum {
  TIDE_OPS_ROUND_BF16 = 1   /* round the kernel's f32 output to bf16 precision */
};

/* out = x / sqrt(mean(x^2) + eps) * w over the last dim (n), row by row.
 * x, out: f32 [T, n] rows of the same shape; out may be x (in place).
 * w: bf16 or f32 [n], or NULL for the weight-free norm. The mean of squares
 * is accumulated in double; the product is (x * r) * w in f32. */
int tide_rmsnorm(tide_tensor *out, const tide_tensor *x, const tide_tensor *w, float eps, int flags);

/* Round every element of an f32 tensor (any shape and strides) to bf16
 * precision in place, nearest even; NaN stays NaN. */
int tide_ops_round_bf16(tide_tensor *t);

/* Embedding gather: out row t = table[ids[t]] as f32.
 * table: bf16 or f32 [vocab, d] (rows contiguous, row stride allowed).
 * ids: i32 or i64 [T] (contiguous). out: f32 [T, d] rows, or [T, hc, d]
 * (every one of the hc streams gets a copy of the row, as the residual
 * stream of mHC starts; doc 2.0). Every id is checked before anything is
 * written: an id outside 0..vocab-1 fails with TIDE_E_RANGE naming the id,
 * its position and the vocabulary size. */
int tide_embed(tide_tensor *out, const tide_tensor *table, const tide_tensor *ids);

/* Constants of the mHC kernels (config hc_sinkhorn_iters, rms_norm_eps,
 * hc_eps). `flags` TIDE_OPS_ROUND_BF16 rounds the layer input x (hc_pre) or
 * the head output y (hc_head); vLLM rounds both. */
typedef struct tide_hc_cfg {
  int32_t iters;        /* Sinkhorn iterations, >= 1 (20); unused by hc_head */
  int32_t flags;        /* TIDE_OPS_ROUND_BF16 */
  float rms_eps;        /* 1e-6 */
  float hc_eps;         /* 1e-6 */
} tide_hc_cfg;

/* mHC before a sub-layer (doc 2.1), per token t with z = X[t] flattened:
 *   rho = 1/sqrt(mean(z^2) + rms_eps) (double), m = rho * (fn . z) (the
 *   [mix, hc*d] x [hc*d] product in f32, 8-lane partial sums in k order),
 *   pre_i = sigmoid(scale0*m_i + base_i) + hc_eps,
 *   post_i = 2*sigmoid(scale1*m_{hc+i} + base_{hc+i}),
 *   comb = Sinkhorn(scale2*m_{2hc+i*hc+j} + base_{2hc+i*hc+j}): a row
 *   softmax + hc_eps, a column normalisation, then (iters-1) x (row, column)
 *   normalisations with hc_eps in the denominators (double precision);
 *   x = sum_i pre_i * X_i (f32, in stream order).
 * X: f32 [T, hc, d], each token's hc*d values contiguous (token stride may be
 * larger); 2 <= hc <= 8. fn: f32 [mix, hc*d] contiguous, mix = (2+hc)*hc.
 * scale: f32 [3]. base: f32 [mix]. Outputs: x f32 [T, d] rows; post f32
 * [T, hc] and comb f32 [T, hc, hc] (comb[i][j]: source stream i ->
 * destination j), both contiguous. */
int tide_hc_pre(tide_tensor *x, tide_tensor *post, tide_tensor *comb, const tide_tensor *X, const tide_tensor *fn,
                const tide_tensor *scale, const tide_tensor *base, const tide_hc_cfg *cfg);

/* mHC after a sub-layer: out_j = post_j * a + sum_i comb[i][j] * X_i for
 * j = 0..hc-1, accumulated in f32 in that order (post first, then i = 0..).
 * a: f32 [T, d] rows (the sub-layer output). X, out: f32 [T, hc, d] with
 * contiguous streams (stream stride d); out may be X itself (in place) but
 * must not partially overlap it. post: f32 [T, hc], comb: f32 [T, hc, hc]
 * contiguous, as hc_pre wrote them. flags: TIDE_OPS_ROUND_BF16 (vLLM stores
 * the residual streams in bf16). */
int tide_hc_post(tide_tensor *out, const tide_tensor *a, const tide_tensor *X, const tide_tensor *post,
                 const tide_tensor *comb, int flags);

/* mHC head (before the final norm): g_i = sigmoid(scale0 * rho * (fn_i . z)
 * + base_i) + hc_eps, y = sum_i g_i * X_i. X: f32 [T, hc, d] as in hc_pre;
 * fn: f32 [hc, hc*d]; scale: f32 [1]; base: f32 [hc]; y: f32 [T, d] rows.
 * cfg->iters is ignored. */
int tide_hc_head(tide_tensor *y, const tide_tensor *X, const tide_tensor *fn, const tide_tensor *scale,
                 const tide_tensor *base, const tide_hc_cfg *cfg);

/* Expert scoring functions (config scoring_func). */
enum {
  TIDE_SCORE_SQRTSOFTPLUS = 0,   /* s = sqrt(log(1 + e^l)); l > 20 uses s = sqrt(l) */
  TIDE_SCORE_SIGMOID = 1,        /* s = 1 / (1 + e^-l) */
  TIDE_SCORE_SOFTMAX = 2         /* s = softmax over the E logits of the token */
};

/* Routing constants (config scoring_func, norm_topk_prob,
 * routed_scaling_factor). */
typedef struct tide_route_cfg {
  int32_t scoring;          /* TIDE_SCORE_* */
  int32_t norm_topk;        /* 1: weights renormalised over the k selected */
  float routed_scale;       /* multiplies every weight (1.5 Flash, 2.5 Pro) */
  int32_t reserved;         /* 0 */
} tide_route_cfg;

/* MoE routing by score + bias (noaux_tc, no groups), per token:
 * s_e = score(logits[t, e]) (double, stored f32), then the k experts with
 * the largest s_e + bias_e are selected in descending order of that biased
 * score, equal values going to the smaller expert index (NaN never wins);
 * w_i = s_{e_i} / sum_i' s_{e_i'} (if norm_topk) * routed_scale.
 * logits: f32 [T, E] rows (x . gate.weight^T from the caller, not rounded).
 * bias: f32 [E] or NULL (plain top-k of the scores). Outputs: ids i32
 * [T, k] and weights f32 [T, k], contiguous, 1 <= k <= min(E, 64); slot i of
 * a token holds its i-th pick. */
int tide_route_topk(tide_tensor *ids, tide_tensor *weights, const tide_tensor *logits, const tide_tensor *bias,
                    const tide_route_cfg *cfg);

/* MoE routing of a hash layer: the experts of token t are tid2eid[tokens[t]]
 * in that row's order; weights as for tide_route_topk from the scores of the
 * token's own logits. tokens: i32 or i64 [T] (the token's input ids);
 * tid2eid: i32 or i64 [vocab, k] contiguous. Checked before anything is
 * written: a token id outside 0..vocab-1 fails with TIDE_E_RANGE, an expert
 * id in tid2eid outside 0..E-1 with TIDE_E_FORMAT, both naming the values. */
int tide_route_hash(tide_tensor *ids, tide_tensor *weights, const tide_tensor *logits, const tide_tensor *tokens,
                    const tide_tensor *tid2eid, const tide_route_cfg *cfg);

/* SwiGLU with the swiglu_limit clamps (doc 6.17): h = silu(min(g, L)) *
 * min(max(u, -L), L), the gate clamped above only, the up projection both
 * ways; silu(v) = v / (1 + e^-v). gate, up, out: f32 [T, n] rows of one
 * shape (gate and up may be the two halves of one fused [T, 2n] tensor);
 * out may be gate or up. limit > 0 (INFINITY: no clamp). */
int tide_swiglu(tide_tensor *out, const tide_tensor *gate, const tide_tensor *up, float limit, int flags);

/* ---- the MoE block ----
 * A tide_moe holds E routed experts and an optional shared expert, each
 * three linear layers (w1 = gate, w3 = up: [inter, d]; w2 = down: [d, inter])
 * in any tide_linear format (real checkpoints: MXFP4 routed experts, FP8
 * shared expert; the bf16 variant: bf16). Weights are referenced, not
 * copied. A step groups its (token, slot) rows by expert, so each active
 * expert's weights are read once per step. */
typedef struct tide_moe tide_moe;   /* opaque */

/* A MoE block of n_experts (>= 1) routed experts of width inter for hidden
 * size dim; swiglu_limit > 0 (INFINITY: no clamp). Experts are set next. */
int tide_moe_new(tide_moe **out, int32_t n_experts, int64_t dim, int64_t inter, float swiglu_limit);
void tide_moe_free(tide_moe *m);   /* NULL-safe */

/* Set (or replace) routed expert e: w1, w3 [inter, dim], w2 [dim, inter] as
 * tide_linear_new takes them (scale NULL for f32/bf16/f16 weights). The
 * tensors are referenced (kept alive by the block). On error expert e is
 * unchanged. */
int tide_moe_set_expert(tide_moe *m, int32_t e, const tide_tensor *w1, const tide_tensor *s1, const tide_tensor *w2,
                        const tide_tensor *s2, const tide_tensor *w3, const tide_tensor *s3);
/* Linear policies (TIDE_LINEAR_INVARIANT, _FAST, _Q8; linear.h): `routed`
 * for every routed expert (those set later included), `shared` for the
 * shared expert as set now. Q8 on a non-MXFP4 weight makes an int8 copy and
 * may fail with TIDE_E_NOMEM (nothing changed then). Not thread-safe against
 * a forward on m. */
int tide_moe_set_policy(tide_moe *m, int routed, int shared);
/* Set the shared expert (weight 1, not scaled): w1, w3 [sinter, dim],
 * w2 [dim, sinter]; sinter is read from w1 (n_shared * inter). */
int tide_moe_set_shared(tide_moe *m, const tide_tensor *w1, const tide_tensor *s1, const tide_tensor *w2,
                        const tide_tensor *s2, const tide_tensor *w3, const tide_tensor *s3);

/* out[t] = sum_{i=0..k-1} weights[t,i] * E_{ids[t,i]}(x[t]) + S(x[t]) where
 * E(x) = w2 . swiglu(w1 . x, w3 . x): the products are rounded to bf16, as is
 * the SwiGLU; the sum runs in f32 in slot order i = 0..k-1, then the shared
 * expert S (if set), and is rounded when flags has TIDE_OPS_ROUND_BF16. The
 * fixed per-token order makes a token's output independent of the grouping,
 * of the other tokens in the step and of the thread count (bitwise).
 * x, out: f32 [T, dim] rows; out may be x. ids: i32 [T, k] (0 <= id < E,
 * checked first: TIDE_E_RANGE names the token, slot and id), weights: f32
 * [T, k], both contiguous. Every expert some token selects must have been
 * set (TIDE_E_STATE otherwise). Scratch is owned by the block and only
 * grows; a step allocates nothing once it has seen its largest T * k. A
 * block runs one step at a time (not thread-safe). */
int tide_moe_forward(tide_moe *m, tide_tensor *out, const tide_tensor *x, const tide_tensor *ids,
                     const tide_tensor *weights, int flags);

/* What the last step did, for benchmarks and inspection. Times are seconds
 * of wall clock in each phase. */
typedef struct tide_moe_stats {
  int64_t tokens;           /* T */
  int64_t rows;             /* routed (token, slot) rows, T * k */
  int32_t n_active;         /* routed experts with at least one row */
  int32_t max_rows;         /* rows of the busiest expert */
  int64_t weight_bytes;     /* bytes of expert weights (and scales) the step read: active + shared */
  int64_t scratch_bytes;    /* scratch the block holds now */
  double t_gather;          /* grouping tokens by expert, gathering rows */
  double t_up;              /* w1 and w3 products (routed and shared) */
  double t_act;             /* SwiGLU */
  double t_down;            /* w2 products */
  double t_combine;         /* weighted per-token sums */
  double t_total;           /* the whole call */
} tide_moe_stats;
int tide_moe_stats_get(const tide_moe *m, tide_moe_stats *out);

/* Rows per routed expert in the last step: counts[e] for e < min(n, E). */
int tide_moe_expert_rows(const tide_moe *m, int32_t *counts, int32_t n);

/* The pieces of tide_moe_forward, for expert parallelism (several processes
 * each holding some of the experts, engine/mpi/):
 * tide_moe_rows: y[r] = E_{ids[r]}(x[r]) for n rows of dim floats (x, y
 *   contiguous [n, dim]); every id must be an expert this block holds
 *   (TIDE_E_STATE otherwise). Bitwise the routed rows tide_moe_forward uses.
 * tide_moe_shared_rows: y [T, dim] = S(x) for x rows with stride ldx.
 * tide_moe_combine_rows: one token's slot-order sum (the combine of
 *   tide_moe_forward): out = sum_i w[i] * ys[i] (+ shared), rounded per flags. */
int tide_moe_rows(tide_moe *m, float *y, const float *x, const int32_t *ids, int64_t n);
int tide_moe_shared_rows(tide_moe *m, float *y, const float *x, int64_t ldx, int64_t T);
void tide_moe_combine_rows(float *out, const float *const *ys, const float *w, int k, const float *shared, int64_t d,
                           int flags);

/* The block's shape; any out-pointer may be NULL. sinter is 0 while no
 * shared expert is set; n_set counts the routed experts set so far. */
int tide_moe_info(const tide_moe *m, int32_t *n_experts, int64_t *dim, int64_t *inter, int64_t *sinter,
                  int32_t *n_set);
