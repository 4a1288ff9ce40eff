/* gemm_dnnl.c - the only file that talks to oneDNN: an f32 matmul
 * y = x . w^T with a primitive cache keyed by shape and strides. Primitives
 * are created once per shape and executed many times, as oneDNN intends. */
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

#include "linear.h"

typedef struct {
  int64_t m, n, k, ldx, ldw, ldy;
  dnnl_primitive_t prim;
  dnnl_memory_desc_t xmd, wmd, ymd;
  uint64_t used;
} dnnl_entry;

enum { CACHE_SIZE = 64 };
static dnnl_entry cache[CACHE_SIZE];
static int ncache;
static uint64_t tick;
static dnnl_engine_t eng;
static dnnl_stream_t strm;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int dn_err(dnnl_status_t s, const char *what) {
  return TIDE_ERR(TIDE_E_INTERNAL, "oneDNN %s failed with status %d", what, (int)s);
}

static int ensure_engine(void) {
  if (eng) return TIDE_OK;
  dnnl_status_t s = dnnl_engine_create(&eng, dnnl_cpu, 0);
  if (s != dnnl_success) return dn_err(s, "engine_create");
  s = dnnl_stream_create(&strm, eng, dnnl_stream_default_flags);
  if (s != dnnl_success) return dn_err(s, "stream_create");
  return TIDE_OK;
}

static int make_entry(dnnl_entry *e) {
  dnnl_dims_t xd = {e->m, e->k}, xs = {e->ldx, 1};
  dnnl_dims_t wd = {e->k, e->n}, ws = {1, e->ldw};
  dnnl_dims_t yd = {e->m, e->n}, ys = {e->ldy, 1};
  dnnl_status_t s;
  if ((s = dnnl_memory_desc_init_by_strides(&e->xmd, 2, xd, dnnl_f32, xs)) != dnnl_success) return dn_err(s, "md x");
  if ((s = dnnl_memory_desc_init_by_strides(&e->wmd, 2, wd, dnnl_f32, ws)) != dnnl_success) return dn_err(s, "md w");
  if ((s = dnnl_memory_desc_init_by_strides(&e->ymd, 2, yd, dnnl_f32, ys)) != dnnl_success) return dn_err(s, "md y");
  dnnl_matmul_desc_t md;
  if ((s = dnnl_matmul_desc_init(&md, &e->xmd, &e->wmd, NULL, &e->ymd)) != dnnl_success) return dn_err(s, "matmul_desc");
  dnnl_primitive_desc_t pd;
  if ((s = dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL)) != dnnl_success) return dn_err(s, "primitive_desc");
  s = dnnl_primitive_create(&e->prim, pd);
  dnnl_primitive_desc_destroy(pd);
  if (s != dnnl_success) return dn_err(s, "primitive_create");
  return TIDE_OK;
}

int tide_dnnl_sgemm_nt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                       float *y, int64_t ldy) {
  if (m <= 0 || n <= 0) return TIDE_OK;
  pthread_mutex_lock(&mu);
  int rc = ensure_engine();
  dnnl_entry *e = NULL;
  if (rc == TIDE_OK) {
    for (int i = 0; i < ncache; i++) {
      dnnl_entry *c = &cache[i];
      if (c->m == m && c->n == n && c->k == k && c->ldx == ldx && c->ldw == ldw && c->ldy == ldy) {
        e = c;
        break;
      }
    }
    if (!e) {
      int slot = ncache < CACHE_SIZE ? ncache++ : 0;
      if (ncache == CACHE_SIZE && slot == 0) { /* evict the least recently used */
        for (int i = 1; i < CACHE_SIZE; i++)
          if (cache[i].used < cache[slot].used) slot = i;
        dnnl_primitive_destroy(cache[slot].prim);
      }
      dnnl_entry ne = {m, n, k, ldx, ldw, ldy, NULL, {0}, {0}, {0}, 0};
      rc = make_entry(&ne);
      if (rc == TIDE_OK) {
        cache[slot] = ne;
        e = &cache[slot];
      } else if (slot == ncache - 1 && ncache <= CACHE_SIZE) {
        ncache--;
      }
    }
    if (e) e->used = ++tick;
  }
  if (rc != TIDE_OK || !e) {
    pthread_mutex_unlock(&mu);
    return rc ? rc : TIDE_E_INTERNAL;
  }
  /* executed under the lock: oneDNN already uses every thread, and an
   * evicted primitive can then never be destroyed while it runs */
  dnnl_primitive_t prim = e->prim;
  dnnl_memory_desc_t xmd = e->xmd, wmd = e->wmd, ymd = e->ymd;

  dnnl_memory_t mx = NULL, mw = NULL, my = NULL;
  dnnl_status_t s;
  if ((s = dnnl_memory_create(&mx, &xmd, eng, (void *)x)) != dnnl_success ||
      (s = dnnl_memory_create(&mw, &wmd, eng, (void *)w)) != dnnl_success ||
      (s = dnnl_memory_create(&my, &ymd, eng, y)) != dnnl_success) {
    rc = dn_err(s, "memory_create");
  } else {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, my}};
    s = dnnl_primitive_execute(prim, strm, 3, args);
    if (s == dnnl_success) s = dnnl_stream_wait(strm);
    if (s != dnnl_success) rc = dn_err(s, "execute");
  }
  dnnl_memory_destroy(mx);
  dnnl_memory_destroy(mw);
  dnnl_memory_destroy(my);
  pthread_mutex_unlock(&mu);
  return rc;
}
