/* kvcache.c - the paged KV cache of every layer, its sequences and the step
 * protocol (batch -> prepare -> kernels -> commit | abort).
 *
 * Pools: SWA blocks (swa_block positions, every layer) and compressed pages
 * (page_tokens positions, every compressed layer: main entries and, for
 * ratio 4, indexer entries). Blocks and pages are reference counted so forks
 * and snapshots share them copy-on-write; prepare copies a shared block
 * before the step writes into it. Compressor state rows live in per-sequence
 * rings indexed by position mod ring size; prepare saves the rows a long step
 * could overwrite so abort restores them exactly. See docs/attention.md. */
#include <stdio.h>
#include <stdlib.h>

#include "attn_internal.h"

/* ---- small helpers ---- */
static int grow_tab(int32_t **tab, int64_t *cap, int64_t need) {
  if (need <= *cap) return TIDE_OK;
  int64_t nc = *cap ? *cap : 16;
  while (nc < need) nc *= 2;
  int32_t *t = tide_xrealloc(*tab, (size_t)nc * sizeof(int32_t));
  if (!t) return TIDE_ERR(TIDE_E_NOMEM, "block table of %lld entries", (long long)nc);
  for (int64_t i = *cap; i < nc; i++) t[i] = -1;
  *tab = t;
  *cap = nc;
  return TIDE_OK;
}

static int32_t pool_pop(int32_t *freel, int32_t *nfree, int32_t *ref) {
  int32_t id = freel[--*nfree];
  ref[id] = 1;
  return id;
}
static void pool_decref(int32_t *freel, int32_t *nfree, int32_t *ref, int32_t id) {
  if (id < 0) return;
  if (--ref[id] == 0) freel[(*nfree)++] = id;
}

static kv_seq *get_seq(const tide_kvcache *c, int32_t id, const char *fn) {
  if (!c) {
    tide_errorf(TIDE_E_INVALID, fn, "cache is NULL");
    return NULL;
  }
  if (id < 0 || id >= c->cfg.max_seqs) {
    tide_errorf(TIDE_E_RANGE, fn, "sequence id %d outside 0..%d", id, c->cfg.max_seqs - 1);
    return NULL;
  }
  kv_seq *s = &c->seqs[id];
  if (!s->live) {
    tide_errorf(TIDE_E_INVALID, fn, "sequence %d is not live", id);
    return NULL;
  }
  return s;
}

static int64_t swa_first_held(const tide_kvcache *c, int64_t len) {
  if (c->cfg.keep_swa_history) return 0;
  int64_t x = len - c->cfg.window + 1;
  if (x <= 0) return 0;
  return x / c->cfg.swa_block * c->cfg.swa_block;
}

/* ---- creation ---- */
int tide_kvcache_new(tide_kvcache **out, const tide_kvcache_config *cfg) {
  if (!out || !cfg) return TIDE_ERR(TIDE_E_INVALID, "out or cfg is NULL");
  *out = NULL;
  tide_kvcache_config k = *cfg;
  if (k.n_layers <= 0 || !k.ratios) return TIDE_ERR(TIDE_E_INVALID, "n_layers %d or ratios NULL", k.n_layers);
  if (k.head_dim == 0) k.head_dim = 512;
  if (k.rope_dim == 0) k.rope_dim = 64;
  if (k.index_head_dim == 0) k.index_head_dim = 128;
  if (k.head_dim != 512 || k.rope_dim != 64 || k.index_head_dim != 128)
    return TIDE_ERR(TIDE_E_UNSUPPORTED, "head_dim %d rope_dim %d index_head_dim %d: only 512/64/128", k.head_dim,
                    k.rope_dim, k.index_head_dim);
  if (k.window == 0) k.window = 128;
  if (k.swa_block == 0) k.swa_block = 64;
  if (k.page_tokens == 0) k.page_tokens = 256;
  if (k.window < 1) return TIDE_ERR(TIDE_E_INVALID, "window %d", k.window);
  if (k.swa_block < 1) return TIDE_ERR(TIDE_E_INVALID, "swa_block %d", k.swa_block);
  if (k.page_tokens < 128 || k.page_tokens % 128) return TIDE_ERR(TIDE_E_INVALID, "page_tokens %d is not a positive multiple of 128", k.page_tokens);
  if (k.swa_blocks < 1 || k.pages < 0 || k.max_seqs < 1)
    return TIDE_ERR(TIDE_E_INVALID, "capacities swa_blocks %d pages %d max_seqs %d", k.swa_blocks, k.pages, k.max_seqs);
  int ncomp = 0, nic = 0;
  for (int i = 0; i < k.n_layers; i++) {
    int r = k.ratios[i] <= 1 ? 1 : k.ratios[i];
    if (k.ratios[i] < 0 || (r != 1 && r != 4 && r != 128))
      return TIDE_ERR(TIDE_E_INVALID, "layer %d ratio %d (expected 0, 1, 4 or 128)", i, k.ratios[i]);
    if (r > 1) ncomp++;
    if (r == 4) nic++;
  }
  if (ncomp && k.pages < 1) return TIDE_ERR(TIDE_E_INVALID, "compressed layers need pages > 0");
  tide_kvcache *c = tide_xcalloc(1, sizeof *c);
  if (!c) return TIDE_E_NOMEM;
  c->refs = 1;
  c->ratios = tide_xcalloc((size_t)k.n_layers, sizeof(int32_t));
  c->layers = tide_xcalloc((size_t)k.n_layers, sizeof(kv_layer));
  c->ring_off = tide_xcalloc((size_t)ncomp + 1, sizeof(int64_t));
  c->iring_off = tide_xcalloc((size_t)nic + 1, sizeof(int64_t));
  c->swa_ref = tide_xcalloc((size_t)k.swa_blocks, sizeof(int32_t));
  c->swa_free = tide_xcalloc((size_t)k.swa_blocks, sizeof(int32_t));
  c->pg_ref = tide_xcalloc((size_t)k.pages + 1, sizeof(int32_t));
  c->pg_free = tide_xcalloc((size_t)k.pages + 1, sizeof(int32_t));
  c->seqs = tide_xcalloc((size_t)k.max_seqs, sizeof(kv_seq));
  c->ran = tide_xcalloc((size_t)k.n_layers, 1);
  if (!c->ratios || !c->layers || !c->ring_off || !c->iring_off || !c->swa_ref || !c->swa_free || !c->pg_ref ||
      !c->pg_free || !c->seqs || !c->ran)
    goto nomem;
  for (int i = 0; i < k.n_layers; i++) c->ratios[i] = k.ratios[i] <= 1 ? 1 : k.ratios[i];
  k.ratios = c->ratios;
  c->cfg = k;
  int64_t off = 0;
  for (int i = 0; i < k.n_layers; i++) {
    kv_layer *ly = &c->layers[i];
    ly->ratio = c->ratios[i];
    ly->comp = ly->icomp = -1;
    ly->swa_stride = (int64_t)k.swa_block * KV_TOK;
    if (tide_storage_new(&ly->swa, ly->swa_stride * k.swa_blocks) < 0) goto nomem;
    if (ly->ratio > 1) {
      ly->comp = c->n_comp++;
      c->ring_off[ly->comp] = off;
      off += kv_ring_rows(ly->ratio) * kv_state_width(ly->ratio);
      ly->E = k.page_tokens / ly->ratio;
      ly->main_stride = ly->E * KV_TOK;
      if (tide_storage_new(&ly->main, ly->main_stride * k.pages) < 0) goto nomem;
    }
    if (ly->ratio == 4) {
      ly->icomp = c->n_icomp++;
      c->iring_off[ly->icomp] = off;
      off += 8 * KV_ISTATE_W;
      ly->idx_stride = ly->E * KV_IDX;
      if (tide_storage_new(&ly->idx, ly->idx_stride * k.pages) < 0) goto nomem;
    }
  }
  c->state_floats = off;
  for (int32_t i = 0; i < k.swa_blocks; i++) c->swa_free[i] = k.swa_blocks - 1 - i;
  c->n_swa_free = k.swa_blocks;
  for (int32_t i = 0; i < k.pages; i++) c->pg_free[i] = k.pages - 1 - i;
  c->n_pg_free = k.pages;
  *out = c;
  return TIDE_OK;
nomem:
  tide_kvcache_free(c);
  return TIDE_ERR(TIDE_E_NOMEM, "cache of %d layers, %d SWA blocks, %d pages", k.n_layers, k.swa_blocks, k.pages);
}

