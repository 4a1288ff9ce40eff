/* tokenizer_internal.h - the loaded form of a tokenizer.json, shared by
 * tokenizer_load.c (JSON -> tables), tokenizer_bpe.c (hash tables, merges,
 * pre-token cache) and tokenizer.c (the encode/decode pipeline). Not public. */
#ifndef TIDE_TOKENIZER_INTERNAL_H
#define TIDE_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tide_internal.h"

/* ---- a bytes -> int32 hash map with keys copied into its own arena ---- */
typedef struct tok_slot {
  uint32_t hash;     /* low 32 bits of the key hash */
  uint32_t off;      /* key offset in arena; UINT32_MAX = empty slot */
  uint32_t len;      /* key bytes */
  int32_t val;
} tok_slot;

typedef struct tok_map {
  tok_slot *slots;
  uint32_t mask;     /* capacity - 1 (power of two) */
  uint32_t n;
  char *arena;
  size_t arena_len, arena_cap;
} tok_map;

uint64_t tok_hash(const void *p, size_t n);
int tok_map_init(tok_map *m, uint32_t expect);
void tok_map_free(tok_map *m);
/* Insert or overwrite. Returns TIDE_OK or TIDE_E_NOMEM. */
int tok_map_put(tok_map *m, const char *k, size_t n, int32_t val);
/* The value, or -1 if absent. */
int32_t tok_map_get(const tok_map *m, const char *k, size_t n);
static inline const char *tok_map_key(const tok_map *m, const tok_slot *s) { return m->arena + s->off; }

/* ---- merges: (left id, right id) -> (rank, merged id) ---- */
typedef struct tok_pair_slot {
  uint64_t key;      /* (left << 32) | right; UINT64_MAX = empty */
  int32_t rank;
  int32_t merged;
} tok_pair_slot;

typedef struct tok_merge {
  int32_t left, right, merged;
} tok_merge;

/* ---- the BPE model ---- */
typedef struct tok_bpe {
  int bytes_mode;          /* symbols are raw bytes (ByteLevel vocabularies) */
  int byte_fallback;       /* unknown chars -> <0xXX> tokens */
  int fuse_unk;
  int ignore_merges;       /* a pre-token found whole in the vocab is one token */
  int32_t unk_id;          /* -1 if none */
  tok_map vocab;           /* symbol bytes -> id (raw bytes in bytes_mode) */
  int32_t byte_id[256];    /* bytes_mode: id of each single byte (-1 none) */
  int32_t fallback_id[256];/* byte_fallback: id of <0xXX> (-1 none) */
  tok_pair_slot *pairs;    /* open addressing, pair_mask + 1 slots */
  uint64_t pair_mask;
  tok_merge *merges;       /* by rank */
  int32_t n_merges;
} tok_bpe;

/* Look up the merge of (a, b): rank or -1; *merged receives the new id. */
static inline int32_t tok_pair_get(const tok_bpe *b, int32_t l, int32_t r, int32_t *merged) {
  uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  for (uint64_t i = h & b->pair_mask;; i = (i + 1) & b->pair_mask) {
    const tok_pair_slot *s = &b->pairs[i];
    if (s->key == key) {
      *merged = s->merged;
      return s->rank;
    }
    if (s->key == UINT64_MAX) return -1;
  }
}
int tok_pairs_build(tok_bpe *b);

/* ---- the pre-token cache: pre-token bytes -> ids ---- */
typedef struct tok_cache_slot {
  uint64_t hash;
  uint32_t key_off, key_len;   /* in the cache arena; key_len == 0: empty */
  uint32_t ids_off, n_ids;     /* int32 ids at arena + ids_off (4-byte aligned) */
} tok_cache_slot;

typedef struct tok_cache {
  tok_cache_slot *slots;
  uint32_t mask, n, max_n;
  char *arena;
  size_t arena_len, arena_cap;
  int64_t hits, misses;
} tok_cache;

enum { TOK_CACHE_MAX_KEY = 96 };   /* longer pre-tokens are not cached */

