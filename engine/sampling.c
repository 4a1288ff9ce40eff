/* sampling.c - the C half of sampling: the per-request RNG, the candidates
 * set and the operations stages apply to it, token histories with counts,
 * DRY, logprobs of a row, and the file stamp used by hot reload.
 *
 * Selection strategy (all in canonical order: logit desc, ties to the
 * smaller id):
 *  - a few best candidates (top-k, the first 256 of a nucleus, top-N
 *    logprobs): a heap of m entries fed by a vectorised search for the next
 *    value above the heap's worst, so most of the row is touched once;
 *  - many candidates: a 1024-bucket histogram over the key range (counts,
 *    and probability mass for top-p/typical) finds the bucket holding the
 *    boundary; only that bucket is sorted;
 *  - a set is then cut by a threshold (key, id) with one stable pass, which
 *    keeps the relative order (and hence any sorted prefix).
 * Nothing here allocates per call once a set's scratch buffers exist. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sample_kernels.h"
#include "tide_internal.h"

/* ======================================================================== */
/* RNG: splitmix64 for seeding, xoshiro256** for the stream                  */
/* ======================================================================== */

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void tide_rng_seed(tide_rng *r, uint64_t seed) {
  if (!r) return;
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
  /* splitmix64 is a bijection of its counter, so four zero words cannot
   * come out of it; keep the guard for hand-written states anyway */
  if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3])) r->s[0] = 1;
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tide_rng_next(tide_rng *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl64(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl64(s[3], 45);
  return out;
}

double tide_rng_uniform(tide_rng *r) { return (double)(tide_rng_next(r) >> 11) * 0x1.0p-53; }

/* ======================================================================== */
/* candidates: scratch                                                       */
/* ======================================================================== */

enum { NBUCKETS = 1024, HEAP_MAX = 1024, HEAP_TRY = 256 };

typedef struct cpriv {
  int32_t *id2;        /* [cap] the other half of each double buffer */
  float *logit2;
  float *p2;
  int32_t *pos;        /* [cap] positions */
  int32_t *where;      /* [cap] id -> position (only entries of current ids are meaningful) */
  uint64_t *k1, *k2;   /* [cap] sort keys */
  void *radix;         /* radix sort counters */
  float *key;          /* [cap] derived keys (typical) */
  double *bsum;        /* [cap / 64 + 1] block sums of the draw */
  int32_t *heap;       /* [cap] positions chosen by the heap */
  void *hents;         /* [hcap] heap entries */
  int64_t hent_cap;
  int32_t *hcnt;       /* [2 (NBUCKETS + 1)] */
  double *hmass;       /* [2 (NBUCKETS + 1)] */
  uint16_t *bkt;       /* [cap] bucket of each position */
  float min_logit;     /* smallest logit above -inf, with c->max_logit, while has_p */
  uint8_t *bits;       /* [cap / 8 + 1] distinctness check, all zero between calls */
  /* trace */
  float *raw;          /* [cap] softmax of the raw row, by id */
  int has_raw;
  float *byid;         /* [cap] input probabilities by id, all zero between stages */
  int32_t *tr_ids;     /* [cap] ids of the traced stage's input */
  int64_t tr_n;
  int tr_on;
  /* DRY */
  int32_t *dry_rev;    /* [cap of the history] newest first */
  int32_t *dry_z;
  int64_t dry_cap, dry_zcap;
  int32_t *dry_best;   /* [cap] longest repeat a token would extend, all zero between calls */
  int32_t *dry_touched;
  int64_t dry_tcap;
  /* logit bias on a set that is not a whole row */
  int32_t *bias_pos;
  int64_t bias_cap;
} cpriv;

#define PRIV(c) ((cpriv *)(c)->priv)

static const tide_sample_kernels *K(void) { return tide_sample_kernels_get(); }

/* Allocate *slot (bytes) once; 0 on success. */
static int need(void *slot, size_t bytes, int zero) {
  void **s = (void **)slot;
  if (*s) return 0;
  *s = zero ? tide_xcalloc(1, bytes ? bytes : 1) : tide_xmalloc(bytes ? bytes : 1);
  return *s ? 0 : TIDE_E_NOMEM;
}

/* Grow-only buffer of `elem`-byte entries. */
static int grow(void *slot, int64_t *cap, int64_t want, size_t elem) {
  void **s = (void **)slot;
  if (*s && *cap >= want) return 0;
  int64_t nc = *cap > 0 ? *cap : 64;
  while (nc < want) nc *= 2;
  void *p = tide_xmalloc((size_t)nc * elem);
  if (!p) return TIDE_E_NOMEM;
  if (*s) {
    memcpy(p, *s, (size_t)*cap * elem);
    tide_xfree(*s);
  }
  *s = p;
  *cap = nc;
  return 0;
}

int tide_cands_new(tide_cands **out, int64_t cap) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "out is NULL");
  *out = NULL;
  if (cap < 1 || cap > INT32_MAX / 2)
    return TIDE_ERR(TIDE_E_INVALID, "cap = %lld outside 1..%d", (long long)cap, INT32_MAX / 2);
  tide_cands *c = tide_xcalloc(1, sizeof *c);
  cpriv *pv = tide_xcalloc(1, sizeof *pv);
  if (!c || !pv) {
    tide_xfree(c);
    tide_xfree(pv);
    return TIDE_E_NOMEM;
  }
  c->priv = pv;
  c->cap = (int32_t)cap;
  c->id = tide_xmalloc((size_t)cap * 4);
  c->logit = tide_xmalloc((size_t)cap * 4);
  c->p = tide_xmalloc((size_t)cap * 4);
  if (!c->id || !c->logit || !c->p) {
    tide_cands_free(c);
    return TIDE_E_NOMEM;
  }
  c->selected = -1;
  *out = c;
  return TIDE_OK;
}

void tide_cands_free(tide_cands *c) {
  if (!c) return;
  cpriv *pv = PRIV(c);
  if (pv) {
    void *bufs[] = {pv->id2, pv->logit2, pv->p2, pv->pos, pv->where, pv->k1, pv->k2, pv->radix, pv->key,
                    pv->bsum, pv->heap, pv->hents, pv->hcnt, pv->hmass, pv->bkt, pv->bits, pv->raw, pv->byid,
                    pv->tr_ids, pv->dry_rev, pv->dry_z, pv->dry_best, pv->dry_touched,
                    pv->bias_pos};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tide_xfree(bufs[i]);
    tide_xfree(pv);
  }
  tide_xfree(c->id);
  tide_xfree(c->logit);
  tide_xfree(c->p);
  tide_xfree(c);
}

static int check_c(const char *fn, const tide_cands *c) {
  if (!c || !c->priv) return tide_errorf(TIDE_E_INVALID, fn, "candidates are NULL");
  return 0;
}
#define CHECK_C(c) TIDE_CHECK(check_c(__func__, (c)))

/* ======================================================================== */
/* canonical order, sorting, selection                                       */
/* ======================================================================== */

static inline int better(float ka, int32_t ia, float kb, int32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}
/* in the prefix set bounded by (kt, it), i.e. not worse than it */
static inline int in_prefix(float k, int32_t i, float kt, int32_t it) {
  return k > kt || (k == kt && i <= it);
}
#define IDOF(id, p) ((id) ? (id)[p] : (int32_t)(p))