void tide_kvcache_retain(tide_kvcache *c) {
  if (c) __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

/* Drops one reference; the last one destroys the cache, its sequences with it.
 * A batch still prepared on it loses its link (freeing it later is safe). */
void tide_kvcache_free(tide_kvcache *c) {
  if (!c) return;
  if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (c->layers)
    for (int i = 0; i < c->cfg.n_layers; i++) {
      tide_storage_release(c->layers[i].swa);
      tide_storage_release(c->layers[i].main);
      tide_storage_release(c->layers[i].idx);
    }
  if (c->seqs)
    for (int i = 0; i < c->cfg.max_seqs; i++) {
      tide_xfree(c->seqs[i].swa);
      tide_xfree(c->seqs[i].pg);
      tide_xfree(c->seqs[i].state);
      tide_xfree(c->seqs[i].backup);
    }
  if (c->step) c->step->cache = NULL;
  for (int t = 0; t < KV_MAXTHREADS; t++) tide_xfree(c->scratch[t]);
  tide_xfree(c->shared);
  tide_xfree(c->ratios);
  tide_xfree(c->layers);
  tide_xfree(c->ring_off);
  tide_xfree(c->iring_off);
  tide_xfree(c->swa_ref);
  tide_xfree(c->swa_free);
  tide_xfree(c->pg_ref);
  tide_xfree(c->pg_free);
  tide_xfree(c->seqs);
  tide_xfree(c->undo);
  tide_xfree(c->ran);
  tide_xfree(c);
}

int tide_kvcache_stats_get(const tide_kvcache *c, tide_kvcache_stats *o) {
  if (!c || !o) return TIDE_ERR(TIDE_E_INVALID, "cache or out is NULL");
  memset(o, 0, sizeof *o);
  o->swa_blocks = c->cfg.swa_blocks;
  o->swa_free = c->n_swa_free;
  o->pages = c->cfg.pages;
  o->pages_free = c->n_pg_free;
  o->max_seqs = c->cfg.max_seqs;
  int n = 0;
  for (int i = 0; i < c->cfg.max_seqs; i++) n += c->seqs[i].live;
  o->seqs = n;
  int64_t bytes = 0;
  for (int i = 0; i < c->cfg.n_layers; i++) {
    const kv_layer *ly = &c->layers[i];
    bytes += tide_storage_bytes(ly->swa);
    if (ly->main) bytes += tide_storage_bytes(ly->main);
    if (ly->idx) bytes += tide_storage_bytes(ly->idx);
  }
  for (int i = 0; i < c->cfg.max_seqs; i++)
    bytes += (c->seqs[i].state ? 1 : 0) * c->state_floats * 4 + (c->seqs[i].backup ? 1 : 0) * c->state_floats * 4;
  o->bytes = bytes;
  o->n_layers = c->cfg.n_layers;
  o->window = c->cfg.window;
  o->swa_block = c->cfg.swa_block;
  o->page_tokens = c->cfg.page_tokens;
  o->keep_swa_history = c->cfg.keep_swa_history;
  o->step_active = c->step != NULL;
  return TIDE_OK;
}

int tide_kvcache_layer_ratio(const tide_kvcache *c, int32_t layer) {
  if (!c) return TIDE_ERR(TIDE_E_INVALID, "cache is NULL");
  if (layer < 0 || layer >= c->cfg.n_layers)
    return TIDE_ERR(TIDE_E_RANGE, "layer %d outside 0..%d", layer, c->cfg.n_layers - 1);
  return c->ratios[layer];
}

static int check_region(const char *fn, const tide_kvcache *c, int32_t layer, int32_t kind) {
  if (!c) return tide_errorf(TIDE_E_INVALID, fn, "cache is NULL");
  if (layer < 0 || layer >= c->cfg.n_layers)
    return tide_errorf(TIDE_E_RANGE, fn, "layer %d outside 0..%d", layer, c->cfg.n_layers - 1);
  int r = c->ratios[layer];
  if (kind < TIDE_KV_SWA || kind > TIDE_KV_ISTATE) return tide_errorf(TIDE_E_INVALID, fn, "bad region kind %d", kind);
  if ((kind == TIDE_KV_MAIN || kind == TIDE_KV_STATE) && r == 1)
    return tide_errorf(TIDE_E_INVALID, fn, "layer %d is SWA-only: no compressed region", layer);
  if ((kind == TIDE_KV_INDEX || kind == TIDE_KV_ISTATE) && r != 4)
    return tide_errorf(TIDE_E_INVALID, fn, "layer %d has ratio %d: no indexer region", layer, r);
  return TIDE_OK;
}

int tide_kvcache_view(tide_kvcache *c, int32_t layer, int32_t kind, tide_tensor *out) {
  TIDE_CHECK(check_region(__func__, c, layer, kind));
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "out is NULL");
  const kv_layer *ly = &c->layers[layer];
  tide_storage *st;
  int64_t shape[2];
  if (kind == TIDE_KV_SWA) {
    st = ly->swa;
    shape[0] = c->cfg.swa_blocks;
    shape[1] = ly->swa_stride;
  } else if (kind == TIDE_KV_MAIN) {
    st = ly->main;
    shape[0] = c->cfg.pages;
    shape[1] = ly->main_stride;
  } else if (kind == TIDE_KV_INDEX) {
    st = ly->idx;
    shape[0] = c->cfg.pages;
    shape[1] = ly->idx_stride;
  } else {
    return TIDE_ERR(TIDE_E_INVALID, "compressor state is per sequence: use tide_kvcache_seq_read");
  }
  tide_tensor t = {0};
  TIDE_CHECK(tide_tensor_from_storage(&t, st, 0, TIDE_U8, 2, shape));
  tide_tensor_release(out);
  *out = t;
  return TIDE_OK;
}

int64_t tide_kvcache_block_slots(const tide_kvcache *c, int32_t layer, int32_t kind) {
  TIDE_CHECK(check_region(__func__, c, layer, kind));
  if (kind == TIDE_KV_SWA) return c->cfg.swa_block;
  if (kind == TIDE_KV_MAIN || kind == TIDE_KV_INDEX) return c->layers[layer].E;
  return kv_ring_rows(kind == TIDE_KV_ISTATE ? 4 : c->ratios[layer]);
}

