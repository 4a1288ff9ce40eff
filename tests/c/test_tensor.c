/* test_tensor.c - tensors: storages (owned, mmap'd, borrowed), view
 * semantics (strides, no copy, shared data, fp4 nibbles), copies with dtype
 * conversion across strides, fill and seeded random numbers (same across
 * runs and thread counts), compare helpers (NMSE, ULP), argmax/topk ties,
 * softmax and elementwise ops, and misuse that must fail cleanly. */
#include <fcntl.h>
#include <unistd.h>

#include "tide.h"
#include "tt.h"

#define T0(name) \
  tide_tensor name; \
  memset(&name, 0, sizeof name)

static tide_alloc_stats start_stats;
static void stats_begin(void) { tide_alloc_stats_get(&start_stats); }
static void stats_end(const char *what) {
  tide_alloc_stats s;
  tide_alloc_stats_get(&s);
  TT_CHECK(s.live_allocs == start_stats.live_allocs && s.live_bytes == start_stats.live_bytes &&
               s.live_storages == start_stats.live_storages && s.live_maps == start_stats.live_maps,
           "%s leaked: %lld blocks, %lld bytes, %lld storages, %lld maps", what,
           (long long)(s.live_allocs - start_stats.live_allocs), (long long)(s.live_bytes - start_stats.live_bytes),
           (long long)(s.live_storages - start_stats.live_storages), (long long)(s.live_maps - start_stats.live_maps));
}

static double at(const tide_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  int64_t ix[4] = {i0, i1, i2, i3};
  double v = NAN;
  int rc = tide_tensor_get(t, ix, &v);
  TT_CHECK(rc == 0, "get(%lld,%lld,%lld,%lld): %s", (long long)i0, (long long)i1, (long long)i2, (long long)i3,
           tide_last_error());
  return v;
}

/* a [2,3,4] f32 tensor holding 0..23 */
static void iota3(tide_tensor *t) {
  int64_t sh[3] = {2, 3, 4};
  TT_OK(tide_tensor_new(t, TIDE_F32, 3, sh));
  for (int i = 0; i < 24; i++) ((float *)t->data)[i] = (float)i;
}

