/* tide/checkpoint.h - checkpoints as DeepSeek publishes them (a directory
 * with config.json and safetensors shards), the model config, the
 * safetensors writer, and the helpers the checkpoint generator uses.
 * Part of tide.h; include tide.h, not this file.
 *
 * Boundary: a tide_ckpt is the opened checkpoint: parsed headers, one
 * read-only mapping per shard, and the parsed config. Tensors are zero-copy
 * views into the mappings; nothing is read from the data sections until a
 * caller touches a view (or calls tide_ckpt_prefault). The model loader
 * builds on this; nothing here knows about kernels. docs/checkpoint.md
 * describes the format decisions (what the parser accepts and rejects). */

/* ---- the model config (config.json, Hugging Face field names) ----
 * tide_config_parse fills every field: from the file when present, else the
 * default of DeepSeek's reference (inference/model.py ModelArgs, i.e. the
 * Flash values), except quantization: no quantization_config means
 * unquantised weights, as in the Hugging Face convention. Strings are
 * NUL-terminated; "" when absent and without a default. */
typedef enum tide_scoring {
  TIDE_SCORING_SQRTSOFTPLUS = 0,   /* s = sqrt(softplus(logit)) */
  TIDE_SCORING_SIGMOID = 1,
  TIDE_SCORING_SOFTMAX = 2
} tide_scoring;

/* The storage format of a family of matrices. */
typedef enum tide_weight_format {
  TIDE_FMT_BF16 = 0,   /* BF16 [out, in] */
  TIDE_FMT_FP8 = 1,    /* F8_E4M3 [out, in] + F8_E8M0 .scale [ceil(out/128), ceil(in/128)] */
  TIDE_FMT_FP4 = 2     /* I8 [out, in/2] (two e2m1, low nibble first) + F8_E8M0 .scale [out, in/32] */
} tide_weight_format;

typedef struct tide_config {
  char model_type[32];              /* "deepseek_v4" */
  char architecture[64];            /* first entry of "architectures" */
  char torch_dtype[16];             /* "bfloat16" */
  char hidden_act[16];              /* "silu" (the only one supported) */
  char scoring_func[16];            /* "sqrtsoftplus" | "sigmoid" | "softmax" */
  char topk_method[16];             /* "noaux_tc" */
  char rope_scaling_type[16];       /* "yarn", or "" when rope_scaling is null */
  char quant_method[16];            /* quantization_config.quant_method: "fp8" or "" */
  char quant_fmt[16];               /* quantization_config.fmt: "e4m3" */
  char quant_scale_fmt[16];         /* quantization_config.scale_fmt: "ue8m0" */
  char activation_scheme[16];       /* quantization_config.activation_scheme */
  char expert_dtype[16];            /* "fp4", "fp8", "bf16" or "" (= as other linears) */
  int64_t vocab_size;
  int64_t hidden_size;              /* d */
  int64_t max_position_embeddings;
  int64_t bos_token_id;             /* -1 when null */
  int64_t eos_token_id;             /* -1 when null; the first entry of a list */
  int32_t num_hidden_layers;        /* main blocks, MTP excluded */
  int32_t num_attention_heads;      /* H */
  int32_t num_key_value_heads;      /* must be 1 */
  int32_t head_dim;                 /* D, must be 512 */
  int32_t qk_rope_head_dim;         /* must be 64 */
  int32_t q_lora_rank;
  int32_t o_lora_rank;
  int32_t o_groups;                 /* G, divides H */
  int32_t sliding_window;           /* W */
  int32_t index_n_heads;
  int32_t index_head_dim;           /* must be 128 */
  int32_t index_topk;
  int32_t n_routed_experts;         /* E */
  int32_t num_experts_per_tok;      /* k <= E */
  int32_t n_shared_experts;
  int32_t moe_intermediate_size;
  int32_t scoring;                  /* tide_scoring, from scoring_func */
  int32_t num_hash_layers;          /* layers 0..num_hash_layers-1 route by tid2eid */
  int32_t hc_mult;
  int32_t hc_sinkhorn_iters;
  int32_t num_nextn_predict_layers; /* MTP blocks, prefix mtp.{i}. */
  int32_t weight_block_size[2];     /* FP8 scale block [rows, cols]: 128, 128 */
  int32_t linear_format;            /* tide_weight_format expected of FP8-capable linears */
  int32_t expert_format;            /* tide_weight_format expected of routed experts */
  _Bool norm_topk_prob;
  _Bool tie_word_embeddings;
  _Bool attention_bias;             /* must be false */
  _Bool rope_scaling;               /* YaRN on compressed layers */
  double rope_theta;                /* SWA-only layers */
  double compress_rope_theta;       /* compressed layers */
  double rope_factor;               /* rope_scaling.factor */
  double rope_original_max_position_embeddings;
  double rope_beta_fast;
  double rope_beta_slow;
  double rope_mscale;               /* informational: tide applies no magnitude scaling */
  double rope_mscale_all_dim;
  double routed_scaling_factor;
  double swiglu_limit;
  double hc_eps;
  double rms_norm_eps;
  int32_t n_compress_ratios;        /* entries in compress_ratios (>= num_hidden_layers) */
  int32_t compress_ratios[256];     /* per block: 0 (SWA only), 1, 4 or 128; trailing = MTP */
} tide_config;

