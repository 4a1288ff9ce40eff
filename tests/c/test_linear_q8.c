/* test_linear_q8.c - the opt-in int8-activation path for MXFP4 (policy
 * TIDE_LINEAR_Q8, kernels/linear_q8.h): the AVX2 quantiser and kernel
 * against their scalar references bitwise on awkward shapes and values
 * (every M from 1 to 13 and some up to 70, ragged row counts, NaN / Inf / zero / tiny blocks,
 * NaN and extreme scales), the accuracy against the exact double reference,
 * batch, row-range and thread invariance through the public API, shared-x
 * jobs, the policy's scope (other formats and the explicit backends keep
 * the exact path) and the MoE switch. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "linear_q8.h"
#include "tide.h"
#include "tt.h"

static uint64_t rng = 0x2545f4914f6cdd1dULL;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}

typedef struct {
  tide_tensor w, s;
  tide_linear *l;
} weight;

static void mx_make(weight *q, int64_t N, int64_t K, int scale_lo, int scale_span) {
  memset(q, 0, sizeof *q);
  int64_t ws[2] = {N, K / 2}, ss[2] = {N, K / 32};
  TT_OK(tide_tensor_new(&q->w, TIDE_I8, 2, ws));
  TT_OK(tide_tensor_new(&q->s, TIDE_E8M0, 2, ss));
  uint8_t *p = q->w.data;
  for (int64_t i = 0; i < N * K / 2; i++) p[i] = (uint8_t)rnd();
  uint8_t *s = q->s.data;
  for (int64_t i = 0; i < N * K / 32; i++) s[i] = (uint8_t)(scale_lo + (int)(rnd() % (unsigned)scale_span));
  TT_OK(tide_linear_new(&q->l, &q->w, &q->s));
}

static void weight_free(weight *q) {
  tide_linear_free(q->l);
  tide_tensor_release(&q->w);
  tide_tensor_release(&q->s);
}

static void x_make(tide_tensor *x, int64_t M, int64_t K, uint64_t seed) {
  int64_t shp[2] = {M, K};
  memset(x, 0, sizeof *x);
  TT_OK(tide_tensor_new(x, TIDE_F32, 2, shp));
  TT_OK(tide_tensor_rand(x, seed, TIDE_RAND_NORMAL, 0.0, 1.0));
  float *p = x->data;
  for (int64_t i = 0; i < M * K; i++) p[i] = tide_bf16_to_f32(tide_f32_to_bf16(p[i]));
}

static void y_make(tide_tensor *y, int64_t M, int64_t N) {
  int64_t shp[2] = {M, N};
  memset(y, 0, sizeof *y);
  TT_OK(tide_tensor_new(y, TIDE_F32, 2, shp));
}

static int same_or_nan(const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (isnan(a[i]) && isnan(b[i])) continue;
    if (memcmp(&a[i], &b[i], 4) != 0) return 0;
  }
  return 1;
}

/* awkward blocks: zeros, a lone value, Inf, NaN, tiny, huge, ties */
static void awkward_x(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    int64_t blk = i / 32;
    switch (blk % 9) {
      case 0: x[i] = 0.0f; break;
      case 1: x[i] = (i % 32 == 5) ? -3.0f : 0.0f; break;
      case 2: x[i] = (i % 32 == 7) ? INFINITY : 1.0f; break;
      case 3: x[i] = (i % 32 == 9) ? NAN : -1.0f; break;
      case 4: x[i] = 1e-38f * (float)(i % 7); break;
      case 5: x[i] = 3e38f * ((i % 2) ? 1.0f : -0.5f); break;
      case 6: x[i] = 0.5f * (float)((int)(i % 32) - 16); break; /* x * 127/amax lands on .5 ties */
      case 7: x[i] = (float)(i % 32) * 1e-40f; break;          /* subnormal block */
      default: x[i] = tide_bf16_to_f32(tide_f32_to_bf16((float)sin((double)i))); break;
    }
  }
}

