/* test_kvcache.c - the paged cache's bookkeeping: configuration checks,
 * sequence slots, batch validation, prepare's all-or-nothing TIDE_FULL, block
 * reuse after free, SWA recycling outside the window, copy-on-write
 * accounting of forks, slot mapping (-1 preserved), export/import of a
 * sequence's bytes and roll-back (tide_kvcache_seq_truncate). The numerics are in test_attn.c. */
#include <stdint.h>

#include "tide.h"
#include "tt.h"

static tide_kvcache *mkcache(int nl, const int32_t *ratios, int swa_blocks, int pages, int seqs, int hist) {
  tide_kvcache_config cfg = {0};
  cfg.n_layers = nl;
  cfg.ratios = ratios;
  cfg.swa_blocks = swa_blocks;
  cfg.pages = pages;
  cfg.max_seqs = seqs;
  cfg.keep_swa_history = hist;
  tide_kvcache *c = NULL;
  TT_OK(tide_kvcache_new(&c, &cfg));
  return c;
}

static int step(tide_kvcache *c, tide_batch *b, int32_t id, int32_t n) {
  tide_batch_clear(b);
  TT_OK(tide_batch_add(b, id, tide_kvcache_seq_len(c, id), n));
  int rc = tide_kvcache_prepare(c, b);
  if (rc) return rc;
  /* no compressed layers in these caches: commit needs no kernel */
  TT_OK(tide_kvcache_commit(c, b));
  return 0;
}

static void test_config(void) {
  tide_alloc_stats s0, s1;
  tide_alloc_stats_get(&s0);
  int32_t bad[2] = {0, 5};
  tide_kvcache_config cfg = {0};
  tide_kvcache *c = NULL;
  cfg.n_layers = 2;
  cfg.ratios = bad;
  cfg.swa_blocks = 4;
  cfg.pages = 4;
  cfg.max_seqs = 2;
  TT_FAILS(tide_kvcache_new(&c, &cfg), TIDE_E_INVALID, "ratio 5");
  int32_t ok[2] = {0, 128};
  cfg.ratios = ok;
  cfg.head_dim = 256;
  TT_FAILS(tide_kvcache_new(&c, &cfg), TIDE_E_UNSUPPORTED, "head_dim 256");
  cfg.head_dim = 0;
  cfg.page_tokens = 200;
  TT_FAILS(tide_kvcache_new(&c, &cfg), TIDE_E_INVALID, "page_tokens 200");
  cfg.page_tokens = 0;
  cfg.pages = 0;
  TT_FAILS(tide_kvcache_new(&c, &cfg), TIDE_E_INVALID, "pages");
  cfg.pages = 3;
  TT_OK(tide_kvcache_new(&c, &cfg));
  tide_kvcache_stats st;
  TT_OK(tide_kvcache_stats_get(c, &st));
  TT_CHECK(st.swa_block == 64 && st.page_tokens == 256 && st.window == 128 && st.swa_free == 4 && st.pages_free == 3,
           "defaults and capacities");
  /* 4 SWA blocks x 64 x 584 per layer x 2 + C128 pages 3 x 2 x 584 + state */
  TT_CHECK(st.bytes == 2 * 4 * 64 * 584 + 3 * 2 * 584, "bytes %lld", (long long)st.bytes);
  TT_CHECK(tide_kvcache_layer_ratio(c, 0) == 1 && tide_kvcache_layer_ratio(c, 1) == 128, "ratios");
  tide_tensor v = {0};
  TT_OK(tide_kvcache_view(c, 1, TIDE_KV_MAIN, &v));
  TT_CHECK(v.sizes[0] == 3 && v.sizes[1] == 2 * 584, "main view [pages, E*584]");
  TT_FAILS(tide_kvcache_view(c, 0, TIDE_KV_MAIN, &v), TIDE_E_INVALID, "SWA-only");
  TT_FAILS(tide_kvcache_view(c, 1, TIDE_KV_INDEX, &v), TIDE_E_INVALID, "no indexer");
  tide_kvcache_free(c);
  tide_tensor_release(&v); /* the view kept the storage alive */
  tide_alloc_stats_get(&s1);
  TT_CHECK(s1.live_allocs == s0.live_allocs && s1.live_storages == s0.live_storages, "no leak");
}

