/* test_ckpt_lazy.c - opening the real Flash and Pro layouts is lazy and
 * fast: header-only stand-ins (sparse files with the exact names, shapes and
 * dtypes of deepseek-v4.md 1.6, written by scripts/make_checkpoint.lua
 * --header-only) must open in well under a second with a peak RSS under
 * 100 MB, and reproduce the doc's tensor and byte totals. The stand-ins are
 * deleted afterwards. */
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tide.h"
#include "tt.h"

static char dir[1200];

/* sanitizer builds (Debug, ASan shadow memory) are far slower and bigger:
 * they run the checks but not the time and memory limits */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static int64_t status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int64_t v = -1;
  size_t l = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, l)) v = atoll(line + l);
  if (f) fclose(f);
  return v;
}

static int make(const char *preset) {
  const char *exe = getenv("TIDE_EXE"), *src = getenv("TIDE_SOURCE_DIR"), *tmp = getenv("TIDE_TEST_TMP");
  if (!exe || !src) {
    fprintf(stderr, "TIDE_EXE / TIDE_SOURCE_DIR unset (run through ctest)\n");
    return -1;
  }
  snprintf(dir, sizeof dir, "%s/lazy_%s_%d", tmp && *tmp ? tmp : "/tmp", preset, (int)getpid());
  char cmd[4000];
  snprintf(cmd, sizeof cmd, "'%s' '%s/scripts/make_checkpoint.lua' --preset %s --header-only --quiet --out '%s'", exe,
           src, preset, dir);
  return system(cmd);
}

