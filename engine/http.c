/* http.c - the HTTP layer of `tide serve` (tide/http.h) on libmicrohttpd.
 *
 * libmicrohttpd runs its own polling thread. Each request is one `hconn`
 * (libmicrohttpd's per-request closure): the body is collected up to
 * max_body, then the request is put on the event queue and its connection
 * suspended, so it costs nothing until the caller answers. An answer sets
 * the response fields under the lock and resumes the connection; the access
 * handler, called again by libmicrohttpd after the resume, queues the
 * response. A stream is a response whose content reader copies from the
 * connection's buffer and suspends the connection when the buffer is empty;
 * tide_http_send appends and resumes.
 *
 * Locking: one mutex per server guards every hconn field, the event queue
 * and the counters. libmicrohttpd's thread suspends connections while
 * holding it (inside its callbacks); the caller's thread resumes them only
 * after releasing it. A suspended connection cannot finish, so the pointer
 * used for the resume stays valid in between.
 *
 * Lifetime: an hconn is freed when libmicrohttpd has finished with the
 * request (mhd_done, reader_live == 0), the caller will not name it again
 * (lua_done), no queued event points at it and the last event handed out
 * does not borrow its strings (pinned). */
#include "tide_internal.h"
#include "tide.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { ST_READING, ST_QUEUED, ST_ANSWERED, ST_STREAM };

typedef struct hconn hconn;
typedef struct hevent {
  struct hevent *next;
  hconn *c;
  int kind;
  int queued;
} hevent;

struct hconn {
  hconn *prev, *next;          /* the server's list of live requests */
  tide_http *srv;
  uint64_t id;
  struct MHD_Connection *mc;   /* NULL once libmicrohttpd finished the request */
  int state;
  int suspended, aborted, too_big;
  int mhd_done, lua_done, pinned, reader_live;
  char *method, *path, *query, *headers, *peer;
  char *body;
  size_t body_len, body_cap;
  int status;                  /* the answer */
  char *resp_headers, *resp_body;
  size_t resp_len;
  char *buf;                   /* stream bytes not yet read by libmicrohttpd: buf[off..len) */
  size_t buf_off, buf_len, buf_cap;
  int ended;
  hevent ev_req, ev_closed;
};

struct tide_http {
  struct MHD_Daemon *d;
  pthread_mutex_t mu;
  hconn *conns;
  hevent *q_head, *q_tail;
  uint64_t next_id;
  int wake[2];
  int port;
  size_t max_body, max_buffer;
  int listen_fd;               /* from quiesce, closed after the daemon stops */
  hconn *pinned;
  tide_http_stats st;
  char *body_413;
};

/* ------------------------------------------------------------------ helpers */

static char *dupn(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (!p) return NULL;
  if (n) memcpy(p, s, n);
  p[n] = 0;
  return p;
}
static char *dup0(const char *s) { return dupn(s ? s : "", s ? strlen(s) : 0); }

typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;
static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return; }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void wake(tide_http *s) {
  char x = 1;
  ssize_t r = write(s->wake[1], &x, 1);
  (void)r;   /* a full pipe already wakes the reader */
}

static void push_event(tide_http *s, hevent *e) {
  if (e->queued) return;
  e->queued = 1;
  e->next = NULL;
  if (s->q_tail) s->q_tail->next = e; else s->q_head = e;
  s->q_tail = e;
}

static void conn_free(hconn *c) {
  free(c->method); free(c->path); free(c->query); free(c->headers); free(c->peer);
  free(c->body); free(c->resp_headers); free(c->resp_body); free(c->buf);
  free(c);
}

/* under the lock */
static void maybe_free(tide_http *s, hconn *c) {
  if (!c->mhd_done || !c->lua_done || c->pinned || c->reader_live || c->ev_req.queued || c->ev_closed.queued) return;
  if (c->prev) c->prev->next = c->next; else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->st.open--;
  conn_free(c);
}

/* under the lock */
static hconn *find(tide_http *s, uint64_t id) {
  for (hconn *c = s->conns; c; c = c->next)
    if (c->id == id) return c;
  return NULL;
}

/* Give the connection back to libmicrohttpd's loop: call after unlocking. */
static void resume(struct MHD_Connection *mc) {
  if (mc) MHD_resume_connection(mc);
}

/* under the lock: mark c resumable, return the connection to resume */
static struct MHD_Connection *unsuspend(hconn *c) {
  if (!c->suspended) return NULL;
  c->suspended = 0;
  return c->mc;
}

