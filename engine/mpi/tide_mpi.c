/* tide_mpi.c - expert parallelism over MPI (tide_mpi.h, docs/scale-out.md).
 *
 * Messages (all MPI_BYTE on MPI_COMM_WORLD, rank 0 <-> one follower):
 *   TAG_CMD   rank 0 -> follower: a MoE request (header, expert ids, rows) or
 *             a control text (header, text) or STOP (header only)
 *   TAG_RES   follower -> rank 0: the expert outputs of a MoE request, in
 *             the order of its rows (or an error text)
 *   TAG_REPLY follower -> rank 0: the answer to a control text
 * Hidden rows travel as bf16 when every value of the message is exactly a
 * bf16 number (the MoE input and the expert outputs are rounded to bf16 by
 * the model), else as f32: lossless either way.
 *
 * Waiting: every wait polls with a deadline (tide_mpi_set_timeout); a peer
 * that does not answer in time, or an MPI error (MPI_ERRORS_RETURN), ends
 * every rank with MPI_Abort after a message naming the rank. A follower
 * waiting for its next request has no deadline (rank 0 may be idle: a REPL);
 * if rank 0 dies, mpirun ends the job. */
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tide_mpi.h"
#include "tide_internal.h"

enum { TAG_CMD = 101, TAG_RES = 102, TAG_REPLY = 103 };
enum { CMD_MOE = 1, CMD_CTRL = 2, CMD_STOP = 3, CMD_RES = 4 };
enum { FMT_F32 = 0, FMT_BF16 = 1 };
enum { MAX_K = 64 };

typedef struct {
  int32_t cmd, model, block, fmt; /* fmt: rows; or status (< 0: error text follows) in CMD_RES */
  int64_t n;                      /* rows, or text bytes */
  int64_t d;                      /* floats per row */
} msg_hdr;

typedef struct {
  tide_moe *m;
  int32_t model, block, E;
  int32_t *owner;
} ep_block;

static struct {
  int inited, finalized;
  int rank, size;
  double timeout;
  ep_block *blocks;
  int n_blocks, cap_blocks;
  /* rank 0, per call; grown only */
  int64_t *cnt;     /* [size] rows per rank */
  int64_t *off;     /* [size + 1] first row per rank in the packed order */
  int64_t *slot;    /* [T * k] packed row of (t, i) */
  int64_t cap_slot;
  uint8_t *sbuf, *rbuf;
  size_t cap_sbuf, cap_rbuf;
  float *rows;      /* [R, d]: inputs packed by rank, then the outputs */
  float *lout;      /* [local rows, d] */
  float *sy;        /* [T, d] shared expert */
  int32_t *lid;     /* [local rows] their experts */
  size_t cap_lid;
  int64_t cap_rows, cap_lout, cap_sy;
  MPI_Request *req;
  int *req_peer;
  /* follower */
  uint8_t *fbuf;
  size_t cap_fbuf;
  char *text;
  int64_t cap_text;
  tide_mpi_stats st;
} G;

static double now(void) { return MPI_Wtime(); }

static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "tide: MPI rank %d of %d: %s; ending the run on every rank\n", G.rank, G.size, msg);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  _exit(3);
}

static const char *mpi_err(int rc) {
  static char s[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
  else s[len] = 0;
  return s;
}

#define MPI_OR_DIE(call, peer, what)                                                                    \
  do {                                                                                                  \
    int mrc_ = (call);                                                                                  \
    if (mrc_ != MPI_SUCCESS) fatal("%s with rank %d failed: %s", (what), (int)(peer), mpi_err(mrc_)); \
  } while (0)

/* Sleep a little once a wait has spun for a while: on an oversubscribed
 * machine the ranks we wait for need the core. */
static void backoff(int64_t spins) {
  if (spins < 64) return;
  if (spins < 2048) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, spins < 20000 ? 20000 : 200000};
  nanosleep(&ts, NULL);
}