static void new_and_storages(void) {
  stats_begin();
  T0(t);
  int64_t sh[4] = {2, 3, 5, 7};
  TT_OK(tide_tensor_new(&t, TIDE_BF16, 4, sh));
  TT_CHECK(((uintptr_t)t.data & 63) == 0, "owned storage not 64-byte aligned");
  TT_CHECK(t.strides[0] == 105 && t.strides[1] == 35 && t.strides[2] == 7 && t.strides[3] == 1, "row-major strides");
  TT_CHECK(tide_tensor_numel(&t) == 210 && tide_tensor_nbytes(&t) == 420, "numel/nbytes");
  TT_CHECK(tide_tensor_is_contiguous(&t), "new tensor is contiguous");
  TT_CHECK(tide_storage_kind_of(t.storage) == TIDE_STORAGE_OWNED, "owned");
  for (int i = 0; i < 210; i++) TT_CHECK(((uint16_t *)t.data)[i] == 0, "not zero-filled at %d", i);
  /* a scalar and an empty tensor */
  T0(s);
  TT_OK(tide_tensor_new(&s, TIDE_I64, 0, NULL));
  TT_CHECK(tide_tensor_numel(&s) == 1 && s.ndim == 0, "scalar has one element");
  int64_t z = 0;
  T0(e);
  TT_OK(tide_tensor_new(&e, TIDE_F32, 1, &z));
  TT_CHECK(tide_tensor_numel(&e) == 0, "empty tensor");
  /* fp4 packs two per byte */
  int64_t n5 = 5;
  T0(q);
  TT_OK(tide_tensor_new(&q, TIDE_FP4, 1, &n5));
  TT_CHECK(tide_tensor_nbytes(&q) == 3, "5 fp4 values take 3 bytes");
  tide_tensor_release(&t), tide_tensor_release(&s), tide_tensor_release(&e), tide_tensor_release(&q);
  tide_tensor_release(&q); /* idempotent */
  tide_tensor_release(NULL);
  stats_end("new");

  /* mmap: read-only views of a file, kept alive by their tensors */
  stats_begin();
  char path[512];
  const char *tmp = getenv("TIDE_TEST_TMP");
  snprintf(path, sizeof path, "%s/tensor_mmap.bin", tmp && *tmp ? tmp : "/tmp");
  float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  FILE *f = fopen(path, "wb");
  TT_CHECK(f != NULL, "cannot write %s", path);
  if (!f) return;
  fwrite(buf, 4, 8, f);
  fclose(f);
  tide_storage *st = NULL;
  TT_OK(tide_storage_mmap(&st, path));
  TT_CHECK(tide_storage_kind_of(st) == TIDE_STORAGE_MMAP && tide_storage_bytes(st) == 32, "mmap storage");
  TT_CHECK(!strcmp(tide_storage_path(st), path), "path kept");
  int64_t sh2[2] = {2, 2};
  T0(m);
  TT_OK(tide_tensor_from_storage(&m, st, 16, TIDE_F32, 2, sh2));
  tide_storage_release(st); /* the tensor keeps the mapping */
  TT_CHECK(at(&m, 1, 1, 0, 0) == 8.0 && m.readonly, "mmap view at offset 16");
  int64_t ix[2] = {0, 0};
  TT_FAILS(tide_tensor_set(&m, ix, 1.0), TIDE_E_INVALID, "read-only");
  TT_FAILS(tide_tensor_fill(&m, 1.0), TIDE_E_INVALID, "read-only");
  T0(v);
  TT_OK(tide_tensor_select(&v, &m, 0, 1));
  TT_CHECK(v.readonly, "views of read-only tensors are read-only");
  TT_FAILS(tide_tensor_copy(&v, &v), TIDE_E_INVALID, "read-only");
  TT_FAILS(tide_tensor_from_storage(&v, m.storage, 24, TIDE_F32, 2, sh2), TIDE_E_RANGE, "do not fit");
  TT_CHECK(v.sizes[0] == 2 && v.ndim == 1, "a failed call leaves its out tensor unchanged");
  TT_FAILS(tide_storage_mmap(&st, "/nonexistent/dir/file"), TIDE_E_IO, "cannot open '/nonexistent/dir/file'");
  TT_FAILS(tide_storage_mmap(&st, tmp && *tmp ? tmp : "/tmp"), TIDE_E_IO, "not a regular file");
  tide_tensor_release(&m), tide_tensor_release(&v);
  stats_end("mmap");

  /* borrowed: caller memory; a borrowed storage keeps its owner alive */
  stats_begin();
  float mem[6] = {1, 2, 3, 4, 5, 6};
  int64_t sh3[2] = {2, 3};
  T0(w);
  TT_OK(tide_tensor_wrap(&w, mem, TIDE_F32, 2, sh3, NULL, NULL));
  TT_CHECK(at(&w, 1, 2, 0, 0) == 6.0 && tide_storage_kind_of(w.storage) == TIDE_STORAGE_BORROWED, "wrap");
  mem[5] = 9;
  TT_CHECK(at(&w, 1, 2, 0, 0) == 9.0, "wrap does not copy");
  int64_t colstride[2] = {1, 2}; /* column-major view of the same 6 floats */
  TT_OK(tide_tensor_wrap(&w, mem, TIDE_F32, 2, sh3, colstride, NULL));
  TT_CHECK(at(&w, 1, 0, 0, 0) == 2.0 && at(&w, 0, 1, 0, 0) == 3.0, "explicit strides");
  T0(own);
  TT_OK(tide_tensor_new(&own, TIDE_U8, 1, (int64_t[]){64}));
  tide_storage *b = NULL;
  TT_OK(tide_storage_borrow(&b, (uint8_t *)own.data + 8, 16, 0, own.storage));
  void *owned_data = own.data;
  tide_tensor_release(&own); /* b keeps the owner's memory */
  T0(bt);
  TT_OK(tide_tensor_from_storage(&bt, b, 0, TIDE_U8, 1, (int64_t[]){16}));
  tide_storage_release(b);
  TT_CHECK(bt.data == (uint8_t *)owned_data + 8, "borrowed data pointer");
  TT_OK(tide_tensor_fill(&bt, 7));
  tide_tensor_release(&bt), tide_tensor_release(&w);
  TT_FAILS(tide_storage_borrow(&b, NULL, 10, 0, NULL), TIDE_E_INVALID, "NULL data");
  stats_end("borrow");
}

