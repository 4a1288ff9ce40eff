/*
 * tide.h - the public C API of tide, and the only surface the Lua side sees.
 *
 * Boundary: the C core owns memory (tensors, weights, caches), kernels and
 * threads; Lua (lua/tide/) owns layer wiring, sampling and batching policy.
 * scripts/gen_cdef.lua turns this header (and the section headers it
 * includes with quotes) into the declarations given to LuaJIT's ffi.cdef, so
 * the declarations between TIDE_CDEF_BEGIN and TIDE_CDEF_END must stay plain
 * C: no macros, no #if, no function-like constructs.
 *
 * Conventions used by every function below:
 *  - Functions return int: TIDE_OK (0), a negative TIDE_E_* on error, or a
 *    small positive value for a recoverable state (TIDE_FULL). On error the
 *    thread-local message from tide_last_error() says what and where, and the
 *    objects passed in are left unchanged.
 *  - Nothing here aborts or exits on bad input.
 *  - Frees and releases accept NULL and are idempotent where stated.
 *  - Ownership is stated at each declaration.
 */
#ifndef TIDE_H
#define TIDE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* TIDE_CDEF_BEGIN */
#include "tide/core.h"
#include "tide/tensor.h"
#include "tide/linear.h"
#include "tide/quant.h"
#include "tide/checkpoint.h"
#include "tide/attn.h"
#include "tide/ops.h"
#include "tide/tokenizer.h"
#include "tide/sampling.h"
#include "tide/refmodel.h"
#include "tide/http.h"
/* TIDE_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* TIDE_H */