/* column c of block b in row i of the pair layout */
static int q_at(const tide_q8_rows *r, int64_t np, int64_t i, int64_t b, int c) {
  const int8_t *Q = r->q + (i * np + b / 2) * 64;
  return (c & 1) ? Q[32 + (b & 1) * 16 + c / 2] : Q[(b & 1) * 16 + c / 2];
}

static void quantizer_same_bits(void) {
  static const int64_t Ks[] = {32, 64, 288, 4096, 96};
  for (int ki = 0; ki < 5; ki++) {
    int64_t K = Ks[ki], M = 3, ldx = K + 5, nb = K / 32, np = (nb + 1) / 2;
    float *x = malloc((size_t)(M * ldx) * 4);
    for (int64_t i = 0; i < M; i++) awkward_x(x + i * ldx, K);
    for (int64_t i = 0; i < K; i++) x[2 * ldx + i] = (float)((int)(rnd() % 2001) - 1000) / 7.0f;
    size_t bytes = tide_q8_bytes(M, K);
    void *b1 = malloc(bytes), *b2 = malloc(bytes);
    memset(b1, 0x5a, bytes), memset(b2, 0xa5, bytes);
    tide_q8_rows r1 = tide_q8_layout(b1, M, K), r2 = tide_q8_layout(b2, M, K);
    tide_q8_quantize_ref(x, ldx, M, K, &r1);
    tide_q8_quantize_avx2(x, ldx, M, K, &r2);
    TT_CHECK(memcmp(r1.q, r2.q, (size_t)(M * np * 64)) == 0, "K=%lld: quantised bytes differ", (long long)K);
    TT_CHECK(memcmp(r1.c, r2.c, (size_t)(M * np * 32)) == 0, "K=%lld: lane sums differ", (long long)K);
    TT_CHECK(same_or_nan(r1.d, r2.d, M * np * 8), "K=%lld: block factors differ", (long long)K);
    /* the reference's own promises: |q| <= 127, x ~ d * q within half a
     * step, the lane sums, zeros past the end */
    for (int64_t i = 0; i < M; i++) {
      for (int64_t b = 0; b < nb; b++) {
        float d = r1.d[(i * np + b / 2) * 8 + (b & 1) * 4];
        for (int c = 0; c < 32; c++) {
          float xv = x[i * ldx + b * 32 + c];
          int qv = q_at(&r1, np, i, b, c);
          TT_CHECK(qv >= -127 && qv <= 127, "q out of range");
          if (isfinite(d) && d > 0)
            TT_CHECK(fabsf(xv - d * (float)qv) <= 0.5001f * d, "x %g not within half a step of %d * %g", xv, qv, d);
        }
        for (int j = 0; j < 4; j++) {
          int32_t sum = 0;
          for (int c = 8 * j; c < 8 * j + 8; c++) sum += q_at(&r1, np, i, b, c);
          TT_CHECK(r1.c[(i * np + b / 2) * 8 + (b & 1) * 4 + j] == 12 * sum, "lane sum wrong");
        }
      }
      if (nb & 1)
        for (int c = 0; c < 32; c++) TT_CHECK(q_at(&r1, np, i, nb, c) == 0, "padding not zero");
    }
    free(x), free(b1), free(b2);
  }
}

/* the M tried against the scalar models: every M 1..13 (the passes of up
 * to 4 rows), then the panel path of m > 8 across its blocks of 16 rows of
 * x (ragged 1-row and 3-row tails) */
static const int64_t kernel_ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 31, 35, 70};
#define KERNEL_NMS ((int)(sizeof kernel_ms / sizeof kernel_ms[0]))

/* the AVX2 rows = the scalar model, bitwise, M from kernel_ms, ragged
 * rows (across the panel path's blocks of 32 weight rows), odd and even
 * block counts (one to several chunks of 8 pairs, a half last pair),
 * awkward x rows */
