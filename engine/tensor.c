/* tensor.c - storages (owned, mmap'd, borrowed), tensor headers, views,
 * element access, copies with conversion, fill and seeded random numbers. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert.h"
#include "tide_internal.h"

/* ---- dtypes ---- */
static const struct {
  const char *name, *st_name;
  int bits, is_float;
} dtinfo[TIDE_NDTYPES] = {
    [TIDE_F32] = {"f32", "F32", 32, 1},        [TIDE_BF16] = {"bf16", "BF16", 16, 1},
    [TIDE_F16] = {"f16", "F16", 16, 1},        [TIDE_F8E4M3] = {"f8e4m3", "F8_E4M3", 8, 1},
    [TIDE_E8M0] = {"e8m0", "F8_E8M0", 8, 1},   [TIDE_FP4] = {"fp4", "F4", 4, 1},
    [TIDE_I8] = {"i8", "I8", 8, 0},            [TIDE_U8] = {"u8", "U8", 8, 0},
    [TIDE_I32] = {"i32", "I32", 32, 0},        [TIDE_I64] = {"i64", "I64", 64, 0},
};

int tide_dtype_valid(int dt) { return dt >= 0 && dt < TIDE_NDTYPES; }
const char *tide_dtype_name(int dt) { return tide_dtype_valid(dt) ? dtinfo[dt].name : "?"; }
int tide_dtype_bits(int dt) { return tide_dtype_valid(dt) ? dtinfo[dt].bits : 0; }
int tide_dtype_is_float(int dt) { return tide_dtype_valid(dt) && dtinfo[dt].is_float; }

int tide_dtype_from_name(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < TIDE_NDTYPES; i++)
    if (!strcmp(name, dtinfo[i].name) || !strcmp(name, dtinfo[i].st_name)) return i;
  if (!strcmp(name, "float32") || !strcmp(name, "float")) return TIDE_F32;
  if (!strcmp(name, "bfloat16")) return TIDE_BF16;
  if (!strcmp(name, "float16") || !strcmp(name, "half")) return TIDE_F16;
  if (!strcmp(name, "F8_E4M3FN") || !strcmp(name, "float8_e4m3fn")) return TIDE_F8E4M3;
  if (!strcmp(name, "float8_e8m0fnu")) return TIDE_E8M0;
  if (!strcmp(name, "int8")) return TIDE_I8;
  if (!strcmp(name, "uint8")) return TIDE_U8;
  if (!strcmp(name, "int32")) return TIDE_I32;
  if (!strcmp(name, "int64")) return TIDE_I64;
  return -1;
}

/* ---- storages ---- */
static tide_storage *storage_alloc(int kind) {
  tide_storage *s = tide_xcalloc(1, sizeof *s);
  if (!s) return NULL;
  s->refs = 1;
  s->kind = kind;
  tide_stats_storage(1);
  return s;
}

int tide_storage_new(tide_storage **out, int64_t bytes) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = NULL;
  if (bytes < 0) return TIDE_ERR(TIDE_E_INVALID, "negative size %lld", (long long)bytes);
  tide_storage *s = storage_alloc(TIDE_STORAGE_OWNED);
  if (!s) return TIDE_E_NOMEM;
  s->data = tide_xcalloc(1, (size_t)(bytes ? bytes : 1));
  if (!s->data) {
    tide_xfree(s);
    tide_stats_storage(-1);
    return TIDE_ERR(TIDE_E_NOMEM, "cannot allocate a %lld-byte tensor", (long long)bytes);
  }
  s->bytes = bytes;
  *out = s;
  return TIDE_OK;
}

int tide_storage_mmap(tide_storage **out, const char *path) {
  if (!out || !path) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return TIDE_ERR(TIDE_E_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return TIDE_ERR(TIDE_E_IO, "cannot stat '%s': %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return TIDE_ERR(TIDE_E_IO, "'%s' is not a regular file", path);
  }
  void *base = NULL;
  size_t len = (size_t)st.st_size;
  if (len > 0) {
    base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
      int e = errno;
      close(fd);
      return TIDE_ERR(TIDE_E_IO, "cannot mmap '%s' (%zu bytes): %s", path, len, strerror(e));
    }
  }
  close(fd);
  tide_storage *s = storage_alloc(TIDE_STORAGE_MMAP);
  char *p = s ? tide_xstrdup(path) : NULL;
  if (!s || !p) {
    if (base) munmap(base, len);
    if (s) {
      tide_xfree(s);
      tide_stats_storage(-1);
    }
    return TIDE_E_NOMEM;
  }
  s->readonly = 1;
  s->data = base;
  s->bytes = (int64_t)len;
  s->map_base = base;
  s->map_len = len;
  s->path = p;
  tide_stats_map(1, (int64_t)len);
  *out = s;
  return TIDE_OK;
}

