/* fusion_reduce.c — a pending elementwise tree fused into the loads of a reduction kernel (the
 * prologue of issue #12; docs/fusion.md, "Reductions with a prologue").
 *
 * A row-wise kernel (softmax, log_softmax, layer/RMS norm, sums over the last dims:
 * src/kernels/tensor_rowwise.ek) whose input is a whole contiguous view of a pending storage does
 * not realize it: it runs a variant of itself that computes each input line from the tree's
 * leaves where it would have loaded it. The variant is the built-in kernel's own text,
 * instantiated by two substitutions, so the reduction is written once:
 *   - its input parameter `const tensor(line(T)) x, ` becomes `comptime u32 R = 1, ` followed by
 *     the tree's leaves (`const tensor(line(L), R) fx<i>, u32 fx<i>_off, `) and scalars
 *     (`C fs<j>, `; generated names start with f, which the built-in kernels do not use);
 *   - each call `tr_load(<dst>, x, ` becomes `fu_load(<dst>, R, <leaves>, <scalars>, `, a
 *     generated helper with tr_load's contract (line u of dst is line first + u * step of the
 *     row starting at line `at`, or pad past nlive) that evaluates the tree at that line.
 * The kernel's text must hold the parameter exactly once and use x only in such calls (a kernel
 * that does not fails to compile, reported at the call; tests/tensor/test_fusion_reduce.c runs
 * every kernel that takes a prologue). The pending storage itself stays pending (the tree is recomputed, as when inlined
 * into an elementwise consumer), so it runs only if something else reads it. Generated modules
 * are cached by kernel and tree signature, under the fusion lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion_internal.h"

static em_map g_cache; /* "kernel|signature" -> fu_kernel-like entry (guarded by fu_lock) */
static int g_nkernels;

typedef struct pro_kernel {
    em_lang_module *m;
    int id;
    char name[64]; /* "fused_<kernel>" */
} pro_kernel;

static atomic_bool g_force_cpu; /* fu_prologue_force_cpu */

void fu_prologue_force_cpu(bool on) { atomic_store(&g_force_cpu, on); }

static const char X_PARAM[] = "const tensor(line(T)) x, ";
static const char X_CALL[] = ", x, ";

bool fu_prologue_begin(const em_tensor *t, int passes, int scalars, fu_prologue *pr)
{
    memset(pr, 0, sizeof *pr);
    if (!t || !fu_enabled()) return false;
    pthread_mutex_lock(&fu_lock);
    fu_node *nd = t->st->pending;
    bool ok = nd && !nd->mm && nd->nleaves >= 1 && t->dtype == nd->dtype && t->offset == 0 && em_is_contiguous(t) &&
              tn_numel(t->rank, t->shape) == tn_numel(nd->rank, nd->shape) &&
              nd->nleaves + nd->nparams + scalars <= FU_MAX_SCALARS;
    /* on the CPU, whose kernels are bound by arithmetic (and whose row kernels walk a row once
     * per pass), recomputing a tree in the loads costs more than reading it back from the cache:
     * only single ops (a cast) are computed there, unless a test forces every tree; and never a
     * transcendental op that several passes would compute again */
    const em_caps *c = em_device_caps(t->st->dev);
    bool cpu = c && !strcmp(c->target, "c");
    if (ok && cpu && !atomic_load(&g_force_cpu) && nd->ncompute > 1) ok = false;
    if (ok && cpu && passes > 1 && fu_node_transcendental(nd)) ok = false;
    if (!ok) {
        pthread_mutex_unlock(&fu_lock);
        return false;
    }
    int n = nd->nleaves + 1;
    int64_t strides[FU_WALK_MAX][EM_MAX_RANK], offs[FU_WALK_MAX];
    em_scalar dts[FU_WALK_MAX];
    for (int i = 0; i < nd->nleaves; i++) {
        memcpy(strides[i], nd->leaves[i].stride, sizeof strides[i]);
        offs[i] = nd->leaves[i].offset;
        dts[i] = nd->leaves[i].dtype;
    }
    tn_contig_strides(nd->rank, nd->shape, strides[n - 1]);
    offs[n - 1] = 0;
    dts[n - 1] = nd->dtype;
    fu_walk_build(&pr->w, nd->rank, nd->shape, n, strides);
    pr->max_lw = fu_walk_width(&pr->w, t->st->dev, dts, n, offs);
    pr->nd = nd;
    return true;
}

void fu_prologue_end(fu_prologue *pr)
{
    if (pr->nd) pthread_mutex_unlock(&fu_lock);
    pr->nd = NULL;
}

