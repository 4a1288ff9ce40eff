/* test_sampling.c - the C half of sampling: RNG known answers, the exp
 * kernel against libm and AVX2 against the reference (bit for bit), every
 * candidates operation against its definition (llama.cpp's test cases and a
 * brute-force canonical sort on large rows), histories with counts, DRY on
 * constructed histories, draws against their distribution (chi-square with
 * fixed seeds), row logprobs, misuse, and leaks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample_kernels.h"
#include "tide.h"
#include "tt.h"

/* ---- helpers ---- */

static uint64_t lcg = 12345;
static double urand(void) {
  lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(lcg >> 11) * 0x1.0p-53;
}
static float nrand(void) {
  double u1 = urand(), u2 = urand();
  if (u1 < 1e-300) u1 = 1e-300;
  return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

/* A set from probabilities: logit = log(p), ids 0.. */
static tide_cands *from_probs(const float *p, int n) {
  tide_cands *c = NULL;
  TT_OK(tide_cands_new(&c, n));
  int32_t ids[64];
  float lg[64];
  for (int i = 0; i < n; i++) {
    ids[i] = i;
    lg[i] = logf(p[i]);
  }
  TT_OK(tide_cands_set(c, ids, lg, n));
  return c;
}

/* Compare the set's softmax with expected probabilities (in any order of
 * ids: expected[id], 0 = absent). */
static int probs_are(tide_cands *c, const float *expected, int nv, double tol) {
  if (tide_cands_softmax(c) != TIDE_OK) return 0;
  int present = 0;
  for (int t = 0; t < nv; t++) present += expected[t] > 0;
  if (present != c->n) {
    fprintf(stderr, "  expected %d candidates, got %d\n", present, c->n);
    return 0;
  }
  for (int i = 0; i < c->n; i++) {
    int t = c->id[i];
    if (t < 0 || t >= nv || fabs(c->p[i] - expected[t]) > tol) {
      fprintf(stderr, "  id %d: p %.6f, expected %.6f\n", t, c->p[i], t >= 0 && t < nv ? expected[t] : -1.0);
      return 0;
    }
  }
  return 1;
}

static tide_tensor row_tensor(float *x, int64_t n) {
  tide_tensor t;
  memset(&t, 0, sizeof t);
  int64_t sh[1] = {n};
  tide_tensor_wrap(&t, x, TIDE_F32, 1, sh, NULL, NULL);
  return t;
}

/* canonical order for qsort */
static const float *g_key;
static int canon_cmp(const void *a, const void *b) {
  int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
  float ka = g_key[ia], kb = g_key[ib];
  if (ka > kb) return -1;
  if (ka < kb) return 1;
  return ia < ib ? -1 : ia > ib;
}
/* ids of x[0..n) in canonical order */
static int32_t *canon_order(const float *x, int64_t n) {
  int32_t *o = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) o[i] = (int32_t)i;
  g_key = x;
  qsort(o, (size_t)n, 4, canon_cmp);
  return o;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return x < y ? -1 : x > y;
}

/* the set's ids sorted ascending equal the first L of `order`, sorted */
static int same_set(tide_cands *c, const int32_t *order, int64_t L) {
  if (c->n != L) {
    fprintf(stderr, "  size %d, expected %lld\n", c->n, (long long)L);
    return 0;
  }
  int32_t *a = malloc((size_t)(L ? L : 1) * 4), *b = malloc((size_t)(L ? L : 1) * 4);
  memcpy(a, c->id, (size_t)L * 4);
  memcpy(b, order, (size_t)L * 4);
  qsort(a, (size_t)L, 4, cmp_i32);
  qsort(b, (size_t)L, 4, cmp_i32);
  int ok = memcmp(a, b, (size_t)L * 4) == 0;
  free(a);
  free(b);
  return ok;
}

/* ---- RNG ---- */

static void test_rng_known_answers(void) {
  tide_rng r;
  tide_rng_seed(&r, 0);
  /* splitmix64 from 0: the published first outputs */
  TT_CHECK(r.s[0] == 0xe220a8397b1dcdafull && r.s[1] == 0x6e789e6aa1b965f4ull &&
               r.s[2] == 0x06c45d188009454full && r.s[3] == 0xf88bb8a8724c81ecull,
           "splitmix64 seeding: %016llx", (unsigned long long)r.s[0]);
  /* xoshiro256** outputs, from an independent Python implementation */
  uint64_t e0[3] = {0x99ec5f36cb75f2b4ull, 0xbf6e1f784956452aull, 0x1a5f849d4933e6e0ull};
  for (int i = 0; i < 3; i++) {
    uint64_t v = tide_rng_next(&r);
    TT_CHECK(v == e0[i], "seed 0 output %d: %016llx", i, (unsigned long long)v);
  }
  tide_rng_seed(&r, 42);
  uint64_t e42[3] = {0x15780b2e0c2ec716ull, 0x6104d9866d113a7eull, 0xae17533239e499a1ull};
  for (int i = 0; i < 3; i++) {
    uint64_t v = tide_rng_next(&r);
    TT_CHECK(v == e42[i], "seed 42 output %d: %016llx", i, (unsigned long long)v);
  }
}

static void test_rng_uniform(void) {
  tide_rng r, copy;
  tide_rng_seed(&r, 7);
  double sum = 0, mn = 1, mx = 0;
  int n = 200000;
  for (int i = 0; i < n; i++) {
    if (i == 1000) copy = r;
    double u = tide_rng_uniform(&r);
    sum += u;
    if (u < mn) mn = u;
    if (u > mx) mx = u;
  }
  TT_CHECK(mn >= 0 && mx < 1, "range [%g, %g]", mn, mx);
  TT_CHECK(fabs(sum / n - 0.5) < 0.005, "mean %g", sum / n);
  /* a copied state continues the same stream */
  tide_rng a = copy, b = copy;
  int same = 1;
  for (int i = 0; i < 100; i++) same &= tide_rng_next(&a) == tide_rng_next(&b);
  TT_CHECK(same, "copied states diverge");
}

/* ---- kernels ---- */

static double ulp_diff(float a, float b) {
  if (a == b) return 0;
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  return fabs((double)ia - (double)ib);
}

static void test_exp_accuracy(void) {
  double worst = 0;
  float at = 0;
  for (int i = 0; i <= 2000000; i++) {
    float x = -86.0f * (float)i / 2000000.0f;
    float got = tide_sample_exp_ref(x), want = expf(x);
    double u = ulp_diff(got, want);
    if (u > worst) {
      worst = u;
      at = x;
    }
  }
  TT_CHECK(worst <= 2, "exp is %g ulp off at %g", worst, (double)at);
  TT_CHECK(tide_sample_exp_ref(0.0f) == 1.0f && tide_sample_exp_ref(-0.0f) == 1.0f, "exp(0) != 1");
  TT_CHECK(tide_sample_exp_ref(-INFINITY) == 0.0f, "exp(-inf) != 0");
  TT_CHECK(tide_sample_exp_ref(-86.5f) == 0.0f, "below the flush point is not 0");
  TT_CHECK(tide_sample_exp_ref(-86.0f) > 0.0f, "exp(-86) flushed");
  TT_CHECK(tide_sample_exp_ref(NAN) == 0.0f, "exp(NaN) not 0");
}

