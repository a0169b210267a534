/* base.h — the whole base library in one include: errors, arena, strings, hash map, hashing,
 * logging, thread pool and files. Nothing here knows about kernels, devices or tensors. */
#ifndef EM_BASE_BASE_H
#define EM_BASE_BASE_H
#include "ember/base.h"
#include "base/arena.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/map.h"
#include "base/strbuf.h"
#include "base/threadpool.h"

#define EM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define EM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EM_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Growable arrays: a struct with `T *items; size_t len, cap;`. EM_VEC_PUSH returns false (error
 * set) when out of memory. */
bool em_vec_grow(void **items, size_t *cap, size_t need, size_t elem_size);
#define EM_VEC_PUSH(v, x)                                                                          \
    (em_vec_grow((void **)&(v)->items, &(v)->cap, (v)->len + 1, sizeof(*(v)->items))               \
         ? ((v)->items[(v)->len++] = (x), true)                                                    \
         : false)

#endif
