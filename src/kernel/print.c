/* print.c — the stable text form of IR kernels (for golden tests, `ember kernel dump` and
 * verifier messages) and its canonical variant (no names, ids renumbered by first appearance),
 * which the structural hash absorbs. Never crashes on ill-formed kernels: bad ids print as %?N. */
#include <stdlib.h>
#include <string.h>

#include "kernel/ir_internal.h"
#include "kernel/print_internal.h"

static uint32_t renumber(uint32_t *map, uint32_t *next, size_t cap, uint32_t id)
{
    if (!map || id >= cap) return id;
    if (!map[id]) map[id] = ++*next;
    return map[id];
}

static void type_text(em_strbuf *sb, em_type t)
{
    const char *n = em_scalar_name((em_scalar)t.scalar);
    em_sb_append(sb, n ? n : "?type");
    if (t.lanes != 1) em_sb_printf(sb, "x%u", t.lanes);
}

static void const_text(em_strbuf *sb, const em_ir_value *v)
{
    em_scalar s = (em_scalar)v->type.scalar;
    if (s == EM_BOOL)
        em_sb_append(sb, v->c.i ? "true" : "false");
    else if (em_scalar_is_float(s))
        em_sb_printf(sb, "%.17g", v->c.f);
    else if (em_scalar_is_signed(s))
        em_sb_printf(sb, "%lld", (long long)v->c.i);
    else
        em_sb_printf(sb, "%llu", (unsigned long long)v->c.u);
    if (s != EM_BOOL || v->type.lanes != 1) type_text(sb, v->type);
}

void em_ir_printer_val(em_ir_printer *p, em_ir_val id)
{
    const em_ir_value *v = em_ir_value_at(p->k, id);
    if (!v) {
        em_sb_printf(p->sb, "%%?%u", id);
        return;
    }
    if (v->kind == EM_VAL_CONST) {
        const_text(p->sb, v);
        return;
    }
    em_sb_printf(p->sb, "%%%u", renumber(p->vmap, &p->next_v, p->vcap, id));
    if (!p->canonical && v->name) em_sb_printf(p->sb, ".%s", v->name);
}

static void mem_ref(em_ir_printer *p, em_ir_mem id)
{
    const em_ir_memory *m = em_ir_mem_at(p->k, id);
    if (!m) {
        em_sb_printf(p->sb, "@?%u", id);
        return;
    }
    em_sb_printf(p->sb, "@%u", renumber(p->mmap, &p->next_m, p->mcap, id));
    if (!p->canonical && m->name) em_sb_printf(p->sb, ".%s", m->name);
}

static const char *const space_names[] = {"global", "shared", "local"};
static const char *const access_names[] = {"?", "read", "write", "read_write"};

static void mem_decl(em_ir_printer *p, em_ir_mem id)
{
    const em_ir_memory *m = em_ir_mem_at(p->k, id);
    mem_ref(p, id);
    if (!m) return;
    em_sb_printf(p->sb, ": %s ", m->space < 3 ? space_names[m->space] : "?space");
    type_text(p->sb, m->elem);
    if (m->space == EM_MEM_GLOBAL)
        em_sb_printf(p->sb, " rank %u %s", m->rank, m->access < 4 ? access_names[m->access] : "?");
    else
        em_sb_printf(p->sb, "[%u]", m->length);
}

static void val_decl(em_ir_printer *p, em_ir_val id)
{
    const em_ir_value *v = em_ir_value_at(p->k, id);
    em_ir_printer_val(p, id);
    if (!v) return;
    em_sb_append(p->sb, ": ");
    if (v->kind == EM_VAL_MATRIX) {
        static const char *const roles[] = {"A", "B", "ACC"};
        em_sb_printf(p->sb, "matrix %s ", v->mat_role < 3 ? roles[v->mat_role] : "?");
        type_text(p->sb, v->type);
        em_sb_printf(p->sb, " %ux%ux%u %s", v->mat_m, v->mat_n, v->mat_k,
                     v->mat_layout ? "col" : "row");
    } else {
        type_text(p->sb, v->type);
    }
}

static void args_list(em_ir_printer *p, const em_ir_inst *in, unsigned from, unsigned n)
{
    for (unsigned i = from; i < n && i < EM_IR_MAX_ARGS; i++) {
        em_sb_append(p->sb, i > from ? ", " : " ");
        em_ir_printer_val(p, in->args[i]);
    }
}