/* Maps a float to an unsigned key with the same order (-0 as +0). */
static inline uint32_t fkey(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
/* Ascending order of this key = canonical order (key desc, id asc). */
static inline uint64_t ckey(float k, int32_t id) {
  return ((uint64_t)(~fkey(k)) << 32) | (uint32_t)id;
}

static void insertion_u64(uint64_t *a, int64_t n) {
  for (int64_t i = 1; i < n; i++) {
    uint64_t v = a[i];
    int64_t j = i - 1;
    while (j >= 0 && a[j] > v) {
      a[j + 1] = a[j];
      j--;
    }
    a[j + 1] = v;
  }
}

enum { RADIX_DIGITS = 6, RADIX_BUCKETS = 2048 };

/* Sort a[0..n) ascending; tmp has room for n, hist for RADIX_DIGITS *
 * RADIX_BUCKETS counters. Returns the buffer holding the result (a or tmp). */
static uint64_t *sort_u64(uint64_t *a, uint64_t *tmp, int64_t n, uint32_t (*hist)[RADIX_BUCKETS]) {
  if (n <= 32) {
    insertion_u64(a, n);
    return a;
  }
  if (n <= 4096) {
    /* bottom-up merge sort: runs of 16 by insertion, then merges */
    for (int64_t i = 0; i < n; i += 16) insertion_u64(a + i, n - i < 16 ? n - i : 16);
    uint64_t *src = a, *dst = tmp;
    for (int64_t w = 16; w < n; w *= 2) {
      for (int64_t lo = 0; lo < n; lo += 2 * w) {
        int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
        int64_t i = lo, j = mid, k = lo;
        while (i < mid && j < hi) dst[k++] = src[i] <= src[j] ? src[i++] : src[j++];
        while (i < mid) dst[k++] = src[i++];
        while (j < hi) dst[k++] = src[j++];
      }
      uint64_t *t = src;
      src = dst;
      dst = t;
    }
    return src;
  }
  /* LSD radix, 11-bit digits; a digit shared by every key is skipped */
  enum { D = RADIX_DIGITS, B = RADIX_BUCKETS };
  memset(hist, 0, sizeof(uint32_t) * D * B);
  for (int64_t i = 0; i < n; i++) {
    uint64_t v = a[i];
    for (int d = 0; d < D; d++) hist[d][(v >> (11 * d)) & (B - 1)]++;
  }
  uint64_t *src = a, *dst = tmp;
  for (int d = 0; d < D; d++) {
    uint32_t *h = hist[d];
    if (h[(src[0] >> (11 * d)) & (B - 1)] == (uint32_t)n) continue;
    uint32_t sum = 0;
    for (int b = 0; b < B; b++) {
      uint32_t c = h[b];
      h[b] = sum;
      sum += c;
    }
    for (int64_t i = 0; i < n; i++) {
      uint64_t v = src[i];
      dst[h[(v >> (11 * d)) & (B - 1)]++] = v;
    }
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  return src;
}

/* Sort positions pos[0..cnt) of the set into canonical order of (key, id). */
static int sort_positions(tide_cands *c, const float *key, int32_t *pos, int64_t cnt) {
  cpriv *pv = PRIV(c);
  size_t cap = (size_t)c->cap;
  TIDE_CHECK(need(&pv->k1, cap * 8, 0));
  TIDE_CHECK(need(&pv->k2, cap * 8, 0));
  TIDE_CHECK(need(&pv->where, cap * 4, 1));
  TIDE_CHECK(need(&pv->radix, sizeof(uint32_t) * RADIX_DIGITS * RADIX_BUCKETS, 0));
  const int32_t *id = c->id;
  for (int64_t j = 0; j < cnt; j++) {
    int32_t p = pos[j];
    pv->where[id[p]] = p;
    pv->k1[j] = ckey(key[p], id[p]);
  }
  uint64_t *s = sort_u64(pv->k1, pv->k2, cnt, (uint32_t(*)[RADIX_BUCKETS])pv->radix);
  for (int64_t j = 0; j < cnt; j++) pos[j] = pv->where[(int32_t)(uint32_t)s[j]];
  return 0;
}

/* The heap holds canonical keys (ckey: smaller = better) with their
 * positions; the root is the worst kept. One integer compare per step. */
typedef struct hent {
  uint64_t k;
  int64_t pos;
} hent;

static void sift_down(hent *h, int64_t m, int64_t i) {
  hent v = h[i];
  for (;;) {
    int64_t l = 2 * i + 1;
    if (l >= m) break;
    int64_t w = (l + 1 < m && h[l + 1].k > h[l].k) ? l + 1 : l;
    if (h[w].k <= v.k) break;
    h[i] = h[w];
    i = w;
  }
  h[i] = v;
}

/* The best m of key[0..n) (ids id, or the positions when id is NULL) into
 * out[0..m), best first; hp is scratch for m entries. asc: ids increase
 * with position, so an equal key further on can never win and the search
 * may be strict. */
static int64_t heap_select(const float *key, const int32_t *id, int64_t n, int64_t m, int asc, hent *hp,
                           int32_t *out) {
  if (m > n) m = n;
  if (m <= 0) return 0;
  for (int64_t i = 0; i < m; i++) {
    hp[i].k = ckey(key[i], IDOF(id, i));
    hp[i].pos = i;
  }
  for (int64_t i = m / 2 - 1; i >= 0; i--) sift_down(hp, m, i);
  const tide_sample_kernels *k = K();
  int64_t i = m;
  while (i < n) {
    float wk = key[hp[0].pos];
    i = k->find(key, i, n, wk, !asc);
    if (i >= n) break;
    uint64_t ck = ckey(key[i], IDOF(id, i));
    if (ck < hp[0].k) {
      hp[0].k = ck;
      hp[0].pos = i;
      sift_down(hp, m, 0);
    }
    i++;
  }
  /* heapsort: the worst goes to the end each time */
  for (int64_t e = m - 1; e > 0; e--) {
    hent t = hp[0];
    hp[0] = hp[e];
    hp[e] = t;
    sift_down(hp, e, 0);
  }
  for (int64_t j = 0; j < m; j++) out[j] = (int32_t)hp[j].pos;
  return m;
}

/* heap_select into pv->heap, with pv's scratch */
static int pv_heap(tide_cands *c, const float *key, int64_t m, int64_t *got) {
  cpriv *pv = PRIV(c);
  if (m > c->n) m = c->n; /* no more entries than candidates, whatever the caller asks */
  TIDE_CHECK(need(&pv->heap, (size_t)c->cap * 4, 0));
  TIDE_CHECK(grow(&pv->hents, &pv->hent_cap, m > 0 ? m : 1, sizeof(hent)));
  *got = heap_select(key, c->id, c->n, m, c->ascending, (hent *)pv->hents, pv->heap);
  return 0;
}

typedef struct {
  float kt;      /* the boundary: the worst member of the prefix */
  int32_t it;
  int64_t len;   /* members of the prefix */
  int all;       /* 1: the whole set (no boundary) */
} thresh;

/* Boundary of the shortest prefix of (key desc, id asc) over the set with
 * at least `target` members (w == NULL) or weight sum >= target (> when
 * strict), by a histogram over the key range; the boundary bucket alone is
 * sorted. */
static int hist_threshold(tide_cands *c, const float *key, const float *w, double target,
                          int strict, thresh *out) {
  cpriv *pv = PRIV(c);
  int64_t n = c->n;
  const int32_t *id = c->id;
  /* two copies (position i % 2) so that neighbours in one bucket do not
   * wait on each other's stores, small enough (24 KB) to stay in L1 */
  enum { NC = 2, NB1 = NBUCKETS + 1 };
  TIDE_CHECK(need(&pv->hcnt, NC * NB1 * 4, 0));
  TIDE_CHECK(need(&pv->hmass, NC * NB1 * 8, 0));
  TIDE_CHECK(need(&pv->pos, (size_t)c->cap * 4, 0));
  TIDE_CHECK(need(&pv->bkt, (size_t)c->cap * 2, 0));
  float kmax, kmin;
  if (key == c->logit && c->has_p) {   /* the softmax's scan saw the same logits */
    kmax = c->max_logit;
    kmin = pv->min_logit;
  } else {
    K()->scan(key, n, &kmax, &kmin);
  }
  if (key == c->logit && kmin < kmax - 64.0f) {
    /* logits more than 64 below the max have probability < 1.6e-28 each:
     * they share the last bucket, which matters only if the boundary is there */
    kmin = kmax - 64.0f;
  }
  float scale = 0.0f;
  if (kmin < kmax) {
    scale = (float)NBUCKETS / (kmax - kmin);
    if (!(scale < INFINITY)) scale = 0.0f;   /* a range too small to split: one bucket */
  }
  uint16_t *restrict bk = pv->bkt;
  K()->buckets(bk, key, n, kmax, scale, NBUCKETS);
  int32_t *restrict hc = pv->hcnt;
  double *restrict hm = pv->hmass;
  memset(hc, 0, NC * NB1 * 4);
  if (w) {
    memset(hm, 0, NC * NB1 * 8);
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      int b0 = bk[i], b1 = NB1 + bk[i + 1];
      hc[b0]++;
      hm[b0] += (double)w[i];
      hc[b1]++;
      hm[b1] += (double)w[i + 1];
    }
    if (i < n) {
      hc[bk[i]]++;
      hm[bk[i]] += (double)w[i];
    }
  } else {
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      hc[bk[i]]++;
      hc[NB1 + bk[i + 1]]++;
    }
    if (i < n) hc[bk[i]]++;
  }
  int64_t ccnt = 0;
  double cmass = 0;
  int bb = -1;
  for (int b = 0; b < NB1; b++) {
    int64_t cb = (int64_t)hc[b] + hc[NB1 + b];
    if (!cb) continue;
    double mb = w ? hm[b] + hm[NB1 + b] : 0;
    int hit = w ? (strict ? cmass + mb > target : cmass + mb >= target) : (double)(ccnt + cb) >= target;
    if (hit) {
      bb = b;
      break;
    }
    ccnt += cb;
    cmass += mb;
  }
  if (bb < 0) {
    out->all = 1;
    out->len = n;
    return 0;
  }
  int64_t cnt = K()->collect(pv->pos, bk, n, (uint16_t)bb);
  TIDE_CHECK(sort_positions(c, key, pv->pos, cnt));
  int64_t j = cnt - 1;
  if (!w) {
    j = (int64_t)target - ccnt - 1;
    if (j < 0) j = 0;
    if (j > cnt - 1) j = cnt - 1;
  } else {
    double acc = cmass;
    for (int64_t q = 0; q < cnt; q++) {
      acc += (double)w[pv->pos[q]];
      if (strict ? acc > target : acc >= target) {
        j = q;
        break;
      }
    }
  }
  out->all = 0;
  out->kt = key[pv->pos[j]];
  out->it = id[pv->pos[j]];
  out->len = ccnt + j + 1;
  return 0;
}