static void views(void) {
  stats_begin();
  T0(t);
  iota3(&t);
  T0(odd);
  TT_OK(tide_tensor_new(&odd, TIDE_U8, 1, (int64_t[]){6}));
  int64_t live_before;
  {
    tide_alloc_stats s;
    tide_alloc_stats_get(&s);
    live_before = s.live_bytes;
  }
  /* narrow: same data, offset pointer, same strides */
  T0(n);
  TT_OK(tide_tensor_narrow(&n, &t, 2, 1, 2));
  TT_CHECK(n.data == (float *)t.data + 1 && n.sizes[2] == 2 && n.strides[2] == 1 && n.strides[0] == 12,
           "narrow geometry");
  TT_CHECK(at(&n, 1, 2, 1, 0) == 22.0, "narrow value");
  TT_CHECK(!tide_tensor_is_contiguous(&n), "a narrowed inner dim is not contiguous");
  /* select drops the dim */
  T0(s);
  TT_OK(tide_tensor_select(&s, &t, 1, 2));
  TT_CHECK(s.ndim == 2 && s.sizes[0] == 2 && s.sizes[1] == 4 && s.strides[0] == 12 && s.strides[1] == 1,
           "select geometry");
  TT_CHECK(at(&s, 1, 3, 0, 0) == 23.0, "select value");
  /* transpose swaps sizes and strides */
  T0(tr);
  TT_OK(tide_tensor_transpose(&tr, &t, 0, 2));
  TT_CHECK(tr.sizes[0] == 4 && tr.sizes[2] == 2 && tr.strides[0] == 1 && tr.strides[2] == 12, "transpose geometry");
  TT_CHECK(at(&tr, 3, 1, 1, 0) == 19.0, "transpose value");
  /* reshape of contiguous data, with -1 */
  T0(r);
  TT_OK(tide_tensor_reshape(&r, &t, 2, (int64_t[]){-1, 6}));
  TT_CHECK(r.sizes[0] == 4 && r.sizes[1] == 6 && r.data == t.data, "reshape geometry");
  TT_CHECK(at(&r, 3, 5, 0, 0) == 23.0, "reshape value");
  TT_FAILS(tide_tensor_reshape(&r, &tr, 1, (int64_t[]){24}), TIDE_E_INVALID, "contiguous");
  TT_FAILS(tide_tensor_reshape(&r, &t, 2, (int64_t[]){5, -1}), TIDE_E_INVALID, "cannot infer");
  TT_FAILS(tide_tensor_reshape(&r, &t, 2, (int64_t[]){5, 5}), TIDE_E_INVALID, "cannot reshape [2, 3, 4]");
  TT_FAILS(tide_tensor_reshape(&r, &t, 2, NULL), TIDE_E_INVALID, "NULL shape");
  TT_CHECK(r.sizes[0] == 4 && r.sizes[1] == 6, "failed reshape left out unchanged");
  /* view_dtype: the same bytes, last dim rescaled */
  T0(u8);
  TT_OK(tide_tensor_view_dtype(&u8, &t, TIDE_U8));
  TT_CHECK(u8.sizes[2] == 16 && u8.data == t.data && u8.dtype == TIDE_U8, "f32 as u8");
  T0(bf);
  TT_OK(tide_tensor_view_dtype(&bf, &t, TIDE_BF16));
  TT_CHECK(bf.sizes[2] == 8, "f32 as bf16");
  TT_CHECK(at(&bf, 0, 0, 3, 0) == 1.0, "high half of 1.0f is bf16 1.0"); /* 1.0f = 0x3f800000 */
  T0(q);
  TT_OK(tide_tensor_view_dtype(&q, &u8, TIDE_FP4));
  TT_CHECK(q.sizes[2] == 32 && q.nib == 0, "u8 as fp4 doubles the last dim");
  TT_FAILS(tide_tensor_view_dtype(&q, &n, TIDE_U8), TIDE_E_INVALID, "contiguous");
  TT_FAILS(tide_tensor_view_dtype(&q, &odd, TIDE_F32), TIDE_E_INVALID, "not a whole number");
  /* data is shared: a write through one view shows in all */
  int64_t ix[3] = {1, 2, 3};
  TT_OK(tide_tensor_set(&tr, (int64_t[]){3, 2, 1}, -5.0));
  TT_CHECK(at(&t, 1, 2, 3, 0) == -5.0 && at(&s, 1, 3, 0, 0) == -5.0 && at(&r, 3, 5, 0, 0) == -5.0, "views share data");
  (void)ix;
  {
    tide_alloc_stats st;
    tide_alloc_stats_get(&st);
    TT_CHECK(st.live_bytes == live_before, "views allocated %lld bytes", (long long)(st.live_bytes - live_before));
  }
  /* out may alias src; views outlive the tensor they came from */
  TT_OK(tide_tensor_narrow(&n, &n, 0, 1, 1));
  tide_tensor_release(&t);
  TT_CHECK(at(&n, 0, 2, 1, 0) == 22.0 && at(&s, 0, 0, 0, 0) == 8.0, "views keep the storage alive");
  /* range errors name the dim and size */
  TT_FAILS(tide_tensor_narrow(&t, &s, 1, 3, 2), TIDE_E_RANGE, "narrow(1, 3, 2) outside size 4");
  TT_FAILS(tide_tensor_select(&t, &s, 0, 2), TIDE_E_RANGE, "index 2 out of range for dim 0 of size 2");
  TT_FAILS(tide_tensor_select(&t, &s, 5, 0), TIDE_E_RANGE, "dim 5 out of range");
  TT_FAILS(tide_tensor_transpose(&t, &s, 0, 2), TIDE_E_RANGE, "out of range");
  TT_FAILS(tide_tensor_get(&s, (int64_t[]){0, 4}, &(double){0}), TIDE_E_RANGE, "index 4 out of range for dim 1");
  TT_CHECK(t.storage == NULL, "failed views leave out empty");
  tide_tensor_release(&n), tide_tensor_release(&s), tide_tensor_release(&tr), tide_tensor_release(&r);
  tide_tensor_release(&u8), tide_tensor_release(&bf), tide_tensor_release(&q), tide_tensor_release(&odd);
  stats_end("views");
}