/* The leaves' and scalars' declarations (decl) or names (call), each followed by ", ". */
static void leaf_list(const fu_node *nd, em_strbuf *sb, bool decl, bool ranked)
{
    for (int i = 0; i < nd->nleaves; i++) {
        if (decl)
            em_sb_printf(sb, "const tensor(line(%s)%s) fx%d, u32 fx%d_off, ", em_scalar_name(nd->leaves[i].dtype),
                         ranked ? ", R" : "", i, i);
        else
            em_sb_printf(sb, "fx%d, fx%d_off, ", i, i);
    }
    for (int j = 0; j < nd->nops; j++) {
        const fu_op *o = &nd->ops[j];
        for (int i = 0; i < o->np; i++) {
            if (decl) em_sb_printf(sb, "%s fs%d, ", em_scalar_name(o->C), o->p + i);
            else em_sb_printf(sb, "fs%d, ", o->p + i);
        }
    }
}

/* fu_load: tr_load's contract, the tree evaluated at each line. */
static void gen_load(const fu_node *nd, em_strbuf *sb)
{
    em_sb_append(sb, "/* generated by src/tensor/fusion_reduce.c */\n"
                     "inline<C: float> void fu_load(array(line(C)) t, comptime u32 R, ");
    leaf_list(nd, sb, true, false);
    em_sb_append(sb, "u32 at, u32 first, u32 step, u32 nlive, C pad, comptime u32 N)\n{\n"
                     "    comptime for (u32 u in range(N)) {\n"
                     "        u32 li = first + u * step;\n"
                     "        t[u] = line(C)(pad);\n"
                     "        if (li < nlive) {\n");
    fu_gen_index(nd, sb, "(at + li) * LINE_WIDTH", "fx0", "            ");
    fu_gen_ops(nd, sb, "            ");
    em_sb_printf(sb, "            t[u] = line(C)(fv%d);\n        }\n    }\n}\n\n", nd->nops - 1);
}

/* The text of `kernel` in src, from "kernel" to its closing brace; false when not found. */
static bool kernel_text(const char *src, const char *kernel, const char **start, const char **end)
{
    char pat[96];
    snprintf(pat, sizeof pat, " void %s(", kernel);
    const char *p = strstr(src, pat);
    if (!p) return false;
    const char *k = p;
    while (k > src && strncmp(k, "kernel", 6) != 0) k--;
    const char *b = strchr(p, '{');
    if (!b || strncmp(k, "kernel", 6) != 0) return false;
    int depth = 0;
    for (const char *q = b; *q; q++) {
        if (*q == '{') depth++;
        if (*q == '}' && --depth == 0) {
            *start = k;
            *end = q + 1;
            return true;
        }
    }
    return false;
}

/* Appends kernel `kernel` of src instantiated as fused_<kernel> (the file comment says how);
 * false when its text does not have the expected shape. */
static bool instantiate(const fu_node *nd, const char *src, const char *kernel, em_strbuf *sb)
{
    const char *s, *e;
    if (!kernel_text(src, kernel, &s, &e)) return false;
    char name[96];
    snprintf(name, sizeof name, " void %s(", kernel);
    const char *nm = strstr(s, name);
    const char *xp = strstr(s, X_PARAM);
    const char *again = xp ? strstr(xp + 1, X_PARAM) : NULL;
    if (!nm || !xp || xp > e || (again && again < e)) return false;
    em_sb_appendn(sb, s, (size_t)(nm - s));
    em_sb_printf(sb, " void fused_%s(", kernel);
    const char *q = nm + strlen(name);
    em_sb_appendn(sb, q, (size_t)(xp - q));
    em_sb_append(sb, "comptime u32 R = 1, ");
    leaf_list(nd, sb, true, true);
    q = xp + strlen(X_PARAM);
    int calls = 0;
    for (;;) {
        const char *c = strstr(q, "tr_load(");
        if (!c || c >= e) break;
        const char *x = strstr(c, X_CALL);
        const char *close = strchr(c, ')');
        if (!x || !close || x > close) return false;
        em_sb_appendn(sb, q, (size_t)(c - q));
        em_sb_append(sb, "fu_load(");
        const char *arg0 = c + strlen("tr_load(");
        em_sb_appendn(sb, arg0, (size_t)(x - arg0));
        em_sb_append(sb, ", R, ");
        leaf_list(nd, sb, false, false);
        q = x + strlen(X_CALL);
        calls++;
    }
    em_sb_appendn(sb, q, (size_t)(e - q));
    em_sb_append(sb, "\n");
    return calls > 0;
}

