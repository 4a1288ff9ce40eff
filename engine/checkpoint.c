/* checkpoint.c - opening a checkpoint directory (or one .safetensors file):
 * config.json, the shard index, every shard's header read with pread and
 * checked, one read-only mapping per shard, zero-copy tensor views, the
 * check of the tensors against the config, and pre-faulting with a progress
 * bar. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

typedef struct ck_shard {
  char *path;                /* as opened: DIR/FILE */
  const char *file;          /* the file name part of path */
  int64_t file_size;
  int64_t tensor_bytes;
  st_header h;
  tide_storage *map;
} ck_shard;

typedef struct ck_ent {
  const char *name;          /* into its shard's header */
  int32_t shard;
  int32_t local;             /* index in that shard's header */
} ck_ent;

struct tide_ckpt {
  char *path;
  int n_shards;
  ck_shard *shards;
  int64_t n;
  ck_ent *ents;              /* sorted by name */
  uint64_t *htab;            /* open addressing over ents: (hash high 32 bits << 32) | (index + 1), 0 = empty */
  int64_t hcap;              /* power of two >= 2n */
  int has_config;
  tide_config cfg;
  char *config_json;
  int64_t config_len;
  char *config_path;
  int64_t index_total;
};

#define PATHF "%.400s"
#define NAMEF "'%.200s'"

/* ---- small file helpers ---- */
static char *join(const char *dir, const char *file) {
  size_t a = strlen(dir), b = strlen(file);
  char *p = tide_xmalloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  size_t o = a;
  if (a && dir[a - 1] != '/') p[o++] = '/';
  memcpy(p + o, file, b + 1);
  return p;
}

static int file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Read a whole (small) file; *out is NUL-terminated, caller frees. */
static int read_text(const char *path, int64_t limit, char **out, int64_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return TIDE_ERR(TIDE_E_IO, PATHF ": cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return TIDE_ERR(TIDE_E_IO, PATHF ": not a regular file", path);
  }
  if (st.st_size > limit) {
    close(fd);
    return TIDE_ERR(TIDE_E_UNSUPPORTED, PATHF ": %lld bytes is larger than the %lld tide accepts", path,
                    (long long)st.st_size, (long long)limit);
  }
  char *buf = tide_xmalloc((size_t)st.st_size + 1);
  if (!buf) {
    close(fd);
    return TIDE_E_NOMEM;
  }
  int64_t got = 0;
  while (got < st.st_size) {
    ssize_t k = pread(fd, buf + got, (size_t)(st.st_size - got), (off_t)got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = k < 0 ? errno : EIO;
      close(fd);
      tide_xfree(buf);
      return TIDE_ERR(TIDE_E_IO, PATHF ": read failed: %s", path, strerror(e));
    }
    got += k;
  }
  close(fd);
  buf[got] = 0;
  *out = buf;
  *len = got;
  return TIDE_OK;
}

static int pread_all(int fd, void *buf, size_t n, int64_t off) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = pread(fd, p, n, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -errno;
    if (k == 0) return -EIO;
    p += k;
    n -= (size_t)k;
    off += k;
  }
  return 0;
}

