/* test_chat.c - `tide chat` driven through a pseudo-terminal as a person
 * would use it, on a generated model with DeepSeek's tokenizer: a line typed
 * gets a streamed reply (the same one the piped, non-interactive chat
 * gives), /undo then the same line gives the same reply again, Ctrl-C during
 * a long generation stops it and the chat goes on, /lua enters the REPL with
 * the session bound to `s` (where Ctrl-C stops a reply too) and Ctrl-D
 * comes back, /save in one process and
 * /load in a new one continue identically, Ctrl-D leaves, and the chat and
 * the REPL each keep their own history file. */
#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tide.h"
#include "tt.h"

typedef struct {
  int fd;
  pid_t pid;
  char buf[1 << 18];
  size_t len, mark; /* bytes received; expectations search from mark */
} session;

static char exe[1024], src[1024], tmp[1024], model[1024], hist[1200], repl_hist[1200], save_path[1200];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void show(const char *what, const char *s, size_t n) {
  fprintf(stderr, "%s: \"", what);
  for (size_t i = 0; i < n && i < 4000; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\n') fputs("\\n", stderr);
    else if (c == '\r') fputs("\\r", stderr);
    else if (c < 32 || c == 127) fprintf(stderr, "\\x%02x", c);
    else fputc(c, stderr);
  }
  fputs("\"\n", stderr);
}

static int pump(session *s, int ms) {
  struct pollfd p = {s->fd, POLLIN, 0};
  int r = poll(&p, 1, ms);
  if (r <= 0) return 0;
  if (s->len >= sizeof s->buf - 1) return -1;
  ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - 1 - s->len);
  if (n <= 0) return -1; /* EIO: the child closed the terminal */
  s->len += (size_t)n;
  s->buf[s->len] = 0;
  return 1;
}

/* Wait until `text` appears after the mark; move the mark past it. */
static int expect(session *s, const char *text, double timeout) {
  double end = now() + timeout;
  for (;;) {
    char *hit = strstr(s->buf + s->mark, text);
    if (hit) {
      s->mark = (size_t)(hit - s->buf) + strlen(text);
      return 1;
    }
    if (now() > end) break;
    if (pump(s, 100) < 0) {
      if (strstr(s->buf + s->mark, text)) continue;
      break;
    }
  }
  fprintf(stderr, "expected \"%s\"\n", text);
  show("after the mark", s->buf + s->mark, s->len - s->mark);
  return 0;
}