static void kernel_same_bits(void) {
  static const int64_t shapes[][2] = {{1, 32}, {7, 64}, {67, 96}, {130, 1088}, {9, 4096}, {5, 160}, {37, 544}};
  for (int si = 0; si < 7; si++) {
    int64_t N = shapes[si][0], K = shapes[si][1];
    for (int sc = 0; sc < 2; sc++) {
      weight q;
      mx_make(&q, N, K, sc ? 0 : 118, sc ? 256 : 8); /* sc = 1: every scale byte, NaN 0xFF and tiny ones too */
      for (int mi = 0; mi < KERNEL_NMS; mi++) {
        int64_t M = kernel_ms[mi], ldx = K + 3, ldy = N + 2;
        float *x = malloc((size_t)(M * ldx) * 4);
        for (int64_t i = 0; i < M * ldx; i++)
          x[i] = tide_bf16_to_f32(tide_f32_to_bf16((float)((int)(rnd() % 4001) - 2000) / 500.0f));
        if (M == 5) awkward_x(x + 2 * ldx, K);
        if (M > 13) awkward_x(x + (M - 2) * ldx, K), awkward_x(x + 9 * ldx, K);
        void *blk = malloc(tide_q8_bytes(M, K));
        tide_q8_rows r = tide_q8_layout(blk, M, K);
        tide_q8_quantize_ref(x, ldx, M, K, &r);
        float *y1 = calloc((size_t)(M * ldy), 4), *y2 = calloc((size_t)(M * ldy), 4);
        for (int flags = 0; flags < 4; flags++) {
          for (int64_t i = 0; i < M * ldy; i++) y1[i] = y2[i] = (float)(i % 13) - 6.0f;
          /* a ragged row range inside N */
          int64_t r0 = N > 3 ? 1 : 0, nr = N > 3 ? N - 2 : N;
          tide_linear_q8_ref_rows(q.l, r0, nr, &r, y1, ldy, M, flags);
          tide_linear_q8_avx2_rows(q.l, r0, nr, &r, y2, ldy, M, flags);
          TT_CHECK(same_or_nan(y1, y2, M * ldy), "N=%lld K=%lld M=%lld flags=%d scales=%d: AVX2 differs from the model",
                   (long long)N, (long long)K, (long long)M, flags, sc);
        }
        free(x), free(blk), free(y1), free(y2);
      }
      weight_free(&q);
    }
  }
}

/* Close to the exact product: the int8 rounding of x costs about
 * 1/(sqrt(3) * 254) relative per element; on random data the output NMSE is
 * of order 1e-5. */
static void accuracy(void) {
  weight q;
  mx_make(&q, 300, 2048, 118, 8);
  tide_tensor x, ye, yq;
  x_make(&x, 4, 2048, 11);
  y_make(&ye, 4, 300);
  y_make(&yq, 4, 300);
  TT_OK(tide_linear_forward_ex(q.l, &ye, &x, 0));
  TT_OK(tide_linear_set_policy(q.l, TIDE_LINEAR_Q8));
  TT_CHECK(tide_linear_get_policy(q.l) == TIDE_LINEAR_Q8, "policy not kept");
  TT_OK(tide_linear_forward_ex(q.l, &yq, &x, 0));
  tide_compare c;
  TT_OK(tide_tensor_compare(&yq, &ye, 0, 0, &c));
  TT_CHECK(c.nmse > 0 && c.nmse < 1e-4, "q8 nmse %g against the exact path (expected (0, 1e-4))", c.nmse);
  tide_tensor_release(&x), tide_tensor_release(&ye), tide_tensor_release(&yq);
  weight_free(&q);
}

