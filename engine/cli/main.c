/* main.c - the `tide` command: an embedded LuaJIT that runs lua/tide/cli.lua.
 * Everything the command does (REPL, scripts, subcommands) is Lua; this file
 * only sets up package.path, a SIGINT hook, and line editing (lineedit.c). */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tide.h"

int luaopen_tide_lineedit(lua_State *L);
void tide_cli_install_sigint(lua_State *L);

#ifndef TIDE_LUA_DIR
#define TIDE_LUA_DIR "lua"
#endif
/* How long idle OpenMP threads spin before they sleep (docs/design.md §6):
 * libgomp reads GOMP_SPINCOUNT once, when it is loaded. lua/tide/ffi.lua sets
 * it before it loads libtide (and with it libgomp); keep the two values equal. */
#define TIDE_DEFAULT_SPINCOUNT "10000"

#ifndef TIDE_LIB_PATH
#define TIDE_LIB_PATH "libtide.so"
#endif

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static void prepend_path(lua_State *L, const char *field, const char *dirs) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, field);
  const char *old = lua_tostring(L, -1);
  lua_pushfstring(L, "%s;%s", dirs, old ? old : "");
  lua_setfield(L, -3, field);
  lua_pop(L, 2);
}

/* Unless the user chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT), give libgomp
 * tide's spin count. When the executable was linked against libtide (some
 * builds keep the link, e.g. with sanitizers), libgomp has already read its
 * environment before main: then run this program again with the variable
 * set, once (the variable is then set, so there is no loop). */
static void set_spin_default(char **argv) {
  const char *policy = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
  if ((policy && *policy) || (spin && *spin)) return;
  if (setenv("GOMP_SPINCOUNT", TIDE_DEFAULT_SPINCOUNT, 0) != 0) return;
  void *gomp = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!gomp) return; /* not loaded yet: lua/tide/ffi.lua loads it after this */
  dlclose(gomp);
  execv("/proc/self/exe", argv);
  /* exec failed: go on with libgomp's own setting */
}

int main(int argc, char **argv) {
  set_spin_default(argv);
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "tide: cannot create a Lua state (out of memory)\n");
    return 1;
  }
  luaL_openlibs(L);

  const char *lua_dir = getenv("TIDE_LUA_DIR");
  if (!lua_dir || !*lua_dir) lua_dir = TIDE_LUA_DIR;
  char buf[8192];
  snprintf(buf, sizeof buf, "%s/?.lua;%s/?/init.lua", lua_dir, lua_dir);
  prepend_path(L, "path", buf);

  /* facts the Lua side needs to find itself and the library */
  lua_newtable(L);
  lua_pushstring(L, lua_dir);
  lua_setfield(L, -2, "lua_dir");
  lua_pushstring(L, TIDE_LIB_PATH);
  lua_setfield(L, -2, "lib_path");
  lua_pushstring(L, argv[0]);
  lua_setfield(L, -2, "exe");
  lua_setglobal(L, "_TIDE_EXE");

  /* line editing as a preloaded module */
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_tide_lineedit);
  lua_setfield(L, -2, "tide.lineedit");
  lua_pop(L, 2);

  tide_cli_install_sigint(L);

  /* require("tide.cli").main(argv) */
  lua_pushcfunction(L, traceback);
  int tb = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "tide.cli");
  int rc = lua_pcall(L, 1, 1, tb);
  if (rc == 0) {
    lua_getfield(L, -1, "main");
    lua_newtable(L);
    for (int i = 0; i < argc; i++) {
      lua_pushstring(L, argv[i]);
      lua_rawseti(L, -2, i);
    }
    rc = lua_pcall(L, 1, 1, tb);
  }
  int status = 0;
  if (rc != 0) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "tide: %s\n", msg ? msg : "(error)");
    status = 1;
  } else if (lua_isnumber(L, -1)) {
    status = (int)lua_tointeger(L, -1);
  }
  lua_close(L);
  return status;
}