static void fp4_views_and_nibbles(void) {
  stats_begin();
  T0(q);
  TT_OK(tide_tensor_new(&q, TIDE_FP4, 2, (int64_t[]){3, 6}));
  static const float vals[18] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4, -6, 0.5f, 1, 6};
  for (int i = 0; i < 18; i++) TT_OK(tide_tensor_set(&q, (int64_t[]){i / 6, i % 6}, vals[i]));
  /* element 2m is the low nibble of byte m */
  const uint8_t *b = q.data;
  TT_CHECK(b[0] == 0x10 && b[1] == 0x32, "packing low nibble first: %02x %02x", b[0], b[1]);
  /* an odd start lands on a high nibble */
  T0(n);
  TT_OK(tide_tensor_narrow(&n, &q, 1, 1, 4));
  TT_CHECK(n.nib == 1 && n.data == q.data, "narrow to an odd element: nib 1, same byte");
  TT_CHECK(at(&n, 0, 0, 0, 0) == 0.5 && at(&n, 2, 3, 0, 0) == 1.0 && at(&n, 1, 2, 0, 0) == -1.0, "nibble reads");
  TT_CHECK(!tide_tensor_is_contiguous(&n), "high-nibble start is not contiguous");
  /* writing through a view touches only its nibble */
  TT_OK(tide_tensor_set(&n, (int64_t[]){0, 0}, -6.0));
  TT_CHECK(at(&q, 0, 0, 0, 0) == 0.0 && at(&q, 0, 1, 0, 0) == -6.0 && at(&q, 0, 2, 0, 0) == 1.0, "nibble write");
  /* a copy of a misaligned fp4 view comes out packed and contiguous */
  T0(c);
  TT_OK(tide_tensor_clone(&c, &n, TIDE_FP4));
  TT_CHECK(tide_tensor_is_contiguous(&c), "clone is contiguous");
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) TT_CHECK(at(&c, i, j, 0, 0) == at(&n, i, j, 0, 0), "clone (%d,%d)", i, j);
  /* fp4 as u8 and back */
  T0(u);
  TT_OK(tide_tensor_view_dtype(&u, &q, TIDE_U8));
  TT_CHECK(u.sizes[1] == 3 && u.data == q.data, "fp4 [3,6] as u8 [3,3]");
  tide_tensor_release(&q), tide_tensor_release(&n), tide_tensor_release(&c), tide_tensor_release(&u);
  stats_end("fp4");
}

static void copy_across_strides(void) {
  stats_begin();
  static const int dts[] = {TIDE_F32, TIDE_BF16, TIDE_F16, TIDE_F8E4M3, TIDE_I32, TIDE_I64, TIDE_I8};
  T0(src);
  TT_OK(tide_tensor_new(&src, TIDE_F32, 3, (int64_t[]){5, 7, 9}));
  TT_OK(tide_tensor_rand(&src, 7, TIDE_RAND_UNIFORM, -100, 100));
  T0(srcT);
  TT_OK(tide_tensor_transpose(&srcT, &src, 0, 2)); /* [9,7,5], strided */
  for (int a = 0; a < 7; a++) {
    for (int b = 0; b < 7; b++) {
      /* src (dtype a, transposed) -> dst (dtype b, a narrowed window of a
       * bigger tensor): every element equals the scalar conversion */
      T0(sa);
      TT_OK(tide_tensor_clone(&sa, &srcT, dts[a]));
      T0(big);
      TT_OK(tide_tensor_new(&big, dts[b], 3, (int64_t[]){11, 7, 8}));
      TT_OK(tide_tensor_fill(&big, 3));
      T0(win);
      TT_OK(tide_tensor_narrow(&win, &big, 0, 1, 9));
      TT_OK(tide_tensor_narrow(&win, &win, 2, 2, 5));
      TT_OK(tide_tensor_copy(&win, &sa));
      int bad = 0;
      for (int i = 0; i < 9 && !bad; i++)
        for (int j = 0; j < 7 && !bad; j++)
          for (int k = 0; k < 5 && !bad; k++) {
            /* expected: the value converted to dtype b through a one-element tensor */
            double v = at(&sa, i, j, k, 0), got = at(&win, i, j, k, 0);
            T0(one);
            TT_OK(tide_tensor_new(&one, dts[b], 0, NULL));
            TT_OK(tide_tensor_set(&one, NULL, v));
            double want = at(&one, 0, 0, 0, 0);
            tide_tensor_release(&one);
            if (got != want) {
              bad = 1;
              TT_CHECK(0, "%s->%s (%d,%d,%d): got %g, want %g", tide_dtype_name(dts[a]), tide_dtype_name(dts[b]), i,
                       j, k, got, want);
            }
          }
      /* the elements outside the window are untouched */
      TT_CHECK(at(&big, 0, 0, 0, 0) == 3 && at(&big, 10, 6, 7, 0) == 3 && at(&big, 5, 3, 1, 0) == 3 &&
                   at(&big, 5, 3, 7, 0) == 3,
               "copy wrote outside its window (%s)", tide_dtype_name(dts[b]));
      tide_tensor_release(&sa), tide_tensor_release(&big), tide_tensor_release(&win);
    }
  }
  /* float -> int truncates toward zero and saturates; NaN -> 0 */
  T0(f);
  TT_OK(tide_tensor_new(&f, TIDE_F32, 1, (int64_t[]){5}));
  float fv[5] = {-2.7f, 2.7f, 1e10f, -1e10f, NAN};
  memcpy(f.data, fv, sizeof fv);
  T0(i8);
  TT_OK(tide_tensor_clone(&i8, &f, TIDE_I8));
  const int8_t *p8 = i8.data;
  TT_CHECK(p8[0] == -2 && p8[1] == 2 && p8[2] == 127 && p8[3] == -128 && p8[4] == 0, "f32->i8: %d %d %d %d %d", p8[0],
           p8[1], p8[2], p8[3], p8[4]);
  T0(mis);
  TT_OK(tide_tensor_new(&mis, TIDE_F32, 1, (int64_t[]){4}));
  TT_FAILS(tide_tensor_copy(&mis, &f), TIDE_E_INVALID, "shape mismatch: dst [4], src [5]");
  tide_tensor_release(&f), tide_tensor_release(&i8), tide_tensor_release(&mis);
  tide_tensor_release(&src), tide_tensor_release(&srcT);
  stats_end("copy");
}