/* Wait for n requests (peer[i] names the rank of each) within the timeout. */
static void wait_all(MPI_Request *req, const int *peer, int n, const char *what) {
  double t0 = now();
  for (int64_t spins = 0;; spins++) {
    int pending = 0;
    for (int i = 0; i < n; i++) {
      if (req[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_OR_DIE(MPI_Test(&req[i], &flag, MPI_STATUS_IGNORE), peer[i], what);
      if (!flag) pending++;
    }
    if (!pending) return;
    if (now() - t0 > G.timeout) {
      char who[256];
      int len = 0;
      who[0] = 0;
      for (int i = 0; i < n && len < 200; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= req[j] != MPI_REQUEST_NULL && peer[j] == peer[i];
        if (req[i] != MPI_REQUEST_NULL && !dup)
          len += snprintf(who + len, sizeof who - (size_t)len, "%s%d", len ? ", " : "", peer[i]);
      }
      fatal("%s: no answer from rank %s within %g s (TIDE_MPI_TIMEOUT)", what, who, G.timeout);
    }
    backoff(spins);
  }
}

static int grow(void **p, size_t *cap, size_t need) {
  if (need <= *cap) return TIDE_OK;
  size_t c = *cap ? *cap : 4096;
  while (c < need) c *= 2;
  void *q = tide_xmalloc(c);
  if (!q) return TIDE_ERR(TIDE_E_NOMEM, "no memory for %zu bytes of MPI buffers", c);
  tide_xfree(*p);
  *p = q;
  *cap = c;
  return TIDE_OK;
}

static int growf(float **p, int64_t *cap, int64_t need) {
  size_t c = (size_t)*cap * sizeof(float);
  int rc = grow((void **)p, &c, (size_t)need * sizeof(float));
  *cap = (int64_t)(c / sizeof(float));
  return rc;
}

/* ---- bf16 packing (lossless only: checked first) ---- */
static int all_bf16(const float *x, int64_t n) {
  const uint32_t *u = (const uint32_t *)x;
  uint32_t acc = 0;
  for (int64_t i = 0; i < n; i++) acc |= u[i];
  return (acc & 0xFFFFu) == 0;
}

static void put_bf16(uint8_t *dst, const float *x, int64_t n) {
  const uint32_t *u = (const uint32_t *)x;
  uint16_t *o = (uint16_t *)dst;
  for (int64_t i = 0; i < n; i++) o[i] = (uint16_t)(u[i] >> 16);
}

static void get_rows(float *dst, const uint8_t *src, int64_t n, int fmt) {
  if (fmt == FMT_F32) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    return;
  }
  const uint16_t *h = (const uint16_t *)src;
  uint32_t *o = (uint32_t *)dst;
  for (int64_t i = 0; i < n; i++) o[i] = (uint32_t)h[i] << 16;
}

static size_t row_bytes(int fmt) { return fmt == FMT_BF16 ? 2 : 4; }

/* ---- set-up ---- */
static void at_exit(void) { tide_mpi_finalize(); }

int tide_mpi_init(int32_t *rank, int32_t *size) {
  if (!G.inited) {
    int have = 0;
    MPI_Initialized(&have);
    if (!have) {
      int provided = 0;
      int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
      if (rc != MPI_SUCCESS) return TIDE_ERR(TIDE_E_IO, "MPI_Init_thread failed: %s", mpi_err(rc));
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &G.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &G.size);
    G.timeout = 60;
    const char *t = getenv("TIDE_MPI_TIMEOUT");
    if (t && *t) {
      char *end = NULL;
      double v = strtod(t, &end);
      if (end == t || *end || !(v > 0))
        return TIDE_ERR(TIDE_E_INVALID, "TIDE_MPI_TIMEOUT='%s': expected a number of seconds > 0", t);
      G.timeout = v;
    }
    G.cnt = tide_xcalloc((size_t)G.size, sizeof *G.cnt);
    G.off = tide_xcalloc((size_t)G.size + 1, sizeof *G.off);
    G.req = tide_xcalloc((size_t)G.size * 2, sizeof *G.req);
    G.req_peer = tide_xcalloc((size_t)G.size * 2, sizeof *G.req_peer);
    if (!G.cnt || !G.off || !G.req || !G.req_peer) return TIDE_E_NOMEM;
    G.inited = 1;
    atexit(at_exit);
  }
  if (rank) *rank = G.rank;
  if (size) *size = G.size;
  return TIDE_OK;
}

int tide_mpi_set_timeout(double seconds) {
  if (!(seconds > 0)) return TIDE_ERR(TIDE_E_INVALID, "timeout %g must be > 0", seconds);
  G.timeout = seconds;
  return TIDE_OK;
}

int tide_mpi_finalize(void) {
  if (!G.inited || G.finalized) return TIDE_OK;
  G.finalized = 1;
  const char *rep = getenv("TIDE_MPI_STATS");
  if (G.rank == 0 && rep && *rep && strcmp(rep, "0") && G.st.calls > 0) {
    const tide_mpi_stats *s = &G.st;
    fprintf(stderr,
            "tide mpi: %lld MoE layer calls, %lld token rows; (token, slot) rows %lld on rank 0, %lld sent;"
            " %.0f hidden-row bytes per token per layer; exchange %.3f s: own rows %.3f, shared expert %.3f,"
            " waiting %.3f, combine %.3f\n",
            (long long)s->calls, (long long)s->tokens, (long long)s->rows_local, (long long)s->rows_remote,
            (double)s->bytes_rows / (double)s->tokens, s->t_total, s->t_local, s->t_shared, s->t_wait, s->t_combine);
  }
  if (G.rank == 0) {
    msg_hdr h = {CMD_STOP, 0, 0, 0, 0, 0};
    for (int r = 1; r < G.size; r++) {
      G.req[r - 1] = MPI_REQUEST_NULL;
      G.req_peer[r - 1] = r;
      MPI_OR_DIE(MPI_Isend(&h, (int)sizeof h, MPI_BYTE, r, TAG_CMD, MPI_COMM_WORLD, &G.req[r - 1]), r, "stop");
    }
    if (G.size > 1) wait_all(G.req, G.req_peer, G.size - 1, "stop");
  }
  MPI_Finalize();
  return TIDE_OK;
}

static int need_init(const char *fn) {
  if (!G.inited || G.finalized) return tide_errorf(TIDE_E_STATE, fn, "MPI is not initialised (or already finalised)");
  return TIDE_OK;
}

int tide_mpi_register(tide_moe *m, int32_t model, int32_t block, const int32_t *owner, int32_t E) {
  TIDE_CHECK(need_init(__func__));
  if (!m || !owner || E < 1) return TIDE_ERR(TIDE_E_INVALID, "NULL block or owner, or E = %d", E);
  int32_t bE = 0;
  TIDE_CHECK(tide_moe_info(m, &bE, NULL, NULL, NULL, NULL));
  if (bE != E) return TIDE_ERR(TIDE_E_INVALID, "owner has %d entries, the block %d experts", E, bE);
  for (int32_t e = 0; e < E; e++)
    if (owner[e] < 0 || owner[e] >= G.size)
      return TIDE_ERR(TIDE_E_RANGE, "block %d: expert %d placed on rank %d, outside 0..%d", block, e, owner[e], G.size - 1);
  for (int i = 0; i < G.n_blocks; i++)
    if (G.blocks[i].m == m || (G.blocks[i].model == model && G.blocks[i].block == block))
      return TIDE_ERR(TIDE_E_INVALID, "block %d of model %d is already registered", block, model);
  if (G.n_blocks == G.cap_blocks) {
    int c = G.cap_blocks ? 2 * G.cap_blocks : 64;
    ep_block *b = tide_xrealloc(G.blocks, (size_t)c * sizeof *b);
    if (!b) return TIDE_E_NOMEM;
    G.blocks = b;
    G.cap_blocks = c;
  }
  int32_t *o = tide_xmalloc((size_t)E * sizeof *o);
  if (!o) return TIDE_E_NOMEM;
  memcpy(o, owner, (size_t)E * sizeof *o);
  G.blocks[G.n_blocks++] = (ep_block){m, model, block, E, o};
  return TIDE_OK;
}

int tide_mpi_unregister(int32_t model) {
  int j = 0;
  for (int i = 0; i < G.n_blocks; i++) {
    if (G.blocks[i].model == model) tide_xfree(G.blocks[i].owner);
    else G.blocks[j++] = G.blocks[i];
  }
  G.n_blocks = j;
  return TIDE_OK;
}

void tide_mpi_forget(const tide_moe *m) {
  int j = 0;
  for (int i = 0; i < G.n_blocks; i++) {
    if (G.blocks[i].m == m) tide_xfree(G.blocks[i].owner);
    else G.blocks[j++] = G.blocks[i];
  }
  G.n_blocks = j;
}

static ep_block *find_ptr(const tide_moe *m) {
  for (int i = 0; i < G.n_blocks; i++)
    if (G.blocks[i].m == m) return &G.blocks[i];
  return NULL;
}

static ep_block *find_id(int32_t model, int32_t block) {
  for (int i = 0; i < G.n_blocks; i++)
    if (G.blocks[i].model == model && G.blocks[i].block == block) return &G.blocks[i];
  return NULL;
}

/* ---- rank 0: one MoE layer ---- */
int tide_mpi_moe_forward(tide_moe *m, tide_tensor *out, const tide_tensor *x, const tide_tensor *ids,
                         const tide_tensor *weights, int flags) {
  double t0 = now();
  TIDE_CHECK(need_init(__func__));
  if (G.rank != 0) return TIDE_ERR(TIDE_E_STATE, "rank %d: only rank 0 runs the network", G.rank);
  ep_block *b = find_ptr(m);
  if (!b) return TIDE_ERR(TIDE_E_STATE, "this MoE block is not registered for expert parallelism");
  int64_t d = 0, sinter = 0;
  TIDE_CHECK(tide_moe_info(m, NULL, &d, NULL, &sinter, NULL));
  TIDE_CHECK(tide_check_tensor(__func__, "x", x, TIDE_DT(TIDE_F32), 2));
  TIDE_CHECK(tide_check_tensor(__func__, "out", out, TIDE_DT(TIDE_F32), 2));
  TIDE_CHECK(tide_check_tensor(__func__, "ids", ids, TIDE_DT(TIDE_I32), 2));
  TIDE_CHECK(tide_check_tensor(__func__, "weights", weights, TIDE_DT(TIDE_F32), 2));
  int64_t T = x->sizes[0], k = ids->sizes[1];
  if (x->sizes[1] != d || x->strides[1] != 1 || out->sizes[1] != d || out->strides[1] != 1 || out->sizes[0] != T ||
      (T > 1 && (x->strides[0] < d || out->strides[0] < d)))
    return TIDE_ERR(TIDE_E_INVALID, "x and out must be [T, %lld] with contiguous rows, T alike", (long long)d);
  if (out->readonly) return TIDE_ERR(TIDE_E_INVALID, "out is read-only");
  if (ids->sizes[0] != T || !tide_tensor_is_contiguous(ids) || weights->sizes[0] != T || weights->sizes[1] != k ||
      !tide_tensor_is_contiguous(weights))
    return TIDE_ERR(TIDE_E_INVALID, "ids and weights must be [%lld, k] contiguous", (long long)T);
  if (k < 1 || k > MAX_K) return TIDE_ERR(TIDE_E_UNSUPPORTED, "k = %lld, supported 1..%d", (long long)k, MAX_K);
  const int32_t *id = ids->data;
  const float *wt = weights->data;
  int64_t R = T * k, ldx = T > 1 ? x->strides[0] : d, ldo = T > 1 ? out->strides[0] : d;
  for (int64_t r = 0; r < R; r++)
    if (id[r] < 0 || id[r] >= b->E)
      return TIDE_ERR(TIDE_E_RANGE, "token %lld slot %lld selects expert %d, outside 0..%d", (long long)(r / k),
                      (long long)(r % k), id[r], b->E - 1);
  if (T == 0) return TIDE_OK;
  const float *xp = x->data;
  float *op = out->data;
  int S = G.size;

  /* 1. pack the rows by owner rank, (t, i) order within a rank */
  memset(G.cnt, 0, (size_t)S * sizeof *G.cnt);
  for (int64_t r = 0; r < R; r++) G.cnt[b->owner[id[r]]]++;
  G.off[0] = 0;
  for (int s = 0; s < S; s++) G.off[s + 1] = G.off[s] + G.cnt[s];
  if (R > G.cap_slot) {
    int64_t *q = tide_xmalloc((size_t)R * sizeof *q);
    if (!q) return TIDE_E_NOMEM;
    tide_xfree(G.slot);
    G.slot = q;
    G.cap_slot = R;
  }
  TIDE_CHECK(growf(&G.rows, &G.cap_rows, R * d));
  /* every buffer is grown before the first send: a send reads sbuf until
   * its wait, so nothing below reallocates */
  if (G.cnt[0]) {
    TIDE_CHECK(growf(&G.lout, &G.cap_lout, G.cnt[0] * d));
    TIDE_CHECK(grow((void **)&G.lid, &G.cap_lid, (size_t)G.cnt[0] * sizeof(int32_t)));
  }
  if (sinter > 0) TIDE_CHECK(growf(&G.sy, &G.cap_sy, T * d));
  {
    int64_t fill[S > 0 ? S : 1];
    for (int s = 0; s < S; s++) fill[s] = G.off[s];
    for (int64_t r = 0; r < R; r++) {
      int64_t p = fill[b->owner[id[r]]]++;
      G.slot[r] = p;
      memcpy(G.rows + p * d, xp + (r / k) * ldx, (size_t)d * sizeof(float));
    }
  }
  int64_t remote = R - G.cnt[0];
  int fmt = all_bf16(G.rows + G.off[1] * d, remote * d) ? FMT_BF16 : FMT_F32;
  size_t hb = sizeof(msg_hdr);
  /* send buffer: per remote rank header + ids + rows; receive buffer:
   * header + rows as f32 at most (or an error text that fits there) */
  size_t sneed = 0, rneed = 0;
  for (int s = 1; s < S; s++)
    if (G.cnt[s]) {
      sneed += hb + (size_t)G.cnt[s] * (sizeof(int32_t) + (size_t)d * row_bytes(fmt));
      rneed += hb + (size_t)G.cnt[s] * (size_t)d * sizeof(float) + 1024;
      if (hb + (size_t)G.cnt[s] * (size_t)d * sizeof(float) + 1024 > (size_t)INT32_MAX)
        return TIDE_ERR(TIDE_E_UNSUPPORTED, "%lld rows for rank %d make a message above 2 GB: run smaller steps",
                        (long long)G.cnt[s], s);
    }
  TIDE_CHECK(grow((void **)&G.sbuf, &G.cap_sbuf, sneed + 1));
  TIDE_CHECK(grow((void **)&G.rbuf, &G.cap_rbuf, rneed + 1));
  int nreq = 0;
  size_t so = 0, ro = 0;
  size_t rpos[S > 0 ? S : 1];
  int64_t sent = 0;
  for (int s = 1; s < S; s++) {
    if (!G.cnt[s]) continue;
    int64_t n = G.cnt[s];
    size_t rsz = hb + (size_t)n * (size_t)d * sizeof(float) + 1024;
    rpos[s] = ro;
    G.req_peer[nreq] = s;
    MPI_OR_DIE(MPI_Irecv(G.rbuf + ro, (int)rsz, MPI_BYTE, s, TAG_RES, MPI_COMM_WORLD, &G.req[nreq]), s, "MoE receive");
    nreq++;
    ro += rsz;
    uint8_t *p = G.sbuf + so;
    msg_hdr h = {CMD_MOE, b->model, b->block, fmt, n, d};
    memcpy(p, &h, hb);
    int32_t *pid = (int32_t *)(p + hb);
    for (int64_t r = 0, j = 0; r < R; r++)
      if (b->owner[id[r]] == s) pid[j++] = id[r];
    uint8_t *pr = p + hb + (size_t)n * sizeof(int32_t);
    const float *src = G.rows + G.off[s] * d;
    if (fmt == FMT_BF16) put_bf16(pr, src, n * d);
    else memcpy(pr, src, (size_t)(n * d) * sizeof(float));
    size_t ssz = hb + (size_t)n * (sizeof(int32_t) + (size_t)d * row_bytes(fmt));
    G.req_peer[nreq] = s;
    MPI_OR_DIE(MPI_Isend(p, (int)ssz, MPI_BYTE, s, TAG_CMD, MPI_COMM_WORLD, &G.req[nreq]), s, "MoE send");
    nreq++;
    so += ssz;
    sent += (int64_t)ssz;
    G.st.bytes_rows += n * d * (int64_t)row_bytes(fmt);
  }
  double t1 = now();

  /* 2. while the rows travel: rank 0's own rows, then the shared expert */
  int64_t nl = G.cnt[0];
  if (nl) {
    int32_t *lid = G.lid;
    for (int64_t r = 0, j = 0; r < R; r++)
      if (b->owner[id[r]] == 0) lid[j++] = id[r];
    int rc = tide_moe_rows(m, G.lout, G.rows, lid, nl);
    if (rc < 0) {
      wait_all(G.req, G.req_peer, nreq, "MoE exchange");
      return rc;
    }
    memcpy(G.rows, G.lout, (size_t)(nl * d) * sizeof(float));
  }
  double t2 = now();
  const float *sy = NULL;
  if (sinter > 0) {
    int rc = tide_moe_shared_rows(m, G.sy, xp, ldx, T);
    if (rc < 0) {
      wait_all(G.req, G.req_peer, nreq, "MoE exchange");
      return rc;
    }
    sy = G.sy;
  }
  double t3 = now();

  /* 3. the other ranks' outputs */
  wait_all(G.req, G.req_peer, nreq, "MoE exchange");
  double t4 = now();
  int64_t recvd = 0;
  for (int s = 1; s < S; s++) {
    if (!G.cnt[s]) continue;
    const uint8_t *p = G.rbuf + rpos[s];
    msg_hdr h;
    memcpy(&h, p, hb);
    if (h.cmd != CMD_RES) fatal("rank %d answered a MoE request with message kind %d", s, h.cmd);
    if (h.fmt < 0) {
      int64_t len = h.n < 900 ? h.n : 900;
      return TIDE_ERR(TIDE_E_STATE, "rank %d: %.*s", s, (int)len, (const char *)(p + hb));
    }
    if (h.n != G.cnt[s] || h.d != d)
      fatal("rank %d answered %lld rows of %lld, expected %lld of %lld", s, (long long)h.n, (long long)h.d,
            (long long)G.cnt[s], (long long)d);
    get_rows(G.rows + G.off[s] * d, p + hb, h.n * d, h.fmt);
    recvd += (int64_t)hb + h.n * d * (int64_t)row_bytes(h.fmt);
    G.st.bytes_rows += h.n * d * (int64_t)row_bytes(h.fmt);
  }
  /* 4. per token, in slot order, then the shared expert */
  for (int64_t t = 0; t < T; t++) {
    const float *ys[MAX_K];
    for (int64_t i = 0; i < k; i++) ys[i] = G.rows + G.slot[t * k + i] * d;
    tide_moe_combine_rows(op + t * ldo, ys, wt + t * k, (int)k, sy ? sy + t * d : NULL, d, flags);
  }
  double t5 = now();
  G.st.calls++;
  G.st.tokens += T;
  G.st.rows_local += nl;
  G.st.rows_remote += remote;
  G.st.bytes_sent += sent;
  G.st.bytes_recv += recvd;
  G.st.t_local += t2 - t1;
  G.st.t_shared += t3 - t2;
  G.st.t_wait += t4 - t3;
  G.st.t_combine += t5 - t4;
  G.st.t_total += t5 - t0;
  return TIDE_OK;
}

int tide_mpi_stats_get(tide_mpi_stats *out) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = G.st;
  return TIDE_OK;
}