static void test_seqs_and_batches(void) {
  int32_t r[1] = {0};
  tide_kvcache *c = mkcache(1, r, 8, 0, 2, 1);
  int32_t a, b2, x;
  TT_OK(tide_kvcache_seq_new(c, &a));
  TT_OK(tide_kvcache_seq_new(c, &b2));
  TT_CHECK(tide_kvcache_seq_new(c, &x) == TIDE_FULL, "slots full -> TIDE_FULL");
  TT_CHECK(tide_kvcache_seq_len(c, 5) < 0 && strstr(tide_last_error(), "sequence id 5"), "bad id");
  tide_batch *b;
  TT_OK(tide_batch_new(&b, 10));
  TT_OK(tide_batch_add(b, a, 0, 3));
  TT_FAILS(tide_batch_add(b, a, 4, 1), TIDE_E_INVALID, "does not continue");
  TT_OK(tide_batch_add(b, a, 3, 2));
  TT_OK(tide_batch_add(b, b2, 0, 2));
  TT_FAILS(tide_batch_add(b, a, 5, 1), TIDE_E_INVALID, "contiguous");
  TT_FAILS(tide_batch_add(b, b2, 2, 10), TIDE_E_RANGE, "capacity");
  TT_CHECK(tide_batch_tokens(b) == 7, "7 tokens");
  int32_t sq;
  int64_t p;
  TT_OK(tide_batch_token(b, 4, &sq, &p));
  TT_CHECK(sq == a && p == 4, "token 4");
  TT_OK(tide_kvcache_prepare(c, b));
  TT_FAILS(tide_batch_clear(b), TIDE_E_STATE, "prepared");
  TT_FAILS(tide_kvcache_prepare(c, b), TIDE_E_STATE, "already prepared");
  TT_OK(tide_kvcache_commit(c, b));
  TT_CHECK(tide_kvcache_seq_len(c, a) == 5 && tide_kvcache_seq_len(c, b2) == 2, "lengths advanced");
  /* a step must start at the committed length */
  TT_OK(tide_batch_clear(b));
  TT_OK(tide_batch_add(b, a, 4, 1));
  TT_FAILS(tide_kvcache_prepare(c, b), TIDE_E_INVALID, "length is 5");
  int64_t pos[3] = {5, 6, 2};
  int32_t seqs[3] = {a, a, b2};
  TT_OK(tide_batch_set(b, 3, seqs, pos));
  tide_tensor pt = {0};
  int64_t three = 3;
  TT_OK(tide_tensor_new(&pt, TIDE_I64, 1, &three));
  TT_OK(tide_batch_positions(b, &pt));
  TT_CHECK(((int64_t *)pt.data)[2] == 2, "positions");
  tide_tensor_release(&pt);
  tide_batch_free(b);
  tide_kvcache_free(c);
}