static void test_kernels_avx2_vs_ref(void) {
#if defined(__x86_64__)
  if (!tide_kernels_avx2()) {
    fprintf(stderr, "  (no AVX2: variant not tested)\n");
    return;
  }
  const tide_sample_kernels *a = &tide_sample_avx2, *r = &tide_sample_ref;
  int64_t sizes[] = {1, 3, 7, 8, 9, 63, 64, 65, 127, 129, 1000, 4099, 129280};
  int bad = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    int64_t n = sizes[s];
    float *x = malloc((size_t)n * 4), *pa = malloc((size_t)n * 4), *pr = malloc((size_t)n * 4);
    double *ba = malloc(((size_t)n / 64 + 1) * 8), *br = malloc(((size_t)n / 64 + 1) * 8);
    for (int64_t i = 0; i < n; i++) {
      x[i] = nrand() * 6.0f;
      if (i % 17 == 5) x[i] = -INFINITY;
      if (i % 23 == 3) x[i] = -0.0f;
      if (i % 29 == 1) x[i] = -200.0f;
    }
    float mxa, mna, mxr, mnr;
    int64_t bda = a->scan(x, n, &mxa, &mna), bdr = r->scan(x, n, &mxr, &mnr);
    if (bda != bdr || memcmp(&mxa, &mxr, 4) || memcmp(&mna, &mnr, 4)) bad++;
    if (mxa == -INFINITY) mxa = 0;
    double sa = a->expsum(pa, x, n, mxa), sr = r->expsum(pr, x, n, mxa);
    if (memcmp(&sa, &sr, 8) || memcmp(pa, pr, (size_t)n * 4)) {
      bad++;
      fprintf(stderr, "  expsum differs at n = %lld\n", (long long)n);
    }
    double sna = a->expsum(NULL, x, n, mxa);
    if (memcmp(&sna, &sa, 8)) bad++;
    double ta = a->blocksum(pa, n, ba), tr = r->blocksum(pa, n, br);
    if (memcmp(&ta, &tr, 8) || memcmp(ba, br, (size_t)((n + 63) / 64) * 8)) {
      bad++;
      fprintf(stderr, "  blocksum differs at n = %lld\n", (long long)n);
    }
    for (int k = 0; k < 20; k++) {
      float t = nrand() * 8.0f;
      int64_t i0 = (int64_t)(urand() * (double)n);
      for (int ge = 0; ge < 2; ge++)
        if (a->find(x, i0, n, t, ge) != r->find(x, i0, n, t, ge)) bad++;
    }
    if (a->count_ge(x, n, 0.5f) != r->count_ge(x, n, 0.5f)) bad++;
    {
      float *cp = malloc((size_t)n * 4), m1, m2;
      int64_t b1 = a->scan_copy(cp, x, n, &m1, &m2);
      if (b1 != bdr || memcmp(&m1, &mxr, 4) || memcmp(&m2, &mnr, 4) || memcmp(cp, x, (size_t)n * 4)) bad++;
      free(cp);
    }
    /* compaction: both keep_in, thresholds with ties by id, a sorted prefix */
    for (int keep = 0; keep < 2; keep++) {
      int32_t *ia = malloc((size_t)n * 4), *ir = malloc((size_t)n * 4);
      float *xa = malloc((size_t)n * 4), *xr = malloc((size_t)n * 4);
      for (int64_t i = 0; i < n; i++) {
        ia[i] = ir[i] = (int32_t)((i * 7919) % n);
        xa[i] = xr[i] = roundf(x[i]);   /* integers: many ties at the threshold */
      }
      float kt = 1.0f;
      int32_t it = (int32_t)(n / 2);
      int64_t la = -1, lr = -2, s0 = n / 3;
      int64_t wa = a->compact(ia, xa, xa, n, kt, it, keep, s0, &la);
      int64_t wr = r->compact(ir, xr, xr, n, kt, it, keep, s0, &lr);
      if (wa != wr || la != lr || memcmp(ia, ir, (size_t)wa * 4) || memcmp(xa, xr, (size_t)wa * 4)) {
        bad++;
        fprintf(stderr, "  compact differs at n = %lld keep %d\n", (long long)n, keep);
      }
      free(ia);
      free(ir);
      free(xa);
      free(xr);
    }
    {
      uint16_t *ua = malloc((size_t)n * 2), *ur = malloc((size_t)n * 2);
      int32_t *qa = malloc((size_t)n * 4), *qr = malloc((size_t)n * 4);
      a->buckets(ua, x, n, mxa, 97.5f, 2048);
      r->buckets(ur, x, n, mxa, 97.5f, 2048);
      if (memcmp(ua, ur, (size_t)n * 2)) bad++;
      a->buckets(ua, x, n, mxa, 0.0f, 2048);   /* one bucket, -inf apart */
      r->buckets(ur, x, n, mxa, 0.0f, 2048);
      if (memcmp(ua, ur, (size_t)n * 2)) bad++;
      for (int64_t i = 0; i < n; i++)
        if (ua[i] != (x[i] == -INFINITY ? 2048 : 0)) {
          bad++;
          break;
        }
      a->buckets(ua, x, n, mxa, 3.0f, 2048);
      uint16_t v = ua[n / 2];
      int64_t ka = a->collect(qa, ua, n, v), kr = r->collect(qr, ua, n, v);
      if (ka != kr || memcmp(qa, qr, (size_t)ka * 4) || ka < 1) bad++;
      a->iota(qa, n);
      r->iota(qr, n);
      if (memcmp(qa, qr, (size_t)n * 4) || qa[n - 1] != n - 1) bad++;
      memcpy(pr, pa, (size_t)n * 4);
      a->scale(pa, n, 0.37f);
      r->scale(pr, n, 0.37f);
      if (memcmp(pa, pr, (size_t)n * 4)) bad++;
      a->divide(pa, n, 0.37f);
      r->divide(pr, n, 0.37f);
      if (memcmp(pa, pr, (size_t)n * 4)) bad++;
      free(ua);
      free(ur);
      free(qa);
      free(qr);
    }
    /* NaN and +inf are counted the same way */
    x[n / 2] = NAN;
    x[n - 1] = INFINITY;
    bda = a->scan(x, n, &mxa, &mna);
    bdr = r->scan(x, n, &mxr, &mnr);
    if (bda != bdr || bda != (n > 1 ? 2 : 1) || memcmp(&mxa, &mxr, 4) || memcmp(&mna, &mnr, 4)) {
      bad++;
      fprintf(stderr, "  scan with NaN differs at n = %lld (%lld vs %lld)\n", (long long)n, (long long)bda,
              (long long)bdr);
    }
    free(x);
    free(pa);
    free(pr);
    free(ba);
    free(br);
  }
  TT_CHECK(bad == 0, "%d AVX2/reference mismatches", bad);
#endif
}

/* ---- loading and misuse ---- */