/* ---- one shard ---- */
static int open_shard(ck_shard *s) {
  int fd = open(s->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return TIDE_ERR(TIDE_E_IO, PATHF ": cannot open: %s", s->path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return TIDE_ERR(TIDE_E_IO, PATHF ": not a regular file", s->path);
  }
  s->file_size = st.st_size;
  if (st.st_size < 8) {
    close(fd);
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": %lld bytes is too short for a safetensors file", s->path,
                    (long long)st.st_size);
  }
  uint8_t len8[8];
  int e = pread_all(fd, len8, 8, 0);
  if (e) {
    close(fd);
    return TIDE_ERR(TIDE_E_IO, PATHF ": cannot read the header length: %s", s->path, strerror(-e));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
  if (n > (uint64_t)(st.st_size - 8)) {
    close(fd);
    return TIDE_ERR(TIDE_E_FORMAT, PATHF ": header length %llu runs past the end of the file (%lld bytes)", s->path,
                    (unsigned long long)n, (long long)st.st_size);
  }
  if ((int64_t)n > ST_MAX_HEADER) {
    close(fd);
    return TIDE_ERR(TIDE_E_UNSUPPORTED, PATHF ": header of %llu bytes is above the 100 MB limit", s->path,
                    (unsigned long long)n);
  }
  char *hdr = tide_xmalloc((size_t)n + 1);
  if (!hdr) {
    close(fd);
    return TIDE_E_NOMEM;
  }
  e = pread_all(fd, hdr, (size_t)n, 8);
  close(fd);
  if (e) {
    tide_xfree(hdr);
    return TIDE_ERR(TIDE_E_IO, PATHF ": cannot read the %llu-byte header: %s", s->path, (unsigned long long)n,
                    strerror(-e));
  }
  int rc = st_parse_header(&s->h, hdr, (int64_t)n, st.st_size, s->path);
  tide_xfree(hdr);
  if (rc < 0) return rc;
  for (int64_t i = 0; i < s->h.n; i++) s->tensor_bytes += s->h.t[i].end - s->h.t[i].begin;
  rc = tide_storage_mmap(&s->map, s->path);
  if (rc < 0) return rc;
  if (tide_storage_bytes(s->map) != s->file_size)
    return TIDE_ERR(TIDE_E_IO, PATHF ": the file changed size while opening (%lld, then %lld bytes)", s->path,
                    (long long)s->file_size, (long long)tide_storage_bytes(s->map));
  return TIDE_OK;
}

void tide_ckpt_free(tide_ckpt *ck) {
  if (!ck) return;
  for (int i = 0; i < ck->n_shards; i++) {
    ck_shard *s = &ck->shards[i];
    st_header_free(&s->h);
    tide_storage_release(s->map);
    tide_xfree(s->path);
  }
  tide_xfree(ck->shards);
  tide_xfree(ck->ents);
  tide_xfree(ck->htab);
  tide_xfree(ck->config_json);
  tide_xfree(ck->config_path);
  tide_xfree(ck->path);
  tide_xfree(ck);
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
  return h;
}

static int cmp_ent(const void *a, const void *b) {
  return strcmp(((const ck_ent *)a)->name, ((const ck_ent *)b)->name);
}
static int cmp_cstr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static int add_shard(tide_ckpt *ck, char *path) {
  ck_shard *q = tide_xrealloc(ck->shards, (size_t)(ck->n_shards + 1) * sizeof *q);
  if (!q) {
    tide_xfree(path);
    return TIDE_E_NOMEM;
  }
  ck->shards = q;
  ck_shard *s = &ck->shards[ck->n_shards++];
  memset(s, 0, sizeof *s);
  s->path = path;
  const char *slash = strrchr(path, '/');
  s->file = slash ? slash + 1 : path;
  return TIDE_OK;
}

/* model.safetensors.index.json, kept compactly (the parsed JSON of the Pro
 * index would take ~30 MB): its shard list becomes the shards to open, and
 * its (tensor, shard) pairs are checked once the headers are read. */
typedef struct {
  int64_t n;
  const char **name;    /* into pool */
  int32_t *shard;       /* index into ck->shards */
  char *pool;
} ck_index;

static void index_free(ck_index *x) {
  tide_xfree(x->name);
  tide_xfree(x->shard);
  tide_xfree(x->pool);
  memset(x, 0, sizeof *x);
}

static int read_index(tide_ckpt *ck, const char *dir, const char *ipath, ck_index *x) {
  char *text;
  int64_t len;
  TIDE_CHECK(read_text(ipath, (int64_t)256 << 20, &text, &len));
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)len, &end, 0);
  tide_xfree(text);
  if (!root) return TIDE_ERR(TIDE_E_FORMAT, PATHF ": not valid JSON", ipath);
  int rc = TIDE_OK;
  const char **files = NULL;
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
    rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": no \"weight_map\" object", ipath);
    goto done;
  }
  const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "metadata");
  const cJSON *ts = cJSON_IsObject(md) ? cJSON_GetObjectItemCaseSensitive(md, "total_size") : NULL;
  ck->index_total = cJSON_IsNumber(ts) && ts->valuedouble >= 0 ? (int64_t)ts->valuedouble : -1;
  int n = cJSON_GetArraySize(wm);
  files = tide_xmalloc((size_t)(n ? n : 1) * sizeof *files);
  if (!files) {
    rc = TIDE_E_NOMEM;
    goto done;
  }
  int k = 0;
  size_t pool = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, wm) {
    if (!cJSON_IsString(it) || !*it->valuestring) {
      rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": weight_map entry " NAMEF " is not a file name", ipath, it->string);
      goto done;
    }
    if (strchr(it->valuestring, '/')) {
      rc = TIDE_ERR(TIDE_E_UNSUPPORTED, PATHF ": weight_map entry " NAMEF " names '%.200s': shards must be files in %s",
                    ipath, it->string, it->valuestring, dir);
      goto done;
    }
    files[k++] = it->valuestring;
    pool += strlen(it->string) + 1;
  }
  if (k == 0) {
    rc = TIDE_ERR(TIDE_E_FORMAT, PATHF ": weight_map is empty", ipath);
    goto done;
  }
  qsort(files, (size_t)k, sizeof *files, cmp_cstr);
  for (int i = 0; i < k && rc == TIDE_OK; i++) {
    if (i && !strcmp(files[i], files[i - 1])) continue;
    char *p = join(dir, files[i]);
    if (!p) rc = TIDE_E_NOMEM;
    else if (!file_exists(p)) {
      /* name one tensor that lives there, to make the error actionable */
      const char *who = "";
      cJSON_ArrayForEach(it, wm) if (!strcmp(it->valuestring, files[i])) { who = it->string; break; }
      rc = TIDE_ERR(TIDE_E_IO, PATHF ": shard missing (listed by %s for tensor " NAMEF " and others)", p,
                    "model.safetensors.index.json", who);
      tide_xfree(p);
    } else {
      rc = add_shard(ck, p);
    }
  }
  if (rc < 0) goto done;
  x->name = tide_xmalloc((size_t)k * sizeof *x->name);
  x->shard = tide_xmalloc((size_t)k * sizeof *x->shard);
  x->pool = tide_xmalloc(pool);
  if (!x->name || !x->shard || !x->pool) {
    rc = TIDE_E_NOMEM;
    goto done;
  }
  char *q = x->pool;
  cJSON_ArrayForEach(it, wm) {
    int lo = 0, hi = ck->n_shards - 1, s = 0;
    while (lo <= hi) { /* the shards were added in file-name order */
      s = (lo + hi) / 2;
      int c = strcmp(ck->shards[s].file, it->valuestring);
      if (!c) break;
      if (c < 0) lo = s + 1;
      else hi = s - 1;
    }
    size_t l = strlen(it->string) + 1;
    memcpy(q, it->string, l);
    x->name[x->n] = q;
    x->shard[x->n++] = s;
    q += l;
  }
