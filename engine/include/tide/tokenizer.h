/* tide/tokenizer.h - the Hugging Face tokenizer.json encoder/decoder.
 * Part of tide.h; include tide.h, not this file.
 *
 * Boundary: a tide_tokenizer is everything read from a model's
 * tokenizer.json (+ tokenizer_config.json): vocabulary, merges, added tokens,
 * normalizer, pre-tokenizer pipeline, post-processor and decoder. It maps
 * UTF-8 text to token ids exactly as Hugging Face's `tokenizers` does for the
 * supported components (docs/tokenizer.md lists them), and ids back to text.
 *
 * Text is bytes + length (no NUL needed). Invalid UTF-8 in the input never
 * fails: each maximal invalid subsequence becomes U+FFFD first (the
 * WHATWG/Python "replace" rule), then the result is tokenized.
 *
 * Threads: a loaded tokenizer is read-only; every function below may be
 * called on the same tokenizer from several threads at once. One caller at a
 * time uses the tokenizer's scratch and its cache of pre-token results;
 * a concurrent caller gets private scratch for that call (correct, slower).
 * Output buffers (tide_tok_ids, tide_tok_text) and streamers belong to one
 * thread at a time. */

typedef struct tide_tokenizer tide_tokenizer;      /* opaque, read-only once loaded */
typedef struct tide_tok_streamer tide_tok_streamer; /* opaque, one id stream */

/* A grow-only output array the caller owns (zero-initialise it; reuse it
 * across calls so encoding does not allocate; free with tide_tok_ids_free). */
typedef struct tide_tok_ids {
  int32_t *ids;       /* ids[0..n-1] */
  int64_t n;          /* ids written by the last call */
  int64_t cap;        /* allocated entries */
} tide_tok_ids;

/* A grow-only output byte buffer (UTF-8, NUL-terminated at data[len]). */
typedef struct tide_tok_text {
  char *data;
  int64_t len;
  int64_t cap;
} tide_tok_text;

void tide_tok_ids_free(tide_tok_ids *ids);     /* frees the array, zeroes the struct; NULL-safe */
void tide_tok_text_free(tide_tok_text *text);  /* same for text */

/* Load a tokenizer. `path` is a model directory holding tokenizer.json (and
 * optionally tokenizer_config.json), or the path of a tokenizer.json file
 * (tokenizer_config.json next to it is read if present). Errors name the
 * file and the JSON field: TIDE_E_IO (missing/unreadable), TIDE_E_FORMAT
 * (malformed), TIDE_E_UNSUPPORTED (a component tide does not implement).
 * *out holds one reference; tide_tokenizer_free drops it.
 *
 * Ownership: the tokenizer is reference counted and destroyed with its last
 * reference. Each streamer holds one (taken by tide_tok_streamer_new, given
 * back by tide_tok_streamer_free), so a streamer stays usable after the
 * tokenizer's owner freed it, and the two may be freed in either order.
 * Other holders take one with tide_tokenizer_retain. */
int tide_tokenizer_load(tide_tokenizer **out, const char *path);
void tide_tokenizer_retain(const tide_tokenizer *tok);   /* NULL-safe */
void tide_tokenizer_free(tide_tokenizer *tok);    /* drops one reference; NULL-safe */

/* Flags for encode and decode. */
enum {
  TIDE_TOK_ADD_SPECIAL = 1,   /* encode: add BOS/EOS as tokenizer_config (or the
                                 post_processor template) says */
  TIDE_TOK_SPLIT_SPECIAL = 2, /* encode: do not match added tokens marked
                                 special=true in the text (encode them as text) */
  TIDE_TOK_SKIP_SPECIAL = 4,  /* decode: drop special tokens */
  TIDE_TOK_NO_CACHE = 8       /* encode: bypass the pre-token cache (tests, benchmarks) */
};

/* Encode `len` bytes of text. out->ids[0..out->n-1] receives the ids (out
 * grows as needed; its old content is replaced). On error out->n is 0. */
int tide_tokenizer_encode(const tide_tokenizer *tok, const char *text, int64_t len, int flags,
                          tide_tok_ids *out);

/* Decode n ids to UTF-8 text in `out` (replaced). Byte sequences that do not
 * form valid UTF-8 become U+FFFD. Ids outside [0, vocab size) or without a
 * token fail with TIDE_E_RANGE naming the position. */
