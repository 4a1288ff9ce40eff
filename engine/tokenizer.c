/* tokenizer.c - the encode pipeline (invalid UTF-8 repair, added tokens,
 * normalizers, pre-tokenizers, BPE), decoding, streaming detokenisation and
 * the small public accessors. Pieces flow depth-first through the
 * pre-tokenizer stages, so memory stays proportional to one piece, not to the
 * input: a 100 MB text needs no 100 MB list of pieces. */
#include <stdlib.h>

#include "tokenizer_internal.h"

/* ---- workspaces ---- */
int tok_ws_init(const tide_tokenizer *tok, tok_ws *ws, int with_cache) {
  memset(ws, 0, sizeof *ws);
  if (with_cache) {
    TIDE_CHECK(tok_cache_init(&ws->cache, 1u << 16));
    ws->has_cache = 1;
  }
  (void)tok;
  return TIDE_OK;
}

void tok_ws_free(tok_ws *ws) {
  for (int i = 0; i < TOK_MAX_STAGES + 2; i++) pcre2_match_data_free(ws->md[i]);
  tide_xfree(ws->clean);
  tide_xfree(ws->norm);
  tide_xfree(ws->norm2);
  for (int i = 0; i < TOK_MAX_STAGES; i++) tide_xfree(ws->stage[i]);
  tok_bpe_scratch_free(&ws->bpe);
  tok_cache_free(&ws->cache);
  memset(ws, 0, sizeof *ws);
}

static pcre2_match_data *ws_md(tok_ws *ws, int i) {
  if (!ws->md[i]) ws->md[i] = pcre2_match_data_create(8, tok_pcre_gctx());
  return ws->md[i];
}

/* Take the tokenizer's own workspace if no other thread holds it, else set
 * up a private one (no cache) for this call. */