/* Parse config.json text (len bytes, no NUL needed) into *out with the
 * defaults filled in, then check what tide supports (tide_config_validate).
 * `path` names the file in error messages (may be NULL). *out is written
 * only on success. Errors: TIDE_E_FORMAT (not JSON, wrong JSON type for a
 * field), TIDE_E_UNSUPPORTED (a value tide does not support), both naming
 * the file, the field, the value and the expectation. */
int tide_config_parse(tide_config *out, const char *json, int64_t len, const char *path);
/* The defaults alone (every field as if config.json were "{}"). */
void tide_config_defaults(tide_config *out);
/* Check a config against what tide supports: model family, head_dim 512
 * with qk_rope_head_dim 64, index_head_dim 128, one KV head, compress ratios
 * in {0, 1, 4, 128} and at least one per layer, H divisible by o_groups,
 * 1 <= k <= E, hash layers <= layers, positive sizes and eps, hidden_act
 * silu, topk_method noaux_tc, rope_scaling yarn or none, quantization fp8
 * e4m3 with 128x128 ue8m0 blocks or none. `path` names the file. */
int tide_config_validate(const tide_config *cfg, const char *path);
/* The compress ratio of block `layer` as the engine uses it: 1 (SWA only,
 * also for a 0 entry), 4 or 128. Blocks num_hidden_layers.. are the MTP
 * blocks (ratio from the trailing entries, 1 when there are none). Returns a
 * negative TIDE_E_RANGE for a layer outside 0..layers+mtp-1. */
int tide_config_layer_ratio(const tide_config *cfg, int layer);

/* ---- the tensor inventory of a config (doc deepseek-v4.md 1.6) ---- */
typedef enum tide_spec_kind {
  TIDE_SPEC_WEIGHT = 0,  /* a matrix y = x W^T: [rows=out, cols=in] (any tide_weight_format) */
  TIDE_SPEC_SCALE = 1,   /* the F8_E8M0 .scale companion of the WEIGHT just before it */
  TIDE_SPEC_NORM = 2,    /* an RMSNorm weight (BF16 vector) */
  TIDE_SPEC_EMBED = 3,   /* embed.weight [vocab, d] (BF16) */
  TIDE_SPEC_PARAM = 4,   /* F32 parameters: hc_*, attn_sink, ape, gate.bias */
  TIDE_SPEC_IDS = 5      /* ffn.gate.tid2eid [vocab, k] I64 */
} tide_spec_kind;

