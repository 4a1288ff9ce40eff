/* test_refmodel.c - the golden reference (engine/ref/refmodel.c) on
 * generated tiny checkpoints (scripts/make_checkpoint.lua, both variants,
 * index_topk 8 so the indexer's top-k really selects from position 35):
 * logits are finite, activations stay of order one at every depth, the FP8/
 * MXFP4 checkpoint computes nearly what its BF16 twin does, and every path
 * matters: perturbing (negating) the window KV, the sink, a C4 and the C128
 * compressor, the indexer and its compressor, mHC parameters, the hash
 * table, the gate bias, the shared expert and a routed expert changes the
 * logits exactly from the position where that path first has an effect, and
 * never before (bitwise). An expert the routing did not pick changes nothing. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ref/refmodel.h"
#include "tide/refmodel.h"
#include "tt.h"

static char dir_fp8[1200], dir_bf16[1200];

typedef struct {
  tide_ckpt *ck;
  const char *perturb;   /* tensor to negate (NULL: none) */
} getter_ctx;

/* negate every element in place (sign bits; e2m1 pairs: both nibbles; ids: +1 mod E) */
static int negate(tide_tensor *t, int64_t n_experts) {
  uint8_t *p = t->data;
  int64_t n = tide_tensor_nbytes(t);
  switch (t->dtype) {
    case TIDE_F32: for (int64_t i = 3; i < n; i += 4) p[i] ^= 0x80; break;
    case TIDE_BF16: case TIDE_F16: for (int64_t i = 1; i < n; i += 2) p[i] ^= 0x80; break;
    case TIDE_F8E4M3: for (int64_t i = 0; i < n; i++) p[i] ^= 0x80; break;
    case TIDE_I8: case TIDE_U8: for (int64_t i = 0; i < n; i++) p[i] ^= 0x88; break;
    case TIDE_I64: for (int64_t i = 0; i < n / 8; i++) ((int64_t *)p)[i] = (((int64_t *)p)[i] + 1) % n_experts; break;
    default: return -1;
  }
  return 0;
}

static int64_t g_experts;
static int get(void *vctx, const char *name, tide_tensor *out) {
  getter_ctx *ctx = vctx;
  if (!ctx->perturb || strcmp(name, ctx->perturb)) return tide_ckpt_tensor(ctx->ck, name, out);
  tide_tensor v = {0};
  TIDE_CHECK(tide_ckpt_tensor(ctx->ck, name, &v));
  int rc = tide_tensor_clone(out, &v, -1);
  tide_tensor_release(&v);
  if (rc == 0 && negate(out, g_experts) != 0) rc = -1;
  return rc;
}

static void fill_cfg(refm_cfg *rc, const tide_config *c) {
  memset(rc, 0, sizeof *rc);
  rc->vocab = c->vocab_size;
  rc->hidden = c->hidden_size;
  rc->max_pos = c->max_position_embeddings;
  rc->n_layers = c->num_hidden_layers;
  rc->n_heads = c->num_attention_heads;
  rc->q_lora = c->q_lora_rank;
  rc->o_lora = c->o_lora_rank;
  rc->o_groups = c->o_groups;
  rc->window = c->sliding_window;
  for (int L = 0; L < c->num_hidden_layers; L++) rc->ratios[L] = c->compress_ratios[L];
  rc->rope_theta = c->rope_theta;
  rc->compress_rope_theta = c->compress_rope_theta;
  rc->yarn = c->rope_scaling;
  rc->yarn_factor = c->rope_factor;
  rc->yarn_original_max = c->rope_original_max_position_embeddings;
  rc->yarn_beta_fast = c->rope_beta_fast;
  rc->yarn_beta_slow = c->rope_beta_slow;
  rc->idx_heads = c->index_n_heads;
  rc->index_topk = c->index_topk;
  rc->n_experts = c->n_routed_experts;
  rc->topk = c->num_experts_per_tok;
  rc->n_shared = c->n_shared_experts;
  rc->inter = c->moe_intermediate_size;
  rc->n_hash_layers = c->num_hash_layers;
  rc->scoring = c->scoring;
  rc->norm_topk = c->norm_topk_prob;
  rc->routed_scale = (float)c->routed_scaling_factor;
  rc->swiglu_limit = (float)c->swiglu_limit;
  rc->hc_mult = c->hc_mult;
  rc->sinkhorn_iters = c->hc_sinkhorn_iters;
  rc->hc_eps = (float)c->hc_eps;
  rc->eps = (float)c->rms_norm_eps;
}

