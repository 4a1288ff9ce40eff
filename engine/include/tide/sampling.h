/* tide/sampling.h - candidates, sampler helpers and the per-request RNG.
 * Part of tide.h; include tide.h, not this file.
 *
 * Boundary: sampling policy is Lua (lua/tide/sampling.lua, one module per
 * stage in lua/tide/sampling/). A stage works on a candidates set
 * (tide_cands): token ids with their current logits, and probabilities once
 * computed. Everything that touches the whole vocabulary (copying a logits
 * row in, softmax, partial sorts and top-k selection, prefix sums of the
 * probability mass, penalties over the recent tokens, the final draw) is
 * one call here, so a chain of stages costs a few passes over the row.
 *
 * Canonical order: every order in this file is "logit descending, ties to
 * the smaller token id" (+0 and -0 compare equal). "The best m candidates"
 * means the first m in that order. It never depends on the position a
 * candidate happens to hold, so results do not depend on how earlier stages
 * left the arrays.
 *
 * Non-finite logits: loading a row fails (TIDE_E_INVALID, with the count and
 * the first token) if it holds a NaN or +inf; -inf means "banned" (the
 * candidate stays, with probability 0). A row where every logit is -inf
 * fails too. Stages never turn finite logits into NaN.
 *
 * Threads: nothing here uses threads; one candidates set, history or RNG is
 * used by one caller at a time. Results do not depend on tide_threads_set.
 * Probabilities come from one exp kernel (a polynomial evaluated with FMA,
 * the same operations in the scalar reference and the AVX2 variant, so both
 * give the same bits) and sums in double in a fixed order. */

/* ---- per-request random numbers -----------------------------------------
 * xoshiro256** (Blackman and Vigna, 2018): 256 bits of state, period
 * 2^256 - 1. tide_rng_seed fills the four state words with four successive
 * outputs of splitmix64 started at `seed`, so every 64-bit seed gives a
 * distinct, well-mixed state. The struct is plain: copy it to save or
 * restore a generator (sessions persist the four words). */
typedef struct tide_rng {
  uint64_t s[4];   /* state words; all zero is invalid (seeding never gives it) */
} tide_rng;

void tide_rng_seed(tide_rng *r, uint64_t seed);
/* The next 64 random bits. */
uint64_t tide_rng_next(tide_rng *r);
/* A double uniform in [0, 1): the top 53 bits of tide_rng_next * 2^-53. */
double tide_rng_uniform(tide_rng *r);

/* ---- candidates -----------------------------------------------------------
 * A candidates set: three arrays of `cap` entries owned by tide, of which
 * positions [0, n) are the current candidates. Fields may be read from Lua
 * directly (c.n, c.id[i], c.logit[i], c.p[i]); the arrays may be swapped for
 * scratch buffers by any tide_cands_* call, so re-read the pointers after a
 * call. Code that writes id[] or logit[] itself must call tide_cands_touch
 * afterwards. */
typedef struct tide_cands {
  int32_t *id;        /* [cap] token id of each position */
  float *logit;       /* [cap] current logit of each position */
  float *p;           /* [cap] softmax of logit[0..n) when has_p */
  int32_t n;          /* candidates in the set, 0..cap */
  int32_t cap;        /* entries allocated (the largest vocabulary it takes) */
  int32_t n_vocab;    /* length of the row loaded last */
  int32_t sorted;     /* positions [0, sorted) hold the `sorted` best candidates, in canonical order */
  int32_t has_p;      /* 1: p[0..n) = softmax(logit[0..n)); lse and max_logit are set */
  int32_t ascending;  /* 1: id[] strictly increases with position (true after a load) */
  int32_t selected;   /* position of the chosen token, -1 until a stage chooses */
  float max_logit;    /* largest logit when has_p */
  double lse;         /* log(sum exp(logit[0..n))) when has_p: logprob = logit - lse */
  void *priv;         /* tide's scratch buffers; not for callers */
} tide_cands;

