/* tide/attn.h - paged KV caches, sequences, step batches and the DeepSeek-V4
 * sparse-attention kernels. Part of tide.h; include tide.h, not this file.
 *
 * Boundary: one tide_kvcache holds every layer's caches (sliding window,
 * compressed, indexer keys, compressor state) for many sequences; a
 * tide_batch describes one forward step (which tokens of which sequences);
 * the kernels below read and write the cache through the prepared batch, so
 * Lua never builds slot lists element by element. docs/attention.md has the
 * byte layouts, the step protocol and each kernel's numerics.
 *
 * Common conventions of the kernels:
 *  - Activations are f32 tensors holding bf16-valued numbers; where a kernel
 *    rounds to bf16 precision it says so (doc 6.21 rounding points).
 *  - Head dim 512 (448 "nope" + 64 rope), indexer head dim 128 (64 + 64 rope),
 *    GPT-J interleaved RoPE. Positions are those of the batch.
 *  - Results do not depend on the thread count, the kernel tiling, nor on
 *    which other tokens share the batch (docs/design.md 1): bitwise.
 *  - No allocation per call except grow-only scratch owned by the cache or
 *    the rope object. */

/* ---- RoPE tables ---- */
typedef struct tide_rope tide_rope;   /* opaque */

typedef struct tide_rope_config {
  double theta;              /* base: rope_theta (10000) or compress_rope_theta */
  int32_t dim;               /* rotated dims, 64 (32 frequency pairs) */
  int32_t yarn;              /* 1: apply the YaRN frequency ramp (doc 2.2.2) */
  double yarn_factor;        /* s, 16 */
  double yarn_original_max;  /* L0, original_max_position_embeddings */
  double yarn_beta_fast;     /* 32 */
  double yarn_beta_slow;     /* 1 */
  int64_t table_positions;   /* positions kept in a lazily grown table; beyond
                                it cos/sin are computed on the fly (same
                                bits). 0 = 65536 (16 MiB). */
} tide_rope_config;

/* Frequencies f_i = theta^(-2i/dim), YaRN-ramped when cfg->yarn (same formula
 * as the reference model); row p of the table is [cos(a_0..31) | sin(a_0..31)]
 * with a_i = (float)p * f_i in f32 and cos/sin evaluated in double, then f32. */
int tide_rope_new(tide_rope **out, const tide_rope_config *cfg);
void tide_rope_free(tide_rope *r);                  /* NULL-safe */
/* freqs[dim/2] f32 (any of the pointers may be NULL). */
int tide_rope_freqs(const tide_rope *r, float *freqs, int32_t n);
/* cs[dim]: the table row of position p (p >= 0). */
int tide_rope_cos_sin(tide_rope *r, int64_t p, float *cs, int32_t n);
/* x[.., dim] f32 (last dim = dim, contiguous rows) rotated in place at the
 * positions pos[rows] (i64 tensor, one per row of x viewed [rows, dim]);
 * inverse when inverse != 0. No rounding. For tests and Lua experiments. */
int tide_rope_apply(tide_rope *r, tide_tensor *x, const tide_tensor *pos, int inverse);

/* ---- the cache ---- */
typedef struct tide_kvcache tide_kvcache;   /* opaque */
typedef struct tide_batch tide_batch;       /* opaque */

typedef struct tide_kvcache_config {
  int32_t n_layers;          /* layers of the model (MTP excluded) */
  const int32_t *ratios;     /* [n_layers]: 0 or 1 = SWA only, 4 (C4A), 128 (C128A) */
  int32_t head_dim;          /* 512 (only value supported) */
  int32_t rope_dim;          /* 64 (only value supported) */
  int32_t index_head_dim;    /* 128 (only value supported) */
  int32_t window;            /* sliding window incl. the current token, 0 = 128 */
  int32_t swa_block;         /* positions per SWA block, 0 = 64 */
  int32_t page_tokens;       /* positions per compressed page, 0 = 256; multiple of 128 */
  int32_t swa_blocks;        /* SWA pool capacity in blocks (each covers every layer) */
  int32_t pages;             /* compressed pool capacity in pages */
  int32_t max_seqs;          /* sequence slots (ids 0..max_seqs-1) */
  int32_t keep_swa_history;  /* 1: keep every SWA block; 0: recycle blocks that
                                fall wholly out of the window at commit */
} tide_kvcache_config;

