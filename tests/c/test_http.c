/* test_http.c - the polled HTTP layer (engine/http.c) over loopback with raw
 * sockets: a request becomes one event with its headers and body; complete
 * and streamed answers; keep-alive; a client that leaves mid-stream gives a
 * CLOSED event and "gone"; a client that does not read is dropped once its
 * buffer is full while another client is served; 413 for large bodies
 * (declared and chunked); misuse errors; freeing with parked requests. */
#include "tide.h"
#include "tt.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
  return fd;
}

static void put(int fd, const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) return;
    s += w, n -= (size_t)w;
  }
}

/* read what arrives within ms (until close or `until` appears) */
static int slurp(int fd, char *buf, int cap, int ms, const char *until) {
  int n = 0;
  for (;;) {
    struct pollfd p = { .fd = fd, .events = POLLIN };
    if (poll(&p, 1, ms) <= 0) break;
    ssize_t r = read(fd, buf + n, (size_t)(cap - 1 - n));
    if (r <= 0) break;
    n += (int)r;
    buf[n] = 0;
    if (until && strstr(buf, until)) break;
    if (n >= cap - 1) break;
  }
  buf[n] = 0;
  return n;
}

static int next_kind(tide_http *s, tide_http_event *ev, int kind, int ms) {
  for (int i = 0; i < ms / 10; i++) {
    if (tide_http_next(s, ev, 10) == 1 && ev->kind == kind) return 1;
  }
  return 0;
}

static tide_http *start(int max_body, int max_buffer) {
  tide_http_opts o;
  memset(&o, 0, sizeof o);
  o.port = 0;
  o.max_body = max_body;
  o.max_buffer = max_buffer;
  o.timeout = 5;
  o.too_large_body = "{\"error\":{\"message\":\"too large\"}}";
  tide_http *s = NULL;
  TT_OK(tide_http_start(&s, &o));
  return s;
}

static void request_and_answer(void) {
  tide_http *s = start(0, 0);
  if (!s) return;
  int port = tide_http_port(s);
  TT_CHECK(port > 0, "port %d", port);
  int fd = dial(port);
  put(fd, "POST /a/b?x=1 HTTP/1.1\r\nHost: h\r\nX-Thing: Yes\r\nContent-Length: 5\r\n\r\nhello");
  tide_http_event ev;
  TT_CHECK(next_kind(s, &ev, TIDE_HTTP_REQUEST, 3000), "no request event");
  TT_CHECK(strcmp(ev.method, "POST") == 0 && strcmp(ev.path, "/a/b") == 0, "%s %s", ev.method, ev.path);
  TT_CHECK(strcmp(ev.query, "x=1") == 0, "query '%s'", ev.query);
  TT_CHECK(strstr(ev.headers, "x-thing: Yes\n") != NULL, "headers '%s'", ev.headers);
  TT_CHECK(ev.body_len == 5 && memcmp(ev.body, "hello", 5) == 0, "body");
  uint64_t id = ev.id;
  TT_OK(tide_http_respond(s, id, 201, "X-Reply: 1\r\n", "done!", 5));
  TT_CHECK(tide_http_send(s, id, "x", 1) == TIDE_HTTP_GONE, "answered: gone");
  char buf[4096];
  slurp(fd, buf, sizeof buf, 3000, "done!");
  TT_CHECK(strncmp(buf, "HTTP/1.1 201", 12) == 0, "reply '%s'", buf);
  TT_CHECK(strstr(buf, "X-Reply: 1") && strstr(buf, "Content-Length: 5"), "reply headers '%s'", buf);
  /* keep-alive: a second request on the same connection, streamed */
  put(fd, "GET /s HTTP/1.1\r\nHost: h\r\n\r\n");
  TT_CHECK(next_kind(s, &ev, TIDE_HTTP_REQUEST, 3000), "no second request");
  TT_CHECK(ev.id != id, "ids are not reused");
  id = ev.id;
  TT_OK(tide_http_stream(s, id, 200, "Content-Type: text/event-stream\r\n"));
  TT_FAILS(tide_http_respond(s, id, 200, NULL, "", 0), TIDE_E_STATE, "already being answered");
  TT_OK(tide_http_send(s, id, "data: 1\n\n", 9));
  TT_OK(tide_http_send(s, id, "data: 2\n\n", 9));
  TT_OK(tide_http_end(s, id));
  slurp(fd, buf, sizeof buf, 3000, "0\r\n\r\n");
  TT_CHECK(strstr(buf, "Transfer-Encoding: chunked") && strstr(buf, "data: 1") && strstr(buf, "data: 2"),
           "stream '%s'", buf);
  TT_CHECK(tide_http_end(s, id) == TIDE_HTTP_GONE, "ended twice");
  close(fd);
  tide_http_stats st;
  tide_http_get_stats(s, &st);
  TT_CHECK(st.requests == 2, "requests %lld", (long long)st.requests);
  tide_http_free(s);
}

static void client_leaves(void) {
  tide_http *s = start(0, 0);
  if (!s) return;
  int fd = dial(tide_http_port(s));
  put(fd, "GET /s HTTP/1.1\r\nHost: h\r\n\r\n");
  tide_http_event ev;
  TT_CHECK(next_kind(s, &ev, TIDE_HTTP_REQUEST, 3000), "no request");
  uint64_t id = ev.id;
  TT_OK(tide_http_stream(s, id, 200, NULL));
  TT_OK(tide_http_send(s, id, "a\n", 2));
  char buf[1024];
  slurp(fd, buf, sizeof buf, 2000, "a\n");
  close(fd);
  /* the next sends notice; a CLOSED event follows */
  int gone = 0, closed = 0;
  for (int i = 0; i < 300 && !(gone && closed); i++) {
    if (!gone && tide_http_send(s, id, "more\n", 5) == TIDE_HTTP_GONE) gone = 1;
    if (tide_http_next(s, &ev, 10) == 1 && ev.kind == TIDE_HTTP_CLOSED && ev.id == id) closed = 1;
  }
  TT_CHECK(gone && closed, "gone %d closed %d", gone, closed);
  tide_http_free(s);
}

