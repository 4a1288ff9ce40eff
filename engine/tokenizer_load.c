/* tokenizer_load.c - read tokenizer.json (+ tokenizer_config.json) into the
 * tables of tokenizer_internal.h. Every rejection names the file and the JSON
 * field, so a user with an unusual tokenizer knows what tide lacks. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "tokenizer_internal.h"

/* ---- PCRE2 with tide's counted allocator ----
 * Compiled patterns and match data go through tide_xmalloc, so the leak
 * counters see them. The general context itself lives as long as the
 * process (like a static) and comes from plain malloc, so it never shows up
 * as a leak. */
static _Thread_local int tl_making_ctx;
static pcre2_general_context *g_ctx;
static pthread_once_t g_ctx_once = PTHREAD_ONCE_INIT;

static void *pcre_alloc(size_t n, void *data) {
  (void)data;
  return tl_making_ctx ? malloc(n) : tide_xmalloc(n);
}
static void pcre_free(void *p, void *data) {
  (void)data;
  tide_xfree(p); /* the context is never freed, so p is always counted */
}
static void make_ctx(void) {
  tl_making_ctx = 1;
  g_ctx = pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
  tl_making_ctx = 0;
}
pcre2_general_context *tok_pcre_gctx(void) {
  pthread_once(&g_ctx_once, make_ctx);
  return g_ctx;
}

pcre2_code *tok_regex_compile(const char *pat, size_t n, int literal, char *err, size_t errn) {
  int ec;
  PCRE2_SIZE eo;
  pcre2_compile_context *cc = pcre2_compile_context_create(tok_pcre_gctx());
  uint32_t opts = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, n, opts, &ec, &eo, cc);
  pcre2_compile_context_free(cc);
  if (!re) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(ec, msg, sizeof msg);
    snprintf(err, errn, "%s at offset %zu", (const char *)msg, (size_t)eo);
    return NULL;
  }
  /* JIT makes the splits several times faster; the interpreter is the
   * fallback where JIT is unavailable */
  (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  return re;
}

/* ---- small helpers ---- */
int tok_grow(char **buf, size_t *cap, size_t need) {
  if (need <= *cap) return TIDE_OK;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  char *nb = tide_xrealloc(*buf, c);
  if (!nb) return TIDE_E_NOMEM;
  *buf = nb;
  *cap = c;
  return TIDE_OK;
}

/* Append bytes to tok->strings; returns the offset or UINT32_MAX. s may
 * point into tok->strings itself (a normalizer that changes nothing hands
 * back its input): it is re-based after the buffer grows, since growing may
 * move it (found by fuzz/tokenizer_load). */
static uint32_t add_string(tide_tokenizer *t, const char *s, size_t n) {
  if (t->strings_len + n + 1 > UINT32_MAX - 1) return UINT32_MAX;
  uintptr_t base = (uintptr_t)t->strings, at = (uintptr_t)s;
  int inside = t->strings && at >= base && at < base + t->strings_len;
  size_t rel = inside ? (size_t)(at - base) : 0;
  if (tok_grow(&t->strings, &t->strings_cap, t->strings_len + n + 1)) return UINT32_MAX;
  if (inside) s = t->strings + rel;
  uint32_t off = (uint32_t)t->strings_len;
  memcpy(t->strings + off, s, n);
  t->strings[off + n] = 0;
  t->strings_len += n + 1;
  return off;
}

static char *read_file(const char *path, size_t *len, int *missing) {
  *missing = 0;
  FILE *f = fopen(path, "rb");
  if (!f) {
    *missing = (errno == ENOENT);
    TIDE_ERR(TIDE_E_IO, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    TIDE_ERR(TIDE_E_IO, "cannot read %s", path);
    return NULL;
  }
  long sz = ftell(f);
  rewind(f);
  char *buf = sz >= 0 ? tide_xmalloc((size_t)sz + 1) : NULL;
  if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
    fclose(f);
    tide_xfree(buf);
    TIDE_ERR(TIDE_E_IO, "cannot read %s", path);
    return NULL;
  }
  fclose(f);
  buf[sz] = 0;
  *len = (size_t)sz;
  return buf;
}

static cJSON *parse_json(const char *path, const char *text, size_t len) {
  const char *end = NULL;
  cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!j) {
    size_t off = end ? (size_t)(end - text) : 0;
    if (off > len) off = len;
    int line = 1;
    for (size_t i = 0; i < off; i++) line += text[i] == '\n';
    TIDE_ERR(TIDE_E_FORMAT, "%s: malformed JSON near byte %zu (line %d)", path, off, line);
  }
  return j;
}

#define FIELD_ERR(st, ...) TIDE_ERR((st), __VA_ARGS__)

static const cJSON *get(const cJSON *o, const char *k) {
  return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}
static int get_bool(const cJSON *o, const char *k, int dflt) {
  const cJSON *v = get(o, k);
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  return dflt;
}
static const char *get_str(const cJSON *o, const char *k) {
  const cJSON *v = get(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- GPT-2 byte-level alphabet ---- */
/* Bytes that print as themselves keep their code point; the others
 * (controls, space, 127..160, 173) are shifted to 256, 257, ... in order. */
static void bytelevel_tables(uint32_t byte_to_cp[256], int16_t cp_to_byte[512]) {
  for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
  int next = 256;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)next++;
    cp_to_byte[byte_to_cp[b]] = (int16_t)b;
  }
}

/* Decode a byte-level token text into raw bytes (out must hold n bytes).
 * Returns the byte count, or -1 if a char is outside the alphabet. */
static long bytelevel_decode(const int16_t cp_to_byte[512], const char *s, size_t n, char *out) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  long k = 0;
  while (i < n) {
    uint32_t cp;
    int l;
    if (p[i] < 0x80) {
      cp = p[i];
      l = 1;
    } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n) {
      cp = ((uint32_t)(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F);
      l = 2;
    } else {
      return -1; /* the alphabet lies below U+0200: 1 or 2 bytes */
    }
    if (cp >= 512 || cp_to_byte[cp] < 0) return -1;
    out[k++] = (char)cp_to_byte[cp];
    i += (size_t)l;
  }
  return k;
}