/* After `prefix`, the rest of the line (up to \r or \n) into out. */
static int grab(session *s, const char *prefix, char *out, size_t cap) {
  if (!expect(s, prefix, 30)) return 0;
  double end = now() + 30;
  for (;;) {
    char *e = strpbrk(s->buf + s->mark, "\r\n");
    if (e) {
      size_t n = (size_t)(e - (s->buf + s->mark));
      if (n >= cap) n = cap - 1;
      memcpy(out, s->buf + s->mark, n);
      out[n] = 0;
      s->mark = (size_t)(e - s->buf);
      return 1;
    }
    if (now() > end || pump(s, 100) < 0) return 0;
  }
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

static const char *FLAGS[] = {"chat", "--model", model, "--seed", "5", "--max-tokens", "12", "--chunk", "24", NULL};

static int start(session *s) {
  memset(s, 0, sizeof *s);
  struct winsize ws = {24, 100, 0, 0};
  s->pid = forkpty(&s->fd, NULL, NULL, &ws);
  if (s->pid < 0) return 0;
  if (s->pid == 0) {
    setenv("TIDE_CHAT_HISTORY", hist, 1);
    setenv("TIDE_HISTORY", repl_hist, 1);
    setenv("TERM", "xterm", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    char *argv[16];
    int i = 0;
    argv[i++] = "tide";
    for (int k = 0; FLAGS[k]; k++) argv[i++] = (char *)FLAGS[k];
    argv[i] = NULL;
    execv(exe, argv);
    _exit(127);
  }
  return expect(s, "you> ", 60);
}

/* Ctrl-D at the prompt and wait for a clean exit (pressed again when it
 * landed before libedit switched the terminal to raw mode, see test_repl). */
static int finish(session *s) {
  int status = -1;
  pid_t r = 0;
  for (int attempt = 0; attempt < 10 && r != s->pid; attempt++) {
    usleep(100000);
    type(s, "\x04");
    double end = now() + 2;
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

static void stop(session *s) {
  kill(s->pid, SIGKILL);
  waitpid(s->pid, NULL, 0);
  close(s->fd);
}

/* a check that ends the test (and the chat) when it fails: what follows
 * would only wait for output that cannot come */
#define REQUIRE(s, cond, ...)       \
  do {                              \
    int ok_ = (cond);               \
    TT_CHECK(ok_, __VA_ARGS__);     \
    if (!ok_) {                     \
      show("chat output", (s)->buf, (s)->len); \
      stop(s);                      \
      return;                       \
    }                               \
  } while (0)
#define EXPECT(s, text) REQUIRE((s), expect((s), (text), 60), "no \"%s\" from the chat", (text))

/* the model (shared with the Lua specs through tests/lua/testmodels.lua) */
static int setup(void) {
  const char *e = getenv("TIDE_EXE");
  if (e && *e) {
    snprintf(exe, sizeof exe, "%s", e);
  } else {
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 8);
    exe[n > 0 ? n : 0] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) strcpy(slash + 1, "tide");
  }
  const char *sd = getenv("TIDE_SOURCE_DIR");
  snprintf(src, sizeof src, "%s", sd && *sd ? sd : ".");
  const char *t = getenv("TIDE_TEST_TMP");
  snprintf(tmp, sizeof tmp, "%s", t && *t ? t : "/tmp");
  snprintf(hist, sizeof hist, "%s/chat_history", tmp);
  snprintf(repl_hist, sizeof repl_hist, "%s/chat_repl_history", tmp);
  unlink(repl_hist);
  snprintf(save_path, sizeof save_path, "%s/chat_test.tsess", tmp);
  unlink(hist);
  unlink(save_path);
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && TIDE_TEST_TMP='%s' '%s' -e \"package.path='./tests/lua/?.lua;'..package.path; "
           "io.write(require('testmodels').get('demo_k8', {'--preset', 'demo', '--set', 'index_topk=8', "
           "'--seed', '5'}))\"",
           src, tmp, exe);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  size_t n = fread(model, 1, sizeof model - 1, p);
  model[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 && n > 0;
}

/* The reply (and its ids) the non-interactive chat gives to `line`. */
static int piped(const char *input, char *out, size_t cap) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "printf '%s' | OMP_NUM_THREADS=1 TIDE_CHAT_HISTORY= '%s' chat --model '%s' --seed 5 "
           "--max-tokens 12 --chunk 24 2>&1", input, exe, model);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static char ids_first[4096], ids_final[4096];

static void conversation(void) {
  if (!setup()) {
    TT_CHECK(0, "could not make the test model (scripts/make_checkpoint.lua --preset demo)");
    return;
  }
  /* what the chat answers without a terminal: the reference reply */
  static char ref[1 << 16];
  if (!piped("Hello there\\n/ids\\n/undo\\nHello there\\n/ids\\n", ref, sizeof ref)) {
    TT_CHECK(0, "piped chat failed: %s", ref);
    return;
  }
  char *a = strstr(ref, "ids: "), *b = a ? strstr(a + 5, "ids: ") : NULL;
  TT_CHECK(a && b, "piped chat printed no ids: %s", ref);
  if (!a || !b) return;
  size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
  TT_CHECK(la == lb && !memcmp(a, b, la), "piped chat: the reply after /undo differs: %s", ref);
  char want[4096];
  snprintf(want, sizeof want, "%.*s", (int)la - 5, a + 5);
  char first_line[256]; /* the reply's first line, as streamed */
  snprintf(first_line, sizeof first_line, "%.*s", (int)strcspn(ref, "\n"), ref);

  session s;
  if (!start(&s)) {
    TT_CHECK(0, "the chat did not show a prompt");
    stop(&s);
    return;
  }
  /* a line gets a streamed reply: the same text and ids as the piped chat */
  type(&s, "Hello there\r");
  if (strlen(first_line) > 0) EXPECT(&s, first_line);
  EXPECT(&s, "you> ");
  type(&s, "/ids\r");
  REQUIRE(&s, grab(&s, "ids: ", ids_first, sizeof ids_first), "no ids");
  TT_CHECK(!strcmp(ids_first, want), "the interactive reply differs from the piped one:\n%s\n%s", ids_first, want);
  /* /undo, the same line: the same reply */
  type(&s, "/undo\r");
  EXPECT(&s, "[undone: ");
  type(&s, "Hello there\r");
  EXPECT(&s, "you> ");
  char again[4096];
  type(&s, "/ids\r");
  REQUIRE(&s, grab(&s, "ids: ", again, sizeof again), "no ids");
  TT_CHECK(!strcmp(again, ids_first), "the reply after /undo differs");
  /* Ctrl-C during a long generation stops it; the chat goes on */
  type(&s, "/set max_tokens 3000\r");
  EXPECT(&s, "[max_tokens = 3000");
  type(&s, "/set ignore_eos true\r");
  EXPECT(&s, "[ignore_eos = true");
  EXPECT(&s, "you> ");
  type(&s, "Keep talking, please\r");
  size_t before = s.len;
  /* the reply streams in (3000 tokens: still running when some text came;
   * the limit is generous for sanitizer builds on a busy machine) */
  double end = now() + 180;
  while (now() < end && s.len < before + 64) pump(&s, 50);
  REQUIRE(&s, s.len >= before + 64, "no streamed output before Ctrl-C");
  type(&s, "\x03");
  EXPECT(&s, "[interrupted]");
  EXPECT(&s, "you> ");
  type(&s, "/stats\r");
  EXPECT(&s, "last reply: ");
  EXPECT(&s, "interrupted");
  type(&s, "/set max_tokens 6\r");
  EXPECT(&s, "[max_tokens = 6");
  type(&s, "Short again\r");
  EXPECT(&s, "you> ");
  type(&s, "/history\r");
  EXPECT(&s, "user: Short again");
  /* Ctrl-C at the prompt drops the line */
  type(&s, "dropped words");
  usleep(200000);
  type(&s, "\x03");
  EXPECT(&s, "^C");
  EXPECT(&s, "you> ");
  /* /lua: the REPL with the session as s; Ctrl-D comes back */
  type(&s, "/lua\r");
  EXPECT(&s, "[Lua REPL");
  EXPECT(&s, "> ");
  type(&s, "=#s.turns * 1000 + 7\r");
  EXPECT(&s, "\r\n3007\r\n");
  /* Ctrl-C during a say() typed at the REPL stops the reply cleanly (the
   * session polls it; a raised "interrupted" would not even reach compiled
   * code), on a session of its own, without the chat's interrupt callback */
  type(&s, "t = model:session{ seed = 1, max_tokens = 3000, ignore_eos = true }\r");
  EXPECT(&s, "> ");
  type(&s, "r = t:say('Go on')\r");
  before = s.len;
  end = now() + 20;
  while (now() < end && s.len < before + 200) pump(&s, 50);
  REQUIRE(&s, s.len >= before + 200, "no streamed output in the REPL");
  type(&s, "\x03");
  EXPECT(&s, "> ");
  type(&s, "=r.finish_reason .. ' ' .. tostring(r.n_tokens > 0) .. ' ' .. #t.turns .. ' ' .. #s.turns\r");
  EXPECT(&s, "\"interrupted true 1 3\"");
  type(&s, "t:close()\r");
  int back = 0;
  for (int attempt = 0; attempt < 10 && !back; attempt++) {
    usleep(200000);
    type(&s, "\x04");
    back = expect(&s, "[back to the chat]", 2);
  }
  REQUIRE(&s, back, "Ctrl-D in the REPL did not return to the chat");
  EXPECT(&s, "you> ");
  /* /save, then one more exchange: the reference for the new process */
  type(&s, "/save ");
  type(&s, save_path);
  type(&s, "\r");
  EXPECT(&s, "[saved ");
  type(&s, "Final words\r");
  EXPECT(&s, "you> ");
  type(&s, "/ids\r");
  REQUIRE(&s, grab(&s, "ids: ", ids_final, sizeof ids_final), "no ids");
  EXPECT(&s, "you> ");
  TT_CHECK(finish(&s), "Ctrl-D did not end the chat cleanly");
  /* the chat's history has the chat lines, not the REPL's */
  FILE *f = fopen(hist, "r");
  TT_CHECK(f != NULL, "no history file %s", hist);
  if (f) {
    char all[16384];
    size_t n = fread(all, 1, sizeof all - 1, f);
    all[n] = 0;
    fclose(f);
    /* libedit writes spaces as \040 */
    TT_CHECK(strstr(all, "talking,") && strstr(all, "Final"), "history lacks the chat lines: %s", all);
    TT_CHECK(!strstr(all, "#s.turns"), "the REPL's lines went into the chat history: %s", all);
  }
  /* and the REPL's history file has its line, not the chat's */
  f = fopen(repl_hist, "r");
  TT_CHECK(f != NULL, "no REPL history file %s", repl_hist);
  if (f) {
    char all[16384];
    size_t n = fread(all, 1, sizeof all - 1, f);
    all[n] = 0;
    fclose(f);
    TT_CHECK(strstr(all, "#s.turns") && !strstr(all, "talking,"), "REPL history: %s", all);
  }
}

static void load_in_a_new_process(void) {
  TT_CHECK(ids_final[0] != 0, "the first conversation did not finish");
  if (!ids_final[0]) return;
  session s;
  if (!start(&s)) {
    TT_CHECK(0, "the chat did not show a prompt");
    stop(&s);
    return;
  }
  type(&s, "/load ");
  type(&s, save_path);
  type(&s, "\r");
  EXPECT(&s, "[loaded ");
  EXPECT(&s, "(imported)]");
  EXPECT(&s, "you> ");
  /* the settings came back with the session (max_tokens 6, ignore_eos) */
  type(&s, "/set\r");
  EXPECT(&s, "max_tokens = 6");
  EXPECT(&s, "you> ");
  type(&s, "Final words\r");
  EXPECT(&s, "you> ");
  char got[4096];
  type(&s, "/ids\r");
  REQUIRE(&s, grab(&s, "ids: ", got, sizeof got), "no ids");
  TT_CHECK(!strcmp(got, ids_final), "the loaded session continues differently:\n%s\n%s", got, ids_final);
  /* the up arrow recalls a line of the previous chat */
  type(&s, "\x1b[A");
  EXPECT(&s, "/ids");
  type(&s, "\x03");
  EXPECT(&s, "you> ");
  TT_CHECK(finish(&s), "Ctrl-D did not end the chat cleanly");
}

/* The other commands, through the piped chat (no terminal): branches, a
 * sampler file swapped in, settings, peek, inspect, trace, stats, history,
 * an unknown command. */
static void piped_commands(void) {
  if (!model[0] && !setup()) {
    TT_CHECK(0, "no test model");
    return;
  }
  char sampler[1200];
  snprintf(sampler, sizeof sampler, "%s/chat_sampler.lua", tmp);
  FILE *f = fopen(sampler, "w");
  TT_CHECK(f != NULL, "cannot write %s", sampler);
  if (!f) return;
  fputs("return sampling.chain{ sampling.top_k(7), sampling.temperature(0.6), sampling.dist() }\n", f);
  fclose(f);
  char input[2048];
  snprintf(input, sizeof input,
           "Hello there\\n/fork\\nSecond branch\\n/branches\\n/switch 1\\n/branches\\n/sampler %s\\n/set\\n"
           "/set top_p 0.5\\n/peek 3\\n/inspect\\n/inspect 1\\n/trace\\n/stats\\n/history\\n/bogus\\n",
           sampler);
  static char out[1 << 17];
  TT_CHECK(piped(input, out, sizeof out), "piped chat failed: %s", out);
  const char *want[] = {"[branch 2 forked from branch 1 at ", "* 2: ", "* 1: ",
                        "[sampler: top_k(k = 7) -> temperature(t = 0.6) -> dist (reloaded when",
                        "  from file ", "[top_p = 0.5; sampler: ", "top_p(p = 0.5", "\n  1  ", "layer ratio",
                        "4 of 4", "layer 1, ratio 4, window", " mean ", "step ", "(raw logits)", "cache blocks: ",
                        "last reply: ", "user: Hello there", "[unknown command /bogus", NULL};
  const char *at = out;
  for (int i = 0; want[i]; i++) {
    const char *hit = strstr(at, want[i]);
    TT_CHECK(hit != NULL, "piped chat output lacks \"%s\" (in order)", want[i]);
    if (hit) at = hit + strlen(want[i]);
  }
  if (tt_cur_failed) show("piped chat output", out, strlen(out));
}

TT_RUN(TT(conversation), TT(load_in_a_new_process), TT(piped_commands))