void tide_mpi_stats_reset(void) { memset(&G.st, 0, sizeof G.st); }

/* ---- control texts ---- */
int tide_mpi_control(const char *text, int64_t n) {
  TIDE_CHECK(need_init(__func__));
  if (G.rank != 0) return TIDE_ERR(TIDE_E_STATE, "rank %d: only rank 0 sends control texts", G.rank);
  if (!text || n < 0 || n > (1 << 30)) return TIDE_ERR(TIDE_E_INVALID, "bad text");
  size_t sz = sizeof(msg_hdr) + (size_t)n;
  TIDE_CHECK(grow((void **)&G.sbuf, &G.cap_sbuf, sz));
  msg_hdr h = {CMD_CTRL, 0, 0, 0, n, 0};
  memcpy(G.sbuf, &h, sizeof h);
  memcpy(G.sbuf + sizeof h, text, (size_t)n);
  int nreq = 0;
  for (int r = 1; r < G.size; r++) {
    G.req_peer[nreq] = r;
    MPI_OR_DIE(MPI_Isend(G.sbuf, (int)sz, MPI_BYTE, r, TAG_CMD, MPI_COMM_WORLD, &G.req[nreq]), r, "control send");
    nreq++;
  }
  wait_all(G.req, G.req_peer, nreq, "control send");
  return TIDE_OK;
}

