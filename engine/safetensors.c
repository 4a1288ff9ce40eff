/* safetensors.c - the safetensors format: a strict header parser (one shard)
 * and the streaming writer. The file is an 8-byte little-endian length N,
 * N bytes of UTF-8 JSON, then the data section; docs/checkpoint.md lists
 * what is checked and why. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"

/* ---- dtypes ----
 * `rank` is the position in Hugging Face's Dtype enum (increasing
 * alignment); its writer lays tensors out by descending rank, then name. */
static const struct {
  const char *name;
  int dtype;   /* tide dtype, -1 = valid safetensors dtype tide does not support */
  int rank;
} st_types[] = {
    {"BOOL", -1, 0},          {"F4", TIDE_FP4, 1},     {"F6_E2M3", -1, 2},       {"F6_E3M2", -1, 3},
    {"U8", TIDE_U8, 4},       {"I8", TIDE_I8, 5},      {"F8_E5M2", -1, 6},       {"F8_E4M3", TIDE_F8E4M3, 7},
    {"F8_E8M0", TIDE_E8M0, 8}, {"I16", -1, 9},         {"U16", -1, 10},          {"F16", TIDE_F16, 11},
    {"BF16", TIDE_BF16, 12},  {"I32", TIDE_I32, 13},   {"U32", -1, 14},          {"F32", TIDE_F32, 15},
    {"F64", -1, 16},          {"I64", TIDE_I64, 17},   {"U64", -1, 18},          {"C64", -1, 19},
};
enum { N_ST_TYPES = (int)(sizeof st_types / sizeof st_types[0]) };

const char *st_dtype_name(int dtype) {
  for (int i = 0; i < N_ST_TYPES; i++)
    if (st_types[i].dtype == dtype && dtype >= 0) return st_types[i].name;
  return NULL;
}

static int st_rank(int dtype) {
  for (int i = 0; i < N_ST_TYPES; i++)
    if (st_types[i].dtype == dtype) return st_types[i].rank;
  return -1;
}

/* ---- parser helpers ---- */
/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF); returns the
 * offset of the first bad byte or -1. Control bytes other than JSON
 * whitespace are rejected too: JSON forbids them raw, and a NUL would cut a
 * name short. */
static int64_t bad_text_at(const uint8_t *s, int64_t n) {
  int64_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) {
      if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return i;
      i++;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
    else return i;
    if (i + len > n) return i;
    for (int k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
      return i;
    i += len;
  }
  return -1;
}