int tide_storage_borrow(tide_storage **out, void *data, int64_t bytes, int readonly, tide_storage *owner) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = NULL;
  if (!data && bytes > 0) return TIDE_ERR(TIDE_E_INVALID, "NULL data for %lld bytes", (long long)bytes);
  if (bytes < 0) return TIDE_ERR(TIDE_E_INVALID, "negative size");
  tide_storage *s = storage_alloc(TIDE_STORAGE_BORROWED);
  if (!s) return TIDE_E_NOMEM;
  s->data = data;
  s->bytes = bytes;
  s->readonly = readonly || (owner && owner->readonly);
  if (owner) {
    tide_storage_retain(owner);
    s->owner = owner;
  }
  *out = s;
  return TIDE_OK;
}

void tide_storage_retain(tide_storage *s) {
  if (s) __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
}

void tide_storage_release(tide_storage *s) {
  if (!s) return;
  if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  switch (s->kind) {
    case TIDE_STORAGE_OWNED: tide_xfree(s->data); break;
    case TIDE_STORAGE_MMAP:
      if (s->map_base) munmap(s->map_base, s->map_len);
      tide_stats_map(-1, (int64_t)s->map_len);
      tide_xfree(s->path);
      break;
    case TIDE_STORAGE_BORROWED: tide_storage_release(s->owner); break;
  }
  tide_xfree(s);
  tide_stats_storage(-1);
}

void *tide_storage_data(const tide_storage *s) { return s ? s->data : NULL; }
int64_t tide_storage_bytes(const tide_storage *s) { return s ? s->bytes : 0; }
int tide_storage_kind_of(const tide_storage *s) { return s ? s->kind : -1; }
const char *tide_storage_path(const tide_storage *s) { return (s && s->path) ? s->path : ""; }

/* ---- headers ---- */
static int check_shape(const char *fn, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > TIDE_MAXDIM) return tide_errorf(TIDE_E_INVALID, fn, "ndim %d not in 0..4", ndim);
  if (ndim > 0 && !shape) return tide_errorf(TIDE_E_INVALID, fn, "NULL shape");
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) return tide_errorf(TIDE_E_INVALID, fn, "negative size %lld in dim %d", (long long)shape[i], i);
  return TIDE_OK;
}

static void set_contiguous(tide_tensor *t, int ndim, const int64_t *shape) {
  t->ndim = ndim;
  int64_t st = 1;
  for (int i = TIDE_MAXDIM - 1; i >= 0; i--) {
    if (i >= ndim) {
      t->sizes[i] = 1;
      t->strides[i] = 0;
    } else {
      t->sizes[i] = shape[i];
      t->strides[i] = st;
      st *= shape[i] ? shape[i] : 1;
    }
  }
}

static int64_t numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] && n > INT64_MAX / 16 / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

static int64_t bytes_for(int dt, int64_t n) { return (n * tide_dtype_bits(dt) + 7) / 8; }

int tide_tensor_from_storage(tide_tensor *out, tide_storage *st, int64_t offset, int dtype, int ndim,
                             const int64_t *shape) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  if (!st) return TIDE_ERR(TIDE_E_INVALID, "NULL storage");
  if (!tide_dtype_valid(dtype)) return TIDE_ERR(TIDE_E_INVALID, "bad dtype %d", dtype);
  TIDE_CHECK(check_shape(__func__, ndim, shape));
  int64_t n = numel_of(ndim, shape);
  if (n < 0) return TIDE_ERR(TIDE_E_INVALID, "shape too large");
  int64_t need = bytes_for(dtype, n);
  if (offset < 0 || offset > st->bytes || need > st->bytes - offset)
    return TIDE_ERR(TIDE_E_RANGE, "%lld bytes at offset %lld do not fit a storage of %lld bytes",
                    (long long)need, (long long)offset, (long long)st->bytes);
  tide_tensor t;
  memset(&t, 0, sizeof t);
  t.data = (uint8_t *)st->data + offset;
  t.dtype = dtype;
  t.readonly = st->readonly;
  set_contiguous(&t, ndim, shape);
  tide_storage_retain(st);
  t.storage = st;
  tide_tensor_release(out);
  *out = t;
  return TIDE_OK;
}

