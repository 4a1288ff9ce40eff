/* fuzz_config.c - libFuzzer target for config.json: any bytes either parse
 * into a config or are refused with an error. An accepted config must give
 * a well-formed tensor inventory (checked when the model is small enough to
 * list), and nothing may leak (tide's allocation counters return to where
 * they were). Run: make fuzz, or scripts/fuzz.sh SECONDS config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tide.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
  tide_alloc_stats a, b;
  tide_alloc_stats_get(&a);
  tide_config cfg;
  if (tide_config_parse(&cfg, (const char *)data, (int64_t)n, "fuzz/config.json") == TIDE_OK) {
    if (cfg.num_hidden_layers < 1 || cfg.hidden_size < 1 || cfg.vocab_size < 1) abort();
    tide_tensor_spec *sp;
    int64_t ns;
    if (cfg.num_hidden_layers * (int64_t)(cfg.n_routed_experts + 1) < 4096 &&
        tide_config_inventory(&cfg, &sp, &ns) == TIDE_OK) {
      for (int64_t i = 0; i < ns; i++) {
        if (!sp[i].name[0] || sp[i].ndim < 1 || sp[i].ndim > 2) abort();
        for (int k = 0; k < sp[i].ndim; k++)
          if (sp[i].shape[k] < 1) abort();
      }
      tide_free(sp);
    }
  }
  tide_alloc_stats_get(&b);
  if (b.live_allocs != a.live_allocs || b.live_bytes != a.live_bytes) {
    fprintf(stderr, "fuzz_config: %lld allocations leaked\n", (long long)(b.live_allocs - a.live_allocs));
    abort();
  }
  return 0;
}
