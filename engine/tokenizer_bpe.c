/* tokenizer_bpe.c - the BPE model: hash tables for the vocabulary and the
 * merges, the merge loop (a binary heap over a linked list of symbols, so a
 * long word costs O(n log n), not O(n^2)), its rescanning reference, and the
 * cache of pre-token results. */
#include <stdlib.h>

#include "tokenizer_internal.h"

/* ---- hashing ---- */
static inline uint64_t rd64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* A small multiply-xorshift hash over 8-byte words; good enough for token
 * strings and cheap for the short keys that dominate. */
uint64_t tok_hash(const void *data, size_t n) {
  const unsigned char *p = data;
  uint64_t h = 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull);
  while (n >= 8) {
    h = (h ^ rd64(p)) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v ^ ((uint64_t)n << 56)) * 0x94D049BB133111EBull;
    h ^= h >> 29;
  }
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

/* ---- bytes -> int32 map ---- */
int tok_map_init(tok_map *m, uint32_t expect) {
  memset(m, 0, sizeof *m);
  uint32_t cap = 16;
  while (cap < expect * 2u) cap <<= 1;
  m->slots = tide_xmalloc(sizeof(tok_slot) * cap);
  if (!m->slots) return TIDE_E_NOMEM;
  for (uint32_t i = 0; i < cap; i++) m->slots[i].off = UINT32_MAX;
  m->mask = cap - 1;
  return TIDE_OK;
}

void tok_map_free(tok_map *m) {
  tide_xfree(m->slots);
  tide_xfree(m->arena);
  memset(m, 0, sizeof *m);
}

static int map_grow(tok_map *m) {
  uint32_t cap = (m->mask + 1) * 2;
  tok_slot *ns = tide_xmalloc(sizeof(tok_slot) * cap);
  if (!ns) return TIDE_E_NOMEM;
  for (uint32_t i = 0; i < cap; i++) ns[i].off = UINT32_MAX;
  for (uint32_t i = 0; i <= m->mask; i++) {
    tok_slot *s = &m->slots[i];
    if (s->off == UINT32_MAX) continue;
    uint32_t j = s->hash & (cap - 1);
    while (ns[j].off != UINT32_MAX) j = (j + 1) & (cap - 1);
    ns[j] = *s;
  }
  tide_xfree(m->slots);
  m->slots = ns;
  m->mask = cap - 1;
  return TIDE_OK;
}

int tok_map_put(tok_map *m, const char *k, size_t n, int32_t val) {
  if ((m->n + 1) * 2 > m->mask + 1) TIDE_CHECK(map_grow(m));
  uint32_t h = (uint32_t)tok_hash(k, n);
  uint32_t i = h & m->mask;
  for (;; i = (i + 1) & m->mask) {
    tok_slot *s = &m->slots[i];
    if (s->off == UINT32_MAX) break;
    if (s->hash == h && s->len == n && memcmp(m->arena + s->off, k, n) == 0) {
      s->val = val;
      return TIDE_OK;
    }
  }
  if (m->arena_len + n + 1 > m->arena_cap) {
    size_t cap = m->arena_cap ? m->arena_cap : 4096;
    while (cap < m->arena_len + n + 1) cap *= 2;
    char *na = tide_xrealloc(m->arena, cap);
    if (!na) return TIDE_E_NOMEM;
    m->arena = na;
    m->arena_cap = cap;
  }
  if (m->arena_len + n + 1 > UINT32_MAX) return TIDE_ERR(TIDE_E_NOMEM, "vocabulary text over 4 GB");
  memcpy(m->arena + m->arena_len, k, n);
  m->arena[m->arena_len + n] = 0;
  tok_slot *s = &m->slots[i];
  s->hash = h;
  s->off = (uint32_t)m->arena_len;
  s->len = (uint32_t)n;
  s->val = val;
  m->arena_len += n + 1;
  m->n++;
  return TIDE_OK;
}

int32_t tok_map_get(const tok_map *m, const char *k, size_t n) {
  if (!m->slots) return -1;
  uint32_t h = (uint32_t)tok_hash(k, n);
  for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
    const tok_slot *s = &m->slots[i];
    if (s->off == UINT32_MAX) return -1;
    if (s->hash == h && s->len == n && memcmp(m->arena + s->off, k, n) == 0) return s->val;
  }
}