/* Receive one message of unknown size from `from` with `tag` into G.fbuf
 * (deadline: the timeout when `deadline`, else none). Returns its size. */
static int64_t recv_any(int from, int tag, int deadline, const char *what) {
  double t0 = now();
  MPI_Status st;
  for (int64_t spins = 0;; spins++) {
    int flag = 0;
    MPI_OR_DIE(MPI_Iprobe(from, tag, MPI_COMM_WORLD, &flag, &st), from, what);
    if (flag) break;
    if (deadline && now() - t0 > G.timeout)
      fatal("%s: no answer from rank %d within %g s (TIDE_MPI_TIMEOUT)", what, from, G.timeout);
    backoff(spins);
  }
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  if (grow((void **)&G.fbuf, &G.cap_fbuf, (size_t)count + 1) < 0) fatal("no memory for a %d-byte message", count);
  MPI_OR_DIE(MPI_Recv(G.fbuf, count, MPI_BYTE, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), from, what);
  return count;
}

static int set_text(const uint8_t *p, int64_t n, const char **text, int64_t *len) {
  if (n + 1 > G.cap_text) {
    char *q = tide_xmalloc((size_t)n + 1);
    if (!q) return TIDE_E_NOMEM;
    tide_xfree(G.text);
    G.text = q;
    G.cap_text = n + 1;
  }
  memcpy(G.text, p, (size_t)n);
  G.text[n] = 0;
  *text = G.text;
  *len = n;
  return TIDE_OK;
}