typedef struct tide_tensor_spec {
  char name[96];         /* safetensors key, e.g. "layers.3.attn.wq_a.weight" */
  int32_t dtype;         /* tide_dtype as stored */
  int32_t ndim;
  int64_t shape[4];      /* as stored (FP4 pairs: in/2 columns) */
  int32_t kind;          /* tide_spec_kind */
  int32_t layer;         /* block (0.. main, num_hidden_layers.. MTP), -1 = global */
  int32_t format;        /* tide_weight_format of a WEIGHT (and its SCALE), else -1 */
  int32_t pad_;
  int64_t rows, cols;    /* logical [out, in] of a WEIGHT/SCALE owner; 0 otherwise */
} tide_tensor_spec;

/* Every tensor a checkpoint of this config holds, in a fixed order (global
 * tensors, then block by block, MTP last; a WEIGHT's SCALE right after it),
 * with the formats the config asks for (linear_format, expert_format).
 * *out is an array of *n specs the caller frees with tide_free. */
int tide_config_inventory(const tide_config *cfg, tide_tensor_spec **out, int64_t *n);

/* ---- opened checkpoints ---- */
typedef struct tide_ckpt tide_ckpt;   /* opaque */

enum {
  TIDE_CKPT_CONFIG_OPTIONAL = 1,   /* a directory without config.json is accepted */
  TIDE_CKPT_NO_MODEL_CHECK = 2     /* skip checking the tensors against the config */
};

/* Open `path`: a directory (config.json and model.safetensors, or shards
 * listed by model.safetensors.index.json) or a single .safetensors file (no
 * config). Reads the headers with pread and maps each shard read-only;
 * touches no tensor data. Every header is checked strictly (docs/
 * checkpoint.md); with a config, every tensor the config implies must be
 * present with an acceptable dtype and shape (tide_ckpt_check_model) unless
 * TIDE_CKPT_NO_MODEL_CHECK. Errors name the file, the tensor and the
 * expectation. *out: a new handle, free with tide_ckpt_free. */
int tide_ckpt_open(tide_ckpt **out, const char *path, int flags);
/* Release the handle. Views handed out stay valid (they hold the mapping
 * through the storage refcount). NULL-safe. */
void tide_ckpt_free(tide_ckpt *ck);

/* Per-tensor facts, read from the header only. */
typedef struct tide_ckpt_info {
  const char *name;      /* borrowed, valid until tide_ckpt_free */
  const char *shard;     /* path of the shard file, borrowed likewise */
  int32_t shard_index;
  int32_t dtype;         /* tide_dtype */
  int32_t ndim;
  int32_t pad_;
  int64_t shape[4];
  int64_t offset;        /* absolute byte offset of the data in the shard file */
  int64_t nbytes;
} tide_ckpt_info;

/* Number of tensors. Tensor indices 0..count-1 follow the names in byte
 * order (strcmp), across all shards. */
int64_t tide_ckpt_count(const tide_ckpt *ck);
/* Index of `name`, or -1 when absent (no error is recorded). */
int64_t tide_ckpt_find(const tide_ckpt *ck, const char *name);
int tide_ckpt_info_at(const tide_ckpt *ck, int64_t index, tide_ckpt_info *out);
/* A read-only zero-copy view of tensor `name` (or of index i) into its
 * shard's mapping; *out takes one storage reference (release it with
 * tide_tensor_release). A missing name is TIDE_E_RANGE naming the tensor and
 * the checkpoint. */
int tide_ckpt_tensor(const tide_ckpt *ck, const char *name, tide_tensor *out);
int tide_ckpt_tensor_at(const tide_ckpt *ck, int64_t index, tide_tensor *out);

typedef struct tide_ckpt_shard_info {
  const char *path;           /* borrowed */
  const char *metadata_json;  /* the shard's __metadata__ as JSON text, NULL if absent; borrowed */
  int64_t file_size;
  int64_t header_bytes;       /* N of the 8-byte length prefix */
  int64_t n_tensors;
  int64_t tensor_bytes;       /* sum of its tensors' byte ranges */
} tide_ckpt_shard_info;
int tide_ckpt_shard_count(const tide_ckpt *ck);
int tide_ckpt_shard_at(const tide_ckpt *ck, int index, tide_ckpt_shard_info *out);

