/* print_internal.h — the IR printer's state, shared by print.c (text form) and ir_hash.c (which
 * hashes the canonical text form). */
#ifndef EM_KERNEL_PRINT_INTERNAL_H
#define EM_KERNEL_PRINT_INTERNAL_H
#include "base/base.h"
#include "ember/kernel.h"

typedef struct em_ir_printer {
    const em_ir_kernel *k; /* kernel printed */
    em_strbuf *sb;         /* output */
    bool canonical;        /* omit names, renumber ids by first appearance */
    uint32_t *vmap, *mmap; /* canonical: old id -> new id (0 = not seen yet) */
    size_t vcap, mcap;     /* entries in vmap / mmap */
    uint32_t next_v, next_m; /* canonical: last ids handed out */
} em_ir_printer;

bool em_ir_printer_init(em_ir_printer *p, const em_ir_kernel *k, em_strbuf *sb, bool canonical);
void em_ir_printer_free(em_ir_printer *p);
void em_ir_printer_kernel(em_ir_printer *p);
void em_ir_printer_inst(em_ir_printer *p, const em_ir_inst *in);
void em_ir_printer_val(em_ir_printer *p, em_ir_val id);

#endif