static int cmp_range(const void *a, const void *b) {
  const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

void st_header_free(st_header *h) {
  if (!h) return;
  tide_xfree(h->t);
  tide_xfree(h->names);
  tide_xfree(h->metadata_json);
  memset(h, 0, sizeof *h);
}

#define PATHF "%.400s"
#define NAMEF "'%.200s'"

/* ---- the header scanner ----
 * A strict JSON reader for the one shape a header has: an object of tensor
 * entries (and __metadata__). It allocates nothing per value (a header of
 * the Pro checkpoint has 2-3 thousand entries, 145 thousand over all
 * shards), reads integers exactly (1.0, 1e3, -0 and leading zeros are
 * refused rather than rounded), and names the tensor in every error. Other
 * JSON inside an entry is checked and skipped. The text was already checked
 * to be UTF-8 without raw control bytes. */
typedef struct {
  const char *s, *p, *end;
  const char *path;
  char *pool;      /* decoded names; a string never decodes longer than its text */
  size_t used;
} scan;

static void ws(scan *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int syntax(scan *c, const char *what) {
  return TIDE_ERR(TIDE_E_FORMAT, PATHF ": header is not valid JSON: %s at byte %lld", c->path, what,
                  (long long)(c->p - c->s));
}

static int peek(scan *c) {
  ws(c);
  return c->p < c->end ? (unsigned char)*c->p : -1;
}

static int hexval(int ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static int hex4(scan *c, uint32_t *v) {
  if (c->end - c->p < 4) return syntax(c, "short \\u escape");
  uint32_t x = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval((unsigned char)c->p[i]);
    if (h < 0) return syntax(c, "bad \\u escape");
    x = x * 16 + (uint32_t)h;
  }
  c->p += 4;
  *v = x;
  return TIDE_OK;
}

/* A string at the cursor, decoded into out (NULL: only checked), NUL
 * terminated; \u0000 is refused (a name must stay a C string). */
static int str(scan *c, char *out, size_t *len) {
  if (peek(c) != '"') return syntax(c, "expected a string");
  c->p++;
  size_t o = 0;
  for (;;) {
    if (c->p >= c->end) return syntax(c, "unterminated string");
    unsigned char ch = (unsigned char)*c->p;
    if (ch == '"') {
      c->p++;
      break;
    }
    if (ch < 0x20) return syntax(c, "control character in a string");
    if (ch != '\\') {
      if (out) out[o] = (char)ch;
      o++;
      c->p++;
      continue;
    }
    if (++c->p >= c->end) return syntax(c, "unterminated string");
    char e = *c->p++;
    uint32_t cp;
    switch (e) {
      case '"': cp = '"'; break;
      case '\\': cp = '\\'; break;
      case '/': cp = '/'; break;
      case 'b': cp = 8; break;
      case 'f': cp = 12; break;
      case 'n': cp = 10; break;
      case 'r': cp = 13; break;
      case 't': cp = 9; break;
      case 'u': {
        TIDE_CHECK(hex4(c, &cp));
        if (cp >= 0xdc00 && cp <= 0xdfff) return syntax(c, "lone low surrogate");
        if (cp >= 0xd800 && cp <= 0xdbff) {
          uint32_t lo;
          if (c->end - c->p < 2 || c->p[0] != '\\' || c->p[1] != 'u') return syntax(c, "lone high surrogate");
          c->p += 2;
          TIDE_CHECK(hex4(c, &lo));
          if (lo < 0xdc00 || lo > 0xdfff) return syntax(c, "bad surrogate pair");
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp == 0) return syntax(c, "\\u0000 in a string");
        break;
      }
      default: return syntax(c, "bad escape");
    }
    uint8_t u8[4];
    int n;
    if (cp < 0x80) u8[0] = (uint8_t)cp, n = 1;
    else if (cp < 0x800) u8[0] = (uint8_t)(0xc0 | cp >> 6), u8[1] = (uint8_t)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
      u8[0] = (uint8_t)(0xe0 | cp >> 12), u8[1] = (uint8_t)(0x80 | ((cp >> 6) & 63)), u8[2] = (uint8_t)(0x80 | (cp & 63)),
      n = 3;
    else
      u8[0] = (uint8_t)(0xf0 | cp >> 18), u8[1] = (uint8_t)(0x80 | ((cp >> 12) & 63)),
      u8[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)), u8[3] = (uint8_t)(0x80 | (cp & 63)), n = 4;
    if (out) memcpy(out + o, u8, (size_t)n);
    o += (size_t)n;
  }
  if (out) out[o] = 0;
  if (len) *len = o;
  return TIDE_OK;
}

static int is_digit(int ch) { return ch >= '0' && ch <= '9'; }

/* skip any JSON value (checked), nested at most 64 deep */
static int skip_value(scan *c, int depth) {
  if (depth > 64) return syntax(c, "values nested too deeply");
  int ch = peek(c);
  if (ch == '"') return str(c, NULL, NULL);
  if (ch == '{' || ch == '[') {
    int close = ch == '{' ? '}' : ']';
    c->p++;
    if (peek(c) == close) {
      c->p++;
      return TIDE_OK;
    }
    for (;;) {
      if (close == '}') {
        TIDE_CHECK(str(c, NULL, NULL));
        if (peek(c) != ':') return syntax(c, "expected ':'");
        c->p++;
      }
      TIDE_CHECK(skip_value(c, depth + 1));
      ch = peek(c);
      c->p++;
      if (ch == close) return TIDE_OK;
      if (ch != ',') {
        c->p--;
        return syntax(c, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
      }
    }
  }
  static const char *const words[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    size_t l = strlen(words[i]);
    if ((size_t)(c->end - c->p) >= l && !memcmp(c->p, words[i], l)) {
      c->p += l;
      return TIDE_OK;
    }
  }
  /* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
  const char *q = c->p;
  if (q < c->end && *q == '-') q++;
  if (q >= c->end || !is_digit(*q)) return syntax(c, "expected a value");
  if (*q == '0') q++;
  else while (q < c->end && is_digit(*q)) q++;
  if (q < c->end && *q == '.') {
    if (++q >= c->end || !is_digit(*q)) return syntax(c, "bad number");
    while (q < c->end && is_digit(*q)) q++;
  }
  if (q < c->end && (*q == 'e' || *q == 'E')) {
    q++;
    if (q < c->end && (*q == '+' || *q == '-')) q++;
    if (q >= c->end || !is_digit(*q)) return syntax(c, "bad number");
    while (q < c->end && is_digit(*q)) q++;
  }
  c->p = q;
  return TIDE_OK;
}

/* a non-negative integer below 2^53, exactly as written; field[idx] names it */
static int count_val(scan *c, const char *name, const char *field, int idx, int64_t *v) {
#define CV_ERR(why) TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": %s[%d] %s", c->path, name, field, idx, why)
  int ch = peek(c);
  if (ch == '-') return CV_ERR("is negative");
  if (ch < 0 || !is_digit(ch)) return CV_ERR("is not a number");
  if (ch == '0' && c->p + 1 < c->end && is_digit(c->p[1])) return CV_ERR("has a leading zero");
  uint64_t acc = 0;
  while (c->p < c->end && is_digit(*c->p)) {
    acc = acc * 10 + (uint64_t)(*c->p - '0');
    c->p++;
    if (acc >= ((uint64_t)1 << 53)) return CV_ERR("is too large (2^53 or more)");
  }
  if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E')) return CV_ERR("is not an integer");
#undef CV_ERR
  *v = (int64_t)acc;
  return TIDE_OK;
}

/* [a, b, ...] of counts, at most `max` (more: *n = max + 1, the rest skipped) */
static int count_list(scan *c, const char *name, const char *field, int64_t *vals, int max, int *n) {
  if (peek(c) != '[')
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": \"%s\" is not an array", c->path, name, field);
  c->p++;
  *n = 0;
  if (peek(c) == ']') {
    c->p++;
    return TIDE_OK;
  }
  for (;;) {
    int64_t v = 0;
    TIDE_CHECK(count_val(c, name, field, *n, &v));
    if (*n < max) vals[*n] = v;
    if (*n <= max) (*n)++;
    int ch = peek(c);
    c->p++;
    if (ch == ']') return TIDE_OK;
    if (ch != ',') {
      c->p--;
      return syntax(c, "expected ',' or ']'");
    }
  }
}

static int parse_entry(scan *c, st_tensor *t, const char *name, int64_t data_len) {
  const char *path = c->path;
  if (peek(c) != '{')
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": entry is not a JSON object", path, name);
  c->p++;
  int have_dt = 0, have_sh = 0, have_of = 0, ti = -1, nof = 0;
  int64_t be[3] = {0, 0, 0};
  if (peek(c) == '}') c->p++;
  else
    for (;;) {
      char *key = c->pool + c->used; /* scratch: decoded but not kept */
      size_t kl;
      TIDE_CHECK(str(c, key, &kl));
      if (peek(c) != ':') return syntax(c, "expected ':'");
      c->p++;
      int *seen = !strcmp(key, "dtype") ? &have_dt : !strcmp(key, "shape") ? &have_sh
                : !strcmp(key, "data_offsets") ? &have_of : NULL;
      if (seen && *seen)
        return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": \"%s\" given twice", path, name, key);
      if (seen == &have_dt) {
        if (peek(c) != '"')
          return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": \"dtype\" is not a string", path, name);
        char *dt = c->pool + c->used;
        TIDE_CHECK(str(c, dt, NULL));
        for (int i = 0; i < N_ST_TYPES; i++)
          if (!strcmp(dt, st_types[i].name)) ti = i;
        if (ti < 0) return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": unknown dtype \"%.40s\"", path, name, dt);
      } else if (seen == &have_sh) {
        int nd;
        TIDE_CHECK(count_list(c, name, "shape", t->shape, TIDE_MAXDIM, &nd));
        if (nd > TIDE_MAXDIM)
          return TIDE_ERR(TIDE_E_UNSUPPORTED, PATHF ": tensor " NAMEF ": more than %d dims, tide supports at most %d", path,
                          name, TIDE_MAXDIM, TIDE_MAXDIM);
        t->ndim = nd;
      } else if (seen == &have_of) {
        TIDE_CHECK(count_list(c, name, "data_offsets", be, 2, &nof));
      } else {
        TIDE_CHECK(skip_value(c, 1));
      }
      if (seen) *seen = 1;
      int ch = peek(c);
      c->p++;
      if (ch == '}') break;
      if (ch != ',') {
        c->p--;
        return syntax(c, "expected ',' or '}'");
      }
    }
  if (!have_dt) return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": no \"dtype\"", path, name);
  if (!have_sh) return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": no \"shape\"", path, name);
  if (!have_of) return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": no \"data_offsets\"", path, name);
  if (st_types[ti].dtype < 0)
    return TIDE_ERR(TIDE_E_UNSUPPORTED, PATHF ": tensor " NAMEF ": dtype %s is valid safetensors but tide does not support it",
                    path, name, st_types[ti].name);
  t->dtype = st_types[ti].dtype;
  int64_t numel = 1;
  for (int k = 0; k < t->ndim; k++)
    if (__builtin_mul_overflow(numel, t->shape[k], &numel) || numel > ((int64_t)1 << 60))
      return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": the shape's element count overflows", path, name);
  for (int k = t->ndim; k < TIDE_MAXDIM; k++) t->shape[k] = 1;
  int64_t bits = tide_dtype_bits(t->dtype);
  if ((numel * bits) % 8)
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": %lld %s elements are not a whole number of bytes", path, name,
                    (long long)numel, st_types[ti].name);
  int64_t need = numel * bits / 8;
  if (nof != 2)
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": data_offsets must be [begin, end], got %d entries", path, name,
                    nof);
  if (be[1] < be[0])
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF ": data_offsets [%lld, %lld] end before they begin", path, name,
                    (long long)be[0], (long long)be[1]);
  if (be[1] - be[0] != need) {
    char shp[96];
    size_t o = 0;
    shp[0] = 0;
    for (int i = 0; i < t->ndim && o < sizeof shp; i++)
      o += (size_t)snprintf(shp + o, sizeof shp - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    return TIDE_ERR(TIDE_E_FORMAT,
                    PATHF ": tensor " NAMEF ": data_offsets [%lld, %lld] hold %lld bytes but %s [%s] needs %lld", path,
                    name, (long long)be[0], (long long)be[1], (long long)(be[1] - be[0]), st_types[ti].name, shp,
                    (long long)need);
  }
  if (be[1] > data_len)
    return TIDE_ERR(TIDE_E_FORMAT,
                    PATHF ": tensor " NAMEF ": data_offsets [%lld, %lld] run past the data section (%lld bytes): file truncated?",
                    path, name, (long long)be[0], (long long)be[1], (long long)data_len);
  t->begin = be[0];
  t->end = be[1];
  return TIDE_OK;
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
  return h;
}

