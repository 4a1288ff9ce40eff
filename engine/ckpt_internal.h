/* ckpt_internal.h - what the checkpoint files share inside the library: the
 * parsed form of one safetensors header (safetensors.c), used by the
 * checkpoint loader (checkpoint.c) and the fuzz target. */
#ifndef TIDE_CKPT_INTERNAL_H
#define TIDE_CKPT_INTERNAL_H

#include "tide_internal.h"

/* HF's reader refuses headers above 100 MB; so do we (a 64-shard Pro
 * checkpoint has headers of ~0.3 MB each). */
#define ST_MAX_HEADER ((int64_t)100 * 1000 * 1000)

typedef struct st_tensor {
  const char *name;      /* into st_header.names */
  int32_t dtype;         /* tide_dtype */
  int32_t ndim;
  int64_t shape[4];
  int64_t begin, end;    /* data_offsets, relative to the data section */
} st_tensor;

typedef struct st_header {
  int64_t header_len;    /* N */
  int64_t data_start;    /* 8 + N: file offset of the data section */
  int64_t data_len;      /* file size - data_start */
  int64_t n;             /* tensors */
  st_tensor *t;          /* [n], in header order */
  char *names;           /* NUL-separated names (one allocation) */
  char *metadata_json;   /* __metadata__ re-serialised, NULL if absent */
} st_header;

/* Parse and check the N header bytes `hdr` of a file of `file_size` bytes
 * (the data section is what follows 8 + n). Every check of docs/checkpoint.md
 * is applied; errors name `path` and the tensor. *out is filled only on
 * success (free with st_header_free). */
int st_parse_header(st_header *out, const char *hdr, int64_t n, int64_t file_size, const char *path);
/* The same over a whole file image in memory (length prefix included). */
int st_parse_image(st_header *out, const uint8_t *data, int64_t len, const char *path);
void st_header_free(st_header *h);

/* tide_config_inventory without the array: fn sees each spec in order (the
 * spec is valid during the call); the first negative return stops the walk
 * and is returned. */
int tide_config_inventory_walk(const tide_config *c, int (*fn)(void *ctx, const tide_tensor_spec *spec), void *ctx);

/* safetensors dtype name of a tide dtype ("F8_E4M3"), NULL if it has none. */
const char *st_dtype_name(int dtype);

#endif