static void random_numbers(void) {
  stats_begin();
  /* fixed values: the generator is part of the file formats tests write
   * (seeded checkpoints), so it must not drift between runs or builds */
  T0(u);
  TT_OK(tide_tensor_new(&u, TIDE_F32, 1, (int64_t[]){4}));
  TT_OK(tide_tensor_rand(&u, 42, TIDE_RAND_UNIFORM, 0, 1));
  static const uint32_t ubits[4] = {0x3f189b3f, 0x3e2436d3, 0x3e2a6430, 0x3d44b6b2};
  for (int i = 0; i < 4; i++) {
    uint32_t b;
    memcpy(&b, (float *)u.data + i, 4);
    TT_CHECK(b == ubits[i], "uniform seed 42 [%d] = 0x%08x, expected 0x%08x", i, b, ubits[i]);
  }
  TT_OK(tide_tensor_rand(&u, 42, TIDE_RAND_NORMAL, 0, 1));
  static const double nvals[4] = {0.543052673, 1.80829918, 0.0183732193, 0.915096045};
  for (int i = 0; i < 4; i++)
    TT_CHECK(fabs(((float *)u.data)[i] - nvals[i]) < 1e-6, "normal seed 42 [%d] = %.9g", i, ((float *)u.data)[i]);
  tide_tensor_release(&u);

  /* large enough for the parallel path: 1 and 2 threads agree bit for bit,
   * and a strided destination gets the same values in logical order */
  int64_t sh[2] = {300, 1001};
  T0(a);
  T0(b);
  TT_OK(tide_tensor_new(&a, TIDE_F32, 2, sh));
  TT_OK(tide_tensor_new(&b, TIDE_F32, 2, sh));
  int old = tide_threads_get();
  for (int dist = 0; dist < 2; dist++) {
    tide_threads_set(1);
    TT_OK(tide_tensor_rand(&a, 1234, dist, 0.5, 2.0));
    tide_threads_set(2);
    TT_OK(tide_tensor_rand(&b, 1234, dist, 0.5, 2.0));
    TT_CHECK(!memcmp(a.data, b.data, 300 * 1001 * 4), "dist %d differs between 1 and 2 threads", dist);
  }
  T0(big);
  TT_OK(tide_tensor_new(&big, TIDE_F32, 2, (int64_t[]){1001, 300}));
  T0(bt);
  TT_OK(tide_tensor_transpose(&bt, &big, 0, 1));
  TT_OK(tide_tensor_rand(&bt, 1234, TIDE_RAND_NORMAL, 0.5, 2.0));
  T0(btc);
  TT_OK(tide_tensor_clone(&btc, &bt, TIDE_F32));
  TT_CHECK(!memcmp(btc.data, b.data, 300 * 1001 * 4), "strided fill differs from contiguous");
  tide_threads_set(old);
  /* statistics: normal(0.5, 2) and uniform[0.5, 2) */
  double s = 0, s2 = 0;
  const float *p = b.data;
  for (int64_t i = 0; i < 300 * 1001; i++) s += p[i], s2 += (double)p[i] * p[i];
  double n = 300 * 1001, mean = s / n, sd = sqrt(s2 / n - mean * mean);
  TT_CHECK(fabs(mean - 0.5) < 0.02 && fabs(sd - 2.0) < 0.02, "normal mean %g sd %g", mean, sd);
  TT_OK(tide_tensor_rand(&a, 99, TIDE_RAND_UNIFORM, 0.5, 2.0));
  double lo = 9, hi = -9;
  s = 0;
  for (int64_t i = 0; i < 300 * 1001; i++) {
    float v = ((float *)a.data)[i];
    lo = v < lo ? v : lo, hi = v > hi ? v : hi, s += v;
  }
  TT_CHECK(lo >= 0.5 && hi < 2.0 && lo < 0.51 && hi > 1.99 && fabs(s / n - 1.25) < 0.01, "uniform range [%g, %g]", lo,
           hi);
  TT_OK(tide_tensor_rand(&b, 100, TIDE_RAND_UNIFORM, 0.5, 2.0));
  TT_CHECK(memcmp(a.data, b.data, 4000) != 0, "different seeds give different numbers");
  TT_FAILS(tide_tensor_rand(&a, 1, 7, 0, 1), TIDE_E_INVALID, "bad distribution 7");
  tide_tensor_release(&a), tide_tensor_release(&b), tide_tensor_release(&big), tide_tensor_release(&bt);
  tide_tensor_release(&btc);
  stats_end("rand");
}