/* ---- the trie of added tokens ---- */
int tok_trie_add(tok_trie *t, const char *s, size_t n, int token) {
  if (n == 0) return TIDE_OK;
  if (t->n == 0) {
    t->cap = 256;
    t->nodes = tide_xmalloc(sizeof(tok_trie_node) * (size_t)t->cap);
    if (!t->nodes) return TIDE_E_NOMEM;
    t->nodes[0] = (tok_trie_node){-1, -1, -1, 0};
    t->n = 1;
  }
  int32_t cur = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t b = (uint8_t)s[i];
    int32_t c = t->nodes[cur].child;
    while (c >= 0 && t->nodes[c].byte != b) c = t->nodes[c].sibling;
    if (c < 0) {
      if (t->n == t->cap) {
        tok_trie_node *nn = tide_xrealloc(t->nodes, sizeof(tok_trie_node) * (size_t)t->cap * 2);
        if (!nn) return TIDE_E_NOMEM;
        t->nodes = nn;
        t->cap *= 2;
      }
      c = t->n++;
      t->nodes[c] = (tok_trie_node){-1, t->nodes[cur].child, -1, b};
      t->nodes[cur].child = c;
    }
    cur = c;
  }
  /* the first token with a given content wins, like a map keyed by content */
  if (t->nodes[cur].token < 0) {
    t->nodes[cur].token = token;
    t->n_tokens++;
  }
  t->first[(uint8_t)s[0]] = 1;
  int nfirst = 0, last = -1;
  for (int b = 0; b < 256; b++)
    if (t->first[b]) {
      nfirst++;
      last = b;
    }
  t->first_only = nfirst == 1 ? last : -1;
  return TIDE_OK;
}

int tok_trie_longest(const tok_trie *t, const unsigned char *p, size_t n, size_t *len) {
  int best = -1;
  int32_t cur = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t c = t->nodes[cur].child;
    while (c >= 0 && t->nodes[c].byte != p[i]) c = t->nodes[c].sibling;
    if (c < 0) break;
    cur = c;
    if (t->nodes[cur].token >= 0) {
      best = t->nodes[cur].token;
      *len = i + 1;
    }
  }
  return best;
}

/* ---- components ---- */
typedef struct load_ctx {
  tide_tokenizer *t;
  const char *path;       /* tokenizer.json, for messages */
  int has_bytelevel_pre;
} load_ctx;

static int compile_pattern(load_ctx *L, const cJSON *pat, const char *field, pcre2_code **out) {
  const char *s = get_str(pat, "Regex");
  int literal = 0;
  if (!s) {
    s = get_str(pat, "String");
    literal = 1;
  }
  if (!s) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s' needs {\"Regex\": ...} or {\"String\": ...}", L->path, field);
  char err[200];
  *out = tok_regex_compile(s, strlen(s), literal, err, sizeof err);
  if (!*out) return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': regex /%s/ rejected by PCRE2: %s", L->path, field, s, err);
  return TIDE_OK;
}

static int dup_str(const char *s, char **out, size_t *n) {
  *n = strlen(s);
  *out = tide_xmalloc(*n + 1);
  if (!*out) return TIDE_E_NOMEM;
  memcpy(*out, s, *n + 1);
  return TIDE_OK;
}