/* Writes one instruction without its child blocks (control flow ends with " {" when it has). */
void em_ir_printer_inst(em_ir_printer *p, const em_ir_inst *in)
{
    const em_op_info *info = em_ir_op_info(in->op);
    if (!info) {
        em_sb_printf(p->sb, "?op%u", in->op);
        return;
    }
    if (in->dst) {
        if (in->op == EM_OP_ASSIGN) {
            em_ir_printer_val(p, in->dst);
            em_sb_append(p->sb, " = ");
            em_ir_printer_val(p, in->args[0]);
            return;
        }
        val_decl(p, in->dst);
        em_sb_append(p->sb, " = ");
    }
    em_sb_append(p->sb, info->name);
    switch ((em_op_class)info->cls) {
    case EM_OPC_CONVERT:
        em_sb_append(p->sb, " ");
        em_ir_printer_val(p, in->args[0]);
        break;
    case EM_OPC_MEMORY:
        em_sb_append(p->sb, " ");
        mem_ref(p, in->mem);
        em_sb_append(p->sb, "[");
        em_ir_printer_val(p, in->args[0]);
        em_sb_append(p->sb, "]");
        if (in->op == EM_OP_COPY_ASYNC) { /* copy_async @dst[i] <- @src[j] x count [if cond] */
            em_sb_append(p->sb, " <- ");
            mem_ref(p, (em_ir_mem)in->imm);
            em_sb_append(p->sb, "[");
            em_ir_printer_val(p, in->args[1]);
            em_sb_append(p->sb, "] x ");
            em_ir_printer_val(p, in->args[2]);
            if (in->args[3]) {
                em_sb_append(p->sb, " if ");
                em_ir_printer_val(p, in->args[3]);
            }
        }
        if (in->op == EM_OP_STORE) {
            em_sb_append(p->sb, ", ");
            em_ir_printer_val(p, in->args[1]);
        }
        break;
    case EM_OPC_META:
        em_sb_append(p->sb, " ");
        mem_ref(p, in->mem);
        if (in->op != EM_OP_LEN) em_sb_printf(p->sb, ", %d", in->imm);
        break;
    case EM_OPC_BUILTIN: {
        const char *b = em_builtin_name((em_builtin)in->imm);
        if (b)
            em_sb_printf(p->sb, " %s", b);
        else
            em_sb_printf(p->sb, " ?builtin%d", in->imm);
        break;
    }
    case EM_OPC_SYNC:
        if (in->op == EM_OP_FENCE) em_sb_append(p->sb, in->imm ? " device" : " cube");
        if (in->op == EM_OP_COPY_WAIT) em_sb_printf(p->sb, " %d", in->imm);
        break;
    case EM_OPC_ATOMIC:
        em_sb_append(p->sb, " ");
        mem_ref(p, in->mem);
        em_sb_append(p->sb, "[");
        em_ir_printer_val(p, in->args[0]);
        em_sb_append(p->sb, "]");
        if (info->nargs > 1) {
            em_sb_append(p->sb, ",");
            args_list(p, in, 1, info->nargs);
        }
        break;
    case EM_OPC_MATRIX:
        if (in->op == EM_OP_MAT_LOAD || in->op == EM_OP_MAT_STORE) {
            em_sb_append(p->sb, " ");
            if (in->op == EM_OP_MAT_LOAD) {
                em_ir_printer_val(p, in->args[0]);
                em_sb_append(p->sb, ", ");
            }
            mem_ref(p, in->mem);
            unsigned off = in->op == EM_OP_MAT_LOAD ? 1 : 0;
            em_sb_append(p->sb, "[");
            em_ir_printer_val(p, in->args[off]);
            em_sb_append(p->sb, "] stride ");
            em_ir_printer_val(p, in->args[off + 1]);
            if (in->op == EM_OP_MAT_STORE) {
                em_sb_append(p->sb, ", ");
                em_ir_printer_val(p, in->args[2]);
            }
            em_sb_append(p->sb, in->imm ? " col" : " row");
        } else {
            args_list(p, in, 0, info->nargs);
        }
        break;
    case EM_OPC_CONTROL:
        if (in->op == EM_OP_IF) {
            em_sb_append(p->sb, " ");
            em_ir_printer_val(p, in->args[0]);
            em_sb_append(p->sb, " {");
        } else if (in->op == EM_OP_RANGE) {
            em_sb_append(p->sb, " ");
            em_ir_printer_val(p, in->args[0]);
            em_sb_append(p->sb, " = ");
            em_ir_printer_val(p, in->args[1]);
            em_sb_append(p->sb, " .. ");
            em_ir_printer_val(p, in->args[2]);
            em_sb_append(p->sb, " step ");
            em_ir_printer_val(p, in->args[3]);
            em_sb_append(p->sb, in->imm ? " unroll {" : " {");
        } else if (in->op == EM_OP_LOOP) {
            em_sb_append(p->sb, " {");
        }
        break;
    case EM_OPC_DEBUG: {
        em_sb_append(p->sb, " \"");
        for (const char *s = in->str ? in->str : ""; *s; s++) {
            if (*s == '"' || *s == '\\') em_sb_appendc(p->sb, '\\');
            if (*s == '\n')
                em_sb_append(p->sb, "\\n");
            else
                em_sb_appendc(p->sb, *s);
        }
        em_sb_append(p->sb, "\"");
        unsigned n = in->imm > 0 && in->imm <= EM_IR_MAX_ARGS ? (unsigned)in->imm : 0;
        if (n) {
            em_sb_append(p->sb, ",");
            args_list(p, in, 0, n);
        }
        break;
    }
    default:
        args_list(p, in, 0, info->nargs);
        break;
    }
}