int tide_tokenizer_decode(const tide_tokenizer *tok, const int32_t *ids, int64_t n, int flags,
                          tide_tok_text *out);

/* Number of token ids: 1 + the largest id of the vocabulary and added tokens. */
int64_t tide_tokenizer_vocab_size(const tide_tokenizer *tok);

/* The id of a token given by its vocabulary text (e.g. "<｜User｜>", "Ġthe"),
 * or -1 if there is none. len < 0 means NUL-terminated. */
int32_t tide_tokenizer_token_to_id(const tide_tokenizer *tok, const char *token, int64_t len);

/* The vocabulary text of token `id` (e.g. "Ġthe"): *text points into the
 * tokenizer (valid until tide_tokenizer_free), *len its bytes. TIDE_E_RANGE
 * for an id with no token. */
int tide_tokenizer_id_to_token(const tide_tokenizer *tok, int32_t id, const char **text,
                               int64_t *len);

/* The bytes token `id` contributes to decoded text (" the" for "Ġthe"; may
 * be part of a UTF-8 character). Same lifetime rules as id_to_token. */
int tide_tokenizer_id_to_bytes(const tide_tokenizer *tok, int32_t id, const char **bytes,
                               int64_t *len);

/* Named token ids from tokenizer_config.json (or the model's unk_token);
 * -1 if the tokenizer has none. */
enum { TIDE_TOK_BOS = 0, TIDE_TOK_EOS = 1, TIDE_TOK_PAD = 2, TIDE_TOK_UNK = 3 };
int32_t tide_tokenizer_special_id(const tide_tokenizer *tok, int which);

/* 1 if `id` is an added token with special=true (dropped by SKIP_SPECIAL),
 * 0 otherwise (also for out-of-range ids). */
int tide_tokenizer_is_special(const tide_tokenizer *tok, int32_t id);

/* Whether TIDE_TOK_ADD_SPECIAL adds a BOS / an EOS (1/0). */
int tide_tokenizer_adds_bos(const tide_tokenizer *tok);
int tide_tokenizer_adds_eos(const tide_tokenizer *tok);

/* The chat_template string of tokenizer_config.json ("" if none). Valid
 * until tide_tokenizer_free. */
const char *tide_tokenizer_chat_template(const tide_tokenizer *tok);

/* A one-line description of the loaded pipeline, e.g.
 * "BPE(byte-level, 128000 merges) pre=[Split,Split,Split,ByteLevel] dec=ByteLevel".
 * Valid until tide_tokenizer_free. */
const char *tide_tokenizer_describe(const tide_tokenizer *tok);

/* Pre-token cache counters (hits, misses) since load, for tests/benchmarks. */
void tide_tokenizer_cache_stats(const tide_tokenizer *tok, int64_t *hits, int64_t *misses);

/* ---- streaming detokenisation ---- */
/* A streamer turns ids arriving one at a time into text, returning only
 * complete UTF-8 characters: bytes of a character split across tokens are
 * held until the character is complete; bytes that can never become valid
 * UTF-8 are returned as U+FFFD. Concatenating every put() result and the
 * final flush() gives the same text as tide_tokenizer_decode of all the ids
 * (with the same flags; clean_up_tokenization_spaces is not applied).
 * The streamer holds a reference to `tok` until tide_tok_streamer_free.
 * flags: SKIP_SPECIAL. */
int tide_tok_streamer_new(tide_tok_streamer **out, const tide_tokenizer *tok, int flags);
void tide_tok_streamer_free(tide_tok_streamer *s);  /* NULL-safe */
/* Feed one id. text and len receive the newly complete text (possibly empty),
 * valid until the next call on this streamer. TIDE_E_RANGE for a bad id
 * (the streamer is unchanged). */
int tide_tok_streamer_put(tide_tok_streamer *s, int32_t id, const char **text, int64_t *len);
/* End of stream: returns held bytes (as U+FFFD) and resets the streamer. */
int tide_tok_streamer_flush(tide_tok_streamer *s, const char **text, int64_t *len);
/* Forget held bytes and start a new stream. */
void tide_tok_streamer_reset(tide_tok_streamer *s);
/* Bytes currently held back (0..3). */
int tide_tok_streamer_pending(const tide_tok_streamer *s);