/* ---- sequences ---- */
static int seq_init(tide_kvcache *c, int32_t *id) {
  for (int32_t i = 0; i < c->cfg.max_seqs; i++) {
    kv_seq *s = &c->seqs[i];
    if (s->live) continue;
    if (!s->state && c->state_floats) {
      s->state = tide_xcalloc((size_t)c->state_floats, sizeof(float));
      if (!s->state) return TIDE_ERR(TIDE_E_NOMEM, "compressor state of %lld floats", (long long)c->state_floats);
    }
    s->live = 1;
    s->len = 0;
    s->backed = 0;
    s->t_p0 = -1;
    for (int64_t k = 0; k < s->swa_cap; k++) s->swa[k] = -1;
    for (int64_t k = 0; k < s->pg_cap; k++) s->pg[k] = -1;
    *id = i;
    return TIDE_OK;
  }
  return TIDE_FULL;
}

int tide_kvcache_seq_new(tide_kvcache *c, int32_t *id) {
  if (!c || !id) return TIDE_ERR(TIDE_E_INVALID, "cache or id is NULL");
  int rc = seq_init(c, id);
  if (rc == TIDE_FULL) tide_errorf(TIDE_FULL, __func__, "all %d sequence slots are in use", c->cfg.max_seqs);
  return rc;
}

static void seq_release(tide_kvcache *c, kv_seq *s) {
  for (int64_t k = 0; k < s->swa_cap; k++) {
    pool_decref(c->swa_free, &c->n_swa_free, c->swa_ref, s->swa[k]);
    s->swa[k] = -1;
  }
  for (int64_t k = 0; k < s->pg_cap; k++) {
    pool_decref(c->pg_free, &c->n_pg_free, c->pg_ref, s->pg[k]);
    s->pg[k] = -1;
  }
  s->len = 0;
}

int tide_kvcache_seq_free(tide_kvcache *c, int32_t id) {
  kv_seq *s = get_seq(c, id, __func__);
  if (!s) return tide_last_status();
  if (c->step) return TIDE_ERR(TIDE_E_STATE, "sequence %d: a step is prepared (commit or abort it first)", id);
  seq_release(c, s);
  s->live = 0;
  return TIDE_OK;
}

int64_t tide_kvcache_seq_len(const tide_kvcache *c, int32_t id) {
  kv_seq *s = get_seq(c, id, __func__);
  if (!s) return tide_last_status();
  return s->len;
}

int tide_kvcache_seq_usage(const tide_kvcache *c, int32_t id, int32_t *swa_blocks, int32_t *pages) {
  kv_seq *s = get_seq(c, id, __func__);
  if (!s) return tide_last_status();
  int32_t a = 0, b = 0;
  for (int64_t k = 0; k < s->swa_cap; k++) a += s->swa[k] >= 0;
  for (int64_t k = 0; k < s->pg_cap; k++) b += s->pg[k] >= 0;
  if (swa_blocks) *swa_blocks = a;
  if (pages) *pages = b;
  return TIDE_OK;
}

/* copy the carried compressor rows of positions [ks, len) of every layer */
static void copy_state_rows(const tide_kvcache *c, float *dst, const float *src, int64_t len) {
  for (int i = 0; i < c->cfg.n_layers; i++) {
    const kv_layer *ly = &c->layers[i];
    if (ly->ratio == 1) continue;
    int64_t R = kv_ring_rows(ly->ratio), w = kv_state_width(ly->ratio);
    int64_t ks = kv_keep_start(ly->ratio, len);
    int64_t o = c->ring_off[ly->comp];
    for (int64_t q = ks; q < len; q++) memcpy(dst + o + (q % R) * w, src + o + (q % R) * w, (size_t)w * 4);
    if (ly->ratio == 4) {
      o = c->iring_off[ly->icomp];
      for (int64_t q = ks; q < len; q++)
        memcpy(dst + o + (q % 8) * KV_ISTATE_W, src + o + (q % 8) * KV_ISTATE_W, KV_ISTATE_W * 4);
    }
  }
}

/* make d a copy-on-write copy of s (d already released and live) */
static int seq_copy(tide_kvcache *c, kv_seq *d, const kv_seq *s) {
  TIDE_CHECK(grow_tab(&d->swa, &d->swa_cap, s->swa_cap));
  TIDE_CHECK(grow_tab(&d->pg, &d->pg_cap, s->pg_cap));
  for (int64_t k = 0; k < s->swa_cap; k++) {
    d->swa[k] = s->swa[k];
    if (s->swa[k] >= 0) c->swa_ref[s->swa[k]]++;
  }
  for (int64_t k = 0; k < s->pg_cap; k++) {
    d->pg[k] = s->pg[k];
    if (s->pg[k] >= 0) c->pg_ref[s->pg[k]]++;
  }
  if (c->state_floats) copy_state_rows(c, d->state, s->state, s->len);
  d->len = s->len;
  return TIDE_OK;
}

int tide_kvcache_seq_fork(tide_kvcache *c, int32_t src, int32_t *dst) {
  kv_seq *s = get_seq(c, src, __func__);
  if (!s) return tide_last_status();
  if (!dst) return TIDE_ERR(TIDE_E_INVALID, "dst is NULL");
  if (c->step) return TIDE_ERR(TIDE_E_STATE, "sequence %d: a step is prepared", src);
  int32_t id;
  int rc = seq_init(c, &id);
  if (rc == TIDE_FULL) return tide_errorf(TIDE_FULL, __func__, "fork of %d: all %d sequence slots are in use", src, c->cfg.max_seqs);
  if (rc < 0) return rc;
  kv_seq *d = &c->seqs[id];
  s = &c->seqs[src];
  rc = seq_copy(c, d, s);
  if (rc < 0) {
    seq_release(c, d);
    d->live = 0;
    return rc;
  }
  *dst = id;
  return TIDE_OK;
}

int tide_kvcache_seq_assign(tide_kvcache *c, int32_t dst, int32_t src) {
  kv_seq *s = get_seq(c, src, __func__);
  if (!s) return tide_last_status();
  kv_seq *d = get_seq(c, dst, __func__);
  if (!d) return tide_last_status();
  if (dst == src) return TIDE_ERR(TIDE_E_INVALID, "dst and src are both %d", dst);
  if (c->step) return TIDE_ERR(TIDE_E_STATE, "a step is prepared");
  TIDE_CHECK(grow_tab(&d->swa, &d->swa_cap, s->swa_cap));
  TIDE_CHECK(grow_tab(&d->pg, &d->pg_cap, s->pg_cap));
  /* blocks shared by dst and src keep a reference through src */
  seq_release(c, d);
  d->t_p0 = -1;
  return seq_copy(c, d, s);
}