static void print_block(em_ir_printer *p, uint32_t b, int depth)
{
    const em_ir_block *blk = em_ir_block_at(p->k, b);
    if (!blk) return;
    if (depth > EM_IR_MAX_DEPTH + 2) {
        em_sb_indent(p->sb, depth);
        em_sb_append(p->sb, "...\n");
        return;
    }
    for (size_t i = 0; i < blk->len; i++) {
        const em_ir_inst *in = em_ir_inst_at(p->k, blk->items[i]);
        em_sb_indent(p->sb, depth);
        if (!in) {
            em_sb_printf(p->sb, "?inst%u\n", blk->items[i]);
            continue;
        }
        em_ir_printer_inst(p, in);
        em_sb_append(p->sb, "\n");
        if (in->op == EM_OP_IF || in->op == EM_OP_RANGE || in->op == EM_OP_LOOP) {
            print_block(p, in->blocks[0], depth + 1);
            if (in->op == EM_OP_IF && in->blocks[1]) {
                em_sb_indent(p->sb, depth);
                em_sb_append(p->sb, "} else {\n");
                print_block(p, in->blocks[1], depth + 1);
            }
            em_sb_indent(p->sb, depth);
            em_sb_append(p->sb, "}\n");
        }
    }
}

bool em_ir_printer_init(em_ir_printer *p, const em_ir_kernel *k, em_strbuf *sb, bool canonical)
{
    memset(p, 0, sizeof(*p));
    p->k = k;
    p->sb = sb;
    p->canonical = canonical;
    if (canonical) {
        p->vcap = em_ir_value_count(k) + 1;
        p->mcap = em_ir_mem_count(k) + 1;
        p->vmap = calloc(p->vcap, sizeof(uint32_t));
        p->mmap = calloc(p->mcap, sizeof(uint32_t));
        if (!p->vmap || !p->mmap) {
            em_ir_printer_free(p);
            em_set_error(EM_ERR_NOMEM, "out of memory printing kernel");
            return false;
        }
    }
    return true;
}

void em_ir_printer_free(em_ir_printer *p)
{
    free(p->vmap);
    free(p->mmap);
    p->vmap = p->mmap = NULL;
}

void em_ir_printer_kernel(em_ir_printer *p)
{
    const em_ir_kernel *k = p->k;
    em_sb_printf(p->sb, "kernel %s(", k->name);
    for (size_t i = 0; i < k->params.len; i++) {
        const em_ir_param *prm = &k->params.items[i];
        if (i) em_sb_append(p->sb, ", ");
        if (prm->kind == EM_PARAM_BUFFER)
            mem_decl(p, prm->id);
        else
            val_decl(p, prm->id);
    }
    em_sb_append(p->sb, ")");
    if (k->cube_dim[0] || k->cube_dim[1] || k->cube_dim[2])
        em_sb_printf(p->sb, " cube_dim(%u, %u, %u)", k->cube_dim[0], k->cube_dim[1], k->cube_dim[2]);
    if (k->cluster_dim > 1) em_sb_printf(p->sb, " cluster_dim(%u)", k->cluster_dim);
    em_sb_append(p->sb, " {\n");
    for (size_t m = 1; m < k->mems.len; m++) {
        if (k->mems.items[m].space == EM_MEM_GLOBAL) continue;
        em_sb_indent(p->sb, 1);
        mem_decl(p, (em_ir_mem)m);
        em_sb_append(p->sb, "\n");
    }
    for (size_t v = 1; v < k->values.len; v++) {
        uint8_t kind = k->values.items[v].kind;
        if (kind != EM_VAL_VAR && kind != EM_VAL_MATRIX) continue;
        em_sb_indent(p->sb, 1);
        em_sb_append(p->sb, "var ");
        val_decl(p, (em_ir_val)v);
        em_sb_append(p->sb, "\n");
    }
    print_block(p, 1, 1);
    em_sb_append(p->sb, "}\n");
}

char *em_ir_print_kernel(const em_ir_kernel *k)
{
    if (!k) {
        em_set_error(EM_ERR_INVALID, "em_ir_print_kernel: no kernel");
        return NULL;
    }
    em_strbuf sb;
    em_sb_init(&sb);
    em_ir_printer p;
    em_ir_printer_init(&p, k, &sb, false);
    em_ir_printer_kernel(&p);
    em_ir_printer_free(&p);
    return em_sb_take(&sb);
}

char *em_ir_print_inst(const em_ir_kernel *k, uint32_t inst)
{
    const em_ir_inst *in = em_ir_inst_at(k, inst);
    em_strbuf sb;
    em_sb_init(&sb);
    if (!in) {
        em_sb_printf(&sb, "?inst%u", inst);
    } else {
        em_ir_printer p;
        em_ir_printer_init(&p, k, &sb, false);
        em_ir_printer_inst(&p, in);
        em_ir_printer_free(&p);
    }
    return em_sb_take(&sb);
}
