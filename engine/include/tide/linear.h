/* tide/linear.h - the one linear-layer interface, y[M,N] = x[M,K] . W[N,K]^T.
 * Part of tide.h; include tide.h, not this file.
 *
 * A tide_linear wraps a weight (and its scales) without copying it: views of
 * mmap'd checkpoint tensors stay zero-copy, and no dequantised copy of a
 * weight is ever kept (panels are decoded into per-thread stack buffers).
 * Backends (scalar reference, hand-written AVX2, oneDNN f32) sit behind the
 * same call.
 *
 * Batch invariance (docs/design.md section 1): with the default policy every
 * output y[m, n] is computed in one fixed order - eight lanes, lane = k mod 8,
 * k increasing, the weight dequantised exactly to f32, one fused multiply-add
 * per element, then one fixed horizontal sum - whatever M is, whichever rows
 * share the call, whichever path runs (M <= 8 streaming, large-M tiles,
 * grouped, forward_many) and however many threads run. So a row computed
 * alone is bitwise the same as inside any batch. The scalar reference
 * (TIDE_BACKEND_REF, TIDE_REF=1) accumulates in double instead: also
 * invariant, with different bits. oneDNN is not invariant: it runs only when
 * asked for (TIDE_BACKEND_DNNL) or under TIDE_LINEAR_FAST. */

typedef struct tide_linear tide_linear;   /* opaque */

/* Weight formats, inferred from the tensors given to tide_linear_new. */
typedef enum tide_wfmt {
  TIDE_W_F32 = 0,      /* w f32 [N,K] */
  TIDE_W_BF16 = 1,     /* w bf16 [N,K] */
  TIDE_W_F16 = 2,      /* w f16 [N,K] */
  TIDE_W_FP8 = 3,      /* w f8e4m3 [N,K] + scale e8m0 [ceil(N/128), ceil(K/128)] */
  TIDE_W_MXFP4 = 4     /* w i8/u8 [N,K/2] (e2m1 pairs, low nibble first) + scale e8m0 [N,K/32] */
} tide_wfmt;

typedef enum tide_backend {
  TIDE_BACKEND_AUTO = 0,
  TIDE_BACKEND_REF = 1,    /* scalar reference, double accumulation */
  TIDE_BACKEND_AVX2 = 2,   /* hand-written AVX2 kernels */
  TIDE_BACKEND_DNNL = 3    /* oneDNN f32 matmul (on dequantised panels) */
} tide_backend;

/* Wrap W (and scale, NULL for plain formats). The tensors are referenced, not
 * copied, and must not change while the handle lives (an FP8 handle records
 * which blocks hold NaN codes on first use); W must be contiguous. Errors
 * name the expected shapes. */
int tide_linear_new(tide_linear **out, const tide_tensor *w, const tide_tensor *scale);
void tide_linear_free(tide_linear *l);                        /* NULL-safe */
/* N (outputs), K (inputs) and the format (tide_wfmt). Any out-pointer may be NULL. */
int tide_linear_info(const tide_linear *l, int64_t *n, int64_t *k, int *fmt);
/* Bytes of weight (and scale) data one full pass reads (under the Q8
 * policy with an int8 copy: the copy's bytes). */
int64_t tide_linear_weight_bytes(const tide_linear *l);
/* The instruction set the invariant AUTO kernels use here: "avx512" (the
 * AVX-512 VBMI + GFNI variants of the M <= 8 FP8 and MXFP4 kernels, AVX2
 * for everything else), "avx2", or "ref" (the scalar reference: no AVX2,
 * or TIDE_REF=1). TIDE_NO_AVX512=1 in the environment keeps AVX-512 off.
 * All of them except "ref" give bitwise the same results. Static string. */
const char *tide_linear_isa(void);

/* y[M,N] = x[M,K] . W^T. x: f32 or bf16, rows contiguous (row stride may
 * exceed K). y: f32 or bf16 (rounded to nearest even), rows contiguous.
 * Fails with TIDE_E_UNSUPPORTED if `backend` cannot do this format. */
int tide_linear_forward(const tide_linear *l, tide_tensor *y, const tide_tensor *x, int backend);

/* y = x . w^T for plain tensors (w f32/bf16/f16 [N,K]) without keeping a
 * handle. */
