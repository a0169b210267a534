/* ops_matmul.c — em_matmul: batched, broadcast matrix multiply with torch.matmul's promotion of
 * 1-D operands, through the tiled kernel of src/kernels/tensor_matmul.ek. Operands are read
 * through their strides (a transposed weight needs no copy); batch dims broadcast by stride 0. */
#include <string.h>

#include "tensor/internal.h"

#define TILE 16

em_tensor *em_matmul(const em_tensor *a, const em_tensor *b)
{
    if (!a || !b) {
        tn_done(a);
        if (b != a) tn_done(b);
        return NULL;
    }
    em_tensor *out = NULL;
    char sa[128], sb[128];
    if (!tn_same_device("matmul", a, b)) goto done;
    if (a->dtype != b->dtype) {
        em_set_error(EM_ERR_INVALID, "matmul: dtypes %s and %s differ (cast one first)", em_scalar_name(a->dtype),
                     em_scalar_name(b->dtype));
        goto done;
    }
    if (a->dtype == EM_BOOL || a->rank == 0 || b->rank == 0) {
        em_set_error(EM_ERR_INVALID, "matmul: needs numeric tensors of rank 1 or more, got %s and %s",
                     em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb));
        goto done;
    }
    /* Promote 1-D operands to matrices: a [K] -> [1, K], b [K] -> [K, 1]. */
    int ra = a->rank == 1 ? 2 : a->rank, rb = b->rank == 1 ? 2 : b->rank;
    int64_t ash[EM_MAX_RANK], ast[EM_MAX_RANK], bsh[EM_MAX_RANK], bst[EM_MAX_RANK];
    if (a->rank == 1) {
        ash[0] = 1, ast[0] = 0, ash[1] = a->shape[0], ast[1] = a->stride[0];
    } else {
        memcpy(ash, a->shape, sizeof ash), memcpy(ast, a->stride, sizeof ast);
    }
    if (b->rank == 1) {
        bsh[0] = b->shape[0], bst[0] = b->stride[0], bsh[1] = 1, bst[1] = 0;
    } else {
        memcpy(bsh, b->shape, sizeof bsh), memcpy(bst, b->stride, sizeof bst);
    }
    int64_t M = ash[ra - 2], K = ash[ra - 1], N = bsh[rb - 1];
    if (bsh[rb - 2] != K) {
        em_set_error(EM_ERR_INVALID, "matmul: shapes %s and %s do not match (inner dims %lld and %lld)",
                     em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb), (long long)K,
                     (long long)bsh[rb - 2]);
        goto done;
    }
    /* Broadcast the batch dims. */
    int ba = ra - 2, bb = rb - 2, br = ba > bb ? ba : bb;
    int R = br + 2;
    int64_t osh[EM_MAX_RANK], aS[EM_MAX_RANK], bS[EM_MAX_RANK], xsh_a[EM_MAX_RANK], xsh_b[EM_MAX_RANK];
    for (int i = 0; i < br; i++) {
        int ia = i - (br - ba), ib = i - (br - bb);
        int64_t da = ia >= 0 ? ash[ia] : 1, db = ib >= 0 ? bsh[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            em_set_error(EM_ERR_INVALID, "matmul: batch dims of %s and %s cannot be broadcast",
                         em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb));
            goto done;
        }
        osh[i] = da == 1 ? db : da;
        aS[i] = ia >= 0 && ash[ia] != 1 ? ast[ia] : 0;
        bS[i] = ib >= 0 && bsh[ib] != 1 ? bst[ib] : 0;
    }
    memcpy(xsh_a, osh, sizeof osh);
    memcpy(xsh_b, osh, sizeof osh);
    xsh_a[br] = M, xsh_a[br + 1] = K, aS[br] = ast[ra - 2], aS[br + 1] = ast[ra - 1];
    xsh_b[br] = K, xsh_b[br + 1] = N, bS[br] = bst[rb - 2], bS[br + 1] = bst[rb - 1];
    osh[br] = M, osh[br + 1] = N;
    /* The result's shape drops the promoted dims. */
    int64_t rsh[EM_MAX_RANK];
    int rr = 0;
    for (int i = 0; i < br; i++) rsh[rr++] = osh[i];
    if (a->rank > 1) rsh[rr++] = M;
    if (b->rank > 1) rsh[rr++] = N;
    out = tn_new(a->st->dev, a->dtype, rr, rsh);
    if (!out) goto done;
    int64_t batch = tn_numel(br, osh);
    if (M * N * batch == 0) goto done;
    if (K == 0) {
        if (tn_fill(out, 0) != EM_OK) goto fail;
        goto done;
    }
    int64_t ost[EM_MAX_RANK];
    tn_contig_strides(R, osh, ost);
    if (batch > 65535) {
        em_set_error(EM_ERR_UNSUPPORTED, "matmul: %lld batches is more than the 65535 supported", (long long)batch);
        goto fail;
    }
    em_scalar ct = em_scalar_is_float(a->dtype) ? tn_compute_type(a->dtype) : a->dtype == EM_I64 ? EM_I64 : EM_I32;
    if (a->dtype == EM_U8) ct = EM_I32;
    em_lang_bind bd[4] = {em_lang_bind_type("T", a->dtype), em_lang_bind_type("C", ct), em_lang_bind_int("R", R),
                          em_lang_bind_int("TILE", TILE)};
    tn_arg args[3] = {tn_arg_geom(a, R, xsh_a, aS, a->offset), tn_arg_geom(b, R, xsh_b, bS, b->offset),
                      tn_arg_geom(out, R, osh, ost, 0)};
    uint32_t cubes[3] = {(uint32_t)((N + TILE - 1) / TILE), (uint32_t)((M + TILE - 1) / TILE), (uint32_t)batch};
    uint32_t units[3] = {TILE, TILE, 1};
    if (tn_launch("matmul", a->st->dev, "tensor_matmul", bd, 4, 1, cubes, units, args, 3) != EM_OK) goto fail;
    goto done;
fail:
    em_release(out);
    out = NULL;
done:
    tn_done(a);
    if (b != a) tn_done(b);
    return out;
}
