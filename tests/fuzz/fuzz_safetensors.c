/* fuzz_safetensors.c - libFuzzer target for the checkpoint parsers: the
 * input is fed as a whole safetensors file (length prefix included), as a
 * bare header over a data section (config.json has its own target,
 * fuzz_config.c). Nothing may crash, leak (tide's allocation counters
 * return to where they were), or accept a header that breaks the format's
 * invariants. Run: make fuzz, or
 * scripts/fuzz.sh SECONDS safetensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

static void check(const st_header *h, int64_t n_input) {
  for (int64_t i = 0; i < h->n; i++) {
    const st_tensor *t = &h->t[i];
    int64_t numel = 1;
    for (int k = 0; k < t->ndim; k++) numel *= t->shape[k];
    if (!t->name[0] || t->begin < 0 || t->end < t->begin || t->end > h->data_len ||
        t->end - t->begin != numel * tide_dtype_bits(t->dtype) / 8 || t->ndim > 4 || h->data_start + h->data_len > n_input + 65536 + 8)
      abort();
    for (int64_t j = 0; j < i; j++) {
      const st_tensor *u = &h->t[j];
      if (!strcmp(u->name, t->name)) abort();
      if (u->end > u->begin && t->end > t->begin && u->begin < t->end && t->begin < u->end) abort();
    }
  }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
  tide_alloc_stats a, b;
  tide_alloc_stats_get(&a);
  st_header h;
  if (st_parse_image(&h, data, (int64_t)n, "fuzz.safetensors") == TIDE_OK) {
    check(&h, (int64_t)n);
    st_header_free(&h);
  }
  /* the bytes as the header itself (most inputs then reach the JSON scanner) */
  if (n > 0 && n < 1 << 20 && st_parse_header(&h, (const char *)data, (int64_t)n, (int64_t)n + 8 + 65536, "fuzz") == TIDE_OK) {
    check(&h, (int64_t)n);
    st_header_free(&h);
  }
  tide_alloc_stats_get(&b);
  if (b.live_allocs != a.live_allocs || b.live_bytes != a.live_bytes) {
    fprintf(stderr, "fuzz_safetensors: %lld allocations leaked\n", (long long)(b.live_allocs - a.live_allocs));
    abort();
  }
  return 0;
}
