/* cuda_tma.c — PTX for the kernel language's tensor memory accelerator builtins (lower_tma.c):
 *   "cuda.tma.load:D,B,M@D"  (di, bi << 32 | mi, y << 32 | x, z)
 *       cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes: the box of
 *       the tensor map at M + 16 mi (a u64 tensor parameter: a global-memory CUtensorMap) at
 *       coordinates (x, y, z) into shared array D from element di, its bytes counted on barrier
 *       B[bi] (complete_tx). The map's generic address is the operand; D's and B's are 32-bit
 *       shared-window addresses (__cvta_generic_to_shared): a shared::cta address is a valid
 *       shared::cluster one naming the cube's own memory.
 *   "cuda.tma.load_mc:D,B,M@D"  (mask << 32 | di, ...)
 *       its .multicast::cluster form: the box lands at the same offset of D in every cube of the
 *       cluster whose rank is a bit of the mask (16 bits), counted on each one's B[bi].
 *   "cuda.tma.acquire:M@M"   (mi)
 *       fence.proxy.tensormap::generic.acquire.sys on the 128 bytes of that map: the host wrote
 *       it (cuMemcpyHtoD), so the tensor-map proxy must not use what it cached of that address.
 *   "cuda.tma.fence_async"   ()
 *       fence.proxy.async.shared::cta: the unit's shared-memory writes (barrier inits) become
 *       visible to the async proxy (the copy engine) before it completes transactions on them.
 *   "cuda.tma.reduce_add:D,S@D"  (di, si, n)
 *       cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32: n f32 of shared array S
 *       from element si added to global D from element di (16-byte multiples and alignment).
 *   "cuda.tma.commit", "cuda.tma.wait_read:N"
 *       cp.async.bulk.commit_group; cp.async.bulk.wait_group.read N.
 * All need sm_90a (PTX ISA 8.3 for the tensor-map fence). */
#include <stdio.h>
#include <string.h>

#include "kernel/codegen/cuda_tma.h"

/* The memory ids in "A,B,C@..." (count of them), into ids; false when malformed. */
static bool parse_ids(const char *what, unsigned count, em_ir_mem *ids)
{
    unsigned v[3] = {0, 0, 0};
    int n = count == 3 ? sscanf(what, "%u,%u,%u@", &v[0], &v[1], &v[2])
                       : sscanf(what, "%u@", &v[0]);
    if (n != (int)count) return false;
    for (unsigned i = 0; i < count; i++) ids[i] = (em_ir_mem)v[i];
    return true;
}

/* Whether memory m exists, in `space`, with elements of `scalar` (EM_SCALAR_COUNT: any). */
static bool mem_is(em_spmd *e, em_ir_mem m, em_mem_space space, em_scalar scalar)
{
    const em_ir_memory *x = m ? em_ir_mem_at(e->k, m) : NULL;
    return x && x->space == space && (scalar == EM_SCALAR_COUNT || x->elem.scalar == scalar);
}

static void load(em_spmd *e, const em_ir_inst *in, const char *what, bool multicast)
{
    em_ir_mem m[3];
    if (!parse_ids(what, 3, m) || in->imm != 4 || !mem_is(e, m[0], EM_MEM_SHARED, EM_SCALAR_COUNT) ||
        !mem_is(e, m[1], EM_MEM_SHARED, EM_U64) || !mem_is(e, m[2], EM_MEM_GLOBAL, EM_U64)) {
        em_spmd_fail(e, "malformed tensor-map load `%s`", in->str);
        return;
    }
    em_strbuf di, bm, xy, z;
    em_sb_init(&di), em_sb_init(&bm), em_sb_init(&xy), em_sb_init(&z);
    if (multicast)
        em_spmd_val(e, in->args[0], &di); /* the u64 mask << 32 | di */
    else
        em_spmd_val_u32(e, in->args[0], &di);
    em_spmd_val(e, in->args[1], &bm);
    em_spmd_val(e, in->args[2], &xy);
    em_spmd_val_u32(e, in->args[3], &z);
    /* multicast: the mask (the u64 operand's high half) as one more 16-bit operand */
    em_strbuf mask;
    em_sb_init(&mask);
    if (multicast) em_sb_printf(&mask, ", \"h\"((unsigned short)((%s) >> 32))", di.data);
    em_spmd_line(e,
                 "asm volatile(\"cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::"
                 "complete_tx::bytes%s [%%0], [%%1, {%%2, %%3, %%4}], [%%5]%s;\" :: "
                 "\"r\"((unsigned)__cvta_generic_to_shared(%s + (unsigned)(%s))), "
                 "\"l\"((unsigned long long)(%s + (unsigned)(%s) * 16u)), "
                 "\"r\"((unsigned)(%s)), \"r\"((unsigned)((%s) >> 32)), \"r\"(%s), "
                 "\"r\"((unsigned)__cvta_generic_to_shared(%s + (unsigned)((%s) >> 32)))%s : "
                 "\"memory\");",
                 multicast ? ".multicast::cluster" : "", multicast ? ", %6" : "", e->mname[m[0]],
                 di.data, e->mname[m[2]], bm.data, xy.data, xy.data, z.data, e->mname[m[1]],
                 bm.data, mask.data);
    em_sb_free(&di), em_sb_free(&bm), em_sb_free(&xy), em_sb_free(&z), em_sb_free(&mask);
}