done:
  tide_xfree(files);
  cJSON_Delete(root);
  if (rc < 0) index_free(x);
  return rc;
}

static int check_index(const tide_ckpt *ck, const ck_index *x, const char *ipath) {
  for (int64_t k = 0; k < x->n; k++) {
    const char *listed = ck->shards[x->shard[k]].file;
    int64_t i = tide_ckpt_find(ck, x->name[k]);
    if (i < 0)
      return TIDE_ERR(TIDE_E_FORMAT, "tensor " NAMEF " is missing from shard %.200s (the index %s lists it there)",
                      x->name[k], listed, ipath);
    const ck_shard *s = &ck->shards[ck->ents[i].shard];
    if (strcmp(s->file, listed))
      return TIDE_ERR(TIDE_E_FORMAT, "tensor " NAMEF " is in shard %.200s but the index %s says %.200s", x->name[k],
                      s->file, ipath, listed);
  }
  return TIDE_OK;
}

int tide_ckpt_open(tide_ckpt **out, const char *path, int flags) {
  if (!out || !path || !*path) return TIDE_ERR(TIDE_E_INVALID, "NULL or empty argument");
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0) return TIDE_ERR(TIDE_E_IO, PATHF ": %s", path, strerror(errno));
  tide_ckpt *ck = tide_xcalloc(1, sizeof *ck);
  if (!ck) return TIDE_E_NOMEM;
  ck->index_total = -1;
  int rc = TIDE_OK;
  ck_index index = {0, NULL, NULL, NULL};
  int have_index = 0;
  char *ipath = NULL;
  ck->path = tide_xstrdup(path);
  if (!ck->path) {
    rc = TIDE_E_NOMEM;
    goto fail;
  }
  if (S_ISREG(st.st_mode)) {
    char *p = tide_xstrdup(path);
    rc = p ? add_shard(ck, p) : TIDE_E_NOMEM;
  } else if (S_ISDIR(st.st_mode)) {
    ck->config_path = join(path, "config.json");
    ipath = join(path, "model.safetensors.index.json");
    char *single = join(path, "model.safetensors");
    if (!ck->config_path || !ipath || !single) {
      tide_xfree(single);
      rc = TIDE_E_NOMEM;
      goto fail;
    }
    if (file_exists(ck->config_path)) {
      rc = read_text(ck->config_path, (int64_t)16 << 20, &ck->config_json, &ck->config_len);
      if (rc < 0) {
        tide_xfree(single);
        goto fail;
      }
      ck->has_config = 1;
    } else if (!(flags & TIDE_CKPT_CONFIG_OPTIONAL)) {
      tide_xfree(single);
      rc = TIDE_ERR(TIDE_E_IO, PATHF ": missing (a checkpoint directory needs config.json)", ck->config_path);
      goto fail;
    }
    if (file_exists(ipath)) {
      tide_xfree(single);
      rc = read_index(ck, path, ipath, &index);
      have_index = rc == TIDE_OK;
    } else if (file_exists(single)) {
      rc = add_shard(ck, single);
    } else {
      tide_xfree(single);
      rc = TIDE_ERR(TIDE_E_IO, PATHF ": no model.safetensors and no model.safetensors.index.json", path);
    }
  } else {
    rc = TIDE_ERR(TIDE_E_IO, PATHF ": neither a directory nor a regular file", path);
  }
  if (rc < 0) goto fail;
  /* headers and mappings */
  int64_t total = 0;
  for (int i = 0; i < ck->n_shards; i++) {
    rc = open_shard(&ck->shards[i]);
    if (rc < 0) goto fail;
    total += ck->shards[i].h.n;
  }
  ck->ents = tide_xmalloc((size_t)(total ? total : 1) * sizeof *ck->ents);
  if (!ck->ents) {
    rc = TIDE_E_NOMEM;
    goto fail;
  }
  for (int i = 0; i < ck->n_shards; i++)
    for (int64_t j = 0; j < ck->shards[i].h.n; j++)
      ck->ents[ck->n++] = (ck_ent){ck->shards[i].h.t[j].name, i, (int32_t)j};
  qsort(ck->ents, (size_t)ck->n, sizeof *ck->ents, cmp_ent);
  for (int64_t i = 1; i < ck->n; i++)
    if (!strcmp(ck->ents[i].name, ck->ents[i - 1].name)) {
      rc = TIDE_ERR(TIDE_E_FORMAT, "tensor " NAMEF " is in two shards: " PATHF " and " PATHF, ck->ents[i].name,
                    ck->shards[ck->ents[i - 1].shard].path, ck->shards[ck->ents[i].shard].path);
      goto fail;
    }
  if (ck->n >= INT32_MAX / 2) {
    rc = TIDE_ERR(TIDE_E_UNSUPPORTED, PATHF ": %lld tensors is more than tide indexes", path, (long long)ck->n);
    goto fail;
  }
  ck->hcap = 16;
  while (ck->hcap < 2 * ck->n) ck->hcap *= 2;
  ck->htab = tide_xcalloc((size_t)ck->hcap, sizeof *ck->htab);
  if (!ck->htab) {
    rc = TIDE_E_NOMEM;
    goto fail;
  }
  for (int64_t i = 0; i < ck->n; i++) {
    uint64_t h = name_hash(ck->ents[i].name), m = (uint64_t)ck->hcap - 1, k = h & m;
    while (ck->htab[k]) k = (k + 1) & m;
    ck->htab[k] = (h & 0xffffffff00000000ULL) | (uint64_t)(i + 1);
  }
  if (have_index) {
    rc = check_index(ck, &index, ipath);
    index_free(&index);
    if (rc < 0) goto fail;
  }
  if (ck->has_config) {
    rc = tide_config_parse(&ck->cfg, ck->config_json, ck->config_len, ck->config_path);
    if (rc < 0) goto fail;
    if (!(flags & TIDE_CKPT_NO_MODEL_CHECK)) {
      rc = tide_ckpt_check_model(ck);
      if (rc < 0) goto fail;
    }
  }
  index_free(&index);
  tide_xfree(ipath);
  *out = ck;
  return TIDE_OK;