/* Boundary of the best m (count mode): heap when small, else histogram. */
static int count_threshold(tide_cands *c, const float *key, int64_t m, thresh *out) {
  cpriv *pv = PRIV(c);
  if (m >= c->n) {
    out->all = 1;
    out->len = c->n;
    return 0;
  }
  if (m <= HEAP_MAX) {
    int64_t got;
    TIDE_CHECK(pv_heap(c, key, m, &got));
    int32_t q = pv->heap[m - 1];
    out->all = 0;
    out->kt = key[q];
    out->it = c->id[q];
    out->len = m;
    return 0;
  }
  return hist_threshold(c, key, NULL, (double)m, 0, out);
}

/* Swap the double buffers after writing the new content into them. */
static void swap_buffers(tide_cands *c) {
  cpriv *pv = PRIV(c);
  int32_t *ti = c->id;
  c->id = pv->id2;
  pv->id2 = ti;
  float *tl = c->logit;
  c->logit = pv->logit2;
  pv->logit2 = tl;
  float *tp = c->p;
  c->p = pv->p2;
  pv->p2 = tp;
}

static int need_double(tide_cands *c) {
  cpriv *pv = PRIV(c);
  size_t cap = (size_t)c->cap;
  TIDE_CHECK(need(&pv->id2, cap * 4, 0));
  TIDE_CHECK(need(&pv->logit2, cap * 4, 0));
  TIDE_CHECK(need(&pv->p2, cap * 4, 0));
  return 0;
}

static int ids_ascending(const int32_t *id, int64_t n) {
  for (int64_t i = 1; i < n; i++)
    if (id[i] <= id[i - 1]) return 0;
  return 1;
}

/* New content: positions pos[0..cnt) in that order, then (rest = 1) every
 * other position in its old order, found as those outside the prefix
 * bounded by `t`. p follows along when has_p. */
static int gather(tide_cands *c, const int32_t *pos, int64_t cnt, const float *key,
                  const thresh *t, int rest) {
  TIDE_CHECK(need_double(c));
  cpriv *pv = PRIV(c);
  int64_t w = 0;
  int hp = c->has_p;
  for (int64_t j = 0; j < cnt; j++) {
    int32_t q = pos[j];
    pv->id2[w] = c->id[q];
    pv->logit2[w] = c->logit[q];
    if (hp) pv->p2[w] = c->p[q];
    w++;
  }
  if (rest) {
    for (int64_t i = 0; i < c->n; i++) {
      if (in_prefix(key[i], c->id[i], t->kt, t->it)) continue;
      pv->id2[w] = c->id[i];
      pv->logit2[w] = c->logit[i];
      if (hp) pv->p2[w] = c->p[i];
      w++;
    }
  }
  swap_buffers(c);
  c->n = (int32_t)w;
  c->selected = -1;
  if (!rest) {
    /* a subset: p no longer sums to 1 */
    c->has_p = 0;
  }
  c->ascending = ids_ascending(c->id, c->n);
  return 0;
}

/* Keep (keep_in = 1) or drop (0) the prefix bounded by t, in order. */
static void filter(tide_cands *c, const float *key, const thresh *t, int keep_in) {
  int64_t low = 0;
  int64_t w = K()->compact(c->id, c->logit, key, c->n, t->kt, t->it, keep_in, c->sorted, &low);
  c->n = (int32_t)w;
  c->sorted = (int32_t)low;
  c->has_p = 0;
  c->selected = -1;
  /* a subsequence of increasing ids still increases */
}

/* The best m first (sorted = m), the rest after in their order. */
static int select_sorted(tide_cands *c, int64_t m, int keep_rest) {
  cpriv *pv = PRIV(c);
  TIDE_CHECK(need(&pv->pos, (size_t)c->cap * 4, 0));
  TIDE_CHECK(need(&pv->heap, (size_t)c->cap * 4, 0));
  int64_t n = c->n;
  if (m >= n) {
    for (int64_t i = 0; i < n; i++) pv->pos[i] = (int32_t)i;
    TIDE_CHECK(sort_positions(c, c->logit, pv->pos, n));
    thresh none = {0, 0, 0, 1};
    int hp = c->has_p;
    TIDE_CHECK(gather(c, pv->pos, n, c->logit, &none, 0));
    c->has_p = hp;   /* the same set, reordered */
    c->sorted = (int32_t)n;
    return 0;
  }
  thresh t;
  int32_t *top;
  if (m <= HEAP_MAX) {
    int64_t got;
    TIDE_CHECK(pv_heap(c, c->logit, m, &got));
    top = pv->heap;
    int32_t q = top[m - 1];
    t.kt = c->logit[q];
    t.it = c->id[q];
    t.all = 0;
    t.len = m;
  } else {
    TIDE_CHECK(hist_threshold(c, c->logit, NULL, (double)m, 0, &t));
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++)
      if (in_prefix(c->logit[i], c->id[i], t.kt, t.it)) pv->pos[cnt++] = (int32_t)i;
    TIDE_CHECK(sort_positions(c, c->logit, pv->pos, cnt));
    top = pv->pos;
  }
  int hp = c->has_p;
  TIDE_CHECK(gather(c, top, m, c->logit, &t, keep_rest));
  if (keep_rest) c->has_p = hp;
  c->sorted = (int32_t)m;
  return 0;
}

/* ======================================================================== */
/* candidates: loading and basic operations                                  */
/* ======================================================================== */

static int row_of(const char *fn, const tide_tensor *t, const float **x, int64_t *n) {
  TIDE_CHECK(tide_check_tensor(fn, "logits", t, TIDE_DT(TIDE_F32), -1));
  char sh[64];
  int nd = t->ndim;
  int ok = nd == 1 || (nd == 2 && t->sizes[0] == 1);
  if (!ok || t->strides[nd - 1] != 1 || t->sizes[nd - 1] < 1)
    return tide_errorf(TIDE_E_INVALID, fn, "logits must be one contiguous row [V] or [1, V], got %s",
                       tide_shape_str(t, sh, sizeof sh));
  *x = (const float *)t->data;
  *n = t->sizes[nd - 1];
  return 0;
}

static int bad_values(const char *fn, const float *x, int64_t n, int64_t nbad, const char *what) {
  int64_t first = -1, nnan = 0, ninf = 0;
  for (int64_t i = 0; i < n; i++) {
    if (x[i] != x[i]) {
      nnan++;
      if (first < 0) first = i;
    } else if (x[i] == INFINITY) {
      ninf++;
      if (first < 0) first = i;
    }
  }
  (void)nbad;
  return tide_errorf(TIDE_E_INVALID, fn, "%s hold %lld NaN and %lld +inf values (first at %s %lld)",
                     what, (long long)nnan, (long long)ninf,
                     strcmp(what, "logits") == 0 ? "token" : "position", (long long)first);
}

static void reset_meta(tide_cands *c, int64_t n, int64_t n_vocab) {
  c->n = (int32_t)n;
  c->n_vocab = (int32_t)n_vocab;
  c->sorted = 0;
  c->has_p = 0;
  c->selected = -1;
}

int tide_cands_load(tide_cands *c, const tide_tensor *logits, int flags) {
  CHECK_C(c);
  const float *x;
  int64_t n;
  TIDE_CHECK(row_of(__func__, logits, &x, &n));
  if (n > c->cap)
    return TIDE_ERR(TIDE_E_INVALID, "row of %lld logits is larger than the set (cap %d)", (long long)n,
                    c->cap);
  /* copy into the spare buffer while checking, so a bad row leaves c as it was */
  TIDE_CHECK(need_double(c));
  cpriv *pv = PRIV(c);
  float mx, mn;
  int64_t bad = K()->scan_copy(pv->logit2, x, n, &mx, &mn);
  if (bad) return bad_values(__func__, x, n, bad, "logits");
  if (mx == -INFINITY) return TIDE_ERR(TIDE_E_INVALID, "every one of the %lld logits is -inf", (long long)n);
  pv->has_raw = 0;
  pv->tr_on = 0;
  if (flags & TIDE_CANDS_TRACE) {
    /* the raw distribution by id, so a trace sums it over the kept ids */
    TIDE_CHECK(need(&pv->raw, (size_t)c->cap * 4, 0));
    double sum = K()->expsum(pv->raw, x, n, mx);
    K()->scale(pv->raw, n, (float)(1.0 / sum));
    pv->has_raw = 1;
  }
  float *t = c->logit;
  c->logit = pv->logit2;
  pv->logit2 = t;
  K()->iota(c->id, n);
  reset_meta(c, n, n);
  c->ascending = 1;
  return TIDE_OK;
}