static void test_load_checks(void) {
  tide_cands *c;
  TT_OK(tide_cands_new(&c, 100));
  float x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  tide_tensor t = row_tensor(x, 10);
  TT_OK(tide_cands_load(c, &t, 0));
  TT_CHECK(c->n == 10 && c->n_vocab == 10 && c->ascending == 1 && c->id[3] == 3 && c->logit[3] == 4,
           "load: n %d", c->n);
  x[4] = NAN;
  x[7] = NAN;
  x[8] = INFINITY;
  TT_FAILS(tide_cands_load(c, &t, 0), TIDE_E_INVALID, "2 NaN and 1 +inf values (first at token 4)");
  TT_CHECK(c->n == 10 && c->logit[4] == 5, "a failed load changed the set");
  for (int i = 0; i < 10; i++) x[i] = -INFINITY;
  TT_FAILS(tide_cands_load(c, &t, 0), TIDE_E_INVALID, "every one of the 10 logits is -inf");
  x[2] = 0;
  TT_OK(tide_cands_load(c, &t, 0));
  tide_tensor_release(&t);
  float big[200] = {0};
  t = row_tensor(big, 200);
  TT_FAILS(tide_cands_load(c, &t, 0), TIDE_E_INVALID, "larger than the set");
  tide_tensor_release(&t);
  tide_tensor m;
  memset(&m, 0, sizeof m);
  int64_t sh[2] = {2, 5};
  TT_OK(tide_tensor_new(&m, TIDE_F32, 2, sh));
  TT_FAILS(tide_cands_load(c, &m, 0), TIDE_E_INVALID, "one contiguous row");
  tide_tensor_release(&m);
  TT_OK(tide_tensor_new(&m, TIDE_BF16, 1, sh + 1));
  TT_FAILS(tide_cands_load(c, &m, 0), TIDE_E_INVALID, "logits");
  tide_tensor_release(&m);
  int32_t ids[3] = {5, 9, 5};
  float lg[3] = {1, 2, 3};
  TT_FAILS(tide_cands_set(c, ids, lg, 3), TIDE_E_INVALID, "id 5 at position 2 is a duplicate");
  ids[2] = 100;
  TT_FAILS(tide_cands_set(c, ids, lg, 3), TIDE_E_INVALID, "outside the vocabulary");
  ids[2] = 7;
  TT_OK(tide_cands_set(c, ids, lg, 3));
  /* direct writes, then touch */
  c->logit[1] = NAN;
  TT_FAILS(tide_cands_touch(c), TIDE_E_INVALID, "NaN");
  c->logit[1] = 2;
  c->id[0] = 7;
  TT_FAILS(tide_cands_touch(c), TIDE_E_INVALID, "duplicate");
  c->id[0] = 3;
  TT_OK(tide_cands_touch(c));
  TT_CHECK(c->ascending == 0, "ascending after 3, 9, 7");
  TT_FAILS(tide_cands_temperature(c, NAN), TIDE_E_INVALID, "not finite");
  TT_FAILS(tide_cands_top_p(c, NAN, 0), TIDE_E_INVALID, "NaN");
  tide_cands_free(c);
  TT_FAILS(tide_cands_new(&c, 0), TIDE_E_INVALID, "cap = 0");
}

/* ---- stages on llama.cpp's cases ---- */

static const float P4[4] = {0.1f, 0.2f, 0.3f, 0.4f};

static void test_temperature_cases(void) {
  tide_cands *c = from_probs(P4, 4);
  TT_OK(tide_cands_temperature(c, 1.0));
  TT_CHECK(probs_are(c, P4, 4, 1e-5), "temp 1");
  TT_OK(tide_cands_temperature(c, 0.0));
  float e0[4] = {0, 0, 0, 1};
  TT_CHECK(probs_are(c, e0, 4, 1e-6), "temp 0 keeps the best");
  tide_cands_free(c);
  c = from_probs(P4, 4);
  TT_OK(tide_cands_temperature(c, 0.5));
  /* p^2 renormalised */
  float e[4] = {0.01f / 0.3f, 0.04f / 0.3f, 0.09f / 0.3f, 0.16f / 0.3f};
  TT_CHECK(probs_are(c, e, 4, 1e-5), "temp 0.5 squares the probabilities");
  tide_cands_free(c);
}

static void test_top_k_cases(void) {
  struct { int k; float e[4]; } cs[] = {
      {1, {0, 0, 0, 1}}, {3, {0, 0.22222f, 0.33333f, 0.44444f}}, {4, {0.1f, 0.2f, 0.3f, 0.4f}}, {0, {0.1f, 0.2f, 0.3f, 0.4f}},
      {9, {0.1f, 0.2f, 0.3f, 0.4f}}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    tide_cands *c = from_probs(P4, 4);
    TT_OK(tide_cands_top_k(c, cs[i].k));
    TT_CHECK(probs_are(c, cs[i].e, 4, 1e-5), "top-k %d", cs[i].k);
    if (cs[i].k > 0 && cs[i].k < 4) TT_CHECK(c->sorted == cs[i].k && c->id[0] == 3, "top-k output sorted");
    tide_cands_free(c);
  }
  /* all-equal logits: ties go to the smaller ids */
  float eq[6] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  tide_cands *c = from_probs(eq, 6);
  TT_OK(tide_cands_top_k(c, 2));
  TT_CHECK(c->n == 2 && c->id[0] == 0 && c->id[1] == 1, "ties: %d %d", c->id[0], c->id[1]);
  tide_cands_free(c);
  /* one candidate */
  float one[1] = {1.0f};
  c = from_probs(one, 1);
  TT_OK(tide_cands_top_k(c, 5));
  TT_OK(tide_cands_top_p(c, 0.5, 0));
  TT_OK(tide_cands_min_p(c, 0.5, 0));
  TT_OK(tide_cands_typical(c, 0.5, 0));
  TT_OK(tide_cands_xtc(c, 0.1, 0));
  TT_OK(tide_cands_top_n_sigma(c, 1.0));
  tide_rng r;
  tide_rng_seed(&r, 1);
  TT_CHECK(tide_cands_draw(c, &r) == 0 && c->n == 1, "one candidate: draw");
  tide_cands_free(c);
}

static void test_top_p_cases(void) {
  struct { float p; float e[4]; } cs[] = {{0.0f, {0, 0, 0, 1}},
                                          {0.7f, {0, 0, 0.428571f, 0.571429f}},
                                          {0.8f, {0, 0.22222f, 0.33333f, 0.44444f}},
                                          {1.0f, {0.1f, 0.2f, 0.3f, 0.4f}}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    tide_cands *c = from_probs(P4, 4);
    TT_OK(tide_cands_top_p(c, cs[i].p, 0));
    TT_CHECK(probs_are(c, cs[i].e, 4, 1e-5), "top-p %g", (double)cs[i].p);
    tide_cands_free(c);
  }
  /* min_keep wins over p */
  tide_cands *c = from_probs(P4, 4);
  TT_OK(tide_cands_top_p(c, 0.1, 3));
  TT_CHECK(c->n == 3, "min_keep 3: n %d", c->n);
  tide_cands_free(c);
}

static void test_min_p_cases(void) {
  struct { float p; float e[4]; } cs[] = {
      {0.00f, {0.1f, 0.2f, 0.3f, 0.4f}}, {0.24f, {0.1f, 0.2f, 0.3f, 0.4f}}, {0.26f, {0, 0.2f / 0.9f, 0.3f / 0.9f, 0.4f / 0.9f}},
      {0.49f, {0, 0.2f / 0.9f, 0.3f / 0.9f, 0.4f / 0.9f}}, {0.51f, {0, 0, 0.3f / 0.7f, 0.4f / 0.7f}},
      {0.74f, {0, 0, 0.3f / 0.7f, 0.4f / 0.7f}}, {0.76f, {0, 0, 0, 1}}, {1.00f, {0, 0, 0, 1}}, {1.05f, {0, 0, 0, 1}}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    tide_cands *c = from_probs(P4, 4);
    TT_OK(tide_cands_min_p(c, cs[i].p, 0));
    TT_CHECK(probs_are(c, cs[i].e, 4, 1e-5), "min-p %g", (double)cs[i].p);
    tide_cands_free(c);
  }
}