static int64_t token(int64_t p, int64_t vocab) { return (p * 7919 + 13) % vocab; }

/* One run of `n` tokens: logits [n][vocab] (caller frees), the rms of the
 * residual streams after the last layer per position, and the last token's
 * routing in the last layer. */
typedef struct {
  float *logits;
  double *xrms;
  int32_t route[64];
  int64_t vocab;
  int ok;
} run_t;

static run_t run(tide_ckpt *ck, const char *perturb, int n, int layers) {
  run_t r;
  memset(&r, 0, sizeof r);
  getter_ctx g = {ck, perturb};
  refm_cfg rc;
  fill_cfg(&rc, tide_ckpt_config(ck));
  if (layers > 0) rc.n_layers = layers;
  g_experts = rc.n_experts;
  refm *m;
  int e = refm_new(&m, &rc, get, &g);
  TT_CHECK(e == 0, "refm_new (%s): %s", perturb ? perturb : "-", tide_last_error());
  if (e) return r;
  r.vocab = rc.vocab;
  r.logits = malloc(sizeof(float) * (size_t)(n * rc.vocab));
  r.xrms = malloc(sizeof(double) * (size_t)n);
  r.ok = 1;
  for (int p = 0; p < n; p++) {
    e = refm_forward_token(m, token(p, rc.vocab), r.logits + (int64_t)p * rc.vocab);
    TT_CHECK(e == 0, "forward at %d: %s", p, tide_last_error());
    if (e) {
      r.ok = 0;
      break;
    }
    double s = 0;
    for (int64_t i = 0; i < rc.hc_mult * rc.hidden; i++) s += (double)m->X[i] * m->X[i];
    r.xrms[p] = sqrt(s / (double)(rc.hc_mult * rc.hidden));
  }
  memcpy(r.route, m->last_route, sizeof r.route);
  refm_free(m);
  return r;
}

static void run_free(run_t *r) {
  free(r->logits);
  free(r->xrms);
}

static double maxdiff(const run_t *a, const run_t *b, int p) {
  double d = 0;
  for (int64_t i = 0; i < a->vocab; i++) d = fmax(d, fabs((double)a->logits[p * a->vocab + i] - b->logits[p * b->vocab + i]));
  return d;
}

static int gen(char *dir, size_t cap, const char *variant) {
  const char *exe = getenv("TIDE_EXE"), *src = getenv("TIDE_SOURCE_DIR"), *tmp = getenv("TIDE_TEST_TMP");
  if (!exe || !src) {
    fprintf(stderr, "TIDE_EXE / TIDE_SOURCE_DIR unset (run through ctest)\n");
    return -1;
  }
  snprintf(dir, cap, "%s/refmodel_%s_%d", tmp && *tmp ? tmp : "/tmp", variant, (int)getpid());
  char cmd[4000];
  snprintf(cmd, sizeof cmd,
           "'%s' '%s/scripts/make_checkpoint.lua' --preset tiny --variant %s --set index_topk=8 --quiet --out '%s'", exe,
           src, variant, dir);
  return system(cmd);
}

static void check_sane(const run_t *r, int n, const char *what) {
  int finite = 1;
  for (int64_t i = 0; i < (int64_t)n * r->vocab; i++) finite &= isfinite(r->logits[i]) != 0;
  TT_CHECK(finite, "%s: non-finite logits", what);
  double lo = 1e9, hi = 0, sdlo = 1e9, sdhi = 0;
  for (int p = 0; p < n; p++) {
    lo = fmin(lo, r->xrms[p]), hi = fmax(hi, r->xrms[p]);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < r->vocab; i++) {
      double v = r->logits[(int64_t)p * r->vocab + i];
      s += v, s2 += v * v;
    }
    double sd = sqrt(s2 / (double)r->vocab - (s / (double)r->vocab) * (s / (double)r->vocab));
    sdlo = fmin(sdlo, sd), sdhi = fmax(sdhi, sd);
  }
  printf("%s: %d tokens, residual rms %.3f..%.3f, logit sd %.3f..%.3f\n", what, n, lo, hi, sdlo, sdhi);
  TT_CHECK(lo > 0.25 && hi < 4.0, "%s: residual rms %.3f..%.3f is not of order one", what, lo, hi);
  TT_CHECK(sdlo > 0.3 && sdhi < 3.0, "%s: logit sd %.3f..%.3f is not of order one", what, sdlo, sdhi);
}

