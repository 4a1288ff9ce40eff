/* fuzz_tokenizer_load.c - libFuzzer target for tokenizer.json and
 * tokenizer_config.json. The input is split at its first NUL byte (JSON
 * text holds none): the part before is tokenizer.json, the part after, when
 * there is a NUL, is tokenizer_config.json (none = the file is missing).
 * Both are written to a private directory and loaded as a real checkpoint's
 * tokenizer would be. A refused file is fine; a crash, a sanitizer report
 * or a leak is a finding. A tokenizer that loads must encode and decode a
 * fixed text and the input itself, and answer its vocabulary queries.
 * Run: make fuzz, or scripts/fuzz.sh SECONDS tokenizer_load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tide.h"

static char dir[512], json_path[600], cfg_path[600];

static void put(const char *path, const unsigned char *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
  if (!dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tide-fuzz-tok-%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    mkdir(dir, 0700);
    snprintf(json_path, sizeof json_path, "%s/tokenizer.json", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
  }
  const unsigned char *nul = memchr(data, 0, n);
  size_t nj = nul ? (size_t)(nul - data) : n;
  put(json_path, data, nj);
  if (nul) put(cfg_path, nul + 1, n - nj - 1);
  else unlink(cfg_path);
  tide_alloc_stats a, b;
  tide_alloc_stats_get(&a);
  tide_tokenizer *t = NULL;
  if (tide_tokenizer_load(&t, dir) == TIDE_OK) {
    static const char text[] = "Hello, world! 123 \xe4\xbd\xa0\xe5\xa5\xbd <|end|>\n\t x";
    tide_tok_ids ids = {0};
    tide_tok_text txt = {0};
    if (tide_tokenizer_encode(t, text, (int64_t)sizeof text - 1, TIDE_TOK_ADD_SPECIAL, &ids) == TIDE_OK)
      tide_tokenizer_decode(t, ids.ids, ids.n, 0, &txt);
    if (tide_tokenizer_encode(t, (const char *)data, (int64_t)nj, 0, &ids) == TIDE_OK)
      tide_tokenizer_decode(t, ids.ids, ids.n, TIDE_TOK_SKIP_SPECIAL, &txt);
    int64_t v = tide_tokenizer_vocab_size(t);
    for (int64_t i = 0; i < v && i < 64; i++) {
      const char *p;
      int64_t len = 0;
      if (tide_tokenizer_id_to_token(t, (int32_t)i, &p, &len) == TIDE_OK &&
          tide_tokenizer_token_to_id(t, p, len) < 0)
        abort(); /* every token's text maps back to an id */
      (void)tide_tokenizer_id_to_bytes(t, (int32_t)i, &p, &len);
    }
    (void)tide_tokenizer_chat_template(t);
    (void)tide_tokenizer_describe(t);
    tide_tok_ids_free(&ids);
    tide_tok_text_free(&txt);
    tide_tokenizer_free(t);
  }
  tide_alloc_stats_get(&b);
  if (b.live_allocs != a.live_allocs) {
    fprintf(stderr, "fuzz_tokenizer_load: %lld allocations leaked\n", (long long)(b.live_allocs - a.live_allocs));
    abort();
  }
  return 0;
}
