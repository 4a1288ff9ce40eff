/* lineedit.c - line editing, history and tab completion for the REPL through
 * libedit's readline interface, exposed to Lua as the module "tide.lineedit".
 * Completion asks a Lua function for candidates; Ctrl-C sets a flag (and a
 * Lua hook) so a long-running chunk or a generation loop can stop. */
#include <editline/readline.h>
#include <lauxlib.h>
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
static volatile sig_atomic_t interrupted;
static lua_State *main_L;
static int hook_armed;

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

/* Ask Lua: completer(text, line, start, finish) -> {candidates} */
static char **attempt(const char *text, int start, int end) {
  rl_attempted_completion_over = 1;
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
      if (s) comp_items[comp_n++] = strdup(s);
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  if (comp_n == 0) return NULL;
  if (comp_n > 1) rl_completion_append_character = '\0';
  return rl_completion_matches(text, generator);
}

static int l_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "> ");
  if (!isatty(0)) { /* piped input: no editing, no echo of the prompt */
    char line[65536];
    if (!fgets(line, sizeof line, stdin)) return 0;
    size_t n = strlen(line);
    if (n && line[n - 1] == '\n') line[--n] = 0;
    lua_pushlstring(L, line, n);
    return 1;
  }
  char *s = readline(prompt);
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

/* ---- Ctrl-C: a flag, plus (when armed) a hook that raises in running Lua ---- */
static void hook_fn(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  interrupted = 0;
  luaL_error(L, "interrupted");
}
static void on_sigint(int sig) {
  (void)sig;
  interrupted = 1;
  if (hook_armed && main_L) lua_sethook(main_L, hook_fn, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}
/* interrupted() -> true once after each Ctrl-C (clears the flag) */
static int l_interrupted(lua_State *L) {
  int v = interrupted;
  interrupted = 0;
  lua_pushboolean(L, v);
  return 1;
}
/* arm_interrupt(on): while on, Ctrl-C raises a Lua error "interrupted" in the
 * running chunk; while off it only sets the flag. */
static int l_arm_interrupt(lua_State *L) {
  hook_armed = lua_toboolean(L, 1);
  if (!hook_armed) lua_sethook(L, NULL, 0, 0);
  interrupted = 0;
  return 0;
}

void tide_cli_install_sigint(lua_State *L) {
  main_L = L;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

int luaopen_tide_lineedit(lua_State *L) {
  static const luaL_Reg fns[] = {{"readline", l_readline},       {"add_history", l_add_history},
                                 {"read_history", l_read_history}, {"write_history", l_write_history},
                                 {"stifle", l_stifle},           {"set_completer", l_set_completer},
                                 {"isatty", l_isatty},           {"interrupted", l_interrupted},
                                 {"arm_interrupt", l_arm_interrupt}, {NULL, NULL}};
  rl_readline_name = "tide";
  rl_attempted_completion_function = attempt;
  rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,+-*/%^~#[]";
  rl_completer_word_break_characters = (char *)rl_basic_word_break_characters;
  using_history();
  lua_newtable(L);
  luaL_register(L, NULL, fns);
  return 1;
}