int tide_tensor_new(tide_tensor *out, int dtype, int ndim, const int64_t *shape) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  if (!tide_dtype_valid(dtype)) return TIDE_ERR(TIDE_E_INVALID, "bad dtype %d", dtype);
  TIDE_CHECK(check_shape(__func__, ndim, shape));
  int64_t n = numel_of(ndim, shape);
  if (n < 0) return TIDE_ERR(TIDE_E_INVALID, "shape too large");
  tide_storage *st;
  TIDE_CHECK(tide_storage_new(&st, bytes_for(dtype, n)));
  int rc = tide_tensor_from_storage(out, st, 0, dtype, ndim, shape);
  tide_storage_release(st);
  return rc;
}

int tide_tensor_wrap(tide_tensor *out, void *data, int dtype, int ndim, const int64_t *shape,
                     const int64_t *stride, tide_storage *owner) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  if (!tide_dtype_valid(dtype)) return TIDE_ERR(TIDE_E_INVALID, "bad dtype %d", dtype);
  TIDE_CHECK(check_shape(__func__, ndim, shape));
  int64_t n = numel_of(ndim, shape);
  if (n < 0) return TIDE_ERR(TIDE_E_INVALID, "shape too large");
  /* the storage spans [data, data + extent) */
  int64_t extent = 1;
  if (stride) {
    for (int i = 0; i < ndim; i++) {
      if (stride[i] < 0) return TIDE_ERR(TIDE_E_INVALID, "negative stride in dim %d", i);
      if (shape[i] == 0) extent = 0;
    }
    if (extent) for (int i = 0; i < ndim; i++) extent += (shape[i] - 1) * stride[i];
  } else {
    extent = n;
  }
  tide_storage *st;
  TIDE_CHECK(tide_storage_borrow(&st, data, bytes_for(dtype, extent), 0, owner));
  tide_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.storage = st;
  t.readonly = st->readonly;
  set_contiguous(&t, ndim, shape);
  if (stride)
    for (int i = 0; i < ndim; i++) t.strides[i] = stride[i];
  tide_tensor_release(out);
  *out = t;
  return TIDE_OK;
}

void tide_tensor_release(tide_tensor *t) {
  if (!t) return;
  tide_storage *s = t->storage;
  memset(t, 0, sizeof *t);
  tide_storage_release(s);
}

int tide_tensor_ref(tide_tensor *dst, const tide_tensor *src) {
  if (!dst || !src) return TIDE_ERR(TIDE_E_INVALID, "NULL tensor");
  if (dst == src) return TIDE_OK;
  tide_tensor t = *src;
  tide_storage_retain(t.storage);
  tide_tensor_release(dst);
  *dst = t;
  return TIDE_OK;
}

/* ---- queries ---- */
int64_t tide_tensor_numel(const tide_tensor *t) {
  if (!t) return 0;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->sizes[i];
  return n;
}

int tide_tensor_is_contiguous(const tide_tensor *t) {
  if (!t) return 0;
  int64_t st = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->sizes[i] != 1 && t->strides[i] != st) return 0;
    st *= t->sizes[i];
  }
  return t->dtype != TIDE_FP4 || t->nib == 0;
}

int64_t tide_tensor_nbytes(const tide_tensor *t) { return t ? bytes_for(t->dtype, tide_tensor_numel(t)) : 0; }