static int parse_normalizer(load_ctx *L, const cJSON *n, const char *field) {
  tide_tokenizer *t = L->t;
  if (!n || cJSON_IsNull(n)) return TIDE_OK;
  const char *type = get_str(n, "type");
  if (!type) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.type' missing", L->path, field);
  char sub[160];
  if (!strcmp(type, "Sequence")) {
    const cJSON *arr = get(n, "normalizers");
    if (!cJSON_IsArray(arr)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.normalizers' must be an array", L->path, field);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
      snprintf(sub, sizeof sub, "%s.normalizers[%d]", field, i++);
      TIDE_CHECK(parse_normalizer(L, e, sub));
    }
    return TIDE_OK;
  }
  if (t->n_norms == TOK_MAX_STAGES) return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': more than %d normalizers", L->path, field, TOK_MAX_STAGES);
  tok_norm *nm = &t->norms[t->n_norms];
  memset(nm, 0, sizeof *nm);
  if (!strcmp(type, "Prepend")) {
    const char *s = get_str(n, "prepend");
    if (!s) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.prepend' must be a string", L->path, field);
    nm->kind = NORM_PREPEND;
    TIDE_CHECK(dup_str(s, &nm->a, &nm->alen));
  } else if (!strcmp(type, "Replace")) {
    const char *c = get_str(n, "content");
    const cJSON *pat = get(n, "pattern");
    if (!c) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.content' must be a string", L->path, field);
    const char *ps = get_str(pat, "String");
    TIDE_CHECK(dup_str(c, &nm->b, &nm->blen));
    if (ps) {
      nm->kind = NORM_REPLACE_STR;
      TIDE_CHECK(dup_str(ps, &nm->a, &nm->alen));
      if (nm->alen == 0) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.pattern.String' is empty", L->path, field);
    } else {
      nm->kind = NORM_REPLACE_RE;
      snprintf(sub, sizeof sub, "%s.pattern", field);
      TIDE_CHECK(compile_pattern(L, pat, sub, &nm->re));
    }
  } else if (!strcmp(type, "Strip")) {
    nm->kind = NORM_STRIP;
    nm->left = get_bool(n, "strip_left", 1);
    nm->right = get_bool(n, "strip_right", 1);
  } else {
    return FIELD_ERR(TIDE_E_UNSUPPORTED,
                     "%s: field '%s.type': normalizer '%s' is not supported (tide has Sequence, Prepend, Replace, Strip)",
                     L->path, field, type);
  }
  t->n_norms++;
  return TIDE_OK;
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* ASCII punctuation (Rust's is_ascii_punctuation) or Unicode P*. */
static const char PUNCT_PATTERN[] = "[\\p{P}!-/:-@\\[-`{-~]";

static int add_builtin_split(load_ctx *L, const char *name, const char *pat, int behavior, int invert,
                             const char *field) {
  tide_tokenizer *t = L->t;
  if (t->n_pres == TOK_MAX_STAGES) return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': too many pre-tokenizers", L->path, field);
  tok_pre *p = &t->pres[t->n_pres];
  memset(p, 0, sizeof *p);
  char err[200];
  p->kind = PRE_SPLIT;
  p->name = name;
  p->behavior = behavior;
  p->invert = invert;
  p->re = tok_regex_compile(pat, strlen(pat), 0, err, sizeof err);
  if (!p->re) return FIELD_ERR(TIDE_E_INTERNAL, "built-in pattern for %s: %s", name, err);
  t->n_pres++;
  return TIDE_OK;
}

static int parse_behavior(load_ctx *L, const cJSON *n, const char *field, int dflt, int *out) {
  const char *b = get_str(n, "behavior");
  if (!b) {
    *out = dflt;
    return TIDE_OK;
  }
  if (!strcmp(b, "Removed")) *out = SPLIT_REMOVED;
  else if (!strcmp(b, "Isolated")) *out = SPLIT_ISOLATED;
  else if (!strcmp(b, "MergedWithPrevious")) *out = SPLIT_MERGED_PREV;
  else if (!strcmp(b, "MergedWithNext")) *out = SPLIT_MERGED_NEXT;
  else if (!strcmp(b, "Contiguous")) *out = SPLIT_CONTIGUOUS;
  else return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.behavior': unknown value '%s'", L->path, field, b);
  return TIDE_OK;
}

static int parse_pretok(load_ctx *L, const cJSON *n, const char *field) {
  tide_tokenizer *t = L->t;
  if (!n || cJSON_IsNull(n)) return TIDE_OK;
  const char *type = get_str(n, "type");
  if (!type) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.type' missing", L->path, field);
  char sub[160];
  if (L->has_bytelevel_pre)
    return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': a pre-tokenizer after ByteLevel is not supported", L->path, field);
  if (!strcmp(type, "Sequence")) {
    const cJSON *arr = get(n, "pretokenizers");
    if (!cJSON_IsArray(arr)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.pretokenizers' must be an array", L->path, field);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
      snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", field, i++);
      TIDE_CHECK(parse_pretok(L, e, sub));
    }
    return TIDE_OK;
  }
  if (!strcmp(type, "Whitespace")) return add_builtin_split(L, "Whitespace", "\\w+|[^\\w\\s]+", SPLIT_REMOVED, 1, field);
  if (!strcmp(type, "WhitespaceSplit")) return add_builtin_split(L, "WhitespaceSplit", "\\s+", SPLIT_REMOVED, 0, field);
  if (!strcmp(type, "Digits"))
    return add_builtin_split(L, "Digits", get_bool(n, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+", SPLIT_ISOLATED, 0, field);
  if (!strcmp(type, "Punctuation")) {
    int beh;
    TIDE_CHECK(parse_behavior(L, n, field, SPLIT_ISOLATED, &beh));
    return add_builtin_split(L, "Punctuation", PUNCT_PATTERN, beh, 0, field);
  }
  if (!strcmp(type, "BertPreTokenizer")) {
    TIDE_CHECK(add_builtin_split(L, "BertPreTokenizer", "\\s+", SPLIT_REMOVED, 0, field));
    return add_builtin_split(L, "BertPreTokenizer", PUNCT_PATTERN, SPLIT_ISOLATED, 0, field);
  }
  if (t->n_pres == TOK_MAX_STAGES) return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': too many pre-tokenizers", L->path, field);
  tok_pre *p = &t->pres[t->n_pres];
  memset(p, 0, sizeof *p);
  if (!strcmp(type, "Split")) {
    p->kind = PRE_SPLIT;
    p->name = "Split";
    snprintf(sub, sizeof sub, "%s.pattern", field);
    /* the behavior first: a compiled pattern is only freed once counted in
     * n_pres (a bad behavior after it leaked it: found by fuzz_tokenizer_load) */
    TIDE_CHECK(parse_behavior(L, n, field, SPLIT_ISOLATED, &p->behavior));
    TIDE_CHECK(compile_pattern(L, get(n, "pattern"), sub, &p->re));
    p->invert = get_bool(n, "invert", 0);
  } else if (!strcmp(type, "ByteLevel")) {
    p->kind = PRE_BYTELEVEL;
    p->name = "ByteLevel";
    p->add_prefix_space = get_bool(n, "add_prefix_space", 1);
    if (get_bool(n, "use_regex", 1)) {
      char err[200];
      p->re = tok_regex_compile(GPT2_PATTERN, strlen(GPT2_PATTERN), 0, err, sizeof err);
      if (!p->re) return FIELD_ERR(TIDE_E_INTERNAL, "GPT-2 pattern: %s", err);
    }
    L->has_bytelevel_pre = 1;
  } else if (!strcmp(type, "Metaspace")) {
    p->kind = PRE_METASPACE;
    p->name = "Metaspace";
    const char *r = get_str(n, "replacement");
    if (!r || !*r || strlen(r) >= sizeof p->repl)
      return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.replacement' must be one character", L->path, field);
    p->repl_len = (int)strlen(r);
    memcpy(p->repl, r, (size_t)p->repl_len);
    const char *ps = get_str(n, "prepend_scheme");
    if (ps) {
      if (!strcmp(ps, "always")) p->prepend = PREPEND_ALWAYS;
      else if (!strcmp(ps, "first")) p->prepend = PREPEND_FIRST;
      else if (!strcmp(ps, "never")) p->prepend = PREPEND_NEVER;
      else return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.prepend_scheme': unknown value '%s'", L->path, field, ps);
    } else {
      p->prepend = get_bool(n, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    }
    p->split = get_bool(n, "split", 1);
    if (p->split) {
      char err[200];
      p->re = tok_regex_compile(p->repl, (size_t)p->repl_len, 1, err, sizeof err);
      if (!p->re) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.replacement': %s", L->path, field, err);
      p->behavior = SPLIT_MERGED_NEXT;
    }
  } else {
    return FIELD_ERR(TIDE_E_UNSUPPORTED,
                     "%s: field '%s.type': pre-tokenizer '%s' is not supported (tide has Sequence, Split, "
                     "ByteLevel, Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation, BertPreTokenizer)",
                     L->path, field, type);
  }
  t->n_pres++;
  return TIDE_OK;
}

/* ---- the decoder: per-token byte transforms, computed once per id ---- */
enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_METASPACE, DEC_STRIP };
typedef struct dec_step {
  int kind;
  char *a, *b;
  size_t alen, blen;
  int start, stop;
} dec_step;

typedef struct dec_plan {
  dec_step steps[TOK_MAX_STAGES];
  int n;
  int fused;
} dec_plan;

static void dec_plan_free(dec_plan *d) {
  for (int i = 0; i < d->n; i++) {
    tide_xfree(d->steps[i].a);
    tide_xfree(d->steps[i].b);
  }
}

static int parse_decoder(load_ctx *L, const cJSON *n, const char *field, dec_plan *d) {
  tide_tokenizer *t = L->t;
  if (!n || cJSON_IsNull(n)) return TIDE_OK;
  const char *type = get_str(n, "type");
  if (!type) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.type' missing", L->path, field);
  char sub[160];
  if (!strcmp(type, "Sequence")) {
    const cJSON *arr = get(n, "decoders");
    if (!cJSON_IsArray(arr)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.decoders' must be an array", L->path, field);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
      snprintf(sub, sizeof sub, "%s.decoders[%d]", field, i++);
      TIDE_CHECK(parse_decoder(L, e, sub, d));
    }
    return TIDE_OK;
  }
  if (!strcmp(type, "Fuse")) {
    d->fused = 1;
    return TIDE_OK;
  }
  if (d->n == TOK_MAX_STAGES) return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': too many decoders", L->path, field);
  dec_step *s = &d->steps[d->n];
  memset(s, 0, sizeof *s);
  if (!strcmp(type, "ByteLevel")) {
    s->kind = DEC_BYTELEVEL;
  } else if (!strcmp(type, "ByteFallback")) {
    s->kind = DEC_BYTEFALLBACK;
  } else if (!strcmp(type, "Replace")) {
    const char *ps = get_str(get(n, "pattern"), "String");
    const char *c = get_str(n, "content");
    if (!ps || !*ps || !c)
      return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': only Replace with a non-empty String pattern and a content string is supported", L->path, field);
    s->kind = DEC_REPLACE;
    TIDE_CHECK(dup_str(ps, &s->a, &s->alen));
    TIDE_CHECK(dup_str(c, &s->b, &s->blen));
  } else if (!strcmp(type, "Metaspace")) {
    const char *r = get_str(n, "replacement");
    if (!r || !*r) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.replacement' must be a string", L->path, field);
    s->kind = DEC_REPLACE;
    TIDE_CHECK(dup_str(r, &s->a, &s->alen));
    TIDE_CHECK(dup_str(" ", &s->b, &s->blen));
    const char *ps = get_str(n, "prepend_scheme");
    int prepend = ps ? strcmp(ps, "never") != 0 : get_bool(n, "add_prefix_space", 1);
    if (prepend) t->dec_first_strip = 1;
  } else if (!strcmp(type, "Strip")) {
    const char *c = get_str(n, "content");
    const cJSON *st = get(n, "start"), *sp = get(n, "stop");
    if (!c || strlen(c) >= sizeof t->strip_char || !*c)
      return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.content' must be one character", L->path, field);
    int start = cJSON_IsNumber(st) ? st->valueint : 0, stop = cJSON_IsNumber(sp) ? sp->valueint : 0;
    if (start < 0 || stop < 0 || start > 64 || stop > 64)
      return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.start/stop' out of range", L->path, field);
    if (d->fused) { /* after Fuse the whole text is one token */
      t->strip_char_len = (int)strlen(c);
      memcpy(t->strip_char, c, (size_t)t->strip_char_len);
      t->strip_start = start;
      t->strip_stop = stop;
      return TIDE_OK;
    }
    s->kind = DEC_STRIP;
    TIDE_CHECK(dup_str(c, &s->a, &s->alen));
    s->start = start;
    s->stop = stop;
  } else {
    return FIELD_ERR(TIDE_E_UNSUPPORTED,
                     "%s: field '%s.type': decoder '%s' is not supported (tide has Sequence, ByteLevel, "
                     "Metaspace, Replace, ByteFallback, Fuse, Strip)",
                     L->path, field, type);
  }
  if (d->fused && s->kind != DEC_STRIP)
    return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': decoder '%s' after Fuse is not supported", L->path, field, type);
  d->n++;
  return TIDE_OK;
}

/* Replace every occurrence of a by b in buf[0..*n) (buf has room `cap`). */
static int replace_all(char **buf, size_t *cap, size_t *n, const char *a, size_t alen, const char *b,
                       size_t blen, char **tmp, size_t *tmpcap) {
  if (alen == 0 || *n < alen) return TIDE_OK;
  size_t o = 0;
  TIDE_CHECK(tok_grow(tmp, tmpcap, *n * (blen > alen ? blen : alen) / alen + blen + 1));
  size_t i = 0;
  while (i < *n) {
    if (i + alen <= *n && memcmp(*buf + i, a, alen) == 0) {
      memcpy(*tmp + o, b, blen);
      o += blen;
      i += alen;
    } else {
      (*tmp)[o++] = (*buf)[i++];
    }
  }
  char *sw = *buf;
  size_t swc = *cap;
  *buf = *tmp;
  *cap = *tmpcap;
  *tmp = sw;
  *tmpcap = swc;
  *n = o;
  return TIDE_OK;
}

static int compute_decoded(load_ctx *L, dec_plan *d) {
  tide_tokenizer *t = L->t;
  uint32_t b2c[256];
  int16_t c2b[512];
  bytelevel_tables(b2c, c2b);
  char *buf = NULL, *tmp = NULL;
  size_t cap = 0, tmpcap = 0;
  int rc = TIDE_OK;
  for (int32_t id = 0; id < t->n_ids && rc == TIDE_OK; id++) {
    if (t->text_len[id] == UINT32_MAX) continue;
    size_t n = t->text_len[id];
    if ((rc = tok_grow(&buf, &cap, n + 1))) break;
    memcpy(buf, t->strings + t->text_off[id], n);
    for (int k = 0; k < d->n && rc == TIDE_OK; k++) {
      dec_step *s = &d->steps[k];
      if (s->kind == DEC_BYTELEVEL) {
        if ((rc = tok_grow(&tmp, &tmpcap, n + 1))) break;
        long m = bytelevel_decode(c2b, buf, n, tmp);
        if (m >= 0) {
          memcpy(buf, tmp, (size_t)m);
          n = (size_t)m;
        }
      } else if (s->kind == DEC_BYTEFALLBACK) {
        static const char hex[] = "0123456789ABCDEF";
        if (n == 6 && !memcmp(buf, "<0x", 3) && buf[5] == '>') {
          const char *h1 = memchr(hex, buf[3], 16), *h2 = memchr(hex, buf[4], 16);
          if (h1 && h2 && buf[3] && buf[4]) {
            buf[0] = (char)(((h1 - hex) << 4) | (h2 - hex));
            n = 1;
          }
        }
      } else if (s->kind == DEC_REPLACE) {
        rc = replace_all(&buf, &cap, &n, s->a, s->alen, s->b, s->blen, &tmp, &tmpcap);
      } else if (s->kind == DEC_STRIP) {
        size_t st = 0, en = n;
        for (int j = 0; j < s->start && st + s->alen <= en && !memcmp(buf + st, s->a, s->alen); j++) st += s->alen;
        for (int j = 0; j < s->stop && en >= st + s->alen && !memcmp(buf + en - s->alen, s->a, s->alen); j++) en -= s->alen;
        memmove(buf, buf + st, en - st);
        n = en - st;
      }
    }
    if (rc) break;
    uint32_t off = add_string(t, buf, n);
    if (off == UINT32_MAX) {
      rc = TIDE_ERR(TIDE_E_NOMEM, "decoded vocabulary too large");
      break;
    }
    t->dec_off[id] = off;
    t->dec_len[id] = (uint32_t)n;
  }
  tide_xfree(buf);
  tide_xfree(tmp);
  return rc;
}

/* ---- post-processor -> prefix/suffix ids for ADD_SPECIAL ---- */
static int pp_push(load_ctx *L, int32_t *arr, int *n, int32_t id, const char *field) {
  if (*n >= 8) return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field '%s': more than 8 special tokens", L->path, field);
  if (id < 0) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s': special token has no id", L->path, field);
  arr[(*n)++] = id;
  return TIDE_OK;
}

static int parse_post(load_ctx *L, const cJSON *n, const char *field) {
  tide_tokenizer *t = L->t;
  if (!n || cJSON_IsNull(n)) return TIDE_OK;
  const char *type = get_str(n, "type");
  if (!type) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.type' missing", L->path, field);
  char sub[160];
  if (!strcmp(type, "ByteLevel")) return TIDE_OK; /* offsets only */
  if (!strcmp(type, "Sequence")) {
    const cJSON *arr = get(n, "processors");
    if (!cJSON_IsArray(arr)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.processors' must be an array", L->path, field);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
      snprintf(sub, sizeof sub, "%s.processors[%d]", field, i++);
      TIDE_CHECK(parse_post(L, e, sub));
    }
    return TIDE_OK;
  }
  if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
    const cJSON *cls = get(n, "cls"), *sep = get(n, "sep");
    const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
    if (!cJSON_IsNumber(ci) || !cJSON_IsNumber(si))
      return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.cls/sep' must be [token, id]", L->path, field);
    TIDE_CHECK(pp_push(L, t->prefix, &t->n_prefix, ci->valueint, field));
    return pp_push(L, t->suffix, &t->n_suffix, si->valueint, field);
  }
  if (!strcmp(type, "TemplateProcessing")) {
    const cJSON *single = get(n, "single"), *specials = get(n, "special_tokens");
    if (!cJSON_IsArray(single)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.single' must be an array", L->path, field);
    int seen_a = 0, i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, single) {
      snprintf(sub, sizeof sub, "%s.single[%d]", field, i++);
      const cJSON *sp = get(e, "SpecialToken");
      if (get(e, "Sequence")) {
        seen_a = 1;
        continue;
      }
      const char *name = get_str(sp, "id");
      if (!name) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s' must be a SpecialToken or Sequence", L->path, sub);
      const cJSON *ids = get(get(specials, name), "ids");
      if (!cJSON_IsArray(ids))
        return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.special_tokens.%s.ids' missing", L->path, field, name);
      const cJSON *x;
      cJSON_ArrayForEach(x, ids) {
        if (!cJSON_IsNumber(x)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s.special_tokens.%s.ids' must hold numbers", L->path, field, name);
        if (seen_a) TIDE_CHECK(pp_push(L, t->suffix, &t->n_suffix, x->valueint, sub));
        else TIDE_CHECK(pp_push(L, t->prefix, &t->n_prefix, x->valueint, sub));
      }
    }
    return TIDE_OK;
  }
  return FIELD_ERR(TIDE_E_UNSUPPORTED,
                   "%s: field '%s.type': post-processor '%s' is not supported (tide has ByteLevel, "
                   "TemplateProcessing, BertProcessing, RobertaProcessing, Sequence)",
                   L->path, field, type);
}

/* ---- the model ---- */
static int parse_model(load_ctx *L, const cJSON *m, tok_map *model_text) {
  tide_tokenizer *t = L->t;
  tok_bpe *b = &t->bpe;
  if (!cJSON_IsObject(m)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'model' missing or not an object", L->path);
  const char *type = get_str(m, "type");
  if (type && strcmp(type, "BPE") != 0)
    return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field 'model.type': model '%s' is not supported (tide implements BPE)", L->path, type);
  const cJSON *vocab = get(m, "vocab"), *merges = get(m, "merges");
  if (!cJSON_IsObject(vocab)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'model.vocab' must be an object", L->path);
  if (!cJSON_IsArray(merges)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'model.merges' must be an array", L->path);
  const cJSON *dropout = get(m, "dropout");
  if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
    return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field 'model.dropout': BPE dropout is not supported (encoding must be deterministic)", L->path);
  const char *cont = get_str(m, "continuing_subword_prefix"), *eow = get_str(m, "end_of_word_suffix");
  if (cont && *cont) return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field 'model.continuing_subword_prefix' is not supported", L->path);
  if (eow && *eow) return FIELD_ERR(TIDE_E_UNSUPPORTED, "%s: field 'model.end_of_word_suffix' is not supported", L->path);
  b->byte_fallback = get_bool(m, "byte_fallback", 0);
  b->fuse_unk = get_bool(m, "fuse_unk", 0);
  b->ignore_merges = get_bool(m, "ignore_merges", 0);
  b->bytes_mode = L->has_bytelevel_pre;

  int nv = cJSON_GetArraySize(vocab);
  TIDE_CHECK(tok_map_init(model_text, (uint32_t)nv));
  TIDE_CHECK(tok_map_init(&b->vocab, (uint32_t)nv));
  int32_t maxid = -1;
  const cJSON *e;
  cJSON_ArrayForEach(e, vocab) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 2e9 || e->valuedouble != (double)e->valueint)
      return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'model.vocab' entry '%s' must map to a non-negative integer id", L->path, e->string);
    TIDE_CHECK(tok_map_put(model_text, e->string, strlen(e->string), e->valueint));
    if (e->valueint > maxid) maxid = e->valueint;
  }
  t->n_ids = maxid + 1;

  /* symbol keys: raw bytes for byte-level vocabularies, the text otherwise */
  uint32_t b2c[256];
  int16_t c2b[512];
  bytelevel_tables(b2c, c2b);
  char tmp[1024];
  for (int i = 0; i < 256; i++) b->byte_id[i] = b->fallback_id[i] = -1;
  cJSON_ArrayForEach(e, vocab) {
    size_t n = strlen(e->string);
    if (b->bytes_mode) {
      if (n > sizeof tmp) continue; /* no merge can reach it from bytes either */
      long k = bytelevel_decode(c2b, e->string, n, tmp);
      if (k < 0) continue;        /* not byte-level text: unreachable by BPE */
      if (k == 1) b->byte_id[(uint8_t)tmp[0]] = e->valueint;
      TIDE_CHECK(tok_map_put(&b->vocab, tmp, (size_t)k, e->valueint));
    } else {
      TIDE_CHECK(tok_map_put(&b->vocab, e->string, n, e->valueint));
      unsigned hv;
      if (n == 6 && sscanf(e->string, "<0x%2X>", &hv) == 1 && e->string[5] == '>') b->fallback_id[hv & 255] = e->valueint;
    }
  }
  const char *unk = get_str(m, "unk_token");
  b->unk_id = unk ? tok_map_get(model_text, unk, strlen(unk)) : -1;
  if (unk && b->unk_id < 0)
    return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'model.unk_token': '%s' is not in the vocabulary", L->path, unk);

  int nm = cJSON_GetArraySize(merges);
  b->merges = tide_xmalloc(sizeof(tok_merge) * (size_t)(nm > 0 ? nm : 1));
  if (!b->merges) return TIDE_E_NOMEM;
  char *cat = NULL;
  size_t catcap = 0;
  int r = 0;
  cJSON_ArrayForEach(e, merges) {
    const char *l, *rt;
    size_t ln, rn;
    char *sp = NULL;
    if (cJSON_IsString(e)) {
      l = e->valuestring;
      sp = strchr(l, ' ');
      if (!sp || strchr(sp + 1, ' ')) {
        tide_xfree(cat);
        return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'model.merges[%d]': '%s' is not two tokens separated by one space", L->path, r, l);
      }
      ln = (size_t)(sp - l);
      rt = sp + 1;
      rn = strlen(rt);
    } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
      l = cJSON_GetArrayItem(e, 0)->valuestring;
      rt = cJSON_GetArrayItem(e, 1)->valuestring;
      ln = strlen(l);
      rn = strlen(rt);
    } else {
      tide_xfree(cat);
      return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'model.merges[%d]' must be \"a b\" or [\"a\", \"b\"]", L->path, r);
    }
    int32_t li = tok_map_get(model_text, l, ln), ri = tok_map_get(model_text, rt, rn);
    if (tok_grow(&cat, &catcap, ln + rn + 1)) return TIDE_E_NOMEM;
    memcpy(cat, l, ln);
    memcpy(cat + ln, rt, rn);
    int32_t mi = tok_map_get(model_text, cat, ln + rn);
    if (li < 0 || ri < 0 || mi < 0) {
      int bad = li < 0 ? 0 : ri < 0 ? 1 : 2;
      tide_xfree(cat);
      return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'model.merges[%d]': %s of '%.*s' + '%.*s' is not in the vocabulary", L->path, r,
                       bad == 0 ? "the left token" : bad == 1 ? "the right token" : "the merged token", (int)ln, l, (int)rn, rt);
    }
    b->merges[r] = (tok_merge){li, ri, mi};
    r++;
  }
  tide_xfree(cat);
  b->n_merges = r;
  return tok_pairs_build(b);
}

/* A token name in tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(const cJSON *cfg, const char *key) {
  const cJSON *v = get(cfg, key);
  if (cJSON_IsString(v)) return v->valuestring;
  return get_str(v, "content");
}

static int parse_added(load_ctx *L, const cJSON *arr) {
  tide_tokenizer *t = L->t;
  if (!arr || cJSON_IsNull(arr)) return TIDE_OK;
  if (!cJSON_IsArray(arr)) return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'added_tokens' must be an array", L->path);
  int n = cJSON_GetArraySize(arr);
  t->added = tide_xcalloc((size_t)(n > 0 ? n : 1), sizeof(tok_added));
  if (!t->added) return TIDE_E_NOMEM;
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    const cJSON *id = get(e, "id");
    const char *c = get_str(e, "content");
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 2e9 || !c || !*c)
      return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'added_tokens[%d]' needs a non-negative 'id' and a non-empty 'content'", L->path, i);
    tok_added *a = &t->added[t->n_added];
    a->id = id->valueint;
    size_t cn = strlen(c);
    a->off = add_string(t, c, cn);
    if (a->off == UINT32_MAX) return TIDE_E_NOMEM;
    a->len = (uint32_t)cn;
    a->lstrip = (uint8_t)get_bool(e, "lstrip", 0);
    a->rstrip = (uint8_t)get_bool(e, "rstrip", 0);
    a->single_word = (uint8_t)get_bool(e, "single_word", 0);
    a->special = (uint8_t)get_bool(e, "special", 0);
    a->normalized = (uint8_t)get_bool(e, "normalized", !a->special);
    if (a->id + 1 > t->n_ids) t->n_ids = a->id + 1;
    t->n_added++;
    i++;
  }
  return TIDE_OK;
}

/* Per-id tables, the text map and the added-token tries, once the model and
 * the added tokens are known. */
/* The per-id tables are sized by the largest id; ids this far beyond the
 * number of tokens defined would only size tables of unused entries (an
 * added token with id 444444197 asked for 7.5 GB). */
enum { TOK_ID_SLACK = 1 << 20 };

static int build_tables(load_ctx *L, const tok_map *model_text) {
  tide_tokenizer *t = L->t;
  size_t n = (size_t)t->n_ids;
  const size_t defined = (size_t)model_text->n + (size_t)t->n_added;
  if (n > defined + TOK_ID_SLACK)
    return FIELD_ERR(TIDE_E_FORMAT,
                     "%s: token ids reach %zu but only %zu tokens are defined (vocab and added_tokens): more than %d "
                     "ids would be unused",
                     L->path, n - 1, defined, TOK_ID_SLACK);
  t->text_off = tide_xmalloc(n * 4);
  t->text_len = tide_xmalloc(n * 4);
  t->dec_off = tide_xmalloc(n * 4);
  t->dec_len = tide_xmalloc(n * 4);
  t->id_special = tide_xcalloc(n, 1);
  if (!t->text_off || !t->text_len || !t->dec_off || !t->dec_len || !t->id_special) return TIDE_E_NOMEM;
  for (size_t i = 0; i < n; i++) t->text_len[i] = t->dec_len[i] = UINT32_MAX;
  TIDE_CHECK(tok_map_init(&t->text_map, model_text->n + (uint32_t)t->n_added));
  for (uint32_t i = 0; i <= model_text->mask; i++) {
    const tok_slot *s = &model_text->slots[i];
    if (s->off == UINT32_MAX) continue;
    uint32_t off = add_string(t, tok_map_key(model_text, s), s->len);
    if (off == UINT32_MAX) return TIDE_E_NOMEM;
    t->text_off[s->val] = off;
    t->text_len[s->val] = s->len;
    TIDE_CHECK(tok_map_put(&t->text_map, tok_map_key(model_text, s), s->len, s->val));
  }
  for (int i = 0; i < t->n_added; i++) {
    tok_added *a = &t->added[i];
    t->text_off[a->id] = a->off;
    t->text_len[a->id] = a->len;
    t->id_special[a->id] = a->special;
    TIDE_CHECK(tok_map_put(&t->text_map, t->strings + a->off, a->len, a->id));
  }
  /* tries: non-normalized contents match the raw text, normalized ones the
   * normalized text (so their contents are normalized too) */
  tok_ws ws;
  memset(&ws, 0, sizeof ws);
  int rc = TIDE_OK;
  for (int i = 0; i < t->n_added && rc == TIDE_OK; i++) {
    tok_added *a = &t->added[i];
    if (!a->normalized) {
      rc = tok_trie_add(&t->trie_raw, t->strings + a->off, a->len, i);
      continue;
    }
    const char *nt;
    size_t nn;
    rc = tok_normalize(t, &ws, t->strings + a->off, a->len, &nt, &nn);
    if (rc) break;
    a->noff = add_string(t, nt, nn);
    a->nlen = (uint32_t)nn;
    if (a->noff == UINT32_MAX) rc = TIDE_E_NOMEM;
    else rc = tok_trie_add(&t->trie_norm, t->strings + a->noff, a->nlen, i);
  }
  tok_ws_free(&ws);
  return rc;
}

static int read_config(load_ctx *L, const char *cfg_path, cJSON **out) {
  *out = NULL;
  size_t len;
  int missing;
  char *text = read_file(cfg_path, &len, &missing);
  if (!text) {
    if (missing) {
      tide_clear_error();
      return TIDE_OK; /* optional */
    }
    return TIDE_E_IO;
  }
  *out = parse_json(cfg_path, text, len);
  tide_xfree(text);
  return *out ? TIDE_OK : TIDE_E_FORMAT;
}

static int apply_config(load_ctx *L, const cJSON *cfg, const char *cfg_path) {
  tide_tokenizer *t = L->t;
  t->bos_id = t->eos_id = t->pad_id = -1;
  t->unk_id = t->bpe.unk_id;
  const char *names[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
  int32_t *dst[4] = {&t->bos_id, &t->eos_id, &t->pad_id, &t->unk_id};
  for (int k = 0; k < 4; k++) {
    const char *s = config_token(cfg, names[k]);
    if (!s) continue;
    int32_t id = tok_map_get(&t->text_map, s, strlen(s));
    if (id < 0) return FIELD_ERR(TIDE_E_FORMAT, "%s: field '%s': token '%s' is not in the vocabulary", cfg_path, names[k], s);
    *dst[k] = id;
  }
  t->cleanup_spaces = get_bool(cfg, "clean_up_tokenization_spaces", 0);
  /* BOS/EOS: tokenizer_config's add_bos_token/add_eos_token, when present,
   * replace the post-processor's template (as transformers' Llama-style fast
   * tokenizers do); otherwise the template decides. */
  const cJSON *ab = get(cfg, "add_bos_token"), *ae = get(cfg, "add_eos_token");
  if (cJSON_IsBool(ab) || cJSON_IsBool(ae)) {
    t->n_prefix = t->n_suffix = 0;
    if (cJSON_IsTrue(ab)) {
      if (t->bos_id < 0) return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'add_bos_token' is true but there is no bos_token", cfg_path);
      t->prefix[t->n_prefix++] = t->bos_id;
    }
    if (cJSON_IsTrue(ae)) {
      if (t->eos_id < 0) return FIELD_ERR(TIDE_E_FORMAT, "%s: field 'add_eos_token' is true but there is no eos_token", cfg_path);
      t->suffix[t->n_suffix++] = t->eos_id;
    }
  }
  for (int i = 0; i < t->n_prefix; i++) t->adds_bos |= t->prefix[i] == t->bos_id && t->bos_id >= 0;
  for (int i = 0; i < t->n_suffix; i++) t->adds_eos |= t->suffix[i] == t->eos_id && t->eos_id >= 0;
  const cJSON *ct = get(cfg, "chat_template");
  const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
  if (cJSON_IsArray(ct)) { /* [{name, template}]: take "default", else the first */
    const cJSON *e;
    cJSON_ArrayForEach(e, ct) {
      const char *nm = get_str(e, "name"), *tp = get_str(e, "template");
      if (tp && (!tmpl || (nm && !strcmp(nm, "default")))) tmpl = tp;
    }
  }
  t->chat_template = tide_xstrdup(tmpl ? tmpl : "");
  return t->chat_template ? TIDE_OK : TIDE_E_NOMEM;
}

static void describe(tide_tokenizer *t) {
  char *d = t->describe;
  size_t cap = sizeof t->describe;
  int n = snprintf(d, cap, "BPE(%s%s, %d merges, %d ids) norm=%d pre=[", t->bpe.bytes_mode ? "byte-level" : "chars",
                   t->bpe.byte_fallback ? "+byte_fallback" : "", t->bpe.n_merges, t->n_ids, t->n_norms);
  for (int i = 0; i < t->n_pres && n > 0 && (size_t)n < cap; i++)
    n += snprintf(d + n, cap - (size_t)n, "%s%s", i ? "," : "", t->pres[i].name);
  if (n > 0 && (size_t)n < cap) snprintf(d + n, cap - (size_t)n, "] added=%d", t->n_added);
}

void tide_tokenizer_retain(const tide_tokenizer *tok) {
  /* the count is the one field a const holder may change */
  if (tok) __atomic_add_fetch(&((tide_tokenizer *)tok)->refs, 1, __ATOMIC_RELAXED);
}

void tide_tokenizer_free(tide_tokenizer *t) {
  if (!t) return;
  if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  tide_xfree(t->path);
  tok_map_free(&t->bpe.vocab);
  tide_xfree(t->bpe.pairs);
  tide_xfree(t->bpe.merges);
  tide_xfree(t->text_off);
  tide_xfree(t->text_len);
  tide_xfree(t->dec_off);
  tide_xfree(t->dec_len);
  tide_xfree(t->id_special);
  tide_xfree(t->strings);
  tok_map_free(&t->text_map);
  tide_xfree(t->added);
  tide_xfree(t->trie_raw.nodes);
  tide_xfree(t->trie_norm.nodes);
  for (int i = 0; i < t->n_norms; i++) {
    tide_xfree(t->norms[i].a);
    tide_xfree(t->norms[i].b);
    pcre2_code_free(t->norms[i].re);
  }
  for (int i = 0; i < t->n_pres; i++) pcre2_code_free(t->pres[i].re);
  pcre2_code_free(t->re_word);
  pcre2_code_free(t->re_space);
  tide_xfree(t->chat_template);
  tok_ws_free(&t->ws);
  tide_xfree(t);
}

int tide_tokenizer_load(tide_tokenizer **out, const char *path) {
  if (!out || !path) return TIDE_ERR(TIDE_E_INVALID, "out and path must not be NULL");
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0) return TIDE_ERR(TIDE_E_IO, "cannot open %s: %s", path, strerror(errno));
  size_t pl = strlen(path);
  char *json_path = tide_xmalloc(pl + 32), *cfg_path = tide_xmalloc(pl + 32);
  if (!json_path || !cfg_path) {
    tide_xfree(json_path);
    tide_xfree(cfg_path);
    return TIDE_E_NOMEM;
  }
  if (S_ISDIR(st.st_mode)) {
    snprintf(json_path, pl + 32, "%s/tokenizer.json", path);
    snprintf(cfg_path, pl + 32, "%s/tokenizer_config.json", path);
  } else {
    snprintf(json_path, pl + 32, "%s", path);
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(cfg_path, pl + 32, "%.*s/tokenizer_config.json", (int)(slash - path), path);
    else snprintf(cfg_path, pl + 32, "tokenizer_config.json");
  }
  size_t len;
  int missing;
  char *text = read_file(json_path, &len, &missing);
  cJSON *j = NULL, *cfg = NULL;
  tide_tokenizer *t = NULL;
  tok_map model_text;
  memset(&model_text, 0, sizeof model_text);
  dec_plan dp;
  memset(&dp, 0, sizeof dp);
  int rc;
  if (!text) {
    rc = tide_last_status();
    goto done;
  }
  j = parse_json(json_path, text, len);
  tide_xfree(text);
  if (!j) {
    rc = TIDE_E_FORMAT;
    goto done;
  }
  if (!cJSON_IsObject(j)) {
    rc = TIDE_ERR(TIDE_E_FORMAT, "%s: the top level must be a JSON object", json_path);
    goto done;
  }
  t = tide_xcalloc(1, sizeof *t);
  if (!t) {
    rc = TIDE_E_NOMEM;
    goto done;
  }
  t->refs = 1;
  t->path = tide_xstrdup(json_path);
  load_ctx L = {t, json_path, 0};
  char err[200];
  t->re_word = tok_regex_compile("\\w", 2, 0, err, sizeof err);
  t->re_space = tok_regex_compile("\\s", 2, 0, err, sizeof err);
  if (!t->path || !t->re_word || !t->re_space) {
    rc = TIDE_ERR(TIDE_E_NOMEM, "out of memory");
    goto done;
  }
  if ((rc = parse_normalizer(&L, get(j, "normalizer"), "normalizer"))) goto done;
  if ((rc = parse_pretok(&L, get(j, "pre_tokenizer"), "pre_tokenizer"))) goto done;
  if ((rc = parse_model(&L, get(j, "model"), &model_text))) goto done;
  if ((rc = parse_added(&L, get(j, "added_tokens")))) goto done;
  if ((rc = build_tables(&L, &model_text))) goto done;
  if ((rc = parse_post(&L, get(j, "post_processor"), "post_processor"))) goto done;
  if ((rc = parse_decoder(&L, get(j, "decoder"), "decoder", &dp))) goto done;
  if ((rc = compute_decoded(&L, &dp))) goto done;
  if ((rc = read_config(&L, cfg_path, &cfg))) goto done;
  if ((rc = apply_config(&L, cfg, cfg_path))) goto done;
  if ((rc = tok_ws_init(t, &t->ws, 1))) goto done;
  describe(t);
  *out = t;
  t = NULL;
  rc = TIDE_OK;
done:
  if (rc && rc != TIDE_E_NOMEM && tide_last_status() != rc) TIDE_ERR(rc, "%s: cannot load", json_path);
  if (rc == TIDE_E_NOMEM && tide_last_status() != TIDE_E_NOMEM) TIDE_ERR(rc, "%s: out of memory", json_path);
  dec_plan_free(&dp);
  tok_map_free(&model_text);
  cJSON_Delete(j);
  cJSON_Delete(cfg);
  tide_tokenizer_free(t);
  tide_xfree(json_path);
  tide_xfree(cfg_path);
  return rc;
}
