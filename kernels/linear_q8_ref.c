/* linear_q8_ref.c - scalar reference of the int8-activation MXFP4 path
 * (linear_q8.h): the quantiser and the dot form, operation for operation what
 * the AVX2 kernel computes. */
#include <float.h>
#include <math.h>
#include <pthread.h>

#include "linear_q8.h"

static float wscale[256];
static pthread_once_t wscale_once = PTHREAD_ONCE_INIT;

static void wscale_fill(void) {
  for (int s = 0; s < 255; s++) wscale[s] = ldexpf(1.0f, s - 128);
  wscale[255] = NAN;
}

const float *tide_q8_wscale(void) {
  pthread_once(&wscale_once, wscale_fill);
  return wscale;
}

/* One block of 32 values: q by column, the factor d; 0 / NaN rules of
 * linear_q8.h. Shared by both quantisers (the AVX2 one only vectorises the
 * scaling and rounding). */
static void q8_place(const int8_t *qcol, int64_t b, int8_t *qrow);

void tide_q8_store_block(const int8_t *qcol, float d, int64_t b, int8_t *qrow, int32_t *crow, float *drow) {
  int64_t p = b / 2, h = b & 1;
  q8_place(qcol, b, qrow);
  for (int j = 0; j < 4; j++) {
    int32_t sum = 0;
    for (int c = 0; c < 8; c++) sum += qcol[8 * j + c];
    crow[p * 8 + h * 4 + j] = 12 * sum;
    drow[p * 8 + h * 4 + j] = d;
  }
}

/* the missing second block of the last pair when K / 32 is odd */
void tide_q8_pad_row(int64_t nb, int8_t *qrow, int32_t *crow, float *drow) {
  if (!(nb & 1)) return;
  static const int8_t zero[32];
  tide_q8_store_block(zero, 0.0f, nb, qrow, crow, drow);
}

/* a span of n (32 or 64) values by column: q and the factor (rules of
 * linear_q8.h) */
static float q8_span_ref(const float *xb, int n, int8_t *qc) {
  float amax = 0;
  int bad = 0;
  for (int c = 0; c < n; c++) {
    float a = fabsf(xb[c]);
    if (!(a <= FLT_MAX)) bad = 1;
    else if (a > amax) amax = a;
  }
  float id = amax > 0 ? 127.0f / amax : 0.0f;
  if (bad || !(id <= FLT_MAX)) { /* Inf/NaN in the span, or amax so small that 127/amax overflows */
    for (int c = 0; c < n; c++) qc[c] = 0;
    return bad ? NAN : 0.0f;
  }
  for (int c = 0; c < n; c++) qc[c] = (int8_t)nearbyintf(xb[c] * id);
  return amax / 127.0f;
}

/* block b's q (by column) into a row's pair layout */
static void q8_place(const int8_t *qcol, int64_t b, int8_t *qrow) {
  int8_t *Q = qrow + (b / 2) * 64;
  int64_t h = b & 1;
  for (int k = 0; k < 16; k++) {
    Q[h * 16 + k] = qcol[2 * k];
    Q[32 + h * 16 + k] = qcol[2 * k + 1];
  }
}

void tide_q8_quantize_weight_rows(struct tide_linear *l, int64_t r0, int64_t nr, float *buf) {
  int64_t K = l->k, nb = K / 32, np = (nb + 1) / 2;
  const tide_dequant_kernels *kt = tide_dequant_kernels_get();
  static const int8_t zero[32];
  for (int64_t n = r0; n < r0 + nr; n++) {
    tide_dequant_block(buf, K, &l->view, n, 1, 0, K, 0, kt);
    int8_t *qrow = l->q8w + n * np * 64;
    for (int64_t p = 0; p < np; p++) {
      int span = 2 * p + 1 < nb ? 64 : 32; /* the last pair of an odd count holds one block */
      int8_t qc[64];
#if defined(__x86_64__)
      float d = kt == &tide_dequant_ref ? q8_span_ref(buf + p * 64, span, qc) : tide_q8_span_avx2(buf + p * 64, span, qc);
#else
      float d = q8_span_ref(buf + p * 64, span, qc);
#endif
      q8_place(qc, 2 * p, qrow);
      q8_place(span == 64 ? qc + 32 : zero, 2 * p + 1, qrow);
      l->q8s[n * np + p] = d;
    }
  }
}