/* The cached module of kernel `kernel` (in src/kernels/<file>.ek) fused with nd's tree. */
static pro_kernel *module_for(const fu_node *nd, const char *file, const char *kernel)
{
    em_strbuf key;
    em_sb_init(&key);
    em_sb_printf(&key, "%s|", kernel);
    fu_signature(nd, &key);
    pro_kernel *k = key.oom ? NULL : em_map_gets(&g_cache, key.data);
    if (k || key.oom) {
        if (!k) em_set_error(EM_ERR_NOMEM, "out of host memory");
        em_sb_free(&key);
        return k;
    }
    const char *base = fu_builtin_source(file);
    em_strbuf src;
    em_sb_init(&src);
    if (!base) {
        em_set_error(EM_ERR_INTERNAL, "the kernels of %s are missing", file);
    } else {
        gen_load(nd, &src);
        if (!instantiate(nd, base, kernel, &src))
            em_set_error(EM_ERR_INTERNAL, "%s.ek: kernel %s cannot take a fused prologue", file, kernel);
        else if (src.oom)
            em_set_error(EM_ERR_NOMEM, "out of host memory");
        else {
            /* the instantiated kernel calls helpers of any built-in file: load them all */
            size_t nb = fu_builtin_count();
            const char **names = calloc(nb + 1, sizeof *names), **srcs = calloc(nb + 1, sizeof *srcs);
            em_lang_module *m = NULL;
            if (names && srcs) {
                for (size_t i = 0; i < nb; i++) fu_builtin_at(i, &names[i], &srcs[i]);
                names[nb] = "fused_prologue.ek";
                srcs[nb] = src.data;
                m = em_lang_module_from_strings(names, srcs, nb + 1, NULL);
            } else {
                em_set_error(EM_ERR_NOMEM, "out of host memory");
            }
            free(names);
            free(srcs);
            k = m ? calloc(1, sizeof *k) : NULL;
            if (k) {
                k->m = m;
                k->id = ++g_nkernels;
                snprintf(k->name, sizeof k->name, "fused_%s", kernel);
                if (!em_map_puts(&g_cache, key.data, k)) {
                    free(k);
                    k = NULL;
                }
            }
            if (!k) em_lang_module_free(m);
            if (k) fu_count_compile();
            if (k && fu_debug_on())
                fprintf(stderr, "ember fusion: prologue kernel #%d generated:\n%s", k->id, src.data);
        }
    }
    em_sb_free(&src);
    em_sb_free(&key);
    return k;
}

em_status fu_prologue_launch(fu_prologue *pr, const char *file, const char *kernel, const em_lang_spec *spec,
                             const uint32_t cubes[3], const uint32_t units[3], const em_arg *rest, size_t nrest,
                             uint64_t read, uint64_t written)
{
    fu_node *nd = pr->nd;
    unsigned lw = spec->line_width ? spec->line_width : 1;
    if (pr->max_lw % lw != 0) {
        em_set_error(EM_ERR_INTERNAL, "%s: line width %u does not divide the fused input's %u", kernel, lw,
                     pr->max_lw);
        return EM_ERR_INTERNAL;
    }
    pro_kernel *k = module_for(nd, file, kernel);
    if (!k) return em_last_status();
    em_arg args[2 * FU_MAX_LEAVES + FU_MAX_PARAMS + 24];
    if (nrest > 24) return em_set_error(EM_ERR_INTERNAL, "%s: too many arguments", kernel);
    size_t na = 0;
    for (int i = 0; i < nd->nleaves; i++) {
        fu_leaf *l = &nd->leaves[i];
        if (fu_ensure_buffer(l->st) != EM_OK) return em_last_status();
        args[na++] = fu_operand_arg(l->st, l->dtype, lw, &pr->w, i);
        args[na++] = em_arg_u32((uint32_t)l->offset);
        read += tn_view_bytes(l->dtype, nd->rank, nd->shape, l->stride);
    }
    for (int i = 0; i < nd->nparams; i++) args[na++] = nd->params[i];
    memcpy(args + na, rest, nrest * sizeof *rest);
    na += nrest;
    em_lang_bind binds[16];
    if (spec->nbinds >= EM_ARRAY_LEN(binds)) return em_set_error(EM_ERR_INTERNAL, "%s: too many bindings", kernel);
    memcpy(binds, spec->binds, spec->nbinds * sizeof *binds);
    binds[spec->nbinds] = em_lang_bind_int("R", pr->w.rank);
    em_lang_spec sp = {binds, spec->nbinds + 1, lw, spec->caps};
    if (fu_debug_on()) {
        em_strbuf sb;
        em_sb_init(&sb);
        fu_op_list(nd, &sb);
        char d[128];
        tn_describe_shape(nd->dtype, nd->rank, nd->shape, d, sizeof d);
        fprintf(stderr, "ember fusion: prologue kernel #%d: %s reading %d ops (%s) over %s, %d inputs, line width %u\n",
                k->id, kernel, nd->ncompute, sb.data, d, nd->nleaves, lw);
        em_sb_free(&sb);
    }
    em_status st = em_lang_launch(nd->st->dev, k->m, k->name, &sp, cubes, units, args, na);
    if (st == EM_OK) {
        fu_count_launch(k->name, read, written);
        fu_count_fused(nd->ncompute + 1);
        nd->inlined++;
    } else {
        em_strbuf sb;
        em_sb_init(&sb);
        fu_op_list(nd, &sb);
        em_error_context("%s fused with %s (EMBER_FUSION=0 runs the ops one by one)", kernel, sb.data);
        em_sb_free(&sb);
    }
    return st;
}