/* ------------------------------------------------------------------ libmicrohttpd callbacks */

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  sbuf *b = cls;
  size_t n = strlen(key);
  for (size_t i = 0; i < n; i++) {
    char ch = (char)tolower((unsigned char)key[i]);
    sb_add(b, &ch, 1);
  }
  sb_add(b, ": ", 2);
  if (value) sb_add(b, value, strlen(value));
  sb_add(b, "\n", 1);
  return MHD_YES;
}

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  sbuf *b = cls;
  if (b->n) sb_add(b, "&", 1);
  sb_add(b, key, strlen(key));
  if (value) { sb_add(b, "=", 1); sb_add(b, value, strlen(value)); }
  return MHD_YES;
}

static void add_headers(struct MHD_Response *r, const char *h) {
  /* "Name: value\r\n" lines */
  while (h && *h) {
    const char *eol = strpbrk(h, "\r\n");
    size_t len = eol ? (size_t)(eol - h) : strlen(h);
    const char *colon = memchr(h, ':', len);
    if (colon && colon > h) {
      char name[128], value[1024];
      size_t nl = (size_t)(colon - h), vs = (size_t)(colon + 1 - h);
      while (vs < len && h[vs] == ' ') vs++;
      size_t vl = len - vs;
      if (nl < sizeof name && vl < sizeof value) {
        memcpy(name, h, nl); name[nl] = 0;
        memcpy(value, h + vs, vl); value[vl] = 0;
        MHD_add_response_header(r, name, value);
      }
    }
    h += len;
    while (*h == '\r' || *h == '\n') h++;
  }
}

static enum MHD_Result reply_413(tide_http *s, struct MHD_Connection *mc) {
  const char *body = s->body_413 ? s->body_413 : "request body too large\n";
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", s->body_413 ? "application/json" : "text/plain");
  MHD_add_response_header(r, "Connection", "close");
  enum MHD_Result ok = MHD_queue_response(mc, MHD_HTTP_CONTENT_TOO_LARGE, r);
  MHD_destroy_response(r);
  return ok;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
  hconn *c = cls;
  tide_http *s = c->srv;
  ssize_t ret;
  pthread_mutex_lock(&s->mu);
  size_t avail = c->buf_len - c->buf_off;
  if (c->aborted) {
    ret = MHD_CONTENT_READER_END_WITH_ERROR;
  } else if (avail) {
    size_t n = avail < max ? avail : max;
    memcpy(out, c->buf + c->buf_off, n);
    c->buf_off += n;
    if (c->buf_off == c->buf_len) c->buf_off = c->buf_len = 0;
    s->st.bytes_sent += (int64_t)n;
    ret = (ssize_t)n;
  } else if (c->ended) {
    ret = MHD_CONTENT_READER_END_OF_STREAM;
  } else {
    c->suspended = 1;
    MHD_suspend_connection(c->mc);
    ret = 0;
  }
  pthread_mutex_unlock(&s->mu);
  return ret;
}

static void stream_done(void *cls) {
  hconn *c = cls;
  tide_http *s = c->srv;
  pthread_mutex_lock(&s->mu);
  c->reader_live = 0;
  maybe_free(s, c);
  pthread_mutex_unlock(&s->mu);
}