/* Create a cache; storage for all pools is allocated now (zero-filled).
 * Fails with TIDE_E_UNSUPPORTED for dims other than 512/64/128 and
 * TIDE_E_INVALID for bad ratios or sizes. *out holds one reference.
 *
 * Ownership: the cache is reference counted. Whoever keeps a sequence id
 * (or anything else that will call into the cache) beyond its owner's life
 * takes a reference with tide_kvcache_retain and gives it back with
 * tide_kvcache_free after its last call (for a sequence: after
 * tide_kvcache_seq_free). The cache, and every sequence still in it, is
 * destroyed when the last reference goes, so holders may be finalized in any
 * order. A batch still prepared on a destroyed cache is unlinked (it can be
 * freed or reused; it is no longer prepared). Not thread-safe against
 * concurrent use of the same cache, like every other call here. */
int tide_kvcache_new(tide_kvcache **out, const tide_kvcache_config *cfg);
void tide_kvcache_retain(tide_kvcache *c);          /* NULL-safe */
void tide_kvcache_free(tide_kvcache *c);            /* drops one reference; NULL-safe */

typedef struct tide_kvcache_stats {
  int32_t swa_blocks, swa_free;     /* pool capacity, free blocks */
  int32_t pages, pages_free;        /* compressed pool capacity, free pages */
  int32_t max_seqs, seqs;           /* slots, live sequences */
  int64_t bytes;                    /* bytes of cache storage (all pools + state) */
  int32_t n_layers, window, swa_block, page_tokens;
  int32_t keep_swa_history;
  int32_t step_active;              /* 1 while a batch is prepared */
} tide_kvcache_stats;
int tide_kvcache_stats_get(const tide_kvcache *c, tide_kvcache_stats *out);
/* Ratio of layer L (1, 4 or 128), or a negative status for a bad L. */
int tide_kvcache_layer_ratio(const tide_kvcache *c, int32_t layer);

/* Cache regions, for byte views, slot mapping and export/import. */
typedef enum tide_kv_kind {
  TIDE_KV_SWA = 0,     /* sliding-window cache, fp8_ds_mla, per position */
  TIDE_KV_MAIN = 1,    /* main compressed cache (ratio 4 or 128), per entry */
  TIDE_KV_INDEX = 2,   /* indexer K cache (ratio 4), per entry, 132 B */
  TIDE_KV_STATE = 3,   /* main compressor state rows (f32), per position */
  TIDE_KV_ISTATE = 4   /* indexer compressor state rows (f32), per position */
} tide_kv_kind;

/* A byte view of a pool region of one layer: u8 [blocks, stride] (SWA:
 * [swa_blocks, swa_block*584]; MAIN: [pages, E*584] with E = page_tokens/r
 * entries; INDEX: [pages, E*132]). The layout inside a row is the vLLM one:
 * [E x 576 data][E x 8 scales] or [E x 128 fp8][E x 4 f32 scale]. The view is
 * writable and shares the cache's storage (it keeps it alive).
 * STATE/ISTATE are per sequence: see tide_kvcache_seq_read. */
int tide_kvcache_view(tide_kvcache *c, int32_t layer, int32_t kind, tide_tensor *out);
/* Slots per pool block of a region: swa_block, or page_tokens/r entries. */
int64_t tide_kvcache_block_slots(const tide_kvcache *c, int32_t layer, int32_t kind);

/* ---- sequences ---- */
/* A new empty sequence (length 0); *id in 0..max_seqs-1. TIDE_FULL when every
 * slot is taken. */
int tide_kvcache_seq_new(tide_kvcache *c, int32_t *id);
/* Release a sequence: its blocks and pages return to the pool (shared ones
 * when their last user goes). Fails while a step is prepared. */
int tide_kvcache_seq_free(tide_kvcache *c, int32_t id);
/* Committed length (positions 0..len-1 are in the cache), or negative. */
int64_t tide_kvcache_seq_len(const tide_kvcache *c, int32_t id);
/* SWA blocks and compressed pages this sequence references (shared ones
 * count for every sharer). Any pointer may be NULL. */