/* TIDE_FULL changes nothing; freed blocks are reused */
static void test_full_and_reuse(void) {
  int32_t r[2] = {0, 4};
  tide_kvcache *c = mkcache(2, r, 5, 2, 3, 1);
  int32_t a, b2;
  TT_OK(tide_kvcache_seq_new(c, &a));
  TT_OK(tide_kvcache_seq_new(c, &b2));
  tide_batch *b;
  TT_OK(tide_batch_new(&b, 512));
  TT_OK(tide_batch_add(b, a, 0, 200));  /* 4 blocks, 1 page */
  TT_OK(tide_kvcache_prepare(c, b));
  TT_OK(tide_kvcache_abort(c, b));      /* commit needs the compressors; abort instead */
  tide_kvcache_stats s0, s1;
  TT_OK(tide_kvcache_stats_get(c, &s0));
  TT_CHECK(s0.swa_free == 5 && s0.pages_free == 2, "abort returned everything");
  TT_OK(tide_batch_clear(b));
  TT_OK(tide_batch_add(b, a, 0, 200));
  TT_OK(tide_batch_add(b, b2, 0, 130)); /* 4 + 3 blocks > 5 */
  TT_CHECK(tide_kvcache_prepare(c, b) == TIDE_FULL && strstr(tide_last_error(), "SWA blocks"), "TIDE_FULL");
  TT_OK(tide_kvcache_stats_get(c, &s1));
  TT_CHECK(!memcmp(&s0, &s1, sizeof s0), "TIDE_FULL left the pools unchanged");
  TT_CHECK(tide_kvcache_seq_len(c, a) == 0, "lengths unchanged");
  TT_OK(tide_batch_clear(b));
  /* import path allocations: all or nothing too */
  TT_CHECK(tide_kvcache_seq_set_length(c, a, 6 * 64) == TIDE_FULL, "set_length past capacity");
  TT_OK(tide_kvcache_seq_set_length(c, a, 300));
  tide_tensor loc = {0}, sl = {0};
  int64_t n = 6;
  TT_OK(tide_tensor_new(&loc, TIDE_I64, 1, &n));
  TT_OK(tide_tensor_new(&sl, TIDE_I64, 1, &n));
  int64_t *lp = loc.data;
  lp[0] = 0; lp[1] = 63; lp[2] = 64; lp[3] = 299; lp[4] = -1; lp[5] = 320;
  TT_OK(tide_kvcache_map_slots(c, a, 0, TIDE_KV_SWA, &loc, &sl));
  int64_t *sp = sl.data;
  TT_CHECK(sp[0] >= 0 && sp[1] == sp[0] + 63 && sp[2] % 64 == 0 && sp[2] != sp[0] && sp[3] % 64 == 299 % 64 && sp[4] == -1 && sp[5] == -1,
           "SWA slots %lld %lld %lld %lld %lld %lld", (long long)sp[0], (long long)sp[1], (long long)sp[2], (long long)sp[3],
           (long long)sp[4], (long long)sp[5]);
  /* the five SWA blocks a holds (the whole pool) */
  int64_t old_blocks[5];
  for (int i = 0; i < 5; i++) {
    lp[0] = 64 * i;
    TT_OK(tide_kvcache_map_slots(c, a, 0, TIDE_KV_SWA, &loc, &sl));
    old_blocks[i] = sp[0] / 64;
  }
  /* C4 entries: 64 per page; entry 74 in the second page */
  lp[0] = 74;
  TT_OK(tide_kvcache_map_slots(c, a, 1, TIDE_KV_MAIN, &loc, &sl));
  TT_CHECK(sp[0] % 64 == 10, "entry slot %lld", (long long)sp[0]);
  TT_CHECK(tide_kvcache_seq_set_length(c, b2, 10) == TIDE_FULL, "the pool is exhausted");
  TT_OK(tide_kvcache_seq_free(c, a));
  TT_OK(tide_kvcache_stats_get(c, &s1));
  TT_CHECK(s1.swa_free == 5 && s1.pages_free == 2 && s1.seqs == 1, "free returned blocks");
  /* the whole pool again: only possible if the freed blocks are reused */
  TT_OK(tide_kvcache_seq_set_length(c, b2, 300));
  int reused = 1;
  for (int i = 0; i < 5; i++) {
    lp[0] = 64 * i;
    TT_OK(tide_kvcache_map_slots(c, b2, 0, TIDE_KV_SWA, &loc, &sl));
    int found = 0;
    for (int k = 0; k < 5; k++) found |= sp[0] / 64 == old_blocks[k];
    reused &= found;
  }
  TT_CHECK(reused, "the new sequence runs on the freed blocks");
  tide_tensor_release(&loc);
  tide_tensor_release(&sl);
  tide_batch_free(b);
  tide_kvcache_free(c);
}