/* ids in [0, lim), distinct; logits without NaN/+inf. */
static int check_set(const char *fn, tide_cands *c, const int32_t *ids, const float *lg, int64_t n,
                     int64_t lim) {
  cpriv *pv = PRIV(c);
  TIDE_CHECK(need(&pv->bits, (size_t)c->cap / 8 + 1, 1));
  int64_t bad = -1;
  const char *why = "";
  int64_t i = 0;
  for (; i < n; i++) {
    int32_t t = ids[i];
    if (t < 0 || t >= lim) {
      bad = i;
      why = "outside the vocabulary";
      break;
    }
    if (pv->bits[t >> 3] & (1u << (t & 7))) {
      bad = i;
      why = "a duplicate";
      break;
    }
    pv->bits[t >> 3] |= (uint8_t)(1u << (t & 7));
  }
  for (int64_t j = 0; j < i; j++) pv->bits[ids[j] >> 3] = 0;
  if (bad >= 0)
    return tide_errorf(TIDE_E_INVALID, fn, "id %d at position %lld is %s (vocabulary %lld)",
                       ids[bad], (long long)bad, why, (long long)lim);
  float mx, mn;
  int64_t nb = K()->scan(lg, n, &mx, &mn);
  if (nb) return bad_values(fn, lg, n, nb, "candidate logits");
  return 0;
}

int tide_cands_set(tide_cands *c, const int32_t *ids, const float *logits, int64_t n) {
  CHECK_C(c);
  if (n < 1 || n > c->cap)
    return TIDE_ERR(TIDE_E_INVALID, "n = %lld outside 1..%d", (long long)n, c->cap);
  if (!ids || !logits) return TIDE_ERR(TIDE_E_INVALID, "ids or logits is NULL");
  TIDE_CHECK(check_set(__func__, c, ids, logits, n, c->cap));
  float mx, mn;
  K()->scan(logits, n, &mx, &mn);
  if (mx == -INFINITY) return TIDE_ERR(TIDE_E_INVALID, "every one of the %lld logits is -inf", (long long)n);
  memcpy(c->id, ids, (size_t)n * 4);
  memcpy(c->logit, logits, (size_t)n * 4);
  reset_meta(c, n, c->cap);
  c->ascending = ids_ascending(c->id, n);
  PRIV(c)->has_raw = 0;
  return TIDE_OK;
}

/* Is [0, s) still the best s in canonical order? Returns the valid length. */
static int64_t sorted_prefix(const tide_cands *c, int64_t s) {
  const float *lg = c->logit;
  const int32_t *id = c->id;
  if (s > c->n) s = c->n;
  for (int64_t i = 1; i < s; i++)
    if (!better(lg[i - 1], id[i - 1], lg[i], id[i])) {
      s = i;
      break;
    }
  if (s <= 0 || s >= c->n) return s < 0 ? 0 : s;
  /* the rest must not beat the last member */
  float kl = lg[s - 1];
  int32_t il = id[s - 1];
  for (int64_t i = s; i < c->n; i++)
    if (better(lg[i], id[i], kl, il)) return 0;
  return s;
}

int tide_cands_touch(tide_cands *c) {
  CHECK_C(c);
  if (c->n < 0 || c->n > c->cap) return TIDE_ERR(TIDE_E_INVALID, "n = %d outside 0..%d", c->n, c->cap);
  TIDE_CHECK(check_set(__func__, c, c->id, c->logit, c->n, c->n_vocab));
  c->ascending = ids_ascending(c->id, c->n);
  c->sorted = (int32_t)sorted_prefix(c, c->sorted);
  c->has_p = 0;
  if (c->selected >= c->n || c->selected < -1) c->selected = -1;
  return TIDE_OK;
}

int tide_cands_softmax(tide_cands *c) {
  CHECK_C(c);
  if (c->has_p) return TIDE_OK;
  int64_t n = c->n;
  if (n < 1) return TIDE_ERR(TIDE_E_STATE, "the candidates set is empty");
  const tide_sample_kernels *k = K();
  float mx, mn;
  int64_t bad = k->scan(c->logit, n, &mx, &mn);
  if (bad) return bad_values(__func__, c->logit, n, bad, "candidate logits");
  if (mx == -INFINITY) return TIDE_ERR(TIDE_E_INVALID, "every one of the %lld candidates is -inf", (long long)n);
  double sum = k->expsum(c->p, c->logit, n, mx);
  K()->scale(c->p, n, (float)(1.0 / sum));
  c->max_logit = mx;
  PRIV(c)->min_logit = mn;
  c->lse = (double)mx + log(sum);
  c->has_p = 1;
  return TIDE_OK;
}

/* sum over p > 0 of p * logit, in 8 lanes */
static double sum_plogit(const tide_cands *c) {
  double a[8] = {0};
  const float *p = c->p, *lg = c->logit;
  for (int64_t i = 0; i < c->n; i++)
    if (p[i] > 0) a[i & 7] += (double)p[i] * (double)lg[i];
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

int tide_cands_entropy(tide_cands *c, double *out) {
  TIDE_CHECK(tide_cands_softmax(c));
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "out is NULL");
  double h = c->lse - sum_plogit(c);
  *out = h > 0 ? h : 0;
  return TIDE_OK;
}

int tide_cands_sort(tide_cands *c, int64_t m) {
  CHECK_C(c);
  if (m < 0 || m > c->n) m = c->n;
  if (c->sorted >= m) return TIDE_OK;
  return select_sorted(c, m, 1);
}

int tide_cands_truncate(tide_cands *c, int64_t m) {
  CHECK_C(c);
  if (m < 0) return TIDE_ERR(TIDE_E_INVALID, "m = %lld is negative", (long long)m);
  if (m >= c->n) return TIDE_OK;
  c->n = (int32_t)m;
  if (c->sorted > m) c->sorted = (int32_t)m;
  c->has_p = 0;
  c->selected = -1;
  return TIDE_OK;
}

int tide_cands_top_k(tide_cands *c, int64_t k) {
  CHECK_C(c);
  if (k <= 0 || k >= c->n) return TIDE_OK;
  if (c->sorted >= k) return tide_cands_truncate(c, k);
  return select_sorted(c, k, 0);
}

/* Keep the best L given as the sorted positions h[0..L). */
static int keep_sorted_positions(tide_cands *c, const int32_t *h, int64_t L) {
  thresh none = {0, 0, 0, 1};
  TIDE_CHECK(gather(c, h, L, c->logit, &none, 0));
  c->sorted = (int32_t)L;
  return 0;
}

/* Shortest prefix (canonical order of key) with mass w >= target (> when
 * strict), then at least min_keep; key is c->logit or scratch. Ends by
 * cutting the set to it. */
static int cut_by_mass(tide_cands *c, const float *key, double target, int strict, int64_t min_keep) {
  cpriv *pv = PRIV(c);
  int64_t n = c->n;
  const float *w = c->p;
  int key_is_logit = key == c->logit;
#define HIT(acc) (strict ? (acc) > target : (acc) >= target)
  /* 1: inside an existing sorted prefix */
  if (key_is_logit && c->sorted > 0) {
    double acc = 0;
    for (int64_t j = 0; j < c->sorted; j++) {
      acc += (double)w[j];
      if (HIT(acc)) {
        int64_t L = j + 1 > min_keep ? j + 1 : min_keep;
        if (L <= c->sorted) return tide_cands_truncate(c, L);
        return tide_cands_top_k(c, L);
      }
    }
  }
  /* 2: among the best few: a heap of 32 first, then of HEAP_TRY; a size
   * that cannot reach the target even at the largest probability each is
   * skipped (a flat distribution goes to 3 directly) */
  /* bound: the best t hold at most (mass of the best s) + (t - s) * p_s */
  double bound_mass = 0, bound_p = exp((double)c->max_logit - c->lse);
  int64_t bound_s = 0, m = 0;
  for (int64_t tryn = 32; tryn <= HEAP_TRY && m == 0; tryn *= 8) {
    int64_t t = n < tryn ? n : tryn;
    if (t < n && bound_mass + (double)(t - bound_s) * bound_p * (1 + 1e-6) < target) continue;
    int64_t got;
    TIDE_CHECK(pv_heap(c, key, t, &got));
    double acc = 0;
    for (int64_t j = 0; j < t; j++) {
      acc += (double)w[pv->heap[j]];
      if (strict ? acc > target : acc >= target) {
        m = t;
        break;
      }
    }
    if (t == n) break;
    if (key_is_logit) {   /* p falls along the heap's order only when the key is the logit */
      bound_mass = acc;
      bound_p = (double)w[pv->heap[t - 1]];
      bound_s = t;
    }
    /* the best 32 hold under a quarter of the target: a wide nucleus,
     * almost surely beyond 256 (this only picks the path; both are exact) */
    if (acc < target / 4) break;
  }
  double acc = 0;
  for (int64_t j = 0; j < m; j++) {
    acc += (double)w[pv->heap[j]];
    if (HIT(acc)) {
      int64_t L = j + 1;
      if (L < min_keep) break;   /* min_keep decides: the general path below */
      if (key_is_logit) return keep_sorted_positions(c, pv->heap, L);
      int32_t q = pv->heap[L - 1];
      thresh t = {key[q], c->id[q], L, 0};
      filter(c, key, &t, 1);
      return 0;
    }
  }
#undef HIT
  /* 3: histogram of the mass over the key range */
  thresh t;
  TIDE_CHECK(hist_threshold(c, key, w, target, strict, &t));
  if (t.len < min_keep) TIDE_CHECK(count_threshold(c, key, min_keep, &t));
  if (t.all) return 0;
  filter(c, key, &t, 1);
  return 0;
}

