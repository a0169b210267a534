/* rules.c — the table of backward rules, indexed by em_tensor_op. It is filled once (thread-safe,
 * through pthread_once) by each family's ad_rules_<family> (rules_elementwise.c, rules_reduce.c,
 * rules_layout.c, rules_index.c, rules_conv.c); entries no family fills have no backward (the op's
 * inputs get no gradient). Also ad_sum_to, the reduction of a broadcast gradient to an input's
 * shape that the tape and the rules share. */
#include <pthread.h>
#include <stdio.h>

#include "autodiff/internal.h"

static ad_rule rule_table[EM_TOP_COUNT];
static pthread_once_t rule_once = PTHREAD_ONCE_INIT;

static void fill_table(void)
{
    ad_rules_elementwise(rule_table);
    ad_rules_reduce(rule_table);
    ad_rules_layout(rule_table);
    ad_rules_index(rule_table);
    ad_rules_conv(rule_table);
}

const ad_rule *ad_rule_for(em_tensor_op op)
{
    static const ad_rule none = {0};
    pthread_once(&rule_once, fill_table);
    if ((int)op <= EM_TOP_NONE || (int)op >= EM_TOP_COUNT) return &none;
    return &rule_table[op];
}

/* "[2, 3, 4]" into buf. */
static const char *shape_str(em_shape s, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

em_tensor *ad_sum_to(const em_tensor *g, em_shape shape)
{
    if (!g) return NULL;
    em_shape gs = em_shape_of(g);
    int lead = gs.rank - shape.rank;
    int dims[EM_MAX_RANK];
    int nd = 0;
    bool ok = lead >= 0;
    for (int i = 0; ok && i < gs.rank; i++) {
        if (i < lead) {
            dims[nd++] = i;
        } else if (shape.d[i - lead] != gs.d[i]) {
            ok = shape.d[i - lead] == 1;
            dims[nd++] = i;
        }
    }
    if (!ok) {
        char a[128], b[128];
        em_set_error(EM_ERR_INVALID, "gradient of shape %s does not sum to an input of shape %s",
                     shape_str(gs, a, sizeof a), shape_str(shape, b, sizeof b));
        return NULL;
    }
    if (nd == 0) return em_retain((em_tensor *)g);
    em_tensor *s = em_sum(g, dims, nd, true);
    if (!s) return NULL;
    em_tensor *r = em_reshape(s, shape);
    em_release(s);
    return r;
}