/* ---- merges ---- */
int tok_pairs_build(tok_bpe *b) {
  uint64_t cap = 16;
  while (cap < (uint64_t)b->n_merges * 2 + 2) cap <<= 1;
  b->pairs = tide_xmalloc(sizeof(tok_pair_slot) * cap);
  if (!b->pairs) return TIDE_E_NOMEM;
  for (uint64_t i = 0; i < cap; i++) b->pairs[i].key = UINT64_MAX;
  b->pair_mask = cap - 1;
  for (int32_t r = 0; r < b->n_merges; r++) {
    const tok_merge *mg = &b->merges[r];
    uint64_t key = ((uint64_t)(uint32_t)mg->left << 32) | (uint32_t)mg->right;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    uint64_t i = h & b->pair_mask;
    while (b->pairs[i].key != UINT64_MAX && b->pairs[i].key != key) i = (i + 1) & b->pair_mask;
    /* a duplicated merge keeps its first (lowest) rank, like tokenizers */
    if (b->pairs[i].key == key) continue;
    b->pairs[i].key = key;
    b->pairs[i].rank = r;
    b->pairs[i].merged = mg->merged;
  }
  return TIDE_OK;
}

/* ---- UTF-8 ---- */
int tok_utf8_char(const unsigned char *p, size_t n, int *bad) {
  unsigned c = p[0];
  *bad = 1;
  if (c < 0x80) return 1;
  int need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0; /* 80..C1, F5..FF: never a lead byte */
  }
  /* the WHATWG rule: the maximal subpart is the lead byte plus the
   * continuation bytes that were still acceptable */
  for (int i = 1; i <= need; i++) {
    if ((size_t)i >= n) {
      *bad = i;
      return 0;
    }
    unsigned d = p[i];
    if (d < lo || d > hi) {
      *bad = i;
      return 0;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

size_t tok_utf8_valid_upto(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n && (rd64(p + i) & 0x8080808080808080ull) == 0) {
      i += 8;
      continue;
    }
    if (p[i] < 0x80) {
      i++;
      continue;
    }
    int bad;
    int l = tok_utf8_char(p + i, n - i, &bad);
    if (!l) return i;
    i += (size_t)l;
  }
  return n;
}

/* ---- output arrays ---- */
int tok_ids_reserve(tide_tok_ids *o, int64_t more) {
  if (o->n + more <= o->cap) return TIDE_OK;
  int64_t cap = o->cap ? o->cap : 256;
  while (cap < o->n + more) cap *= 2;
  int32_t *ni = tide_xrealloc(o->ids, (size_t)cap * sizeof(int32_t));
  if (!ni) return TIDE_E_NOMEM;
  o->ids = ni;
  o->cap = cap;
  return TIDE_OK;
}

static inline int push_id(tide_tok_ids *o, int32_t id) {
  if (o->n == o->cap) TIDE_CHECK(tok_ids_reserve(o, 1));
  o->ids[o->n++] = id;
  return TIDE_OK;
}

/* ---- initial symbols ---- */
int tok_bpe_initial(const tok_bpe *b, const char *s, size_t n, tide_tok_ids *out) {
  const unsigned char *p = (const unsigned char *)s;
  int last_unk = 0;
  if (b->bytes_mode) {
    TIDE_CHECK(tok_ids_reserve(out, (int64_t)n));
    for (size_t i = 0; i < n; i++) {
      int32_t id = b->byte_id[p[i]];
      if (id >= 0) {
        out->ids[out->n++] = id;
        last_unk = 0;
      } else if (b->unk_id >= 0 && !(b->fuse_unk && last_unk)) {
        out->ids[out->n++] = b->unk_id;
        last_unk = 1;
      }
    }
    return TIDE_OK;
  }
  size_t i = 0;
  while (i < n) {
    int bad;
    int l = tok_utf8_char(p + i, n - i, &bad);
    if (!l) l = bad; /* cannot happen on sanitized text; stay safe anyway */
    int32_t id = tok_map_get(&b->vocab, s + i, (size_t)l);
    if (id >= 0) {
      TIDE_CHECK(push_id(out, id));
      last_unk = 0;
    } else {
      int done = 0;
      if (b->byte_fallback) {
        int all = 1;
        for (int k = 0; k < l; k++)
          if (b->fallback_id[p[i + k]] < 0) all = 0;
        if (all) {
          for (int k = 0; k < l; k++) TIDE_CHECK(push_id(out, b->fallback_id[p[i + k]]));
          done = 1;
          last_unk = 0;
        }
      }
      if (!done && b->unk_id >= 0) {
        if (!(b->fuse_unk && last_unk)) TIDE_CHECK(push_id(out, b->unk_id));
        last_unk = 1;
      }
    }
    i += (size_t)l;
  }
  return TIDE_OK;
}