static hconn *conn_new(tide_http *s, struct MHD_Connection *mc, const char *url, const char *method) {
  hconn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->srv = s;
  c->mc = mc;
  c->lua_done = 1;   /* until it is handed to the caller */
  c->ev_req.c = c->ev_closed.c = c;
  c->ev_req.kind = TIDE_HTTP_REQUEST;
  c->ev_closed.kind = TIDE_HTTP_CLOSED;
  sbuf h = { 0 }, q = { 0 };
  MHD_get_connection_values(mc, MHD_HEADER_KIND, collect_header, &h);
  MHD_get_connection_values(mc, MHD_GET_ARGUMENT_KIND, collect_arg, &q);
  c->headers = h.p ? h.p : dup0("");
  c->query = q.p ? q.p : dup0("");
  c->method = dup0(method);
  c->path = dup0(url);
  char peer[INET6_ADDRSTRLEN] = "";
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (ci && ci->client_addr) {
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
      inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, peer, sizeof peer);
    else if (sa->sa_family == AF_INET6)
      inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, peer, sizeof peer);
  }
  c->peer = dup0(peer);
  if (h.oom || q.oom || !c->headers || !c->query || !c->method || !c->path || !c->peer) {
    conn_free(c);
    return NULL;
  }
  pthread_mutex_lock(&s->mu);
  c->id = ++s->next_id;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->st.open++;
  pthread_mutex_unlock(&s->mu);
  return c;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  tide_http *s = cls;
  hconn *c = *con_cls;
  if (!c) {
    c = conn_new(s, mc, url, method);
    if (!c) return MHD_NO;   /* out of memory: close the connection */
    *con_cls = c;
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
      char *end;
      errno = 0;
      unsigned long long n = strtoull(cl, &end, 10);
      if (errno || n > s->max_body) {
        pthread_mutex_lock(&s->mu);
        c->too_big = 1;
        s->st.rejected_large++;
        pthread_mutex_unlock(&s->mu);
        return reply_413(s, mc);   /* at once: the body is never read */
      }
    }
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    if (c->too_big) return MHD_YES;   /* discard the rest of a chunked body */
    if (c->body_len + n > s->max_body) {
      free(c->body);
      c->body = NULL;
      c->body_len = c->body_cap = 0;
      pthread_mutex_lock(&s->mu);
      c->too_big = 1;
      s->st.rejected_large++;
      pthread_mutex_unlock(&s->mu);
      return MHD_YES;
    }
    if (c->body_len + n > c->body_cap) {
      size_t cap = c->body_cap ? c->body_cap : 4096;
      while (cap < c->body_len + n) cap *= 2;
      char *p = realloc(c->body, cap);
      if (!p) return MHD_NO;
      c->body = p, c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, upload, n);
    c->body_len += n;
    return MHD_YES;
  }
  /* the request is complete (first time), or the connection was resumed */
  if (c->too_big) return reply_413(s, mc);
  pthread_mutex_lock(&s->mu);
  int state = c->state;
  if (c->aborted) {
    pthread_mutex_unlock(&s->mu);
    return MHD_NO;
  }
  if (state == ST_READING || state == ST_QUEUED) {
    if (state == ST_READING) {
      c->state = ST_QUEUED;
      c->lua_done = 0;
      s->st.requests++;
      push_event(s, &c->ev_req);
    }
    c->suspended = 1;
    MHD_suspend_connection(mc);
    pthread_mutex_unlock(&s->mu);
    wake(s);
    return MHD_YES;
  }
  struct MHD_Response *r;
  if (state == ST_ANSWERED) {
    r = MHD_create_response_from_buffer(c->resp_len, c->resp_body, MHD_RESPMEM_MUST_FREE);
    if (r) {
      c->resp_body = NULL;
      s->st.bytes_sent += (int64_t)c->resp_len;
    }
  } else {
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, c, stream_done);
    if (r) c->reader_live = 1;
  }
  int status = c->status;
  char *hdrs = c->resp_headers;
  c->resp_headers = NULL;
  pthread_mutex_unlock(&s->mu);
  if (!r) { free(hdrs); return MHD_NO; }
  add_headers(r, hdrs);
  free(hdrs);
  enum MHD_Result ok = MHD_queue_response(mc, (unsigned)status, r);
  MHD_destroy_response(r);
  return ok;
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
  tide_http *s = cls;
  hconn *c = *con_cls;
  if (!c) return;
  *con_cls = NULL;
  int woke = 0;
  pthread_mutex_lock(&s->mu);
  c->mhd_done = 1;
  c->mc = NULL;
  c->suspended = 0;
  if (!c->lua_done && !c->ev_req.queued) {
    push_event(s, &c->ev_closed);
    woke = 1;
  }
  maybe_free(s, c);
  pthread_mutex_unlock(&s->mu);
  if (woke) wake(s);
}

/* ------------------------------------------------------------------ API */