const char *tide_shape_str(const tide_tensor *t, char *buf, size_t n) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, n - o, "[");
  for (int i = 0; i < t->ndim && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->sizes[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
  return buf;
}

int tide_check_tensor(const char *fn, const char *what, const tide_tensor *t, unsigned mask, int ndim) {
  if (!t) return tide_errorf(TIDE_E_INVALID, fn, "%s is NULL", what);
  if (!t->data && tide_tensor_numel(t) > 0) return tide_errorf(TIDE_E_INVALID, fn, "%s is an empty (released) tensor", what);
  if (!tide_dtype_valid(t->dtype)) return tide_errorf(TIDE_E_INVALID, fn, "%s has a bad dtype %d", what, t->dtype);
  if (mask && !(mask & TIDE_DT(t->dtype))) {
    char want[128] = "";
    size_t o = 0;
    for (int i = 0; i < TIDE_NDTYPES; i++)
      if (mask & TIDE_DT(i)) o += (size_t)snprintf(want + o, sizeof want - o, "%s%s", o ? "/" : "", dtinfo[i].name);
    return tide_errorf(TIDE_E_INVALID, fn, "%s has dtype %s, expected %s", what, dtinfo[t->dtype].name, want);
  }
  if (ndim >= 0 && t->ndim != ndim) {
    char b[96];
    return tide_errorf(TIDE_E_INVALID, fn, "%s has shape %s, expected %d dims", what, tide_shape_str(t, b, sizeof b), ndim);
  }
  return TIDE_OK;
}

double tide_load_elem(const tide_tensor *t, int64_t off) {
  int nib;
  const uint8_t *p = tide_elem_ptr(t, off, &nib);
  switch (t->dtype) {
    case TIDE_F32: { float v; memcpy(&v, p, 4); return v; }
    case TIDE_BF16: { uint16_t v; memcpy(&v, p, 2); return tide_bf16_to_f32(v); }
    case TIDE_F16: { uint16_t v; memcpy(&v, p, 2); return tide_f16_to_f32(v); }
    case TIDE_F8E4M3: return tide_f8e4m3_to_f32(*p);
    case TIDE_E8M0: return tide_e8m0_to_f32(*p);
    case TIDE_FP4: return tide_fp4_to_f32((uint8_t)((*p >> (nib * 4)) & 15));
    case TIDE_I8: return (int8_t)*p;
    case TIDE_U8: return *p;
    case TIDE_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case TIDE_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
  }
  return NAN;
}

static int64_t sat(double v, double lo, double hi) {
  if (isnan(v)) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

void tide_store_elem(tide_tensor *t, int64_t off, double v) {
  int nib;
  uint8_t *p = tide_elem_ptr(t, off, &nib);
  switch (t->dtype) {
    case TIDE_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case TIDE_BF16: { uint16_t h = tide_f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
    case TIDE_F16: { uint16_t h = tide_f32_to_f16((float)v); memcpy(p, &h, 2); break; }
    case TIDE_F8E4M3: *p = tide_f32_to_f8e4m3((float)v); break;
    case TIDE_E8M0: *p = tide_f32_to_e8m0((float)v); break;
    case TIDE_FP4: *p = (uint8_t)((*p & ~(15 << (nib * 4))) | (tide_f32_to_fp4((float)v) << (nib * 4))); break;
    case TIDE_I8: *(int8_t *)p = (int8_t)sat(v, -128, 127); break;
    case TIDE_U8: *p = (uint8_t)sat(v, 0, 255); break;
    case TIDE_I32: { int32_t x = (int32_t)sat(v, -2147483648.0, 2147483647.0); memcpy(p, &x, 4); break; }
    case TIDE_I64: { int64_t x = sat(v, -9223372036854775808.0, 9223372036854774784.0); memcpy(p, &x, 8); break; }
  }
}

static int index_offset(const char *fn, const tide_tensor *t, const int64_t *idx, int64_t *off) {
  TIDE_CHECK(tide_check_tensor(fn, "tensor", t, 0, -1));
  if (t->ndim > 0 && !idx) return tide_errorf(TIDE_E_INVALID, fn, "NULL index");
  int64_t o = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (idx[i] < 0 || idx[i] >= t->sizes[i])
      return tide_errorf(TIDE_E_RANGE, fn, "index %lld out of range for dim %d of size %lld", (long long)idx[i], i,
                         (long long)t->sizes[i]);
    o += idx[i] * t->strides[i];
  }
  *off = o;
  return TIDE_OK;
}

int tide_tensor_get(const tide_tensor *t, const int64_t *idx, double *out) {
  int64_t off;
  TIDE_CHECK(index_offset(__func__, t, idx, &off));
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = tide_load_elem(t, off);
  return TIDE_OK;
}

int tide_tensor_set(tide_tensor *t, const int64_t *idx, double v) {
  int64_t off;
  TIDE_CHECK(index_offset(__func__, t, idx, &off));
  if (t->readonly) return TIDE_ERR(TIDE_E_INVALID, "tensor is read-only (a view of a mapped file)");
  tide_store_elem(t, off, v);
  return TIDE_OK;
}

/* ---- views ---- */
static void advance(tide_tensor *t, int64_t off) {
  if (t->dtype == TIDE_FP4) {
    int64_t tot = t->nib + off;
    t->data = (uint8_t *)t->data + (tot >> 1);
    t->nib = (int32_t)(tot & 1);
  } else {
    t->data = (uint8_t *)t->data + off * (tide_dtype_bits(t->dtype) / 8);
  }
}

static int finish_view(tide_tensor *out, const tide_tensor *src, tide_tensor *v) {
  tide_storage_retain(v->storage);
  if (out == src) {
    tide_storage_release(src->storage);
    *out = *v;
  } else {
    tide_tensor_release(out);
    *out = *v;
  }
  return TIDE_OK;
}

int tide_tensor_narrow(tide_tensor *out, const tide_tensor *src, int dim, int64_t start, int64_t len) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  if (dim < 0 || dim >= src->ndim) return TIDE_ERR(TIDE_E_RANGE, "dim %d out of range for a %d-d tensor", dim, src->ndim);
  if (start < 0 || len < 0 || start > src->sizes[dim] || len > src->sizes[dim] - start)
    return TIDE_ERR(TIDE_E_RANGE, "narrow(%d, %lld, %lld) outside size %lld", dim, (long long)start, (long long)len,
                    (long long)src->sizes[dim]);
  tide_tensor v = *src;
  advance(&v, start * src->strides[dim]);
  v.sizes[dim] = len;
  return finish_view(out, src, &v);
}

int tide_tensor_select(tide_tensor *out, const tide_tensor *src, int dim, int64_t index) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  if (dim < 0 || dim >= src->ndim) return TIDE_ERR(TIDE_E_RANGE, "dim %d out of range for a %d-d tensor", dim, src->ndim);
  if (index < 0 || index >= src->sizes[dim])
    return TIDE_ERR(TIDE_E_RANGE, "index %lld out of range for dim %d of size %lld", (long long)index, dim,
                    (long long)src->sizes[dim]);
  tide_tensor v = *src;
  advance(&v, index * src->strides[dim]);
  for (int i = dim; i < TIDE_MAXDIM - 1; i++) {
    v.sizes[i] = v.sizes[i + 1];
    v.strides[i] = v.strides[i + 1];
  }
  v.ndim--;
  v.sizes[TIDE_MAXDIM - 1] = 1;
  v.strides[TIDE_MAXDIM - 1] = 0;
  return finish_view(out, src, &v);
}