static void slow_client_dropped(void) {
  tide_http *s = start(0, 65536);
  if (!s) return;
  int port = tide_http_port(s);
  int slow = dial(port);
  int bufsz = 4096;
  setsockopt(slow, SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof bufsz);
  put(slow, "GET /slow HTTP/1.1\r\nHost: h\r\n\r\n");
  tide_http_event ev;
  TT_CHECK(next_kind(s, &ev, TIDE_HTTP_REQUEST, 3000), "no request");
  uint64_t id = ev.id;
  TT_OK(tide_http_stream(s, id, 200, NULL));
  /* the client never reads: sends succeed (buffered) until the limit, then gone */
  static char chunk[8192];
  memset(chunk, 'x', sizeof chunk);
  int rc = 0;
  long sent = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 20000 && rc == 0; i++) {
    rc = tide_http_send(s, id, chunk, sizeof chunk);
    if (rc == 0) sent += (long)sizeof chunk;
    if (i % 64 == 0) tide_http_next(s, &ev, 1);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  TT_CHECK(rc == TIDE_HTTP_GONE, "a client that does not read is dropped (rc %d after %ld bytes)", rc, sent);
  TT_CHECK(secs < 10, "sends never block (%.2f s)", secs);
  tide_http_stats st;
  tide_http_get_stats(s, &st);
  TT_CHECK(st.dropped_slow == 1, "dropped_slow %lld", (long long)st.dropped_slow);
  /* another client is served */
  int fd = dial(port);
  put(fd, "GET /other HTTP/1.1\r\nHost: h\r\n\r\n");
  TT_CHECK(next_kind(s, &ev, TIDE_HTTP_REQUEST, 3000), "no second request");
  TT_OK(tide_http_respond(s, ev.id, 200, NULL, "ok", 2));
  char buf[1024];
  slurp(fd, buf, sizeof buf, 3000, "\r\n\r\nok");
  TT_CHECK(strstr(buf, "200") && strstr(buf, "\r\n\r\nok"), "'%s'", buf);
  close(fd);
  close(slow);
  tide_http_free(s);
}

static void large_bodies(void) {
  tide_http *s = start(1000, 0);
  if (!s) return;
  int port = tide_http_port(s);
  char buf[4096];
  int fd = dial(port);
  put(fd, "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 1001\r\n\r\n");
  slurp(fd, buf, sizeof buf, 3000, "too large");
  TT_CHECK(strncmp(buf, "HTTP/1.1 413", 12) == 0 && strstr(buf, "too large"), "declared '%s'", buf);
  close(fd);
  fd = dial(port);
  put(fd, "POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
  char chunk[600];
  memset(chunk, 'a', sizeof chunk);
  memcpy(chunk, "200\r\n", 5);
  memcpy(chunk + 5 + 512, "\r\n", 3);   /* "200\r\n" + 512 bytes + "\r\n" */
  for (int i = 0; i < 3; i++) put(fd, chunk);
  put(fd, "0\r\n\r\n");
  slurp(fd, buf, sizeof buf, 3000, "too large");
  TT_CHECK(strncmp(buf, "HTTP/1.1 413", 12) == 0, "chunked '%s'", buf);
  close(fd);
  tide_http_event ev;
  TT_CHECK(tide_http_next(s, &ev, 100) == 0, "no event for refused bodies (kind %d)", ev.kind);
  tide_http_stats st;
  tide_http_get_stats(s, &st);
  TT_CHECK(st.rejected_large == 2, "rejected %lld", (long long)st.rejected_large);
  tide_http_free(s);
}

static void misuse_and_parked_free(void) {
  tide_http_opts o;
  memset(&o, 0, sizeof o);
  tide_http *s = NULL;
  o.port = 70000;
  TT_FAILS(tide_http_start(&s, &o), TIDE_E_INVALID, "port");
  o.port = 0;
  o.host = "not-an-address";
  TT_FAILS(tide_http_start(&s, &o), TIDE_E_INVALID, "numeric");
  TT_CHECK(s == NULL, "nothing made");
  s = start(0, 0);
  if (!s) return;
  TT_CHECK(tide_http_send(s, 12345, "x", 1) == TIDE_HTTP_GONE, "unknown id");
  TT_FAILS(tide_http_respond(s, 1, 42, NULL, "", 0), TIDE_E_INVALID, "status");
  /* a request parked (never answered) and a stream left open: free closes both */
  int a = dial(tide_http_port(s)), b = dial(tide_http_port(s));
  put(a, "GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
  put(b, "GET /b HTTP/1.1\r\nHost: h\r\n\r\n");
  tide_http_event ev;
  int got = 0;
  for (int i = 0; i < 300 && got < 2; i++) {
    if (tide_http_next(s, &ev, 10) == 1 && ev.kind == TIDE_HTTP_REQUEST) {
      got++;
      if (ev.path[1] == 'b') tide_http_stream(s, ev.id, 200, NULL);
    }
  }
  TT_CHECK(got == 2, "got %d", got);
  tide_http_quiesce(s);
  tide_http_free(s);
  char buf[256];
  slurp(a, buf, sizeof buf, 2000, NULL);
  slurp(b, buf, sizeof buf, 2000, NULL);
  close(a);
  close(b);
  tide_http_free(NULL);
}

TT_RUN(TT(request_and_answer), TT(client_leaves), TT(slow_client_dropped), TT(large_bodies),
       TT(misuse_and_parked_free))