int tide_cands_top_p(tide_cands *c, double p, int64_t min_keep) {
  CHECK_C(c);
  if (p != p) return TIDE_ERR(TIDE_E_INVALID, "p is NaN");
  if (p >= 1.0 || c->n <= 1) return TIDE_OK;
  TIDE_CHECK(tide_cands_softmax(c));
  return cut_by_mass(c, c->logit, p, 0, min_keep);
}

int tide_cands_cut(tide_cands *c, double min_logit, int64_t min_keep) {
  CHECK_C(c);
  if (min_logit != min_logit) return TIDE_ERR(TIDE_E_INVALID, "min_logit is NaN");
  int64_t mk = min_keep > 1 ? min_keep : 1;
  float thr = (float)min_logit;
  const float *lg = c->logit;
  int64_t n = c->n, cnt = K()->count_ge(lg, n, thr);
  if (cnt == n) return TIDE_OK;
  if (cnt < mk) return tide_cands_top_k(c, mk);
  thresh t = {thr, INT32_MAX, cnt, 0};
  filter(c, c->logit, &t, 1);
  return TIDE_OK;
}

static float max_logit(tide_cands *c) {
  if (c->sorted > 0) return c->logit[0];
  float mx, mn;
  K()->scan(c->logit, c->n, &mx, &mn);
  return mx;
}

int tide_cands_min_p(tide_cands *c, double p, int64_t min_keep) {
  CHECK_C(c);
  if (p != p) return TIDE_ERR(TIDE_E_INVALID, "p is NaN");
  if (p <= 0.0 || c->n <= 1) return TIDE_OK;
  float thr = max_logit(c) + logf((float)p);   /* as llama.cpp: p_i >= p * p_max */
  return tide_cands_cut(c, thr, min_keep);
}

int tide_cands_typical(tide_cands *c, double p, int64_t min_keep) {
  CHECK_C(c);
  if (p != p) return TIDE_ERR(TIDE_E_INVALID, "p is NaN");
  if (p >= 1.0 || c->n <= 1) return TIDE_OK;
  TIDE_CHECK(tide_cands_softmax(c));
  cpriv *pv = PRIV(c);
  TIDE_CHECK(need(&pv->key, (size_t)c->cap * 4, 0));
  /* -log p_i - H = (lse - H) - logit_i; a typical token has it near 0 */
  double h = c->lse - sum_plogit(c);
  double c0 = c->lse - (h > 0 ? h : 0);
  const float *lg = c->logit;
  float *key = pv->key;
  for (int64_t i = 0; i < c->n; i++) key[i] = -(float)fabs(c0 - (double)lg[i]);
  return cut_by_mass(c, key, p, 1, min_keep);
}

int tide_cands_top_n_sigma(tide_cands *c, double nsigma) {
  CHECK_C(c);
  if (nsigma != nsigma) return TIDE_ERR(TIDE_E_INVALID, "nsigma is NaN");
  if (nsigma <= 0 || c->n <= 1) return TIDE_OK;
  const float *lg = c->logit;
  int64_t n = c->n, cnt = 0;
  double s[4] = {0};
  for (int64_t i = 0; i < n; i++)
    if (lg[i] != -INFINITY) {
      s[i & 3] += lg[i];
      cnt++;
    }
  if (cnt == 0) return TIDE_OK;
  double mean = ((s[0] + s[2]) + (s[1] + s[3])) / (double)cnt;
  double q[4] = {0};
  for (int64_t i = 0; i < n; i++)
    if (lg[i] != -INFINITY) {
      double d = lg[i] - mean;
      q[i & 3] += d * d;
    }
  double sd = sqrt(((q[0] + q[2]) + (q[1] + q[3])) / (double)cnt);
  float thr = max_logit(c) - (float)(nsigma * sd);
  return tide_cands_cut(c, thr, 1);
}

int tide_cands_xtc(tide_cands *c, double threshold, int64_t min_keep) {
  CHECK_C(c);
  if (threshold != threshold) return TIDE_ERR(TIDE_E_INVALID, "threshold is NaN");
  if (threshold > 0.5 || c->n < 2) return TIDE_OK;
  TIDE_CHECK(tide_cands_softmax(c));
  float t = (float)threshold;
  int64_t above = 0;
  above = K()->count_ge(c->p, c->n, t);
  int64_t m = above - 1;   /* all of them but the least likely go */
  if (m < 1 || c->n - m < min_keep) return TIDE_OK;
  thresh th;
  TIDE_CHECK(count_threshold(c, c->logit, m, &th));
  filter(c, c->logit, &th, 0);
  return TIDE_OK;
}

int tide_cands_argmax(tide_cands *c) {
  CHECK_C(c);
  if (c->n < 1) return TIDE_ERR(TIDE_E_STATE, "the candidates set is empty");
  int64_t best = 0;
  if (c->sorted < 1) {
    float mx, mn;
    int64_t bad = K()->scan(c->logit, c->n, &mx, &mn);
    if (bad) return bad_values(__func__, c->logit, c->n, bad, "candidate logits");
    best = K()->find(c->logit, 0, c->n, mx, 1);
    if (!c->ascending)
      for (int64_t i = best + 1; i < c->n; i++)
        if (c->logit[i] == mx && c->id[i] < c->id[best]) best = i;
  }
  c->selected = (int32_t)best;
  return (int)best;
}

int tide_cands_temperature(tide_cands *c, double t) {
  CHECK_C(c);
  if (t != t || t == INFINITY || t == -INFINITY)
    return TIDE_ERR(TIDE_E_INVALID, "temperature %g is not finite", t);
  if (c->n < 1) return TIDE_ERR(TIDE_E_STATE, "the candidates set is empty");
  if (t < 1e-30) {   /* 0, negative, or so small that dividing would overflow: greedy */
    int b = tide_cands_argmax(c);
    if (b < 0) return b;
    c->id[0] = c->id[b];
    c->logit[0] = c->logit[b];
    c->n = 1;
    c->sorted = 1;
    c->has_p = 0;
    c->ascending = 1;
    c->selected = -1;
    return TIDE_OK;
  }
  float tf = (float)t;
  if (tf == 1.0f) return TIDE_OK;
  K()->divide(c->logit, c->n, tf);
  c->has_p = 0;
  c->selected = -1;
  /* dividing keeps the order unless two logits round to the same value */
  c->sorted = (int32_t)sorted_prefix(c, c->sorted);
  return TIDE_OK;
}

int tide_cands_find(const tide_cands *c, int64_t token) {
  if (!c || token < 0 || token >= c->n_vocab) return -1;
  if (c->ascending) {
    if (c->n == c->n_vocab) return (int)token;
    int64_t lo = 0, hi = c->n;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (c->id[mid] < token) lo = mid + 1;
      else hi = mid;
    }
    return lo < c->n && c->id[lo] == token ? (int)lo : -1;
  }
  for (int64_t i = 0; i < c->n; i++)
    if (c->id[i] == token) return (int)i;
  return -1;
}

/* Position of every current id in pv->where. */
static int index_positions(tide_cands *c) {
  cpriv *pv = PRIV(c);
  TIDE_CHECK(need(&pv->where, (size_t)c->cap * 4, 1));
  for (int64_t i = 0; i < c->n; i++) pv->where[c->id[i]] = (int32_t)i;
  return 0;
}
static inline int64_t pos_of(const tide_cands *c, int64_t token) {
  if (token < 0 || token >= c->n_vocab) return -1;
  int32_t p = PRIV(c)->where[token];
  return p >= 0 && p < c->n && c->id[p] == token ? p : -1;
}