int tide_mpi_reply_recv(int32_t from, const char **text, int64_t *n) {
  TIDE_CHECK(need_init(__func__));
  if (G.rank != 0 || from < 1 || from >= G.size || !text || !n)
    return TIDE_ERR(TIDE_E_INVALID, "rank %d cannot receive a reply from rank %d", G.rank, from);
  int64_t c = recv_any(from, TAG_REPLY, 1, "control reply");
  return set_text(G.fbuf, c, text, n);
}

int tide_mpi_reply(const char *text, int64_t n) {
  TIDE_CHECK(need_init(__func__));
  if (G.rank == 0 || !text || n < 0 || n > INT32_MAX) return TIDE_ERR(TIDE_E_INVALID, "bad reply");
  MPI_Request rq = MPI_REQUEST_NULL;
  int peer = 0;
  MPI_OR_DIE(MPI_Isend(text, (int)n, MPI_BYTE, 0, TAG_REPLY, MPI_COMM_WORLD, &rq), 0, "control reply");
  wait_all(&rq, &peer, 1, "control reply");
  return TIDE_OK;
}

/* ---- followers ---- */
static void serve_moe(const msg_hdr *h, const uint8_t *body, int64_t bytes) {
  size_t hb = sizeof *h;
  char err[1024];
  int status = 0;
  int64_t n = h->n, d = h->d;
  ep_block *b = find_id(h->model, h->block);
  float *y = NULL;
  int fmt = FMT_F32;
  if (!b) {
    snprintf(err, sizeof err, "no block %d of model %d here", h->block, h->model);
    status = -1;
  } else if (n < 0 || d < 1 || (size_t)bytes != (size_t)n * (sizeof(int32_t) + (size_t)d * row_bytes(h->fmt))) {
    snprintf(err, sizeof err, "malformed MoE request (%lld rows of %lld, %lld bytes)", (long long)n, (long long)d,
             (long long)bytes);
    status = -1;
  } else {
    if (growf(&G.rows, &G.cap_rows, n * d) < 0 || growf(&G.lout, &G.cap_lout, n * d) < 0) fatal("no memory for %lld rows", (long long)n);
    const int32_t *ids = (const int32_t *)body;
    get_rows(G.rows, body + (size_t)n * sizeof(int32_t), n * d, h->fmt);
    if (tide_moe_rows(b->m, G.lout, G.rows, ids, n) < 0) {
      snprintf(err, sizeof err, "%s", tide_last_error());
      status = -1;
    } else {
      y = G.lout;
      fmt = all_bf16(y, n * d) ? FMT_BF16 : FMT_F32;
    }
  }
  size_t sz = status < 0 ? hb + strlen(err) : hb + (size_t)(n * d) * row_bytes(fmt);
  if (grow((void **)&G.sbuf, &G.cap_sbuf, sz + 1) < 0) fatal("no memory for a %zu-byte answer", sz);
  msg_hdr r = {CMD_RES, h->model, h->block, status < 0 ? -1 : fmt, status < 0 ? (int64_t)strlen(err) : n, d};
  memcpy(G.sbuf, &r, hb);
  if (status < 0) memcpy(G.sbuf + hb, err, strlen(err));
  else if (fmt == FMT_BF16) put_bf16(G.sbuf + hb, y, n * d);
  else memcpy(G.sbuf + hb, y, (size_t)(n * d) * sizeof(float));
  MPI_Request rq = MPI_REQUEST_NULL;
  int peer = 0;
  MPI_OR_DIE(MPI_Isend(G.sbuf, (int)sz, MPI_BYTE, 0, TAG_RES, MPI_COMM_WORLD, &rq), 0, "MoE answer");
  wait_all(&rq, &peer, 1, "MoE answer");
}