int tide_kvcache_seq_set_length(tide_kvcache *c, int32_t id, int64_t len) {
  kv_seq *s = get_seq(c, id, __func__);
  if (!s) return tide_last_status();
  if (c->step) return TIDE_ERR(TIDE_E_STATE, "a step is prepared");
  if (s->len != 0) return TIDE_ERR(TIDE_E_STATE, "sequence %d has length %lld (must be empty)", id, (long long)s->len);
  if (len < 0) return TIDE_ERR(TIDE_E_RANGE, "length %lld", (long long)len);
  if (len == 0) return TIDE_OK;
  int64_t B = c->cfg.swa_block, pt = c->cfg.page_tokens;
  int64_t b0 = swa_first_held(c, len) / B, b1 = (len - 1) / B;
  int64_t np = c->n_comp ? (len - 1) / pt + 1 : 0;
  if (b1 - b0 + 1 > c->n_swa_free || np > c->n_pg_free)
    return tide_errorf(TIDE_FULL, __func__, "length %lld needs %lld SWA blocks (%d free) and %lld pages (%d free)",
                       (long long)len, (long long)(b1 - b0 + 1), c->n_swa_free, (long long)np, c->n_pg_free);
  TIDE_CHECK(grow_tab(&s->swa, &s->swa_cap, b1 + 1));
  TIDE_CHECK(grow_tab(&s->pg, &s->pg_cap, np));
  c->epoch++;
  for (int64_t b = b0; b <= b1; b++) {
    s->swa[b] = pool_pop(c->swa_free, &c->n_swa_free, c->swa_ref);
    for (int i = 0; i < c->cfg.n_layers; i++) {
      const kv_layer *ly = &c->layers[i];
      memset((uint8_t *)tide_storage_data(ly->swa) + (int64_t)s->swa[b] * ly->swa_stride, 0, (size_t)ly->swa_stride);
    }
  }
  for (int64_t p = 0; p < np; p++) {
    s->pg[p] = pool_pop(c->pg_free, &c->n_pg_free, c->pg_ref);
    for (int i = 0; i < c->cfg.n_layers; i++) {
      const kv_layer *ly = &c->layers[i];
      if (ly->main) memset((uint8_t *)tide_storage_data(ly->main) + (int64_t)s->pg[p] * ly->main_stride, 0, (size_t)ly->main_stride);
      if (ly->idx) memset((uint8_t *)tide_storage_data(ly->idx) + (int64_t)s->pg[p] * ly->idx_stride, 0, (size_t)ly->idx_stride);
    }
  }
  if (c->state_floats) memset(s->state, 0, (size_t)c->state_floats * 4);
  s->len = len;
  return TIDE_OK;
}

/* ---- roll-back ---- */
/* Take back block id released by the last commit: still referenced by a
 * fork (data untouched: no step since) or still in the free list. */
static void retake_swa(tide_kvcache *c, int32_t id) {
  if (c->swa_ref[id]++ > 0) return;
  for (int32_t i = c->n_swa_free - 1; i >= 0; i--)
    if (c->swa_free[i] == id) {
      memmove(c->swa_free + i, c->swa_free + i + 1, (size_t)(c->n_swa_free - 1 - i) * sizeof(int32_t));
      c->n_swa_free--;
      return;
    }
}

int tide_kvcache_seq_truncate(tide_kvcache *c, int32_t id, int64_t len) {
  kv_seq *s = get_seq(c, id, __func__);
  if (!s) return tide_last_status();
  if (c->step) return TIDE_ERR(TIDE_E_STATE, "a step is prepared");
  if (len < 0 || len > s->len)
    return TIDE_ERR(TIDE_E_RANGE, "sequence %d: length %lld outside 0..%lld", id, (long long)len, (long long)s->len);
  if (len == s->len) return TIDE_OK;
  int64_t p0 = s->t_p0, p1 = s->len;
  if (p0 < 0 || s->t_epoch != c->epoch)
    return TIDE_ERR(TIDE_E_STATE, "sequence %d: no roll-back record (a step, import or write ran on the cache "
                    "since its last step)", id);
  if (len < p0)
    return TIDE_ERR(TIDE_E_STATE, "sequence %d: length %lld is before its last step (positions %lld..%lld)", id,
                    (long long)len, (long long)p0, (long long)p1 - 1);
  /* the carried compressor rows of len: those before p0 are intact or in the
   * backup; the step's own rows are in the ring when it wrote them (its last
   * R positions) */
  for (int i = 0; i < c->cfg.n_layers; i++) {
    int r = c->ratios[i];
    for (int part = 0; part < (r == 4 ? 2 : r > 1 ? 1 : 0); part++) {
      int rr = part ? 4 : r;
      int64_t lo = kv_keep_start(rr, len);
      if (lo < p0) lo = p0;
      if (lo < len && lo < p1 - kv_ring_rows(rr))
        return TIDE_ERR(TIDE_E_STATE, "sequence %d: the step of %lld tokens overwrote compressor rows of layer %d "
                        "that length %lld needs", id, (long long)(p1 - p0), i, (long long)len);
    }
  }
  /* SWA blocks: those the window of len needs that the commit released must be in the record */
  int64_t B = c->cfg.swa_block, pt = c->cfg.page_tokens;
  int64_t need0 = len > 0 ? swa_first_held(c, len) / B : 0, held0 = swa_first_held(c, p1) / B;
  int64_t keep_b = len > 0 ? (len - 1) / B : -1;
  for (int64_t bi = need0; bi < held0 && bi <= keep_b; bi++) {
    int found = 0;
    for (int k = 0; k < s->t_nrel; k++) found |= s->t_rel_bi[k] == bi;
    if (!found)
      return TIDE_ERR(TIDE_E_STATE, "sequence %d: SWA block %lld released by its last step is not recorded", id,
                      (long long)bi);
  }
  /* perform: nothing below fails */
  for (int k = 0; k < s->t_nrel; k++) {
    int64_t bi = s->t_rel_bi[k];
    if (bi < need0 || bi >= held0 || bi > keep_b) continue;
    retake_swa(c, s->t_rel_id[k]);
    s->swa[bi] = s->t_rel_id[k];
    s->t_rel_id[k] = -1;
    s->t_rel_bi[k] = -1;
  }
  for (int64_t bi = keep_b + 1; bi < s->swa_cap; bi++) {
    pool_decref(c->swa_free, &c->n_swa_free, c->swa_ref, s->swa[bi]);
    s->swa[bi] = -1;
  }
  if (c->n_comp) {
    int64_t keep_p = len > 0 ? (len - 1) / pt : -1;
    for (int64_t pi = keep_p + 1; pi < s->pg_cap; pi++) {
      pool_decref(c->pg_free, &c->n_pg_free, c->pg_ref, s->pg[pi]);
      s->pg[pi] = -1;
    }
  }
  if (s->t_backed)
    for (int i = 0; i < c->cfg.n_layers; i++) {
      const kv_layer *ly = &c->layers[i];
      for (int part = 0; part < (ly->ratio == 4 ? 2 : ly->ratio > 1 ? 1 : 0); part++) {
        int rr = part ? 4 : ly->ratio;
        int64_t R = kv_ring_rows(rr), w = part ? KV_ISTATE_W : kv_state_width(rr);
        int64_t o = part ? c->iring_off[ly->icomp] : c->ring_off[ly->comp];
        int64_t q0 = kv_keep_start(rr, len);
        for (int64_t q = q0; q < p0; q++)
          memcpy(s->state + o + (q % R) * w, s->backup + o + (q % R) * w, (size_t)w * 4);
      }
    }
  s->len = len;
  return TIDE_OK;
}

