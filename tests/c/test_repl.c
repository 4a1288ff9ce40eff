/* test_repl.c - the `tide` REPL driven through a pseudo-terminal, as a person
 * would use it: values printed, an unfinished chunk continued, TAB
 * completion (globals, tensor methods, tide's lazy modules), an error and a
 * traceback followed by a working line, Ctrl-C at the prompt and in a
 * running loop, Ctrl-D to leave, and history kept across sessions. */
#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tide.h"
#include "tt.h"

/* The waits below detect hangs; each ends as soon as the awaited output
 * comes, so they are long (x PATIENCE) for a busy, shared machine. */
#define PATIENCE 5.0

typedef struct {
  int fd;
  pid_t pid;
  char buf[1 << 16];
  size_t len, mark; /* bytes received; expectations search from mark */
} session;

static char exe[1024], hist[1024];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void show(const char *what, const char *s, size_t n) {
  fprintf(stderr, "%s: \"", what);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\n') fputs("\\n", stderr);
    else if (c == '\r') fputs("\\r", stderr);
    else if (c < 32 || c > 126) fprintf(stderr, "\\x%02x", c);
    else fputc(c, stderr);
  }
  fputs("\"\n", stderr);
}

static int pump(session *s, int ms) {
  struct pollfd p = {s->fd, POLLIN, 0};
  int r = poll(&p, 1, ms);
  if (r <= 0) return 0;
  ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - 1 - s->len);
  if (n <= 0) return -1; /* EIO: the child closed the terminal */
  s->len += (size_t)n;
  s->buf[s->len] = 0;
  return 1;
}

/* Wait until `text` appears after the mark; move the mark past it. */
static int expect(session *s, const char *text, double timeout) {
  double end = now() + PATIENCE * timeout;
  for (;;) {
    char *hit = strstr(s->buf + s->mark, text);
    if (hit) {
      s->mark = (size_t)(hit - s->buf) + strlen(text);
      return 1;
    }
    if (now() > end || s->len >= sizeof s->buf - 1) break;
    if (pump(s, 100) < 0) {
      if (strstr(s->buf + s->mark, text)) continue;
      break;
    }
  }
  fprintf(stderr, "expected \"%s\"\n", text);
  show("after the mark", s->buf + s->mark, s->len - s->mark);
  return 0;
}

static void type(session *s, const char *keys) {
  size_t n = strlen(keys);
  while (n > 0) {
    ssize_t w = write(s->fd, keys, n);
    if (w <= 0) {
      if (errno == EINTR) continue;
      return;
    }
    keys += w;
    n -= (size_t)w;
  }
}

static int start(session *s) {
  memset(s, 0, sizeof *s);
  struct winsize ws = {24, 100, 0, 0};
  s->pid = forkpty(&s->fd, NULL, NULL, &ws);
  if (s->pid < 0) return 0;
  if (s->pid == 0) {
    setenv("TIDE_HISTORY", hist, 1);
    setenv("TERM", "xterm", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    execl(exe, "tide", (char *)NULL);
    _exit(127);
  }
  return expect(s, "> ", 20);
}

/* Ctrl-D and wait for a clean exit. The REPL prints its prompt just before
 * libedit puts the terminal in raw mode; a Ctrl-D that lands in between is
 * the line discipline's end-of-file marker and is dropped when raw mode
 * starts, so a person would press it again: so does this. */
static int finish(session *s) {
  if (!expect(s, "> ", 20)) return 0;
  int status = -1;
  pid_t r = 0;
  for (int attempt = 0; attempt < 10 && r != s->pid; attempt++) {
    type(s, "\x04");
    double end = now() + PATIENCE * 2;
    while (now() < end && (r = waitpid(s->pid, &status, WNOHANG)) != s->pid) pump(s, 50);
  }
  if (r != s->pid) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &status, 0);
  }
  close(s->fd);
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    fprintf(stderr, "exit status 0x%x\n", status);
    show("session output", s->buf, s->len);
    return 0;
  }
  return 1;
}

#define EXPECT(s, text) TT_CHECK(expect((s), (text), 20), "no \"%s\" from the REPL", (text))

static void setup(void) {
  const char *e = getenv("TIDE_EXE");
  if (e && *e) {
    snprintf(exe, sizeof exe, "%s", e);
  } else { /* next to this test binary */
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 8);
    exe[n > 0 ? n : 0] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) strcpy(slash + 1, "tide");
  }
  const char *tmp = getenv("TIDE_TEST_TMP");
  snprintf(hist, sizeof hist, "%s/repl_history", tmp && *tmp ? tmp : "/tmp");
  unlink(hist);
}

