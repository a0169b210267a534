/* record.c — the tensor layer's side of op recording (ember/tensor_op.h): the process-wide op
 * recorder, the per-tensor annotation slot, op names, and tn_record, which every differentiable op
 * calls after computing its result (while its inputs are still alive) so that autodiff can build
 * its tape. With no recorder installed, or no annotated input, recording costs a pointer test per
 * input. */
#include <stdatomic.h>

#include "tensor/internal.h"

static _Atomic(const em_op_recorder *) g_recorder;

void em_set_op_recorder(const em_op_recorder *r)
{
    atomic_store(&g_recorder, r);
}

void *em_tensor_annotation(const em_tensor *t)
{
    return t ? t->annotation : NULL;
}

void em_tensor_set_annotation(em_tensor *t, void *annotation)
{
    if (t) t->annotation = annotation;
}

const char *em_top_name(em_tensor_op op)
{
    static const char *const names[EM_TOP_COUNT] = {
        [EM_TOP_NONE] = "none",
        [EM_TOP_NEG] = "neg",
        [EM_TOP_ABS] = "abs",
        [EM_TOP_SIGN] = "sign",
        [EM_TOP_EXP] = "exp",
        [EM_TOP_LN] = "ln",
        [EM_TOP_LOG1P] = "log1p",
        [EM_TOP_EXPM1] = "expm1",
        [EM_TOP_SQRT] = "sqrt",
        [EM_TOP_RSQRT] = "rsqrt",
        [EM_TOP_RECIPROCAL] = "reciprocal",
        [EM_TOP_SIN] = "sin",
        [EM_TOP_COS] = "cos",
        [EM_TOP_TANH] = "tanh",
        [EM_TOP_ERF] = "erf",
        [EM_TOP_SIGMOID] = "sigmoid",
        [EM_TOP_RELU] = "relu",
        [EM_TOP_GELU] = "gelu",
        [EM_TOP_GELU_TANH] = "gelu_tanh",
        [EM_TOP_SILU] = "silu",
        [EM_TOP_SOFTPLUS] = "softplus",
        [EM_TOP_FLOOR] = "floor",
        [EM_TOP_CEIL] = "ceil",
        [EM_TOP_ROUND] = "round",
        [EM_TOP_CLAMP] = "clamp",
        [EM_TOP_POW_SCALAR] = "pow_scalar",
        [EM_TOP_ADD_SCALAR] = "add_scalar",
        [EM_TOP_MUL_SCALAR] = "mul_scalar",
        [EM_TOP_DIV_SCALAR] = "div_scalar",
        [EM_TOP_RSUB_SCALAR] = "rsub_scalar",
        [EM_TOP_RDIV_SCALAR] = "rdiv_scalar",
        [EM_TOP_MAXIMUM_SCALAR] = "maximum_scalar",
        [EM_TOP_MINIMUM_SCALAR] = "minimum_scalar",
        [EM_TOP_CAST] = "cast",
        [EM_TOP_ADD] = "add",
        [EM_TOP_SUB] = "sub",
        [EM_TOP_MUL] = "mul",
        [EM_TOP_DIV] = "div",
        [EM_TOP_POW] = "pow",
        [EM_TOP_MAXIMUM] = "maximum",
        [EM_TOP_MINIMUM] = "minimum",
        [EM_TOP_REMAINDER] = "remainder",
        [EM_TOP_WHERE] = "where",
        [EM_TOP_MASKED_FILL] = "masked_fill",
        [EM_TOP_SUM] = "sum",
        [EM_TOP_MEAN] = "mean",
        [EM_TOP_PROD] = "prod",
        [EM_TOP_MAX] = "max",
        [EM_TOP_MIN] = "min",
        [EM_TOP_LOGSUMEXP] = "logsumexp",
        [EM_TOP_VAR] = "var",
        [EM_TOP_STD] = "std",
        [EM_TOP_CUMSUM] = "cumsum",
        [EM_TOP_SOFTMAX] = "softmax",
        [EM_TOP_LOG_SOFTMAX] = "log_softmax",
        [EM_TOP_LAYER_NORM] = "layer_norm",
        [EM_TOP_RMS_NORM] = "rms_norm",
        [EM_TOP_RESHAPE] = "reshape",
        [EM_TOP_PERMUTE] = "permute",
        [EM_TOP_EXPAND] = "expand",
        [EM_TOP_SLICE] = "slice",
        [EM_TOP_SELECT] = "select",
        [EM_TOP_FLIP] = "flip",
        [EM_TOP_CAT] = "cat",
        [EM_TOP_TRIL] = "tril",
        [EM_TOP_TRIU] = "triu",
        [EM_TOP_PAD] = "pad",
        [EM_TOP_MATMUL] = "matmul",
        [EM_TOP_INDEX_SELECT] = "index_select",
        [EM_TOP_GATHER] = "gather",
        [EM_TOP_SCATTER] = "scatter",
        [EM_TOP_SCATTER_ADD] = "scatter_add",
        [EM_TOP_EMBEDDING] = "embedding",
        [EM_TOP_CONV2D] = "conv2d",
        [EM_TOP_MAX_POOL2D] = "max_pool2d",
        [EM_TOP_AVG_POOL2D] = "avg_pool2d",
        [EM_TOP_CROSS_ENTROPY] = "cross_entropy_rows",
        [EM_TOP_ATTENTION] = "attention",
        [EM_TOP_LINEAR_CROSS_ENTROPY] = "linear_cross_entropy",
        [EM_TOP_ATTENTION_QKV] = "attention_qkv",
    };
    if ((int)op < 0 || (int)op >= EM_TOP_COUNT || !names[op]) return "?";
    return names[op];
}

