/* test_checkpoint.c - safetensors parsing and writing, checkpoint opening,
 * the config, the model check, the quantisers and generators (AVX2 vs
 * scalar reference, thread invariance), pre-faulting, and corrupted input:
 * every bad file gives an error naming the file (and the tensor), nothing
 * crashes or leaks. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "ckpt_quant.h"
#include "tt.h"

static char tmpdir[900];

static const char *tmp(const char *name) {
  static char buf[8][1200];
  static int k;
  char *b = buf[k++ & 7];
  snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
  return b;
}

static void setup(void) {
  const char *t = getenv("TIDE_TEST_TMP");
  snprintf(tmpdir, sizeof tmpdir, "%s/ckpt_test_%d", t && *t ? t : "/tmp", (int)getpid());
  mkdir(tmpdir, 0755);
}

static int64_t live(void) {
  tide_alloc_stats s;
  tide_alloc_stats_get(&s);
  return s.live_allocs + s.live_storages * 1000 + s.live_maps * 1000000;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) { perror(path); exit(1); }
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

/* a safetensors file from a header text and `data` bytes of zeros */
static void write_st(const char *path, const char *json, int64_t data) {
  size_t n = strlen(json);
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)n >> (8 * i));
  FILE *f = fopen(path, "wb");
  fwrite(len8, 1, 8, f);
  fwrite(json, 1, n, f);
  for (int64_t i = 0; i < data; i++) fputc(i & 0xff, f);
  fclose(f);
}

static int msg_has(const char *a, const char *b) {
  const char *m = tide_last_error();
  return strstr(m, a) && (!b || strstr(m, b));
}

/* opening `path` fails with `status` and a message naming `a` and `b` */
#define OPEN_FAILS(path, flags, status, a, b)                                                         \
  do {                                                                                                \
    tide_ckpt *ck_ = (tide_ckpt *)1;                                                                   \
    int rc_ = tide_ckpt_open(&ck_, (path), (flags));                                                   \
    TT_CHECK(rc_ == (status), "%s: rc %d, expected %d (%s)", (path), rc_, (status), tide_last_error()); \
    TT_CHECK(ck_ == NULL, "out not cleared");                                                          \
    TT_CHECK(msg_has((a), (b)), "message '%s' lacks '%s' / '%s'", tide_last_error(), (a), (b) ? (b) : ""); \
  } while (0)

/* ---- the header parser on crafted files ---- */
static void test_bad_headers(void) {
  int64_t base = live();
  const char *p = tmp("bad.safetensors");
  struct { const char *json; int64_t data; int status; const char *frag; const char *tensor; } cases[] = {
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, TIDE_E_FORMAT, "truncated", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1,7]}}", 8, TIDE_E_FORMAT, "negative", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.5,8]}}", 8, TIDE_E_FORMAT, "not an integer", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 8, TIDE_E_FORMAT, "not an integer", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8e0]}}", 8, TIDE_E_FORMAT, "not an integer", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[00,8]}}", 8, TIDE_E_FORMAT, "leading zero", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8, TIDE_E_FORMAT, "past the data", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[99999999999999999,8]}}", 8, TIDE_E_FORMAT, "too large", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, TIDE_E_FORMAT, "end before", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 9, TIDE_E_FORMAT, "[begin, end]", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 9, TIDE_E_FORMAT, "[begin, end]", "'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, TIDE_E_FORMAT, "needs 12", "'a'"},
      {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, TIDE_E_FORMAT, "needs 8", "'a'"},
      {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, TIDE_E_FORMAT, "unknown dtype", "'a'"},
      {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, TIDE_E_UNSUPPORTED, "F64", "'a'"},
      {"{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 8, TIDE_E_FORMAT, "not a string", "'a'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 8, TIDE_E_UNSUPPORTED, "dims", "'a'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 8, TIDE_E_FORMAT, "negative", "'a'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}", 8, TIDE_E_FORMAT, "overflow",
       "'a'"},
      {"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 8, TIDE_E_FORMAT, "whole number of bytes", "'a'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":\"2\",\"data_offsets\":[0,2]}}", 8, TIDE_E_FORMAT, "not an array", "'a'"},
      {"{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,2]}}", 8, TIDE_E_FORMAT, "no \"shape\"", "'a'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2]}}", 8, TIDE_E_FORMAT, "no \"data_offsets\"", "'a'"},
      {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,2]}}", 8, TIDE_E_FORMAT, "no \"dtype\"", "'a'"},
      {"{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 8, TIDE_E_FORMAT, "twice", "'a'"},
      {"{\"a\":[1,2]}", 8, TIDE_E_FORMAT, "not a JSON object", "'a'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],"
       "\"data_offsets\":[2,6]}}", 8, TIDE_E_FORMAT, "overlap", "'b'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"U8\",\"shape\":[4],"
       "\"data_offsets\":[4,8]}}", 8, TIDE_E_FORMAT, "twice", "'a'"},
      {"{\"__metadata__\":{\"k\":1}}", 8, TIDE_E_FORMAT, "not a string", "'k'"},
      {"{\"__metadata__\":[]}", 8, TIDE_E_FORMAT, "__metadata__", NULL},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", 8, TIDE_E_FORMAT, "twice", NULL},
      {"{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 8, TIDE_E_FORMAT, "empty name", NULL},
      {"{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 8, TIDE_E_FORMAT, "\\u0000", NULL},
      {"{\"a\\ud800\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 8, TIDE_E_FORMAT, "surrogate", NULL},
      {"{\"a\\q\":{}}", 8, TIDE_E_FORMAT, "bad escape", NULL},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 8, TIDE_E_FORMAT, "not valid JSON", NULL},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}} x", 8, TIDE_E_FORMAT, "text after", NULL},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],}}", 8, TIDE_E_FORMAT, "not valid JSON", NULL},
      {"{\"a\" {}}", 8, TIDE_E_FORMAT, "expected ':'", NULL},
      {"[]", 8, TIDE_E_FORMAT, "expected '{'", NULL},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":[1,{\"y\":tru]}}", 8, TIDE_E_FORMAT, "JSON", NULL},
      {"{\"a\x01\":{}}", 8, TIDE_E_FORMAT, "UTF-8", NULL},
      {"{\"a\xc3\x28\":{}}", 8, TIDE_E_FORMAT, "UTF-8", NULL},
      {"{\"a\xed\xa0\x80\":{}}", 8, TIDE_E_FORMAT, "UTF-8", NULL}, /* an encoded surrogate */
      {"{", 8, TIDE_E_FORMAT, "JSON", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_st(p, cases[i].json, cases[i].data);
    tide_ckpt *ck = NULL;
    int rc = tide_ckpt_open(&ck, p, 0);
    TT_CHECK(rc == cases[i].status, "case %zu (%s): rc %d, expected %d: %s", i, cases[i].json, rc, cases[i].status,
             tide_last_error());
    TT_CHECK(msg_has(p, cases[i].frag), "case %zu: message '%s' lacks the file or '%s'", i, tide_last_error(),
             cases[i].frag);
    if (cases[i].tensor) TT_CHECK(msg_has(cases[i].tensor, NULL), "case %zu: '%s' lacks the tensor %s", i,
                                  tide_last_error(), cases[i].tensor);
    TT_CHECK(ck == NULL, "case %zu: handle returned", i);
    tide_ckpt_free(ck);
  }
  /* valid oddities are accepted: extra keys, gaps, trailing bytes, empty tensors, unicode names */
  write_st(p, "{\"__metadata__\":{\"format\":\"pt\"},\"b\\u00e9\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[2],"
              "\"data_offsets\":[4,6],\"extra\":{\"x\":[1,-2.5e3,null,true]}},\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],"
              "\"data_offsets\":[5,5]},\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[8,12]}}   ", 16);
  tide_ckpt *ck = NULL;
  TT_OK(tide_ckpt_open(&ck, p, 0));
  TT_CHECK(tide_ckpt_count(ck) == 3, "count %lld", (long long)tide_ckpt_count(ck));
  TT_CHECK(tide_ckpt_find(ck, "b\xc3\xa9\xf0\x9f\x98\x80") >= 0, "unicode name not decoded");
  tide_tensor t = {0};
  TT_OK(tide_ckpt_tensor(ck, "s", &t));
  int32_t sv;
  memcpy(&sv, t.data, 4); /* this file's data section is not aligned */
  TT_CHECK(t.ndim == 0 && tide_tensor_numel(&t) == 1 && sv == (int32_t)0x0b0a0908, "scalar read");
  tide_tensor_release(&t);
  TT_OK(tide_ckpt_tensor(ck, "z", &t));
  TT_CHECK(tide_tensor_numel(&t) == 0 && t.sizes[1] == 3, "empty tensor");
  tide_tensor_release(&t);
  tide_ckpt_free(ck);
  /* files that are too short, or whose header length runs past the end */
  write_bytes(p, "\x05\0\0\0", 4);
  OPEN_FAILS(p, 0, TIDE_E_FORMAT, p, "too short");
  write_bytes(p, "\xff\0\0\0\0\0\0\0{}", 10);
  OPEN_FAILS(p, 0, TIDE_E_FORMAT, p, "past the end");
  write_bytes(p, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
  OPEN_FAILS(p, 0, TIDE_E_FORMAT, p, "past the end");
  write_bytes(p, "\x01\0\0\0\0\0\0\0{", 9);
  OPEN_FAILS(p, 0, TIDE_E_FORMAT, p, "cannot hold");
  OPEN_FAILS(tmp("nope.safetensors"), 0, TIDE_E_IO, "nope.safetensors", NULL);
  unlink(p);
  TT_CHECK(live() == base, "leak: %lld", (long long)(live() - base));
}

