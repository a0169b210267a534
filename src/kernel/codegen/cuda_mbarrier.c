/* cuda_mbarrier.c — PTX for the kernel language's Hopper pipeline builtins (lower_mbarrier.c):
 *   "cuda.mbar.init@M"        (i, count)   mbarrier.init: bar[i] expects count arrivals a phase
 *   "cuda.mbar.arrive@M"      (i)          mbarrier.arrive (release, CTA scope)
 *   "cuda.mbar.arrive_tx@M"   (i, bytes)   mbarrier.arrive.expect_tx
 *   "cuda.mbar.copy_arrive@M" (i)          cp.async.mbarrier.arrive.noinc: an arrival once this
 *                                          thread's earlier cp.async copies completed; .noinc
 *                                          leaves the pending count alone, so the init count
 *                                          includes these arrivals
 *   "cuda.mbar.wait@M"        (i, parity)  mbarrier.try_wait.parity in a loop (acquire)
 *   "cuda.mbar.try_wait@M"    (i, parity)  one try_wait.parity: its predicate as a bool
 *   "cuda.mbar.arrive_cluster@M" (i, c)    mapa to cube c of the cluster, then mbarrier.arrive
 *                                          on that cube's bar[i] (the default semantics, a
 *                                          CTA-scope release: a buffer's reads are all it hands
 *                                          back; a cluster-scope one would also wait for the
 *                                          unit's earlier global stores)
 *   "cuda.setmaxnreg:inc,N" / ":dec,N"     setmaxnreg.{inc,dec}.sync.aligned.u32 N
 *   "cuda.mbar.lds32@M"       (i)          the 4 bytes of shared array M from element i, as an
 *                                          unsigned (shared_load_u32: any shared array of 2- or
 *                                          4-byte scalars, i even for 2)
 * M is the shared u64 array of barriers; bar[i]'s shared-window address is taken with
 * __cvta_generic_to_shared. All need sm_90a (try_wait.parity, expect_tx and setmaxnreg). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/codegen/cuda_mbarrier.h"

/* The 32-bit shared address of barrier i of in's memory, into addr. */
static void barrier_addr(em_spmd *e, const em_ir_inst *in, em_strbuf *addr)
{
    em_strbuf idx;
    em_sb_init(&idx);
    em_spmd_val_u32(e, in->args[0], &idx);
    em_sb_printf(addr, "(unsigned)__cvta_generic_to_shared(%s + (%s))", e->mname[in->mem],
                 idx.data);
    em_sb_free(&idx);
}

static bool setmaxnreg(em_spmd *e, const char *what, em_strbuf *sb)
{
    char action[4] = "";
    unsigned n = 0;
    if (sscanf(what, "%3[a-z],%u", action, &n) != 2 ||
        (strcmp(action, "inc") && strcmp(action, "dec"))) {
        em_spmd_fail(e, "malformed setmaxnreg `%s`", what);
        return true;
    }
    em_spmd_line(e, "asm volatile(\"setmaxnreg.%s.sync.aligned.u32 %u;\" ::: \"memory\");", action,
                 n);
    em_sb_append(sb, "(void)0");
    return true;
}

bool em_cuda_mbarrier(em_spmd *e, const em_ir_inst *in, const char *what, em_strbuf *sb)
{
    bool regs = !strncmp(what, "setmaxnreg:", 11);
    if (!regs && strncmp(what, "mbar.", 5)) return false;
    if (strcmp(e->caps.arch, "sm_90a")) {
        em_spmd_fail(e,
                     "shared-memory barriers with phases and setmaxnreg need compute capability "
                     "9.0 (sm_90a); this device is %s",
                     e->caps.arch[0] ? e->caps.arch : "of unknown architecture");
        return true;
    }
    if (regs) return setmaxnreg(e, what + 11, sb);
    const em_ir_memory *m = em_ir_mem_at(e->k, in->mem);
    if (!strncmp(what, "mbar.lds32@", 11)) {
        if (!m || m->space != EM_MEM_SHARED || in->imm != 1) {
            em_spmd_fail(e, "shared_load_u32 needs a shared array and an index");
            return true;
        }
        em_strbuf idx;
        em_sb_init(&idx);
        em_spmd_val_u32(e, in->args[0], &idx);
        em_sb_printf(sb, "(*(const unsigned *)(%s + (%s)))", e->mname[in->mem], idx.data);
        em_sb_free(&idx);
        return true;
    }
    if (!m || m->space != EM_MEM_SHARED || m->elem.scalar != EM_U64 || in->imm < 1) {
        em_spmd_fail(e, "barrier intrinsic `%s` needs a shared u64 array and an index", in->str);
        return true;
    }
    const char *op = what + 5;
    size_t oplen = strcspn(op, "@");
    em_strbuf addr, x;
    em_sb_init(&addr);
    em_sb_init(&x);
    barrier_addr(e, in, &addr);
    if (in->imm > 1) em_spmd_val_u32(e, in->args[1], &x);
    bool known = true;
#define IS(s) (oplen == strlen(s) && !strncmp(op, s, oplen))
    if (IS("init") && in->imm == 2) {
        em_spmd_line(e,
                     "asm volatile(\"mbarrier.init.shared::cta.b64 [%%0], %%1;\" :: \"r\"(%s), "
                     "\"r\"(%s) : \"memory\");",
                     addr.data, x.data);
    } else if (IS("arrive")) {
        em_spmd_line(e,
                     "asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%%0];\" :: \"r\"(%s) : "
                     "\"memory\");",
                     addr.data);
    } else if (IS("arrive_tx") && in->imm == 2) {
        em_spmd_line(e,
                     "asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;\" :: "
                     "\"r\"(%s), \"r\"(%s) : \"memory\");",
                     addr.data, x.data);
    } else if (IS("arrive_cluster") && in->imm == 2) {
        em_spmd_line(e,
                     "asm volatile(\"{\\n.reg .b32 ra;\\nmapa.shared::cluster.u32 ra, %%0, %%1;\\n"
                     "mbarrier.arrive.shared::cluster.b64 _, [ra];\\n}\" :: "
                     "\"r\"(%s), \"r\"(%s) : \"memory\");",
                     addr.data, x.data);
    } else if (IS("copy_arrive")) {
        em_spmd_line(e,
                     "asm volatile(\"cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%%0];\" :: "
                     "\"r\"(%s) : \"memory\");",
                     addr.data);
    } else if ((IS("wait") || IS("try_wait")) && in->imm == 2) {
        char ok[32];
        em_spmd_fresh(e, "mbar_ok", ok);
        bool loop = IS("wait");
        em_spmd_line(e, "unsigned %s;", ok);
        em_spmd_line(
            e,
            "%sasm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 "
            "p, [%%1], %%2;\\nselp.u32 %%0, 1, 0, p;\\n}\" : \"=r\"(%s) : \"r\"(%s), "
            "\"r\"(%s) : \"memory\");",
            loop ? "do { " : "", ok, addr.data, x.data);
        if (loop) em_spmd_line(e, "} while (!%s);", ok);
        if (!loop && in->dst) {
            em_sb_printf(sb, "(%s != 0u)", ok);
            em_sb_free(&addr);
            em_sb_free(&x);
            return true;
        }
    } else {
        known = false;
    }
#undef IS
    em_sb_free(&addr);
    em_sb_free(&x);
    if (!known) em_spmd_fail(e, "unknown barrier intrinsic `%s`", in->str);
    em_sb_append(sb, "(void)0");
    return true;
}