/* ---- export / import ---- */
int tide_kvcache_seq_extent(const tide_kvcache *c, int32_t id, int32_t layer, int32_t kind, int64_t *first,
                            int64_t *rows, int64_t *row_bytes) {
  TIDE_CHECK(check_region(__func__, c, layer, kind));
  kv_seq *s = get_seq(c, id, __func__);
  if (!s) return tide_last_status();
  int r = c->ratios[layer];
  int64_t f = 0, n = 0, rb = 0;
  switch (kind) {
    case TIDE_KV_SWA: f = swa_first_held(c, s->len); n = s->len - f; rb = KV_TOK; break;
    case TIDE_KV_MAIN: n = s->len / r; rb = KV_TOK; break;
    case TIDE_KV_INDEX: n = s->len / 4; rb = KV_IDX; break;
    case TIDE_KV_STATE: f = kv_keep_start(r, s->len); n = s->len - f; rb = kv_state_width(r) * 4; break;
    default: f = kv_keep_start(4, s->len); n = s->len - f; rb = KV_ISTATE_W * 4; break;
  }
  if (first) *first = f;
  if (rows) *rows = n;
  if (row_bytes) *row_bytes = rb;
  return TIDE_OK;
}

/* address of row i of an extent (token layout split into data + scale parts) */
static void extent_ptrs(const tide_kvcache *c, const kv_seq *s, int32_t layer, int32_t kind, int64_t u, uint8_t **a,
                        uint8_t **b) {
  const kv_layer *ly = &c->layers[layer];
  int64_t off = 0;
  *a = *b = NULL;
  if (kind == TIDE_KV_SWA) {
    uint8_t *blk = kv_swa_block(c, ly, s, u, &off);
    if (!blk) return;
    *a = blk + off * KV_DATA;
    *b = blk + c->cfg.swa_block * KV_DATA + off * 8;
  } else if (kind == TIDE_KV_MAIN) {
    uint8_t *blk = kv_entry_block(c, ly, s, u, 0, &off);
    if (!blk) return;
    *a = blk + off * KV_DATA;
    *b = blk + ly->E * KV_DATA + off * 8;
  } else if (kind == TIDE_KV_INDEX) {
    uint8_t *blk = kv_entry_block(c, ly, s, u, 1, &off);
    if (!blk) return;
    *a = blk + off * 128;
    *b = blk + ly->E * 128 + off * 4;
  } else if (kind == TIDE_KV_STATE) {
    *a = (uint8_t *)(kv_ring(c, s, ly, 0) + (u % kv_ring_rows(ly->ratio)) * kv_state_width(ly->ratio));
  } else {
    *a = (uint8_t *)(kv_ring(c, s, ly, 1) + (u % 8) * KV_ISTATE_W);
  }
}

static int check_rows_tensor(const char *fn, const char *what, const tide_tensor *t, int64_t rows, int64_t rb) {
  TIDE_CHECK(tide_check_tensor(fn, what, t, TIDE_DT(TIDE_U8) | TIDE_DT(TIDE_I8), 2));
  if (t->sizes[0] != rows || t->sizes[1] != rb || !tide_tensor_is_contiguous(t)) {
    char sb[64];
    return tide_errorf(TIDE_E_INVALID, fn, "%s has shape %s, expected contiguous [%lld, %lld]", what,
                       tide_shape_str(t, sb, sizeof sb), (long long)rows, (long long)rb);
  }
  return TIDE_OK;
}

int tide_kvcache_seq_read(const tide_kvcache *c, int32_t id, int32_t layer, int32_t kind, tide_tensor *out) {
  int64_t f, n, rb;
  TIDE_CHECK(tide_kvcache_seq_extent(c, id, layer, kind, &f, &n, &rb));
  TIDE_CHECK(check_rows_tensor(__func__, "out", out, n, rb));
  const kv_seq *s = &c->seqs[id];
  uint8_t *o = out->data;
  for (int64_t i = 0; i < n; i++) {
    uint8_t *a, *b;
    extent_ptrs(c, s, layer, kind, f + i, &a, &b);
    if (!a) return TIDE_ERR(TIDE_E_INTERNAL, "row %lld of sequence %d is not held", (long long)(f + i), id);
    if (kind == TIDE_KV_SWA || kind == TIDE_KV_MAIN) {
      memcpy(o + i * rb, a, KV_DATA);
      memcpy(o + i * rb + KV_DATA, b, 8);
    } else if (kind == TIDE_KV_INDEX) {
      memcpy(o + i * rb, a, 128);
      memcpy(o + i * rb + 128, b, 4);
    } else {
      memcpy(o + i * rb, a, (size_t)rb);
    }
  }
  return TIDE_OK;
}

/* copy a shared block/page so the sequence owns it (for writes outside a step) */
static int own_swa(tide_kvcache *c, kv_seq *s, int64_t bi) {
  int32_t old = s->swa[bi];
  if (c->swa_ref[old] == 1) return TIDE_OK;
  if (!c->n_swa_free) return TIDE_FULL;
  int32_t nb = pool_pop(c->swa_free, &c->n_swa_free, c->swa_ref);
  for (int i = 0; i < c->cfg.n_layers; i++) {
    uint8_t *base = tide_storage_data(c->layers[i].swa);
    int64_t st = c->layers[i].swa_stride;
    memcpy(base + nb * st, base + old * st, (size_t)st);
  }
  c->swa_ref[old]--;
  s->swa[bi] = nb;
  return TIDE_OK;
}
static void copy_page(tide_kvcache *c, int32_t dst, int32_t src) {
  for (int i = 0; i < c->cfg.n_layers; i++) {
    const kv_layer *ly = &c->layers[i];
    if (ly->main) {
      uint8_t *base = tide_storage_data(ly->main);
      memcpy(base + (int64_t)dst * ly->main_stride, base + (int64_t)src * ly->main_stride, (size_t)ly->main_stride);
    }
    if (ly->idx) {
      uint8_t *base = tide_storage_data(ly->idx);
      memcpy(base + (int64_t)dst * ly->idx_stride, base + (int64_t)src * ly->idx_stride, (size_t)ly->idx_stride);
    }
  }
}
static int own_page(tide_kvcache *c, kv_seq *s, int64_t pi) {
  int32_t old = s->pg[pi];
  if (c->pg_ref[old] == 1) return TIDE_OK;
  if (!c->n_pg_free) return TIDE_FULL;
  int32_t np = pool_pop(c->pg_free, &c->n_pg_free, c->pg_ref);
  copy_page(c, np, old);
  c->pg_ref[old]--;
  s->pg[pi] = np;
  return TIDE_OK;
}

