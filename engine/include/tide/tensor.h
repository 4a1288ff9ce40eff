/* tide/tensor.h - dtypes, storages and strided tensors (up to 4 dims).
 * Part of tide.h; include tide.h, not this file.
 *
 * A tide_tensor is a small header (shape, strides, data pointer) that holds
 * one counted reference to a storage. Headers are plain values: the caller
 * provides the memory (a local, a struct field, or LuaJIT's ffi.new), C fills
 * it, and tide_tensor_release() drops the storage reference. C code never
 * keeps a pointer to a caller's header; it copies it with tide_tensor_ref().
 * This keeps field access from Lua free (no call per t:shape()). */

typedef enum tide_dtype {
  TIDE_F32 = 0,
  TIDE_BF16 = 1,
  TIDE_F16 = 2,
  TIDE_F8E4M3 = 3,   /* float8_e4m3fn: bias 7, max 448, no inf, 0x7F/0xFF NaN */
  TIDE_E8M0 = 4,     /* unsigned exponent byte b = 2^(b-127), 0xFF NaN */
  TIDE_FP4 = 5,      /* e2m1, two per byte, element 2m in the low nibble */
  TIDE_I8 = 6,
  TIDE_U8 = 7,
  TIDE_I32 = 8,
  TIDE_I64 = 9,
  TIDE_NDTYPES = 10
} tide_dtype;

enum { TIDE_MAXDIM = 4 };

typedef enum tide_storage_kind {
  TIDE_STORAGE_OWNED = 0,    /* 64-byte aligned heap memory tide frees */
  TIDE_STORAGE_MMAP = 1,     /* read-only mapping of a file */
  TIDE_STORAGE_BORROWED = 2  /* someone else's memory; keeps `owner` alive */
} tide_storage_kind;

typedef struct tide_storage tide_storage;   /* opaque, reference counted */

typedef struct tide_tensor {
  void *data;              /* byte address of element (0,...,0) */
  tide_storage *storage;   /* one counted reference; NULL = empty header */
  int64_t sizes[4];        /* shape; dims >= ndim are 1 */
  int64_t strides[4];      /* in elements; dims >= ndim are 0 */
  int32_t ndim;            /* 0..4; 0 = scalar (one element) */
  int32_t dtype;           /* tide_dtype */
  int32_t nib;             /* fp4 only: 1 if element 0 is the high nibble */
  int32_t readonly;        /* 1 for views of read-only (mmap'd) storage */
} tide_tensor;

/* ---- dtypes ---- */
/* Name ("f32", "bf16", "f16", "f8e4m3", "e8m0", "fp4", "i8", "u8", "i32",
 * "i64"); "?" for a bad value. Static storage. */
const char *tide_dtype_name(int dtype);
/* Parse a dtype name (also accepts safetensors names "F32", "BF16", "F8_E4M3",
 * "F8_E8M0", "I8", ...). Returns the dtype or -1. */
int tide_dtype_from_name(const char *name);
/* Bits per element: 32, 16, 8 or 4. 0 for a bad dtype. */
int tide_dtype_bits(int dtype);
/* 1 for floating dtypes (f32 bf16 f16 f8e4m3 e8m0 fp4). */
int tide_dtype_is_float(int dtype);

/* ---- scalar conversions (reference semantics, exported for tests) ---- */
/* Round-to-nearest-even; NaN stays NaN (quiet); overflow to inf for bf16/f16. */
uint16_t tide_f32_to_bf16(float x);
float tide_bf16_to_f32(uint16_t h);
uint16_t tide_f32_to_f16(float x);
float tide_f16_to_f32(uint16_t h);
/* e4m3fn: RNE; finite values beyond +-448 and +-inf saturate to +-448; NaN ->
 * 0x7F (sign kept). Decoding 0x7F/0xFF gives NaN. */
uint8_t tide_f32_to_f8e4m3(float x);
float tide_f8e4m3_to_f32(uint8_t b);
/* e8m0: a pure power of two. Encoding rounds up to the next power of two
 * (so a scale never shrinks); x <= 2^-127 (incl. 0) -> 0x00; NaN, inf,
 * negative and x > 2^127 -> 0xFF (NaN). */
uint8_t tide_f32_to_e8m0(float x);
float tide_e8m0_to_f32(uint8_t b);
/* e2m1 code (0..15): RNE onto {0,.5,1,1.5,2,3,4,6}, saturating at 6; NaN -> 0. */
uint8_t tide_f32_to_fp4(float x);
float tide_fp4_to_f32(uint8_t code);

/* Convert n contiguous elements between dtypes (any pair of the float and
 * integer dtypes; fp4 needs even n). Uses the AVX2 paths when available. */
int tide_convert(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n);

/* ---- storages ---- */
/* A read-only mapping of a whole file. *out holds one reference. */
int tide_storage_mmap(tide_storage **out, const char *path);
/* Owned, 64-byte aligned, zero-filled memory of `bytes` bytes. */
int tide_storage_new(tide_storage **out, int64_t bytes);
/* Borrowed memory: `data` stays valid as long as `owner` lives (owner may be
 * NULL when the caller guarantees the lifetime, e.g. a Lua-held buffer). */
int tide_storage_borrow(tide_storage **out, void *data, int64_t bytes, int readonly,
                        tide_storage *owner);
void tide_storage_retain(tide_storage *s);
void tide_storage_release(tide_storage *s);         /* NULL-safe */
void *tide_storage_data(const tide_storage *s);
int64_t tide_storage_bytes(const tide_storage *s);
int tide_storage_kind_of(const tide_storage *s);     /* tide_storage_kind */
/* For mmap storages the file path, else "". Valid while s lives. */
const char *tide_storage_path(const tide_storage *s);

