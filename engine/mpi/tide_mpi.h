/*
 * tide_mpi.h - expert parallelism over MPI (libtide_mpi.so, built when CMake
 * finds MPI; docs/scale-out.md). Rank 0 runs the whole network; the routed
 * experts of every MoE block are spread over the ranks by a placement, and
 * each MoE layer sends the (token, slot) rows to the ranks owning their
 * experts and gets the expert outputs back, then combines them per token in
 * slot order, so the result is bitwise the single-process one. The other
 * ranks are expert servers (tide_mpi_follow).
 *
 * lua/tide/mpi.lua declares the same functions to LuaJIT's FFI (a spec
 * checks the two agree). All functions run on the main thread (MPI is
 * initialised MPI_THREAD_FUNNELED). Returns follow tide.h: TIDE_OK or a
 * negative TIDE_E_* with tide_last_error() set. A communication failure or a
 * peer that does not answer within the timeout ends every rank
 * (MPI_Abort) after a message on stderr naming the rank.
 */
#ifndef TIDE_MPI_H
#define TIDE_MPI_H

#include <stdint.h>

#include "tide.h"

/* TIDE_MPI_CDEF_BEGIN */
typedef struct tide_mpi_stats {
  int64_t calls;          /* MoE layers run through tide_mpi_moe_forward */
  int64_t tokens;         /* token rows over those calls */
  int64_t rows_local;     /* (token, slot) rows computed on rank 0 */
  int64_t rows_remote;    /* rows sent to another rank */
  int64_t bytes_sent;     /* every byte rank 0 sent in MoE messages */
  int64_t bytes_recv;     /* every byte rank 0 received in MoE results */
  int64_t bytes_rows;     /* of those, hidden-row payload only (both ways) */
  double t_total;         /* seconds in tide_mpi_moe_forward */
  double t_local;         /* rank 0's own routed rows */
  double t_shared;        /* the shared expert (runs while the rows travel) */
  double t_wait;          /* waiting for the other ranks after that */
  double t_combine;       /* unpacking and the per-token sums */
} tide_mpi_stats;

/* MPI_Init_thread; rank and size out. Sets the timeout from
 * $TIDE_MPI_TIMEOUT (seconds, default 60). Idempotent. */
int tide_mpi_init(int32_t *rank, int32_t *size);
/* Rank 0: tell every follower to stop; then MPI_Finalize (every rank).
 * Also run at exit. Idempotent. */
int tide_mpi_finalize(void);
int tide_mpi_set_timeout(double seconds);

/* Both sides: block `block` of model `model` is m; owner[e] (E entries) is
 * the rank holding routed expert e (0 <= owner < size). On rank 0 the
 * pointer identifies the block in tide_mpi_moe_forward. Copies owner. */
int tide_mpi_register(tide_moe *m, int32_t model, int32_t block, const int32_t *owner, int32_t E);
/* Drop every block of `model` (rank 0 and followers). */
int tide_mpi_unregister(int32_t model);
/* Drop block m (before it is freed: a new block may get its address). */
void tide_mpi_forget(const tide_moe *m);

/* Rank 0: tide_moe_forward's contract for a registered block, with the
 * routed rows of remote experts computed by their owners. */
int tide_mpi_moe_forward(tide_moe *m, tide_tensor *out, const tide_tensor *x, const tide_tensor *ids,
                         const tide_tensor *weights, int flags);

/* Rank 0: send a control text to every follower. */
int tide_mpi_control(const char *text, int64_t n);
/* Rank 0: the reply of follower `from` to the last control text (waits
 * within the timeout); *text valid until the next call. */
int tide_mpi_reply_recv(int32_t from, const char **text, int64_t *n);
/* Follower: serve MoE rows until a control text arrives; *text valid until
 * the next call. */
int tide_mpi_follow(const char **text, int64_t *n);
/* Follower: answer the control text. */
int tide_mpi_reply(const char *text, int64_t n);

int tide_mpi_stats_get(tide_mpi_stats *out);
void tide_mpi_stats_reset(void);
/* Bytes of [p, p + n) mapped into this process's page tables (present in
 * /proc/self/pagemap): what this rank touched, not what the page cache
 * holds; -1 when pagemap cannot be read. */
int64_t tide_mpi_resident_bytes(const void *p, int64_t n);
/* TIDE_MPI_CDEF_END */

#endif /* TIDE_MPI_H */