static void test_typical_cases(void) {
  float a[4] = {0.97f, 0.01f, 0.01f, 0.01f}, ea[4] = {1, 0, 0, 0};
  tide_cands *c = from_probs(a, 4);
  TT_OK(tide_cands_typical(c, 0.5, 0));
  TT_CHECK(probs_are(c, ea, 4, 1e-5), "typical 1");
  tide_cands_free(c);
  float b[4] = {0.4f, 0.2f, 0.2f, 0.2f}, eb[4] = {0, 1.0f / 3, 1.0f / 3, 1.0f / 3};
  c = from_probs(b, 4);
  TT_OK(tide_cands_typical(c, 0.5, 0));
  TT_CHECK(probs_are(c, eb, 4, 1e-5), "typical 2");
  tide_cands_free(c);
  c = from_probs(b, 4);
  TT_OK(tide_cands_typical(c, 1.0, 0));
  TT_CHECK(c->n == 4, "typical p = 1 keeps all");
  tide_cands_free(c);
}

static void test_top_n_sigma_cases(void) {
  float e1[4] = {0, 0, 0.428571f, 0.571429f};
  tide_cands *c = from_probs(P4, 4);
  TT_OK(tide_cands_top_n_sigma(c, 1.0));
  TT_CHECK(probs_are(c, e1, 4, 1e-5), "top-n-sigma 1");
  tide_cands_free(c);
  for (int k = 0; k < 2; k++) {
    c = from_probs(P4, 4);
    TT_OK(tide_cands_top_n_sigma(c, k ? 3.0 : 0.0));
    TT_CHECK(probs_are(c, P4, 4, 1e-5), "top-n-sigma %d keeps all", k ? 3 : 0);
    tide_cands_free(c);
  }
}

static void test_xtc_cases(void) {
  float p[4] = {0.4f, 0.3f, 0.2f, 0.1f};
  struct { float t; float e[4]; } cs[] = {{0.09f, {0, 0, 0, 1}},
                                          {0.19f, {0, 0, 2.0f / 3, 1.0f / 3}},
                                          {0.29f, {0, 0.5f, 1.0f / 3, 1.0f / 6}},
                                          {0.39f, {0.4f, 0.3f, 0.2f, 0.1f}},
                                          {0.6f, {0.4f, 0.3f, 0.2f, 0.1f}}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    tide_cands *c = from_probs(p, 4);
    TT_OK(tide_cands_xtc(c, cs[i].t, 0));
    TT_CHECK(probs_are(c, cs[i].e, 4, 1e-5), "xtc %g", (double)cs[i].t);
    tide_cands_free(c);
  }
  tide_cands *c = from_probs(p, 4);
  TT_OK(tide_cands_xtc(c, 0.09, 2));   /* would leave 1 < min_keep */
  TT_CHECK(c->n == 4, "xtc min_keep");
  tide_cands_free(c);
}