int tide_http_start(tide_http **out, const tide_http_opts *o) {
  if (!out || !o) return TIDE_ERR(TIDE_E_INVALID, "out and opts must not be NULL");
  *out = NULL;
  if (o->port < 0 || o->port > 65535) return TIDE_ERR(TIDE_E_INVALID, "port %d is outside 0..65535", o->port);
  if (o->max_body < 0 || o->max_buffer < 0 || o->max_connections < 0 || o->timeout < 0 || o->threads < 0)
    return TIDE_ERR(TIDE_E_INVALID, "negative limit");
  const char *host = o->host && *o->host ? o->host : "127.0.0.1";
  struct sockaddr_in a4;
  struct sockaddr_in6 a6;
  struct sockaddr *sa;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME;
  memset(&a4, 0, sizeof a4);
  memset(&a6, 0, sizeof a6);
  if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
    a4.sin_family = AF_INET;
    a4.sin_port = htons((uint16_t)o->port);
    sa = (struct sockaddr *)&a4;
  } else if (inet_pton(AF_INET6, host, &a6.sin6_addr) == 1) {
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons((uint16_t)o->port);
    sa = (struct sockaddr *)&a6;
    flags |= MHD_USE_IPv6;
  } else {
    return TIDE_ERR(TIDE_E_INVALID, "host '%s' is not a numeric IPv4 or IPv6 address", host);
  }
  tide_http *s = calloc(1, sizeof *s);
  if (!s) return TIDE_ERR(TIDE_E_NOMEM, "out of memory");
  s->max_body = o->max_body ? (size_t)o->max_body : (size_t)1 << 20;
  s->max_buffer = o->max_buffer ? (size_t)o->max_buffer : (size_t)4 << 20;
  s->listen_fd = -1;
  if (o->too_large_body && !(s->body_413 = dup0(o->too_large_body))) {
    free(s);
    return TIDE_ERR(TIDE_E_NOMEM, "out of memory");
  }
  pthread_mutex_init(&s->mu, NULL);
  if (pipe2(s->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    int e = errno;
    pthread_mutex_destroy(&s->mu);
    free(s->body_413);
    free(s);
    return TIDE_ERR(TIDE_E_IO, "pipe: %s", strerror(e));
  }
  unsigned threads = o->threads > 1 ? (unsigned)o->threads : 0;
  errno = 0;
  s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                          MHD_OPTION_SOCK_ADDR, sa,
                          MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o->max_connections ? o->max_connections : 256),
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o->timeout ? o->timeout : 30),
                          threads ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, threads,
                          MHD_OPTION_END);
  if (!s->d) {
    int e = errno;
    close(s->wake[0]);
    close(s->wake[1]);
    pthread_mutex_destroy(&s->mu);
    free(s->body_413);
    free(s);
    return TIDE_ERR(TIDE_E_IO, "cannot serve on %s port %d: %s", host, o->port,
                    e ? strerror(e) : "libmicrohttpd refused to start");
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : o->port;
  *out = s;
  return TIDE_OK;
}

int tide_http_port(const tide_http *s) { return s ? s->port : 0; }

static volatile sig_atomic_t g_signal;
static volatile int g_wake_fd = -1;

static void on_signal(int sig) {
  int saved = errno;
  g_signal = sig;
  if (g_wake_fd >= 0) {
    char x = 2;
    ssize_t r = write(g_wake_fd, &x, 1);
    (void)r;
  }
  errno = saved;
}

int tide_http_catch_signals(tide_http *s) {
  if (!s) return TIDE_ERR(TIDE_E_INVALID, "server is NULL");
  g_wake_fd = s->wake[1];
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
    return TIDE_ERR(TIDE_E_IO, "sigaction: %s", strerror(errno));
  return TIDE_OK;
}

