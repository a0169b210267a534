/* passes.h — helpers shared by the IR passes (simplify.c, fold.c). */
#ifndef EM_KERNEL_PASSES_H
#define EM_KERNEL_PASSES_H
#include "kernel/ir_internal.h"

/* When every operand of `in` is a constant and the operation can be evaluated at compile time,
 * writes the result's type and value and returns true. */
bool em_ir_fold_inst(const em_ir_kernel *k, const em_ir_inst *in, em_type *type, em_ir_const *out);

#endif