static void test_penalty_cases(void) {
  float p5[5] = {0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
  struct { int32_t h[5]; int nh; float rep, fr, pr; float e[5]; } cs[] = {
      {{0}, 1, 50, 0, 0, {0, 0.25f, 0.25f, 0.25f, 0.25f}},
      {{0, 1, 2}, 3, 50, 0, 0, {0, 0, 0, 0.5f, 0.5f}},
      {{0, 1, 2, 0, 0}, 5, 50, 0, 0, {0, 0, 0, 0.5f, 0.5f}},
      {{0}, 1, 1, 5, 5, {0.000011f, 0.249997f, 0.249997f, 0.249997f, 0.249997f}},
      {{0, 1, 2}, 3, 1, 5, 5, {0.000023f, 0.000023f, 0.000023f, 0.499966f, 0.499966f}},
      {{0, 1, 2, 0, 0}, 5, 1, 5, 5, {0.000000f, 0.000023f, 0.000023f, 0.499977f, 0.499977f}}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    tide_cands *c = from_probs(p5, 5);
    tide_hist *h;
    TT_OK(tide_hist_new(&h, cs[i].nh, 1));
    TT_OK(tide_hist_push(h, cs[i].h, cs[i].nh));
    TT_OK(tide_cands_penalties(c, h, cs[i].rep, cs[i].fr, cs[i].pr));
    /* "probability 0" in llama.cpp's table is 1e-8-ish: compare all but presence */
    TT_OK(tide_cands_softmax(c));
    int ok = 1;
    for (int k = 0; k < 5; k++) ok &= fabs(c->p[k] - cs[i].e[c->id[k]]) < 1e-5;
    TT_CHECK(ok, "penalties case %zu", i);
    tide_hist_free(h);
    tide_cands_free(c);
  }
  /* on a set that is not a whole row (after a sort) the result is the same */
  float x[6] = {1, 2, 3, -1, 0.5f, 2.5f};
  tide_cands *a, *b;
  TT_OK(tide_cands_new(&a, 6));
  TT_OK(tide_cands_new(&b, 6));
  tide_tensor t = row_tensor(x, 6);
  TT_OK(tide_cands_load(a, &t, 0));
  TT_OK(tide_cands_load(b, &t, 0));
  TT_OK(tide_cands_sort(b, -1));
  tide_hist *h;
  TT_OK(tide_hist_new(&h, 8, 1));
  int32_t toks[5] = {3, 1, 3, 5, 0};
  TT_OK(tide_hist_push(h, toks, 5));
  TT_OK(tide_cands_penalties(a, h, 1.3, 0.2, 0.1));
  TT_OK(tide_cands_penalties(b, h, 1.3, 0.2, 0.1));
  int ok = 1;
  for (int i = 0; i < 6; i++) ok &= a->logit[b->id[i]] == b->logit[i];
  TT_CHECK(ok, "penalties depend on the layout");
  TT_CHECK(a->logit[3] == -1.0f * 1.3f - (2 * 0.2f + 0.1f), "negative logit multiplied: %g", (double)a->logit[3]);
  TT_CHECK(a->logit[1] == 2.0f / 1.3f - (0.2f + 0.1f), "positive logit divided: %g", (double)a->logit[1]);
  TT_CHECK(a->logit[2] == 3.0f, "untouched token changed");
  tide_hist_free(h);
  tide_tensor_release(&t);
  tide_cands_free(a);
  tide_cands_free(b);
}

static void dry_case(const float *probs, int nv, const int32_t *hist, int nh, const float *expected, float mult,
                     float base, int allowed, int last_n, const int32_t *breaker, int blen, const char *what) {
  tide_cands *c = from_probs(probs, nv);
  tide_hist *h;
  TT_OK(tide_hist_new(&h, -1, 0));
  TT_OK(tide_hist_push(h, hist, nh));
  tide_dry *d = NULL;
  if (blen) {
    TT_OK(tide_dry_new(&d));
    TT_OK(tide_dry_add_breaker(d, breaker, blen));
  }
  TT_OK(tide_cands_dry(c, d, h, mult, base, allowed, last_n));
  TT_CHECK(probs_are(c, expected, nv, 1e-5), "dry: %s", what);
  tide_dry_free(d);
  tide_hist_free(h);
  tide_cands_free(c);
}

static void test_dry_cases(void) {
  float q4[4] = {0.25f, 0.25f, 0.25f, 0.25f}, q5[5] = {0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
  int32_t h1[] = {0, 1}, h2[] = {0, 1, 2, 0, 1}, h3[] = {0, 1, 3, 4, 0, 1}, h5[] = {0, 1, 2, 3, 4, 0, 1};
  float e2[4] = {0.296923f, 0.296923f, 0.109232f, 0.296923f};
  float e4[5] = {0.241818f, 0.241818f, 0.032727f, 0.241818f, 0.241818f};
  int32_t br3[1] = {3};
  dry_case(q4, 4, h1, 2, q4, 1.0f, 1.1f, 2, 4, NULL, 0, "too short to repeat");
  dry_case(q4, 4, h2, 5, e2, 1.0f, 1.1f, 2, 5, NULL, 0, "0 1 2 0 1 penalises 2");
  dry_case(q5, 5, h3, 6, q5, 1.0f, 1.1f, 2, 6, br3, 1, "a breaker in between stops it");
  dry_case(q5, 5, h2, 5, e4, 2.0f, 1.1f, 2, 5, NULL, 0, "multiplier 2");
  dry_case(q5, 5, h5, 7, q5, 1.0f, 1.1f, 4, 7, NULL, 0, "allowed length 4");
  /* longer repeats grow the exponent: 0 1 2 3 0 1 2 -> 3 extends a repeat of
   * 3 tokens: penalty 1.75^(3-2) */
  int32_t h6[] = {0, 1, 2, 3, 0, 1, 2};
  tide_cands *c = from_probs(q5, 5);
  tide_hist *h;
  TT_OK(tide_hist_new(&h, -1, 0));
  TT_OK(tide_hist_push(h, h6, 7));
  TT_OK(tide_cands_dry(c, NULL, h, 0.8, 1.75, 2, -1));
  float l0 = logf(0.2f);
  TT_CHECK(c->logit[3] == l0 - (float)(0.8f * 1.75), "exponent 1: %g vs %g", (double)c->logit[3],
           (double)(l0 - 0.8f * 1.75f));
  TT_CHECK(c->logit[0] == l0 && c->logit[1] == l0 && c->logit[2] == l0 && c->logit[4] == l0, "others untouched");
  /* last_n = 3 only sees "0 1 2": nothing repeats */
  tide_cands_free(c);
  c = from_probs(q5, 5);
  TT_OK(tide_cands_dry(c, NULL, h, 0.8, 1.75, 2, 3));
  TT_CHECK(c->logit[3] == l0, "last_n window");
  tide_cands_free(c);
  /* a one-token breaker is never penalised itself; a multi-token breaker
   * (2, 3) in the history limits the repeat */
  c = from_probs(q5, 5);
  tide_dry *d;
  TT_OK(tide_dry_new(&d));
  int32_t b3[1] = {3};
  TT_OK(tide_dry_add_breaker(d, b3, 1));
  TT_OK(tide_dry_add_breaker(d, b3, 1));
  TT_CHECK(tide_dry_count(d) == 1, "duplicate breaker kept");
  int32_t h7[] = {0, 1, 2, 4, 0, 1, 2};
  tide_hist_clear(h);
  TT_OK(tide_hist_push(h, h7, 7));
  TT_OK(tide_cands_dry(c, d, h, 0.8, 1.75, 2, -1));
  TT_CHECK(c->logit[4] < l0, "4 extends 0 1 2");
  tide_cands_free(c);
  int32_t h8[] = {0, 1, 3, 0, 1};   /* the breaker 3 lies inside the window */
  int32_t h9[] = {3, 0, 1, 3, 0, 1};   /* ... and the breaker itself */
  tide_hist_clear(h);
  TT_OK(tide_hist_push(h, h8, 5));
  c = from_probs(q5, 5);
  TT_OK(tide_cands_dry(c, d, h, 0.8, 1.75, 2, -1));
  TT_CHECK(c->logit[3] == l0, "one-token breaker penalised");
  tide_cands_free(c);
  tide_hist_clear(h);
  TT_OK(tide_hist_push(h, h9, 6));
  c = from_probs(q5, 5);
  TT_OK(tide_cands_dry(c, d, h, 0.8, 1.75, 1, -1));
  TT_CHECK(c->logit[3] == l0, "the breaker was penalised");
  tide_cands_free(c);
  tide_dry_free(d);
  TT_OK(tide_dry_new(&d));
  int32_t b23[2] = {2, 3};
  TT_OK(tide_dry_add_breaker(d, b23, 2));
  /* 4 2 3 1 4 2 3 1: without breakers 4 extends a repeat of 4 tokens; the
   * breaker (2, 3) leaves one token after it, less than allowed_length */
  int32_t h10[] = {4, 2, 3, 1, 4, 2, 3, 1};
  tide_hist_clear(h);
  TT_OK(tide_hist_push(h, h10, 8));
  c = from_probs(q5, 5);
  TT_OK(tide_cands_dry(c, d, h, 0.8, 1.75, 2, -1));
  TT_CHECK(c->logit[4] == l0, "the two-token breaker did not limit the repeat");
  tide_cands_free(c);
  c = from_probs(q5, 5);
  TT_OK(tide_cands_dry(c, NULL, h, 0.8, 1.75, 2, -1));
  TT_CHECK(c->logit[4] == l0 - (float)(0.8 * pow(1.75f, 2)), "without breakers: %g", (double)c->logit[4]);
  tide_cands_free(c);
  tide_dry_free(d);
  tide_hist_free(h);
}

/* ---- large rows against a brute-force canonical sort ---- */

static void fill_row(float *x, int64_t n, float scale, int ties) {
  for (int64_t i = 0; i < n; i++) x[i] = nrand() * scale;
  if (ties)
    for (int64_t i = 0; i < n; i++) x[i] = roundf(x[i] * 4) / 4;   /* many equal logits */
}

static void test_selection_large(void) {
  int64_t n = 129280;
  float *x = malloc((size_t)n * 4);
  tide_cands *c;
  TT_OK(tide_cands_new(&c, n));
  tide_tensor t = row_tensor(x, n);
  int64_t ks[] = {1, 2, 40, 256, 1024, 1025, 5000, 60000};
  for (int ties = 0; ties < 2; ties++) {
    fill_row(x, n, 3.0f, ties);
    int32_t *order = canon_order(x, n);
    for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
      for (int permuted = 0; permuted < 2; permuted++) {
        int64_t k = ks[j];
        TT_OK(tide_cands_load(c, &t, 0));
        if (permuted) {
          /* scramble positions first: reverse the row through a sort of 10 */
          TT_OK(tide_cands_sort(c, 10));
          int32_t ti = c->id[0];
          float tl = c->logit[0];
          c->id[0] = c->id[n - 1];
          c->logit[0] = c->logit[n - 1];
          c->id[n - 1] = ti;
          c->logit[n - 1] = tl;
          TT_OK(tide_cands_touch(c));
        }
        TT_OK(tide_cands_top_k(c, k));
        int ok = c->n == k && c->sorted == k;
        for (int64_t i = 0; ok && i < k; i++) ok = c->id[i] == order[i];
        TT_CHECK(ok, "top-k %lld (ties %d, permuted %d)", (long long)k, ties, permuted);
      }
    }
    /* sort(m) puts the best m first and keeps everything */
    TT_OK(tide_cands_load(c, &t, 0));
    TT_OK(tide_cands_sort(c, 3000));
    int ok = c->n == n && c->sorted == 3000;
    for (int64_t i = 0; ok && i < 3000; i++) ok = c->id[i] == order[i];
    TT_CHECK(ok, "sort 3000");
    TT_OK(tide_cands_sort(c, -1));
    ok = c->n == n && c->sorted == n;
    for (int64_t i = 0; ok && i < n; i++) ok = c->id[i] == order[i];
    TT_CHECK(ok, "full sort (ties %d)", ties);
    /* argmax and find */
    TT_OK(tide_cands_load(c, &t, 0));
    TT_CHECK(tide_cands_argmax(c) == order[0], "argmax");
    TT_CHECK(tide_cands_find(c, 777) == 777, "find on a row");
    TT_OK(tide_cands_top_k(c, 100));
    TT_CHECK(tide_cands_find(c, order[57]) == 57 && tide_cands_find(c, order[500]) == -1, "find on a subset");
    free(order);
  }
  tide_tensor_release(&t);
  free(x);
  tide_cands_free(c);
}

/* brute force nucleus size: smallest L with sum of the L best p >= p */
static int64_t nucleus_size(const float *x, const int32_t *order, int64_t n, double p) {
  double mx = x[order[0]], s = 0;
  for (int64_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
  double acc = 0;
  for (int64_t i = 0; i < n; i++) {
    acc += exp((double)x[order[i]] - mx) / s;
    if (acc >= p) return i + 1;
  }
  return n;
}

static void test_top_p_large(void) {
  int64_t n = 129280;
  float *x = malloc((size_t)n * 4);
  tide_cands *c;
  TT_OK(tide_cands_new(&c, n));
  tide_tensor t = row_tensor(x, n);
  float scales[] = {8.0f, 3.0f, 1.0f};   /* peaked (heap path) to flat (histogram path) */
  double ps[] = {0.5, 0.9, 0.95, 0.999};
  for (size_t s = 0; s < 3; s++) {
    fill_row(x, n, scales[s], s == 2);
    int32_t *order = canon_order(x, n);
    for (size_t j = 0; j < 4; j++) {
      TT_OK(tide_cands_load(c, &t, 0));
      TT_OK(tide_cands_top_p(c, ps[j], 1));
      int64_t L = nucleus_size(x, order, n, ps[j]);
      /* the sums differ in rounding only: allow the boundary to move by one
       * when the mass at L-1 is within 1e-6 of p */
      int ok = same_set(c, order, c->n) && llabs((long long)(c->n - L)) <= 1;
      TT_CHECK(ok, "top-p %g (scale %g): %d vs %lld", ps[j], (double)scales[s], c->n, (long long)L);
    }
    /* min-p against its definition */
    TT_OK(tide_cands_load(c, &t, 0));
    TT_OK(tide_cands_min_p(c, 0.05, 1));
    float thr = x[order[0]] + logf(0.05f);
    int64_t want = 0;
    while (want < n && x[order[want]] >= thr) want++;
    TT_CHECK(same_set(c, order, want), "min-p 0.05 (scale %g)", (double)scales[s]);
    free(order);
  }
  tide_tensor_release(&t);
  free(x);
  tide_cands_free(c);
}

/* typical on a large row against a brute-force sort by |-log p - H| */
static float *g_score;
static const float *g_lg;
static int typ_cmp(const void *a, const void *b) {
  int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
  if (g_score[ia] < g_score[ib]) return -1;
  if (g_score[ia] > g_score[ib]) return 1;
  if (g_lg[ia] > g_lg[ib]) return -1;
  if (g_lg[ia] < g_lg[ib]) return 1;
  return ia < ib ? -1 : ia > ib;
}

static void test_typical_large(void) {
  int64_t n = 20000;
  float *x = malloc((size_t)n * 4);
  fill_row(x, n, 2.0f, 0);
  tide_cands *c;
  TT_OK(tide_cands_new(&c, n));
  tide_tensor t = row_tensor(x, n);
  TT_OK(tide_cands_load(c, &t, 0));
  TT_OK(tide_cands_softmax(c));
  double lse = c->lse, h = 0;
  for (int64_t i = 0; i < n; i++) h -= c->p[i] > 0 ? c->p[i] * ((double)x[i] - lse) : 0;
  g_score = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) g_score[i] = (float)fabs((lse - h) - (double)x[i]);
  g_lg = x;
  int32_t *o = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) o[i] = (int32_t)i;
  qsort(o, (size_t)n, 4, typ_cmp);
  double acc = 0;
  int64_t L = n;
  for (int64_t i = 0; i < n; i++) {
    acc += exp((double)x[o[i]] - lse);
    if (acc > 0.7) {
      L = i + 1;
      break;
    }
  }
  TT_OK(tide_cands_typical(c, 0.7, 1));
  TT_CHECK(llabs((long long)(c->n - L)) <= 2 && same_set(c, o, c->n), "typical 0.7: %d vs %lld", c->n, (long long)L);
  free(o);
  free(g_score);
  tide_tensor_release(&t);
  free(x);
  tide_cands_free(c);
}