/* __metadata__: an object of strings (as Hugging Face requires), kept as
 * compact JSON text; the span is small, so cJSON checks and re-prints it */
static int parse_metadata(scan *c, st_header *h) {
  ws(c);
  const char *b = c->p;
  if (peek(c) != '{') return TIDE_ERR(TIDE_E_FORMAT, PATHF ": \"__metadata__\" is not a JSON object", c->path);
  TIDE_CHECK(skip_value(c, 1));
  cJSON *m = cJSON_ParseWithLength(b, (size_t)(c->p - b));
  if (!m) return TIDE_ERR(TIDE_E_FORMAT, PATHF ": \"__metadata__\" is not valid JSON", c->path);
  int rc = TIDE_OK;
  const cJSON *it;
  cJSON_ArrayForEach(it, m) {
    if (!cJSON_IsString(it)) {
      rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": \"__metadata__\" value of '%.100s' is not a string", c->path, it->string);
      break;
    }
  }
  if (rc == TIDE_OK) {
    char *txt = cJSON_PrintUnformatted(m);
    h->metadata_json = txt ? tide_xstrdup(txt) : NULL;
    cJSON_free(txt);
    if (!h->metadata_json) rc = TIDE_ERR(TIDE_E_NOMEM, PATHF ": cannot copy __metadata__", c->path);
  }
  cJSON_Delete(m);
  return rc;
}

