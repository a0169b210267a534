/* vec.c — growth for the EM_VEC_PUSH growable arrays of base/base.h: capacity doubles (from 8)
 * until it covers the need, with overflow checks; new slots are left uninitialized. */
#include "base/base.h"

#include <stdint.h>
#include <stdlib.h>

bool em_vec_grow(void **items, size_t *cap, size_t need, size_t elem_size)
{
    if (need <= *cap) return true;
    size_t n = *cap ? *cap : 8;
    while (n < need) {
        if (n > SIZE_MAX / 2) {
            n = need;
            break;
        }
        n *= 2;
    }
    if (elem_size && n > SIZE_MAX / elem_size) {
        em_set_error(EM_ERR_NOMEM, "array of %zu elements of %zu bytes is too large", need,
                     elem_size);
        return false;
    }
    void *p = realloc(*items, n * elem_size);
    if (!p) {
        em_set_error(EM_ERR_NOMEM, "out of memory growing an array to %zu elements", n);
        return false;
    }
    *items = p;
    *cap = n;
    return true;
}