int tide_kvcache_seq_usage(const tide_kvcache *c, int32_t id, int32_t *swa_blocks, int32_t *pages);
/* *dst = a new sequence that continues exactly like src: block tables shared
 * copy-on-write (reference counts), compressor state copied. A snapshot is a
 * fork that is never stepped. TIDE_FULL when no slot is free. */
int tide_kvcache_seq_fork(tide_kvcache *c, int32_t src, int32_t *dst);
/* Make dst an exact copy of src (dst's old contents released first): restore
 * a snapshot with (dst = conversation, src = snapshot). dst != src. */
int tide_kvcache_seq_assign(tide_kvcache *c, int32_t dst, int32_t src);
/* Roll a sequence back to length len (positions len.. are dropped), exactly:
 * afterwards its cache contents (every region's extent, tide_kvcache_seq_read)
 * are those of a sequence that was only ever fed its first len tokens. Only
 * within the sequence's last committed step and before any other step,
 * import or write on this cache (len in p0..length, p0 = its length before
 * that step; what speculative decoding needs: verify k+1 tokens, keep the
 * accepted prefix) and with that step at most 8 tokens past the carried
 * compressor rows; otherwise TIDE_E_STATE and nothing changes. Blocks and
 * pages holding only dropped positions return to the pool. */
int tide_kvcache_seq_truncate(tide_kvcache *c, int32_t id, int64_t len);
/* Give an empty sequence the length len, allocating (all or nothing, TIDE_FULL)
 * the blocks and pages positions 0..len-1 need, for importing saved contents
 * with tide_kvcache_seq_write. Contents are zero until written. */
int tide_kvcache_seq_set_length(tide_kvcache *c, int32_t id, int64_t len);

/* Export/import of one sequence's cache contents, per layer and region, as
 * rows: SWA = positions first..len-1 still held (584 B each, token format:
 * 576 data bytes then the 8 scale bytes); MAIN = entries 0..floor(len/r)-1
 * (584 B); INDEX = entries (132 B: 128 fp8 then the f32 scale); STATE/ISTATE
 * = the carried compressor rows of positions first..len-1 (f32 bytes, width
 * 2*c*d). Extent: *first, *rows, *row_bytes (any may be NULL). */
int tide_kvcache_seq_extent(const tide_kvcache *c, int32_t id, int32_t layer, int32_t kind,
                            int64_t *first, int64_t *rows, int64_t *row_bytes);
/* out u8 [rows, row_bytes] contiguous <- the sequence's bytes of that extent. */
int tide_kvcache_seq_read(const tide_kvcache *c, int32_t id, int32_t layer, int32_t kind,
                          tide_tensor *out);
/* The inverse: writes the same extent from in u8 [rows, row_bytes]. Shared
 * blocks are copied first (copy-on-write); TIDE_FULL if that needs a block
 * the pool lacks (nothing changed). Not during a step. */
int tide_kvcache_seq_write(tide_kvcache *c, int32_t id, int32_t layer, int32_t kind,
                           const tide_tensor *in);

/* Local index -> global slot: out[i] = slot of local[i] (SWA: position;
 * MAIN/INDEX: entry index), = block_id*B + local mod B (B =
 * tide_kvcache_block_slots); -1 where local is negative or its block is not
 * held. local, out: i32 or i64 tensors of the same shape (any, contiguous). */
int tide_kvcache_map_slots(const tide_kvcache *c, int32_t id, int32_t layer, int32_t kind,
                           const tide_tensor *local, tide_tensor *out);

/* ---- step batches ---- */
/* A reusable batch for up to max_tokens tokens. It holds no reference to a
 * cache: while prepared it is linked to one, and the link goes with either
 * side (freeing a prepared batch aborts its step; destroying the cache
 * unlinks the batch). */
int tide_batch_new(tide_batch **out, int32_t max_tokens);
void tide_batch_free(tide_batch *b);                /* NULL-safe */
/* Empty the batch (fails while it is prepared). */
int tide_batch_clear(tide_batch *b);
/* Append n tokens of sequence seq at positions pos0..pos0+n-1. A sequence's
 * tokens must be contiguous in the batch and consecutive; TIDE_E_INVALID
 * otherwise, TIDE_E_RANGE past max_tokens. */
