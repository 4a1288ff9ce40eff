/* test_smoke.c - the harness itself and the library's most basic promises:
 * a version string, error messages that name the function, counters. */
#include "tide.h"
#include "tt.h"

static void version_and_errors(void) {
  TT_CHECK(strlen(tide_version()) > 0, "empty version");
  tide_tensor t;
  memset(&t, 0, sizeof t);
  int64_t shape[2] = {2, -3};
  TT_FAILS(tide_tensor_new(&t, TIDE_F32, 2, shape), TIDE_E_INVALID, "tide_tensor_new");
  TT_FAILS(tide_tensor_new(&t, 99, 2, shape), TIDE_E_INVALID, "bad dtype");
}

static void counters_return_to_zero(void) {
  tide_alloc_stats a, b;
  tide_alloc_stats_get(&a);
  tide_tensor t;
  memset(&t, 0, sizeof t);
  int64_t shape[2] = {16, 16};
  TT_OK(tide_tensor_new(&t, TIDE_BF16, 2, shape));
  tide_alloc_stats_get(&b);
  TT_CHECK(b.live_allocs > a.live_allocs, "no allocation counted");
  tide_tensor_release(&t);
  tide_tensor_release(&t); /* idempotent */
  tide_alloc_stats_get(&b);
  TT_CHECK(b.live_allocs == a.live_allocs && b.live_bytes == a.live_bytes, "leak: %lld allocs", (long long)(b.live_allocs - a.live_allocs));
}

TT_RUN(TT(version_and_errors), TT(counters_return_to_zero))