bool tn_recording(const em_tensor *const *in, int n)
{
    const em_op_recorder *r = atomic_load_explicit(&g_recorder, memory_order_acquire);
    if (!r) return false;
    for (int i = 0; i < n; i++)
        if (in[i] && in[i]->annotation) return !r->active || r->active();
    return false;
}

bool tn_record_keeps_input(em_tensor_op op, int i)
{
    const em_op_recorder *r = atomic_load_explicit(&g_recorder, memory_order_acquire);
    if (!r || (r->active && !r->active())) return false;
    return !r->keeps_input || r->keeps_input(op, i);
}

void tn_record(em_tensor_op op, const em_top_params *p, const em_tensor *const *in, int nin,
               em_tensor *out)
{
    if (!out || !em_scalar_is_float(out->dtype) || nin > EM_TOP_MAX_INPUTS) return;
    const em_op_recorder *r = atomic_load_explicit(&g_recorder, memory_order_acquire);
    if (!r || !r->record || !tn_recording(in, nin)) return;
    for (int i = 0; i < nin; i++)
        if (in[i] == out) return; /* an op that returned its input records nothing */
    static const em_top_params none;
    r->record(op, p ? p : &none, in, nin, out);
}

void tn_record1(em_tensor_op op, const em_tensor *in, em_tensor *out)
{
    tn_record(op, NULL, &in, 1, out);
}

em_top_params tn_params_k(int64_t k)
{
    em_top_params p = {{0}, {0}, 0, k, false};
    return p;
}

void tn_release_annotation(em_tensor *t)
{
    const em_op_recorder *r = atomic_load_explicit(&g_recorder, memory_order_acquire);
    void *a = t->annotation;
    t->annotation = NULL;
    if (r && r->release) r->release(t, a);
}

em_status tn_check_write(const em_tensor *t, const char *op)
{
    if (!t || !t->annotation) return EM_OK;
    const em_op_recorder *r = atomic_load_explicit(&g_recorder, memory_order_acquire);
    return r && r->check_write ? r->check_write(t, op) : EM_OK;
}