/* A set with room for `cap` (>= 1) candidates. *out is owned by the caller:
 * free with tide_cands_free. Scratch buffers grow on first use. */
int tide_cands_new(tide_cands **out, int64_t cap);
void tide_cands_free(tide_cands *c);   /* NULL-safe */

enum {
  TIDE_CANDS_TRACE = 1   /* load: also keep the raw row so traces can report mass relative to it */
};

/* Load a logits row: `logits` is f32, 1-d [V] or [1, V], last dim contiguous,
 * V <= cap. The row is copied (the tensor is not kept): id[i] = i,
 * logit[i] = row[i], n = n_vocab = V, ascending = 1, sorted = has_p = 0,
 * selected = -1. Fails without changing c if the row holds NaN or +inf or
 * only -inf. flags: TIDE_CANDS_TRACE or 0. */
int tide_cands_load(tide_cands *c, const tide_tensor *logits, int flags);
/* Load an explicit set: ids[0..n) (distinct, in [0, cap)) with their
 * logits; n_vocab = cap. Same checks as tide_cands_load. */
int tide_cands_set(tide_cands *c, const int32_t *ids, const float *logits, int64_t n);
/* After writing id[], logit[] or n directly: checks n, that ids are in
 * range and distinct and logits hold no NaN or +inf, recomputes `ascending`
 * and forgets `sorted`, `has_p` and `selected` unless still valid.
 * TIDE_E_INVALID names the first bad entry. */
int tide_cands_touch(tide_cands *c);

/* p[0..n) = softmax(logit[0..n)); sets max_logit, lse, has_p. No-op when
 * has_p. p of a -inf logit is 0; exp(x - max) below e^-86 is flushed to 0. */
int tide_cands_softmax(tide_cands *c);
/* Entropy in nats of softmax(logit[0..n)), computed as lse - sum p*logit. */
int tide_cands_entropy(tide_cands *c, double *out);

/* Reorder so that positions [0, min(m, n)) hold the best candidates in
 * canonical order; the others follow in their previous relative order.
 * m >= n (or m < 0) sorts everything. sorted = min(m, n). */
int tide_cands_sort(tide_cands *c, int64_t m);
/* Keep positions [0, m) (clamped to n); the caller chose them. */
int tide_cands_truncate(tide_cands *c, int64_t m);
/* Keep the k best, in canonical order (sorted = k). k <= 0 or k >= n: no
 * change (llama.cpp's top-k, which sorts when k >= n; the set is the same). */
int tide_cands_top_k(tide_cands *c, int64_t k);
/* Nucleus (top-p): keep the smallest set of best candidates whose
 * probability reaches p (sum in double, >= p), and at least min_keep.
 * p >= 1: no change. The kept set is the best L candidates; when they were
 * found among the 256 best, they come out in canonical order (sorted = L),
 * else in their previous relative order. */
int tide_cands_top_p(tide_cands *c, double p, int64_t min_keep);
/* Min-p: keep candidates whose probability is at least p times the largest
 * (logit >= max + logf(p)), at least max(min_keep, 1) of them (the best).
 * p <= 0: no change. */
int tide_cands_min_p(tide_cands *c, double p, int64_t min_keep);
/* Keep candidates with logit >= min_logit, but at least max(min_keep, 1)
 * (the best). The primitive behind min-p and mirostat v2. */
int tide_cands_cut(tide_cands *c, double min_logit, int64_t min_keep);
/* Locally typical sampling (Meister et al. 2023, as llama.cpp): order by
 * |-log p - H| ascending (ties: the smaller id), keep the shortest such
 * prefix whose mass exceeds p (strictly), at least min_keep. p >= 1: no
 * change. Kept candidates stay in their previous relative order. */