int tide_kvcache_seq_write(tide_kvcache *c, int32_t id, int32_t layer, int32_t kind, const tide_tensor *in) {
  int64_t f, n, rb;
  TIDE_CHECK(tide_kvcache_seq_extent(c, id, layer, kind, &f, &n, &rb));
  TIDE_CHECK(check_rows_tensor(__func__, "in", in, n, rb));
  if (c->step) return TIDE_ERR(TIDE_E_STATE, "a step is prepared");
  kv_seq *s = &c->seqs[id];
  const kv_layer *ly = &c->layers[layer];
  c->epoch++;
  /* copy-on-write first, all or nothing */
  int need = 0;
  if (kind == TIDE_KV_SWA) {
    for (int64_t b = f / c->cfg.swa_block; n && b <= (f + n - 1) / c->cfg.swa_block; b++) need += c->swa_ref[s->swa[b]] > 1;
    if (need > c->n_swa_free) return tide_errorf(TIDE_FULL, __func__, "copy-on-write needs %d SWA blocks, %d free", need, c->n_swa_free);
    for (int64_t b = f / c->cfg.swa_block; n && b <= (f + n - 1) / c->cfg.swa_block; b++) own_swa(c, s, b);
  } else if (kind == TIDE_KV_MAIN || kind == TIDE_KV_INDEX) {
    for (int64_t p = 0; n && p <= (n - 1) / ly->E; p++) need += c->pg_ref[s->pg[p]] > 1;
    if (need > c->n_pg_free) return tide_errorf(TIDE_FULL, __func__, "copy-on-write needs %d pages, %d free", need, c->n_pg_free);
    for (int64_t p = 0; n && p <= (n - 1) / ly->E; p++) own_page(c, s, p);
  }
  const uint8_t *src = in->data;
  for (int64_t i = 0; i < n; i++) {
    uint8_t *a, *b;
    extent_ptrs(c, s, layer, kind, f + i, &a, &b);
    if (kind == TIDE_KV_SWA || kind == TIDE_KV_MAIN) {
      memcpy(a, src + i * rb, KV_DATA);
      memcpy(b, src + i * rb + KV_DATA, 8);
    } else if (kind == TIDE_KV_INDEX) {
      memcpy(a, src + i * rb, 128);
      memcpy(b, src + i * rb + 128, 4);
    } else {
      memcpy(a, src + i * rb, (size_t)rb);
    }
  }
  return TIDE_OK;
}

static int64_t map_one(const tide_kvcache *c, const kv_seq *s, const kv_layer *ly, int32_t kind, int64_t u) {
  if (u < 0) return -1;
  if (kind == TIDE_KV_SWA) {
    int64_t B = c->cfg.swa_block, bi = u / B;
    if (bi >= s->swa_cap || s->swa[bi] < 0) return -1;
    return (int64_t)s->swa[bi] * B + u % B;
  }
  int64_t pi = u / ly->E;
  if (pi >= s->pg_cap || s->pg[pi] < 0) return -1;
  return (int64_t)s->pg[pi] * ly->E + u % ly->E;
}

int tide_kvcache_map_slots(const tide_kvcache *c, int32_t id, int32_t layer, int32_t kind, const tide_tensor *local,
                           tide_tensor *out) {
  TIDE_CHECK(check_region(__func__, c, layer, kind));
  if (kind > TIDE_KV_INDEX) return TIDE_ERR(TIDE_E_INVALID, "slot mapping is for SWA, MAIN and INDEX regions");
  kv_seq *s = get_seq(c, id, __func__);
  if (!s) return tide_last_status();
  unsigned m = TIDE_DT(TIDE_I32) | TIDE_DT(TIDE_I64);
  TIDE_CHECK(tide_check_tensor(__func__, "local", local, m, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, m, -1));
  int64_t n = tide_tensor_numel(local);
  if (tide_tensor_numel(out) != n || !tide_tensor_is_contiguous(local) || !tide_tensor_is_contiguous(out))
    return TIDE_ERR(TIDE_E_INVALID, "local and out must be contiguous with the same number of elements");
  const kv_layer *ly = &c->layers[layer];
  for (int64_t i = 0; i < n; i++) {
    int64_t u = local->dtype == TIDE_I32 ? ((const int32_t *)local->data)[i] : ((const int64_t *)local->data)[i];
    int64_t v = map_one(c, s, ly, kind, u);
    if (out->dtype == TIDE_I32) ((int32_t *)out->data)[i] = (int32_t)v;
    else ((int64_t *)out->data)[i] = v;
  }
  return TIDE_OK;
}

/* ---- batches ---- */
int tide_batch_new(tide_batch **out, int32_t max_tokens) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "out is NULL");
  *out = NULL;
  if (max_tokens < 1) return TIDE_ERR(TIDE_E_INVALID, "max_tokens %d", max_tokens);
  tide_batch *b = tide_xcalloc(1, sizeof *b);
  if (!b) return TIDE_E_NOMEM;
  b->max_tokens = max_tokens;
  b->seq = tide_xcalloc((size_t)max_tokens, sizeof(int32_t));
  b->pos = tide_xcalloc((size_t)max_tokens, sizeof(int64_t));
  b->run_seq = tide_xcalloc((size_t)max_tokens, sizeof(int32_t));
  b->run_t0 = tide_xcalloc((size_t)max_tokens, sizeof(int32_t));
  b->run_n = tide_xcalloc((size_t)max_tokens, sizeof(int32_t));
  if (!b->seq || !b->pos || !b->run_seq || !b->run_t0 || !b->run_n) {
    tide_batch_free(b);
    return TIDE_ERR(TIDE_E_NOMEM, "batch of %d tokens", max_tokens);
  }
  *out = b;
  return TIDE_OK;
}

void tide_batch_free(tide_batch *b) {
  if (!b) return;
  if (b->cache) tide_kvcache_abort(b->cache, b);
  tide_xfree(b->seq);
  tide_xfree(b->pos);
  tide_xfree(b->run_seq);
  tide_xfree(b->run_t0);
  tide_xfree(b->run_n);
  tide_xfree(b);
}

int tide_batch_clear(tide_batch *b) {
  if (!b) return TIDE_ERR(TIDE_E_INVALID, "batch is NULL");
  if (b->cache) return TIDE_ERR(TIDE_E_STATE, "the batch is prepared: commit or abort it first");
  b->n = 0;
  b->n_runs = 0;
  return TIDE_OK;
}

int tide_batch_add(tide_batch *b, int32_t seq, int64_t pos0, int32_t n) {
  if (!b) return TIDE_ERR(TIDE_E_INVALID, "batch is NULL");
  if (b->cache) return TIDE_ERR(TIDE_E_STATE, "the batch is prepared: commit or abort it first");
  if (n < 0 || seq < 0 || pos0 < 0) return TIDE_ERR(TIDE_E_INVALID, "sequence %d, position %lld, count %d", seq, (long long)pos0, n);
  if (n == 0) return TIDE_OK;
  if ((int64_t)b->n + n > b->max_tokens)
    return TIDE_ERR(TIDE_E_RANGE, "%d + %d tokens exceed the batch capacity %d", b->n, n, b->max_tokens);
  int last = b->n_runs - 1;
  if (last >= 0 && b->run_seq[last] == seq) {
    int64_t next = b->pos[b->n - 1] + 1;
    if (pos0 != next)
      return TIDE_ERR(TIDE_E_INVALID, "sequence %d: position %lld does not continue %lld", seq, (long long)pos0,
                      (long long)b->pos[b->n - 1]);
    b->run_n[last] += n;
  } else {
    for (int r = 0; r < b->n_runs; r++)
      if (b->run_seq[r] == seq)
        return TIDE_ERR(TIDE_E_INVALID, "sequence %d: its tokens must be contiguous in the batch", seq);
    b->run_seq[b->n_runs] = seq;
    b->run_t0[b->n_runs] = b->n;
    b->run_n[b->n_runs] = n;
    b->n_runs++;
  }
  for (int32_t i = 0; i < n; i++) {
    b->seq[b->n + i] = seq;
    b->pos[b->n + i] = pos0 + i;
  }
  b->n += n;
  return TIDE_OK;
}