int tide_mpi_follow(const char **text, int64_t *n) {
  TIDE_CHECK(need_init(__func__));
  if (G.rank == 0 || !text || !n) return TIDE_ERR(TIDE_E_INVALID, "rank 0 does not follow");
  for (;;) {
    int64_t c = recv_any(0, TAG_CMD, 0, "waiting for rank 0");
    msg_hdr h;
    if (c < (int64_t)sizeof h) fatal("a %lld-byte message from rank 0 is shorter than a header", (long long)c);
    memcpy(&h, G.fbuf, sizeof h);
    const uint8_t *body = G.fbuf + sizeof h;
    int64_t bytes = c - (int64_t)sizeof h;
    if (h.cmd == CMD_MOE) {
      serve_moe(&h, body, bytes);
    } else if (h.cmd == CMD_CTRL) {
      if (h.n != bytes) fatal("control text of %lld bytes announced, %lld received", (long long)h.n, (long long)bytes);
      return set_text(body, bytes, text, n);
    } else if (h.cmd == CMD_STOP) {
      return set_text((const uint8_t *)"stop", 4, text, n);
    } else {
      fatal("unknown message kind %d from rank 0", h.cmd);
    }
  }
}

/* ---- residency ---- */
int64_t tide_mpi_resident_bytes(const void *p, int64_t n) {
  if (!p || n <= 0) return 0;
  long ps = sysconf(_SC_PAGESIZE);
  if (ps <= 0) return -1;
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  uintptr_t a = (uintptr_t)p, e = a + (uintptr_t)n;
  uintptr_t first = a / (uintptr_t)ps, last = (e - 1) / (uintptr_t)ps;
  int64_t bytes = 0;
  uint64_t buf[512];
  for (uintptr_t pg = first; pg <= last;) {
    size_t want = (size_t)(last - pg + 1);
    if (want > 512) want = 512;
    ssize_t got = pread(fd, buf, want * sizeof buf[0], (off_t)(pg * sizeof buf[0]));
    if (got <= 0) {
      close(fd);
      return -1;
    }
    size_t cnt = (size_t)got / sizeof buf[0];
    for (size_t i = 0; i < cnt; i++) {
      if (!(buf[i] >> 63 & 1)) continue;
      uintptr_t lo = (pg + i) * (uintptr_t)ps, hi = lo + (uintptr_t)ps;
      if (lo < a) lo = a;
      if (hi > e) hi = e;
      bytes += (int64_t)(hi - lo);
    }
    pg += cnt;
  }
  close(fd);
  return bytes;
}