/* a row alone = the same row in M = 3, 8, 17, 65; 1 thread = 2 threads */
static void invariance(void) {
  weight q;
  mx_make(&q, 513, 1024, 116, 12);
  TT_OK(tide_linear_set_policy(q.l, TIDE_LINEAR_Q8));
  tide_tensor x, yf;
  x_make(&x, 65, 1024, 3);
  y_make(&yf, 65, 513);
  TT_OK(tide_linear_forward_ex(q.l, &yf, &x, 0));
  static const int64_t Ms[] = {1, 3, 8, 17};
  for (int mi = 0; mi < 4; mi++) {
    int64_t M = Ms[mi], r0 = 65 - M;
    tide_tensor xs = {0}, ys;
    TT_OK(tide_tensor_narrow(&xs, &x, 0, r0, M));
    y_make(&ys, M, 513);
    TT_OK(tide_linear_forward_ex(q.l, &ys, &xs, 0));
    TT_CHECK(memcmp(ys.data, (float *)yf.data + r0 * 513, (size_t)(M * 513) * 4) == 0,
             "rows %lld.. alone (M=%lld) differ from the same rows at M=65", (long long)r0, (long long)M);
    tide_tensor_release(&xs), tide_tensor_release(&ys);
  }
  int old = tide_threads_get();
  tide_tensor y1, y2;
  y_make(&y1, 65, 513);
  y_make(&y2, 65, 513);
  tide_threads_set(1);
  TT_OK(tide_linear_forward_ex(q.l, &y1, &x, 0));
  tide_threads_set(2);
  TT_OK(tide_linear_forward_ex(q.l, &y2, &x, 0));
  tide_threads_set(old);
  TT_CHECK(memcmp(y1.data, y2.data, (size_t)(65 * 513) * 4) == 0, "1 vs 2 threads differ");
  TT_CHECK(memcmp(y1.data, yf.data, (size_t)(65 * 513) * 4) == 0, "repeat differs");
  tide_tensor_release(&x), tide_tensor_release(&yf), tide_tensor_release(&y1), tide_tensor_release(&y2);
  weight_free(&q);
}

/* jobs sharing x (quantised once) = separate calls; the explicit AVX2 and
 * REF backends and other formats ignore the policy */
static void jobs_and_scope(void) {
  weight a, b;
  mx_make(&a, 200, 512, 118, 8);
  mx_make(&b, 77, 512, 118, 8);
  TT_OK(tide_linear_set_policy(a.l, TIDE_LINEAR_Q8));
  TT_OK(tide_linear_set_policy(b.l, TIDE_LINEAR_Q8));
  tide_tensor x, ya, yb, ya2, yb2;
  x_make(&x, 3, 512, 9);
  y_make(&ya, 3, 200), y_make(&yb, 3, 77), y_make(&ya2, 3, 200), y_make(&yb2, 3, 77);
  TT_OK(tide_linear_forward_ex(a.l, &ya, &x, TIDE_LINEAR_ROUND_BF16));
  TT_OK(tide_linear_forward_ex(b.l, &yb, &x, TIDE_LINEAR_ROUND_BF16));
  tide_linear_job jobs[2] = {{a.l, x.data, 512, ya2.data, 200, 3}, {b.l, x.data, 512, yb2.data, 77, 3}};
  TT_OK(tide_linear_forward_many(jobs, 2, TIDE_LINEAR_ROUND_BF16));
  TT_CHECK(memcmp(ya.data, ya2.data, 3 * 200 * 4) == 0 && memcmp(yb.data, yb2.data, 3 * 77 * 4) == 0,
           "forward_many with a shared x differs from separate calls");
  /* explicit AVX2 backend: the exact kernel, = the invariant policy */
  tide_tensor ye, yi;
  y_make(&ye, 3, 200), y_make(&yi, 3, 200);
  TT_OK(tide_linear_forward(a.l, &ye, &x, TIDE_BACKEND_AVX2));
  TT_OK(tide_linear_set_policy(a.l, TIDE_LINEAR_INVARIANT));
  TT_OK(tide_linear_forward_ex(a.l, &yi, &x, 0));
  TT_CHECK(memcmp(ye.data, yi.data, 3 * 200 * 4) == 0, "explicit AVX2 backend took the Q8 path");
  TT_CHECK(memcmp(ye.data, ya.data, 3 * 200 * 4) != 0, "the Q8 path gave the exact bits (not taken?)");
  /* an FP8 handle whose K is not a multiple of 32: the policy leaves it exact */
  int64_t ws[2] = {130, 200}, ss[2] = {2, 2};
  tide_tensor w8 = {0}, s8 = {0};
  TT_OK(tide_tensor_new(&w8, TIDE_F8E4M3, 2, ws));
  TT_OK(tide_tensor_new(&s8, TIDE_E8M0, 2, ss));
  for (int64_t i = 0; i < 130 * 200; i++) ((uint8_t *)w8.data)[i] = (uint8_t)(rnd() & 0x77);
  for (int i = 0; i < 4; i++) ((uint8_t *)s8.data)[i] = 120;
  tide_linear *l8;
  TT_OK(tide_linear_new(&l8, &w8, &s8));
  tide_tensor x8, y8a, y8b;
  x_make(&x8, 2, 200, 4);
  y_make(&y8a, 2, 130), y_make(&y8b, 2, 130);
  TT_OK(tide_linear_forward_ex(l8, &y8a, &x8, 0));
  TT_OK(tide_linear_set_policy(l8, TIDE_LINEAR_Q8));
  TT_OK(tide_linear_forward_ex(l8, &y8b, &x8, 0));
  TT_CHECK(memcmp(y8a.data, y8b.data, 2 * 130 * 4) == 0, "Q8 policy changed an FP8 handle with K %% 32 != 0");
  TT_CHECK(tide_linear_set_policy(l8, 7) == TIDE_E_INVALID, "bad policy accepted");
  tide_clear_error();
  tide_linear_free(l8);
  tide_tensor_release(&w8), tide_tensor_release(&s8), tide_tensor_release(&x8), tide_tensor_release(&y8a),
      tide_tensor_release(&y8b);
  tide_tensor_release(&x), tide_tensor_release(&ya), tide_tensor_release(&yb), tide_tensor_release(&ya2),
      tide_tensor_release(&yb2), tide_tensor_release(&ye), tide_tensor_release(&yi);
  weight_free(&a), weight_free(&b);
}