/* SWA blocks out of the window are recycled at commit unless history is kept */
static void test_recycle(void) {
  int32_t r[1] = {0};
  for (int hist = 0; hist < 2; hist++) {
    tide_kvcache *c = mkcache(1, r, hist ? 20 : 4, 0, 1, hist);
    int32_t a;
    TT_OK(tide_kvcache_seq_new(c, &a));
    tide_batch *b;
    TT_OK(tide_batch_new(&b, 64));
    int full = 0;
    for (int i = 0; i < 20 && !full; i++) full = step(c, b, a, 64) != 0;
    int32_t used;
    TT_OK(tide_kvcache_seq_usage(c, a, &used, NULL));
    if (!hist) TT_CHECK(!full && used <= 3, "no history: 1280 tokens in <= 3 blocks (%d), full %d", used, full);
    else TT_CHECK(!full && used == 20, "history: every block kept (%d)", used);
    int64_t f, rows, rb;
    TT_OK(tide_kvcache_seq_extent(c, a, 0, TIDE_KV_SWA, &f, &rows, &rb));
    TT_CHECK(f + rows == 1280 && (hist ? f == 0 : f == 1152), "SWA extent first %lld rows %lld", (long long)f, (long long)rows);
    tide_batch_free(b);
    tide_kvcache_free(c);
  }
}

/* forks share blocks; the first write copies only the shared partial block */
static void test_fork_cow(void) {
  int32_t r[1] = {0};
  tide_kvcache *c = mkcache(1, r, 10, 0, 3, 1);
  int32_t a, f;
  TT_OK(tide_kvcache_seq_new(c, &a));
  tide_batch *b;
  TT_OK(tide_batch_new(&b, 200));
  TT_OK(step(c, b, a, 100));
  TT_OK(tide_kvcache_seq_fork(c, a, &f));
  tide_kvcache_stats st;
  TT_OK(tide_kvcache_stats_get(c, &st));
  TT_CHECK(st.swa_free == 8, "fork shares: %d free", st.swa_free);
  /* write a marker into a's block 1 through the import path: copies it */
  int64_t fst, rows, rb;
  TT_OK(tide_kvcache_seq_extent(c, a, 0, TIDE_KV_SWA, &fst, &rows, &rb));
  tide_tensor t = {0};
  int64_t sh[2] = {rows, rb};
  TT_OK(tide_tensor_new(&t, TIDE_U8, 2, sh));
  TT_OK(tide_kvcache_seq_read(c, a, 0, TIDE_KV_SWA, &t));
  ((uint8_t *)t.data)[99 * 584] = 0x42;
  TT_OK(tide_kvcache_seq_write(c, a, 0, TIDE_KV_SWA, &t));
  TT_OK(tide_kvcache_stats_get(c, &st));
  TT_CHECK(st.swa_free == 6, "both shared blocks copied on write: %d free", st.swa_free);
  tide_tensor u = {0};
  TT_OK(tide_tensor_new(&u, TIDE_U8, 2, sh));
  TT_OK(tide_kvcache_seq_read(c, f, 0, TIDE_KV_SWA, &u));
  TT_CHECK(((uint8_t *)u.data)[99 * 584] == 0, "the fork still sees the old bytes");
  /* a step on the fork copies its (shared) partial block 1 only */
  TT_OK(tide_kvcache_seq_fork(c, f, &a)); /* reuse the id variable for a third */
  TT_OK(tide_kvcache_stats_get(c, &st));
  int before = st.swa_free;
  TT_OK(step(c, b, f, 10));
  TT_OK(tide_kvcache_stats_get(c, &st));
  TT_CHECK(st.swa_free == before - 1, "copy-on-write of the partial block: %d -> %d", before, st.swa_free);
  /* assign drops the old contents and shares the source's */
  TT_OK(tide_kvcache_seq_assign(c, f, a));
  TT_CHECK(tide_kvcache_seq_len(c, f) == 100, "assign length");
  TT_FAILS(tide_kvcache_seq_assign(c, f, f), TIDE_E_INVALID, "both");
  tide_tensor_release(&t);
  tide_tensor_release(&u);
  tide_batch_free(b);
  tide_kvcache_free(c);
}