int tide_batch_add(tide_batch *b, int32_t seq, int64_t pos0, int32_t n);
/* Replace the contents with n tokens from arrays (same rules as add). */
int tide_batch_set(tide_batch *b, int32_t n, const int32_t *seqs, const int64_t *pos);
int32_t tide_batch_tokens(const tide_batch *b);
/* Sequence id and position of token t (either pointer may be NULL). */
int tide_batch_token(const tide_batch *b, int32_t t, int32_t *seq, int64_t *pos);
/* pos i64 [T] <- the positions (for GEMM-side code that wants them). */
int tide_batch_positions(const tide_batch *b, tide_tensor *pos);

/* Begin a step: validate (every sequence live, its first token at its
 * committed length), allocate every block and page the step writes, resolve
 * copy-on-write. All or nothing: TIDE_FULL (pool exhausted) or an error
 * leaves the cache unchanged. One batch at a time per cache. */
int tide_kvcache_prepare(tide_kvcache *c, tide_batch *b);
/* End the step: lengths advance, compressor states become current, SWA
 * blocks out of the window are recycled (unless keeping history). Fails
 * with TIDE_E_STATE (nothing changed, step still prepared) if a compressed
 * layer's compressors did not run on this batch. */
int tide_kvcache_commit(tide_kvcache *c, tide_batch *b);
/* Drop the step: every sequence is bitwise as before prepare (blocks taken
 * by the step are returned, copy-on-write undone, state rows restored). */
int tide_kvcache_abort(tide_kvcache *c, tide_batch *b);
/* Per-token slot lists of a prepared batch, for inspection:
 * TIDE_KV_SWA: out i64 [T, window]: window positions max(0,p-W+1)..p in
 * order, their SWA slots, -1 padded; TIDE_KV_MAIN: out i64 [T] the main
 * compressed write slot of each token (-1 unless (p+1) mod r = 0);
 * TIDE_KV_INDEX: same for the indexer cache. */
int tide_batch_slots(const tide_batch *b, const tide_kvcache *c, int32_t layer, int32_t kind,
                     tide_tensor *out);

/* ---- kernels ---- */
/* Per-head weight-free RMSNorm, RoPE on dims 448..511 at each token's
 * position, then bf16 rounding of all 512 dims, in place.
 * q f32 [T, H, 512] (contiguous); b filled (prepare not needed). */
int tide_attn_q_prep(tide_tensor *q, const tide_batch *b, tide_rope *rope, float eps);

/* SWA insert: kv f32 [T, 512] (not modified) -> RoPE on 448..511, bf16
 * rounding of the whole vector, 7 fp8 tiles of 64 with UE8M0 scales
 * (s = max(amax/448, 1e-4), exponent ceil(log2 s), values below the smallest
 * fp8 normal after scaling flushed to 0), rope dims as bf16, pad byte 0, at
 * the token's SWA slot of layer `layer`. b prepared on c. */
int tide_attn_kv_insert(tide_kvcache *c, int32_t layer, const tide_tensor *kv,
                        const tide_batch *b, tide_rope *rope);

/* Main compressor of a ratio-4 or ratio-128 layer. kvs f32 [T, 2*c*512]
 * (c = 2 for ratio 4 else 1): the step's projection rows [kv | score]
 * (bf16-valued); ape f32 [r, c*512]; norm [512] f32/bf16; eps. For every
 * block completed in the step (token with (p+1) mod r = 0) the entry
 * j = p / r is pooled (per-channel softmax of score+ape over the block, and
 * for ratio 4 the previous block's first halves), RMSNorm*norm, nope dims
 * bf16-rounded, RoPE at j*r on the f32 rope dims, stored as fp8_ds_mla (fp8
 * subnormals kept). Rows of the still-open blocks are staged as the
 * sequence's compressor state (current at commit). Reads the step's rows and
 * the committed state, so chunking does not change a byte. */
int tide_attn_compress(tide_kvcache *c, int32_t layer, const tide_tensor *kvs,
                       const tide_tensor *ape, const tide_tensor *norm, float eps,
                       const tide_batch *b, tide_rope *rope);