/* the MoE switch: refuses bad values, reaches the routed experts (output
 * moves, stays close), and setting it back restores the exact bits */
static void moe_policy(void) {
  const int E = 4, d = 256, I = 128, T = 3, k = 2;
  tide_moe *m;
  TT_OK(tide_moe_new(&m, E, d, I, INFINITY));
  weight w[4][3];
  for (int e = 0; e < E; e++) {
    mx_make(&w[e][0], I, d, 118, 8);
    mx_make(&w[e][1], d, I, 118, 8);
    mx_make(&w[e][2], I, d, 118, 8);
    TT_OK(tide_moe_set_expert(m, e, &w[e][0].w, &w[e][0].s, &w[e][1].w, &w[e][1].s, &w[e][2].w, &w[e][2].s));
  }
  TT_CHECK(tide_moe_set_policy(m, 9, 0) == TIDE_E_INVALID, "bad moe policy accepted");
  tide_clear_error();
  TT_CHECK(tide_moe_set_policy(m, 0, 5) == TIDE_E_INVALID, "bad shared policy accepted");
  tide_clear_error();
  TT_CHECK(tide_moe_set_policy(NULL, 0, 0) == TIDE_E_INVALID, "NULL moe accepted");
  tide_clear_error();
  tide_tensor x, ids, wts, y0, y1, y2;
  x_make(&x, T, d, 2);
  int64_t is[2] = {T, k};
  memset(&ids, 0, sizeof ids), memset(&wts, 0, sizeof wts);
  TT_OK(tide_tensor_new(&ids, TIDE_I32, 2, is));
  TT_OK(tide_tensor_new(&wts, TIDE_F32, 2, is));
  for (int i = 0; i < T * k; i++) ((int32_t *)ids.data)[i] = (i * 3 + 1) % E, ((float *)wts.data)[i] = 0.5f;
  y_make(&y0, T, d), y_make(&y1, T, d), y_make(&y2, T, d);
  TT_OK(tide_moe_forward(m, &y0, &x, &ids, &wts, 0));
  TT_OK(tide_moe_set_policy(m, TIDE_LINEAR_Q8, TIDE_LINEAR_INVARIANT));
  TT_OK(tide_moe_forward(m, &y1, &x, &ids, &wts, 0));
  TT_OK(tide_moe_set_policy(m, TIDE_LINEAR_INVARIANT, TIDE_LINEAR_INVARIANT));
  TT_OK(tide_moe_forward(m, &y2, &x, &ids, &wts, 0));
  TT_CHECK(memcmp(y0.data, y2.data, (size_t)(T * d) * 4) == 0, "back to invariant: bits differ");
  TT_CHECK(memcmp(y0.data, y1.data, (size_t)(T * d) * 4) != 0, "Q8 did not reach the experts");
  tide_compare c;
  TT_OK(tide_tensor_compare(&y1, &y0, 0, 0, &c));
  TT_CHECK(c.nmse < 1e-3, "moe q8 nmse %g", c.nmse);
  tide_tensor_release(&x), tide_tensor_release(&ids), tide_tensor_release(&wts), tide_tensor_release(&y0),
      tide_tensor_release(&y1), tide_tensor_release(&y2);
  tide_moe_free(m);
  for (int e = 0; e < E; e++)
    for (int j = 0; j < 3; j++) weight_free(&w[e][j]);
}