typedef struct tide_ckpt_summary {
  const char *path;              /* as opened; borrowed */
  int32_t n_shards;
  int32_t has_config;
  int64_t n_tensors;
  int64_t tensor_bytes;          /* sum over all tensors */
  int64_t index_total_size;      /* metadata.total_size of the index, -1 if none */
  int64_t parameters;            /* elements of every tensor except .scale companions and
                                    integer index tables (I32/I64 tid2eid); an I8/U8
                                    weight with a .scale (MXFP4) counts two per byte */
  int64_t count_by_dtype[10];    /* indexed by tide_dtype */
  int64_t elements_by_dtype[10];
  int64_t bytes_by_dtype[10];
} tide_ckpt_summary;
int tide_ckpt_summary_get(const tide_ckpt *ck, tide_ckpt_summary *out);

/* The parsed config (borrowed, valid until tide_ckpt_free), NULL without one. */
const tide_config *tide_ckpt_config(const tide_ckpt *ck);
/* The raw config.json text (NUL-terminated, borrowed), NULL without one;
 * *len (may be NULL) gets its length. */
const char *tide_ckpt_config_json(const tide_ckpt *ck, int64_t *len);
/* Check that every tensor of tide_config_inventory(config) is present with an
 * acceptable format and shape: a WEIGHT may be stored as FP8 (+scale), BF16,
 * F16, F32 or MXFP4 I8/U8 (+scale) whatever the config says; vectors as
 * BF16/F16/F32; tid2eid as I64/I32. Extra tensors are allowed. The error
 * names the tensor, its shard, what it is and what was expected. */
int tide_ckpt_check_model(const tide_ckpt *ck);

/* ---- touching weights, with a progress bar ---- */
enum {
  TIDE_PROGRESS_AUTO = 0,     /* a bar on stderr only when stderr is a terminal */
  TIDE_PROGRESS_ALWAYS = 1,
  TIDE_PROGRESS_NEVER = 2
};
typedef struct tide_progress tide_progress;   /* opaque */
/* A progress bar over `total` units of bytes ("label  42% 1.2/3.0 GB
 * 850 MB/s"), redrawn on stderr at most every 0.1 s and finished by
 * tide_progress_free. In AUTO mode without a terminal nothing is printed and
 * the calls cost an atomic add. */
int tide_progress_new(tide_progress **out, const char *label, int64_t total, int mode);
/* Add `done` units; thread-safe. NULL-safe. */
void tide_progress_add(tide_progress *p, int64_t done);
/* Print the final state (when shown) and free. NULL-safe. */
void tide_progress_free(tide_progress *p);

/* Fault in every page of the listed tensors (indices; idx NULL = all), shard
 * by shard in file order, so later reads hit memory. Shows a "loading"
 * progress bar per `mode` (TIDE_PROGRESS_*). Read-only: the mapping is not
 * changed. */
int tide_ckpt_prefault(const tide_ckpt *ck, const int64_t *idx, int64_t n, int mode);

/* ---- writing safetensors ----
 * A streaming writer: declare every tensor (name, dtype, shape), then write
 * their data one at a time in any order, then finish. The file is laid out
 * as Hugging Face's writer does: __metadata__ first, tensors ordered by
 * dtype (widest first, so every tensor is aligned to its element size) then
 * by name, contiguous data, the header padded with spaces to a multiple of
 * 8 bytes so the data section starts 8-byte aligned. The header's keys are
 * in that same order. Data goes to PATH.tmp-PID and is renamed to PATH by
 * finish, so a failed write never leaves a half file under PATH. A new
 * writer of PATH removes the PATH.tmp-PID files of killed writers (PID not
 * running, file untouched for a minute). */