int tide_tensor_transpose(tide_tensor *out, const tide_tensor *src, int d0, int d1) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  if (d0 < 0 || d0 >= src->ndim || d1 < 0 || d1 >= src->ndim)
    return TIDE_ERR(TIDE_E_RANGE, "dims %d, %d out of range for a %d-d tensor", d0, d1, src->ndim);
  tide_tensor v = *src;
  v.sizes[d0] = src->sizes[d1];
  v.sizes[d1] = src->sizes[d0];
  v.strides[d0] = src->strides[d1];
  v.strides[d1] = src->strides[d0];
  return finish_view(out, src, &v);
}

int tide_tensor_reshape(tide_tensor *out, const tide_tensor *src, int ndim, const int64_t *shape) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  if (ndim < 0 || ndim > TIDE_MAXDIM) return TIDE_ERR(TIDE_E_INVALID, "ndim %d not in 0..4", ndim);
  if (ndim > 0 && !shape) return TIDE_ERR(TIDE_E_INVALID, "NULL shape");
  if (!tide_tensor_is_contiguous(src))
    return TIDE_ERR(TIDE_E_INVALID, "reshape needs a contiguous tensor (copy it first)");
  int64_t want[TIDE_MAXDIM], n = tide_tensor_numel(src), known = 1;
  int infer = -1;
  for (int i = 0; i < ndim; i++) {
    want[i] = shape[i];
    if (shape[i] == -1) {
      if (infer >= 0) return TIDE_ERR(TIDE_E_INVALID, "more than one -1 in the new shape");
      infer = i;
    } else if (shape[i] < 0) {
      return TIDE_ERR(TIDE_E_INVALID, "negative size %lld", (long long)shape[i]);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || n % known) return TIDE_ERR(TIDE_E_INVALID, "cannot infer a size: %lld elements", (long long)n);
    want[infer] = n / known;
    known *= want[infer];
  }
  if (known != n) {
    char b[96];
    return TIDE_ERR(TIDE_E_INVALID, "cannot reshape %s (%lld elements) to %lld elements",
                    tide_shape_str(src, b, sizeof b), (long long)n, (long long)known);
  }
  tide_tensor v = *src;
  set_contiguous(&v, ndim, want);
  return finish_view(out, src, &v);
}

