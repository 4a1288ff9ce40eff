/* lineedit.c - line editing, history and tab completion for the REPL through
 * libedit's readline interface, exposed to Lua as the module "tide.lineedit".
 *
 * Signals are ours, not libedit's (rl_catch_signals = 0): libedit's own
 * SIGINT handler puts the terminal in cooked mode and re-raises, which left
 * the prompt unusable. Instead the input bytes come through our getc
 * function, which sees read() fail with EINTR: Ctrl-C at the prompt cancels
 * the line (readline() gives back false), SIGWINCH resizes. While a chunk
 * runs, Ctrl-C sets a Lua hook that raises "interrupted" in it. */
#include <editline/readline.h>
#include <errno.h>
#include <lauxlib.h>
#include <locale.h>
#include <poll.h>
#include <lua.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static lua_State *comp_L;
static int comp_ref = LUA_NOREF;
static char **comp_items;
static int comp_n, comp_i;

static volatile sig_atomic_t interrupted;   /* Ctrl-C seen, not yet consumed */
static volatile sig_atomic_t resized;       /* SIGWINCH seen */
static volatile sig_atomic_t hook_armed;    /* a chunk is running: raise in it */
static volatile sig_atomic_t hook_pending;  /* the hook is set and has not fired */
static int line_cancelled;                  /* the last readline ended by Ctrl-C */
static int keys_this_line;                  /* characters read since the prompt */
static lua_State *main_L;

static void free_items(void) {
  for (int i = 0; i < comp_n; i++) free(comp_items[i]);
  free(comp_items);
  comp_items = NULL;
  comp_n = comp_i = 0;
}

static char *generator(const char *text, int state) {
  (void)text;
  if (state == 0) comp_i = 0;
  if (comp_i < comp_n) return strdup(comp_items[comp_i++]);
  return NULL;
}

/* Ask Lua: completer(text, line, start, finish) -> {candidates}. The
 * candidates carry their own suffix ("(" after a function), so libedit adds
 * nothing after a unique match. */
static char **attempt(const char *text, int start, int end) {
  rl_attempted_completion_over = 1;
  rl_completion_append_character = '\0';
  free_items();
  if (!comp_L || comp_ref == LUA_NOREF) return NULL;
  lua_State *L = comp_L;
  int top = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, comp_ref);
  lua_pushstring(L, text);
  lua_pushstring(L, rl_line_buffer ? rl_line_buffer : "");
  lua_pushinteger(L, start);
  lua_pushinteger(L, end);
  if (lua_pcall(L, 4, 1, 0) == 0 && lua_istable(L, -1)) {
    int n = (int)lua_objlen(L, -1);
    comp_items = calloc((size_t)n + 1, sizeof(char *));
    for (int i = 1; comp_items && i <= n; i++) {
      lua_rawgeti(L, -1, i);
      const char *s = lua_tostring(L, -1);
      if (s) {
        char *d = strdup(s);
        if (d) comp_items[comp_n++] = d;
      }
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  if (comp_n == 0) return NULL;
  return rl_completion_matches(text, generator);
}

/* One byte from the terminal, or -2 after Ctrl-C. The signals are blocked
 * except inside ppoll(), so a Ctrl-C that lands between the check of the
 * flag and the wait still wakes the wait. */
static int read_byte(void) {
  sigset_t block, orig;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGWINCH);
  sigprocmask(SIG_BLOCK, &block, &orig);
  int c = EOF;
  for (;;) {
    if (interrupted) {
      c = -2;
      break;
    }
    if (resized) {
      resized = 0;
      rl_resize_terminal();
    }
    struct pollfd p = {0, POLLIN, 0};
    int r = ppoll(&p, 1, NULL, &orig);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    unsigned char b;
    ssize_t n = read(0, &b, 1);
    if (n == 1) c = b;
    else if (n < 0 && errno == EINTR) continue;
    break;
  }
  sigprocmask(SIG_SETMASK, &orig, NULL);
  return c;
}

/* One character for libedit. Multi-byte UTF-8 sequences are decoded here,
 * because libedit stores whatever this returns as one wide character. */
static int tide_getc(FILE *f) {
  (void)f;
  int c = read_byte();
  /* Ctrl-D as the first key ends the input. A Ctrl-D pressed while a chunk
   * ran (terminal in cooked mode) is kept by Linux as an end-of-file mark
   * that reads as a NUL byte once libedit switches to raw mode: the user
   * meant end of input then too. A NUL later in a line is dropped. */
  while (c == 0 && keys_this_line > 0) c = read_byte();
  if ((c == 4 || c == 0) && keys_this_line == 0) return EOF;
  keys_this_line++;
  if (c == -2) {
    /* Ctrl-C: accept the line as it is and mark it cancelled */
    interrupted = 0;
    line_cancelled = 1;
    if (write(1, "^C", 2) < 0) { /* nothing to do about a closed terminal */ }
    return '\n';
  }
  if (c < 0xc0 || c > 0xf7) return c;
  int more = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
  int cp = c & (0x3f >> more);
  for (int i = 0; i < more; i++) {
    int d = read_byte();
    if (d == -2) {
      interrupted = 0;
      line_cancelled = 1;
      return '\n';
    }
    if (d < 0) return EOF;
    if ((d & 0xc0) != 0x80) return 0xfffd;
    cp = (cp << 6) | (d & 0x3f);
  }
  return cp;
}