/* ---- creating and releasing tensors ---- */
/* A new owned, zero-filled, contiguous tensor. shape may be NULL if ndim = 0. */
int tide_tensor_new(tide_tensor *out, int dtype, int ndim, const int64_t *shape);
/* A contiguous view of `st` at byte offset `offset` (takes a new reference).
 * The byte range must lie inside the storage. */
int tide_tensor_from_storage(tide_tensor *out, tide_storage *st, int64_t offset,
                             int dtype, int ndim, const int64_t *shape);
/* A tensor over caller memory with explicit strides (NULL = contiguous); the
 * memory must outlive the tensor (owner may be NULL, see tide_storage_borrow). */
int tide_tensor_wrap(tide_tensor *out, void *data, int dtype, int ndim, const int64_t *shape,
                     const int64_t *stride, tide_storage *owner);
/* Drop the storage reference and clear the header. NULL-safe, idempotent. */
void tide_tensor_release(tide_tensor *t);
/* dst = a new reference to the same view as src (dst's old content is
 * released first). */
int tide_tensor_ref(tide_tensor *dst, const tide_tensor *src);

/* ---- queries ---- */
int64_t tide_tensor_numel(const tide_tensor *t);
int tide_tensor_is_contiguous(const tide_tensor *t);
/* Bytes spanned by a contiguous tensor (numel * bits / 8, rounded up). */
int64_t tide_tensor_nbytes(const tide_tensor *t);
/* Element at idx[0..ndim-1] as a double (any dtype). */
int tide_tensor_get(const tide_tensor *t, const int64_t *idx, double *out);
int tide_tensor_set(tide_tensor *t, const int64_t *idx, double v);

/* ---- views (no copy; out takes a new reference; out may alias src) ---- */
int tide_tensor_narrow(tide_tensor *out, const tide_tensor *src, int dim, int64_t start,
                       int64_t len);
int tide_tensor_select(tide_tensor *out, const tide_tensor *src, int dim, int64_t index);
int tide_tensor_transpose(tide_tensor *out, const tide_tensor *src, int d0, int d1);
/* Reshape a contiguous tensor; one size may be -1 (inferred). */
int tide_tensor_reshape(tide_tensor *out, const tide_tensor *src, int ndim,
                        const int64_t *shape);
/* Reinterpret the bytes of a contiguous tensor as another dtype; the last
 * dim is rescaled by the size ratio and must divide evenly. */
int tide_tensor_view_dtype(tide_tensor *out, const tide_tensor *src, int dtype);

/* ---- data ---- */
/* dst <- src elementwise, same shape, any strides, converting dtypes
 * (float->int truncates toward zero with saturation; see the scalar
 * conversions above for floats). dst must be writable. */
int tide_tensor_copy(tide_tensor *dst, const tide_tensor *src);
/* A new contiguous tensor of `dtype` holding src's values. */
int tide_tensor_clone(tide_tensor *out, const tide_tensor *src, int dtype);
int tide_tensor_fill(tide_tensor *t, double v);

enum { TIDE_RAND_UNIFORM = 0, TIDE_RAND_NORMAL = 1 };
/* Fill with seeded random numbers: uniform in [a, b) or normal(mean a, std b).
 * Element i (in logical row-major order) depends only on (seed, i), so the
 * result is the same across runs and thread counts. */
int tide_tensor_rand(tide_tensor *t, uint64_t seed, int dist, double a, double b);

/* ---- comparisons for tests ---- */
typedef struct tide_compare {
  double max_abs;          /* max |a - b| */
  double max_rel;          /* max |a - b| / max(|b|, tiny) */
  double nmse;             /* sum (a-b)^2 / sum b^2 (b = reference) */
  double cosine;           /* a.b / (|a||b|) */
  double max_ulp;          /* max distance in units in the last place of a's dtype */
  int64_t n_bad;           /* elements failing |a-b| <= atol + rtol*|b| */
  int64_t first_bad;       /* row-major index of the first failure, -1 if none */
  int64_t n_nan_mismatch;  /* positions where exactly one side is NaN */
} tide_compare;
/* Compare a (tested) against b (reference), same shape, any dtypes. */
int tide_tensor_compare(const tide_tensor *a, const tide_tensor *b, double rtol, double atol,
                        tide_compare *out);

/* ---- small ops over the last dim (f32/bf16/f16 inputs, any batch dims) ---- */
/* out[..] = index of the max along the last dim (i64 tensor of src's shape
 * minus the last dim); ties go to the smaller index; NaN is ignored. */
int tide_tensor_argmax(tide_tensor *out, const tide_tensor *src);
/* values/indices [.., k] (f32 / i64) of the k largest along the last dim,
 * in descending order, ties to the smaller index. */
int tide_tensor_topk(tide_tensor *values, tide_tensor *indices, const tide_tensor *src,
                     int64_t k);
/* out = softmax(src) along the last dim, in f32 accumulate, out may be src. */
int tide_tensor_softmax(tide_tensor *out, const tide_tensor *src);

enum { TIDE_OP_ADD = 0, TIDE_OP_SUB = 1, TIDE_OP_MUL = 2, TIDE_OP_DIV = 3 };
/* out = a (op) b elementwise, same shapes (b may also be a one-element
 * tensor), computed in f32 and stored in out's dtype. out may alias a or b. */
int tide_tensor_binary(tide_tensor *out, const tide_tensor *a, const tide_tensor *b, int op);
/* out = a * alpha + beta elementwise. */
int tide_tensor_affine(tide_tensor *out, const tide_tensor *a, double alpha, double beta);
/* Sum of all elements in double. */
int tide_tensor_sum(const tide_tensor *t, double *out);