/* ---- the merge loop ----
 * Symbols form a doubly linked list in sym[]; the heap holds candidate merges
 * as (rank << 32 | left position). A popped candidate is applied only if the
 * pair at that position is still exactly the pair of that rank (ranks name
 * merges uniquely, so this detects every stale entry). Ties in rank go to
 * the leftmost position, as in tokenizers. */
static inline void heap_push(uint64_t *h, size_t *n, uint64_t v) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h[p] <= v) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0];
  uint64_t v = h[--(*n)];
  size_t i = 0, m = *n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= m) break;
    if (c + 1 < m && h[c + 1] < h[c]) c++;
    if (v <= h[c]) break;
    h[i] = h[c];
    i = c;
  }
  if (m) h[i] = v;
  return top;
}

static int scratch_reserve(tok_bpe_scratch *sc, size_t n) {
  if (n > sc->sym_cap) {
    size_t cap = sc->sym_cap ? sc->sym_cap : 64;
    while (cap < n) cap *= 2;
    tok_sym *ns = tide_xrealloc(sc->sym, cap * sizeof(tok_sym));
    if (!ns) return TIDE_E_NOMEM;
    sc->sym = ns;
    sc->sym_cap = cap;
  }
  /* each merge pushes at most two candidates: n initial + 2n */
  if (3 * n > sc->heap_cap) {
    size_t cap = sc->heap_cap ? sc->heap_cap : 192;
    while (cap < 3 * n) cap *= 2;
    uint64_t *nh = tide_xrealloc(sc->heap, cap * sizeof(uint64_t));
    if (!nh) return TIDE_E_NOMEM;
    sc->heap = nh;
    sc->heap_cap = cap;
  }
  return TIDE_OK;
}

void tok_bpe_scratch_free(tok_bpe_scratch *sc) {
  tide_xfree(sc->sym);
  tide_xfree(sc->heap);
  memset(sc, 0, sizeof *sc);
}