/* readline([prompt]) -> line | nil at end of input | false after Ctrl-C */
static int l_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "> ");
  if (!isatty(0)) { /* piped input: no editing, no prompt */
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    int c, any = 0;
    while ((c = getchar()) != EOF && c != '\n') {
      luaL_addchar(&b, (char)c);
      any = 1;
    }
    if (c == EOF && !any) return 0;
    luaL_pushresult(&b);
    return 1;
  }
  /* a Ctrl-C pressed since the last chunk ended cancels this line */
  line_cancelled = 0;
  keys_this_line = 0;
  char *s = readline(prompt);
  if (line_cancelled) {
    free(s);
    lua_pushboolean(L, 0);
    return 1;
  }
  if (!s) return 0;
  lua_pushstring(L, s);
  free(s);
  return 1;
}

static int l_add_history(lua_State *L) {
  add_history(luaL_checkstring(L, 1));
  return 0;
}
static int l_read_history(lua_State *L) {
  lua_pushboolean(L, read_history(luaL_checkstring(L, 1)) == 0);
  return 1;
}
static int l_write_history(lua_State *L) {
  lua_pushboolean(L, write_history(luaL_checkstring(L, 1)) == 0);
  return 1;
}
/* clear_history(): forget the lines in memory (the chat and the REPL keep
 * separate histories and swap them when /lua enters the REPL) */
static int l_clear_history(lua_State *L) {
  (void)L;
  clear_history();
  return 0;
}
static int l_stifle(lua_State *L) {
  stifle_history((int)luaL_checkinteger(L, 1));
  return 0;
}
static int l_set_completer(lua_State *L) {
  if (comp_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, comp_ref);
  comp_ref = LUA_NOREF;
  if (lua_isfunction(L, 1)) {
    lua_pushvalue(L, 1);
    comp_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    comp_L = L;
  }
  return 0;
}
static int l_isatty(lua_State *L) {
  lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, 0)));
  return 1;
}

/* ---- Ctrl-C while a chunk runs: the standalone interpreters' approach, a
 * one-shot hook set from the signal handler that raises in the running
 * Lua code at its next call, return or instruction count. ---- */
static void hook_fn(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  hook_pending = 0;
  interrupted = 0;
  luaL_error(L, "interrupted");
}

static void on_sigint(int sig) {
  (void)sig;
  if (hook_armed && hook_pending) {
    /* A second Ctrl-C and the first has not been honoured: the chunk is
     * stuck in machine code (a JIT-compiled loop or a long C call) where
     * hooks do not run. Leave rather than hang. */
    static const char msg[] = "\ntide: interrupted twice, leaving\n";
    if (write(2, msg, sizeof msg - 1) < 0) { /* exiting anyway */ }
    _exit(130);
  }
  interrupted = 1;
  if (hook_armed && main_L) {
    hook_pending = 1;
    lua_sethook(main_L, hook_fn, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  }
}

static void on_sigwinch(int sig) {
  (void)sig;
  resized = 1;
}

/* interrupted() -> true once after each Ctrl-C (clears the flag) */
static int l_interrupted(lua_State *L) {
  int v = interrupted;
  interrupted = 0;
  lua_pushboolean(L, v);
  return 1;
}
/* arm_interrupt(on) -> previous setting: while on, Ctrl-C raises a Lua error
 * "interrupted" in the running chunk; while off it only sets the flag (code
 * that polls interrupted() between steps, as sessions do, turns it off). */
static int l_arm_interrupt(lua_State *L) {
  int on = lua_toboolean(L, 1);
  int was = hook_armed;
  hook_armed = 0;
  if (hook_pending) lua_sethook(main_L ? main_L : L, NULL, 0, 0);
  hook_pending = 0;
  interrupted = 0;
  hook_armed = on;
  lua_pushboolean(L, was);
  return 1;
}

void tide_cli_install_sigint(lua_State *L) {
  main_L = L;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; /* no SA_RESTART: a blocked read() returns EINTR */
  sigaction(SIGINT, &sa, NULL);
}

int luaopen_tide_lineedit(lua_State *L) {
  static const luaL_Reg fns[] = {{"readline", l_readline},       {"add_history", l_add_history},
                                 {"read_history", l_read_history}, {"write_history", l_write_history},
                                 {"stifle", l_stifle},           {"set_completer", l_set_completer},
                                 {"isatty", l_isatty},           {"interrupted", l_interrupted},
                                 {"arm_interrupt", l_arm_interrupt}, {"clear_history", l_clear_history},
                                 {NULL, NULL}};
  /* libedit encodes what it displays with the C library's multibyte
   * functions: make sure they speak UTF-8 (character classes only). */
  const char *loc = setlocale(LC_CTYPE, "");
  if (!loc || !strcmp(loc, "C") || !strcmp(loc, "POSIX")) setlocale(LC_CTYPE, "C.UTF-8");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigwinch;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGWINCH, &sa, NULL);
  rl_readline_name = "tide";
  rl_catch_signals = 0;
  rl_getc_function = tide_getc;
  rl_attempted_completion_function = attempt;
  rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,+-*/%^~#[]";
  rl_completer_word_break_characters = (char *)rl_basic_word_break_characters;
  using_history();
  lua_newtable(L);
  luaL_register(L, NULL, fns);
  return 1;
}