/* ---- draws ---- */

static double chi2(const int64_t *obs, const double *p, int k, int64_t n) {
  double s = 0;
  for (int i = 0; i < k; i++) {
    double e = p[i] * (double)n;
    if (e > 0) s += ((double)obs[i] - e) * ((double)obs[i] - e) / e;
  }
  return s;
}

static void test_draw_distribution(void) {
  /* 4 outcomes, df 3: chi2 < 16.27 at p = 0.001; the seed is fixed so the
   * statistic is a deterministic number */
  float lg[5] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f), -INFINITY};
  int32_t ids[5] = {0, 1, 2, 3, 4};
  tide_cands *c;
  TT_OK(tide_cands_new(&c, 5));
  tide_rng r;
  tide_rng_seed(&r, 2024);
  int64_t obs[5] = {0};
  int64_t n = 100000;
  for (int64_t i = 0; i < n; i++) {
    TT_OK(tide_cands_set(c, ids, lg, 5));
    int pos = tide_cands_draw(c, &r);
    obs[c->id[pos]]++;
  }
  double p[4] = {0.1, 0.2, 0.3, 0.4};
  double x2 = chi2(obs, p, 4, n);
  TT_CHECK(x2 < 16.27, "chi2 = %g (%lld %lld %lld %lld)", x2, (long long)obs[0], (long long)obs[1],
           (long long)obs[2], (long long)obs[3]);
  TT_CHECK(obs[4] == 0, "a -inf token was drawn %lld times", (long long)obs[4]);
  tide_cands_free(c);
  /* a large row: draws over 129280 candidates, grouped in 8 bins of equal
   * mass by the exact cumulative distribution */
  int64_t V = 129280;
  float *x = malloc((size_t)V * 4);
  fill_row(x, V, 1.0f, 0);
  double *cdf = malloc((size_t)V * 8), mx = -1e30, s = 0;
  for (int64_t i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
  for (int64_t i = 0; i < V; i++) s += exp(x[i] - mx);
  double acc = 0;
  for (int64_t i = 0; i < V; i++) {
    acc += exp(x[i] - mx) / s;
    cdf[i] = acc;
  }
  TT_OK(tide_cands_new(&c, V));
  tide_tensor t = row_tensor(x, V);
  int64_t bins[8] = {0}, m = 8000;
  for (int64_t i = 0; i < m; i++) {
    TT_OK(tide_cands_load(c, &t, 0));
    int pos = tide_cands_draw(c, &r);
    double before = c->id[pos] ? cdf[c->id[pos] - 1] : 0, mid = (before + cdf[c->id[pos]]) / 2;
    int b = (int)(mid * 8);
    bins[b > 7 ? 7 : b]++;
  }
  double q[8] = {0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125};
  /* df 7: chi2 < 24.32 at p = 0.001 */
  x2 = chi2(bins, q, 8, m);
  TT_CHECK(x2 < 24.32, "large-row chi2 = %g", x2);
  tide_tensor_release(&t);
  free(x);
  free(cdf);
  tide_cands_free(c);
}