fail:
  index_free(&index);
  tide_xfree(ipath);
  tide_ckpt_free(ck);
  return rc;
}

/* ---- queries ---- */
int64_t tide_ckpt_count(const tide_ckpt *ck) { return ck ? ck->n : 0; }

int64_t tide_ckpt_find(const tide_ckpt *ck, const char *name) {
  if (!ck || !name || !ck->htab) return -1;
  uint64_t h = name_hash(name), m = (uint64_t)ck->hcap - 1, hi = h & 0xffffffff00000000ULL;
  for (uint64_t k = h & m;; k = (k + 1) & m) {
    uint64_t v = ck->htab[k];
    if (!v) return -1;
    /* the stored high hash bits spare a look at the name for other entries */
    int64_t i = (int64_t)(v & 0xffffffffu) - 1;
    if ((v & 0xffffffff00000000ULL) == hi && !strcmp(ck->ents[i].name, name)) return i;
  }
}

static const st_tensor *ent_tensor(const tide_ckpt *ck, int64_t i) {
  const ck_ent *e = &ck->ents[i];
  return &ck->shards[e->shard].h.t[e->local];
}

int tide_ckpt_info_at(const tide_ckpt *ck, int64_t i, tide_ckpt_info *out) {
  if (!ck || !out) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  if (i < 0 || i >= ck->n)
    return TIDE_ERR(TIDE_E_RANGE, "tensor index %lld outside 0..%lld", (long long)i, (long long)ck->n - 1);
  const ck_shard *s = &ck->shards[ck->ents[i].shard];
  const st_tensor *t = ent_tensor(ck, i);
  memset(out, 0, sizeof *out);
  out->name = t->name;
  out->shard = s->path;
  out->shard_index = ck->ents[i].shard;
  out->dtype = t->dtype;
  out->ndim = t->ndim;
  for (int k = 0; k < TIDE_MAXDIM; k++) out->shape[k] = t->shape[k];
  out->offset = s->h.data_start + t->begin;
  out->nbytes = t->end - t->begin;
  return TIDE_OK;
}