/* ---- BPE scratch ---- */
typedef struct tok_sym {
  int32_t id, prev, next;
} tok_sym;

typedef struct tok_bpe_scratch {
  tok_sym *sym;
  size_t sym_cap;
  uint64_t *heap;
  size_t heap_cap;
} tok_bpe_scratch;

/* Append the ids of one pre-token (`n` bytes) to *out (grown as needed).
 * Uses the cache when `cache` is non-NULL. */
int tok_bpe_word(const tok_bpe *b, tok_bpe_scratch *sc, tok_cache *cache, const char *p, size_t n,
                 tide_tok_ids *out);
/* The readable reference for the merge loop: repeatedly merge the
 * lowest-rank adjacent pair (leftmost on ties) by rescanning the whole word.
 * Same contract as tok_bpe_word without the cache; O(n^2), tests only. */
int tok_bpe_word_ref(const tok_bpe *b, const char *p, size_t n, tide_tok_ids *out);
/* The symbols a word starts from (before merges): chars/bytes mapped to ids,
 * unknowns to byte fallback or unk. Appends to *out. */
int tok_bpe_initial(const tok_bpe *b, const char *p, size_t n, tide_tok_ids *out);
int tok_ids_reserve(tide_tok_ids *o, int64_t more);

int tok_cache_init(tok_cache *c, uint32_t max_entries);
void tok_cache_free(tok_cache *c);
void tok_bpe_scratch_free(tok_bpe_scratch *sc);

/* ---- UTF-8 ---- */
/* Length of the valid UTF-8 character at p (1..4), or 0 if the bytes at p do
 * not start one; then *bad = the maximal invalid subpart to replace (>= 1). */
int tok_utf8_char(const unsigned char *p, size_t n, int *bad);
/* Index of the first invalid byte, or n if all of p is valid UTF-8. */
size_t tok_utf8_valid_upto(const char *p, size_t n);

/* ---- normalizers, pre-tokenizers, decoders ---- */
enum {
  NORM_PREPEND, NORM_REPLACE_STR, NORM_REPLACE_RE, NORM_STRIP
};
typedef struct tok_norm {
  int kind;
  char *a; size_t alen;      /* PREPEND text; REPLACE pattern string */
  char *b; size_t blen;      /* REPLACE content */
  pcre2_code *re;            /* REPLACE_RE */
  int left, right;           /* STRIP */
} tok_norm;

enum {
  SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS
};
enum {
  PRE_SPLIT,       /* regex split with a behaviour */
  PRE_BYTELEVEL,   /* optional prefix space (+ the GPT-2 split if use_regex) */
  PRE_METASPACE    /* ' ' -> replacement, prepend, optional split */
};
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

typedef struct tok_pre {
  int kind;
  const char *name;          /* JSON type, for describe() */
  pcre2_code *re;            /* SPLIT (and BYTELEVEL/METASPACE when they split) */
  int behavior, invert;
  int add_prefix_space;      /* BYTELEVEL */
  char repl[8]; int repl_len;/* METASPACE replacement (UTF-8) */
  int prepend;               /* METASPACE scheme */
  int split;                 /* METASPACE split on the replacement */
} tok_pre;

enum { TOK_MAX_STAGES = 16 };

typedef struct tok_added {
  int32_t id;
  uint32_t off, len;         /* content in tok->strings */
  uint32_t noff, nlen;       /* normalized content (normalized tokens) */
  uint8_t lstrip, rstrip, single_word, normalized, special;
} tok_added;

/* A byte trie over added-token contents, for leftmost-longest matching. */
typedef struct tok_trie_node {
  int32_t child;             /* first child, -1 none */
  int32_t sibling;           /* next sibling, -1 none */
  int32_t token;             /* index into tok->added, -1 if not terminal */
  uint8_t byte;
} tok_trie_node;

typedef struct tok_trie {
  tok_trie_node *nodes;
  int32_t n, cap;
  uint8_t first[256];        /* 1 if some content starts with this byte */
  int first_only;            /* the only first byte if there is one, else -1 */
  int n_tokens;
} tok_trie;