int st_parse_header(st_header *out, const char *hdr, int64_t n, int64_t file_size, const char *path) {
  if (!out || !hdr) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  if (!path) path = "(memory)";
  if (n > ST_MAX_HEADER)
    return TIDE_ERR(TIDE_E_UNSUPPORTED, PATHF ": header of %lld bytes is above the 100 MB limit", path, (long long)n);
  if (n < 2) return TIDE_ERR(TIDE_E_FORMAT, PATHF ": header of %lld bytes cannot hold a JSON object", path, (long long)n);
  if (file_size < 8 || n > file_size - 8)
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": header length %lld runs past the end of the file (%lld bytes)", path,
                    (long long)n, (long long)file_size);
  int64_t bad = bad_text_at((const uint8_t *)hdr, n);
  if (bad >= 0)
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": header byte %lld (0x%02x) is not valid UTF-8 JSON text", path,
                    (long long)bad, (unsigned)(uint8_t)hdr[bad]);
  st_header h;
  memset(&h, 0, sizeof h);
  h.header_len = n;
  h.data_start = 8 + n;
  h.data_len = file_size - 8 - n;
  /* every entry takes at least 51 bytes of text ("x":{"dtype":"U8","shape":[],"data_offsets":[0,0]}) */
  int64_t cap = n / 48 + 2;
  int rc = TIDE_OK;
  int64_t *tab = NULL;
  const st_tensor **order = NULL;
  h.t = tide_xmalloc((size_t)cap * sizeof *h.t);
  h.names = tide_xmalloc((size_t)n + 1);
  if (!h.t || !h.names) {
    rc = TIDE_E_NOMEM;
    goto done;
  }
  scan c = {hdr, hdr, hdr + n, path, h.names, 0};
  int nmeta = 0;
  if (peek(&c) != '{') {
    rc = syntax(&c, "expected '{'");
    goto done;
  }
  c.p++;
  if (peek(&c) == '}') c.p++;
  else
    for (;;) {
      char *name = c.pool + c.used;
      size_t len;
      if ((rc = str(&c, name, &len)) < 0) goto done;
      if (peek(&c) != ':') {
        rc = syntax(&c, "expected ':'");
        goto done;
      }
      c.p++;
      if (!strcmp(name, "__metadata__")) {
        if (nmeta++) {
          rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": header has \"__metadata__\" twice", path);
          goto done;
        }
        if ((rc = parse_metadata(&c, &h)) < 0) goto done;
      } else {
        if (!len) {
          rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": a tensor has an empty name", path);
          goto done;
        }
        if (h.n >= cap) {
          rc = TIDE_ERR(TIDE_E_INTERNAL, PATHF ": more entries than the header can hold", path);
          goto done;
        }
        c.used += len + 1;
        st_tensor *t = &h.t[h.n];
        memset(t, 0, sizeof *t);
        t->name = name;
        if ((rc = parse_entry(&c, t, name, h.data_len)) < 0) goto done;
        h.n++;
      }
      int ch = peek(&c);
      c.p++;
      if (ch == '}') break;
      if (ch != ',') {
        c.p--;
        rc = syntax(&c, "expected ',' or '}'");
        goto done;
      }
    }
  ws(&c);
  if (c.p != c.end) {
    rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": header has text after its JSON object (byte %lld)", path,
                  (long long)(c.p - hdr));
    goto done;
  }
  /* unique names (a later duplicate would shadow the first) */
  int64_t hcap = 16;
  while (hcap < 2 * h.n) hcap *= 2;
  tab = tide_xcalloc((size_t)hcap, sizeof *tab);
  order = tide_xmalloc((size_t)(h.n ? h.n : 1) * sizeof *order);
  if (!tab || !order) {
    rc = TIDE_E_NOMEM;
    goto done;
  }
  for (int64_t i = 0; i < h.n; i++) {
    uint64_t m = (uint64_t)hcap - 1;
    for (uint64_t k = name_hash(h.t[i].name) & m;; k = (k + 1) & m) {
      if (!tab[k]) {
        tab[k] = i + 1;
        break;
      }
      if (!strcmp(h.t[tab[k] - 1].name, h.t[i].name)) {
        rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensor " NAMEF " appears twice in the header", path, h.t[i].name);
        goto done;
      }
    }
  }
  /* byte ranges: no two non-empty ranges share a byte */
  for (int64_t i = 0; i < h.n; i++) order[i] = &h.t[i];
  qsort(order, (size_t)h.n, sizeof *order, cmp_range);
  const st_tensor *prev = NULL;
  for (int64_t i = 0; i < h.n; i++) {
    const st_tensor *t = order[i];
    if (t->end == t->begin) continue;
    if (prev && t->begin < prev->end) {
      rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": tensors " NAMEF " [%lld, %lld) and " NAMEF " [%lld, %lld) overlap", path,
                    prev->name, (long long)prev->begin, (long long)prev->end, t->name, (long long)t->begin,
                    (long long)t->end);
      goto done;
    }
    prev = t;
  }
  /* keep exactly what was parsed: the entry array and the name pool were
   * sized for the worst case (an opened Pro checkpoint holds 64 of them) */
  {
    st_tensor *t = tide_xmalloc((size_t)(h.n ? h.n : 1) * sizeof *t);
    char *names = tide_xmalloc(c.used ? c.used : 1);
    if (!t || !names) {
      tide_xfree(t);
      tide_xfree(names);
      rc = TIDE_E_NOMEM;
      goto done;
    }
    memcpy(t, h.t, (size_t)h.n * sizeof *t);
    memcpy(names, h.names, c.used);
    for (int64_t i = 0; i < h.n; i++) t[i].name = names + (h.t[i].name - h.names);
    tide_xfree(h.t);
    tide_xfree(h.names);
    h.t = t;
    h.names = names;
  }
  *out = h;
  memset(&h, 0, sizeof h);