int tide_ckpt_tensor_at(const tide_ckpt *ck, int64_t i, tide_tensor *out) {
  if (!ck || !out) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  if (i < 0 || i >= ck->n)
    return TIDE_ERR(TIDE_E_RANGE, "tensor index %lld outside 0..%lld", (long long)i, (long long)ck->n - 1);
  const ck_shard *s = &ck->shards[ck->ents[i].shard];
  const st_tensor *t = ent_tensor(ck, i);
  int rc = tide_tensor_from_storage(out, s->map, s->h.data_start + t->begin, t->dtype, t->ndim, t->shape);
  if (rc < 0) return tide_error_wrap(rc, "tensor " NAMEF " of " PATHF, t->name, s->path);
  return TIDE_OK;
}

int tide_ckpt_tensor(const tide_ckpt *ck, const char *name, tide_tensor *out) {
  if (!ck || !name || !out) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  int64_t i = tide_ckpt_find(ck, name);
  if (i < 0)
    return TIDE_ERR(TIDE_E_RANGE, "tensor " NAMEF " not found in " PATHF " (%lld tensors in %d shard%s)", name,
                    ck->path, (long long)ck->n, ck->n_shards, ck->n_shards == 1 ? "" : "s");
  return tide_ckpt_tensor_at(ck, i, out);
}

int tide_ckpt_shard_count(const tide_ckpt *ck) { return ck ? ck->n_shards : 0; }

int tide_ckpt_shard_at(const tide_ckpt *ck, int i, tide_ckpt_shard_info *out) {
  if (!ck || !out) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  if (i < 0 || i >= ck->n_shards) return TIDE_ERR(TIDE_E_RANGE, "shard %d outside 0..%d", i, ck->n_shards - 1);
  const ck_shard *s = &ck->shards[i];
  memset(out, 0, sizeof *out);
  out->path = s->path;
  out->metadata_json = s->h.metadata_json;
  out->file_size = s->file_size;
  out->header_bytes = s->h.header_len;
  out->n_tensors = s->h.n;
  out->tensor_bytes = s->tensor_bytes;
  return TIDE_OK;
}

static int is_scale(const char *name, int dtype) {
  size_t l = strlen(name);
  return dtype == TIDE_E8M0 && l > 6 && !strcmp(name + l - 6, ".scale");
}

/* does `name` (ending in .weight) have a .scale companion? */
static int has_scale(const tide_ckpt *ck, const char *name) {
  size_t l = strlen(name);
  if (l < 7 || strcmp(name + l - 7, ".weight") || l > 400) return 0;
  char buf[420];
  snprintf(buf, sizeof buf, "%.*s.scale", (int)(l - 7), name);
  return tide_ckpt_find(ck, buf) >= 0;
}

