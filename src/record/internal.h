/* internal.h — what the record layer's files share: the safetensors dtype names (the spec's "F32",
 * "BF16", ...) and their mapping to ember's scalar kinds. */
#ifndef EM_RECORD_INTERNAL_H
#define EM_RECORD_INTERNAL_H

#include "ember/record.h"

/* The safetensors name of a scalar kind ("F32"), or NULL for a kind the format has no name for. */
const char *rec_dtype_name(em_scalar s);
/* The scalar kind of a safetensors dtype name; EM_SCALAR_COUNT when unknown. */
em_scalar rec_dtype_parse(const char *name);
/* True for the kinds ember tensors hold (F64 F32 F16 BF16 I64 I32 U8 BOOL); the other names the
 * format has (I8, I16, U16, U32, U64) are parsed but refused when loading. */
bool rec_dtype_loadable(em_scalar s);

#endif