typedef struct tide_st_writer tide_st_writer;   /* opaque */
int tide_st_writer_new(tide_st_writer **out, const char *path);
/* A __metadata__ entry (string to string). Before the first write. */
int tide_st_writer_meta(tide_st_writer *w, const char *key, const char *value);
/* Declare a tensor. Names are unique, non-empty, not "__metadata__"; fp4
 * needs an even element count. Before the first write. */
int tide_st_writer_declare(tide_st_writer *w, const char *name, int dtype, int ndim,
                           const int64_t *shape);
/* Write the data of declared tensor `name`: t must have its dtype and shape
 * (any strides; a non-contiguous tensor is written in logical row-major
 * order). Each tensor is written once. */
int tide_st_writer_write(tide_st_writer *w, const char *name, const tide_tensor *t);
/* Write the header, check every tensor was written (unless header_only, which
 * leaves the data section a hole: a sparse file of the full size), close
 * and rename into place. */
int tide_st_writer_finish(tide_st_writer *w, int header_only);
/* Total bytes of the declared tensors' data. */
int64_t tide_st_writer_data_bytes(const tide_st_writer *w);
/* Free; an unfinished file is removed. NULL-safe. */
void tide_st_writer_free(tide_st_writer *w);

/* ---- quantisers and generators for writing checkpoints ----
 * Exact rules (scalar references in kernels/ckpt_quant.c, AVX2 variants with
 * identical bytes):
 *  FP8 block (128 x 128, ragged edges are smaller blocks): a = max |x| over the
 *   block (NaN ignored); s = a / 448 in f32; e = ceil(log2 s) computed exactly
 *   from the bits of s, clamped to [-127, 127] (a = 0 gives -127); the scale
 *   byte is e + 127 (F8_E8M0, value 2^e); codes = e4m3 RNE of x * 2^-e
 *   (saturating at 448, NaN -> 0x7F).
 *  MXFP4 (32 consecutive inputs of a row): a = max |x|; e = ceil(log2(a / 6))
 *   likewise, clamped; byte e + 127; codes = e2m1 RNE of x * 2^-e (saturating
 *   at 6, sign kept, NaN -> 0); element 2m in the low nibble of byte m.
 * So no input is clipped: the block amax always fits after scaling. */
/* q: f8e4m3 [n, k]; scale: e8m0 [ceil(n/128), ceil(k/128)]; x: f32 [n, k]. */
int tide_ckpt_quant_fp8(tide_tensor *q, tide_tensor *scale, const tide_tensor *x);
/* q: i8 or u8 [n, k/2]; scale: e8m0 [n, k/32]; x: f32 [n, k], k % 32 == 0. */
int tide_ckpt_quant_mxfp4(tide_tensor *q, tide_tensor *scale, const tide_tensor *x);

/* A 64-bit seed for the tensor `name` of a checkpoint generated with `seed`
 * (so a tensor's values do not depend on the order or sharding). */
uint64_t tide_ckpt_seed(uint64_t seed, const char *name);
/* Fill a contiguous tensor with deterministic pseudo-random values, uniform
 * on [mean - sqrt(3) std, mean + sqrt(3) std) (so of standard deviation std),
 * stored in its format: f32/bf16/f16 any shape (scale NULL); f8e4m3 [n, k]
 * with scale e8m0 [ceil(n/128), ceil(k/128)] (FP8 blocks); i8/u8 [n, k/2]
 * with scale e8m0 [n, k/32] (MXFP4). Logical element (i, j) depends only on
 * (seed, i * k + j): the result is the same for any thread count. */
int tide_ckpt_gen_weight(tide_tensor *w, tide_tensor *scale, uint64_t seed, double mean, double std);
/* Fill an i64/i32 tensor [rows, k] so each row holds k distinct values in
 * [0, n_values) drawn from (seed, row); k <= n_values. */
int tide_ckpt_gen_ids(tide_tensor *t, uint64_t seed, int64_t n_values);