int tide_ckpt_summary_get(const tide_ckpt *ck, tide_ckpt_summary *out) {
  if (!ck || !out) return TIDE_ERR(TIDE_E_INVALID, "NULL argument");
  memset(out, 0, sizeof *out);
  out->path = ck->path;
  out->n_shards = ck->n_shards;
  out->has_config = ck->has_config;
  out->n_tensors = ck->n;
  out->index_total_size = ck->index_total;
  for (int64_t i = 0; i < ck->n; i++) {
    const st_tensor *t = ent_tensor(ck, i);
    int64_t numel = 1;
    for (int k = 0; k < t->ndim; k++) numel *= t->shape[k];
    int64_t bytes = t->end - t->begin;
    out->count_by_dtype[t->dtype]++;
    out->elements_by_dtype[t->dtype] += numel;
    out->bytes_by_dtype[t->dtype] += bytes;
    out->tensor_bytes += bytes;
    if (is_scale(t->name, t->dtype) || t->dtype == TIDE_I32 || t->dtype == TIDE_I64) continue;
    int packed = (t->dtype == TIDE_I8 || t->dtype == TIDE_U8) && has_scale(ck, t->name);
    out->parameters += packed ? 2 * numel : numel;
  }
  return TIDE_OK;
}

const tide_config *tide_ckpt_config(const tide_ckpt *ck) { return ck && ck->has_config ? &ck->cfg : NULL; }

const char *tide_ckpt_config_json(const tide_ckpt *ck, int64_t *len) {
  if (len) *len = ck && ck->has_config ? ck->config_len : 0;
  return ck && ck->has_config ? ck->config_json : NULL;
}

/* ---- the tensors a config implies ---- */
static const char *shape_txt(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t o = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
  return buf;
}

static int same_shape(const st_tensor *t, int ndim, int64_t d0, int64_t d1) {
  return t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
}

static int check_weight(const tide_ckpt *ck, const tide_tensor_spec *sp, const st_tensor *t, const char *shard) {
  int64_t r = sp->rows, c = sp->cols;
  const tide_config *cfg = &ck->cfg;
  int64_t b0 = cfg->weight_block_size[0] > 0 ? cfg->weight_block_size[0] : 128;
  int64_t b1 = cfg->weight_block_size[1] > 0 ? cfg->weight_block_size[1] : 128;
  char got[80], sname[128];
  size_t l = strlen(sp->name);
  snprintf(sname, sizeof sname, "%.*s.scale", (int)(l > 7 ? l - 7 : l), sp->name);
  int need_scale = 0;
  int64_t s0 = 0, s1 = 0;
  int ok = 0;
  switch (t->dtype) {
    case TIDE_BF16: case TIDE_F16: case TIDE_F32: ok = same_shape(t, 2, r, c); break;
    case TIDE_F8E4M3:
      ok = same_shape(t, 2, r, c);
      need_scale = 1, s0 = (r + b0 - 1) / b0, s1 = (c + b1 - 1) / b1;
      break;
    case TIDE_I8: case TIDE_U8:
      ok = c % 32 == 0 && same_shape(t, 2, r, c / 2);
      need_scale = 1, s0 = r, s1 = c / 32;
      break;
    case TIDE_FP4:
      ok = c % 32 == 0 && same_shape(t, 2, r, c);
      need_scale = 1, s0 = r, s1 = c / 32;
      break;
    default: break;
  }
  if (!ok)
    return TIDE_ERR(TIDE_E_FORMAT,
                    "tensor " NAMEF " in " PATHF " is %s %s: expected a [%lld, %lld] matrix as bf16/f16/f32 [%lld, %lld], "
                    "f8e4m3 [%lld, %lld] or MXFP4 i8 [%lld, %lld] (with .scale)",
                    sp->name, shard, tide_dtype_name(t->dtype), shape_txt(got, sizeof got, t->ndim, t->shape),
                    (long long)r, (long long)c, (long long)r, (long long)c, (long long)r, (long long)c, (long long)r,
                    (long long)(c / 2));
  if (!need_scale) return TIDE_OK;
  int64_t si = tide_ckpt_find(ck, sname);
  if (si < 0)
    return TIDE_ERR(TIDE_E_FORMAT, "tensor " NAMEF " is missing from %.400s: %s weight " NAMEF " needs its e8m0 scale %s",
                    sname, ck->path, tide_dtype_name(t->dtype), sp->name,
                    shape_txt(got, sizeof got, 2, (int64_t[]){s0, s1}));
  const st_tensor *s = ent_tensor(ck, si);
  if (s->dtype != TIDE_E8M0 || !same_shape(s, 2, s0, s1)) {
    char want[80];
    return TIDE_ERR(TIDE_E_FORMAT, "tensor " NAMEF " in " PATHF " is %s %s: expected e8m0 %s (the scale of %s " NAMEF ")",
                    sname, ck->shards[ck->ents[si].shard].path, tide_dtype_name(s->dtype),
                    shape_txt(got, sizeof got, s->ndim, s->shape), shape_txt(want, sizeof want, 2, (int64_t[]){s0, s1}),
                    tide_dtype_name(t->dtype), sp->name);
  }
  return TIDE_OK;
}