static void session_one(void) {
  setup();
  TT_CHECK(access(exe, X_OK) == 0, "no tide executable at %s", exe);
  session s;
  TT_CHECK(start(&s), "the REPL did not show a prompt");
  /* a bare expression and =expr print their values */
  type(&s, "100+23\r");
  EXPECT(&s, "\r\n123\r\n");
  type(&s, "=20+22\r");
  EXPECT(&s, "\r\n42\r\n");
  /* tables and tensors are pretty-printed */
  type(&s, "{a = 1, b = {2, 3}}\r");
  EXPECT(&s, "{ a = 1, b = { 2, 3 } }");
  type(&s, "tide.zeros(2, 3)\r");
  EXPECT(&s, "[tide.Tensor f32 of size 2x3]");
  /* an unfinished chunk continues on the next line */
  type(&s, "for i = 1, 3 do\r");
  EXPECT(&s, ">> ");
  type(&s, "io.write(i * 111, ';') end\r");
  EXPECT(&s, "111;222;333;");
  /* TAB completion: a global, a field of tide, a tensor method and one of
   * tide's lazily loaded modules (inside a string, so that the completed
   * word can be checked without running it) */
  type(&s, "tide.zer\t");
  type(&s, "4):size(0) * 1000 + 7\r");
  EXPECT(&s, "\r\n4007\r\n");
  type(&s, "x = \"pri\t\"\r");
  type(&s, "=x:upper()\r");
  EXPECT(&s, "\"PRINT(\"");
  type(&s, "t = tide.ones(3)\r");
  type(&s, "x = \"t:softm\t\"\r");
  type(&s, "=x:upper()\r");
  EXPECT(&s, "\"T:SOFTMAX(\"");
  type(&s, "x = \"tide.sampl\t\"\r");
  type(&s, "=x:upper()\r");
  EXPECT(&s, "\"TIDE.SAMPLING\"");
  /* an error shows a traceback; the session goes on */
  type(&s, "error('bo' .. 'om')\r");
  EXPECT(&s, "boom");
  EXPECT(&s, "stack traceback:");
  type(&s, "=6*7\r");
  EXPECT(&s, "\r\n42\r\n");
  /* Ctrl-C at the prompt drops the line; in an unfinished chunk, the chunk */
  type(&s, "abc");
  usleep(200000);
  type(&s, "\x03");
  EXPECT(&s, "^C");
  type(&s, "=7*8\r");
  EXPECT(&s, "\r\n56\r\n");
  type(&s, "for i = 1, 2 do\r");
  EXPECT(&s, ">> ");
  type(&s, "\x03");
  type(&s, "=5*5\r");
  EXPECT(&s, "\r\n25\r\n");
  /* Ctrl-C interrupts a running chunk and returns to the prompt */
  type(&s, "while true do end\r");
  usleep(300000);
  type(&s, "\x03");
  EXPECT(&s, "interrupted");
  type(&s, "=9*9\r");
  EXPECT(&s, "\r\n81\r\n");
  /* Ctrl-D leaves with status 0 */
  TT_CHECK(finish(&s), "Ctrl-D did not end the session cleanly");
  /* history went to the file */
  FILE *f = fopen(hist, "r");
  TT_CHECK(f != NULL, "no history file %s", hist);
  if (f) {
    char all[8192];
    size_t n = fread(all, 1, sizeof all - 1, f);
    all[n] = 0;
    fclose(f);
    TT_CHECK(strstr(all, "100+23") && strstr(all, "=9*9"), "history lacks the lines typed");
  }
}

static void history_next_session(void) {
  session s;
  TT_CHECK(start(&s), "the REPL did not show a prompt");
  /* the up arrow recalls the last line of the previous session */
  type(&s, "\x1b[A\r");
  EXPECT(&s, "\r\n81\r\n");
  TT_CHECK(finish(&s), "Ctrl-D did not end the session cleanly");
}

/* Ctrl-D typed while a chunk runs (the terminal is in cooked mode then)
 * ends the session once the chunk is done. */
static void ctrl_d_during_a_chunk(void) {
  session s;
  TT_CHECK(start(&s), "the REPL did not show a prompt");
  type(&s, "local s = 0 for i = 1, 3e7 do s = s + i end print('done', s)\r");
  usleep(50000);
  type(&s, "\x04");
  EXPECT(&s, "done");
  int status = -1;
  double end = now() + PATIENCE * 20;
  pid_t r = 0;
  while (now() < end && (r = waitpid(s.pid, &status, WNOHANG)) != s.pid) pump(&s, 50);
  if (r != s.pid) {
    show("session output", s.buf, s.len);
    kill(s.pid, SIGKILL);
    waitpid(s.pid, &status, 0);
  }
  close(s.fd);
  TT_CHECK(r == s.pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "no clean exit after an early Ctrl-D");
}

/* Piped input (not a terminal): no prompt decorations, values printed. */
static void piped_input(void) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "printf '=1+2\\nfor i=1,2 do\\nio.write(i) end\\nprint(\"\")\\nerror(\"x\")\\n=3\\n' | TIDE_HISTORY= '%s' 2>&1", exe);
  FILE *p = popen(cmd, "r");
  TT_CHECK(p != NULL, "popen");
  if (!p) return;
  char out[4096];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  int st = pclose(p);
  TT_CHECK(strstr(out, "3\n") && strstr(out, "12") && strstr(out, "x\nstack traceback") && WIFEXITED(st) &&
               WEXITSTATUS(st) == 0,
           "piped session output: %s", out);
}

TT_RUN(TT(session_one), TT(history_next_session), TT(ctrl_d_during_a_chunk), TT(piped_input))
