/* tide/http.h - an HTTP/1.1 server that Lua drives by polling.
 * Part of tide.h; include tide.h, not this file.
 *
 * Boundary: libmicrohttpd owns the sockets, parsing, keep-alive, chunked
 * encoding and timeouts on its own thread. This layer turns each complete
 * request (headers and body) into an event that the caller takes with
 * tide_http_next, parks the connection (suspended, costing nothing) until the
 * caller answers, and buffers streamed bytes per connection. No call blocks
 * on a client: tide_http_respond/send only copy bytes into the connection's
 * buffer, so a slow or stuck client never stalls the caller or the other
 * clients. A stream whose buffer grows past max_buffer is dropped (the
 * client reads too slowly); the caller sees "gone" and a CLOSED event.
 *
 * Identities: every request gets an id (>= 1, never reused in a server's
 * life). Calls naming an id that has finished or been dropped return
 * TIDE_HTTP_GONE and change nothing.
 *
 * Threads: all of these functions are for one thread (the caller's loop).
 * libmicrohttpd's thread touches the shared state only under the server's
 * lock. */

typedef struct tide_http tide_http;   /* opaque */

typedef struct tide_http_opts {
  const char *host;          /* address to bind ("127.0.0.1"; NULL = that) */
  int port;                  /* 0: a free port (read it with tide_http_port) */
  int max_body;              /* largest request body in bytes (larger: 413), default 1 MiB */
  int max_buffer;            /* most unsent bytes a stream may hold, default 4 MiB */
  int max_connections;       /* open connections at once, default 256 */
  int timeout;               /* seconds a connection may be idle (headers too slow, no reads), default 30 */
  int threads;               /* libmicrohttpd polling threads, default 1 */
  const char *too_large_body; /* JSON body of the 413 answer (copied); NULL: plain text */
} tide_http_opts;

enum {
  TIDE_HTTP_NONE = 0,        /* tide_http_next: nothing happened before the timeout */
  TIDE_HTTP_REQUEST = 1,     /* a complete request; answer it with respond or stream */
  TIDE_HTTP_CLOSED = 2,      /* a request still being answered lost its client */
  TIDE_HTTP_SIGNAL = 3,      /* SIGINT or SIGTERM arrived (after tide_http_catch_signals) */
  TIDE_HTTP_GONE = 2         /* respond/stream/send/end: the request is no longer there */
};

/* One event. The strings point into the server and stay valid until the
 * next tide_http_next call (copy what you keep). `headers` holds every
 * request header as "name: value\n" lines, names lower-cased. `body` is
 * not NUL-terminated: use body_len. */
typedef struct tide_http_event {
  uint64_t id;               /* request id */
  int kind;                  /* TIDE_HTTP_* */
  int signal;                /* kind SIGNAL: the signal number */
  const char *method;        /* "GET", "POST", ... */
  const char *path;          /* the URL path, without the query */
  const char *query;         /* the query string without '?', "" when none */
  const char *headers;
  const char *body;
  size_t body_len;
  const char *peer;          /* client address as text */
} tide_http_event;

/* Start serving. *out is owned by the caller (tide_http_free). Errors:
 * TIDE_E_INVALID (bad options), TIDE_E_IO (cannot bind: the message says
 * why). */
int tide_http_start(tide_http **out, const tide_http_opts *opts);
int tide_http_port(const tide_http *s);                 /* the bound port */

/* Wait up to timeout_ms (0: do not wait) for an event; 1 when *ev was
 * filled, 0 when none. Also returns at once when a signal is pending. */
int tide_http_next(tide_http *s, tide_http_event *ev, int timeout_ms);

/* A complete response. `headers`: extra "Name: value\r\n" lines (or NULL);
 * Content-Length is added. Returns TIDE_OK or TIDE_HTTP_GONE. */
int tide_http_respond(tide_http *s, uint64_t id, int status, const char *headers, const char *body, size_t len);

/* Start a streamed response (chunked transfer encoding, or until close for
 * HTTP/1.0 clients), then send bytes as they come, then end it. send copies
 * the bytes; it returns TIDE_HTTP_GONE when the client has left or was
 * dropped for reading too slowly (more than max_buffer bytes waiting). */
int tide_http_stream(tide_http *s, uint64_t id, int status, const char *headers);
int tide_http_send(tide_http *s, uint64_t id, const char *bytes, size_t len);
int tide_http_end(tide_http *s, uint64_t id);
/* Drop a request's connection without a (complete) response. */
int tide_http_abort(tide_http *s, uint64_t id);
/* Bytes a stream holds that the client has not read yet (0 when gone). */
int64_t tide_http_pending(tide_http *s, uint64_t id);

/* Counters: open requests (read, waiting for an answer, or streaming),
 * requests taken, bytes handed to the sockets. */
typedef struct tide_http_stats {
  int64_t open;
  int64_t requests;
  int64_t bytes_sent;
  int64_t dropped_slow;      /* streams dropped for exceeding max_buffer */
  int64_t rejected_large;    /* bodies over max_body (413) */
} tide_http_stats;
void tide_http_get_stats(tide_http *s, tide_http_stats *out);

/* SIGINT and SIGTERM set a flag that tide_http_next reports as a SIGNAL
 * event (once per signal) instead of ending the process. */
int tide_http_catch_signals(tide_http *s);

/* Stop accepting new connections (requests already read are still
 * answered; keep-alive connections close after their current request). */
void tide_http_quiesce(tide_http *s);

/* Drop every connection, stop the thread, free. NULL-safe. */
void tide_http_free(tide_http *s);