static int check_spec(void *ctx, const tide_tensor_spec *sp) {
  const tide_ckpt *ck = ctx;
  char got[80], want[80];
  if (sp->kind == TIDE_SPEC_SCALE) return TIDE_OK; /* checked with its weight */
  int64_t i = tide_ckpt_find(ck, sp->name);
  /* tide does not run the MTP block (like vLLM's CPU path), so checkpoints
   * saved without it load; the MTP tensors that are present are checked. */
  if (i < 0 && sp->layer >= ck->cfg.num_hidden_layers) return TIDE_OK;
  if (i < 0)
    return TIDE_ERR(TIDE_E_FORMAT, "tensor " NAMEF " is missing from " PATHF ": the config (%s) implies %s %s", sp->name,
                    ck->path, ck->config_path, tide_dtype_name(sp->dtype),
                    shape_txt(want, sizeof want, sp->ndim, sp->shape));
  const st_tensor *t = ent_tensor(ck, i);
  const char *shard = ck->shards[ck->ents[i].shard].path;
  if (sp->kind == TIDE_SPEC_WEIGHT) return check_weight(ck, sp, t, shard);
  int dt_ok;
  if (sp->kind == TIDE_SPEC_IDS) dt_ok = t->dtype == TIDE_I64 || t->dtype == TIDE_I32;
  else dt_ok = t->dtype == TIDE_BF16 || t->dtype == TIDE_F16 || t->dtype == TIDE_F32;
  if (!dt_ok || !same_shape(t, sp->ndim, sp->shape[0], sp->shape[1]))
    return TIDE_ERR(TIDE_E_FORMAT, "tensor " NAMEF " in " PATHF " is %s %s: expected %s %s%s", sp->name, shard,
                    tide_dtype_name(t->dtype), shape_txt(got, sizeof got, t->ndim, t->shape), tide_dtype_name(sp->dtype),
                    shape_txt(want, sizeof want, sp->ndim, sp->shape),
                    sp->kind == TIDE_SPEC_IDS ? " (or i32)" : " (or another float dtype)");
  return TIDE_OK;
}

int tide_ckpt_check_model(const tide_ckpt *ck) {
  if (!ck) return TIDE_ERR(TIDE_E_INVALID, "NULL checkpoint");
  if (!ck->has_config) return TIDE_ERR(TIDE_E_STATE, PATHF ": no config.json to check the tensors against", ck->path);
  return tide_config_inventory_walk(&ck->cfg, check_spec, (void *)ck);
}

/* ---- progress bar ---- */
struct tide_progress {
  char label[48];
  int64_t total;
  int64_t done;          /* atomic */
  int show;
  int drawing;           /* atomic flag: one drawer at a time */
  double t0, last;
};

static void progress_draw(tide_progress *p, int final) {
  int64_t done = __atomic_load_n(&p->done, __ATOMIC_RELAXED);
  double now = tide_time(), dt = now - p->t0;
  double frac = p->total > 0 ? (double)done / (double)p->total : 1.0;
  if (frac > 1) frac = 1;
  char bar[31];
  int fill = (int)(frac * 30);
  for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
  bar[30] = 0;
  double rate = dt > 0 ? (double)done / dt : 0;
  fprintf(stderr, "\r%s %3d%% [%s] %.2f/%.2f GB %6.0f MB/s%s", p->label, (int)(frac * 100), bar, (double)done / 1e9,
          (double)p->total / 1e9, rate / 1e6, final ? "\n" : "");
  fflush(stderr);
}