static void test_draw_reproducible(void) {
  int64_t V = 50000;
  float *x = malloc((size_t)V * 4);
  fill_row(x, V, 2.0f, 0);
  tide_tensor t = row_tensor(x, V);
  tide_cands *c;
  TT_OK(tide_cands_new(&c, V));
  int32_t seq[3][64];
  for (int pass = 0; pass < 3; pass++) {
    /* pass 0: default kernels, 1 thread; 1: 2 threads; 2: scalar references */
    tide_threads_set(pass == 1 ? 2 : 1);
    int old = tide_kernels_force_ref(pass == 2);
    tide_rng r;
    tide_rng_seed(&r, 99);
    for (int i = 0; i < 64; i++) {
      TT_OK(tide_cands_load(c, &t, 0));
      TT_OK(tide_cands_top_p(c, 0.9, 1));
      TT_OK(tide_cands_temperature(c, 0.7));
      seq[pass][i] = c->id[tide_cands_draw(c, &r)];
    }
    tide_kernels_force_ref(old);
  }
  tide_threads_set(0);
  TT_CHECK(memcmp(seq[0], seq[1], sizeof seq[0]) == 0, "tokens depend on the thread count");
  TT_CHECK(memcmp(seq[0], seq[2], sizeof seq[0]) == 0, "tokens depend on the kernel path");
  tide_tensor_release(&t);
  free(x);
  tide_cands_free(c);
}

/* ---- histories ---- */

static void test_hist(void) {
  tide_hist *h;
  TT_OK(tide_hist_new(&h, 4, 1));
  int32_t a[6] = {5, 6, 5, 7, 8, 5};
  TT_OK(tide_hist_push(h, a, 6));
  TT_CHECK(tide_hist_len(h) == 4, "len %lld", (long long)tide_hist_len(h));
  TT_CHECK(tide_hist_get(h, 0) == 5 && tide_hist_get(h, 3) == 5 && tide_hist_get(h, 4) == -1, "get");
  TT_CHECK(tide_hist_count(h, 5) == 2 && tide_hist_count(h, 6) == 0 && tide_hist_count(h, 7) == 1, "counts");
  int32_t out[8];
  TT_CHECK(tide_hist_read(h, out, 8) == 4 && out[0] == 5 && out[1] == 7 && out[3] == 5, "read");
  TT_CHECK(tide_hist_read(h, out, 2) == 2 && out[0] == 8 && out[1] == 5, "read newest 2");
  int32_t neg = -3;
  TT_FAILS(tide_hist_push(h, &neg, 1), TIDE_E_RANGE, "negative");
  TT_CHECK(tide_hist_len(h) == 4, "failed push changed the history");
  tide_hist *u;
  TT_OK(tide_hist_new(&u, -1, 0));
  TT_OK(tide_hist_push(u, a, 6));
  TT_OK(tide_hist_assign(h, u));
  TT_CHECK(tide_hist_len(h) == 4 && tide_hist_count(h, 5) == 2 && tide_hist_get(h, 3) == 5, "assign");
  tide_hist_free(u);
  tide_hist_clear(h);
  TT_CHECK(tide_hist_len(h) == 0 && tide_hist_count(h, 5) == 0, "clear");
  tide_hist_free(h);
  /* counts under churn: a small vocabulary with many collisions, compared
   * with counting the window directly */
  for (int w = 1; w <= 64; w *= 4) {
    TT_OK(tide_hist_new(&h, w, 1));
    int32_t *all = malloc(5000 * 4);
    int bad = 0;
    for (int i = 0; i < 5000; i++) {
      all[i] = (int32_t)(urand() * 37) * 1024;   /* ids that share hash slots */
      TT_OK(tide_hist_push(h, all + i, 1));
      if (i % 97 == 0)
        for (int v = 0; v < 37; v++) {
          int64_t cnt = 0;
          for (int j = i - w + 1; j <= i; j++)
            if (j >= 0 && all[j] == v * 1024) cnt++;
          bad += tide_hist_count(h, v * 1024) != cnt;
        }
    }
    TT_CHECK(bad == 0, "window %d: %d wrong counts", w, bad);
    free(all);
    tide_hist_free(h);
  }
  /* window 0 keeps nothing; unbounded keeps everything */
  TT_OK(tide_hist_new(&h, 0, 1));
  TT_OK(tide_hist_push(h, a, 6));
  TT_CHECK(tide_hist_len(h) == 0, "window 0");
  tide_hist_free(h);
  TT_OK(tide_hist_new(&h, -1, 1));
  for (int i = 0; i < 1000; i++) TT_OK(tide_hist_push(h, a, 6));
  TT_CHECK(tide_hist_len(h) == 6000 && tide_hist_count(h, 5) == 3000, "unbounded");
  tide_hist_free(h);
}

/* ---- logprobs, bias, trace ---- */

static void test_logprobs(void) {
  float x[7] = {1.0f, 3.0f, -INFINITY, 3.0f, 0.5f, -2.0f, 2.0f};
  tide_tensor t = row_tensor(x, 7);
  int32_t ids[4];
  float lps[4];
  tide_logprobs io = {4, 4, ids, lps, 0, 0, 0, 0};
  TT_OK(tide_logits_logprobs(&t, &io));
  double s = 0;
  for (int i = 0; i < 7; i++) s += exp((double)x[i] - 3.0);
  double lse = 3.0 + log(s);
  TT_CHECK(fabs(io.lse - lse) < 1e-6, "lse %g vs %g", io.lse, lse);
  TT_CHECK(fabs(io.target_logprob - (0.5 - lse)) < 1e-6 && io.target_rank == 4, "target lp %g rank %lld",
           io.target_logprob, (long long)io.target_rank);
  TT_CHECK(io.n_out == 4 && ids[0] == 1 && ids[1] == 3 && ids[2] == 6 && ids[3] == 0, "top ids %d %d %d %d", ids[0],
           ids[1], ids[2], ids[3]);
  TT_CHECK(fabs(lps[2] - (2.0 - lse)) < 1e-6, "top logprob");
  io.target = 2;
  TT_OK(tide_logits_logprobs(&t, &io));
  TT_CHECK(io.target_logprob == -INFINITY && io.target_rank == 6, "banned token logprob");
  io.target = 7;
  TT_FAILS(tide_logits_logprobs(&t, &io), TIDE_E_RANGE, "target 7");
  x[3] = NAN;
  io.target = 0;
  TT_FAILS(tide_logits_logprobs(&t, &io), TIDE_E_INVALID, "NaN");
  tide_tensor_release(&t);
  /* topn of a set after a stage matches its softmax */
  tide_cands *c = from_probs(P4, 4);
  TT_OK(tide_cands_top_k(c, 3));
  int k = tide_cands_topn(c, 5, ids, lps);
  TT_CHECK(k == 3 && ids[0] == 3 && fabs(expf(lps[0]) - 0.4f / 0.9f) < 1e-6, "topn: %d", k);
  /* asking for more than the set holds writes (and allocates for) the set only */
  k = tide_cands_topn(c, (int64_t)1 << 40, ids, lps);
  TT_CHECK(k == 3 && ids[0] == 3, "topn of 2^40: %d", k);
  tide_cands_free(c);
}