/* deterministic byte mutations of a valid header never crash or leak */
static void test_mutations(void) {
  int64_t base = live();
  const char *good = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                     "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}";
  size_t n = strlen(good);
  uint8_t img[512];
  int accepted = 0;
  uint64_t r = 12345;
  for (int it = 0; it < 4000; it++) {
    memset(img, 0, sizeof img);
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(img + 8, good, n);
    int muts = 1 + it % 3;
    for (int m = 0; m < muts; m++) {
      r = r * 6364136223846793005ULL + 1442695040888963407ULL;
      size_t at = (size_t)(r >> 33) % (8 + n);
      img[at] = (uint8_t)(r >> 13);
    }
    st_header h;
    int rc = st_parse_image(&h, img, (int64_t)(8 + n + 24), "mut");
    if (rc == TIDE_OK) {
      accepted++;
      for (int64_t i = 0; i < h.n; i++)
        TT_CHECK(h.t[i].end <= h.data_len && h.t[i].begin <= h.t[i].end, "accepted a bad range");
      st_header_free(&h);
    } else {
      TT_CHECK(strstr(tide_last_error(), "mut") != NULL, "error lacks the file: %s", tide_last_error());
    }
  }
  TT_CHECK(accepted > 0 && accepted < 4000, "accepted %d of 4000", accepted);
  TT_CHECK(live() == base, "leak: %lld", (long long)(live() - base));
}

/* ---- the writer ---- */
static void fill_seq(tide_tensor *t) {
  int64_t n = tide_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) tide_store_elem(t, i, (double)((i * 7) % 23) - 11.0);
}

static void test_writer_roundtrip(void) {
  int64_t base = live();
  const char *p = tmp("rt.safetensors");
  int dts[] = {TIDE_F32, TIDE_BF16, TIDE_F16, TIDE_F8E4M3, TIDE_E8M0, TIDE_FP4, TIDE_I8, TIDE_U8, TIDE_I32, TIDE_I64};
  tide_tensor ts[10];
  char names[10][32];
  tide_st_writer *w;
  TT_OK(tide_st_writer_new(&w, p));
  TT_OK(tide_st_writer_meta(w, "format", "pt"));
  TT_OK(tide_st_writer_meta(w, "note", "quote \" and \\ and \n"));
  for (int i = 0; i < 10; i++) {
    int64_t shape[2] = {3, 2 * (i + 1)};
    memset(&ts[i], 0, sizeof ts[i]);
    TT_OK(tide_tensor_new(&ts[i], dts[i], 2, shape));
    fill_seq(&ts[i]);
    snprintf(names[i], sizeof names[i], "t.%s", tide_dtype_name(dts[i]));
    TT_OK(tide_st_writer_declare(w, names[i], dts[i], 2, shape));
  }
  /* a transposed (non-contiguous) view and a scalar */
  tide_tensor src = {0}, tr = {0}, sc = {0};
  int64_t s2[2] = {40, 300000};
  TT_OK(tide_tensor_new(&src, TIDE_F32, 2, s2));
  fill_seq(&src);
  TT_OK(tide_tensor_transpose(&tr, &src, 0, 1));
  int64_t trs[2] = {300000, 40};
  TT_OK(tide_st_writer_declare(w, "transposed", TIDE_F32, 2, trs));
  TT_OK(tide_tensor_new(&sc, TIDE_I64, 0, NULL));
  *(int64_t *)sc.data = -42;
  TT_OK(tide_st_writer_declare(w, "scalar", TIDE_I64, 0, NULL));
  TT_OK(tide_st_writer_declare(w, "empty", TIDE_BF16, 2, (int64_t[]){0, 7}));
  /* misuse */
  TT_FAILS(tide_st_writer_declare(w, names[0], TIDE_F32, 1, (int64_t[]){1}), TIDE_E_INVALID, "twice");
  TT_FAILS(tide_st_writer_declare(w, "__metadata__", TIDE_F32, 1, (int64_t[]){1}), TIDE_E_INVALID, "not a tensor");
  TT_FAILS(tide_st_writer_declare(w, "odd", TIDE_FP4, 1, (int64_t[]){3}), TIDE_E_INVALID, "odd");
  TT_FAILS(tide_st_writer_write(w, "nope", &ts[0]), TIDE_E_INVALID, "not declared");
  TT_FAILS(tide_st_writer_write(w, names[1], &ts[0]), TIDE_E_INVALID, names[1]);
  for (int i = 0; i < 10; i++) TT_OK(tide_st_writer_write(w, names[i], &ts[i]));
  TT_FAILS(tide_st_writer_write(w, names[0], &ts[0]), TIDE_E_STATE, "twice");
  TT_FAILS(tide_st_writer_declare(w, "late", TIDE_F32, 1, (int64_t[]){1}), TIDE_E_STATE, "after the first write");
  TT_FAILS(tide_st_writer_finish(w, 0), TIDE_E_STATE, "never written");
  TT_OK(tide_st_writer_write(w, "transposed", &tr));
  TT_OK(tide_st_writer_write(w, "scalar", &sc));
  tide_tensor em = {0};
  TT_OK(tide_tensor_new(&em, TIDE_BF16, 2, (int64_t[]){0, 7}));
  TT_OK(tide_st_writer_write(w, "empty", &em));
  TT_CHECK(access(p, F_OK) != 0, "the file appears before finish");
  TT_OK(tide_st_writer_finish(w, 0));
  tide_st_writer_free(w);
  /* read back */
  tide_ckpt *ck;
  TT_OK(tide_ckpt_open(&ck, p, 0));
  TT_CHECK(tide_ckpt_count(ck) == 13, "count %lld", (long long)tide_ckpt_count(ck));
  for (int i = 0; i < 10; i++) {
    tide_tensor t = {0};
    TT_OK(tide_ckpt_tensor(ck, names[i], &t));
    TT_CHECK(t.dtype == dts[i] && t.ndim == 2 && t.sizes[0] == 3 && t.sizes[1] == 2 * (i + 1) && t.readonly,
             "%s: header", names[i]);
    TT_CHECK(!memcmp(t.data, ts[i].data, (size_t)tide_tensor_nbytes(&t)), "%s: bytes differ", names[i]);
    TT_CHECK(((uintptr_t)t.data) % (uintptr_t)(tide_dtype_bits(dts[i]) >= 8 ? tide_dtype_bits(dts[i]) / 8 : 1) == 0,
             "%s: misaligned", names[i]);
    tide_tensor_release(&t);
  }
  tide_tensor t = {0};
  TT_OK(tide_ckpt_tensor(ck, "transposed", &t));
  int ok = 1;
  for (int64_t i = 0; i < 300000 && ok; i += 977)
    for (int64_t j = 0; j < 40; j++) ok &= ((float *)t.data)[i * 40 + j] == ((float *)src.data)[j * 300000 + i];
  TT_CHECK(ok, "transposed tensor not written in logical order");
  tide_tensor_release(&t);
  TT_OK(tide_ckpt_tensor(ck, "scalar", &t));
  TT_CHECK(t.ndim == 0 && *(int64_t *)t.data == -42, "scalar");
  tide_tensor_release(&t);
  tide_ckpt_shard_info si;
  TT_OK(tide_ckpt_shard_at(ck, 0, &si));
  TT_CHECK(si.metadata_json && strstr(si.metadata_json, "\"format\":\"pt\"") &&
               strstr(si.metadata_json, "quote \\\" and \\\\ and \\n"),
           "metadata %s", si.metadata_json ? si.metadata_json : "(null)");
  tide_ckpt_free(ck);
  /* what Hugging Face's reader demands: header a multiple of 8, ranges sorted by
   * offset covering [0, data) exactly, __metadata__ first, dtype-then-name order */
  int fd = open(p, O_RDONLY);
  struct stat st;
  fstat(fd, &st);
  uint8_t *img = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  st_header h;
  TT_OK(st_parse_image(&h, img, st.st_size, p));
  TT_CHECK(h.header_len % 8 == 0, "header %lld not padded to 8", (long long)h.header_len);
  TT_CHECK(!memcmp(img + 8, "{\"__metadata__\":", 16), "__metadata__ not first");
  int64_t at = 0;
  int prev_bits = 64;
  for (int64_t i = 0; i < h.n; i++) { /* header order = offset order here */
    TT_CHECK(h.t[i].begin == at, "gap or disorder before %s", h.t[i].name);
    TT_CHECK(tide_dtype_bits(h.t[i].dtype) <= prev_bits, "dtype order broken at %s", h.t[i].name);
    if (tide_dtype_bits(h.t[i].dtype) >= 8)
      TT_CHECK((h.data_start + h.t[i].begin) % (tide_dtype_bits(h.t[i].dtype) / 8) == 0, "%s unaligned", h.t[i].name);
    prev_bits = tide_dtype_bits(h.t[i].dtype);
    at = h.t[i].end;
  }
  TT_CHECK(h.data_start + at == st.st_size, "data does not end at EOF");
  st_header_free(&h);
  munmap(img, (size_t)st.st_size);
  /* an unfinished writer leaves nothing behind */
  const char *p2 = tmp("never.safetensors");
  TT_OK(tide_st_writer_new(&w, p2));
  TT_OK(tide_st_writer_declare(w, "x", TIDE_F32, 1, (int64_t[]){4}));
  tide_st_writer_free(w);
  char tmpname[1300];
  snprintf(tmpname, sizeof tmpname, "%s.tmp-%d", p2, (int)getpid());
  TT_CHECK(access(p2, F_OK) != 0 && access(tmpname, F_OK) != 0, "unfinished writer left a file");
  TT_FAILS(tide_st_writer_new(&w, "/nonexistent-dir/x.safetensors"), TIDE_E_IO, "/nonexistent-dir/x.safetensors");
  for (int i = 0; i < 10; i++) tide_tensor_release(&ts[i]);
  tide_tensor_release(&src);
  tide_tensor_release(&tr);
  tide_tensor_release(&sc);
  tide_tensor_release(&em);
  unlink(p);
  TT_CHECK(live() == base, "leak: %lld", (long long)(live() - base));
}