static void drain(tide_http *s) {
  char buf[256];
  while (read(s->wake[0], buf, sizeof buf) > 0) {}
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int tide_http_next(tide_http *s, tide_http_event *ev, int timeout_ms) {
  if (!s || !ev) return TIDE_ERR(TIDE_E_INVALID, "server and event must not be NULL");
  memset(ev, 0, sizeof *ev);
  pthread_mutex_lock(&s->mu);
  if (s->pinned) {
    hconn *p = s->pinned;
    s->pinned = NULL;
    p->pinned = 0;
    maybe_free(s, p);
  }
  pthread_mutex_unlock(&s->mu);
  double deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  for (;;) {
    drain(s);
    if (g_signal && g_wake_fd == s->wake[1]) {
      ev->kind = TIDE_HTTP_SIGNAL;
      ev->signal = g_signal;
      g_signal = 0;
      return 1;
    }
    pthread_mutex_lock(&s->mu);
    while (s->q_head) {
      hevent *e = s->q_head;
      s->q_head = e->next;
      if (!s->q_head) s->q_tail = NULL;
      e->queued = 0;
      hconn *c = e->c;
      if (e->kind == TIDE_HTTP_REQUEST && c->mhd_done) {
        c->lua_done = 1;   /* gone before anyone saw it */
        maybe_free(s, c);
        continue;
      }
      if (e->kind == TIDE_HTTP_CLOSED) {
        if (c->lua_done) { maybe_free(s, c); continue; }
        c->lua_done = 1;
      }
      ev->id = c->id;
      ev->kind = e->kind;
      ev->method = c->method;
      ev->path = c->path;
      ev->query = c->query;
      ev->headers = c->headers;
      ev->body = c->body ? c->body : "";
      ev->body_len = c->body_len;
      ev->peer = c->peer;
      c->pinned = 1;
      s->pinned = c;
      pthread_mutex_unlock(&s->mu);
      return 1;
    }
    pthread_mutex_unlock(&s->mu);
    double left = deadline - now_ms();
    if (left <= 0) return 0;
    struct pollfd p = { .fd = s->wake[0], .events = POLLIN };
    poll(&p, 1, (int)(left + 0.999));
  }
}

/* under the lock: the request the caller may still answer */
static hconn *answerable(tide_http *s, uint64_t id) {
  hconn *c = find(s, id);
  if (!c || c->lua_done || c->aborted || c->mhd_done) return NULL;
  return c;
}

int tide_http_respond(tide_http *s, uint64_t id, int status, const char *headers, const char *body, size_t len) {
  if (!s || (!body && len)) return TIDE_ERR(TIDE_E_INVALID, "server is NULL, or body NULL with a length");
  if (status < 100 || status > 599) return TIDE_ERR(TIDE_E_INVALID, "status %d is outside 100..599", status);
  char *b = dupn(body ? body : "", len), *h = dup0(headers);
  if (!b || !h) { free(b); free(h); return TIDE_ERR(TIDE_E_NOMEM, "out of memory"); }
  pthread_mutex_lock(&s->mu);
  hconn *c = answerable(s, id);
  if (!c || c->state != ST_QUEUED) {
    pthread_mutex_unlock(&s->mu);
    free(b); free(h);
    if (c) return TIDE_ERR(TIDE_E_STATE, "request %llu is already being answered", (unsigned long long)id);
    return TIDE_HTTP_GONE;
  }
  c->state = ST_ANSWERED;
  c->status = status;
  c->resp_body = b;
  c->resp_len = len;
  c->resp_headers = h;
  c->lua_done = 1;
  struct MHD_Connection *mc = unsuspend(c);
  pthread_mutex_unlock(&s->mu);
  resume(mc);
  return TIDE_OK;
}

int tide_http_stream(tide_http *s, uint64_t id, int status, const char *headers) {
  if (!s) return TIDE_ERR(TIDE_E_INVALID, "server is NULL");
  if (status < 100 || status > 599) return TIDE_ERR(TIDE_E_INVALID, "status %d is outside 100..599", status);
  char *h = dup0(headers);
  if (!h) return TIDE_ERR(TIDE_E_NOMEM, "out of memory");
  pthread_mutex_lock(&s->mu);
  hconn *c = answerable(s, id);
  if (!c || c->state != ST_QUEUED) {
    pthread_mutex_unlock(&s->mu);
    free(h);
    if (c) return TIDE_ERR(TIDE_E_STATE, "request %llu is already being answered", (unsigned long long)id);
    return TIDE_HTTP_GONE;
  }
  c->state = ST_STREAM;
  c->status = status;
  c->resp_headers = h;
  struct MHD_Connection *mc = unsuspend(c);
  pthread_mutex_unlock(&s->mu);
  resume(mc);
  return TIDE_OK;
}

int tide_http_send(tide_http *s, uint64_t id, const char *bytes, size_t len) {
  if (!s || (!bytes && len)) return TIDE_ERR(TIDE_E_INVALID, "server is NULL, or bytes NULL with a length");
  pthread_mutex_lock(&s->mu);
  hconn *c = answerable(s, id);
  if (!c || c->state != ST_STREAM) {
    pthread_mutex_unlock(&s->mu);
    if (c) return TIDE_ERR(TIDE_E_STATE, "request %llu is not streaming (call tide_http_stream first)",
                           (unsigned long long)id);
    return TIDE_HTTP_GONE;
  }
  struct MHD_Connection *mc = NULL;
  int rc = TIDE_OK;
  size_t held = c->buf_len - c->buf_off;
  if (held + len > s->max_buffer) {
    /* the client reads too slowly: drop it rather than hold more */
    c->aborted = 1;
    s->st.dropped_slow++;
    rc = TIDE_HTTP_GONE;
  } else if (len) {
    if (c->buf_off && c->buf_len + len > c->buf_cap) {
      memmove(c->buf, c->buf + c->buf_off, held);
      c->buf_off = 0, c->buf_len = held;
    }
    if (c->buf_len + len > c->buf_cap) {
      size_t cap = c->buf_cap ? c->buf_cap : 4096;
      while (cap < c->buf_len + len) cap *= 2;
      char *p = realloc(c->buf, cap);
      if (!p) {
        pthread_mutex_unlock(&s->mu);
        return TIDE_ERR(TIDE_E_NOMEM, "out of memory");
      }
      c->buf = p, c->buf_cap = cap;
    }
    memcpy(c->buf + c->buf_len, bytes, len);
    c->buf_len += len;
  }
  mc = unsuspend(c);
  pthread_mutex_unlock(&s->mu);
  resume(mc);
  return rc;
}

int tide_http_end(tide_http *s, uint64_t id) {
  if (!s) return TIDE_ERR(TIDE_E_INVALID, "server is NULL");
  pthread_mutex_lock(&s->mu);
  hconn *c = answerable(s, id);
  if (!c || c->state != ST_STREAM) {
    pthread_mutex_unlock(&s->mu);
    if (c) return TIDE_ERR(TIDE_E_STATE, "request %llu is not streaming", (unsigned long long)id);
    return TIDE_HTTP_GONE;
  }
  c->ended = 1;
  c->lua_done = 1;
  struct MHD_Connection *mc = unsuspend(c);
  pthread_mutex_unlock(&s->mu);
  resume(mc);
  return TIDE_OK;
}

int tide_http_abort(tide_http *s, uint64_t id) {
  if (!s) return TIDE_ERR(TIDE_E_INVALID, "server is NULL");
  pthread_mutex_lock(&s->mu);
  hconn *c = answerable(s, id);
  if (!c) {
    pthread_mutex_unlock(&s->mu);
    return TIDE_HTTP_GONE;
  }
  c->aborted = 1;
  c->lua_done = 1;
  struct MHD_Connection *mc = unsuspend(c);
  pthread_mutex_unlock(&s->mu);
  resume(mc);
  return TIDE_OK;
}

int64_t tide_http_pending(tide_http *s, uint64_t id) {
  if (!s) return 0;
  pthread_mutex_lock(&s->mu);
  hconn *c = find(s, id);
  int64_t n = c && !c->aborted && !c->mhd_done ? (int64_t)(c->buf_len - c->buf_off) : 0;
  pthread_mutex_unlock(&s->mu);
  return n;
}

void tide_http_get_stats(tide_http *s, tide_http_stats *out) {
  if (!s || !out) return;
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  pthread_mutex_unlock(&s->mu);
}

void tide_http_quiesce(tide_http *s) {
  if (!s || !s->d || s->listen_fd >= 0) return;
  MHD_socket fd = MHD_quiesce_daemon(s->d);
  if (fd != MHD_INVALID_SOCKET) s->listen_fd = fd;
}

void tide_http_free(tide_http *s) {
  if (!s) return;
  /* libmicrohttpd must not be stopped with suspended connections: abort
   * every request, resume what is parked, and give its thread a moment to
   * close them. */
  double deadline = now_ms() + 1000;
  for (;;) {
    struct MHD_Connection *list[64];
    int n = 0, parked = 0;
    pthread_mutex_lock(&s->mu);
    for (hconn *c = s->conns; c; c = c->next) {
      if (c->mhd_done) continue;
      c->aborted = 1;
      if (c->suspended) {
        if (n < 64) { list[n++] = c->mc; c->suspended = 0; }
        else parked++;
      }
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) MHD_resume_connection(list[i]);
    if (!n && !parked) break;
    if (now_ms() > deadline) break;
    struct timespec ts = { 0, 2000000 };
    nanosleep(&ts, NULL);
  }
  /* let resumed connections close before the daemon stops */
  while (now_ms() < deadline) {
    int live = 0;
    pthread_mutex_lock(&s->mu);
    for (hconn *c = s->conns; c; c = c->next) if (!c->mhd_done && c->state != ST_READING) live++;
    pthread_mutex_unlock(&s->mu);
    if (!live) break;
    struct timespec ts = { 0, 2000000 };
    nanosleep(&ts, NULL);
  }
  MHD_stop_daemon(s->d);
  if (s->listen_fd >= 0) close(s->listen_fd);
  if (g_wake_fd == s->wake[1]) g_wake_fd = -1;
  close(s->wake[0]);
  close(s->wake[1]);
  for (hconn *c = s->conns, *next; c; c = next) {
    next = c->next;
    conn_free(c);
  }
  free(s->body_413);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