int tide_cands_bias(tide_cands *c, const int32_t *ids, const float *bias, int64_t m) {
  CHECK_C(c);
  if (m < 0 || (m > 0 && (!ids || !bias))) return TIDE_ERR(TIDE_E_INVALID, "bad bias arrays (m = %lld)", (long long)m);
  for (int64_t j = 0; j < m; j++) {
    if (ids[j] < 0 || ids[j] >= c->n_vocab)
      return TIDE_ERR(TIDE_E_RANGE, "logit bias token %d outside the vocabulary (%d)", ids[j], c->n_vocab);
    if (bias[j] != bias[j] || bias[j] == INFINITY)
      return TIDE_ERR(TIDE_E_INVALID, "logit bias of token %d is %g (NaN and +inf are not allowed)", ids[j],
                      (double)bias[j]);
  }
  if (m == 0) return TIDE_OK;
  int whole = c->ascending && c->n == c->n_vocab;
  if (!whole) TIDE_CHECK(index_positions(c));
  for (int64_t j = 0; j < m; j++) {
    int64_t p = whole ? ids[j] : pos_of(c, ids[j]);
    if (p >= 0) c->logit[p] += bias[j];
  }
  c->has_p = 0;
  c->selected = -1;
  c->sorted = 0;
  return TIDE_OK;
}

int tide_cands_draw(tide_cands *c, tide_rng *r) {
  CHECK_C(c);
  if (!r) return TIDE_ERR(TIDE_E_INVALID, "rng is NULL");
  TIDE_CHECK(tide_cands_softmax(c));
  cpriv *pv = PRIV(c);
  TIDE_CHECK(need(&pv->bsum, ((size_t)c->cap / 64 + 1) * 8, 0));
  int64_t n = c->n;
  const float *p = c->p;
  double total = K()->blocksum(p, n, pv->bsum);
  double target = tide_rng_uniform(r) * total;
  int64_t nb = (n + 63) / 64, b = 0;
  double acc = 0;
  for (; b < nb - 1; b++) {
    if (acc + pv->bsum[b] > target) break;
    acc += pv->bsum[b];
  }
  int64_t pick = -1, last = -1;
  for (int64_t i = b * 64; i < n; i++) {
    if (p[i] <= 0) continue;
    last = i;
    acc += (double)p[i];
    if (acc > target) {
      pick = i;
      break;
    }
  }
  if (pick < 0) {
    /* rounding left the target at the very end: the last token with mass */
    if (last < 0)
      for (int64_t i = n - 1; i >= 0; i--)
        if (p[i] > 0) {
          last = i;
          break;
        }
    pick = last;
  }
  if (pick < 0) return TIDE_ERR(TIDE_E_INTERNAL, "no candidate has probability > 0");
  c->selected = (int32_t)pick;
  return (int)pick;
}

int tide_cands_topn(tide_cands *c, int64_t m, int32_t *ids, float *logprobs) {
  CHECK_C(c);
  if (m < 0 || (m > 0 && (!ids || !logprobs))) return TIDE_ERR(TIDE_E_INVALID, "bad output arrays (m = %lld)", (long long)m);
  if (m == 0) return 0;
  TIDE_CHECK(tide_cands_softmax(c));
  cpriv *pv = PRIV(c);
  int64_t k;
  TIDE_CHECK(pv_heap(c, c->logit, m, &k));
  for (int64_t j = 0; j < k; j++) {
    int32_t q = pv->heap[j];
    ids[j] = c->id[q];
    logprobs[j] = (float)((double)c->logit[q] - c->lse);
  }
  return (int)k;
}

/* ---- trace ---- */

int tide_cands_trace_begin(tide_cands *c) {
  CHECK_C(c);
  TIDE_CHECK(tide_cands_softmax(c));
  cpriv *pv = PRIV(c);
  size_t cap = (size_t)c->cap;
  TIDE_CHECK(need(&pv->byid, cap * 4, 1));
  TIDE_CHECK(need(&pv->tr_ids, cap * 4, 0));
  if (pv->tr_on)
    for (int64_t i = 0; i < pv->tr_n; i++) pv->byid[pv->tr_ids[i]] = 0;
  for (int64_t i = 0; i < c->n; i++) {
    pv->tr_ids[i] = c->id[i];
    pv->byid[c->id[i]] = c->p[i];
  }
  pv->tr_n = c->n;
  pv->tr_on = 1;
  return TIDE_OK;
}

int tide_cands_trace_end(tide_cands *c, tide_cands_trace *out) {
  CHECK_C(c);
  cpriv *pv = PRIV(c);
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "out is NULL");
  if (!pv->tr_on) return TIDE_ERR(TIDE_E_STATE, "trace_end without trace_begin");
  int rc = tide_cands_softmax(c);
  if (rc == TIDE_OK) {
    double mi = 0, mr = 0;
    for (int64_t i = 0; i < c->n; i++) {
      int32_t t = c->id[i];
      if (t >= 0 && t < c->cap) {
        mi += pv->byid[t];
        if (pv->has_raw) mr += pv->raw[t];
      }
    }
    double h = c->lse - sum_plogit(c);
    out->n_in = pv->tr_n;
    out->n_out = c->n;
    out->mass_in = mi;
    out->mass_raw = pv->has_raw ? mr : NAN;
    out->entropy = h > 0 ? h : 0;
  }
  for (int64_t i = 0; i < pv->tr_n; i++) pv->byid[pv->tr_ids[i]] = 0;
  pv->tr_on = 0;
  return rc;
}

/* ======================================================================== */
/* token histories                                                           */
/* ======================================================================== */

struct tide_hist {
  int64_t window;    /* < 0: unbounded */
  int counts;
  int32_t *ring;     /* windowed: ring of `window`; unbounded: a growing array */
  int64_t cap;
  int64_t start;     /* oldest entry */
  int64_t len;
  /* token -> count in the window: open addressing, linear probing */
  int32_t *hk;       /* -1 = empty */
  int32_t *hv;
  int64_t hcap;      /* power of two */
  int64_t hused;
};

static inline uint64_t hslot(int32_t key, int64_t hcap) {
  return ((uint32_t)key * 2654435761u) & (uint64_t)(hcap - 1);
}

static int hmap_alloc(tide_hist *h, int64_t cap) {
  int32_t *k = tide_xmalloc((size_t)cap * 4), *v = tide_xmalloc((size_t)cap * 4);
  if (!k || !v) {
    tide_xfree(k);
    tide_xfree(v);
    return TIDE_E_NOMEM;
  }
  for (int64_t i = 0; i < cap; i++) k[i] = -1;
  int32_t *ok = h->hk, *ov = h->hv;
  int64_t oc = h->hcap;
  h->hk = k;
  h->hv = v;
  h->hcap = cap;
  h->hused = 0;
  for (int64_t i = 0; i < oc; i++) {
    if (ok[i] < 0) continue;
    uint64_t s = hslot(ok[i], cap);
    while (k[s] >= 0) s = (s + 1) & (uint64_t)(cap - 1);
    k[s] = ok[i];
    v[s] = ov[i];
    h->hused++;
  }
  tide_xfree(ok);
  tide_xfree(ov);
  return 0;
}

static int64_t hfind(const tide_hist *h, int32_t key) {
  if (!h->hcap) return -1;
  uint64_t s = hslot(key, h->hcap);
  while (h->hk[s] >= 0) {
    if (h->hk[s] == key) return (int64_t)s;
    s = (s + 1) & (uint64_t)(h->hcap - 1);
  }
  return -1;
}

static int hadd(tide_hist *h, int32_t key) {
  if ((h->hused + 1) * 2 > h->hcap) TIDE_CHECK(hmap_alloc(h, h->hcap ? h->hcap * 2 : 16));
  uint64_t s = hslot(key, h->hcap);
  while (h->hk[s] >= 0) {
    if (h->hk[s] == key) {
      h->hv[s]++;
      return 0;
    }
    s = (s + 1) & (uint64_t)(h->hcap - 1);
  }
  h->hk[s] = key;
  h->hv[s] = 1;
  h->hused++;
  return 0;
}

/* Decrement; at zero remove with backward-shift deletion (no tombstones). */
static void hdec(tide_hist *h, int32_t key) {
  int64_t f = hfind(h, key);
  if (f < 0) return;
  if (--h->hv[f] > 0) return;
  uint64_t mask = (uint64_t)(h->hcap - 1), i = (uint64_t)f, j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (h->hk[j] < 0) break;
    uint64_t home = hslot(h->hk[j], h->hcap);
    /* entry j may fill the hole at i unless its home lies cyclically in (i, j] */
    int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!between) {
      h->hk[i] = h->hk[j];
      h->hv[i] = h->hv[j];
      i = j;
    }
  }
  h->hk[i] = -1;
  h->hused--;
}

int tide_hist_new(tide_hist **out, int64_t window, int counts) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "out is NULL");
  *out = NULL;
  tide_hist *h = tide_xcalloc(1, sizeof *h);
  if (!h) return TIDE_E_NOMEM;
  h->window = window < 0 ? -1 : window;
  h->counts = counts ? 1 : 0;
  if (window > 0) {
    h->ring = tide_xmalloc((size_t)window * 4);
    if (!h->ring) {
      tide_xfree(h);
      return TIDE_E_NOMEM;
    }
    h->cap = window;
  }
  *out = h;
  return TIDE_OK;
}