/* Ops built on OpenMP give the same bytes for 1 and 2 threads. */
static void threads_do_not_change_results(void) {
  stats_begin();
  int old = tide_threads_get();
  TT_CHECK(tide_threads_set(1) == 1 && tide_threads_get() == 1, "threads_set(1)");
  TT_CHECK(tide_threads_set(2) == 2 && tide_threads_get() == 2, "threads_set(2)");
  int64_t sh[2] = {257, 1023};
  T0(x);
  TT_OK(tide_tensor_new(&x, TIDE_F32, 2, sh));
  TT_OK(tide_tensor_rand(&x, 5, TIDE_RAND_NORMAL, 0, 3));
  T0(xt);
  TT_OK(tide_tensor_transpose(&xt, &x, 0, 1));
  tide_tensor out[2][6];
  memset(out, 0, sizeof out);
  for (int r = 0; r < 2; r++) {
    tide_threads_set(r + 1);
    TT_OK(tide_tensor_clone(&out[r][0], &x, TIDE_BF16));    /* contiguous convert */
    TT_OK(tide_tensor_clone(&out[r][1], &xt, TIDE_F8E4M3)); /* strided copy */
    TT_OK(tide_tensor_clone(&out[r][2], &out[r][0], TIDE_F32));
    TT_OK(tide_tensor_new(&out[r][3], TIDE_F32, 2, sh));
    TT_OK(tide_tensor_softmax(&out[r][3], &x));
    TT_OK(tide_tensor_new(&out[r][4], TIDE_F16, 2, sh));
    TT_OK(tide_tensor_binary(&out[r][4], &x, &out[r][2], TIDE_OP_MUL));
    TT_OK(tide_tensor_new(&out[r][5], TIDE_F16, 2, (int64_t[]){1023, 257}));
    TT_OK(tide_tensor_fill(&out[r][5], 0.1));
  }
  for (int k = 0; k < 6; k++)
    TT_CHECK(!memcmp(out[0][k].data, out[1][k].data, (size_t)tide_tensor_nbytes(&out[0][k])),
             "result %d differs between 1 and 2 threads", k);
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < 6; k++) tide_tensor_release(&out[r][k]);
  tide_tensor_release(&x), tide_tensor_release(&xt);
  tide_threads_set(old);
  stats_end("threads");
}

static void compare_helpers(void) {
  stats_begin();
  T0(a);
  T0(b);
  int64_t n = 4;
  TT_OK(tide_tensor_new(&a, TIDE_F32, 1, &n));
  TT_OK(tide_tensor_new(&b, TIDE_F32, 1, &n));
  float av[4] = {1, 2, 3, 4}, bv[4] = {1, 2, 3, 4.5f};
  memcpy(a.data, av, 16), memcpy(b.data, bv, 16);
  tide_compare c;
  TT_OK(tide_tensor_compare(&a, &b, 0, 0.1, &c));
  double want_nmse = 0.25 / (1 + 4 + 9 + 20.25);
  TT_CHECK(fabs(c.nmse - want_nmse) < 1e-12, "nmse %g, want %g", c.nmse, want_nmse);
  TT_CHECK(c.max_abs == 0.5 && fabs(c.max_rel - 0.5 / 4.5) < 1e-12, "max_abs %g max_rel %g", c.max_abs, c.max_rel);
  TT_CHECK(c.n_bad == 1 && c.first_bad == 3, "n_bad %lld first_bad %lld", (long long)c.n_bad, (long long)c.first_bad);
  TT_CHECK(c.cosine > 0.99 && c.cosine < 1, "cosine %g", c.cosine);
  /* ULPs in a's dtype: 1 ulp of bf16 at 1.0 is 2^-7 */
  T0(h);
  TT_OK(tide_tensor_new(&h, TIDE_BF16, 1, &n));
  float hv[4] = {1.0f, 1.0f + 1.0f / 128, 2.0f, -4.0f};
  memcpy(b.data, hv, 16);
  TT_OK(tide_tensor_copy(&h, &b));
  ((uint16_t *)h.data)[0] += 3; /* three bf16 ulps above 1.0 */
  TT_OK(tide_tensor_compare(&h, &b, 0, 0, &c));
  TT_CHECK(c.max_ulp == 3.0 && c.n_bad == 1 && c.first_bad == 0, "bf16 max_ulp %g n_bad %lld", c.max_ulp,
           (long long)c.n_bad);
  ((uint16_t *)h.data)[0] -= 3;
  TT_OK(tide_tensor_compare(&h, &b, 0, 0, &c));
  TT_CHECK(c.max_ulp == 0 && c.n_bad == 0 && c.first_bad == -1 && c.nmse == 0, "identical");
  /* NaN on one side only is a mismatch; on both sides it is not */
  ((float *)a.data)[1] = NAN;
  memcpy(b.data, av, 16);
  TT_OK(tide_tensor_compare(&a, &b, 1, 1, &c));
  TT_CHECK(c.n_nan_mismatch == 1 && c.n_bad == 1 && c.first_bad == 1, "NaN mismatch");
  ((float *)b.data)[1] = NAN;
  TT_OK(tide_tensor_compare(&a, &b, 0, 0, &c));
  TT_CHECK(c.n_nan_mismatch == 0 && c.n_bad == 0, "NaN on both sides");
  T0(w);
  TT_OK(tide_tensor_new(&w, TIDE_F32, 2, (int64_t[]){2, 2}));
  TT_FAILS(tide_tensor_compare(&a, &w, 0, 0, &c), TIDE_E_INVALID, "shape mismatch: a [4] vs b [2, 2]");
  tide_tensor_release(&a), tide_tensor_release(&b), tide_tensor_release(&h), tide_tensor_release(&w);
  stats_end("compare");
}

