/* grad_mode.c — per-thread recording state: the depth of nested no-grad regions (ops record
 * nothing while it is above zero; backward rules run inside one) and the recompute policy
 * (gradient checkpointing) applied to the ops recorded while it is set. */
#include "autodiff/tape.h"

static _Thread_local int g_no_grad;                /* open no-grad regions */
static _Thread_local em_recompute_policy g_policy; /* this thread's checkpointing policy */

void em_no_grad_begin(void)
{
    em_autodiff_init();
    g_no_grad++;
}

void em_no_grad_end(void)
{
    if (g_no_grad > 0) g_no_grad--;
}

bool em_grad_enabled(void)
{
    return g_no_grad == 0;
}

void em_set_recompute_policy(em_recompute_policy policy)
{
    em_autodiff_init();
    g_policy = policy == EM_RECOMPUTE_ELEMENTWISE ? EM_RECOMPUTE_ELEMENTWISE : EM_RECOMPUTE_NONE;
}

em_recompute_policy em_recompute_policy_get(void)
{
    return g_policy;
}