static void acquire(em_spmd *e, const em_ir_inst *in, const char *what)
{
    em_ir_mem m;
    if (!parse_ids(what, 1, &m) || in->imm != 1 || !mem_is(e, m, EM_MEM_GLOBAL, EM_U64)) {
        em_spmd_fail(e, "malformed tensor-map fence `%s`", in->str);
        return;
    }
    em_strbuf mi;
    em_sb_init(&mi);
    em_spmd_val_u32(e, in->args[0], &mi);
    em_spmd_line(e,
                 "asm volatile(\"fence.proxy.tensormap::generic.acquire.sys [%%0], 128;\" :: "
                 "\"l\"((unsigned long long)(%s + (%s) * 16u)) : \"memory\");",
                 e->mname[m], mi.data);
    em_sb_free(&mi);
}

static void reduce_add(em_spmd *e, const em_ir_inst *in, const char *what)
{
    unsigned v[2] = {0, 0};
    if (sscanf(what, "%u,%u@", &v[0], &v[1]) != 2 || in->imm != 3 ||
        !mem_is(e, (em_ir_mem)v[0], EM_MEM_GLOBAL, EM_F32) ||
        !mem_is(e, (em_ir_mem)v[1], EM_MEM_SHARED, EM_F32)) {
        em_spmd_fail(e, "malformed bulk reduction `%s`", in->str);
        return;
    }
    em_strbuf di, si, n;
    em_sb_init(&di), em_sb_init(&si), em_sb_init(&n);
    em_spmd_val_u32(e, in->args[0], &di);
    em_spmd_val_u32(e, in->args[1], &si);
    em_spmd_val_u32(e, in->args[2], &n);
    em_spmd_line(e,
                 "asm volatile(\"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 "
                 "[%%0], [%%1], %%2;\" :: \"l\"((unsigned long long)(%s + (unsigned)(%s))), "
                 "\"r\"((unsigned)__cvta_generic_to_shared(%s + (unsigned)(%s))), "
                 "\"r\"((unsigned)(%s) * 4u) : \"memory\");",
                 e->mname[v[0]], di.data, e->mname[v[1]], si.data, n.data);
    em_sb_free(&di), em_sb_free(&si), em_sb_free(&n);
}

void em_cuda_tma(em_spmd *e, const em_ir_inst *in, const char *what, em_strbuf *sb)
{
    em_sb_append(sb, "(void)0");
    if (strcmp(e->caps.arch, "sm_90a")) {
        em_spmd_fail(e,
                     "the tensor memory accelerator needs compute capability 9.0 (sm_90a); this "
                     "device is %s",
                     e->caps.arch[0] ? e->caps.arch : "of unknown architecture");
        return;
    }
    if (!strncmp(what, "load:", 5))
        load(e, in, what + 5, false);
    else if (!strncmp(what, "load_mc:", 8))
        load(e, in, what + 8, true);
    else if (!strncmp(what, "acquire:", 8))
        acquire(e, in, what + 8);
    else if (!strcmp(what, "fence_async"))
        em_spmd_line(e, "asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");");
    else if (!strncmp(what, "reduce_add:", 11))
        reduce_add(e, in, what + 11);
    else if (!strcmp(what, "commit"))
        em_spmd_line(e, "asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");");
    else if (!strncmp(what, "wait_read:", 10) && what[10] >= '0' && what[10] <= '7' && !what[11])
        em_spmd_line(e, "asm volatile(\"cp.async.bulk.wait_group.read %c;\" ::: \"memory\");",
                     what[10]);
    else
        em_spmd_fail(e, "unknown tensor-map intrinsic `%s`", in->str);
}
