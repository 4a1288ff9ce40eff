/* tide/linear.h - the one linear-layer interface, y[M,N] = x[M,K] . W[N,K]^T.
 * Part of tide.h; include tide.h, not this file.
 *
 * A tide_linear wraps a weight (and its scales) without copying it: views of
 * mmap'd checkpoint tensors stay zero-copy. Backends (scalar reference,
 * hand-written AVX2, oneDNN f32) sit behind the same call; AUTO picks per
 * shape whichever is fastest for that format. */

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
 * copied; W must be contiguous. Errors name the expected shapes. */
int tide_linear_new(tide_linear **out, const tide_tensor *w, const tide_tensor *scale);
void tide_linear_free(tide_linear *l);                        /* NULL-safe */
/* N (outputs), K (inputs) and the format (tide_wfmt). Any out-pointer may be NULL. */
int tide_linear_info(const tide_linear *l, int64_t *n, int64_t *k, int *fmt);
/* Bytes of weight (and scale) data one full pass reads. */
int64_t tide_linear_weight_bytes(const tide_linear *l);

/* y[M,N] = x[M,K] . W^T. x: f32 or bf16, rows contiguous (row stride may
 * exceed K). y: f32 or bf16 (rounded to nearest even), rows contiguous.
 * Fails with TIDE_E_UNSUPPORTED if `backend` cannot do this format. */
int tide_linear_forward(const tide_linear *l, tide_tensor *y, const tide_tensor *x, int backend);

/* y = x . w^T for plain tensors (w f32/bf16/f16 [N,K]) without keeping a
 * handle. */
int tide_matmul(tide_tensor *y, const tide_tensor *x, const tide_tensor *w, int backend);