static tide_ckpt *open_dir(const char *d) {
  tide_ckpt *ck = NULL;
  int rc = tide_ckpt_open(&ck, d, 0);
  TT_CHECK(rc == 0, "open %s: %s", d, tide_last_error());
  return rc ? NULL : ck;
}

/* ---- the base runs ---- */
#if defined(__SANITIZE_ADDRESS__)
enum { N_BASE = 140 }; /* a Debug ASan build is ~8x slower */
#else
enum { N_BASE = 260 };
#endif
static run_t base_bf16;
static tide_ckpt *ck_bf16;

static void test_base(void) {
  TT_CHECK(gen(dir_bf16, sizeof dir_bf16, "bf16") == 0, "make_checkpoint bf16 failed");
  TT_CHECK(gen(dir_fp8, sizeof dir_fp8, "fp8") == 0, "make_checkpoint fp8 failed");
  ck_bf16 = open_dir(dir_bf16);
  tide_ckpt *ck8 = open_dir(dir_fp8);
  if (!ck_bf16 || !ck8) return;
  double t0 = tide_time();
  base_bf16 = run(ck_bf16, NULL, N_BASE, 0);
  double t1 = tide_time();
  if (!base_bf16.ok) return;
  check_sane(&base_bf16, N_BASE, "bf16");
  enum { N8 = 48 };
  run_t r8 = run(ck8, NULL, N8, 0);
  double t2 = tide_time();
  printf("reference: %.1f ms/token (bf16), %.1f ms/token (fp8 + mxfp4)\n", 1e3 * (t1 - t0) / N_BASE, 1e3 * (t2 - t1) / N8);
  if (r8.ok) {
    check_sane(&r8, N8, "fp8");
    /* the same random values, quantised: the logits must stay close */
    double worst = 1;
    for (int p = 0; p < N8; p++) {
      double ab = 0, aa = 0, bb = 0;
      for (int64_t i = 0; i < r8.vocab; i++) {
        double a = r8.logits[p * r8.vocab + i], b = base_bf16.logits[p * r8.vocab + i];
        ab += a * b, aa += a * a, bb += b * b;
      }
      worst = fmin(worst, ab / sqrt(aa * bb));
    }
    printf("fp8+mxfp4 vs bf16 logits: worst cosine %.4f over %d positions\n", worst, N8);
    TT_CHECK(worst > 0.9, "fp8 checkpoint drifts from its bf16 twin: cosine %.4f", worst);
  }
  run_free(&r8);
  tide_ckpt_free(ck8);
  /* determinism: the bitwise comparisons below rely on it */
  run_t again = run(ck_bf16, NULL, 4, 0);
  if (again.ok) TT_CHECK(maxdiff(&again, &base_bf16, 3) == 0, "the reference is not deterministic");
  run_free(&again);
}

/* activations of order one through every depth (the model cut after L layers) */
static void test_depth(void) {
  if (!ck_bf16) return;
  for (int L = 1; L < 4; L++) {
    run_t r = run(ck_bf16, NULL, 24, L);
    char what[32];
    snprintf(what, sizeof what, "bf16, %d layer%s", L, L > 1 ? "s" : "");
    if (r.ok) check_sane(&r, 24, what);
    run_free(&r);
  }
}

/* perturb `name`: logits bitwise equal before position `from`, clearly
 * different (> 1e-3) at some position in from..n-1 */
static void expect_path(const char *name, int from, int n) {
  if (!base_bf16.ok) return;
  run_t r = run(ck_bf16, name, n, 0);
  if (!r.ok) return;
  double before = 0, after = 0;
  for (int p = 0; p < n; p++) {
    double d = maxdiff(&r, &base_bf16, p);
    if (p < from) before = fmax(before, d);
    else after = fmax(after, d);
  }
  printf("negated %-42s: max |dlogit| %.3g before position %d, %.3g from it\n", name, before, from, after);
  TT_CHECK(before == 0, "%s changed the logits before position %d (%.3g)", name, from, before);
  TT_CHECK(after > 1e-3, "%s did not change the logits from position %d (%.3g)", name, from, after);
  run_free(&r);
}