void tide_hist_free(tide_hist *h) {
  if (!h) return;
  tide_xfree(h->ring);
  tide_xfree(h->hk);
  tide_xfree(h->hv);
  tide_xfree(h);
}

void tide_hist_clear(tide_hist *h) {
  if (!h) return;
  h->start = 0;
  h->len = 0;
  for (int64_t i = 0; i < h->hcap; i++) h->hk[i] = -1;
  h->hused = 0;
}

int tide_hist_push(tide_hist *h, const int32_t *tokens, int64_t n) {
  if (!h) return TIDE_ERR(TIDE_E_INVALID, "history is NULL");
  if (n < 0 || (n > 0 && !tokens)) return TIDE_ERR(TIDE_E_INVALID, "bad tokens (n = %lld)", (long long)n);
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0) return TIDE_ERR(TIDE_E_RANGE, "token %d at %lld is negative", tokens[i], (long long)i);
  if (h->window == 0) return TIDE_OK;
  if (h->window < 0 && h->len + n > h->cap) {
    int64_t nc = h->cap ? h->cap : 256;
    while (nc < h->len + n) nc *= 2;
    int32_t *r = tide_xmalloc((size_t)nc * 4);
    if (!r) return TIDE_E_NOMEM;
    if (h->len) memcpy(r, h->ring, (size_t)h->len * 4);
    tide_xfree(h->ring);
    h->ring = r;
    h->cap = nc;
  }
  if (h->counts) {
    /* room for every distinct token first, so a failure changes nothing */
    int64_t most = h->hused + n;
    if (h->window > 0 && most > h->window) most = h->window;
    int64_t want = 16;
    while (want < most * 2) want *= 2;
    if (want > h->hcap) TIDE_CHECK(hmap_alloc(h, want));
  }
  for (int64_t i = 0; i < n; i++) {
    int32_t t = tokens[i];
    if (h->window > 0 && h->len == h->window) {
      if (h->counts) hdec(h, h->ring[h->start]);
      h->ring[h->start] = t;
      h->start = (h->start + 1) % h->cap;
    } else {
      h->ring[(h->start + h->len) % h->cap] = t;
      h->len++;
    }
    if (h->counts) hadd(h, t);   /* cannot grow: room was made above */
  }
  return TIDE_OK;
}

int64_t tide_hist_len(const tide_hist *h) { return h ? h->len : 0; }
int64_t tide_hist_window(const tide_hist *h) { return h ? h->window : 0; }

static inline int32_t hist_back(const tide_hist *h, int64_t back) {
  return h->ring[(h->start + h->len - 1 - back) % h->cap];
}

int64_t tide_hist_get(const tide_hist *h, int64_t back) {
  if (!h || back < 0 || back >= h->len) return -1;
  return hist_back(h, back);
}

int64_t tide_hist_count(const tide_hist *h, int64_t token) {
  if (!h || !h->counts || token < 0 || token > INT32_MAX) return 0;
  int64_t f = hfind(h, (int32_t)token);
  return f < 0 ? 0 : h->hv[f];
}

int64_t tide_hist_read(const tide_hist *h, int32_t *out, int64_t max) {
  if (!h || !out || max <= 0) return 0;
  int64_t k = h->len < max ? h->len : max;
  for (int64_t i = 0; i < k; i++) out[i] = hist_back(h, k - 1 - i);
  return k;
}

int tide_hist_assign(tide_hist *dst, const tide_hist *src) {
  if (!dst || !src) return TIDE_ERR(TIDE_E_INVALID, "history is NULL");
  if (dst == src) return TIDE_OK;
  int64_t k = src->len;
  if (dst->window >= 0 && k > dst->window) k = dst->window;
  int32_t *tmp = tide_xmalloc((size_t)(k ? k : 1) * 4);
  if (!tmp) return TIDE_E_NOMEM;
  for (int64_t i = 0; i < k; i++) tmp[i] = hist_back(src, k - 1 - i);
  /* fill a fresh history of dst's shape, then swap it in: a failure leaves dst */
  tide_hist *fresh;
  int rc = tide_hist_new(&fresh, dst->window, dst->counts);
  if (rc == TIDE_OK) rc = tide_hist_push(fresh, tmp, k);
  tide_xfree(tmp);
  if (rc != TIDE_OK) {
    tide_hist_free(fresh);
    return rc;
  }
  tide_hist old = *dst;
  *dst = *fresh;
  *fresh = old;
  tide_hist_free(fresh);
  return TIDE_OK;
}

/* ======================================================================== */
/* penalties and DRY                                                         */
/* ======================================================================== */

static inline float penalize(float l, int32_t cnt, float rep, float freq, float pres) {
  l = l <= 0 ? l * rep : l / rep;
  return l - ((float)cnt * freq + (float)(cnt > 0) * pres);
}

int tide_cands_penalties(tide_cands *c, const tide_hist *h, double repeat, double freq, double present) {
  CHECK_C(c);
  if (!h) return TIDE_ERR(TIDE_E_INVALID, "history is NULL");
  if (!h->counts) return TIDE_ERR(TIDE_E_INVALID, "the history keeps no counts (create it with counts = 1)");
  if (repeat != repeat || freq != freq || present != present || repeat <= 0)
    return TIDE_ERR(TIDE_E_INVALID, "bad penalties (repeat %g, frequency %g, presence %g)", repeat, freq, present);
  float rep = (float)repeat, fr = (float)freq, pr = (float)present;
  if ((rep == 1.0f && fr == 0.0f && pr == 0.0f) || h->len == 0) return TIDE_OK;
  int whole = c->ascending && c->n == c->n_vocab;
  if (!whole && c->n > 4 * h->hused) {
    TIDE_CHECK(index_positions(c));
    whole = 2;
  }
  if (whole) {
    for (int64_t s = 0; s < h->hcap; s++) {
      int32_t t = h->hk[s];
      if (t < 0) continue;
      int64_t p = whole == 1 ? (t < c->n ? t : -1) : pos_of(c, t);
      if (p >= 0) c->logit[p] = penalize(c->logit[p], h->hv[s], rep, fr, pr);
    }
  } else {
    for (int64_t i = 0; i < c->n; i++) {
      int64_t f = hfind(h, c->id[i]);
      if (f >= 0) c->logit[i] = penalize(c->logit[i], h->hv[f], rep, fr, pr);
    }
  }
  c->has_p = 0;
  c->sorted = 0;
  c->selected = -1;
  return TIDE_OK;
}

typedef struct dry_entry {
  int32_t head;
  int32_t len;    /* tail length */
  int64_t off;    /* into tails */
} dry_entry;

struct tide_dry {
  dry_entry *e;
  int64_t n, cap;
  int32_t *tails;
  int64_t tn, tcap;
};

enum { DRY_MAX_TAIL = 20 };

int tide_dry_new(tide_dry **out) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "out is NULL");
  *out = tide_xcalloc(1, sizeof(tide_dry));
  return *out ? TIDE_OK : TIDE_E_NOMEM;
}

void tide_dry_free(tide_dry *d) {
  if (!d) return;
  tide_xfree(d->e);
  tide_xfree(d->tails);
  tide_xfree(d);
}

int64_t tide_dry_count(const tide_dry *d) { return d ? d->n : 0; }

static int dry_cmp(const dry_entry *a, const int32_t *ta, const dry_entry *b, const int32_t *tb) {
  if (a->head != b->head) return a->head < b->head ? -1 : 1;
  if (a->len != b->len) return a->len < b->len ? -1 : 1;
  for (int32_t k = 0; k < a->len; k++)
    if (ta[k] != tb[k]) return ta[k] < tb[k] ? -1 : 1;
  return 0;
}

int tide_dry_add_breaker(tide_dry *d, const int32_t *seq, int64_t len) {
  if (!d) return TIDE_ERR(TIDE_E_INVALID, "dry is NULL");
  if (!seq || len < 1) return TIDE_ERR(TIDE_E_INVALID, "a breaker needs at least one token (len = %lld)", (long long)len);
  for (int64_t i = 0; i < len; i++)
    if (seq[i] < 0) return TIDE_ERR(TIDE_E_RANGE, "breaker token %d is negative", seq[i]);
  int32_t tl = (int32_t)(len - 1 > DRY_MAX_TAIL ? DRY_MAX_TAIL : len - 1);
  dry_entry ne = {seq[0], tl, 0};
  /* entries stay sorted by (head, tail): binary search for the slot */
  int64_t lo = 0, hi = d->n;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    int r = dry_cmp(&d->e[mid], d->tails + d->e[mid].off, &ne, seq + 1);
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  if (lo < d->n && dry_cmp(&d->e[lo], d->tails + d->e[lo].off, &ne, seq + 1) == 0) return TIDE_OK;
  TIDE_CHECK(grow(&d->e, &d->cap, d->n + 1, sizeof(dry_entry)));
  TIDE_CHECK(grow(&d->tails, &d->tcap, d->tn + tl + 1, 4));
  ne.off = d->tn;
  memcpy(d->tails + d->tn, seq + 1, (size_t)tl * 4);
  d->tn += tl;
  memmove(d->e + lo + 1, d->e + lo, (size_t)(d->n - lo) * sizeof(dry_entry));
  d->e[lo] = ne;
  d->n++;
  return TIDE_OK;
}