int tide_matmul(tide_tensor *y, const tide_tensor *x, const tide_tensor *w, int backend);

/* ---- output flags, policy, grouped and batched forms ---- */

/* Flags of the _ex/_grouped/_many calls (bitwise or). The result is
 * v = x . W^T; with ACCUMULATE v = y_old + v (one f32 add); with ROUND_BF16
 * v is rounded to bf16 precision (nearest even) and stored as f32, as vLLM
 * rounds every GEMM output (doc 6.21). */
enum {
  TIDE_LINEAR_ROUND_BF16 = 1,
  TIDE_LINEAR_ACCUMULATE = 2
};

/* Policy of a handle. INVARIANT (the default): AUTO uses the invariant
 * kernels above. FAST: AUTO may use oneDNN f32 (on dequantised panels) for
 * large M where it measures faster; results then depend on M and on the
 * thread count. Q8 (opt-in, K a multiple of 32; other handles run as
 * INVARIANT): every row of x is rounded to int8 per block of 32 columns and
 * multiplied in integers with the e2m1 codes (MXFP4) or with an int8 copy
 * of the weight made when the policy is set (other formats: per 32-column
 * block, the same rule; N * K bytes + N * K / 8 of scales, freed when the
 * policy changes back). About 3x the exact kernels' speed on AVX2, other
 * numbers (docs/linear.md has the cost); still invariant to the batch, the
 * row range and the thread count. The explicit backends (REF, AVX2, DNNL)
 * ignore it. Setting Q8 may fail with TIDE_E_NOMEM. */
enum {
  TIDE_LINEAR_INVARIANT = 0,
  TIDE_LINEAR_FAST = 1,
  TIDE_LINEAR_Q8 = 2
};
/* Set the policy of l (not thread-safe against forwards on l running at the
 * same time). */
int tide_linear_set_policy(tide_linear *l, int policy);
int tide_linear_get_policy(const tide_linear *l);   /* -1 for NULL */

/* y = x . W^T with output flags, AUTO backend under the handle's policy.
 * x: f32 or bf16 [M, K] (or [K]), y: f32 or bf16 [M, N] (or [N]), rows
 * contiguous (row strides may exceed the row length). */
int tide_linear_forward_ex(const tide_linear *l, tide_tensor *y, const tide_tensor *x, int flags);

/* Grouped form (the grouped output projection wo_a): W is [G*n, k] (the
 * handle's N = G*n, K = k), x is f32 [M, G*k], y is f32 [M, G*n], and
 * y[:, g*n:(g+1)*n] = x[:, g*k:(g+1)*k] . W[g*n:(g+1)*n, :]^T for g < G.
 * n need not be a multiple of 128 for FP8 (scale blocks may straddle
 * groups). Bitwise equal to G separate handles on the row slices. x and y
 * rows contiguous; groups > 0 must divide N. The invariant kernels (or the
 * scalar reference under TIDE_REF), or the Q8 path under that policy;
 * never oneDNN. */
int tide_linear_forward_grouped(const tide_linear *l, tide_tensor *y, const tide_tensor *x, int64_t groups, int flags);

/* One independent product of tide_linear_forward_many: y[m, :] =
 * x[m, :] . W^T for m < rows, x rows of K floats at stride ldx >= K, y rows
 * of N floats at stride ldy >= N (floats). The memory is the caller's;
 * distinct jobs must not write overlapping y. */
typedef struct tide_linear_job {
  const tide_linear *l;
  const float *x;
  int64_t ldx;
  float *y;
  int64_t ldy;
  int64_t m;            /* rows of x and y; 0 skips the job */
} tide_linear_job;

/* Run n_jobs independent products in one parallel region (MoE: one job per
 * active expert on its gathered rows; two jobs on the same x fuse wq_a|wkv or
 * an expert's w1|w3). Work is balanced across threads by weight bytes times
 * rows; each job's result is bitwise what it gives alone. All jobs are
 * validated before any runs (a bad job is named by its index). Uses the
 * invariant kernels (or the scalar reference under TIDE_REF) whatever the
 * handles' policies. */
int tide_linear_forward_many(const tide_linear_job *jobs, int n_jobs, int flags);