static tok_ws *ws_acquire(const tide_tokenizer *tok, tok_ws *priv, int *is_priv) {
  tide_tokenizer *t = (tide_tokenizer *)tok; /* the workspace is the one mutable part */
  int expect = 0;
  if (__atomic_compare_exchange_n(&t->ws_busy, &expect, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
    *is_priv = 0;
    return &t->ws;
  }
  *is_priv = 1;
  tok_ws_init(tok, priv, 0);
  return priv;
}

static void ws_release(const tide_tokenizer *tok, tok_ws *ws, int is_priv) {
  if (is_priv) {
    tok_ws_free(ws);
    return;
  }
  __atomic_store_n(&((tide_tokenizer *)tok)->ws_busy, 0, __ATOMIC_RELEASE);
}

static int regex_fail(int rc) {
  PCRE2_UCHAR msg[160];
  pcre2_get_error_message(rc, msg, sizeof msg);
  return TIDE_ERR(TIDE_E_INTERNAL, "regex match failed: %s (%d)", (const char *)msg, rc);
}

/* Length of the White_Space char at p, or 0. */
static int space_at(const tide_tokenizer *tok, tok_ws *ws, const char *p, size_t n) {
  unsigned char c = (unsigned char)p[0];
  if (c < 0x80) return (c == ' ' || (c >= 9 && c <= 13)) ? 1 : 0;
  int bad;
  int l = tok_utf8_char((const unsigned char *)p, n, &bad);
  if (!l) return 0;
  int rc = pcre2_match(tok->re_space, (PCRE2_SPTR)p, (size_t)l, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK,
                       ws_md(ws, TOK_MAX_STAGES + 1), NULL);
  return rc >= 0 ? l : 0;
}

/* Start of the UTF-8 char that ends at p + end. */
static size_t char_start_before(const char *p, size_t end) {
  size_t i = end - 1;
  while (i > 0 && ((unsigned char)p[i] & 0xC0) == 0x80 && end - i < 4) i--;
  return i;
}

static int word_at(const tide_tokenizer *tok, tok_ws *ws, const char *p, size_t n) {
  unsigned char c = (unsigned char)p[0];
  if (c < 0x80) return (c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'));
  int bad;
  int l = tok_utf8_char((const unsigned char *)p, n, &bad);
  if (!l) return 0;
  return pcre2_match(tok->re_word, (PCRE2_SPTR)p, (size_t)l, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK,
                     ws_md(ws, TOK_MAX_STAGES + 1), NULL) >= 0;
}

/* ---- normalizers ---- */
static int norm_replace_str(const tok_norm *nm, const char *s, size_t n, char **dst, size_t *cap, size_t *outn) {
  size_t grow = nm->blen > nm->alen ? nm->blen - nm->alen : 0;
  size_t worst = n + (grow ? (n / nm->alen + 1) * grow : 0);
  TIDE_CHECK(tok_grow(dst, cap, worst + 1));
  size_t o = 0, i = 0;
  while (i < n) {
    const char *hit = nm->alen <= n - i ? memmem(s + i, n - i, nm->a, nm->alen) : NULL;
    size_t upto = hit ? (size_t)(hit - s) : n;
    memcpy(*dst + o, s + i, upto - i);
    o += upto - i;
    if (!hit) break;
    memcpy(*dst + o, nm->b, nm->blen);
    o += nm->blen;
    i = upto + nm->alen;
  }
  *outn = o;
  return TIDE_OK;
}

static int norm_replace_re(tok_ws *ws, const tok_norm *nm, const char *s, size_t n, char **dst, size_t *cap,
                           size_t *outn) {
  pcre2_match_data *md = ws_md(ws, TOK_MAX_STAGES);
  if (!md) return TIDE_ERR(TIDE_E_NOMEM, "match data");
  size_t o = 0, prev = 0, off = 0;
  TIDE_CHECK(tok_grow(dst, cap, n + 1));
  while (off < n) {
    int rc = pcre2_match(nm->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return regex_fail(rc);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t ms = ov[0], me = ov[1];
    TIDE_CHECK(tok_grow(dst, cap, o + (ms - prev) + nm->blen + (n - me) + 1));
    memcpy(*dst + o, s + prev, ms - prev);
    o += ms - prev;
    memcpy(*dst + o, nm->b, nm->blen);
    o += nm->blen;
    prev = me;
    if (me == ms) { /* an empty match: keep the next char and move on */
      int bad;
      int l = ms < n ? tok_utf8_char((const unsigned char *)s + ms, n - ms, &bad) : 1;
      if (!l) l = bad;
      if (ms < n) {
        memcpy(*dst + o, s + ms, (size_t)l);
        o += (size_t)l;
      }
      prev = off = ms + (size_t)l;
    } else {
      off = me;
    }
  }
  if (prev < n) {
    TIDE_CHECK(tok_grow(dst, cap, o + (n - prev) + 1));
    memcpy(*dst + o, s + prev, n - prev);
    o += n - prev;
  }
  *outn = o;
  return TIDE_OK;
}

int tok_normalize(const tide_tokenizer *tok, tok_ws *ws, const char *src, size_t n, const char **out,
                  size_t *out_n) {
  const char *cur = src;
  size_t cn = n;
  int which = 0; /* ping-pong between norm and norm2 */
  for (int i = 0; i < tok->n_norms; i++) {
    const tok_norm *nm = &tok->norms[i];
    char **dst = which ? &ws->norm2 : &ws->norm;
    size_t *cap = which ? &ws->norm2_cap : &ws->norm_cap;
    size_t on = 0;
    switch (nm->kind) {
      case NORM_PREPEND:
        if (cn == 0) continue;
        TIDE_CHECK(tok_grow(dst, cap, cn + nm->alen + 1));
        memcpy(*dst, nm->a, nm->alen);
        memcpy(*dst + nm->alen, cur, cn);
        on = cn + nm->alen;
        break;
      case NORM_REPLACE_STR:
        TIDE_CHECK(norm_replace_str(nm, cur, cn, dst, cap, &on));
        break;
      case NORM_REPLACE_RE:
        TIDE_CHECK(norm_replace_re(ws, nm, cur, cn, dst, cap, &on));
        break;
      case NORM_STRIP: {
        size_t a = 0, b = cn;
        int l;
        if (nm->left)
          while (a < b && (l = space_at(tok, ws, cur + a, b - a)) > 0) a += (size_t)l;
        if (nm->right)
          while (b > a) {
            size_t cs = char_start_before(cur, b);
            if (cs < a || space_at(tok, ws, cur + cs, b - cs) != (int)(b - cs)) break;
            b = cs;
          }
        TIDE_CHECK(tok_grow(dst, cap, b - a + 1));
        memmove(*dst, cur + a, b - a);
        on = b - a;
        break;
      }
      default:
        return TIDE_ERR(TIDE_E_INTERNAL, "normalizer kind %d", nm->kind);
    }
    cur = *dst;
    cn = on;
    which ^= 1;
  }
  *out = cur;
  *out_n = cn;
  return TIDE_OK;
}

/* ---- the pre-tokenizer stages ---- */
typedef struct enc_ctx {
  const tide_tokenizer *tok;
  tok_ws *ws;
  tok_cache *cache;
  tide_tok_ids *out;
  int flags;
  void (*piece_cb)(void *ud, const char *p, size_t n); /* tests: see pieces instead of ids */
  void *piece_ud;
} enc_ctx;

static int run_pre(enc_ctx *c, int k, const char *p, size_t n, int at_start);

/* The split behaviours of tokenizers, applied to the stream of (range,
 * is_match) events a regex produces, holding at most one piece back. */
typedef struct splitter {
  enc_ctx *c;
  int k, behavior, at_start;
  const char *p;
  size_t ps, pe;
  int have, prev_match;
} splitter;

static inline int sp_emit(splitter *s, size_t a, size_t b) {
  if (b <= a) return TIDE_OK;
  return run_pre(s->c, s->k + 1, s->p + a, b - a, s->at_start && a == 0);
}

static int sp_event(splitter *s, size_t a, size_t b, int m) {
  int rc = TIDE_OK;
  switch (s->behavior) {
    case SPLIT_ISOLATED:
      return sp_emit(s, a, b);
    case SPLIT_REMOVED:
      return m ? TIDE_OK : sp_emit(s, a, b);
    case SPLIT_MERGED_PREV:
    case SPLIT_CONTIGUOUS: {
      int join = s->behavior == SPLIT_MERGED_PREV ? (m && !s->prev_match) : (m == s->prev_match);
      if (join && s->have) {
        s->pe = b;
      } else {
        if (s->have) rc = sp_emit(s, s->ps, s->pe);
        s->ps = a;
        s->pe = b;
        s->have = 1;
      }
      s->prev_match = m;
      return rc;
    }
    case SPLIT_MERGED_NEXT: /* a match joins the non-match after it */
      if (s->have) {
        if (!m) {
          s->have = 0;
          return sp_emit(s, s->ps, b);
        }
        rc = sp_emit(s, s->ps, s->pe);
        s->ps = a;
        s->pe = b;
        return rc;
      }
      if (m) {
        s->ps = a;
        s->pe = b;
        s->have = 1;
        return TIDE_OK;
      }
      return sp_emit(s, a, b);
  }
  return TIDE_ERR(TIDE_E_INTERNAL, "split behaviour %d", s->behavior);
}

static int split_stage(enc_ctx *c, int k, pcre2_code *re, int behavior, int invert, const char *p, size_t n,
                       int at_start) {
  pcre2_match_data *md = ws_md(c->ws, k);
  if (!md) return TIDE_ERR(TIDE_E_NOMEM, "match data");
  splitter s = {c, k, behavior, at_start, p, 0, 0, 0, 0};
  size_t prev = 0, off = 0;
  PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
  while (off < n) {
    int rc = pcre2_match(re, (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return regex_fail(rc);
    size_t ms = ov[0], me = ov[1];
    if (me == ms) { /* empty matches split nothing */
      int bad;
      int l = tok_utf8_char((const unsigned char *)p + ms, n - ms, &bad);
      off = ms + (size_t)(l ? l : bad);
      continue;
    }
    if (ms > prev) TIDE_CHECK(sp_event(&s, prev, ms, invert));
    TIDE_CHECK(sp_event(&s, ms, me, !invert));
    prev = off = me;
  }
  if (prev < n) TIDE_CHECK(sp_event(&s, prev, n, invert));
  if (s.have) TIDE_CHECK(sp_emit(&s, s.ps, s.pe));
  return TIDE_OK;
}

static int run_pre(enc_ctx *c, int k, const char *p, size_t n, int at_start) {
  const tide_tokenizer *tok = c->tok;
  if (k == tok->n_pres) {
    if (c->piece_cb) {
      c->piece_cb(c->piece_ud, p, n);
      return TIDE_OK;
    }
    return tok_bpe_word(&tok->bpe, &c->ws->bpe, c->cache, p, n, c->out);
  }
  const tok_pre *pre = &tok->pres[k];
  tok_ws *ws = c->ws;
  switch (pre->kind) {
    case PRE_SPLIT:
      return split_stage(c, k, pre->re, pre->behavior, pre->invert, p, n, at_start);
    case PRE_BYTELEVEL:
      if (pre->add_prefix_space && p[0] != ' ') {
        TIDE_CHECK(tok_grow(&ws->stage[k], &ws->stage_cap[k], n + 1));
        ws->stage[k][0] = ' ';
        memcpy(ws->stage[k] + 1, p, n);
        p = ws->stage[k];
        n++;
      }
      if (pre->re) return split_stage(c, k, pre->re, SPLIT_ISOLATED, 0, p, n, at_start);
      return run_pre(c, k + 1, p, n, at_start);
    case PRE_METASPACE: {
      size_t rl = (size_t)pre->repl_len;
      TIDE_CHECK(tok_grow(&ws->stage[k], &ws->stage_cap[k], n * rl + rl + 1));
      char *d = ws->stage[k];
      size_t o = 0;
      int starts = (p[0] == ' ') || (n >= rl && !memcmp(p, pre->repl, rl));
      if (!starts && (pre->prepend == PREPEND_ALWAYS || (pre->prepend == PREPEND_FIRST && at_start))) {
        memcpy(d, pre->repl, rl);
        o = rl;
      }
      for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
          memcpy(d + o, pre->repl, rl);
          o += rl;
        } else {
          d[o++] = p[i];
        }
      }
      if (pre->split) return split_stage(c, k, pre->re, SPLIT_MERGED_NEXT, 0, d, o, at_start);
      return run_pre(c, k + 1, d, o, at_start);
    }
  }
  return TIDE_ERR(TIDE_E_INTERNAL, "pre-tokenizer kind %d", pre->kind);
}

/* ---- added tokens ---- */
static int push_id(tide_tok_ids *o, int32_t id) {
  TIDE_CHECK(tok_ids_reserve(o, 1));
  o->ids[o->n++] = id;
  return TIDE_OK;
}

typedef int (*gap_fn)(enc_ctx *c, const char *p, size_t n, int at_start);

/* Split s at the added tokens of `trie` (leftmost-longest, then the
 * single_word / lstrip / rstrip rules of tokenizers' AddedVocabulary); gaps
 * go to `gap`, tokens straight to the output. */
static int split_added(enc_ctx *c, const tok_trie *trie, const char *s, size_t n, int at_start, gap_fn gap) {
  const tide_tokenizer *tok = c->tok;
  size_t done = 0, i = 0;
  while (i < n) {
    if (trie->first_only >= 0) { /* e.g. every special token starts with '<' */
      const char *hit = memchr(s + i, trie->first_only, n - i);
      if (!hit) break;
      i = (size_t)(hit - s);
    } else if (!trie->first[(unsigned char)s[i]]) {
      i++;
      continue;
    }
    size_t mlen = 0;
    int ti = tok_trie_longest(trie, (const unsigned char *)s + i, n - i, &mlen);
    if (ti < 0) {
      i++;
      continue;
    }
    const tok_added *a = &tok->added[ti];
    size_t start = i, stop = i + mlen;
    if ((c->flags & TIDE_TOK_SPLIT_SPECIAL) && a->special) {
      i = stop; /* matched, then ignored: it stays text */
      continue;
    }
    if (a->single_word) {
      int before = start > 0 && word_at(tok, c->ws, s + char_start_before(s, start), start - char_start_before(s, start));
      int after = stop < n && word_at(tok, c->ws, s + stop, n - stop);
      if (before || after) {
        i = stop;
        continue;
      }
    }
    if (a->lstrip) {
      while (start > done) {
        size_t cs = char_start_before(s, start);
        if (cs < done || space_at(tok, c->ws, s + cs, start - cs) != (int)(start - cs)) break;
        start = cs;
      }
    }
    if (a->rstrip) {
      int l;
      while (stop < n && (l = space_at(tok, c->ws, s + stop, n - stop)) > 0) stop += (size_t)l;
    }
    if (start > done) TIDE_CHECK(gap(c, s + done, start - done, at_start && done == 0));
    TIDE_CHECK(push_id(c->out, a->id));
    done = i = stop;
  }
  if (done < n) TIDE_CHECK(gap(c, s + done, n - done, at_start && done == 0));
  return TIDE_OK;
}

static int gap_pre(enc_ctx *c, const char *p, size_t n, int at_start) {
  if (n == 0) return TIDE_OK;
  return run_pre(c, 0, p, n, at_start);
}

/* A stretch between non-normalized added tokens: normalize it, then split
 * at normalized added tokens, then pre-tokenize. */
static int gap_segment(enc_ctx *c, const char *p, size_t n, int at_start) {
  const char *q;
  size_t qn;
  TIDE_CHECK(tok_normalize(c->tok, c->ws, p, n, &q, &qn));
  if (qn == 0) return TIDE_OK;
  if (c->tok->trie_norm.n_tokens) return split_added(c, &c->tok->trie_norm, q, qn, at_start, gap_pre);
  return run_pre(c, 0, q, qn, at_start);
}

/* Copy s with each maximal invalid UTF-8 subsequence replaced by U+FFFD. */
static int utf8_repair(const char *s, size_t n, size_t first_bad, char **dst, size_t *cap, size_t *outn) {
  TIDE_CHECK(tok_grow(dst, cap, n * 3 + 1));
  memcpy(*dst, s, first_bad);
  size_t o = first_bad, i = first_bad;
  const unsigned char *p = (const unsigned char *)s;
  while (i < n) {
    if (p[i] < 0x80) {
      (*dst)[o++] = (char)p[i++];
      continue;
    }
    int bad;
    int l = tok_utf8_char(p + i, n - i, &bad);
    if (l) {
      memcpy(*dst + o, s + i, (size_t)l);
      o += (size_t)l;
      i += (size_t)l;
    } else {
      memcpy(*dst + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i += (size_t)bad;
    }
  }
  *outn = o;
  return TIDE_OK;
}

static int encode(const tide_tokenizer *tok, const char *text, int64_t len, int flags, tide_tok_ids *out,
                  void (*piece_cb)(void *, const char *, size_t), void *ud) {
  if (!tok || !out) return TIDE_ERR(TIDE_E_INVALID, "tokenizer and out must not be NULL");
  if (len < 0 || (!text && len > 0)) return TIDE_ERR(TIDE_E_INVALID, "bad text (len %lld)", (long long)len);
  if (flags & ~(TIDE_TOK_ADD_SPECIAL | TIDE_TOK_SPLIT_SPECIAL | TIDE_TOK_NO_CACHE))
    return TIDE_ERR(TIDE_E_INVALID, "unknown encode flags 0x%x", (unsigned)flags);
  out->n = 0;
  tok_ws priv;
  int is_priv;
  tok_ws *ws = ws_acquire(tok, &priv, &is_priv);
  enc_ctx c = {tok, ws, (ws->has_cache && !(flags & TIDE_TOK_NO_CACHE)) ? &ws->cache : NULL, out, flags,
               piece_cb, ud};
  int rc = TIDE_OK;
  const char *s = text ? text : "";
  size_t n = (size_t)len;
  size_t ok = tok_utf8_valid_upto(s, n);
  if (ok < n) {
    rc = utf8_repair(s, n, ok, &ws->clean, &ws->clean_cap, &n);
    s = ws->clean;
  }
  if (rc == TIDE_OK && (flags & TIDE_TOK_ADD_SPECIAL)) {
    for (int i = 0; i < tok->n_prefix && rc == TIDE_OK; i++) rc = push_id(out, tok->prefix[i]);
  }
  if (rc == TIDE_OK && n > 0) {
    if (tok->trie_raw.n_tokens) rc = split_added(&c, &tok->trie_raw, s, n, 1, gap_segment);
    else rc = gap_segment(&c, s, n, 1);
  }
  if (rc == TIDE_OK && (flags & TIDE_TOK_ADD_SPECIAL)) {
    for (int i = 0; i < tok->n_suffix && rc == TIDE_OK; i++) rc = push_id(out, tok->suffix[i]);
  }
  ws_release(tok, ws, is_priv);
  if (rc) {
    out->n = 0;
    if (rc == TIDE_E_NOMEM && tide_last_status() != TIDE_E_NOMEM) TIDE_ERR(rc, "out of memory");
  }
  return rc;
}

int tide_tokenizer_encode(const tide_tokenizer *tok, const char *text, int64_t len, int flags, tide_tok_ids *out) {
  return encode(tok, text, len, flags, out, NULL, NULL);
}

int tok_pretokenize(const tide_tokenizer *tok, const char *text, size_t len, int flags,
                    void (*cb)(void *ud, const char *p, size_t n), void *ud, tide_tok_ids *added) {
  return encode(tok, text, (int64_t)len, flags, added, cb, ud);
}

/* ---- decoding ---- */
static int text_reserve(tide_tok_text *t, int64_t need) {
  if (need + 1 <= t->cap) return TIDE_OK;
  int64_t cap = t->cap ? t->cap : 256;
  while (cap < need + 1) cap *= 2;
  char *nd = tide_xrealloc(t->data, (size_t)cap);
  if (!nd) return TIDE_E_NOMEM;
  t->data = nd;
  t->cap = cap;
  return TIDE_OK;
}

void tide_tok_ids_free(tide_tok_ids *ids) {
  if (!ids) return;
  tide_xfree(ids->ids);
  memset(ids, 0, sizeof *ids);
}

void tide_tok_text_free(tide_tok_text *t) {
  if (!t) return;
  tide_xfree(t->data);
  memset(t, 0, sizeof *t);
}

static int id_ok(const tide_tokenizer *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids && tok->dec_len[id] != UINT32_MAX;
}

static const char CLEANUPS[][2][6] = {{" .", "."},     {" ?", "?"},     {" !", "!"},     {" ,", ","},
                                      {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"},   {" 's", "'s"},
                                      {" 've", "'ve"}, {" 're", "'re"}};

/* transformers' clean_up_tokenization: drop the space before some
 * punctuation and English contractions, in place. */
static size_t cleanup_spaces(char *s, size_t n) {
  for (size_t k = 0; k < sizeof CLEANUPS / sizeof CLEANUPS[0]; k++) {
    const char *a = CLEANUPS[k][0], *b = CLEANUPS[k][1];
    size_t al = strlen(a), bl = strlen(b), o = 0, i = 0;
    while (i < n) {
      if (i + al <= n && !memcmp(s + i, a, al)) {
        memmove(s + o, b, bl);
        o += bl;
        i += al;
      } else {
        s[o++] = s[i++];
      }
    }
    n = o;
  }
  return n;
}

int tide_tokenizer_decode(const tide_tokenizer *tok, const int32_t *ids, int64_t n, int flags, tide_tok_text *out) {
  if (!tok || !out || (n > 0 && !ids) || n < 0) return TIDE_ERR(TIDE_E_INVALID, "bad arguments (n %lld)", (long long)n);
  if (flags & ~(TIDE_TOK_SKIP_SPECIAL)) return TIDE_ERR(TIDE_E_INVALID, "unknown decode flags 0x%x", (unsigned)flags);
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!id_ok(tok, ids[i]))
      return TIDE_ERR(TIDE_E_RANGE, "id %d at position %lld is not a token (vocab size %d)", ids[i], (long long)i, tok->n_ids);
    total += tok->dec_len[ids[i]];
  }
  /* worst case: every byte invalid -> 3 bytes of U+FFFD */
  TIDE_CHECK(text_reserve(out, total * 4 + 4));
  char *raw = out->data + total * 3 + 3; /* assemble raw bytes at the back, repair to the front */
  int64_t r = 0;
  int first = 1;
  for (int64_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if ((flags & TIDE_TOK_SKIP_SPECIAL) && tok->id_special[id]) continue;
    const char *b = tok->strings + tok->dec_off[id];
    size_t l = tok->dec_len[id];
    if (first && tok->dec_first_strip && l > 0 && b[0] == ' ') {
      b++;
      l--;
    }
    first = 0;
    memcpy(raw + r, b, l);
    r += (int64_t)l;
  }
  size_t o;
  size_t ok = tok_utf8_valid_upto(raw, (size_t)r);
  if (ok == (size_t)r) {
    memmove(out->data, raw, (size_t)r);
    o = (size_t)r;
  } else {
    /* in place from back to front is unsafe; the repair writes at most
     * 3 bytes per input byte, and raw starts 3*total+3 bytes in */
    char *dst = out->data;
    const unsigned char *p = (const unsigned char *)raw;
    size_t i = 0;
    o = 0;
    while (i < (size_t)r) {
      int bad;
      int l = tok_utf8_char(p + i, (size_t)r - i, &bad);
      if (l) {
        memmove(dst + o, raw + i, (size_t)l);
        o += (size_t)l;
        i += (size_t)l;
      } else {
        memcpy(dst + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += (size_t)bad;
      }
    }
  }
  char *d = out->data;
  if (tok->strip_char_len) {
    size_t cl = (size_t)tok->strip_char_len, a = 0;
    for (int k = 0; k < tok->strip_start && a + cl <= o && !memcmp(d + a, tok->strip_char, cl); k++) a += cl;
    for (int k = 0; k < tok->strip_stop && o >= a + cl && !memcmp(d + o - cl, tok->strip_char, cl); k++) o -= cl;
    memmove(d, d + a, o - a);
    o -= a;
  }
  if (tok->cleanup_spaces) o = cleanup_spaces(d, o);
  d[o] = 0;
  out->len = (int64_t)o;
  return TIDE_OK;
}

/* ---- streaming ---- */
struct tide_tok_streamer {
  const tide_tokenizer *tok;
  int flags;
  int started;             /* a non-skipped token was seen (first-token rules done) */
  int strip_left;          /* whole-text Strip: leading chars still to drop */
  unsigned char hold[4];   /* an incomplete UTF-8 char */
  int nhold;
  char *buf;
  size_t cap;
};

int tide_tok_streamer_new(tide_tok_streamer **out, const tide_tokenizer *tok, int flags) {
  if (!out || !tok) return TIDE_ERR(TIDE_E_INVALID, "out and tokenizer must not be NULL");
  if (flags & ~TIDE_TOK_SKIP_SPECIAL) return TIDE_ERR(TIDE_E_INVALID, "unknown streamer flags 0x%x", (unsigned)flags);
  tide_tok_streamer *s = tide_xcalloc(1, sizeof *s);
  if (!s) return TIDE_E_NOMEM;
  tide_tokenizer_retain(tok);
  s->tok = tok;
  s->flags = flags;
  s->strip_left = tok->strip_start;
  *out = s;
  return TIDE_OK;
}

void tide_tok_streamer_free(tide_tok_streamer *s) {
  if (!s) return;
  tide_tokenizer_free((tide_tokenizer *)s->tok);   /* the streamer's reference */
  tide_xfree(s->buf);
  tide_xfree(s);
}

void tide_tok_streamer_reset(tide_tok_streamer *s) {
  if (!s) return;
  s->started = 0;
  s->nhold = 0;
  s->strip_left = s->tok->strip_start;
}

int tide_tok_streamer_pending(const tide_tok_streamer *s) { return s ? s->nhold : 0; }

/* Append complete text from `in` (held bytes first) to s->buf; keep an
 * incomplete trailing char unless `final`. */
static int stream_feed(tide_tok_streamer *s, const char *in, size_t n, int final, size_t *outn) {
  size_t total = (size_t)s->nhold + n;
  TIDE_CHECK(tok_grow(&s->buf, &s->cap, total * 3 + 8));
  /* gather held + new bytes contiguously at the back of buf */
  char *src = s->buf + total * 2 + 4;
  memcpy(src, s->hold, (size_t)s->nhold);
  memcpy(src + s->nhold, in, n);
  const unsigned char *p = (const unsigned char *)src;
  size_t i = 0, o = 0;
  s->nhold = 0;
  while (i < total) {
    int bad;
    int l = tok_utf8_char(p + i, total - i, &bad);
    if (!l && !final && (size_t)bad == total - i) { /* a char still arriving */
      memcpy(s->hold, p + i, total - i);
      s->nhold = (int)(total - i);
      break;
    }
    const char *piece = l ? src + i : "\xEF\xBF\xBD";
    size_t pl = l ? (size_t)l : 3;
    i += l ? (size_t)l : (size_t)bad;
    if (s->strip_left > 0 && s->tok->strip_char_len == (int)pl && !memcmp(piece, s->tok->strip_char, pl)) {
      s->strip_left--;
      continue;
    }
    s->strip_left = 0;
    memmove(s->buf + o, piece, pl);
    o += pl;
  }
  s->buf[o] = 0;
  *outn = o;
  return TIDE_OK;
}

int tide_tok_streamer_put(tide_tok_streamer *s, int32_t id, const char **text, int64_t *len) {
  if (!s || !text || !len) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  const tide_tokenizer *tok = s->tok;
  if (!id_ok(tok, id)) return TIDE_ERR(TIDE_E_RANGE, "id %d is not a token (vocab size %d)", id, tok->n_ids);
  const char *b = tok->strings + tok->dec_off[id];
  size_t l = tok->dec_len[id];
  if ((s->flags & TIDE_TOK_SKIP_SPECIAL) && tok->id_special[id]) l = 0;
  else {
    if (!s->started && tok->dec_first_strip && l > 0 && b[0] == ' ') {
      b++;
      l--;
    }
    s->started = 1;
  }
  size_t o;
  TIDE_CHECK(stream_feed(s, b, l, 0, &o));
  *text = s->buf;
  *len = (int64_t)o;
  return TIDE_OK;
}

int tide_tok_streamer_flush(tide_tok_streamer *s, const char **text, int64_t *len) {
  if (!s || !text || !len) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  size_t o;
  TIDE_CHECK(stream_feed(s, "", 0, 1, &o));
  *text = s->buf;
  *len = (int64_t)o;
  tide_tok_streamer_reset(s);
  return TIDE_OK;
}

/* ---- accessors ---- */
int64_t tide_tokenizer_vocab_size(const tide_tokenizer *tok) { return tok ? tok->n_ids : 0; }

int32_t tide_tokenizer_token_to_id(const tide_tokenizer *tok, const char *token, int64_t len) {
  if (!tok || !token) return -1;
  return tok_map_get(&tok->text_map, token, len < 0 ? strlen(token) : (size_t)len);
}

int tide_tokenizer_id_to_token(const tide_tokenizer *tok, int32_t id, const char **text, int64_t *len) {
  if (!tok || !text || !len) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  if (!id_ok(tok, id)) return TIDE_ERR(TIDE_E_RANGE, "id %d is not a token (vocab size %d)", id, tok->n_ids);
  *text = tok->strings + tok->text_off[id];
  *len = tok->text_len[id];
  return TIDE_OK;
}

int tide_tokenizer_id_to_bytes(const tide_tokenizer *tok, int32_t id, const char **bytes, int64_t *len) {
  if (!tok || !bytes || !len) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  if (!id_ok(tok, id)) return TIDE_ERR(TIDE_E_RANGE, "id %d is not a token (vocab size %d)", id, tok->n_ids);
  *bytes = tok->strings + tok->dec_off[id];
  *len = tok->dec_len[id];
  return TIDE_OK;
}

int32_t tide_tokenizer_special_id(const tide_tokenizer *tok, int which) {
  if (!tok) return -1;
  switch (which) {
    case TIDE_TOK_BOS: return tok->bos_id;
    case TIDE_TOK_EOS: return tok->eos_id;
    case TIDE_TOK_PAD: return tok->pad_id;
    case TIDE_TOK_UNK: return tok->unk_id;
  }
  return -1;
}

int tide_tokenizer_is_special(const tide_tokenizer *tok, int32_t id) {
  return tok && id >= 0 && id < tok->n_ids && tok->id_special[id];
}

int tide_tokenizer_adds_bos(const tide_tokenizer *tok) { return tok ? tok->adds_bos : 0; }
int tide_tokenizer_adds_eos(const tide_tokenizer *tok) { return tok ? tok->adds_eos : 0; }
const char *tide_tokenizer_chat_template(const tide_tokenizer *tok) { return tok ? tok->chat_template : ""; }
const char *tide_tokenizer_describe(const tide_tokenizer *tok) { return tok ? tok->describe : ""; }

void tide_tokenizer_cache_stats(const tide_tokenizer *tok, int64_t *hits, int64_t *misses) {
  if (hits) *hits = tok ? tok->ws.cache.hits : 0;
  if (misses) *misses = tok ? tok->ws.cache.misses : 0;
}