done:
  tide_xfree(tab);
  tide_xfree(order);
  st_header_free(&h);
  return rc;
}

int st_parse_image(st_header *out, const uint8_t *data, int64_t len, const char *path) {
  if (!path) path = "(memory)";
  if (!data || len < 8)
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": %lld bytes are too short for a safetensors file", path, (long long)len);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
  if (n > (uint64_t)(len - 8))
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": header length %llu runs past the end of the file (%lld bytes)", path,
                    (unsigned long long)n, (long long)len);
  return st_parse_header(out, (const char *)data + 8, (int64_t)n, len, path);
}

/* ---- writer ---- */
typedef struct wt {
  char *name;
  int32_t dtype, ndim, rank, written;
  int64_t shape[TIDE_MAXDIM];
  int64_t nbytes, off;
} wt;

struct tide_st_writer {
  char *path, *tmp;
  int fd;
  int laid_out, failed;
  wt *t;
  int64_t n, cap;
  int64_t *hash;          /* open addressing over t (index + 1, 0 = empty) */
  int64_t hcap;
  char **mk, **mv;        /* metadata */
  int nmeta, mcap;
  int64_t data_start, data_bytes;
  void *scratch;
  size_t scratch_cap;
};

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
  return h;
}

static int64_t wfind(const tide_st_writer *w, const char *name) {
  if (!w->hcap) return -1;
  uint64_t m = (uint64_t)w->hcap - 1;
  for (uint64_t i = fnv1a(name) & m;; i = (i + 1) & m) {
    int64_t v = w->hash[i];
    if (!v) return -1;
    if (!strcmp(w->t[v - 1].name, name)) return v - 1;
  }
}

static int hash_insert(int64_t *tab, int64_t cap, const wt *t, int64_t idx) {
  uint64_t m = (uint64_t)cap - 1;
  for (uint64_t i = fnv1a(t[idx].name) & m;; i = (i + 1) & m)
    if (!tab[i]) {
      tab[i] = idx + 1;
      return TIDE_OK;
    }
}

/* Temporary files of earlier writers of `path` that were killed before their
 * rename (PATH.tmp-PID, PID a process that no longer exists) are removed
 * before a new write of the same path. Only regular files untouched for
 * TIDE_STALE_TMP_SECONDS: a writer in another PID namespace (a container
 * sharing the directory) looks dead from here but keeps its file's mtime
 * fresh while it writes. Best effort: what cannot be checked is left. */
#define TIDE_STALE_TMP_SECONDS 60
static void remove_stale_tmps(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t bl = strlen(base);
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else if ((size_t)(slash - path) < sizeof dir) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  else return;
  DIR *d = opendir(dir);
  if (!d) return;
  time_t now = time(NULL);
  long self = (long)getpid();
  for (struct dirent *e; (e = readdir(d));) {
    const char *n = e->d_name;
    if (strncmp(n, base, bl) || strncmp(n + bl, ".tmp-", 5)) continue;
    const char *digits = n + bl + 5;
    size_t nd = strspn(digits, "0123456789");
    if (nd == 0 || nd > 9 || digits[nd]) continue;
    long pid = strtol(digits, NULL, 10);
    if (pid <= 0 || pid == self) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   /* alive, or not ours to judge */
    struct stat st;
    if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (now - st.st_mtime < TIDE_STALE_TMP_SECONDS) continue;
    unlinkat(dirfd(d), n, 0);
  }
  closedir(d);
}

int tide_st_writer_new(tide_st_writer **out, const char *path) {
  if (!out || !path || !*path) return TIDE_ERR(TIDE_E_INVALID, "NULL or empty argument");
  *out = NULL;
  tide_st_writer *w = tide_xcalloc(1, sizeof *w);
  if (!w) return TIDE_E_NOMEM;
  w->fd = -1;
  size_t l = strlen(path);
  w->path = tide_xstrdup(path);
  w->tmp = tide_xmalloc(l + 32);
  if (!w->path || !w->tmp) {
    tide_st_writer_free(w);
    return TIDE_E_NOMEM;
  }
  snprintf(w->tmp, l + 32, "%s.tmp-%ld", path, (long)getpid());
  remove_stale_tmps(path);
  w->fd = open(w->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    int e = errno;
    tide_st_writer_free(w);
    return TIDE_ERR(TIDE_E_IO, "cannot create '%s': %s", path, strerror(e));
  }
  *out = w;
  return TIDE_OK;
}