/* ---- the scratch one encode call uses ---- */
typedef struct tok_ws {
  pcre2_match_data *md[TOK_MAX_STAGES + 2];  /* per pre-tokenizer stage; [MAX]: normalizers; [MAX+1]: checks */
  char *clean; size_t clean_cap;     /* input with invalid UTF-8 replaced */
  char *norm; size_t norm_cap;       /* normalized segment */
  char *norm2; size_t norm2_cap;
  char *stage[TOK_MAX_STAGES]; size_t stage_cap[TOK_MAX_STAGES];  /* rewritten pieces */
  tok_bpe_scratch bpe;
  tok_cache cache;                   /* only the tokenizer's own workspace */
  int has_cache;
} tok_ws;

struct tide_tokenizer {
  int64_t refs;                      /* atomic: the owner's, each streamer's, tide_tokenizer_retain's */
  char *path;                        /* the tokenizer.json read */
  tok_bpe bpe;
  int32_t n_ids;                     /* vocab size (max id + 1) */
  /* per id: vocabulary text and decoded bytes, both in `strings` */
  uint32_t *text_off, *text_len, *dec_off, *dec_len;   /* len UINT32_MAX: no token */
  uint8_t *id_special;
  char *strings; size_t strings_len, strings_cap;
  tok_map text_map;                  /* vocabulary text -> id (model + added) */
  /* added tokens */
  tok_added *added; int n_added;
  tok_trie trie_raw, trie_norm;      /* non-normalized / normalized contents */
  /* pipeline */
  tok_norm norms[TOK_MAX_STAGES]; int n_norms;
  tok_pre pres[TOK_MAX_STAGES]; int n_pres;
  /* post-processing for ADD_SPECIAL */
  int32_t prefix[8], suffix[8]; int n_prefix, n_suffix;
  /* decoder */
  int dec_first_strip;               /* strip one leading ' ' from the first token (Metaspace) */
  char strip_char[8]; int strip_char_len;  /* whole-text Strip (after Fuse) */
  int strip_start, strip_stop;
  int cleanup_spaces;                /* clean_up_tokenization_spaces */
  /* named ids */
  int32_t bos_id, eos_id, pad_id, unk_id;
  int adds_bos, adds_eos;
  char *chat_template;
  char describe[256];
  pcre2_code *re_word, *re_space;    /* \w and \s, for single_word and lstrip/rstrip */
  /* the shared workspace, taken with an atomic flag */
  tok_ws ws;
  int ws_busy;
};

/* Run the encode pipeline but hand each final pre-token to cb instead of
 * BPE (added tokens still land in *added). For tests of the pre-tokenizers. */
int tok_pretokenize(const tide_tokenizer *tok, const char *text, size_t len, int flags,
                    void (*cb)(void *ud, const char *p, size_t n), void *ud, tide_tok_ids *added);
int tok_ws_init(const tide_tokenizer *tok, tok_ws *ws, int with_cache);
void tok_ws_free(tok_ws *ws);
/* Apply the normalizers to src[0..n) into a workspace buffer; out and out_n
 * point at the result (may be src itself when nothing changes). */
int tok_normalize(const tide_tokenizer *tok, tok_ws *ws, const char *src, size_t n,
                  const char **out, size_t *out_n);
/* Grow a byte buffer to at least `need` bytes (grow-only). */
int tok_grow(char **buf, size_t *cap, size_t need);
int tok_trie_add(tok_trie *t, const char *s, size_t n, int token);
/* Longest added token starting at p (max n bytes) in the trie: its index in
 * tok->added and *len, or -1. */
int tok_trie_longest(const tok_trie *t, const unsigned char *p, size_t n, size_t *len);
pcre2_general_context *tok_pcre_gctx(void);
/* Compile a tokenizer.json regex for PCRE2 (UTF + UCP, JIT when available). */
pcre2_code *tok_regex_compile(const char *pat, size_t n, int literal, char *err, size_t errn);

#endif