int tide_tensor_view_dtype(tide_tensor *out, const tide_tensor *src, int dtype) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  if (!tide_dtype_valid(dtype)) return TIDE_ERR(TIDE_E_INVALID, "bad dtype %d", dtype);
  if (!tide_tensor_is_contiguous(src)) return TIDE_ERR(TIDE_E_INVALID, "view_dtype needs a contiguous tensor");
  int sb = tide_dtype_bits(src->dtype), db = tide_dtype_bits(dtype);
  tide_tensor v = *src;
  v.dtype = dtype;
  v.nib = 0;
  int64_t shape[TIDE_MAXDIM];
  int nd = src->ndim ? src->ndim : 1;
  for (int i = 0; i < nd; i++) shape[i] = src->sizes[i];
  int64_t last = shape[nd - 1] * sb;
  if (last % db) {
    return TIDE_ERR(TIDE_E_INVALID, "last dim of %lld %s elements is not a whole number of %s elements",
                    (long long)shape[nd - 1], tide_dtype_name(src->dtype), tide_dtype_name(dtype));
  }
  shape[nd - 1] = last / db;
  set_contiguous(&v, nd, shape);
  return finish_view(out, src, &v);
}

/* ---- data ---- */
/* Iterate over all elements of a shape in row-major order, calling `body`
 * with the two element offsets, parallel over the outer rows. */
int tide_tensor_copy(tide_tensor *dst, const tide_tensor *src) {
  TIDE_CHECK(tide_check_tensor(__func__, "dst", dst, 0, -1));
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  if (dst->readonly) return TIDE_ERR(TIDE_E_INVALID, "dst is read-only");
  int64_t n = tide_tensor_numel(src);
  int same = dst->ndim == src->ndim;
  for (int i = 0; same && i < dst->ndim; i++) same = dst->sizes[i] == src->sizes[i];
  if (!same) {
    char a[96], b[96];
    return TIDE_ERR(TIDE_E_INVALID, "shape mismatch: dst %s, src %s", tide_shape_str(dst, a, sizeof a),
                    tide_shape_str(src, b, sizeof b));
  }
  if (n == 0) return TIDE_OK;
  if (tide_tensor_is_contiguous(dst) && tide_tensor_is_contiguous(src) &&
      (n % 2 == 0 || (dst->dtype != TIDE_FP4 && src->dtype != TIDE_FP4)))
    return tide_convert(dst->data, dst->dtype, src->data, src->dtype, n);
  /* generic strided path, in the logical order of src */
  int nd = src->ndim;
  int64_t sh[4] = {1, 1, 1, 1}, ss[4] = {0}, ds[4] = {0};
  for (int i = 0; i < nd; i++) {
    sh[4 - nd + i] = src->sizes[i];
    ss[4 - nd + i] = src->strides[i];
  }
  for (int i = 0; i < dst->ndim; i++) ds[4 - dst->ndim + i] = dst->strides[i];
  int same_float_path = tide_dtype_is_float(dst->dtype) || tide_dtype_is_float(src->dtype);
  int64_t rows = sh[0] * sh[1] * sh[2];
  int fp4 = dst->dtype == TIDE_FP4;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 65536 && !fp4)
#endif
  for (int64_t r = 0; r < rows; r++) {
    int64_t i0 = r / (sh[1] * sh[2]), i1 = (r / sh[2]) % sh[1], i2 = r % sh[2];
    int64_t so = i0 * ss[0] + i1 * ss[1] + i2 * ss[2], dof = i0 * ds[0] + i1 * ds[1] + i2 * ds[2];
    for (int64_t j = 0; j < sh[3]; j++) {
      if (same_float_path || dst->dtype != TIDE_I64 || src->dtype != TIDE_I64) {
        tide_store_elem(dst, dof + j * ds[3], tide_load_elem(src, so + j * ss[3]));
      } else {
        int n1, n2;
        memcpy(tide_elem_ptr(dst, dof + j * ds[3], &n1), tide_elem_ptr(src, so + j * ss[3], &n2), 8);
      }
    }
  }
  (void)fp4;
  return TIDE_OK;
}