static void test_bias(void) {
  float x[5] = {0, 0, 0, 0, 0};
  tide_cands *c;
  TT_OK(tide_cands_new(&c, 5));
  tide_tensor t = row_tensor(x, 5);
  TT_OK(tide_cands_load(c, &t, 0));
  int32_t ids[3] = {1, 3, 1};
  float b[3] = {1.0f, -INFINITY, 0.5f};
  TT_OK(tide_cands_bias(c, ids, b, 3));
  TT_CHECK(c->logit[1] == 1.5f && c->logit[3] == -INFINITY && c->logit[0] == 0, "bias on a row");
  /* on a subset in another order */
  TT_OK(tide_cands_load(c, &t, 0));
  TT_OK(tide_cands_top_k(c, 3));   /* ids 0 1 2 */
  int32_t i4[2] = {2, 4};
  float b4[2] = {2.0f, 9.0f};
  TT_OK(tide_cands_bias(c, i4, b4, 2));
  TT_CHECK(c->n == 3 && c->logit[tide_cands_find(c, 2)] == 2.0f, "bias on a subset");
  i4[1] = 5;
  TT_FAILS(tide_cands_bias(c, i4, b4, 2), TIDE_E_RANGE, "token 5 outside");
  b4[1] = INFINITY;
  i4[1] = 4;
  TT_FAILS(tide_cands_bias(c, i4, b4, 2), TIDE_E_INVALID, "+inf");
  tide_tensor_release(&t);
  tide_cands_free(c);
}

static void test_trace(void) {
  float x[6] = {3, 2, 1, 0, -1, -INFINITY};
  tide_cands *c;
  TT_OK(tide_cands_new(&c, 6));
  tide_tensor t = row_tensor(x, 6);
  TT_OK(tide_cands_load(c, &t, TIDE_CANDS_TRACE));
  double s = 0;
  for (int i = 0; i < 5; i++) s += exp(x[i]);
  tide_cands_trace tr;
  TT_OK(tide_cands_trace_begin(c));
  TT_OK(tide_cands_top_k(c, 2));
  TT_OK(tide_cands_trace_end(c, &tr));
  double m2 = (exp(3) + exp(2)) / s;
  TT_CHECK(tr.n_in == 6 && tr.n_out == 2, "counts %lld %lld", (long long)tr.n_in, (long long)tr.n_out);
  TT_CHECK(fabs(tr.mass_in - m2) < 1e-6 && fabs(tr.mass_raw - m2) < 1e-6, "mass %g %g vs %g", tr.mass_in,
           tr.mass_raw, m2);
  double p0 = exp(1) / (exp(1) + 1), h = -(p0 * log(p0) + (1 - p0) * log(1 - p0));
  TT_CHECK(fabs(tr.entropy - h) < 1e-6, "entropy %g vs %g", tr.entropy, h);
  TT_OK(tide_cands_trace_begin(c));
  TT_OK(tide_cands_temperature(c, 0.5));
  TT_OK(tide_cands_trace_end(c, &tr));
  TT_CHECK(fabs(tr.mass_in - 1) < 1e-6 && fabs(tr.mass_raw - m2) < 1e-6, "temperature keeps the mass");
  TT_FAILS(tide_cands_trace_end(c, &tr), TIDE_E_STATE, "without trace_begin");
  tide_tensor_release(&t);
  tide_cands_free(c);
}

static void test_entropy_and_stamp(void) {
  float u[4] = {0.25f, 0.25f, 0.25f, 0.25f};
  tide_cands *c = from_probs(u, 4);
  double h;
  TT_OK(tide_cands_entropy(c, &h));
  TT_CHECK(fabs(h - log(4.0)) < 1e-6, "uniform entropy %g", h);
  tide_cands_free(c);
  const char *dir = getenv("TIDE_TEST_TMP");
  char path[512];
  snprintf(path, sizeof path, "%s/stamp.txt", dir ? dir : "/tmp");
  FILE *f = fopen(path, "wb");
  fputs("hello", f);
  fclose(f);
  int64_t mt = 0, sz = 0;
  TT_OK(tide_file_stamp(path, &mt, &sz));
  TT_CHECK(sz == 5 && mt > 0, "stamp %lld %lld", (long long)mt, (long long)sz);
  remove(path);
  TT_FAILS(tide_file_stamp(path, &mt, &sz), TIDE_E_IO, "cannot stat");
  TT_CHECK(tide_hash64("a", 1) == 0xaf63dc4c8601ec8cull, "fnv1a('a')");
}

static void test_no_leaks(void) {
  tide_alloc_stats s0, s1;
  tide_alloc_stats_get(&s0);
  tide_cands *c;
  TT_OK(tide_cands_new(&c, 1000));
  float x[1000];
  for (int i = 0; i < 1000; i++) x[i] = nrand();
  tide_tensor t = row_tensor(x, 1000);
  TT_OK(tide_cands_load(c, &t, TIDE_CANDS_TRACE));
  TT_OK(tide_cands_trace_begin(c));
  TT_OK(tide_cands_sort(c, 500));
  TT_OK(tide_cands_typical(c, 0.5, 1));
  tide_cands_trace tr;
  TT_OK(tide_cands_trace_end(c, &tr));
  tide_hist *h;
  TT_OK(tide_hist_new(&h, -1, 1));
  int32_t toks[3] = {1, 2, 1};
  TT_OK(tide_hist_push(h, toks, 3));
  TT_OK(tide_cands_dry(c, NULL, h, 1, 2, 1, -1));
  tide_hist_free(h);
  tide_tensor_release(&t);
  tide_cands_free(c);
  tide_alloc_stats_get(&s1);
  TT_CHECK(s1.live_allocs == s0.live_allocs && s1.live_bytes == s0.live_bytes, "leak: %lld blocks",
           (long long)(s1.live_allocs - s0.live_allocs));
}

TT_RUN(TT(test_rng_known_answers), TT(test_rng_uniform), TT(test_exp_accuracy), TT(test_kernels_avx2_vs_ref),
       TT(test_load_checks), TT(test_temperature_cases), TT(test_top_k_cases), TT(test_top_p_cases),
       TT(test_min_p_cases), TT(test_typical_cases), TT(test_top_n_sigma_cases), TT(test_xtc_cases),
       TT(test_penalty_cases), TT(test_dry_cases), TT(test_selection_large), TT(test_top_p_large),
       TT(test_typical_large), TT(test_draw_distribution), TT(test_draw_reproducible), TT(test_hist),
       TT(test_logprobs), TT(test_bias), TT(test_trace), TT(test_entropy_and_stamp), TT(test_no_leaks))