static void cleanup(void) {
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

typedef struct {
  const char *name;
  int dtype;
  int64_t d0, d1;
} want_t;

static void check_standin(const char *preset, int64_t tensors, int64_t bytes, int shards, const int64_t *counts,
                          int64_t params_1e7, const want_t *wants, int nw) {
  TT_CHECK(make(preset) == 0, "make_checkpoint --preset %s failed", preset);
  /* restart the peak-RSS counter (Linux: "5" > clear_refs), so each stand-in
   * is measured on its own */
  FILE *cr = fopen("/proc/self/clear_refs", "w");
  if (cr) {
    fputs("5", cr);
    fclose(cr);
  }
  int64_t hwm0 = status_kb("VmHWM:");
  double best = 1e9, cpu = 0;
  tide_ckpt *ck = NULL;
  for (int rep = 0; rep < 3; rep++) {
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    double t0 = tide_time();
    tide_ckpt *c;
    int rc = tide_ckpt_open(&c, dir, 0);
    double t = tide_time() - t0;
    getrusage(RUSAGE_SELF, &r1);
    TT_CHECK(rc == 0, "open %s: %s", preset, tide_last_error());
    if (rc) return;
    if (t < best) {
      best = t;
      cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
            (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e6;
    }
    if (rep < 2) tide_ckpt_free(c);
    else ck = c;
  }
  int64_t hwm = status_kb("VmHWM:"), rss_file = status_kb("RssFile:");
  tide_ckpt_summary s;
  TT_OK(tide_ckpt_summary_get(ck, &s));
  printf("%s stand-in: %lld tensors, %lld bytes in %d shards: open %.3f s (best of 3, %.3f s CPU), peak RSS %.1f MB "
         "(%.1f MB before), file pages mapped %.1f MB\n",
         preset, (long long)s.n_tensors, (long long)s.tensor_bytes, s.n_shards, best, cpu, (double)hwm / 1024,
         (double)hwm0 / 1024, (double)rss_file / 1024);
  /* laziness is checked by the file pages mapped (below): nothing of the
   * data may be touched. The time is not the contract; the CPU time (not the
   * wall clock, which counts the other jobs of a shared machine) only
   * catches a pathological open, with a wide margin (it is ~0.05 s). */
  if (SANITIZED) printf("%s: sanitizer build, time and memory limits not applied\n", preset);
  TT_CHECK(SANITIZED || cpu < 2.0, "%s: opening took %.3f s of CPU", preset, cpu);
  TT_CHECK(SANITIZED || hwm < 100 * 1024, "%s: peak RSS %lld kB", preset, (long long)hwm);
  TT_CHECK(rss_file < 20 * 1024, "%s: %lld kB of file pages mapped: data was touched", preset, (long long)rss_file);
  TT_CHECK(s.n_tensors == tensors, "%s: %lld tensors, doc says %lld", preset, (long long)s.n_tensors, (long long)tensors);
  TT_CHECK(s.tensor_bytes == bytes, "%s: %lld bytes, doc says %lld", preset, (long long)s.tensor_bytes, (long long)bytes);
  TT_CHECK(s.n_shards == shards && s.index_total_size == bytes, "%s: shards %d, total_size %lld", preset, s.n_shards,
           (long long)s.index_total_size);
  TT_CHECK((s.parameters + 5000000) / 10000000 == params_1e7, "%s: %lld parameters", preset, (long long)s.parameters);
  static const int dts[6] = {TIDE_BF16, TIDE_F32, TIDE_F8E4M3, TIDE_E8M0, TIDE_I64, TIDE_I8};
  for (int i = 0; counts && i < 6; i++)
    TT_CHECK(s.count_by_dtype[dts[i]] == counts[i], "%s: %lld %s tensors, doc says %lld", preset,
             (long long)s.count_by_dtype[dts[i]], tide_dtype_name(dts[i]), (long long)counts[i]);
  for (int i = 0; i < nw; i++) {
    tide_tensor t = {0};
    TT_OK(tide_ckpt_tensor(ck, wants[i].name, &t));
    TT_CHECK(t.dtype == wants[i].dtype && t.sizes[0] == wants[i].d0 && (t.ndim < 2 || t.sizes[1] == wants[i].d1),
             "%s: %s is %s [%lld, %lld]", preset, wants[i].name, tide_dtype_name(t.dtype), (long long)t.sizes[0],
             (long long)t.sizes[1]);
    tide_tensor_release(&t);
  }
  const tide_config *c = tide_ckpt_config(ck);
  TT_CHECK(c && c->num_hidden_layers + c->num_nextn_predict_layers == (shards == 46 ? 44 : 62), "%s: layers", preset);
  tide_ckpt_free(ck);
  cleanup();
}

static void test_flash(void) {
  /* deepseek-v4.md 1.5: 69,187 tensors, 159,609,485,896 bytes, 46 shards; BF16 433, F32 417,
   * F8_E4M3 375, F8_E8M0 34167, I64 3, I8 33792; 290,942,289,362 parameters */
  const int64_t counts[6] = {433, 417, 375, 34167, 3, 33792};
  const want_t w[] = {
      {"embed.weight", TIDE_BF16, 129280, 4096},
      {"layers.2.attn.compressor.wkv.weight", TIDE_BF16, 1024, 4096},
      {"layers.3.attn.compressor.ape", TIDE_F32, 128, 512},
      {"layers.42.attn.indexer.wq_b.scale", TIDE_E8M0, 64, 8},
      {"layers.0.ffn.gate.tid2eid", TIDE_I64, 129280, 6},
      {"layers.5.ffn.experts.255.w2.weight", TIDE_I8, 4096, 1024},
      {"layers.5.ffn.experts.255.w2.scale", TIDE_E8M0, 4096, 64},
      {"layers.7.attn.wo_a.weight", TIDE_F8E4M3, 8192, 4096},
      {"mtp.0.e_proj.weight", TIDE_F8E4M3, 4096, 4096},
      {"mtp.0.ffn.gate.bias", TIDE_F32, 256, 1},
      {"hc_head_fn", TIDE_F32, 4, 16384},
  };
  check_standin("flash", 69187, 159609485896LL, 46, counts, 29094, w, (int)(sizeof w / sizeof w[0]));
}

static void test_pro(void) {
  /* deepseek-v4.md 1.5: 145,116 tensors, 864,704,792,696 bytes, 64 shards; 1,598.84 B parameters */
  const want_t w[] = {
      {"layers.0.attn.compressor.ape", TIDE_F32, 128, 512},
      {"layers.2.attn.indexer.compressor.ape", TIDE_F32, 4, 256},
      {"layers.60.attn.wo_a.weight", TIDE_F8E4M3, 16384, 4096},
      {"layers.60.ffn.experts.383.w1.weight", TIDE_I8, 3072, 3584},
      {"mtp.0.attn.wq_b.weight", TIDE_F8E4M3, 65536, 1536},
  };
  check_standin("pro", 145116, 864704792696LL, 64, NULL, 159884, w, (int)(sizeof w / sizeof w[0]));
}

TT_RUN(TT(test_flash), TT(test_pro))