void tide_st_writer_free(tide_st_writer *w) {
  if (!w) return;
  if (w->fd >= 0) {
    close(w->fd);
    unlink(w->tmp);
  }
  for (int64_t i = 0; i < w->n; i++) tide_xfree(w->t[i].name);
  tide_xfree(w->t);
  tide_xfree(w->hash);
  for (int i = 0; i < w->nmeta; i++) {
    tide_xfree(w->mk[i]);
    tide_xfree(w->mv[i]);
  }
  tide_xfree(w->mk);
  tide_xfree(w->mv);
  tide_xfree(w->scratch);
  tide_xfree(w->path);
  tide_xfree(w->tmp);
  tide_xfree(w);
}

static int writer_open_check(const tide_st_writer *w, const char *fn) {
  if (!w) return tide_errorf(TIDE_E_INVALID, fn, "NULL writer");
  if (w->fd < 0) return tide_errorf(TIDE_E_STATE, fn, "writer for '%s' is already finished", w->path);
  if (w->failed) return tide_errorf(TIDE_E_STATE, fn, "writer for '%s' failed earlier", w->path);
  return TIDE_OK;
}

static int valid_text(const char *s) { return bad_text_at((const uint8_t *)s, (int64_t)strlen(s)) < 0; }

int tide_st_writer_meta(tide_st_writer *w, const char *key, const char *value) {
  TIDE_CHECK(writer_open_check(w, __func__));
  if (!key || !value) return TIDE_ERR(TIDE_E_INVALID, "NULL key or value");
  if (w->laid_out) return TIDE_ERR(TIDE_E_STATE, "%s: metadata must come before the first write", w->path);
  if (!valid_text(key) || !valid_text(value))
    return TIDE_ERR(TIDE_E_INVALID, "%s: metadata '%.100s' is not valid UTF-8 text", w->path, key);
  for (int i = 0; i < w->nmeta; i++)
    if (!strcmp(w->mk[i], key)) {
      char *v = tide_xstrdup(value);
      if (!v) return TIDE_E_NOMEM;
      tide_xfree(w->mv[i]);
      w->mv[i] = v;
      return TIDE_OK;
    }
  if (w->nmeta == w->mcap) {
    int nc = w->mcap ? 2 * w->mcap : 8;
    char **a = tide_xrealloc(w->mk, (size_t)nc * sizeof *a);
    if (!a) return TIDE_E_NOMEM;
    w->mk = a;
    char **b = tide_xrealloc(w->mv, (size_t)nc * sizeof *b);
    if (!b) return TIDE_E_NOMEM;
    w->mv = b;
    w->mcap = nc;
  }
  char *k = tide_xstrdup(key), *v = tide_xstrdup(value);
  if (!k || !v) {
    tide_xfree(k);
    tide_xfree(v);
    return TIDE_E_NOMEM;
  }
  w->mk[w->nmeta] = k;
  w->mv[w->nmeta] = v;
  w->nmeta++;
  return TIDE_OK;
}

int tide_st_writer_declare(tide_st_writer *w, const char *name, int dtype, int ndim, const int64_t *shape) {
  TIDE_CHECK(writer_open_check(w, __func__));
  if (!name || !*name) return TIDE_ERR(TIDE_E_INVALID, "%s: empty tensor name", w->path);
  if (w->laid_out) return TIDE_ERR(TIDE_E_STATE, "%s: tensor '%.200s' declared after the first write", w->path, name);
  if (!strcmp(name, "__metadata__")) return TIDE_ERR(TIDE_E_INVALID, "%s: '__metadata__' is not a tensor name", w->path);
  if (!valid_text(name)) return TIDE_ERR(TIDE_E_INVALID, "%s: tensor name is not valid UTF-8 text", w->path);
  if (!st_dtype_name(dtype)) return TIDE_ERR(TIDE_E_INVALID, "%s: tensor '%.200s': bad dtype %d", w->path, name, dtype);
  if (ndim < 0 || ndim > TIDE_MAXDIM || (ndim && !shape))
    return TIDE_ERR(TIDE_E_INVALID, "%s: tensor '%.200s': bad ndim %d", w->path, name, ndim);
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || shape[i] >= ((int64_t)1 << 53) || __builtin_mul_overflow(numel, shape[i], &numel) ||
        numel > ((int64_t)1 << 60))
      return TIDE_ERR(TIDE_E_INVALID, "%s: tensor '%.200s': bad size %lld in dim %d", w->path, name,
                      (long long)shape[i], i);
  }
  if (dtype == TIDE_FP4 && numel % 2)
    return TIDE_ERR(TIDE_E_INVALID, "%s: fp4 tensor '%.200s' has an odd element count", w->path, name);
  if (wfind(w, name) >= 0) return TIDE_ERR(TIDE_E_INVALID, "%s: tensor '%.200s' declared twice", w->path, name);
  if (w->n == w->cap) {
    int64_t nc = w->cap ? 2 * w->cap : 64;
    wt *a = tide_xrealloc(w->t, (size_t)nc * sizeof *a);
    if (!a) return TIDE_E_NOMEM;
    w->t = a;
    w->cap = nc;
  }
  if ((w->n + 1) * 2 > w->hcap) {
    int64_t nc = w->hcap ? 2 * w->hcap : 128;
    int64_t *tab = tide_xcalloc((size_t)nc, sizeof *tab);
    if (!tab) return TIDE_E_NOMEM;
    for (int64_t i = 0; i < w->n; i++) hash_insert(tab, nc, w->t, i);
    tide_xfree(w->hash);
    w->hash = tab;
    w->hcap = nc;
  }
  wt *t = &w->t[w->n];
  memset(t, 0, sizeof *t);
  t->name = tide_xstrdup(name);
  if (!t->name) return TIDE_E_NOMEM;
  t->dtype = dtype;
  t->ndim = ndim;
  t->rank = st_rank(dtype);
  for (int i = 0; i < TIDE_MAXDIM; i++) t->shape[i] = i < ndim ? shape[i] : 1;
  t->nbytes = numel * tide_dtype_bits(dtype) / 8;
  hash_insert(w->hash, w->hcap, w->t, w->n);
  w->n++;
  w->data_bytes += t->nbytes;
  return TIDE_OK;
}

