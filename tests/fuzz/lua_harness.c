/* lua_harness.c - libFuzzer driver for tide's Lua-side parsers. It embeds
 * LuaJIT with the tide modules on package.path and libtide (instrumented)
 * linked in, loads tests/fuzz/fuzz_NAME.lua (FUZZ_LUA_TARGET, set per
 * executable by CMake), which returns a function, and calls that function
 * with every input as a Lua string.
 *
 * A Lua error is a rejected input and is fine. A crash, an abort (a target
 * reports a broken invariant with the global fuzz_fail(message)), a
 * sanitizer report, a hang (libFuzzer -timeout) or a C allocation that
 * outlives its input (checked after a full garbage collection, twice, so
 * one-time caches are not counted) is a finding.
 *
 * LuaJIT itself is not instrumented, so the C counters alone would be blind
 * to the Lua code. A line hook feeds libFuzzer's extra-counters section with
 * (previous line, current line) pairs of the Lua source, which gives the
 * Lua parsers edge coverage of their own. The JIT is off (hooks only run in
 * the interpreter, and the runs stay deterministic). TIDE_FUZZ_VERBOSE=1
 * prints why each refused input was refused (to check seeds). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

#include "tide.h"

#define COV_BITS 16
__attribute__((section("__libfuzzer_extra_counters"), used)) static uint8_t lua_cov[1 << COV_BITS];

static lua_State *L;
static int fn_ref = LUA_NOREF;
static uint32_t prev_loc;
static int verbose; /* $TIDE_FUZZ_VERBOSE: print why each input was refused */

static void line_hook(lua_State *l, lua_Debug *ar) {
  if (ar->event != LUA_HOOKLINE || !lua_getinfo(l, "S", ar)) return;
  uint64_t h = (uint64_t)(uintptr_t)ar->source * 0x9E3779B97F4A7C15ull ^ (uint64_t)ar->currentline * 0xC2B2AE3D27D4EB4Full;
  uint32_t loc = (uint32_t)(h >> (64 - COV_BITS));
  uint8_t *c = &lua_cov[(loc ^ prev_loc) & ((1u << COV_BITS) - 1)];
  if (*c < 255) (*c)++;
  prev_loc = loc >> 1;
}

static void close_lua(void) {
  if (!L) return;
  lua_sethook(L, NULL, 0, 0);
  lua_close(L);
  L = NULL;
}

static void die(const char *what) {
  fprintf(stderr, "lua_harness: %s: %s\n", what, lua_tostring(L, -1));
  abort();
}

/* fuzz_fail(message): a broken invariant, a finding (not a refused input) */
static int l_fuzz_fail(lua_State *l) {
  fprintf(stderr, "fuzz_%s: FINDING: %s\n", FUZZ_LUA_TARGET, luaL_optstring(l, 1, "(no message)"));
  abort();
  return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  L = luaL_newstate();
  if (!L) abort();
  const char *v = getenv("TIDE_FUZZ_VERBOSE");
  verbose = v && *v && *v != '0';
  luaL_openlibs(L);
  lua_register(L, "fuzz_fail", l_fuzz_fail);
  luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  const char *root = getenv("TIDE_SOURCE_DIR");
  if (!root || !*root) root = TIDE_SOURCE_DIR;
  char buf[4096];
  lua_getglobal(L, "package");
  snprintf(buf, sizeof buf, "%s/lua/?.lua;%s/lua/?/init.lua;%s/tests/fuzz/?.lua;", root, root, root);
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s%s", buf, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
  /* the tide modules find the (already linked) library through _TIDE_EXE */
  lua_newtable(L);
  snprintf(buf, sizeof buf, "%s/lua", root);
  lua_pushstring(L, buf);
  lua_setfield(L, -2, "lua_dir");
  lua_pushstring(L, TIDE_LIB_PATH);
  lua_setfield(L, -2, "lib_path");
  lua_setglobal(L, "_TIDE_EXE");
  snprintf(buf, sizeof buf, "%s/tests/fuzz/fuzz_%s.lua", root, FUZZ_LUA_TARGET);
  if (luaL_loadfile(L, buf) != 0) die("load");
  if (lua_pcall(L, 0, 1, 0) != 0) die("init");
  if (!lua_isfunction(L, -1)) {
    fprintf(stderr, "lua_harness: %s does not return a function\n", buf);
    abort();
  }
  fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  /* LeakSanitizer does not see LuaJIT's heap: what only Lua still holds at
   * exit (the models) would be reported as leaked, so the state is closed
   * first (atexit runs this before the sanitizer's own check) */
  atexit(close_lua);
  lua_gc(L, LUA_GCCOLLECT, 0);
  lua_sethook(L, line_hook, LUA_MASKLINE, 0);
  return 0;
}

static int64_t live_allocs(void) {
  tide_alloc_stats s;
  tide_alloc_stats_get(&s);
  return s.live_allocs;
}

static void run(const uint8_t *data, size_t n) {
  prev_loc = 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
  lua_pushlstring(L, (const char *)data, n);
  if (lua_pcall(L, 1, 0, 0) != 0 && verbose) { /* an error = the input was refused */
    const char *m = lua_tostring(L, -1);
    if (!m && lua_istable(L, -1)) { /* a tide user error: { msg = ... } */
      lua_getfield(L, -1, "msg");
      m = lua_tostring(L, -1);
    }
    fprintf(stderr, "fuzz_%s: refused: %s\n", FUZZ_LUA_TARGET, m ? m : "(no message)");
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT, 0);
  lua_gc(L, LUA_GCCOLLECT, 0); /* finalizers queued by the first pass */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  int64_t before = live_allocs();
  run(data, n);
  int64_t after = live_allocs();
  if (after > before) {
    /* a cache filled on first use is fine; growth on a repeat is a leak */
    run(data, n);
    int64_t again = live_allocs();
    if (again > after) {
      fprintf(stderr, "lua_harness: fuzz_%s leaks %lld tide allocations per run\n", FUZZ_LUA_TARGET,
              (long long)(again - after));
      abort();
    }
  }
  return 0;
}