void tide_q8_quantize_ref(const float *x, int64_t ldx, int64_t m, int64_t K, const tide_q8_rows *out) {
  int64_t nb = K / 32, np = (nb + 1) / 2;
  for (int64_t i = 0; i < m; i++) {
    int8_t *qrow = (int8_t *)out->q + i * np * 64;
    int32_t *crow = (int32_t *)out->c + i * np * 8;
    float *drow = (float *)out->d + i * np * 8;
    for (int64_t b = 0; b < nb; b++) {
      int8_t qc[32];
      float d = q8_span_ref(x + i * ldx + b * 32, 32, qc);
      tide_q8_store_block(qc, d, b, qrow, crow, drow);
    }
    tide_q8_pad_row(nb, qrow, crow, drow);
  }
}

static const int8_t e2m1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void tide_linear_q8_ref_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                             int64_t ldy, int64_t m, int flags) {
  int64_t K = l->k, nb = K / 32, np = (nb + 1) / 2;
  const uint8_t *W = l->w.data, *S = l->scale.data;
  const float *ws = tide_q8_wscale();
  for (int64_t j = 0; j < nr; j++) {
    int64_t n = r0 + j;
    for (int64_t i = 0; i < m; i++) {
      const int8_t *qrow = x->q + i * np * 64;
      const float *drow = x->d + i * np * 8;
      float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t p = 0; p < np; p++)
        for (int ln = 0; ln < 8; ln++) {
          int64_t b = 2 * p + ln / 4;
          int32_t s = 0;
          float dx = 0.0f, dw = 0.0f;
          if (b < nb) {
            const uint8_t *wb = W + n * (K / 2) + b * 16;
            for (int c = 8 * (ln % 4); c < 8 * (ln % 4) + 8; c++) {
              int code = (c & 1) ? (wb[c / 2] >> 4) : (wb[c / 2] & 15);
              int qv = (c & 1) ? qrow[p * 64 + 32 + (b & 1) * 16 + c / 2] : qrow[p * 64 + (b & 1) * 16 + c / 2];
              s += (int32_t)e2m1x2[code] * qv;
            }
            dx = drow[p * 8 + ln];
            dw = ws[S[n * nb + b]];
          }
          float t = (float)s * dx;
          lane[ln] = fmaf(t, dw, lane[ln]);
        }
      float v = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
      tide_linear_store(&y[i * ldy + j], v, flags);
    }
  }
}

void tide_linear_q8w_ref_rows(const struct tide_linear *l, int64_t r0, int64_t nr, const tide_q8_rows *x, float *y,
                              int64_t ldy, int64_t m, int flags) {
  int64_t K = l->k, nb = K / 32, np = (nb + 1) / 2;
  for (int64_t j = 0; j < nr; j++) {
    int64_t n = r0 + j;
    const int8_t *wrow = l->q8w + n * np * 64;
    for (int64_t i = 0; i < m; i++) {
      const int8_t *qrow = x->q + i * np * 64;
      const float *drow = x->d + i * np * 8;
      float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t p = 0; p < np; p++)
        for (int ln = 0; ln < 8; ln++) {
          int64_t b = 2 * p + ln / 4;
          int32_t s = 0;
          float dx = 0.0f, dw = l->q8s[n * np + p]; /* the pair's factor, on every lane */
          if (b < nb) {
            for (int c = 8 * (ln % 4); c < 8 * (ln % 4) + 8; c++) {
              int64_t at = p * 64 + ((c & 1) ? 32 : 0) + (b & 1) * 16 + c / 2;
              s += (int32_t)wrow[at] * qrow[at];
            }
            dx = drow[p * 8 + ln];
          }
          float t = (float)s * dx;
          lane[ln] = fmaf(t, dw, lane[ln]);
        }
      float v = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
      tide_linear_store(&y[i * ldy + j], v, flags);
    }
  }
}