/* ---- the config ---- */
static const char *TINY =
    "{\"architectures\":[\"DeepseekV4ForCausalLM\"],\"model_type\":\"deepseek_v4\",\"vocab_size\":64,"
    "\"hidden_size\":64,\"num_hidden_layers\":3,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
    "\"head_dim\":512,\"qk_rope_head_dim\":64,\"q_lora_rank\":32,\"o_lora_rank\":32,\"o_groups\":2,"
    "\"compress_ratios\":[0,4,128,0],\"index_n_heads\":2,\"index_head_dim\":128,\"index_topk\":8,"
    "\"n_routed_experts\":4,\"num_experts_per_tok\":2,\"n_shared_experts\":1,\"moe_intermediate_size\":32,"
    "\"num_hash_layers\":1,\"num_nextn_predict_layers\":1,\"rope_scaling\":null,"
    "\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128],"
    "\"scale_fmt\":\"ue8m0\"},\"expert_dtype\":\"fp4\"}";

static int parse_with(const char *base_json, const char *key, const char *value, tide_config *out) {
  /* replace or add one top-level field */
  char buf[4096];
  const char *k = NULL;
  char pat[80];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  k = strstr(base_json, pat);
  if (k) {
    const char *v = k + strlen(pat);
    int depth = 0;
    const char *e = v;
    for (; *e; e++) {
      if (*e == '[' || *e == '{') depth++;
      if (*e == ']' || *e == '}') {
        if (depth == 0) break;
        depth--;
      }
      if (*e == ',' && depth == 0) break;
    }
    snprintf(buf, sizeof buf, "%.*s%s%s%s", (int)(v - base_json), base_json, value, e, "");
  } else {
    snprintf(buf, sizeof buf, "{\"%s\":%s,%s", key, value, base_json + 1);
  }
  return tide_config_parse(out, buf, (int64_t)strlen(buf), "cfg/config.json");
}