static void test_paths_short(void) {
  expect_path("layers.0.attn.wkv.weight", 0, 4);          /* the window (SWA layer) */
  expect_path("layers.2.attn.attn_sink", 0, 4);           /* the sink */
  expect_path("layers.1.attn.compressor.ape", 3, 6);      /* C4: the first entry appears at p = 3 */
  expect_path("layers.3.attn.compressor.wkv.weight", 3, 6);
  expect_path("layers.0.hc_attn_fn", 0, 3);               /* mHC */
  expect_path("layers.2.hc_ffn_base", 0, 3);
  expect_path("hc_head_fn", 0, 3);
  expect_path("layers.0.ffn.gate.tid2eid", 0, 3);         /* hash routing */
  expect_path("layers.3.ffn.gate.bias", 0, 6);            /* routing bias */
  expect_path("layers.1.ffn.shared_experts.w2.weight", 0, 3);
}

static void test_paths_indexer(void) {
  /* index_topk 8: positions < 35 see <= 8 entries and take all of them
   * (the short path: the indexer's scores are never used) */
  expect_path("layers.1.attn.indexer.wq_b.weight", 35, 48);
  expect_path("layers.3.attn.indexer.weights_proj.weight", 35, 48);
  expect_path("layers.1.attn.indexer.compressor.ape", 35, 48);
}

static void test_paths_c128(void) {
  expect_path("layers.2.attn.compressor.ape", 127, 130);  /* C128: entry 0 at p = 127 */
}

static void test_experts(void) {
  if (!base_bf16.ok) return;
  run_t one = run(ck_bf16, NULL, 1, 0);
  if (!one.ok) return;
  tide_config c = *tide_ckpt_config(ck_bf16);
  int used = one.route[0], unused = -1;
  for (int e = 0; e < c.n_routed_experts && unused < 0; e++) {
    int in = 0;
    for (int k = 0; k < c.num_experts_per_tok; k++) in |= one.route[k] == e;
    if (!in) unused = e;
  }
  char name[96];
  snprintf(name, sizeof name, "layers.3.ffn.experts.%d.w2.weight", used);
  run_t a = run(ck_bf16, name, 1, 0);
  snprintf(name, sizeof name, "layers.3.ffn.experts.%d.w2.weight", unused);
  run_t b = run(ck_bf16, name, 1, 0);
  if (a.ok && b.ok) {
    double da = maxdiff(&a, &one, 0), db = maxdiff(&b, &one, 0);
    printf("layer 3 expert %d (routed): max |dlogit| %.3g; expert %d (not routed): %.3g\n", used, da, unused, db);
    TT_CHECK(da > 1e-3, "negating routed expert %d changed nothing (%.3g)", used, da);
    TT_CHECK(db == 0, "negating unrouted expert %d changed the logits (%.3g)", unused, db);
  }
  run_free(&a);
  run_free(&b);
  run_free(&one);
}

/* The MTP block through the public API: it runs on the main model's streams,
 * depends on them and on the token, is deterministic, feeds its own streams
 * back, and bad input is refused without moving its position. */