/* export of every region and import into a fresh sequence of another cache */
static void test_export_import(void) {
  int32_t r[3] = {0, 4, 128};
  tide_kvcache *c1 = mkcache(3, r, 10, 4, 1, 1), *c2 = mkcache(3, r, 10, 4, 1, 1);
  int32_t a, b2;
  TT_OK(tide_kvcache_seq_new(c1, &a));
  TT_OK(tide_kvcache_seq_set_length(c1, a, 300));
  TT_OK(tide_kvcache_seq_new(c2, &b2));
  TT_OK(tide_kvcache_seq_set_length(c2, b2, 300));
  int kinds[5][3] = {{1, 1, 1}, {0, 1, 1}, {0, 1, 0}, {0, 1, 1}, {0, 1, 0}};
  int64_t expect_rows[5][3] = {{300, 300, 300}, {0, 75, 2}, {0, 75, 0}, {0, 4, 44}, {0, 4, 0}};
  for (int k = 0; k < 5; k++)
    for (int L = 0; L < 3; L++) {
      if (!kinds[k][L]) continue;
      int64_t f, rows, rb;
      TT_OK(tide_kvcache_seq_extent(c1, a, L, k, &f, &rows, &rb));
      TT_CHECK(rows == expect_rows[k][L], "kind %d layer %d rows %lld", k, L, (long long)rows);
      tide_tensor t = {0}, u = {0};
      int64_t sh[2] = {rows, rb};
      TT_OK(tide_tensor_new(&t, TIDE_U8, 2, sh));
      TT_OK(tide_tensor_new(&u, TIDE_U8, 2, sh));
      for (int64_t i = 0; i < rows * rb; i++) ((uint8_t *)t.data)[i] = (uint8_t)(i * 7 + k + L);
      TT_OK(tide_kvcache_seq_write(c1, a, L, k, &t));
      TT_OK(tide_kvcache_seq_read(c1, a, L, k, &u));
      TT_CHECK(!memcmp(t.data, u.data, (size_t)(rows * rb)), "round trip kind %d layer %d", k, L);
      TT_OK(tide_kvcache_seq_write(c2, b2, L, k, &u));
      memset(t.data, 0, (size_t)(rows * rb));
      TT_OK(tide_kvcache_seq_read(c2, b2, L, k, &t));
      TT_CHECK(!memcmp(t.data, u.data, (size_t)(rows * rb)), "import kind %d layer %d", k, L);
      tide_tensor_release(&t);
      tide_tensor_release(&u);
    }
  tide_tensor bad = {0};
  int64_t sh[2] = {3, 584};
  TT_OK(tide_tensor_new(&bad, TIDE_U8, 2, sh));
  TT_FAILS(tide_kvcache_seq_read(c1, a, 0, TIDE_KV_SWA, &bad), TIDE_E_INVALID, "expected contiguous [300, 584]");
  TT_FAILS(tide_kvcache_seq_set_length(c1, a, 10), TIDE_E_STATE, "must be empty");
  tide_tensor_release(&bad);
  tide_kvcache_free(c1);
  tide_kvcache_free(c2);
}

/* roll-back within the last step: a window block the commit released comes
 * back (from the free list) with its bytes, blocks past the new length return
 * to the pool; refusals change nothing (the numerics with compressor rings
 * are in tests/lua/truncate_spec.lua) */