static void test_config(void) {
  int64_t base = live();
  tide_config c;
  TT_OK(tide_config_parse(&c, TINY, (int64_t)strlen(TINY), "t/config.json"));
  TT_CHECK(c.hidden_size == 64 && c.num_hidden_layers == 3 && c.n_compress_ratios == 4 && c.compress_ratios[2] == 128,
           "fields");
  TT_CHECK(c.linear_format == TIDE_FMT_FP8 && c.expert_format == TIDE_FMT_FP4 && !c.rope_scaling, "formats/rope");
  /* defaults of DeepSeek's reference where a field is absent */
  TT_CHECK(c.sliding_window == 128 && c.rope_theta == 10000 && c.compress_rope_theta == 160000 && c.hc_mult == 4 &&
               c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6 && c.rms_norm_eps == 1e-6 && c.swiglu_limit == 10.0 &&
               c.routed_scaling_factor == 1.5 && c.norm_topk_prob && !c.tie_word_embeddings &&
               c.scoring == TIDE_SCORING_SQRTSOFTPLUS && !strcmp(c.topk_method, "noaux_tc") &&
               c.max_position_embeddings == 1048576 && c.bos_token_id == 0 && c.eos_token_id == 1,
           "defaults");
  TT_CHECK(tide_config_layer_ratio(&c, 0) == 1 && tide_config_layer_ratio(&c, 1) == 4 &&
               tide_config_layer_ratio(&c, 2) == 128 && tide_config_layer_ratio(&c, 3) == 1,
           "layer ratios");
  TT_FAILS(tide_config_layer_ratio(&c, 4), TIDE_E_RANGE, "layer 4");
  TT_FAILS(tide_config_layer_ratio(&c, -1), TIDE_E_RANGE, "layer -1");
  /* rope_scaling absent = the reference's YaRN; "rope_type" spelling accepted */
  TT_OK(parse_with(TINY, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":8,\"original_max_position_embeddings\":256}", &c));
  TT_CHECK(c.rope_scaling && c.rope_factor == 8 && c.rope_original_max_position_embeddings == 256 && c.rope_beta_fast == 32,
           "yarn fields");
  TT_OK(parse_with(TINY, "eos_token_id", "[7, 8]", &c));
  TT_CHECK(c.eos_token_id == 7, "eos list");
  TT_OK(parse_with(TINY, "quantization_config", "null", &c));
  TT_CHECK(c.linear_format == TIDE_FMT_BF16 && c.expert_format == TIDE_FMT_FP4, "unquantised linears");
  struct { const char *k, *v; int status; const char *frag; } bad[] = {
      {"compress_ratios", "[0,4,8,0]", TIDE_E_UNSUPPORTED, "compress_ratios[2] = 8"},
      {"compress_ratios", "[0,4]", TIDE_E_UNSUPPORTED, "compress_ratios has 2 entries"},
      {"compress_ratios", "[0,4,\"x\",0]", TIDE_E_FORMAT, "compress_ratios[2]"},
      {"head_dim", "256", TIDE_E_UNSUPPORTED, "head_dim 256"},
      {"qk_rope_head_dim", "32", TIDE_E_UNSUPPORTED, "qk_rope_head_dim 32"},
      {"index_head_dim", "64", TIDE_E_UNSUPPORTED, "index_head_dim 64"},
      {"num_key_value_heads", "2", TIDE_E_UNSUPPORTED, "num_key_value_heads 2"},
      {"o_groups", "3", TIDE_E_UNSUPPORTED, "o_groups 3"},
      {"num_experts_per_tok", "5", TIDE_E_UNSUPPORTED, "num_experts_per_tok 5"},
      {"num_hash_layers", "4", TIDE_E_UNSUPPORTED, "num_hash_layers 4"},
      {"hidden_size", "\"64\"", TIDE_E_FORMAT, "'hidden_size' must be an integer"},
      {"hidden_size", "64.5", TIDE_E_FORMAT, "'hidden_size' must be an integer"},
      {"hidden_size", "48", TIDE_E_UNSUPPORTED, "divisible by 32"},
      {"num_hidden_layers", "1e12", TIDE_E_UNSUPPORTED, "num_hidden_layers"},
      {"scoring_func", "\"relu\"", TIDE_E_UNSUPPORTED, "scoring_func \"relu\""},
      {"topk_method", "\"greedy\"", TIDE_E_UNSUPPORTED, "topk_method \"greedy\""},
      {"hidden_act", "\"gelu\"", TIDE_E_UNSUPPORTED, "hidden_act \"gelu\""},
      {"rope_scaling", "{\"type\":\"linear\",\"factor\":2}", TIDE_E_UNSUPPORTED, "rope_scaling type \"linear\""},
      {"rope_scaling", "{\"factor\":2}", TIDE_E_FORMAT, "no \"type\""},
      {"rope_scaling", "7", TIDE_E_FORMAT, "'rope_scaling' must be an object"},
      {"quantization_config", "{\"quant_method\":\"int8\"}", TIDE_E_UNSUPPORTED, "quant_method \"int8\""},
      {"quantization_config", "{\"quant_method\":\"fp8\",\"weight_block_size\":[64,64]}", TIDE_E_UNSUPPORTED,
       "weight_block_size [64, 64]"},
      {"quantization_config", "{\"quant_method\":\"fp8\",\"scale_fmt\":\"fp32\"}", TIDE_E_UNSUPPORTED, "scale_fmt"},
      {"expert_dtype", "\"int4\"", TIDE_E_UNSUPPORTED, "expert_dtype \"int4\""},
      {"model_type", "\"deepseek_v3\"", TIDE_E_UNSUPPORTED, "model_type \"deepseek_v3\""},
      {"architectures", "[\"DeepseekV3ForCausalLM\"]", TIDE_E_UNSUPPORTED, "DeepseekV4ForCausalLM"},
      {"architectures", "\"DeepseekV4ForCausalLM\"", TIDE_E_FORMAT, "architectures"},
      {"norm_topk_prob", "1", TIDE_E_FORMAT, "'norm_topk_prob' must be true or false"},
      {"rms_norm_eps", "0", TIDE_E_UNSUPPORTED, "rms_norm_eps"},
      {"attention_bias", "true", TIDE_E_UNSUPPORTED, "attention_bias"},
      {"sliding_window", "0", TIDE_E_UNSUPPORTED, "sliding_window 0"},
      {"eos_token_id", "\"x\"", TIDE_E_FORMAT, "eos_token_id"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tide_config keep = c;
    int rc = parse_with(TINY, bad[i].k, bad[i].v, &c);
    TT_CHECK(rc == bad[i].status, "%s=%s: rc %d, expected %d (%s)", bad[i].k, bad[i].v, rc, bad[i].status,
             tide_last_error());
    TT_CHECK(msg_has("cfg/config.json", bad[i].frag), "%s=%s: message '%s' lacks '%s'", bad[i].k, bad[i].v,
             tide_last_error(), bad[i].frag);
    TT_CHECK(!memcmp(&keep, &c, sizeof c), "%s: *out changed on error", bad[i].k);
  }
  TT_FAILS(tide_config_parse(&c, "{\"vocab_size\":1}", 16, "x/config.json"), TIDE_E_UNSUPPORTED, "neither model_type");
  TT_FAILS(tide_config_parse(&c, "{\"model_type\":", 14, "x/config.json"), TIDE_E_FORMAT, "not valid JSON");
  TT_FAILS(tide_config_parse(&c, "[1]", 3, "x/config.json"), TIDE_E_FORMAT, "not a JSON object");
  TT_FAILS(tide_config_parse(&c, "{\"model_type\":\"deepseek_v4\"}x", 29, "x/config.json"), TIDE_E_FORMAT, "text after");
  /* a config with only the family given takes every default: Flash, whose
   * compress_ratios default (8 entries) is too short for its 43 layers */
  TT_FAILS(tide_config_parse(&c, "{\"model_type\":\"deepseek_v4\"}", 28, "x/config.json"), TIDE_E_UNSUPPORTED,
           "compress_ratios has 8 entries but num_hidden_layers is 43");
  tide_config d;
  tide_config_defaults(&d);
  TT_CHECK(d.vocab_size == 129280 && d.hidden_size == 4096 && d.num_hidden_layers == 43 && d.n_routed_experts == 256,
           "defaults are Flash's");
  TT_CHECK(live() == base, "leak");
}

/* ---- directories: index, config, model check ---- */
static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

/* a header-only checkpoint of `cfg_json` in `dir`, `nshards` shards; the
 * inventory entry `skip` is left out, `bad_shape` gets a wrong shape */
static void make_dir(const char *dir, const char *cfg_json, int nshards, const char *skip, const char *bad_shape,
                     int data) {
  char p[1400];
  mkdir(dir, 0755);
  snprintf(p, sizeof p, "%s/config.json", dir);
  write_text(p, cfg_json);
  tide_config c;
  if (tide_config_parse(&c, cfg_json, (int64_t)strlen(cfg_json), p)) {
    fprintf(stderr, "%s\n", tide_last_error());
    exit(1);
  }
  tide_tensor_spec *sp;
  int64_t n;
  TT_OK(tide_config_inventory(&c, &sp, &n));
  char idx[1400];
  snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
  FILE *fi = nshards > 1 ? fopen(idx, "w") : NULL;
  if (fi) fprintf(fi, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
  int first = 1;
  for (int s = 0; s < nshards; s++) {
    char f[64];
    if (nshards == 1) snprintf(f, sizeof f, "model.safetensors");
    else snprintf(f, sizeof f, "model-%05d-of-%05d.safetensors", s + 1, nshards);
    snprintf(p, sizeof p, "%s/%s", dir, f);
    tide_st_writer *w;
    TT_OK(tide_st_writer_new(&w, p));
    for (int64_t i = s; i < n; i += nshards) {
      if (skip && !strcmp(sp[i].name, skip)) continue;
      int64_t shape[4] = {sp[i].shape[0], sp[i].shape[1]};
      if (bad_shape && !strcmp(sp[i].name, bad_shape)) shape[0]++;
      TT_OK(tide_st_writer_declare(w, sp[i].name, sp[i].dtype, sp[i].ndim, shape));
      if (fi) fprintf(fi, "%s\"%s\":\"%s\"", first ? "" : ",", sp[i].name, f), first = 0;
    }
    if (data) {
      for (int64_t i = s; i < n; i += nshards) {
        tide_tensor t = {0};
        TT_OK(tide_tensor_new(&t, sp[i].dtype, sp[i].ndim, sp[i].shape));
        fill_seq(&t);
        TT_OK(tide_st_writer_write(w, sp[i].name, &t));
        tide_tensor_release(&t);
      }
    }
    TT_OK(tide_st_writer_finish(w, !data));
    tide_st_writer_free(w);
  }
  if (fi) {
    fprintf(fi, "}}");
    fclose(fi);
  }
  tide_xfree(sp);
}

static void rm_dir(const char *dir) {
  char cmd[1500];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

static void test_directories(void) {
  int64_t base = live();
  const char *d = tmp("dir3");
  make_dir(d, TINY, 3, NULL, NULL, 1);
  tide_ckpt *ck;
  TT_OK(tide_ckpt_open(&ck, d, 0));
  tide_ckpt_summary s;
  TT_OK(tide_ckpt_summary_get(ck, &s));
  TT_CHECK(s.n_shards == 3 && s.has_config && s.index_total_size == 0, "summary");
  const tide_config *c = tide_ckpt_config(ck);
  TT_CHECK(c && c->hidden_size == 64, "config");
  int64_t len;
  TT_CHECK(tide_ckpt_config_json(ck, &len) && len == (int64_t)strlen(TINY), "raw config");
  /* names in byte order, infos, views into the mapping */
  tide_ckpt_info a, b;
  for (int64_t i = 1; i < tide_ckpt_count(ck); i++) {
    tide_ckpt_info_at(ck, i - 1, &a);
    tide_ckpt_info_at(ck, i, &b);
    TT_CHECK(strcmp(a.name, b.name) < 0, "order at %lld", (long long)i);
    TT_CHECK(tide_ckpt_find(ck, b.name) == i, "find %s", b.name);
  }
  TT_CHECK(tide_ckpt_find(ck, "nope") == -1, "find nope");
  TT_FAILS(tide_ckpt_tensor(ck, "nope", &(tide_tensor){0}), TIDE_E_RANGE, "'nope' not found");
  TT_CHECK(msg_has(d, NULL), "missing-tensor message lacks the checkpoint: %s", tide_last_error());
  TT_FAILS(tide_ckpt_info_at(ck, tide_ckpt_count(ck), &a), TIDE_E_RANGE, "outside");
  tide_tensor t = {0};
  TT_OK(tide_ckpt_tensor(ck, "layers.1.attn.wq_a.weight", &t));
  int64_t i = tide_ckpt_find(ck, "layers.1.attn.wq_a.weight");
  tide_ckpt_info_at(ck, i, &a);
  TT_CHECK(t.dtype == TIDE_F8E4M3 && t.readonly && a.nbytes == tide_tensor_nbytes(&t) && strstr(a.shard, d),
           "view/info");
  TT_CHECK((uint8_t *)t.data == (uint8_t *)tide_storage_data(t.storage) + a.offset, "view is not into the mapping");
  TT_CHECK(tide_storage_kind_of(t.storage) == TIDE_STORAGE_MMAP, "not an mmap storage");
  /* the mapping outlives the handle */
  tide_ckpt_free(ck);
  double v;
  TT_OK(tide_tensor_get(&t, (int64_t[]){1, 1}, &v));
  TT_FAILS(tide_tensor_set(&t, (int64_t[]){0, 0}, 1.0), TIDE_E_INVALID, "read-only");
  tide_tensor_release(&t);
  /* broken directories */
  char p[1400], q2[1400];
  snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", d);
  snprintf(q2, sizeof q2, "%s/moved.safetensors", d);
  TT_CHECK(rename(p, q2) == 0, "rename");
  OPEN_FAILS(d, 0, TIDE_E_IO, "model-00002-of-00003.safetensors", "shard missing");
  TT_CHECK(rename(q2, p) == 0, "rename back");
  /* the index names a tensor the shard lacks / puts one in the wrong shard */
  char ip[1400];
  snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", d);
  char *text;
  int64_t tl;
  {
    FILE *f = fopen(ip, "rb");
    fseek(f, 0, SEEK_END);
    tl = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc((size_t)tl + 64);
    if (fread(text, 1, (size_t)tl, f) != (size_t)tl) tl = 0;
    text[tl] = 0;
    fclose(f);
  }
  char *mod = malloc((size_t)tl + 200);
  const char *wm = strstr(text, "\"weight_map\":{");
  TT_CHECK(wm != NULL, "index layout");
  snprintf(mod, (size_t)tl + 200, "{\"weight_map\":{\"ghost.weight\":\"model-00001-of-00003.safetensors\",%s",
           wm ? wm + strlen("\"weight_map\":{") : "}}");
  write_text(ip, mod);
  OPEN_FAILS(d, 0, TIDE_E_FORMAT, "'ghost.weight'", "model-00001-of-00003.safetensors");
  char *at = strstr(text, "\"embed.weight\":\"model-00001");
  TT_CHECK(at != NULL, "index layout");
  if (at) {
    memcpy(mod, text, (size_t)tl + 1);
    memcpy(mod + (at - text) + strlen("\"embed.weight\":\"model-0000"), "2", 1);
    write_text(ip, mod);
    OPEN_FAILS(d, 0, TIDE_E_FORMAT, "'embed.weight'", "model-00002-of-00003.safetensors");
  }
  write_text(ip, "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
  OPEN_FAILS(d, 0, TIDE_E_UNSUPPORTED, "'a'", "../x.safetensors");
  write_text(ip, "{\"weight_map\":[]}");
  OPEN_FAILS(d, 0, TIDE_E_FORMAT, ip, "weight_map");
  write_text(ip, "{nope");
  OPEN_FAILS(d, 0, TIDE_E_FORMAT, ip, "not valid JSON");
  write_text(ip, text);
  TT_OK(tide_ckpt_open(&ck, d, 0));
  tide_ckpt_free(ck);
  /* an unsupported config value stops the open, naming config.json */
  snprintf(p, sizeof p, "%s/config.json", d);
  char cfg8[4096];
  snprintf(cfg8, sizeof cfg8, "%s", TINY);
  memcpy(strstr(cfg8, "[0,4,128,0]"), "[0,4,8,0]  ", 11);
  write_text(p, cfg8);
  OPEN_FAILS(d, 0, TIDE_E_UNSUPPORTED, p, "compress_ratios[2] = 8");
  unlink(p);
  OPEN_FAILS(d, 0, TIDE_E_IO, p, "missing");
  TT_OK(tide_ckpt_open(&ck, d, TIDE_CKPT_CONFIG_OPTIONAL));
  TT_CHECK(tide_ckpt_config(ck) == NULL && tide_ckpt_config_json(ck, NULL) == NULL, "no config");
  TT_FAILS(tide_ckpt_check_model(ck), TIDE_E_STATE, "no config.json");
  tide_ckpt_free(ck);
  free(text);
  free(mod);
  rm_dir(d);
  /* the same tensor in two shards */
  const char *d2 = tmp("dup");
  mkdir(d2, 0755);
  snprintf(p, sizeof p, "%s/a.safetensors", d2);
  write_st(p, "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  snprintf(p, sizeof p, "%s/b.safetensors", d2);
  write_st(p, "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", d2);
  write_text(p, "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}");
  OPEN_FAILS(d2, TIDE_CKPT_CONFIG_OPTIONAL, TIDE_E_FORMAT, "'x'", "two shards");
  unlink(p);
  OPEN_FAILS(d2, TIDE_CKPT_CONFIG_OPTIONAL, TIDE_E_IO, d2, "no model.safetensors");
  rm_dir(d2);
  TT_CHECK(live() == base, "leak: %lld", (long long)(live() - base));
}

static void test_model_check(void) {
  int64_t base = live();
  const char *d = tmp("mc");
  make_dir(d, TINY, 1, NULL, NULL, 0);
  tide_ckpt *ck;
  TT_OK(tide_ckpt_open(&ck, d, 0));
  tide_ckpt_summary s;
  tide_ckpt_summary_get(ck, &s);
  /* tiny: 3 layers (SWA, C4, C128) + 1 MTP block, 4 experts, fp4 experts */
  TT_CHECK(s.count_by_dtype[TIDE_I8] == 4 * 4 * 3 && s.count_by_dtype[TIDE_I64] == 1, "inventory counts");
  tide_ckpt_free(ck);
  rm_dir(d);
  const char *missing[] = {"layers.1.attn.attn_sink", "layers.1.attn.indexer.compressor.ape",
                           "layers.2.attn.compressor.wgate.weight", "layers.0.ffn.gate.tid2eid",
                           "layers.2.ffn.gate.bias", "head.weight", "layers.2.ffn.experts.3.w2.weight"};
  for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
    make_dir(d, TINY, 1, missing[i], NULL, 0);
    OPEN_FAILS(d, 0, TIDE_E_FORMAT, missing[i], "missing");
    TT_CHECK(msg_has(d, NULL), "no checkpoint path in '%s'", tide_last_error());
    TT_OK(tide_ckpt_open(&ck, d, TIDE_CKPT_NO_MODEL_CHECK));
    tide_ckpt_free(ck);
    rm_dir(d);
  }
  /* the MTP block is not run by tide: a checkpoint saved without it opens */
  make_dir(d, TINY, 1, "mtp.0.e_proj.weight", NULL, 0);
  TT_OK(tide_ckpt_open(&ck, d, 0));
  tide_ckpt_free(ck);
  rm_dir(d);
  make_dir(d, TINY, 1, "layers.1.attn.wq_b.scale", NULL, 0);
  OPEN_FAILS(d, 0, TIDE_E_FORMAT, "layers.1.attn.wq_b.scale", "needs its e8m0 scale");
  rm_dir(d);
  const char *shapes[] = {"layers.1.attn.wq_b.weight", "layers.1.attn.wq_b.scale", "layers.0.attn_norm.weight",
                          "layers.0.ffn.gate.tid2eid", "layers.1.ffn.experts.0.w1.weight", "embed.weight"};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    make_dir(d, TINY, 1, NULL, shapes[i], 0);
    OPEN_FAILS(d, 0, TIDE_E_FORMAT, shapes[i], "expected");
    TT_CHECK(msg_has("model.safetensors", NULL), "no shard in '%s'", tide_last_error());
    rm_dir(d);
  }
  TT_CHECK(live() == base, "leak: %lld", (long long)(live() - base));
}

/* ---- quantisers ---- */
static uint64_t rs = 88172645463325252ULL;
static float frand(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill_awkward(float *x, int64_t n, int flavour) {
  for (int64_t i = 0; i < n; i++) {
    float v = frand();
    switch (flavour) {
      case 0: x[i] = v * 0.05f; break;                          /* weights */
      case 1: x[i] = v * ldexpf(1.0f, (int)(i % 61) - 30); break; /* wild range */
      case 2: x[i] = 0.0f; break;                               /* zero blocks */
      case 3: x[i] = (i % 17 == 0) ? 1e-38f * v : v * 1e-30f; break; /* tiny: scale clamps */
      case 4: x[i] = (i % 5 == 0) ? NAN : (i % 7 == 0) ? -0.0f : (i % 11 == 0) ? INFINITY : v * 300.0f; break;
      default: { /* exact rounding ties of e4m3 (normal and subnormal) and e2m1, at scale 1 */
        static const float e2m1_mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
        uint32_t u = (uint32_t)(rs >> 20);
        float t;
        if (flavour == 5) t = (u & 1) ? ldexpf(8.0f + (float)((u >> 1) & 7) + 0.5f, (int)((u >> 4) % 15) - 9)
                                      : ldexpf((float)((u >> 1) & 7) + 0.5f, -9);
        else t = e2m1_mid[(u >> 1) % 7];
        x[i] = (u & 0x100) ? -t : t;
        break;
      }
    }
  }
}

/* flavour 5/6 blocks: the first element pins the scale to 2^0 */
static void pin_scale(float *x, int64_t n, int64_t k, int rows_blk, int cols_blk, float amax) {
  for (int64_t r = 0; r < n; r += rows_blk)
    for (int64_t c = 0; c < k; c += cols_blk) x[r * k + c] = amax;
}

static void test_quant_fp8(void) {
  int64_t base = live();
  int shapes[][2] = {{1, 1}, {3, 7}, {63, 65}, {65, 129}, {128, 128}, {129, 256}, {200, 33}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int fl = 0; fl < 6; fl++) {
      int64_t n = shapes[si][0], k = shapes[si][1];
      tide_tensor x = {0}, q = {0}, s = {0}, q2 = {0}, s2 = {0};
      TT_OK(tide_tensor_new(&x, TIDE_F32, 2, (int64_t[]){n, k}));
      fill_awkward(x.data, n * k, fl);
      if (fl == 5) pin_scale(x.data, n, k, 128, 128, 448.0f);
      int64_t sb[2] = {(n + 127) / 128, (k + 127) / 128};
      TT_OK(tide_tensor_new(&q, TIDE_F8E4M3, 2, (int64_t[]){n, k}));
      TT_OK(tide_tensor_new(&q2, TIDE_F8E4M3, 2, (int64_t[]){n, k}));
      TT_OK(tide_tensor_new(&s, TIDE_E8M0, 2, sb));
      TT_OK(tide_tensor_new(&s2, TIDE_E8M0, 2, sb));
      int old = tide_kernels_force_ref(1);
      TT_OK(tide_ckpt_quant_fp8(&q, &s, &x));
      tide_kernels_force_ref(0);
      TT_OK(tide_ckpt_quant_fp8(&q2, &s2, &x));
      tide_kernels_force_ref(old);
      TT_CHECK(!memcmp(q.data, q2.data, (size_t)(n * k)) && !memcmp(s.data, s2.data, (size_t)(sb[0] * sb[1])),
               "fp8 AVX2 != reference at %lldx%lld flavour %d", (long long)n, (long long)k, fl);
      /* the rule: scale = smallest power of two with amax/scale <= 448; codes RNE */
      const float *xs = x.data;
      const uint8_t *qs = q.data, *ss = s.data;
      for (int64_t b = 0; b < sb[0] * sb[1]; b++) {
        int64_t r0 = (b / sb[1]) * 128, c0 = (b % sb[1]) * 128;
        float amax = 0;
        for (int64_t r = r0; r < n && r < r0 + 128; r++)
          for (int64_t c = c0; c < k && c < c0 + 128; c++)
            if (fabsf(xs[r * k + c]) > amax) amax = fabsf(xs[r * k + c]);
        int e = (int)ss[b] - 127;
        if (fl != 4 && amax > 0) {
          TT_CHECK(amax <= 448.0f * ldexpf(1.0f, e) || e == 127, "block %lld: amax %g over 448*2^%d", (long long)b, amax, e);
          TT_CHECK(e == -127 || amax > 448.0f * ldexpf(1.0f, e - 1), "block %lld: scale 2^%d not the smallest", (long long)b, e);
        }
        if (fl == 2) TT_CHECK(ss[b] == 0, "zero block scale byte %d", ss[b]);
        for (int64_t r = r0; r < n && r < r0 + 128; r++)
          for (int64_t c = c0; c < k && c < c0 + 128; c++) {
            float v = xs[r * k + c];
            float want = tide_f8e4m3_to_f32(tide_f32_to_f8e4m3(v * ldexpf(1.0f, -e)));
            float got = tide_f8e4m3_to_f32(qs[r * k + c]);
            TT_CHECK((isnan(want) && isnan(got)) || want == got, "code at %lld,%lld", (long long)r, (long long)c);
          }
      }
      tide_tensor_release(&x), tide_tensor_release(&q), tide_tensor_release(&s);
      tide_tensor_release(&q2), tide_tensor_release(&s2);
    }
  tide_tensor x = {0}, q = {0}, s = {0};
  TT_OK(tide_tensor_new(&x, TIDE_F32, 2, (int64_t[]){4, 4}));
  TT_OK(tide_tensor_new(&q, TIDE_F8E4M3, 2, (int64_t[]){4, 4}));
  TT_OK(tide_tensor_new(&s, TIDE_E8M0, 2, (int64_t[]){1, 2}));
  TT_FAILS(tide_ckpt_quant_fp8(&q, &s, &x), TIDE_E_INVALID, "scale has shape [1, 2], expected [1, 1]");
  tide_tensor_release(&x), tide_tensor_release(&q), tide_tensor_release(&s);
  TT_CHECK(live() == base, "leak");
}

static void test_quant_mxfp4(void) {
  int64_t base = live();
  int shapes[][2] = {{1, 32}, {3, 64}, {7, 96}, {65, 160}, {2, 4096}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int fl = 0; fl < 7; fl++) {
      if (fl == 5) continue; /* e4m3 ties: not e2m1 ones */
      int64_t n = shapes[si][0], k = shapes[si][1];
      tide_tensor x = {0}, q = {0}, s = {0}, q2 = {0}, s2 = {0};
      TT_OK(tide_tensor_new(&x, TIDE_F32, 2, (int64_t[]){n, k}));
      fill_awkward(x.data, n * k, fl);
      if (fl == 6) pin_scale(x.data, n, k, 1, 32, 6.0f);
      TT_OK(tide_tensor_new(&q, TIDE_I8, 2, (int64_t[]){n, k / 2}));
      TT_OK(tide_tensor_new(&q2, TIDE_U8, 2, (int64_t[]){n, k / 2}));
      TT_OK(tide_tensor_new(&s, TIDE_E8M0, 2, (int64_t[]){n, k / 32}));
      TT_OK(tide_tensor_new(&s2, TIDE_E8M0, 2, (int64_t[]){n, k / 32}));
      int old = tide_kernels_force_ref(1);
      TT_OK(tide_ckpt_quant_mxfp4(&q, &s, &x));
      tide_kernels_force_ref(0);
      TT_OK(tide_ckpt_quant_mxfp4(&q2, &s2, &x));
      tide_kernels_force_ref(old);
      TT_CHECK(!memcmp(q.data, q2.data, (size_t)(n * k / 2)) && !memcmp(s.data, s2.data, (size_t)(n * k / 32)),
               "mxfp4 AVX2 != reference at %lldx%lld flavour %d", (long long)n, (long long)k, fl);
      const float *xs = x.data;
      const uint8_t *qs = q.data, *ss = s.data;
      for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < k / 32; b++) {
          int e = (int)ss[r * (k / 32) + b] - 127;
          float amax = 0;
          for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xs[r * k + 32 * b + i]));
          if (fl != 4 && amax > 0)
            TT_CHECK(amax <= 6.0f * ldexpf(1.0f, e) && (e == -127 || amax > 6.0f * ldexpf(1.0f, e - 1)),
                     "row %lld block %lld: scale 2^%d for amax %g", (long long)r, (long long)b, e, amax);
          for (int i = 0; i < 32; i++) {
            int64_t j = 32 * b + i;
            uint8_t byte = qs[r * (k / 2) + j / 2];
            uint8_t code = (j & 1) ? byte >> 4 : byte & 15; /* element 2m in the low nibble */
            uint8_t want = tide_f32_to_fp4(xs[r * k + j] * ldexpf(1.0f, -e));
            TT_CHECK(code == want, "row %lld col %lld: code %d, expected %d", (long long)r, (long long)j, code, want);
          }
        }
      tide_tensor_release(&x), tide_tensor_release(&q), tide_tensor_release(&s);
      tide_tensor_release(&q2), tide_tensor_release(&s2);
    }
  /* the low nibble is the even element, with exact codes */
  tide_tensor x = {0}, q = {0}, s = {0};
  TT_OK(tide_tensor_new(&x, TIDE_F32, 2, (int64_t[]){1, 32}));
  TT_OK(tide_tensor_new(&q, TIDE_I8, 2, (int64_t[]){1, 16}));
  TT_OK(tide_tensor_new(&s, TIDE_E8M0, 2, (int64_t[]){1, 1}));
  float *xv = x.data;
  for (int i = 0; i < 32; i++) xv[i] = 0;
  xv[0] = 6.0f, xv[1] = -0.5f, xv[2] = 1.5f, xv[3] = 3.0f;
  TT_OK(tide_ckpt_quant_mxfp4(&q, &s, &x));
  TT_CHECK(((uint8_t *)q.data)[0] == (0x7 | (0x9 << 4)) && ((uint8_t *)q.data)[1] == (0x3 | (0x5 << 4)) &&
               ((uint8_t *)s.data)[0] == 127,
           "nibbles %02x %02x scale %d", ((uint8_t *)q.data)[0], ((uint8_t *)q.data)[1], ((uint8_t *)s.data)[0]);
  tide_tensor_release(&x), tide_tensor_release(&q), tide_tensor_release(&s);
  TT_CHECK(live() == base, "leak");
}

static void test_uniform_kernel(void) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    printf("test_uniform_kernel: no AVX2 on this CPU, comparison skipped\n");
    return;
  }
  int lens[] = {1, 3, 7, 8, 63, 65, 129, 1000};
  float a[1000], b[1000];
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    tide_ckq_ref.uniform(a, lens[i], 0xdeadbeefu, 0xfffffff0u, 0.25f, 3.0f);
    tide_ckq_avx2.uniform(b, lens[i], 0xdeadbeefu, 0xfffffff0u, 0.25f, 3.0f);
    TT_CHECK(!memcmp(a, b, sizeof(float) * (size_t)lens[i]), "uniform AVX2 != reference for n = %d", lens[i]);
  }
  uint32_t key = 99;
  float *big = tide_xmalloc(1 << 22);
  int64_t n = (1 << 22) / 4;
  tide_ckq_avx2.uniform(big, n, key, 0, 0.0f, 1.0f);
  double sum = 0, sq = 0, mn = 1, mx = -1;
  for (int64_t i = 0; i < n; i++) {
    sum += big[i], sq += (double)big[i] * big[i];
    mn = fmin(mn, big[i]), mx = fmax(mx, big[i]);
  }
  double mean = sum / (double)n, var = sq / (double)n - mean * mean;
  TT_CHECK(fabs(mean) < 0.005 && fabs(var - 1.0 / 3) < 0.005 && mn >= -1 && mx < 1, "uniform stats: mean %g var %g", mean,
           var);
  tide_xfree(big);
}