/* FP8 / BF16 weights under Q8: rounded to int8 once; the AVX2 rows equal
 * the scalar model bitwise (M from kernel_ms, odd block counts, NaN weights);
 * close to the exact product; back to INVARIANT gives the exact bits */
static void int8_weights(void) {
  static const int64_t shapes[][2] = {{1, 128}, {67, 384}, {130, 1024}, {9, 160}};
  for (int si = 0; si < 4; si++) {
    int64_t N = shapes[si][0], K = shapes[si][1];
    for (int bf = 0; bf < 2; bf++) {
      tide_tensor w = {0}, s = {0};
      int64_t shp[2] = {N, K}, ss[2] = {(N + 127) / 128, (K + 127) / 128};
      if (bf) {
        tide_tensor f = {0};
        TT_OK(tide_tensor_new(&f, TIDE_F32, 2, shp));
        TT_OK(tide_tensor_rand(&f, 5 + si, TIDE_RAND_NORMAL, 0.0, 0.05));
        TT_OK(tide_tensor_clone(&w, &f, TIDE_BF16));
        tide_tensor_release(&f);
      } else {
        TT_OK(tide_tensor_new(&w, TIDE_F8E4M3, 2, shp));
        TT_OK(tide_tensor_new(&s, TIDE_E8M0, 2, ss));
        uint8_t *p = w.data;
        for (int64_t i = 0; i < N * K; i++) {
          p[i] = (uint8_t)rnd();
          if ((p[i] & 0x7f) == 0x7f) p[i] ^= 0x10;
        }
        if (N > 5) p[3 * K + 40] = 0x7f; /* a NaN weight: its block, and so row 3, give NaN */
        for (int64_t i = 0; i < ss[0] * ss[1]; i++) ((uint8_t *)s.data)[i] = (uint8_t)(118 + rnd() % 6);
      }
      tide_linear *l;
      TT_OK(tide_linear_new(&l, &w, bf ? NULL : &s));
      tide_tensor x, ye, yq;
      int64_t M = 3;
      x_make(&x, M, K, 21);
      y_make(&ye, M, N), y_make(&yq, M, N);
      TT_OK(tide_linear_forward_ex(l, &ye, &x, 0));
      TT_OK(tide_linear_set_policy(l, TIDE_LINEAR_Q8));
      TT_OK(tide_linear_forward_ex(l, &yq, &x, 0));
      int nanrow = !bf && N > 5;
      if (nanrow) {
        TT_CHECK(isnan(((float *)yq.data)[3]) && isnan(((float *)ye.data)[3]), "NaN weight row not NaN");
        for (int64_t i = 0; i < M; i++) ((float *)yq.data)[i * N + 3] = ((float *)ye.data)[i * N + 3] = 0;
      }
      tide_compare c;
      TT_OK(tide_tensor_compare(&yq, &ye, 0, 0, &c));
      TT_CHECK(c.nmse > 0 && c.nmse < 1e-3, "%s N=%lld K=%lld: q8 nmse %g", bf ? "bf16" : "fp8", (long long)N,
               (long long)K, c.nmse);
      for (int mi = 0; mi < KERNEL_NMS; mi++) {
        int64_t Mm = kernel_ms[mi], ldx = K + 1, ldy = N + 3;
        float *xv = malloc((size_t)(Mm * ldx) * 4);
        for (int64_t i = 0; i < Mm * ldx; i++)
          xv[i] = tide_bf16_to_f32(tide_f32_to_bf16((float)((int)(rnd() % 4001) - 2000) / 300.0f));
        if (Mm == 6 || Mm > 13) awkward_x(xv + ldx, K);
        void *blk = malloc(tide_q8_bytes(Mm, K));
        tide_q8_rows r = tide_q8_layout(blk, Mm, K);
        tide_q8_quantize_avx2(xv, ldx, Mm, K, &r);
        float *y1 = calloc((size_t)(Mm * ldy), 4), *y2 = calloc((size_t)(Mm * ldy), 4);
        for (int flags = 0; flags < 4; flags += 3) {
          for (int64_t i = 0; i < Mm * ldy; i++) y1[i] = y2[i] = (float)(i % 11) - 5.0f;
          tide_linear_q8w_ref_rows(l, 0, N, &r, y1, ldy, Mm, flags);
          tide_linear_q8w_avx2_rows(l, 0, N, &r, y2, ldy, Mm, flags);
          TT_CHECK(same_or_nan(y1, y2, Mm * ldy), "%s N=%lld K=%lld M=%lld flags=%d: AVX2 differs from the model",
                   bf ? "bf16" : "fp8", (long long)N, (long long)K, (long long)Mm, flags);
        }
        free(xv), free(blk), free(y1), free(y2);
      }
      /* the weight rounding itself under the scalar kernels: the same bytes */
      size_t wb = (size_t)(N * ((K / 32 + 1) / 2) * 64), sb = (size_t)(N * ((K / 32 + 1) / 2)) * 4;
      int8_t *w1 = malloc(wb);
      float *s1 = malloc(sb);
      memcpy(w1, l->q8w, wb), memcpy(s1, l->q8s, sb);
      TT_OK(tide_linear_set_policy(l, TIDE_LINEAR_INVARIANT));
      TT_CHECK(l->q8w == NULL && l->q8s == NULL, "the int8 copy stays after the policy went back");
      int old = tide_kernels_force_ref(1);
      TT_OK(tide_linear_set_policy(l, TIDE_LINEAR_Q8));
      tide_kernels_force_ref(old);
      TT_CHECK(memcmp(w1, l->q8w, wb) == 0 && same_or_nan(s1, l->q8s, (int64_t)(sb / 4)),
               "the weight rounding differs between the AVX2 and the scalar kernels");
      free(w1), free(s1);
      TT_OK(tide_linear_set_policy(l, TIDE_LINEAR_INVARIANT));
      tide_tensor y2 = {0};
      y_make(&y2, M, N);
      TT_OK(tide_linear_forward_ex(l, &y2, &x, 0));
      if (nanrow)
        for (int64_t i = 0; i < M; i++) ((float *)y2.data)[i * N + 3] = 0;
      TT_CHECK(memcmp(y2.data, ye.data, (size_t)(M * N) * 4) == 0, "back to INVARIANT: bits differ");
      tide_linear_free(l);
      tide_tensor_release(&w), tide_tensor_release(&s), tide_tensor_release(&x), tide_tensor_release(&ye),
          tide_tensor_release(&yq), tide_tensor_release(&y2);
    }
  }
}

TT_RUN(TT(quantizer_same_bits), TT(int8_weights), TT(kernel_same_bits), TT(accuracy), TT(invariance), TT(jobs_and_scope), TT(moe_policy))