int64_t tide_st_writer_data_bytes(const tide_st_writer *w) { return w ? w->data_bytes : 0; }

/* a growable text buffer for the header */
typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 4096;
    while (b->len + n + 1 > nc) nc *= 2;
    char *q = tide_xrealloc(b->p, nc);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = nc;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_json(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  const char *run = s;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\' || c < 0x20) {
      sb_put(b, run, (size_t)(s - run));
      char esc[8];
      if (c == '"') sb_put(b, "\\\"", 2);
      else if (c == '\\') sb_put(b, "\\\\", 2);
      else {
        snprintf(esc, sizeof esc, "\\u%04x", c);
        sb_put(b, esc, 6);
      }
      run = s + 1;
    }
  }
  sb_put(b, run, (size_t)(s - run));
  sb_put(b, "\"", 1);
}

static int cmp_layout(const void *a, const void *b) {
  const wt *x = *(const wt *const *)a, *y = *(const wt *const *)b;
  if (x->rank != y->rank) return x->rank > y->rank ? -1 : 1;
  return strcmp(x->name, y->name);
}
static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int pwrite_all(int fd, const void *buf, size_t n, int64_t off) {
  const char *p = buf;
  while (n > 0) {
    ssize_t k = pwrite(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += k;
    n -= (size_t)k;
    off += k;
  }
  return 0;
}

/* Fix the data layout and write the header (at the first write or finish). */
static int writer_layout(tide_st_writer *w) {
  if (w->laid_out) return TIDE_OK;
  wt **ord = tide_xmalloc((size_t)(w->n ? w->n : 1) * sizeof *ord);
  char **mk = tide_xmalloc((size_t)(w->nmeta ? w->nmeta : 1) * sizeof *mk);
  if (!ord || !mk) {
    tide_xfree(ord);
    tide_xfree(mk);
    return TIDE_E_NOMEM;
  }
  for (int64_t i = 0; i < w->n; i++) ord[i] = &w->t[i];
  qsort(ord, (size_t)w->n, sizeof *ord, cmp_layout);
  for (int i = 0; i < w->nmeta; i++) mk[i] = w->mk[i];
  qsort(mk, (size_t)w->nmeta, sizeof *mk, cmp_cstr);
  sbuf b = {0};
  char num[64];
  sb_str(&b, "{");
  int first = 1;
  if (w->nmeta) {
    sb_str(&b, "\"__metadata__\":{");
    for (int i = 0; i < w->nmeta; i++) {
      int j = 0;
      while (w->mk[j] != mk[i]) j++;
      if (i) sb_str(&b, ",");
      sb_json(&b, w->mk[j]);
      sb_str(&b, ":");
      sb_json(&b, w->mv[j]);
    }
    sb_str(&b, "}");
    first = 0;
  }
  int64_t off = 0;
  for (int64_t i = 0; i < w->n; i++) {
    wt *t = ord[i];
    t->off = off;
    if (!first) sb_str(&b, ",");
    first = 0;
    sb_json(&b, t->name);
    sb_str(&b, ":{\"dtype\":\"");
    sb_str(&b, st_dtype_name(t->dtype));
    sb_str(&b, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->shape[d]);
      sb_str(&b, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + t->nbytes));
    sb_str(&b, num);
    off += t->nbytes;
  }
  sb_str(&b, "}");
  while (!b.oom && b.len % 8) sb_str(&b, " ");
  tide_xfree(ord);
  tide_xfree(mk);
  if (b.oom) {
    tide_xfree(b.p);
    return TIDE_ERR(TIDE_E_NOMEM, "%s: cannot build the header", w->path);
  }
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
  int e = pwrite_all(w->fd, len8, 8, 0);
  if (!e) e = pwrite_all(w->fd, b.p, b.len, 8);
  tide_xfree(b.p);
  if (e) {
    w->failed = 1;
    return TIDE_ERR(TIDE_E_IO, "%s: cannot write the header: %s", w->path, strerror(-e));
  }
  w->data_start = 8 + (int64_t)b.len;
  w->laid_out = 1;
  return TIDE_OK;
}

static int grow_scratch(tide_st_writer *w, size_t need) {
  if (need <= w->scratch_cap) return TIDE_OK;
  void *p = tide_xmalloc(need);
  if (!p) return TIDE_E_NOMEM;
  tide_xfree(w->scratch);
  w->scratch = p;
  w->scratch_cap = need;
  return TIDE_OK;
}