static void test_gen_weight(void) {
  int64_t base = live();
  int dts[] = {TIDE_F32, TIDE_BF16, TIDE_F16, TIDE_F8E4M3, TIDE_I8};
  for (int di = 0; di < 5; di++) {
    int dt = dts[di];
    int64_t n = 300, k = dt == TIDE_I8 ? 160 : 257; /* stored columns: i8 holds pairs */
    int64_t kl = dt == TIDE_I8 ? 2 * k : k;
    int64_t sshape[2] = {dt == TIDE_F8E4M3 ? (n + 127) / 128 : n, dt == TIDE_F8E4M3 ? (k + 127) / 128 : kl / 32};
    tide_tensor w[4], s[4];
    for (int v = 0; v < 4; v++) {
      memset(&w[v], 0, sizeof w[v]);
      memset(&s[v], 0, sizeof s[v]);
      TT_OK(tide_tensor_new(&w[v], dt, 2, (int64_t[]){n, k}));
      if (dt == TIDE_F8E4M3 || dt == TIDE_I8) TT_OK(tide_tensor_new(&s[v], TIDE_E8M0, 2, sshape));
      int th = v == 1 ? 1 : 2, ref = v == 2;
      int oldt = tide_threads_get();
      tide_threads_set(th);
      int old = tide_kernels_force_ref(ref);
      TT_OK(tide_ckpt_gen_weight(&w[v], s[v].storage ? &s[v] : NULL, v == 3 ? 8 : 7, 0.5, 0.1));
      tide_kernels_force_ref(old);
      tide_threads_set(oldt);
    }
    size_t wb = (size_t)tide_tensor_nbytes(&w[0]), sb = s[0].storage ? (size_t)tide_tensor_nbytes(&s[0]) : 0;
    TT_CHECK(!memcmp(w[0].data, w[1].data, wb) && (!sb || !memcmp(s[0].data, s[1].data, sb)),
             "%s: 1 vs 2 threads differ", tide_dtype_name(dt));
    TT_CHECK(!memcmp(w[0].data, w[2].data, wb) && (!sb || !memcmp(s[0].data, s[2].data, sb)),
             "%s: reference vs AVX2 differ", tide_dtype_name(dt));
    TT_CHECK(memcmp(w[0].data, w[3].data, wb) != 0, "%s: another seed gives the same values", tide_dtype_name(dt));
    /* decoded values have the asked mean and spread: uniform on 0.5 +- 0.1 sqrt(3) */
    double sum = 0, sq = 0;
    for (int64_t r = 0; r < n; r++)
      for (int64_t j = 0; j < kl; j++) {
        double v;
        if (dt == TIDE_F8E4M3)
          v = tide_f8e4m3_to_f32(((uint8_t *)w[0].data)[r * k + j]) *
              tide_e8m0_to_f32(((uint8_t *)s[0].data)[(r / 128) * sshape[1] + j / 128]);
        else if (dt == TIDE_I8) {
          uint8_t byte = ((uint8_t *)w[0].data)[r * k + j / 2];
          v = tide_fp4_to_f32((j & 1) ? byte >> 4 : byte & 15) * tide_e8m0_to_f32(((uint8_t *)s[0].data)[r * (kl / 32) + j / 32]);
        } else
          v = tide_load_elem(&w[0], r * k + j);
        sum += v, sq += v * v;
      }
    double cnt = (double)(n * kl), mean = sum / cnt, sd = sqrt(sq / cnt - mean * mean);
    double tol = dt == TIDE_I8 ? 0.05 : 0.01;
    TT_CHECK(fabs(mean - 0.5) < tol && fabs(sd - 0.1) < (dt == TIDE_I8 ? 0.05 : 0.005), "%s: mean %g sd %g",
             tide_dtype_name(dt), mean, sd);
    for (int v = 0; v < 4; v++) tide_tensor_release(&w[v]), tide_tensor_release(&s[v]);
  }
  /* the seed of a tensor depends on its name */
  TT_CHECK(tide_ckpt_seed(1, "a") != tide_ckpt_seed(1, "b") && tide_ckpt_seed(1, "a") != tide_ckpt_seed(2, "a") &&
               tide_ckpt_seed(1, "a") == tide_ckpt_seed(1, "a"),
           "seeds");
  /* ids: k distinct values per row, in range, deterministic, thread-invariant */
  tide_tensor ids = {0}, ids2 = {0};
  TT_OK(tide_tensor_new(&ids, TIDE_I64, 2, (int64_t[]){5000, 6}));
  TT_OK(tide_tensor_new(&ids2, TIDE_I64, 2, (int64_t[]){5000, 6}));
  tide_threads_set(1);
  TT_OK(tide_ckpt_gen_ids(&ids, 3, 8));
  tide_threads_set(2);
  TT_OK(tide_ckpt_gen_ids(&ids2, 3, 8));
  tide_threads_set(0);
  TT_CHECK(!memcmp(ids.data, ids2.data, 5000 * 6 * 8), "ids depend on the thread count");
  int ok = 1;
  int64_t hist[8] = {0};
  for (int64_t r = 0; r < 5000; r++)
    for (int a = 0; a < 6; a++) {
      int64_t va = ((int64_t *)ids.data)[r * 6 + a];
      ok &= va >= 0 && va < 8;
      if (va >= 0 && va < 8) hist[va]++;
      for (int b = 0; b < a; b++) ok &= va != ((int64_t *)ids.data)[r * 6 + b];
    }
  TT_CHECK(ok, "ids not distinct or out of range");
  for (int v = 0; v < 8; v++) TT_CHECK(hist[v] > 3300 && hist[v] < 4200, "id %d drawn %lld times of 30000", v, (long long)hist[v]);
  TT_FAILS(tide_ckpt_gen_ids(&ids, 3, 5), TIDE_E_INVALID, "distinct");
  tide_tensor_release(&ids), tide_tensor_release(&ids2);
  TT_CHECK(live() == base, "leak");
}