int tide_batch_set(tide_batch *b, int32_t n, const int32_t *seqs, const int64_t *pos) {
  if (!b) return TIDE_ERR(TIDE_E_INVALID, "batch is NULL");
  if (b->cache) return TIDE_ERR(TIDE_E_STATE, "the batch is prepared: commit or abort it first");
  if (n < 0 || n > b->max_tokens) return TIDE_ERR(TIDE_E_RANGE, "%d tokens, capacity %d", n, b->max_tokens);
  if (n > 0 && (!seqs || !pos)) return TIDE_ERR(TIDE_E_INVALID, "seqs or pos is NULL");
  b->n = 0;
  b->n_runs = 0;
  for (int32_t i = 0; i < n; i++) {
    int rc = tide_batch_add(b, seqs[i], pos[i], 1);
    if (rc < 0) {
      /* leave an empty batch rather than a partial one */
      b->n = 0;
      b->n_runs = 0;
      return tide_error_wrap(rc, "token %d", i);
    }
  }
  return TIDE_OK;
}

int32_t tide_batch_tokens(const tide_batch *b) { return b ? b->n : 0; }

int tide_batch_token(const tide_batch *b, int32_t t, int32_t *seq, int64_t *pos) {
  if (!b) return TIDE_ERR(TIDE_E_INVALID, "batch is NULL");
  if (t < 0 || t >= b->n) return TIDE_ERR(TIDE_E_RANGE, "token %d outside 0..%d", t, b->n - 1);
  if (seq) *seq = b->seq[t];
  if (pos) *pos = b->pos[t];
  return TIDE_OK;
}

int tide_batch_positions(const tide_batch *b, tide_tensor *pos) {
  if (!b) return TIDE_ERR(TIDE_E_INVALID, "batch is NULL");
  TIDE_CHECK(tide_check_tensor(__func__, "pos", pos, TIDE_DT(TIDE_I64), 1));
  if (pos->sizes[0] != b->n || !tide_tensor_is_contiguous(pos))
    return TIDE_ERR(TIDE_E_INVALID, "pos has %lld elements, batch has %d tokens", (long long)pos->sizes[0], b->n);
  memcpy(pos->data, b->pos, (size_t)b->n * 8);
  return TIDE_OK;
}

/* ---- the step ---- */
static int undo_push(tide_kvcache *c, int kind, int32_t seq, int64_t index, int32_t old) {
  if (c->n_undo == c->undo_cap) return TIDE_ERR(TIDE_E_INTERNAL, "undo journal overflow");
  c->undo[c->n_undo++] = (kv_undo){kind, seq, index, old};
  return TIDE_OK;
}

int tide_kvcache_prepare(tide_kvcache *c, tide_batch *b) {
  if (!c || !b) return TIDE_ERR(TIDE_E_INVALID, "cache or batch is NULL");
  if (c->step) return TIDE_ERR(TIDE_E_STATE, "another batch is already prepared on this cache");
  if (b->cache) return TIDE_ERR(TIDE_E_STATE, "the batch is already prepared");
  int64_t B = c->cfg.swa_block, pt = c->cfg.page_tokens;
  int64_t need_swa = 0, need_pg = 0, n_tab = 0;
  for (int r = 0; r < b->n_runs; r++) {
    int32_t id = b->run_seq[r];
    kv_seq *s = get_seq(c, id, __func__);
    if (!s) return tide_error_wrap(tide_last_status(), "batch token %d", b->run_t0[r]);
    int64_t p0 = b->pos[b->run_t0[r]], p1 = p0 + b->run_n[r];
    if (p0 != s->len)
      return TIDE_ERR(TIDE_E_INVALID, "sequence %d: the step starts at position %lld but its length is %lld", id,
                      (long long)p0, (long long)s->len);
    for (int64_t bi = p0 / B; bi <= (p1 - 1) / B; bi++) {
      int32_t cur = bi < s->swa_cap ? s->swa[bi] : -1;
      need_swa += cur < 0 || c->swa_ref[cur] > 1;
      n_tab++;
    }
    if (c->n_comp)
      for (int64_t pi = p0 / pt; pi <= (p1 - 1) / pt; pi++) {
        int32_t cur = pi < s->pg_cap ? s->pg[pi] : -1;
        need_pg += cur < 0 || c->pg_ref[cur] > 1;
        n_tab++;
      }
  }
  if (need_swa > c->n_swa_free || need_pg > c->n_pg_free)
    return tide_errorf(TIDE_FULL, __func__, "the step needs %lld SWA blocks (%d free) and %lld pages (%d free)",
                       (long long)need_swa, c->n_swa_free, (long long)need_pg, c->n_pg_free);
  /* everything that can fail for lack of memory, before any change */
  if (n_tab > c->undo_cap) {
    kv_undo *u = tide_xrealloc(c->undo, (size_t)n_tab * sizeof *u);
    if (!u) return TIDE_ERR(TIDE_E_NOMEM, "undo journal of %lld entries", (long long)n_tab);
    c->undo = u;
    c->undo_cap = n_tab;
  }
  for (int r = 0; r < b->n_runs; r++) {
    kv_seq *s = &c->seqs[b->run_seq[r]];
    int64_t p1 = s->len + b->run_n[r];
    TIDE_CHECK(grow_tab(&s->swa, &s->swa_cap, (p1 - 1) / B + 1));
    if (c->n_comp) TIDE_CHECK(grow_tab(&s->pg, &s->pg_cap, (p1 - 1) / pt + 1));
    if (c->state_floats && !s->backup) {
      s->backup = tide_xcalloc((size_t)c->state_floats, sizeof(float));
      if (!s->backup) return TIDE_ERR(TIDE_E_NOMEM, "state backup of %lld floats", (long long)c->state_floats);
    }
  }
  /* now perform: nothing below fails */
  c->n_undo = 0;
  c->epoch++;
  for (int r = 0; r < b->n_runs; r++) {
    int32_t id = b->run_seq[r];
    kv_seq *s = &c->seqs[id];
    int64_t p0 = s->len, p1 = p0 + b->run_n[r];
    for (int64_t bi = p0 / B; bi <= (p1 - 1) / B; bi++) {
      int32_t cur = s->swa[bi];
      if (cur >= 0 && c->swa_ref[cur] == 1) continue;
      int32_t nb = pool_pop(c->swa_free, &c->n_swa_free, c->swa_ref);
      if (cur >= 0) {
        for (int i = 0; i < c->cfg.n_layers; i++) {
          uint8_t *base = tide_storage_data(c->layers[i].swa);
          int64_t st = c->layers[i].swa_stride;
          memcpy(base + nb * st, base + cur * st, (size_t)st);
        }
        c->swa_ref[cur]--;
      }
      s->swa[bi] = nb;
      undo_push(c, 0, id, bi, cur);
    }
    if (c->n_comp)
      for (int64_t pi = p0 / pt; pi <= (p1 - 1) / pt; pi++) {
        int32_t cur = s->pg[pi];
        if (cur >= 0 && c->pg_ref[cur] == 1) continue;
        int32_t np = pool_pop(c->pg_free, &c->n_pg_free, c->pg_ref);
        if (cur >= 0) {
          copy_page(c, np, cur);
          c->pg_ref[cur]--;
        }
        s->pg[pi] = np;
        undo_push(c, 1, id, pi, cur);
      }
    /* a step long enough to wrap a compressor ring saves the carried rows */
    s->backed = 0;
    if (c->state_floats) {
      int wraps = 0;
      for (int i = 0; i < c->cfg.n_layers; i++) {
        int rr = c->ratios[i];
        if (rr > 1 && p1 > kv_keep_start(rr, p0) + kv_ring_rows(rr)) wraps = 1;
      }
      if (wraps) {
        copy_state_rows(c, s->backup, s->state, p0);
        s->backed = 1;
      }
    }
  }
  memset(c->ran, 0, (size_t)c->cfg.n_layers);
  c->step = b;
  b->cache = c;
  return TIDE_OK;
}