static void argmax_topk_softmax(void) {
  stats_begin();
  T0(x);
  TT_OK(tide_tensor_new(&x, TIDE_F32, 2, (int64_t[]){3, 6}));
  float xv[18] = {1, 5, 3, 5, 0, 5,            /* ties: first index wins */
                  NAN, -1, -2, NAN, -1, -3,    /* NaN ignored */
                  -INFINITY, -INFINITY, 2, 2, 2, 7};
  memcpy(x.data, xv, sizeof xv);
  T0(am);
  TT_OK(tide_tensor_new(&am, TIDE_I64, 1, (int64_t[]){3}));
  TT_OK(tide_tensor_argmax(&am, &x));
  const int64_t *ai = am.data;
  TT_CHECK(ai[0] == 1 && ai[1] == 1 && ai[2] == 5, "argmax %lld %lld %lld", (long long)ai[0], (long long)ai[1],
           (long long)ai[2]);
  T0(v);
  T0(ix);
  TT_OK(tide_tensor_new(&v, TIDE_F32, 2, (int64_t[]){3, 4}));
  TT_OK(tide_tensor_new(&ix, TIDE_I64, 2, (int64_t[]){3, 4}));
  TT_OK(tide_tensor_topk(&v, &ix, &x, 4));
  const int64_t *ti = ix.data;
  const float *tv = v.data;
  static const int64_t want_i[12] = {1, 3, 5, 2, 1, 4, 2, 5, 5, 2, 3, 4};
  static const float want_v[12] = {5, 5, 5, 3, -1, -1, -2, -3, 7, 2, 2, 2};
  for (int i = 0; i < 12; i++)
    TT_CHECK(ti[i] == want_i[i] && tv[i] == want_v[i], "topk[%d] = (%lld, %g), want (%lld, %g)", i, (long long)ti[i],
             tv[i], (long long)want_i[i], want_v[i]);
  TT_FAILS(tide_tensor_topk(&v, &ix, &x, 7), TIDE_E_RANGE, "k = 7 outside 0..6");
  /* strided input: argmax over columns of the transpose */
  T0(xt);
  TT_OK(tide_tensor_transpose(&xt, &x, 0, 1));
  T0(am2);
  TT_OK(tide_tensor_new(&am2, TIDE_I32, 1, (int64_t[]){6}));
  TT_OK(tide_tensor_argmax(&am2, &xt));
  const int32_t *a2 = am2.data;
  TT_CHECK(a2[0] == 0 && a2[1] == 0 && a2[2] == 0 && a2[5] == 2 && a2[4] == 2, "argmax over strided rows");
  /* softmax: rows sum to 1, equal inputs give equal outputs, -inf gives 0 */
  T0(sm);
  TT_OK(tide_tensor_new(&sm, TIDE_F32, 2, (int64_t[]){3, 6}));
  float yv[18] = {0, 0, 0, 0, 0, 0, 1000, 999, 0, 0, 0, 0, -INFINITY, 0, 1, 2, 3, 4};
  memcpy(x.data, yv, sizeof yv);
  TT_OK(tide_tensor_softmax(&sm, &x));
  const float *p = sm.data;
  for (int r = 0; r < 3; r++) {
    double s = 0;
    for (int j = 0; j < 6; j++) s += p[r * 6 + j];
    TT_CHECK(fabs(s - 1) < 1e-6, "row %d sums to %g", r, s);
  }
  TT_CHECK(fabs(p[0] - 1.0 / 6) < 1e-7 && fabs(p[6] / p[7] - exp(1.0)) < 1e-5 && p[12] == 0, "softmax values");
  TT_OK(tide_tensor_softmax(&x, &x)); /* in place */
  TT_CHECK(!memcmp(x.data, sm.data, 18 * 4), "in-place softmax");
  T0(bad);
  TT_OK(tide_tensor_new(&bad, TIDE_I64, 2, (int64_t[]){3, 6}));
  TT_FAILS(tide_tensor_softmax(&bad, &x), TIDE_E_INVALID, "out has dtype i64, expected f32/bf16/f16");
  TT_FAILS(tide_tensor_argmax(&sm, &x), TIDE_E_INVALID, "out has dtype f32");
  tide_tensor_release(&x), tide_tensor_release(&am), tide_tensor_release(&v), tide_tensor_release(&ix);
  tide_tensor_release(&xt), tide_tensor_release(&am2), tide_tensor_release(&sm), tide_tensor_release(&bad);
  stats_end("argmax/topk/softmax");
}