/* ---- prefault and the progress bar ---- */
static int64_t rss_file_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int64_t v = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "RssFile:", 8)) v = atoll(line + 8);
  if (f) fclose(f);
  return v;
}

static void test_prefault(void) {
  int64_t base = live();
  const char *d = tmp("pf");
  make_dir(d, TINY, 2, NULL, NULL, 1);
  tide_ckpt *ck;
  TT_OK(tide_ckpt_open(&ck, d, 0));
  int64_t i = tide_ckpt_find(ck, "layers.1.attn.wq_b.weight");
  tide_ckpt_info inf;
  tide_ckpt_info_at(ck, i, &inf);
  /* drop this process's mappings of the shard pages, then fault them in
   * again: RssFile (pages of files mapped into this process) must grow */
  tide_tensor t = {0};
  TT_OK(tide_ckpt_tensor_at(ck, i, &t));
  tide_ckpt_summary sum;
  tide_ckpt_summary_get(ck, &sum);
  for (int sh = 0; sh < tide_ckpt_shard_count(ck); sh++) {
    tide_ckpt_shard_info si;
    tide_ckpt_shard_at(ck, sh, &si);
    tide_tensor any = {0};
    for (int64_t k = 0; k < tide_ckpt_count(ck); k++) {
      tide_ckpt_info ik;
      tide_ckpt_info_at(ck, k, &ik);
      if (ik.shard_index == sh) {
        tide_ckpt_tensor_at(ck, k, &any);
        break;
      }
    }
    madvise(tide_storage_data(any.storage), (size_t)tide_storage_bytes(any.storage), MADV_DONTNEED);
    tide_tensor_release(&any);
  }
  int64_t rss0 = rss_file_kb();
  /* the progress bar, forced on, to a file */
  char errf[1400];
  snprintf(errf, sizeof errf, "%s/stderr.txt", tmpdir);
  fflush(stderr);
  int saved = dup(2);
  int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 2);
  close(fd);
  TT_OK(tide_ckpt_prefault(ck, (int64_t[]){i, i}, 2, TIDE_PROGRESS_ALWAYS));
  TT_OK(tide_ckpt_prefault(ck, NULL, 0, TIDE_PROGRESS_NEVER));
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  int64_t rss1 = rss_file_kb();
  TT_CHECK(rss1 - rss0 >= sum.tensor_bytes / 1024 * 9 / 10, "RssFile grew by %lld kB for %lld kB of tensors",
           (long long)(rss1 - rss0), (long long)(sum.tensor_bytes / 1024));
  FILE *f = fopen(errf, "r");
  char buf[2048] = {0};
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[got] = 0;
  TT_CHECK(strstr(buf, "loading 100%") && strstr(buf, "GB") && strchr(buf, '\n') && strstr(buf, "MB/s"),
           "progress output: '%s'", buf);
  TT_CHECK(!strstr(buf + (strchr(buf, '\n') ? strchr(buf, '\n') - buf + 1 : 0), "loading"),
           "NEVER printed something: '%s'", buf);
  TT_FAILS(tide_ckpt_prefault(ck, (int64_t[]){-1}, 1, 0), TIDE_E_RANGE, "outside");
  TT_FAILS(tide_ckpt_prefault(ck, NULL, 0, 7), TIDE_E_INVALID, "mode");
  tide_tensor_release(&t);
  tide_ckpt_free(ck);
  rm_dir(d);
  unlink(errf);
  /* AUTO without a terminal prints nothing and costs nothing */
  tide_progress *p;
  TT_OK(tide_progress_new(&p, "x", 100, TIDE_PROGRESS_NEVER));
  tide_progress_add(p, 50);
  tide_progress_free(p);
  tide_progress_add(NULL, 1);
  tide_progress_free(NULL);
  TT_CHECK(live() == base, "leak: %lld", (long long)(live() - base));
}

static void teardown(void) { rmdir(tmpdir); }

int main(int argc, char **argv) {
  setup();
  static const tt_test tests[] = {TT(test_bad_headers),  TT(test_mutations),   TT(test_writer_roundtrip),
                                  TT(test_config),       TT(test_directories), TT(test_model_check),
                                  TT(test_quant_fp8),    TT(test_quant_mxfp4), TT(test_uniform_kernel),
                                  TT(test_gen_weight),   TT(test_prefault)};
  int rc = tt_main(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
  teardown();
  return rc;
}
