/* ir_hash.c — the structural hash of a kernel: the 128-bit hash of its canonical text form (names
 * left out, ids renumbered by first appearance), so that kernels that generate the same code get
 * the same cache key whatever order their builder allocated ids in. */
#include <string.h>

#include "kernel/ir_internal.h"
#include "kernel/print_internal.h"

void em_ir_hash(const em_ir_kernel *k, char out[33])
{
    em_hasher h;
    em_hasher_init(&h);
    em_strbuf sb;
    em_sb_init(&sb);
    em_ir_printer p;
    if (k && em_ir_printer_init(&p, k, &sb, true)) {
        em_ir_printer_kernel(&p);
        em_ir_printer_free(&p);
    }
    em_hasher_str(&h, "ember-ir-1");
    em_hasher_bytes(&h, sb.data, sb.len);
    em_sb_free(&sb);
    em_hasher_hex(&h, out);
}