int tide_tensor_clone(tide_tensor *out, const tide_tensor *src, int dtype) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  TIDE_CHECK(tide_check_tensor(__func__, "src", src, 0, -1));
  if (dtype < 0) dtype = src->dtype;
  tide_tensor t;
  memset(&t, 0, sizeof t);
  TIDE_CHECK(tide_tensor_new(&t, dtype, src->ndim, src->sizes));
  int rc = tide_tensor_copy(&t, src);
  if (rc < 0) {
    tide_tensor_release(&t);
    return rc;
  }
  tide_tensor_release(out);
  *out = t;
  return TIDE_OK;
}

/* Visit every element: fn(t, offset, logical_index, ctx). Parallel over rows;
 * the logical index makes results independent of the thread count. */
typedef void (*elem_fn)(tide_tensor *t, int64_t off, int64_t lin, void *ctx);
static void for_each(tide_tensor *t, elem_fn fn, void *ctx) {
  int nd = t->ndim;
  int64_t sh[4] = {1, 1, 1, 1}, st[4] = {0};
  for (int i = 0; i < nd; i++) {
    sh[4 - nd + i] = t->sizes[i];
    st[4 - nd + i] = t->strides[i];
  }
  int64_t rows = sh[0] * sh[1] * sh[2], n = rows * sh[3];
  int fp4 = t->dtype == TIDE_FP4;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 65536 && !fp4)
#endif
  for (int64_t r = 0; r < rows; r++) {
    int64_t i0 = r / (sh[1] * sh[2]), i1 = (r / sh[2]) % sh[1], i2 = r % sh[2];
    int64_t o = i0 * st[0] + i1 * st[1] + i2 * st[2];
    for (int64_t j = 0; j < sh[3]; j++) fn(t, o + j * st[3], r * sh[3] + j, ctx);
  }
  (void)n;
  (void)fp4;
}

static void fill_fn(tide_tensor *t, int64_t off, int64_t lin, void *ctx) {
  (void)lin;
  tide_store_elem(t, off, *(double *)ctx);
}

int tide_tensor_fill(tide_tensor *t, double v) {
  TIDE_CHECK(tide_check_tensor(__func__, "tensor", t, 0, -1));
  if (t->readonly) return TIDE_ERR(TIDE_E_INVALID, "tensor is read-only");
  if (t->dtype == TIDE_F32 && tide_tensor_is_contiguous(t)) {
    float f = (float)v, *p = t->data;
    int64_t n = tide_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) p[i] = f;
    return TIDE_OK;
  }
  for_each(t, fill_fn, &v);
  return TIDE_OK;
}

/* Counter-based generator: element i of a fill depends only on (seed, i). */
static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static inline double u01(uint64_t seed, uint64_t i) {
  /* 53 random bits in (0, 1): never exactly 0, so log() is safe */
  return ((double)(mix64(mix64(seed) + (i + 1) * 0x9e3779b97f4a7c15ULL) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

typedef struct {
  uint64_t seed;
  int dist;
  double a, b;
} rand_ctx;

static void rand_fn(tide_tensor *t, int64_t off, int64_t lin, void *vctx) {
  rand_ctx *c = vctx;
  double v;
  if (c->dist == TIDE_RAND_NORMAL) {
    double u1 = u01(c->seed, 2 * (uint64_t)lin), u2 = u01(c->seed, 2 * (uint64_t)lin + 1);
    v = c->a + c->b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
  } else {
    v = c->a + (c->b - c->a) * u01(c->seed, (uint64_t)lin);
  }
  tide_store_elem(t, off, v);
}

int tide_tensor_rand(tide_tensor *t, uint64_t seed, int dist, double a, double b) {
  TIDE_CHECK(tide_check_tensor(__func__, "tensor", t, 0, -1));
  if (t->readonly) return TIDE_ERR(TIDE_E_INVALID, "tensor is read-only");
  if (dist != TIDE_RAND_UNIFORM && dist != TIDE_RAND_NORMAL) return TIDE_ERR(TIDE_E_INVALID, "bad distribution %d", dist);
  rand_ctx c = {seed, dist, a, b};
  for_each(t, rand_fn, &c);
  return TIDE_OK;
}