static void test_mtp(void) {
  if (!ck_bf16) return;
  const tide_config *c = tide_ckpt_config(ck_bf16);
  int64_t V = c->vocab_size, n = (int64_t)c->hc_mult * c->hidden_size;
  tide_refmodel *a = NULL, *b = NULL;
  TT_CHECK(tide_refmodel_new(&a, ck_bf16) == 0 && tide_refmodel_new(&b, ck_bf16) == 0, "refmodel_new: %s",
           tide_last_error());
  if (!a || !b) goto out;
  float *buf = calloc((size_t)(4 * V + 4 * n), sizeof(float));
  float *la = buf, *lb = buf + V, *lc = buf + 2 * V, *ld = buf + 3 * V;
  float *H = buf + 4 * V, *Ha = H + n, *Hb = H + 2 * n, *H2 = H + 3 * n;
  /* wrap releases what the tensor held before: start from empty tensors */
  tide_tensor tla = {0}, tlb = {0}, tlc = {0}, tld = {0}, tH = {0}, tHa = {0}, tHb = {0}, tH2 = {0};
  int64_t sv[1] = {V}, sh[2] = {c->hc_mult, c->hidden_size};
  tide_tensor_wrap(&tla, la, TIDE_F32, 1, sv, NULL, NULL);
  tide_tensor_wrap(&tlb, lb, TIDE_F32, 1, sv, NULL, NULL);
  tide_tensor_wrap(&tlc, lc, TIDE_F32, 1, sv, NULL, NULL);
  tide_tensor_wrap(&tld, ld, TIDE_F32, 1, sv, NULL, NULL);
  tide_tensor_wrap(&tH, H, TIDE_F32, 2, sh, NULL, NULL);
  tide_tensor_wrap(&tHa, Ha, TIDE_F32, 2, sh, NULL, NULL);
  tide_tensor_wrap(&tHb, Hb, TIDE_F32, 2, sh, NULL, NULL);
  tide_tensor_wrap(&tH2, H2, TIDE_F32, 2, sh, NULL, NULL);
  for (int p = 0; p < 5; p++) TT_CHECK(tide_refmodel_step(a, token(p, V), NULL) == 0, "step %d", p);
  TT_CHECK(tide_refmodel_hidden(a, &tH) == 0, "hidden: %s", tide_last_error());
  /* bad token, bad sizes: refused, the position does not move */
  TT_CHECK(tide_refmodel_mtp(a, &tH, V, &tla, NULL) == TIDE_E_RANGE, "token out of range accepted");
  tide_tensor half = {0};
  int64_t shalf[1] = {n / 2};
  tide_tensor_wrap(&half, H2, TIDE_F32, 1, shalf, NULL, NULL);
  TT_CHECK(tide_refmodel_mtp(a, &half, 3, &tlb, NULL) == TIDE_E_INVALID, "wrong hidden size accepted");
  TT_CHECK(tide_refmodel_mtp(a, &tH, 3, &tla, &tHa) == 0, "mtp: %s", tide_last_error());
  TT_CHECK(tide_refmodel_mtp(b, &tH, 3, &tlb, &tHb) == 0, "mtp b: %s", tide_last_error());
  TT_CHECK(memcmp(la, lb, (size_t)V * sizeof(float)) == 0 && memcmp(Ha, Hb, (size_t)n * sizeof(float)) == 0,
           "the MTP block is not deterministic (or a refused call moved its position)");
  double s = 0;
  for (int64_t i = 0; i < V; i++) {
    TT_CHECK(isfinite(la[i]), "logit %lld not finite", (long long)i);
    s += (double)la[i] * la[i];
  }
  TT_CHECK(s > 0, "all-zero MTP logits");
  /* the next entry: another token, and other streams, change the logits */
  memcpy(H2, H, (size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) H2[i] = -H2[i] * 0.5f + 0.25f;
  TT_CHECK(tide_refmodel_mtp(a, &tHa, 5, &tlc, NULL) == 0, "recursive mtp: %s", tide_last_error());
  TT_CHECK(tide_refmodel_mtp(b, &tH2, 5, &tld, NULL) == 0, "mtp on other streams: %s", tide_last_error());
  TT_CHECK(memcmp(lc, ld, (size_t)V * sizeof(float)) != 0, "the MTP block ignores its input streams");
  TT_CHECK(memcmp(la, lc, (size_t)V * sizeof(float)) != 0, "recursive MTP step repeats the first");
  tide_tensor *ts[] = {&tla, &tlb, &tlc, &tld, &tH, &tHa, &tHb, &tH2, &half};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tide_tensor_release(ts[i]);
  free(buf);
out:
  tide_refmodel_free(a);
  tide_refmodel_free(b);
}

static void cleanup(void) {
  tide_ckpt_free(ck_bf16);
  run_free(&base_bf16);
  char cmd[3000];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir_fp8, dir_bf16);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove the checkpoints\n");
}

int main(int argc, char **argv) {
  static const tt_test tests[] = {TT(test_base),         TT(test_depth),      TT(test_paths_short),
                                  TT(test_paths_indexer), TT(test_paths_c128), TT(test_experts),
                                  TT(test_mtp)};
  int rc = tt_main(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
  cleanup();
  return rc;
}
