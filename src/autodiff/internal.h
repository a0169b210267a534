/* internal.h — what the autodiff layer's files share: the context a backward rule sees, the rule
 * table (rules_*.c), and helpers every rule uses. The tape itself (nodes, the walk, saved tensors,
 * recomputation) is tape.c's and backward.c's business. */
#ifndef EM_AUTODIFF_INTERNAL_H
#define EM_AUTODIFF_INTERNAL_H

#include "base/base.h"
#include "ember/autodiff.h"
#include "ember/tensor_op.h"

/* What a backward rule sees. Saved tensors are detached views (no recording), present only when
 * the rule's table entry asks for them (NULL otherwise, and NULL for absent optional inputs). */
typedef struct ad_ctx {
    em_tensor_op op;
    const em_top_params *p;
    int nin;
    const em_tensor *in[EM_TOP_MAX_INPUTS]; /* saved inputs (see ad_rule.save_inputs) */
    const em_tensor *out;                  /* saved output (see ad_rule.save_output) */
    em_shape in_shape[EM_TOP_MAX_INPUTS];   /* always: each input's shape */
    em_scalar in_dtype[EM_TOP_MAX_INPUTS];  /* always: each input's dtype */
    bool in_present[EM_TOP_MAX_INPUTS];     /* always: false for absent optional inputs */
    bool needs[EM_TOP_MAX_INPUTS];          /* which inputs want a gradient */
    em_shape out_shape;                    /* always */
    em_scalar out_dtype;                   /* always */
    em_tensor **owned;                     /* the step's references to in[] (ad_take_input) */
    unsigned takeable;                     /* bit i: in[i] is held by nothing else (below) */
    struct ad_node *const *edge;           /* the input nodes (ad_take_grad) */
    em_tensor **gout;                      /* the step's reference to g (ad_take_out_grad) */
    struct ad_node *self;                  /* the node whose rule runs (ad_take_colsum) */
} ad_ctx;

/* Saved input i as a donated reference (em_take) the rule's op may write its result into, when
 * the rule asked for it (ad_rule_take_inputs), the graph is not retained and nothing else holds
 * that tensor: the tape let go of it before the rule ran. NULL otherwise (use c->in[i]). After a
 * take, c->in[i] must not be used. */
em_tensor *ad_take_input(const ad_ctx *c, int i);

/* g, the gradient of the rule's output, donated (em_take) to the one op that reads it last, so
 * that the op may write into g's buffer or move the pending matmul that makes g into its own
 * result (a GELU's backward into the input-gradient matmul's epilogue: docs/fusion.md); the step
 * then holds no reference to it. g itself (borrowed) where the step holds none. After a take, g
 * must not be used. */
em_tensor *ad_take_out_grad(const ad_ctx *c, const em_tensor *g);

/* The gradient input i has received so far from its other consumers, taken from its node (a new
 * reference; the node then holds none): a rule that takes it must return gin[i] with it added,
 * which lets a rule's op fold the accumulation into its own pass (the norms, em_norm_backward).
 * NULL when input i wants no gradient, is a leaf, has received none yet, or holds it in another
 * shape or dtype than the input's. */
em_tensor *ad_take_grad(const ad_ctx *c, int i);

/* Where input i's gradient is to be written (em_set_grad_into; borrowed): its leaf's destination
 * when the leaf wants a gradient, has none yet and the destination has the input's shape and
 * dtype. A rule whose op can write its result there returns that tensor itself as gin[i] (a new
 * reference), and the leaf then keeps it as its gradient. NULL otherwise. */
em_tensor *ad_grad_dest(const ad_ctx *c, int i);

/* A bias's gradient handed on: input i (a leaf with a destination, ad_grad_dest) gets g's sums
 * over its leading dims, and input `via` is the result of a matmul whose gradient g passes on
 * unchanged (an add's rule: y = x w + bias). Hands the sums to that matmul's node, whose rule may
 * take them into the product that makes its b operand's gradient from g (ad_take_colsum:
 * em_matmul_sum_b reads g once for both); otherwise they run right after that rule, or before
 * anything else adds to the leaf's gradient. true when handed: the caller returns the
 * destination as gin[i] (a new reference), unwritten yet. false (nothing done) when the pattern
 * does not hold or EMBER_MATMUL_BSUM=0. */
bool ad_defer_colsum(const ad_ctx *c, int i, int via, const em_tensor *g);

/* In a matmul's rule: the destination of column sums handed to this node (ad_defer_colsum) when
 * they are sums of g itself (the rule's gradient, the same tensor), which the rule then must
 * write (em_matmul_sum_b with a view of g as b); NULL otherwise (they run after the rule). */
em_tensor *ad_take_colsum(const ad_ctx *c, const em_tensor *g);

/* A backward rule: from g = d loss / d out (out's shape, out's dtype) computes d loss / d in[i]
 * for every i with c->needs[i], as a new reference in gin[i] (NULL = a zero gradient). A gradient
 * may have any shape that broadcasts to the input's shape and any float dtype: the tape sums it
 * over broadcast dims and casts it to the input's dtype. Runs with recording off. Returns EM_OK
 * or an error status with the message set (the tape releases whatever gin holds). */
typedef em_status (*ad_rule_fn)(const ad_ctx *c, const em_tensor *g, em_tensor **gin);

typedef struct ad_rule {
    ad_rule_fn backward;    /* NULL: the op is not differentiable (its inputs get no gradient) */
    unsigned save_inputs;   /* bit i: the rule reads c->in[i] */
    bool save_output;       /* the rule reads c->out */
} ad_rule;

/* Bit i: op's rule may take saved input i over (ad_take_input): cross-entropy's logits. */
unsigned ad_rule_take_inputs(em_tensor_op op);

/* The rule of an op (rules.c assembles the table from rules_*.c). Never NULL; .backward may be. */
const ad_rule *ad_rule_for(em_tensor_op op);

/* The rules of each family, filled by rules_<family>.c into the table (indexed by em_tensor_op). */
void ad_rules_elementwise(ad_rule *table);
void ad_rules_reduce(ad_rule *table);
void ad_rules_layout(ad_rule *table);
void ad_rules_index(ad_rule *table);
void ad_rules_conv(ad_rule *table);

/* Sums g over the dims along which `shape` was broadcast to g's shape and reshapes to `shape`.
 * A new reference (g retained when no reduction is needed), NULL on error. */
em_tensor *ad_sum_to(const em_tensor *g, em_shape shape);

#endif