static void elementwise(void) {
  stats_begin();
  T0(a);
  T0(b);
  T0(o);
  TT_OK(tide_tensor_new(&a, TIDE_F32, 2, (int64_t[]){2, 3}));
  TT_OK(tide_tensor_new(&b, TIDE_BF16, 2, (int64_t[]){2, 3}));
  TT_OK(tide_tensor_new(&o, TIDE_F32, 2, (int64_t[]){2, 3}));
  for (int i = 0; i < 6; i++) ((float *)a.data)[i] = (float)(i + 1);
  TT_OK(tide_tensor_fill(&b, 2));
  static const float want[4][6] = {{3, 4, 5, 6, 7, 8}, {-1, 0, 1, 2, 3, 4}, {2, 4, 6, 8, 10, 12}, {.5f, 1, 1.5f, 2, 2.5f, 3}};
  for (int op = 0; op < 4; op++) {
    TT_OK(tide_tensor_binary(&o, &a, &b, op));
    TT_CHECK(!memcmp(o.data, want[op], 24), "op %d", op);
  }
  TT_OK(tide_tensor_affine(&o, &a, 2, 1));
  TT_CHECK(((float *)o.data)[5] == 13, "affine");
  double s;
  TT_OK(tide_tensor_sum(&a, &s));
  TT_CHECK(s == 21, "sum %g", s);
  T0(sc);
  TT_OK(tide_tensor_new(&sc, TIDE_F32, 0, NULL));
  TT_OK(tide_tensor_fill(&sc, 10));
  TT_OK(tide_tensor_binary(&a, &a, &sc, TIDE_OP_MUL)); /* one-element b broadcasts; out aliases a */
  TT_CHECK(((float *)a.data)[2] == 30, "scalar broadcast");
  T0(w);
  TT_OK(tide_tensor_new(&w, TIDE_F32, 2, (int64_t[]){3, 2}));
  TT_FAILS(tide_tensor_binary(&o, &a, &w, TIDE_OP_ADD), TIDE_E_INVALID, "shape mismatch: a [2, 3] vs b [3, 2]");
  TT_FAILS(tide_tensor_binary(&o, &a, &b, 9), TIDE_E_INVALID, "bad op 9");
  tide_tensor_release(&a), tide_tensor_release(&b), tide_tensor_release(&o), tide_tensor_release(&sc);
  tide_tensor_release(&w);
  stats_end("elementwise");
}

static void misuse(void) {
  stats_begin();
  T0(t);
  int64_t sh[5] = {1, 2, 3, 4, 5};
  TT_FAILS(tide_tensor_new(&t, TIDE_F32, 5, sh), TIDE_E_INVALID, "ndim 5 not in 0..4");
  TT_FAILS(tide_tensor_new(&t, -1, 1, sh), TIDE_E_INVALID, "bad dtype -1");
  TT_FAILS(tide_tensor_new(&t, TIDE_F32, 2, NULL), TIDE_E_INVALID, "NULL shape");
  TT_FAILS(tide_tensor_new(&t, TIDE_F32, 2, (int64_t[]){1 << 20, 1 << 30}), TIDE_E_NOMEM, "cannot allocate");
  TT_FAILS(tide_tensor_new(&t, TIDE_F32, 3, (int64_t[]){1 << 30, 1 << 30, 1 << 30}), TIDE_E_INVALID, "too large");
  TT_FAILS(tide_tensor_new(NULL, TIDE_F32, 1, sh), TIDE_E_INVALID, "NULL out");
  TT_FAILS(tide_tensor_fill(&t, 1), TIDE_E_INVALID, "released");
  TT_FAILS(tide_tensor_copy(&t, NULL), TIDE_E_INVALID, "dst is an empty (released) tensor");
  TT_FAILS(tide_tensor_ref(NULL, &t), TIDE_E_INVALID, "NULL tensor");
  tide_tensor bogus;
  memset(&bogus, 0, sizeof bogus);
  bogus.dtype = 77;
  bogus.data = &sh;
  bogus.ndim = 1;
  bogus.sizes[0] = 1;
  TT_FAILS(tide_tensor_clone(&t, &bogus, TIDE_F32), TIDE_E_INVALID, "bad dtype 77");
  TT_CHECK(strstr(tide_last_error(), "tide_tensor_clone") != NULL, "message names the function: %s",
           tide_last_error());
  TT_CHECK(tide_last_status() == TIDE_E_INVALID, "last status");
  tide_clear_error();
  TT_CHECK(tide_last_error()[0] == 0 && tide_last_status() == 0, "clear_error");
  TT_CHECK(t.storage == NULL, "nothing allocated by failed calls");
  stats_end("misuse");
}

TT_RUN(TT(new_and_storages), TT(views), TT(fp4_views_and_nibbles), TT(copy_across_strides), TT(random_numbers),
       TT(threads_do_not_change_results), TT(compare_helpers), TT(argmax_topk_softmax), TT(elementwise), TT(misuse))