/* Merge out->ids[start..] in place. */
static int bpe_merge(const tok_bpe *b, tok_bpe_scratch *sc, tide_tok_ids *out, int64_t start) {
  size_t n = (size_t)(out->n - start);
  if (n < 2) return TIDE_OK;
  int32_t *ids = out->ids + start;
  if (n == 2) { /* the most common case after the cache: no heap needed */
    int32_t m;
    if (tok_pair_get(b, ids[0], ids[1], &m) >= 0) {
      ids[0] = m;
      out->n--;
    }
    return TIDE_OK;
  }
  TIDE_CHECK(scratch_reserve(sc, n));
  tok_sym *sym = sc->sym;
  uint64_t *heap = sc->heap;
  size_t hn = 0;
  for (size_t i = 0; i < n; i++) {
    sym[i].id = ids[i];
    sym[i].prev = (int32_t)i - 1;
    sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    int32_t m;
    int32_t r = tok_pair_get(b, ids[i], ids[i + 1], &m);
    if (r >= 0) heap_push(heap, &hn, ((uint64_t)(uint32_t)r << 32) | (uint32_t)i);
  }
  while (hn) {
    uint64_t top = heap_pop(heap, &hn);
    int32_t rank = (int32_t)(top >> 32);
    int32_t pos = (int32_t)(uint32_t)top;
    tok_sym *s = &sym[pos];
    if (s->id < 0 || s->next < 0) continue;
    const tok_merge *mg = &b->merges[rank];
    tok_sym *t = &sym[s->next];
    if (s->id != mg->left || t->id != mg->right) continue; /* stale */
    s->id = mg->merged;
    t->id = -1;
    s->next = t->next;
    if (t->next >= 0) sym[t->next].prev = pos;
    int32_t m;
    if (s->prev >= 0) {
      int32_t r = tok_pair_get(b, sym[s->prev].id, s->id, &m);
      if (r >= 0) heap_push(heap, &hn, ((uint64_t)(uint32_t)r << 32) | (uint32_t)s->prev);
    }
    if (s->next >= 0) {
      int32_t r = tok_pair_get(b, s->id, sym[s->next].id, &m);
      if (r >= 0) heap_push(heap, &hn, ((uint64_t)(uint32_t)r << 32) | (uint32_t)pos);
    }
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids[k++] = sym[i].id;
  out->n = start + (int64_t)k;
  return TIDE_OK;
}

/* ---- the cache ---- */
int tok_cache_init(tok_cache *c, uint32_t max_entries) {
  memset(c, 0, sizeof *c);
  uint32_t cap = 1024;
  while (cap < max_entries * 2u) cap <<= 1;
  c->slots = tide_xcalloc(cap, sizeof(tok_cache_slot));
  if (!c->slots) return TIDE_E_NOMEM;
  c->mask = cap - 1;
  c->max_n = max_entries;
  c->arena_cap = (size_t)max_entries * 48;
  c->arena = tide_xmalloc(c->arena_cap);
  if (!c->arena) {
    tide_xfree(c->slots);
    c->slots = NULL;
    return TIDE_E_NOMEM;
  }
  return TIDE_OK;
}

void tok_cache_free(tok_cache *c) {
  tide_xfree(c->slots);
  tide_xfree(c->arena);
  memset(c, 0, sizeof *c);
}

static void cache_clear(tok_cache *c) {
  memset(c->slots, 0, sizeof(tok_cache_slot) * ((size_t)c->mask + 1));
  c->n = 0;
  c->arena_len = 0;
}

/* Remember ids for key; when the cache is full it starts over (cheap, and a
 * working set larger than the cache gains little from smarter eviction). */
static void cache_put(tok_cache *c, uint64_t h, const char *k, size_t kn, const int32_t *ids,
                      size_t n) {
  size_t need = ((kn + 3) & ~(size_t)3) + n * 4;
  if (c->n >= c->max_n || c->arena_len + need > c->arena_cap) {
    if (need > c->arena_cap / 4) return;
    cache_clear(c);
  }
  uint32_t i = (uint32_t)h & c->mask;
  while (c->slots[i].key_len) i = (i + 1) & c->mask;
  tok_cache_slot *s = &c->slots[i];
  s->hash = h;
  s->key_off = (uint32_t)c->arena_len;
  s->key_len = (uint32_t)kn;
  memcpy(c->arena + c->arena_len, k, kn);
  c->arena_len += (kn + 3) & ~(size_t)3;
  s->ids_off = (uint32_t)c->arena_len;
  s->n_ids = (uint32_t)n;
  memcpy(c->arena + c->arena_len, ids, n * 4);
  c->arena_len += n * 4;
  c->n++;
}

int tok_bpe_word(const tok_bpe *b, tok_bpe_scratch *sc, tok_cache *cache, const char *p, size_t n,
                 tide_tok_ids *out) {
  if (n == 0) return TIDE_OK;
  uint64_t h = 0;
  int cacheable = cache && cache->slots && n <= TOK_CACHE_MAX_KEY;
  if (cacheable) {
    h = tok_hash(p, n);
    for (uint32_t i = (uint32_t)h & cache->mask;; i = (i + 1) & cache->mask) {
      const tok_cache_slot *s = &cache->slots[i];
      if (!s->key_len) break;
      if (s->hash == h && s->key_len == n && memcmp(cache->arena + s->key_off, p, n) == 0) {
        TIDE_CHECK(tok_ids_reserve(out, s->n_ids));
        memcpy(out->ids + out->n, cache->arena + s->ids_off, (size_t)s->n_ids * 4);
        out->n += s->n_ids;
        cache->hits++;
        return TIDE_OK;
      }
    }
    cache->misses++;
  }
  int64_t start = out->n;
  int32_t whole;
  if (b->ignore_merges && (whole = tok_map_get(&b->vocab, p, n)) >= 0) {
    TIDE_CHECK(push_id(out, whole));
  } else {
    TIDE_CHECK(tok_bpe_initial(b, p, n, out));
    TIDE_CHECK(bpe_merge(b, sc, out, start));
  }
  if (cacheable) cache_put(cache, h, p, n, out->ids + start, (size_t)(out->n - start));
  return TIDE_OK;
}

int tok_bpe_word_ref(const tok_bpe *b, const char *p, size_t n, tide_tok_ids *out) {
  int64_t start = out->n;
  int32_t whole;
  if (b->ignore_merges && (whole = tok_map_get(&b->vocab, p, n)) >= 0) return push_id(out, whole);
  TIDE_CHECK(tok_bpe_initial(b, p, n, out));
  for (;;) {
    int32_t *ids = out->ids + start;
    int64_t m = out->n - start;
    int64_t best = -1;
    int32_t best_rank = INT32_MAX, best_merged = -1;
    for (int64_t i = 0; i + 1 < m; i++) {
      int32_t merged;
      int32_t r = tok_pair_get(b, ids[i], ids[i + 1], &merged);
      if (r >= 0 && r < best_rank) {
        best_rank = r;
        best = i;
        best_merged = merged;
      }
    }
    if (best < 0) break;
    ids[best] = best_merged;
    memmove(ids + best + 1, ids + best + 2, (size_t)(m - best - 2) * sizeof(int32_t));
    out->n--;
  }
  return TIDE_OK;
}