int tide_cands_typical(tide_cands *c, double p, int64_t min_keep);
/* Top-n-sigma (Tang et al. 2024, as llama.cpp): over the finite logits,
 * keep logit >= max - nsigma * std (population std). nsigma <= 0 or n <= 1:
 * no change. Dropped candidates leave the set (llama.cpp sets them to -inf:
 * same distribution). */
int tide_cands_top_n_sigma(tide_cands *c, double nsigma);
/* XTC, "exclude top choices" (as llama.cpp, once the caller's coin said
 * yes): if at least two candidates have probability >= threshold, remove
 * all of them but the least likely, provided min_keep remain. threshold >
 * 0.5 or n < 2: no change. */
int tide_cands_xtc(tide_cands *c, double threshold, int64_t min_keep);
/* Temperature: t > 0 divides every logit by t; t <= 0 keeps only the best
 * candidate (greedy), and so does 0 < t < 1e-30, where dividing could
 * overflow to +inf. t must not be NaN or inf. */
int tide_cands_temperature(tide_cands *c, double t);
/* Logit bias: logit(ids[j]) += bias[j] for each j < m that is a candidate
 * (duplicates add up). bias may be -inf (ban), not NaN or +inf. */
int tide_cands_bias(tide_cands *c, const int32_t *ids, const float *bias, int64_t m);

/* Choose: the best candidate (ties: smaller id). Returns its position
 * (>= 0) and sets c->selected, or a negative status. */
int tide_cands_argmax(tide_cands *c);
/* Choose by drawing from softmax(logit[0..n)) with one tide_rng_uniform:
 * the position whose running mass (double, summed in blocks of 64 in
 * position order) first exceeds u * total. Candidates with probability 0
 * are never drawn. Returns the position and sets c->selected. */
int tide_cands_draw(tide_cands *c, tide_rng *r);
/* Position of `token`, or -1 if it is not a candidate (not a status: no
 * error is recorded). O(1) while the set is a whole loaded row. */
int tide_cands_find(const tide_cands *c, int64_t token);
/* The m best candidates of softmax(logit[0..n)) without reordering: ids and
 * logprobs (logit - lse) into the caller's arrays [m], best first. Returns
 * the count written, min(m, n). */
int tide_cands_topn(tide_cands *c, int64_t m, int32_t *ids, float *logprobs);

/* Trace of one stage, between tide_cands_trace_begin and _end. */
typedef struct tide_cands_trace {
  int64_t n_in;       /* candidates before the stage */
  int64_t n_out;      /* candidates after it */
  double mass_in;     /* probability the kept ids had in the stage's input distribution */
  double mass_raw;    /* probability the kept ids had in the raw row (needs a TIDE_CANDS_TRACE load) */
  double entropy;     /* entropy (nats) of the distribution after the stage */
} tide_cands_trace;
/* Remember the input distribution of the stage about to run (computes the
 * softmax of the current set). */
int tide_cands_trace_begin(tide_cands *c);
/* Fill *out for the stage that ran since trace_begin; the stage must only
 * have removed or re-weighted candidates (ids not in the input count 0). */
int tide_cands_trace_end(tide_cands *c, tide_cands_trace *out);

/* ---- token histories --------------------------------------------------------
 * The recent tokens of a request, oldest to newest, in a window of `window`
 * tokens (window < 0: every token; 0: nothing is kept). With counts = 1 the
 * history also keeps the number of times each token occurs in the window,
 * updated as tokens enter and leave (what penalties read). */
typedef struct tide_hist tide_hist;   /* opaque */