static void test_truncate(void) {
  int32_t r[1] = {0};
  tide_kvcache *c = mkcache(1, r, 8, 0, 2, 0);
  int32_t a, b2;
  TT_OK(tide_kvcache_seq_new(c, &a));
  TT_OK(tide_kvcache_seq_new(c, &b2));
  tide_batch *b;
  TT_OK(tide_batch_new(&b, 64));
  TT_OK(step(c, b, a, 64));
  TT_OK(step(c, b, a, 64));
  TT_OK(step(c, b, a, 62));
  int64_t f, rows, rb;
  TT_OK(tide_kvcache_seq_extent(c, a, 0, TIDE_KV_SWA, &f, &rows, &rb));
  TT_CHECK(f == 0 && rows == 190, "extent %lld + %lld", (long long)f, (long long)rows);
  tide_tensor pat = {0}, got = {0};
  int64_t sh[2] = {rows, rb};
  TT_OK(tide_tensor_new(&pat, TIDE_U8, 2, sh));
  TT_OK(tide_tensor_new(&got, TIDE_U8, 2, sh));
  for (int64_t i = 0; i < rows * rb; i++) ((uint8_t *)pat.data)[i] = (uint8_t)(i * 13 + 5);
  TT_OK(tide_kvcache_seq_write(c, a, 0, TIDE_KV_SWA, &pat));
  TT_FAILS(tide_kvcache_seq_truncate(c, a, 189), TIDE_E_STATE, "no roll-back record");
  tide_kvcache_stats s0, s1;
  TT_OK(tide_kvcache_stats_get(c, &s0));
  TT_OK(step(c, b, a, 10));   /* 190..199: the window's first block (0..63) is released */
  TT_OK(tide_kvcache_stats_get(c, &s1));
  TT_CHECK(s1.swa_free == s0.swa_free, "block 0 released, block 3 taken: %d -> %d", s0.swa_free, s1.swa_free);
  TT_FAILS(tide_kvcache_seq_truncate(c, a, 201), TIDE_E_RANGE, "outside 0..200");
  TT_FAILS(tide_kvcache_seq_truncate(c, a, 189), TIDE_E_STATE, "before its last step");
  TT_CHECK(tide_kvcache_seq_len(c, a) == 200, "a refusal changed the length");
  TT_OK(tide_kvcache_seq_truncate(c, a, 190));
  TT_CHECK(tide_kvcache_seq_len(c, a) == 190, "length after truncate");
  TT_OK(tide_kvcache_stats_get(c, &s1));
  int32_t used;
  TT_OK(tide_kvcache_seq_usage(c, a, &used, NULL));
  TT_CHECK(s1.swa_free == s0.swa_free && used == 3, "block 0 back, block 3 returned: %d -> %d free, %d held",
           s0.swa_free, s1.swa_free, used);
  TT_OK(tide_kvcache_seq_read(c, a, 0, TIDE_KV_SWA, &got));
  TT_CHECK(!memcmp(pat.data, got.data, (size_t)(rows * rb)), "the window's bytes after truncate");
  TT_OK(tide_kvcache_seq_truncate(c, a, 190));   /* to its own length: nothing to do */
  /* another sequence's step ends the record */
  TT_OK(step(c, b, a, 5));
  TT_OK(step(c, b, b2, 1));
  TT_FAILS(tide_kvcache_seq_truncate(c, a, 192), TIDE_E_STATE, "no roll-back record");
  TT_CHECK(tide_kvcache_seq_len(c, a) == 195, "a refusal changed the length");
  TT_FAILS(tide_kvcache_seq_truncate(c, 7, 0), TIDE_E_RANGE, "outside");
  tide_tensor_release(&pat);
  tide_tensor_release(&got);
  tide_batch_free(b);
  tide_kvcache_free(c);
}

TT_RUN(TT(test_config), TT(test_seqs_and_batches), TT(test_full_and_reuse), TT(test_recycle), TT(test_fork_cow),
       TT(test_export_import), TT(test_truncate))