int tide_progress_new(tide_progress **out, const char *label, int64_t total, int mode) {
  if (!out) return TIDE_ERR(TIDE_E_INVALID, "NULL out");
  *out = NULL;
  if (mode < TIDE_PROGRESS_AUTO || mode > TIDE_PROGRESS_NEVER) return TIDE_ERR(TIDE_E_INVALID, "bad mode %d", mode);
  tide_progress *p = tide_xcalloc(1, sizeof *p);
  if (!p) return TIDE_E_NOMEM;
  snprintf(p->label, sizeof p->label, "%s", label ? label : "progress");
  p->total = total < 0 ? 0 : total;
  if (mode == TIDE_PROGRESS_AUTO) {
    const char *env = getenv("TIDE_PROGRESS");
    if (env && *env) p->show = strcmp(env, "0") != 0;
    else p->show = isatty(2);
  } else {
    p->show = mode == TIDE_PROGRESS_ALWAYS;
  }
  p->t0 = p->last = tide_time();
  if (p->show) progress_draw(p, 0);
  *out = p;
  return TIDE_OK;
}

void tide_progress_add(tide_progress *p, int64_t n) {
  if (!p) return;
  __atomic_add_fetch(&p->done, n, __ATOMIC_RELAXED);
  if (!p->show) return;
  double now = tide_time();
  if (now - p->last < 0.1) return;
  if (__atomic_exchange_n(&p->drawing, 1, __ATOMIC_ACQUIRE)) return;
  p->last = now;
  progress_draw(p, 0);
  __atomic_store_n(&p->drawing, 0, __ATOMIC_RELEASE);
}

void tide_progress_free(tide_progress *p) {
  if (!p) return;
  if (p->show) progress_draw(p, 1);
  tide_xfree(p);
}

/* ---- pre-faulting ---- */
typedef struct {
  int32_t shard;
  int64_t begin, end;   /* absolute file offsets */
} range;

static int cmp_rangev(const void *a, const void *b) {
  const range *x = a, *y = b;
  if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return 0;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

int tide_ckpt_prefault(const tide_ckpt *ck, const int64_t *idx, int64_t n, int mode) {
  if (!ck) return TIDE_ERR(TIDE_E_INVALID, "NULL checkpoint");
  if (!idx) n = ck->n;
  if (n < 0) return TIDE_ERR(TIDE_E_INVALID, "negative count %lld", (long long)n);
  for (int64_t k = 0; idx && k < n; k++)
    if (idx[k] < 0 || idx[k] >= ck->n)
      return TIDE_ERR(TIDE_E_RANGE, "tensor index %lld outside 0..%lld", (long long)idx[k], (long long)ck->n - 1);
  range *rs = tide_xmalloc((size_t)(n ? n : 1) * sizeof *rs);
  if (!rs) return TIDE_E_NOMEM;
  for (int64_t k = 0; k < n; k++) {
    int64_t i = idx ? idx[k] : k;
    const ck_shard *s = &ck->shards[ck->ents[i].shard];
    const st_tensor *t = ent_tensor(ck, i);
    rs[k] = (range){ck->ents[i].shard, s->h.data_start + t->begin, s->h.data_start + t->end};
  }
  qsort(rs, (size_t)n, sizeof *rs, cmp_rangev);
  /* a tensor listed twice is touched once (ranges of distinct tensors never overlap) */
  int64_t m = 0, total = 0;
  for (int64_t k = 0; k < n; k++) {
    if (m && rs[m - 1].shard == rs[k].shard && rs[m - 1].begin == rs[k].begin) continue;
    rs[m++] = rs[k];
    total += rs[k].end - rs[k].begin;
  }
  n = m;
  tide_progress *bar;
  int rc = tide_progress_new(&bar, "loading", total, mode);
  if (rc < 0) {
    tide_xfree(rs);
    return rc;
  }
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) page = 4096;
  int populate = 1;
  volatile uint8_t sink = 0;
  const int64_t chunk = (int64_t)16 << 20;
  for (int64_t k = 0; k < n; k++) {
    const ck_shard *s = &ck->shards[rs[k].shard];
    const uint8_t *base = tide_storage_data(s->map);
    int64_t b = rs[k].begin, e = rs[k].end;
    for (int64_t at = b; at < e; at += chunk) {
      int64_t stop = at + chunk < e ? at + chunk : e;
      int64_t a0 = at / page * page;
      if (populate && madvise((void *)(base + a0), (size_t)(stop - a0), MADV_POPULATE_READ) != 0) populate = 0;
      if (!populate) {
        for (int64_t p = at; p < stop; p += page) sink ^= base[p];
        sink ^= base[stop - 1];
      }
      tide_progress_add(bar, stop - at);
    }
  }
  (void)sink;
  tide_progress_free(bar);
  tide_xfree(rs);
  return TIDE_OK;
}