int tide_hist_new(tide_hist **out, int64_t window, int counts);
void tide_hist_free(tide_hist *h);    /* NULL-safe */
/* Append tokens[0..n) (each >= 0), oldest first; the oldest leave the window. */
int tide_hist_push(tide_hist *h, const int32_t *tokens, int64_t n);
void tide_hist_clear(tide_hist *h);
/* Tokens in the window. */
int64_t tide_hist_len(const tide_hist *h);
/* The window size given at creation. */
int64_t tide_hist_window(const tide_hist *h);
/* The token `back` steps from the newest (0 = newest), -1 if out of range. */
int64_t tide_hist_get(const tide_hist *h, int64_t back);
/* Occurrences of `token` in the window (needs counts = 1, else 0). */
int64_t tide_hist_count(const tide_hist *h, int64_t token);
/* Copy the window oldest first into out[0..max); returns the number of
 * tokens copied (the newest min(len, max)). */
int64_t tide_hist_read(const tide_hist *h, int32_t *out, int64_t max);
/* Replace dst's content by the newest tokens of src that fit its window. */
int tide_hist_assign(tide_hist *dst, const tide_hist *src);

/* Repetition penalties over a history with counts (llama.cpp semantics): for
 * each candidate whose token occurs c > 0 times in the window, logit is
 * divided by `repeat` if positive, multiplied by it otherwise, then
 * decreased by c * freq + present. repeat = 1, freq = present = 0: no change. */
int tide_cands_penalties(tide_cands *c, const tide_hist *h, double repeat, double freq,
                         double present);

/* ---- DRY ("don't repeat yourself", as llama.cpp / koboldcpp) ----------------
 * Sequence breakers, as token sequences: a head token and a tail of up to 20
 * tokens (longer tails are cut). A repetition never extends across the last
 * breaker in the history, and a candidate that is a one-token breaker is
 * never penalised. */
typedef struct tide_dry tide_dry;   /* opaque */

int tide_dry_new(tide_dry **out);
void tide_dry_free(tide_dry *d);     /* NULL-safe */
/* Add the breaker seq[0..len) (len >= 1; duplicates are ignored). */
int tide_dry_add_breaker(tide_dry *d, const int32_t *seq, int64_t len);
int64_t tide_dry_count(const tide_dry *d);
/* DRY penalty: over the last last_n tokens of h (last_n < 0: all), for each
 * token that would extend a repetition of the history's suffix of length
 * L >= allowed_length (L limited by the last breaker), logit -= multiplier *
 * base^(L - allowed_length) (exponent capped so the power stays finite).
 * d may be NULL (no breakers). multiplier = 0, base < 1 or last_n = 0: no
 * change. */
int tide_cands_dry(tide_cands *c, const tide_dry *d, const tide_hist *h, double multiplier,
                   double base, int64_t allowed_length, int64_t last_n);

/* ---- logprobs of a logits row (scoring) -------------------------------------
 * For a row straight from the model (no sampling stages): the logprob and
 * rank of one token and the n_top best tokens. The caller owns the arrays. */
typedef struct tide_logprobs {
  int64_t target;          /* in: token to score, or -1 for none */
  int64_t n_top;           /* in: how many best tokens to return (0 = none) */
  int32_t *top_ids;        /* in: caller's array [n_top] (may be NULL when n_top = 0) */
  float *top_logprobs;     /* in: caller's array [n_top] */
  int64_t n_out;           /* out: entries written, min(n_top, V) */
  int64_t target_rank;     /* out: candidates before target in canonical order (0 = best) */
  double target_logprob;   /* out: row[target] - lse */
  double lse;              /* out: log-sum-exp of the row */
} tide_logprobs;
/* logits: f32 [V] or [1, V], last dim contiguous; NaN or +inf fail. */
int tide_logits_logprobs(const tide_tensor *logits, tide_logprobs *io);

/* ---- small utilities for sampler files ------------------------------------ */
/* Modification time (ns since the epoch) and size of a file, for hot reload.
 * TIDE_E_IO if it cannot be stat'ed. */
int tide_file_stamp(const char *path, int64_t *mtime_ns, int64_t *size);
/* FNV-1a 64-bit hash of n bytes (names a sampler file's content in logs). */
uint64_t tide_hash64(const void *data, int64_t n);