/* First entry with this head, or d->n. */
static int64_t dry_first(const tide_dry *d, int32_t head) {
  int64_t lo = 0, hi = d->n;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (d->e[mid].head < head) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

int tide_cands_dry(tide_cands *c, const tide_dry *d, const tide_hist *h, double multiplier, double base,
                   int64_t allowed_length, int64_t last_n) {
  CHECK_C(c);
  if (!h) return TIDE_ERR(TIDE_E_INVALID, "history is NULL");
  if (multiplier != multiplier || base != base)
    return TIDE_ERR(TIDE_E_INVALID, "bad DRY parameters (multiplier %g, base %g)", multiplier, base);
  if (multiplier == 0 || base < 1 || last_n == 0) return TIDE_OK;
  if (allowed_length < 0) allowed_length = 0;
  int64_t N = h->len;
  if (last_n > 0 && last_n < N) N = last_n;
  if (N <= allowed_length) return TIDE_OK;
  cpriv *pv = PRIV(c);
  TIDE_CHECK(grow(&pv->dry_rev, &pv->dry_cap, N, 4));
  TIDE_CHECK(grow(&pv->dry_z, &pv->dry_zcap, N, 4));
  TIDE_CHECK(need(&pv->dry_best, (size_t)c->cap * 4, 1));
  TIDE_CHECK(grow(&pv->dry_touched, &pv->dry_tcap, N, 4));
  int32_t *r = pv->dry_rev, *z = pv->dry_z;
  for (int64_t i = 0; i < N; i++) r[i] = hist_back(h, i);   /* r[0] is the newest */

  /* 1: the breaker nearest the end limits how far back a repeat may reach */
  int64_t limit = N;
  if (d && d->n) {
    for (int64_t i = 0; i < N; i++) {
      int64_t e = dry_first(d, r[i]);
      int64_t longest = -1;
      for (; e < d->n && d->e[e].head == r[i]; e++) {
        int64_t L = d->e[e].len;
        if (L <= longest || L > i) continue;
        const int32_t *tail = d->tails + d->e[e].off;
        int64_t k = 0;
        while (k < L && tail[k] == r[i - 1 - k]) k++;
        if (k == L) longest = L;
      }
      if (longest >= 0) {
        limit = i - longest;
        break;
      }
    }
  }
  if (limit < allowed_length) return TIDE_OK;

  /* 2: z[k] = length of the longest common prefix of r and r + k, i.e. how
   * many tokens ending k steps back repeat the end of the history (the
   * Z-algorithm over the reversed history) */
  int64_t lb = 0, rb = 0;
  for (int64_t k = 1; k < N; k++) {
    int64_t v = 0;
    if (k < rb) {
      v = z[k - lb];
      if (v > rb - k) v = rb - k;
    }
    while (k + v < N && r[v] == r[k + v]) v++;
    z[k] = (int32_t)v;
    if (k + v > rb) {
      lb = k;
      rb = k + v;
    }
  }

  /* 3: the token after each long enough repeat would extend it; dry_best
   * holds the longest such repeat + 1 (0 = none) */
  int64_t nt = 0;
  for (int64_t k = 1; k < N; k++) {
    int64_t len = z[k] < limit ? z[k] : limit;
    if (len < allowed_length) continue;
    int32_t t = r[k - 1];
    if (t >= c->cap) continue;
    if (pv->dry_best[t] == 0) pv->dry_touched[nt++] = t;
    if (len + 1 > pv->dry_best[t]) pv->dry_best[t] = (int32_t)(len + 1);
  }

  /* 4: penalties, exponent capped so base^e stays a finite float */
  float fb = (float)base, fm = (float)multiplier;
  int64_t max_exp = 0;
  if (fb > 1.000001f) max_exp = (int64_t)(88.7228391f / logf(fb));
  int whole = c->ascending && c->n == c->n_vocab;
  if (!whole) TIDE_CHECK(index_positions(c));
  for (int64_t j = 0; j < nt; j++) {
    int32_t t = pv->dry_touched[j];
    int64_t p = whole ? (t < c->n ? t : -1) : pos_of(c, t);
    int single = 0;
    if (d && d->n)
      for (int64_t e = dry_first(d, t); e < d->n && d->e[e].head == t; e++)
        if (d->e[e].len == 0) single = 1;
    if (p >= 0 && !single) {
      int64_t ex = pv->dry_best[t] - 1 - allowed_length;
      if (max_exp > 0 && ex > max_exp) ex = max_exp;
      float pen = (float)((double)fm * pow((double)fb, (double)ex));
      c->logit[p] -= pen;
    }
    pv->dry_best[t] = 0;
  }
  c->has_p = 0;
  c->sorted = 0;
  c->selected = -1;
  return TIDE_OK;
}

/* ======================================================================== */
/* logprobs of a row                                                         */
/* ======================================================================== */

/* The best m of a row (ids = positions, increasing) into ids/vals, best
 * first, by insertion into the caller's arrays: no scratch needed. */
static int64_t row_topn(const float *x, int64_t n, int64_t m, int32_t *ids, float *vals) {
  if (m > n) m = n;
  if (m <= 0) return 0;
  const tide_sample_kernels *k = K();
  int64_t have = 0, i = 0;
  while (i < n) {
    if (have == m) {
      i = k->find(x, i, n, vals[m - 1], 0);
      if (i >= n) break;
    }
    float v = x[i];
    /* first slot with a smaller value: equal values keep their (smaller) ids first */
    int64_t lo = 0, hi = have;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (vals[mid] >= v) lo = mid + 1;
      else hi = mid;
    }
    int64_t last = have < m ? have : m - 1;
    memmove(ids + lo + 1, ids + lo, (size_t)(last - lo) * 4);
    memmove(vals + lo + 1, vals + lo, (size_t)(last - lo) * 4);
    ids[lo] = (int32_t)i;
    vals[lo] = v;
    if (have < m) have++;
    i++;
  }
  return have;
}

int tide_logits_logprobs(const tide_tensor *logits, tide_logprobs *io) {
  const float *x;
  int64_t n;
  TIDE_CHECK(row_of(__func__, logits, &x, &n));
  if (!io) return TIDE_ERR(TIDE_E_INVALID, "io is NULL");
  if (io->target < -1 || io->target >= n)
    return TIDE_ERR(TIDE_E_RANGE, "target %lld outside the vocabulary (%lld)", (long long)io->target, (long long)n);
  if (io->n_top < 0 || (io->n_top > 0 && (!io->top_ids || !io->top_logprobs)))
    return TIDE_ERR(TIDE_E_INVALID, "bad top arrays (n_top = %lld)", (long long)io->n_top);
  const tide_sample_kernels *k = K();
  float mx, mn;
  int64_t bad = k->scan(x, n, &mx, &mn);
  if (bad) return bad_values(__func__, x, n, bad, "logits");
  if (mx == -INFINITY) return TIDE_ERR(TIDE_E_INVALID, "every one of the %lld logits is -inf", (long long)n);
  double lse = (double)mx + log(k->expsum(NULL, x, n, mx));
  io->lse = lse;
  io->target_logprob = NAN;
  io->target_rank = -1;
  if (io->target >= 0) {
    int64_t t = io->target;
    float xt = x[t];
    /* before t: >= wins (ties go to the smaller id); after t: only > */
    int64_t rank = k->count_ge(x, t, xt);
    if (t + 1 < n) rank += k->count_ge(x + t + 1, n - t - 1, nextafterf(xt, INFINITY));
    io->target_rank = rank;
    io->target_logprob = (double)xt - lse;
  }
  int64_t m = row_topn(x, n, io->n_top, io->top_ids, io->top_logprobs);
  for (int64_t j = 0; j < m; j++) io->top_logprobs[j] = (float)((double)io->top_logprobs[j] - lse);
  io->n_out = m;
  return TIDE_OK;
}

/* ======================================================================== */
/* utilities                                                                 */
/* ======================================================================== */

int tide_file_stamp(const char *path, int64_t *mtime_ns, int64_t *size) {
  if (!path) return TIDE_ERR(TIDE_E_INVALID, "path is NULL");
  struct stat st;
  if (stat(path, &st) != 0) return TIDE_ERR(TIDE_E_IO, "cannot stat '%s'", path);
  if (mtime_ns) *mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  if (size) *size = (int64_t)st.st_size;
  return TIDE_OK;
}

uint64_t tide_hash64(const void *data, int64_t n) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; p && i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