/* Indexer compressor of a ratio-4 layer: kvs f32 [T, 2*2*128], ape [4, 256],
 * norm [128]. Pooling and RMSNorm as above, RoPE on dims 64..127 at j*4, bf16
 * rounding of all 128 dims, fp8 with one power-of-two f32 scale
 * 2^ceil(log2(max(amax,1e-4)/448)) into the indexer K cache. */
int tide_attn_compress_indexer(tide_kvcache *c, int32_t layer, const tide_tensor *kvs,
                               const tide_tensor *ape, const tide_tensor *norm, float eps,
                               const tide_batch *b, tide_rope *rope);

/* Indexer query: qi f32 [T, nI, 128] (not modified) -> RoPE on dims 64..127
 * at each token's position, rotated dims rounded to bf16, per head
 * s = 2^ceil(log2(max(amax,1e-4)/448)), q8 = fp8(q/s) into q8 (u8 or f8e4m3
 * [T, nI, 128]); w f32 [T, nI] = w_raw * s * wscale (wscale = dI^-1/2 *
 * nI^-1/2 for DeepSeek-V4). w may alias w_raw. */
int tide_attn_indexer_q(tide_tensor *q8, tide_tensor *w, const tide_tensor *qi,
                        const tide_tensor *w_raw, float wscale, const tide_batch *b,
                        tide_rope *rope);

/* Lightning-indexer selection for a ratio-4 layer. For token t at p with
 * n = floor((p+1)/4) visible entries: if n <= K, topk[t] = 0..n-1 (no
 * scoring, the short path); else logit_j = s_j * sum_h w_h * ReLU(q8_h . k8_j)
 * over j < n (heads in order) and topk[t] = the K largest, ties to the
 * smaller index. Output in ascending index order, -1 padded. topk i32 [T, K]
 * (K any, e.g. 512 or 1024); q8 [T, nI, 128] u8/f8e4m3; w f32 [T, nI];
 * scores: NULL or f32 [T, S]: logits of j < min(n, S) for scored tokens
 * (other elements untouched). */
int tide_attn_indexer_topk(tide_kvcache *c, int32_t layer, const tide_tensor *q8,
                           const tide_tensor *w, const tide_batch *b, tide_tensor *topk,
                           tide_tensor *scores);

/* Sparse MLA attention with sink. For token t at p, head h: candidates = the
 * window positions max(0,p-W+1)..p (in order), then the compressed entries:
 * topk[t] (C4; entries < 0 or >= floor((p+1)/r) skipped) or all
 * 0..floor((p+1)/r)-1 when topk is NULL (C128, or C4 short path); none for
 * SWA-only layers. Keys dequantised exactly from the cache; V = K.
 * s_e = scale * q.k_e; m = max s; P_e = exp(s_e - m) (bf16-rounded for P.V,
 * unrounded in the sum); out = sum P_e k_e / (sum P_e + exp(sink_h - m)),
 * rounded to bf16; zero when no candidate is valid. Softmax is exact over the
 * whole candidate list (global max, keys processed in tiles of 16 from its
 * start), which is what the reference model computes.
 * out f32 [T, H, 512]; q f32 [T, H, 512]; sink f32 [H]; topk i32 [T, K] or
 * NULL; stats NULL or f32 [T, H, 4]: probability mass on the window, on the
 * compressed entries, on the sink, and lse = m + ln(sum P_e) (keys only;
 * -inf without keys). */
int tide_attn_sparse(tide_tensor *out, const tide_tensor *q, tide_kvcache *c, int32_t layer,
                     const tide_batch *b, const tide_tensor *topk, const tide_tensor *sink,
                     float scale, tide_tensor *stats);

/* Output path: out[t,h] = in[t,h] with dims 448..511 inverse-rotated at the
 * token's position and rounded to bf16 (other dims copied). out, in f32
 * [T, H, 512]; out may be in. The result feeds the grouped wo_a GEMM viewed
 * [T, G, hpg*512]. */
int tide_attn_o_unrope(tide_tensor *out, const tide_tensor *in, const tide_batch *b,
                       tide_rope *rope);