int tide_st_writer_write(tide_st_writer *w, const char *name, const tide_tensor *t) {
  TIDE_CHECK(writer_open_check(w, __func__));
  if (!name) return TIDE_ERR(TIDE_E_INVALID, "NULL name");
  int64_t i = wfind(w, name);
  if (i < 0) return TIDE_ERR(TIDE_E_INVALID, "%s: tensor '%.200s' was not declared", w->path, name);
  wt *d = &w->t[i];
  TIDE_CHECK(tide_check_tensor(__func__, name, t, 0, -1));
  int same = t->dtype == d->dtype && t->ndim == d->ndim;
  for (int k = 0; same && k < d->ndim; k++) same = t->sizes[k] == d->shape[k];
  if (!same) {
    char a[96];
    return TIDE_ERR(TIDE_E_INVALID, "%s: tensor '%.200s' is %s %s, declared %s with %d dims", w->path, name,
                    tide_dtype_name(t->dtype), tide_shape_str(t, a, sizeof a), tide_dtype_name(d->dtype), d->ndim);
  }
  if (d->written) return TIDE_ERR(TIDE_E_STATE, "%s: tensor '%.200s' written twice", w->path, name);
  TIDE_CHECK(writer_layout(w));
  int64_t base = w->data_start + d->off;
  int e = 0;
  if (d->nbytes == 0) {
    /* nothing to write */
  } else if (tide_tensor_is_contiguous(t)) {
    e = pwrite_all(w->fd, t->data, (size_t)d->nbytes, base);
  } else {
    /* logical order, a few MB at a time: slices along dim 0 */
    int64_t d0 = t->ndim ? t->sizes[0] : 1;
    int64_t slice_el = d0 ? tide_tensor_numel(t) / d0 : 0;
    int64_t rows = slice_el ? (8 << 20) / (slice_el * tide_dtype_bits(t->dtype) / 8 + 1) : d0;
    if (rows < 1) rows = 1;
    if (t->dtype == TIDE_FP4 && slice_el % 2) rows = d0; /* whole tensor in one piece */
    for (int64_t r0 = 0; r0 < d0 && !e; r0 += rows) {
      int64_t len = d0 - r0 < rows ? d0 - r0 : rows;
      tide_tensor src, dst;
      memset(&src, 0, sizeof src);
      memset(&dst, 0, sizeof dst);
      int64_t shape[TIDE_MAXDIM];
      for (int k = 0; k < t->ndim; k++) shape[k] = t->sizes[k];
      shape[0] = len;
      int64_t nb = len * slice_el * tide_dtype_bits(t->dtype) / 8;
      int rc = grow_scratch(w, (size_t)nb);
      if (rc == TIDE_OK) rc = tide_tensor_narrow(&src, t, 0, r0, len);
      if (rc == TIDE_OK) rc = tide_tensor_wrap(&dst, w->scratch, t->dtype, t->ndim, shape, NULL, NULL);
      if (rc == TIDE_OK) rc = tide_tensor_copy(&dst, &src);
      tide_tensor_release(&src);
      tide_tensor_release(&dst);
      if (rc < 0) return tide_error_wrap(rc, "%s: tensor '%.200s'", w->path, name);
      e = pwrite_all(w->fd, w->scratch, (size_t)nb, base);
      base += nb;
    }
  }
  if (e) {
    w->failed = 1;
    return TIDE_ERR(TIDE_E_IO, "%s: cannot write tensor '%.200s': %s", w->path, name, strerror(-e));
  }
  d->written = 1;
  return TIDE_OK;
}

int tide_st_writer_finish(tide_st_writer *w, int header_only) {
  TIDE_CHECK(writer_open_check(w, __func__));
  if (!header_only)
    for (int64_t i = 0; i < w->n; i++)
      if (!w->t[i].written)
        return TIDE_ERR(TIDE_E_STATE, "%s: tensor '%.200s' was declared but never written", w->path, w->t[i].name);
  TIDE_CHECK(writer_layout(w));
  int64_t size = w->data_start + w->data_bytes;
  if (ftruncate(w->fd, (off_t)size) != 0) {
    w->failed = 1;
    return TIDE_ERR(TIDE_E_IO, "%s: cannot size the file to %lld bytes: %s", w->path, (long long)size, strerror(errno));
  }
  /* durable before it is visible: the data reaches the disk, then the
   * rename replaces the old file in one step, then the directory entry is
   * synced; a crash or a kill at any point leaves the old file or the new */
  if (fsync(w->fd) != 0) {
    w->failed = 1;
    return TIDE_ERR(TIDE_E_IO, "%s: fsync failed: %s", w->path, strerror(errno));
  }
  if (close(w->fd) != 0) {
    int e = errno;
    w->fd = -1;
    unlink(w->tmp);
    return TIDE_ERR(TIDE_E_IO, "%s: close failed: %s", w->path, strerror(e));
  }
  w->fd = -1;
  if (rename(w->tmp, w->path) != 0) {
    int e = errno;
    unlink(w->tmp);
    return TIDE_ERR(TIDE_E_IO, "cannot rename '%s' to '%s': %s", w->tmp, w->path, strerror(e));
  }
  const char *slash = strrchr(w->path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == w->path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - w->path), w->path);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd); /* best effort: some file systems refuse a directory fsync */
    close(dfd);
  }
  return TIDE_OK;
}
