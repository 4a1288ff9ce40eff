/* tt.h - the tiny C test harness: TT_CHECK records a failure with file:line
 * and keeps going; tt_main runs the registered tests and prints
 * "N passed, N failed"; the exit status is nonzero on any failure. */
#ifndef TIDE_TT_H
#define TIDE_TT_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tt_failures, tt_checks, tt_cur_failed;
static const char *tt_cur;

#define TT_CHECK(cond, ...)                                                  \
  do {                                                                       \
    tt_checks++;                                                             \
    if (!(cond)) {                                                           \
      tt_failures++;                                                         \
      tt_cur_failed = 1;                                                     \
      if (tt_failures < 50) {                                                \
        fprintf(stderr, "%s:%d: [%s] check failed: %s: ", __FILE__, __LINE__, tt_cur, #cond); \
        fprintf(stderr, __VA_ARGS__);                                        \
        fprintf(stderr, "\n");                                               \
      }                                                                      \
    }                                                                        \
  } while (0)

/* a tide call that must succeed */
#define TT_OK(expr)                                                          \
  do {                                                                       \
    int tt_rc_ = (expr);                                                     \
    TT_CHECK(tt_rc_ == 0, "%s -> %d (%s)", #expr, tt_rc_, tide_last_error()); \
  } while (0)

/* a tide call that must fail with `status` and a message containing `frag` */
#define TT_FAILS(expr, status, frag)                                         \
  do {                                                                       \
    int tt_rc_ = (expr);                                                     \
    TT_CHECK(tt_rc_ == (status), "%s -> %d, expected %d (%s)", #expr, tt_rc_, (status), tide_last_error()); \
    TT_CHECK(strstr(tide_last_error(), (frag)) != NULL, "message '%s' lacks '%s'", tide_last_error(), (frag)); \
  } while (0)

typedef struct {
  const char *name;
  void (*fn)(void);
} tt_test;

static int tt_main(const tt_test *tests, int n, int argc, char **argv) {
  int passed = 0, failed = 0;
  for (int i = 0; i < n; i++) {
    if (argc > 1 && !strstr(tests[i].name, argv[1])) continue;
    tt_cur = tests[i].name;
    tt_cur_failed = 0;
    tests[i].fn();
    if (tt_cur_failed) {
      failed++;
      fprintf(stderr, "FAIL %s\n", tests[i].name);
    } else {
      passed++;
    }
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

#define TT_RUN(...)                                          \
  int main(int argc, char **argv) {                          \
    static const tt_test tests_[] = {__VA_ARGS__};           \
    return tt_main(tests_, (int)(sizeof tests_ / sizeof tests_[0]), argc, argv); \
  }
#define TT(fn) {#fn, fn}

#endif