static int check_prepared(const char *fn, tide_kvcache *c, tide_batch *b) {
  if (!c || !b) return tide_errorf(TIDE_E_INVALID, fn, "cache or batch is NULL");
  if (c->step != b || b->cache != c) return tide_errorf(TIDE_E_STATE, fn, "the batch is not prepared on this cache");
  return TIDE_OK;
}

int tide_kvcache_commit(tide_kvcache *c, tide_batch *b) {
  TIDE_CHECK(check_prepared(__func__, c, b));
  if (b->n > 0)
    for (int i = 0; i < c->cfg.n_layers; i++) {
      int r = c->ratios[i];
      if (r > 1 && !(c->ran[i] & 1))
        return TIDE_ERR(TIDE_E_STATE, "layer %d (ratio %d): tide_attn_compress did not run in this step", i, r);
      if (r == 4 && !(c->ran[i] & 2))
        return TIDE_ERR(TIDE_E_STATE, "layer %d: tide_attn_compress_indexer did not run in this step", i);
    }
  int64_t B = c->cfg.swa_block;
  for (int r = 0; r < b->n_runs; r++) {
    kv_seq *s = &c->seqs[b->run_seq[r]];
    s->t_p0 = s->len;
    s->t_epoch = c->epoch;
    s->t_backed = s->backed;
    s->t_nrel = 0;
    s->len += b->run_n[r];
    s->backed = 0;
    if (!c->cfg.keep_swa_history) {
      int64_t first = swa_first_held(c, s->len) / B;
      for (int64_t bi = 0; bi < first && bi < s->swa_cap; bi++)
        if (s->swa[bi] >= 0) {
          /* kept in the roll-back record: no step can reuse it before a truncate */
          if (s->t_nrel >= 0 && s->t_nrel < KV_TRUNC_REL) {
            s->t_rel_bi[s->t_nrel] = bi;
            s->t_rel_id[s->t_nrel++] = s->swa[bi];
          } else {
            s->t_nrel = -1;
          }
          pool_decref(c->swa_free, &c->n_swa_free, c->swa_ref, s->swa[bi]);
          s->swa[bi] = -1;
        }
    }
  }
  c->n_undo = 0;
  c->step = NULL;
  b->cache = NULL;
  return TIDE_OK;
}

int tide_kvcache_abort(tide_kvcache *c, tide_batch *b) {
  TIDE_CHECK(check_prepared(__func__, c, b));
  for (int64_t i = c->n_undo - 1; i >= 0; i--) {
    kv_undo u = c->undo[i];
    kv_seq *s = &c->seqs[u.seq];
    if (u.kind == 0) {
      pool_decref(c->swa_free, &c->n_swa_free, c->swa_ref, s->swa[u.index]);
      s->swa[u.index] = u.old;
      if (u.old >= 0) c->swa_ref[u.old]++;
    } else {
      pool_decref(c->pg_free, &c->n_pg_free, c->pg_ref, s->pg[u.index]);
      s->pg[u.index] = u.old;
      if (u.old >= 0) c->pg_ref[u.old]++;
    }
  }
  for (int r = 0; r < b->n_runs; r++) {
    kv_seq *s = &c->seqs[b->run_seq[r]];
    if (s->backed) copy_state_rows(c, s->state, s->backup, s->len);
    s->backed = 0;
  }
  c->n_undo = 0;
  c->step = NULL;
  b->cache = NULL;
  return TIDE_OK;
}

int tide_kv_check_step(const char *fn, const tide_kvcache *c, const tide_batch *b, int32_t layer, unsigned mask) {
  if (!c || !b) return tide_errorf(TIDE_E_INVALID, fn, "cache or batch is NULL");
  if (c->step != b || b->cache != c) return tide_errorf(TIDE_E_STATE, fn, "the batch is not prepared on this cache");
  if (layer < 0 || layer >= c->cfg.n_layers)
    return tide_errorf(TIDE_E_RANGE, fn, "layer %d outside 0..%d", layer, c->cfg.n_layers - 1);
  int r = c->ratios[layer];
  unsigned bit = r == 1 ? 1u : r == 4 ? 2u : 4u;
  if (!(mask & bit)) return tide_errorf(TIDE_E_INVALID, fn, "layer %d has ratio %d, which this kernel does not take", layer, r);
  return TIDE_OK;
}

int tide_kv_scratch(tide_kvcache *c, int t, int64_t n) {
  if (t < 0 || t >= KV_MAXTHREADS) return TIDE_ERR(TIDE_E_INTERNAL, "thread %d", t);
  if (n <= c->scratch_cap[t]) return TIDE_OK;
  n += n / 2; /* geometric: a growing context reallocates rarely */
  float *p = tide_xrealloc(c->scratch[t], (size_t)n * sizeof(float));
  if (!p) return TIDE_ERR(TIDE_E_NOMEM, "scratch of %lld floats", (long long)n);
  c->scratch[t] = p;
  c->scratch_cap[t] = n;
  return TIDE_OK;
}

int tide_batch_slots(const tide_batch *b, const tide_kvcache *c, int32_t layer, int32_t kind, tide_tensor *out) {
  TIDE_CHECK(check_region(__func__, c, layer, kind));
  if (!b) return TIDE_ERR(TIDE_E_INVALID, "batch is NULL");
  if (c->step != b) return TIDE_ERR(TIDE_E_STATE, "the batch is not prepared on this cache");
  const kv_layer *ly = &c->layers[layer];
  int64_t W = c->cfg.window;
  if (kind == TIDE_KV_SWA) {
    TIDE_CHECK(tide_check_tensor(__func__, "out", out, TIDE_DT(TIDE_I64), 2));
    if (out->sizes[0] != b->n || out->sizes[1] != W || !tide_tensor_is_contiguous(out))
      return TIDE_ERR(TIDE_E_INVALID, "out must be contiguous [%d, %lld]", b->n, (long long)W);
    int64_t *o = out->data;
    for (int32_t t = 0; t < b->n; t++) {
      const kv_seq *s = &c->seqs[b->seq[t]];
      int64_t p = b->pos[t], w0 = p - W + 1 < 0 ? 0 : p - W + 1;
      for (int64_t i = 0; i < W; i++) o[t * W + i] = w0 + i <= p ? map_one(c, s, ly, kind, w0 + i) : -1;
    }
    return TIDE_OK;
  }
  if (kind != TIDE_KV_MAIN && kind != TIDE_KV_INDEX) return TIDE_ERR(TIDE_E_INVALID, "kind %d has no slot list", kind);
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, TIDE_DT(TIDE_I64), 1));
  if (out->sizes[0] != b->n || !tide_tensor_is_contiguous(out))
    return TIDE_ERR(TIDE_E_INVALID, "out must be contiguous [%d]", b->n);
  int64_t *o = out->data;
  for (int32_t t = 0; t < b->n; t++) {
    int64_t p = b->pos[t];
    o[t] = (p + 1) % ly->ratio == 0 ? map_one(c, &c->seqs[b->seq[t]], ly, kind, p / ly->ratio) : -1;
  }
  return TIDE_OK;
}
