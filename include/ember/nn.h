/* ember/nn.h — neural-network modules, initializers and losses, built from tensor ops (so they
 * run on every device and autodiff differentiates them).
 *
 * A module owns a tree of named tensors: parameters (trained; they require gradients) and buffers
 * (state that is saved but not trained). Full names join the path with dots, as PyTorch and
 * Hugging Face do: "h.0.attn.c_attn.weight". Optimizers visit the parameters, records save and
 * load the tree by name. Each concrete module is a struct whose first member is em_module, made by
 * its _new function on a device and freed by em_module_free (which frees the children too).
 * Forward functions return a new tensor reference (or NULL with the error set) and borrow their
 * inputs, like tensor ops. */
#ifndef EMBER_NN_H
#define EMBER_NN_H

#include "ember/autodiff.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the module tree ------------------------------------------------------------------------- */

typedef struct em_module em_module;

typedef struct em_module_entry {
    char *name;       /* local name ("weight") */
    em_tensor *t;     /* owned reference */
    bool is_param;    /* parameter (requires grad) or buffer */
    bool decay;       /* weight decay applies (false for biases, norms and embeddings' choice) */
} em_module_entry;

struct em_module {
    const char *kind;             /* "Linear", "LayerNorm", ... (static string) */
    em_device *dev;               /* where its tensors live */
    em_module_entry *entries;     /* own parameters and buffers, in insertion order */
    int nentries, cap_entries;
    em_module **children;         /* owned submodules, in insertion order */
    char **child_names;
    int nchildren, cap_children;
    bool training;                /* train (dropout active) or eval mode */
    void (*destroy)(em_module *m);/* frees the concrete module's own extra state, or NULL */
};

/* A zeroed module of `size` bytes (the concrete struct, em_module first). NULL on no memory. */
em_module *em_module_new(const char *kind, em_device *dev, size_t size);
/* Frees m, its tensors and its children (NULL is ignored). */
void em_module_free(em_module *m);
/* Adds a child under `name` (m takes ownership, also on error). Returns child or NULL. */
em_module *em_module_add(em_module *m, const char *name, em_module *child);
/* Adds a parameter (marked requires-grad) or a buffer; m takes the reference t. Returns t. */
em_tensor *em_module_param(em_module *m, const char *name, em_tensor *t, bool decay);
em_tensor *em_module_buffer(em_module *m, const char *name, em_tensor *t);

/* Calls fn for every parameter and buffer of the tree, depth first in insertion order, with its
 * full name; stops when fn returns false. */
typedef bool (*em_module_visit_fn)(const char *full_name, em_module_entry *e, void *user);
void em_module_visit(em_module *m, em_module_visit_fn fn, void *user);
/* The entry with that full name, or NULL. */
em_module_entry *em_module_find(em_module *m, const char *full_name);
/* Number of parameter elements (buffers not counted). */
int64_t em_module_num_params(em_module *m);
/* Train / eval mode for the whole tree. */
void em_module_train(em_module *m, bool training);
/* Drops the gradients of every parameter. */
void em_module_zero_grad(em_module *m);

/* ---- initializers (in place, no gradient recorded) ------------------------------------------ */

em_status em_init_normal(em_tensor *t, double mean, double std, em_rng *rng);
em_status em_init_uniform(em_tensor *t, double lo, double hi, em_rng *rng);
em_status em_init_constant(em_tensor *t, double value);
/* fan_in / fan_out as PyTorch computes them (dims 1 and 0 times the receptive field). */
em_status em_init_xavier_uniform(em_tensor *t, double gain, em_rng *rng);
em_status em_init_xavier_normal(em_tensor *t, double gain, em_rng *rng);
/* mode_fan_in: true for fan_in; gain sqrt(2) for ReLU as PyTorch's default nonlinearity. */
em_status em_init_kaiming_uniform(em_tensor *t, bool mode_fan_in, em_rng *rng);
em_status em_init_kaiming_normal(em_tensor *t, bool mode_fan_in, em_rng *rng);
/* GPT-2's residual projections: normal(0, 0.02 / sqrt(2 * n_layer)). */
em_status em_init_gpt2_residual(em_tensor *t, int n_layer, em_rng *rng);

/* ---- layers ---------------------------------------------------------------------------------- */

/* y = x W^T + b with weight [out, in] (PyTorch's Linear), or y = x W + b with weight [in, out]
 * when weight_in_out (Hugging Face GPT-2's Conv1D layout, so its checkpoints load as they are).
 * Weight init: Kaiming-uniform as PyTorch's Linear, bias uniform(+-1/sqrt(in)). */
typedef struct em_linear {
    em_module base;
    em_tensor *weight, *bias; /* borrowed from base.entries; bias NULL when absent */
    int64_t in, out;
    bool weight_in_out;
} em_linear;
em_linear *em_linear_new(em_device *dev, em_scalar dtype, int64_t in, int64_t out, bool bias,
                         bool weight_in_out, em_rng *rng);
em_tensor *em_linear_forward(em_linear *l, const em_tensor *x);

/* weight [num, dim] ~ normal(0, 1) (PyTorch's default). ids: i32/i64 of any shape. */
typedef struct em_embedding_mod {
    em_module base;
    em_tensor *weight;
    int64_t num, dim;
} em_embedding_mod;
em_embedding_mod *em_embedding_new(em_device *dev, em_scalar dtype, int64_t num, int64_t dim,
                                   em_rng *rng);
em_tensor *em_embedding_forward(em_embedding_mod *e, const em_tensor *ids);

/* Over the last dim; weight ones, bias zeros ("weight"/"bias"); affine false: no parameters. */
typedef struct em_layer_norm_mod {
    em_module base;
    em_tensor *weight, *bias;
    int64_t dim;
    double eps;
} em_layer_norm_mod;
em_layer_norm_mod *em_layer_norm_new(em_device *dev, em_scalar dtype, int64_t dim, double eps,
                                     bool affine, bool bias);
em_tensor *em_layer_norm_forward(em_layer_norm_mod *n, const em_tensor *x);

typedef struct em_rms_norm_mod {
    em_module base;
    em_tensor *weight;
    int64_t dim;
    double eps;
} em_rms_norm_mod;
em_rms_norm_mod *em_rms_norm_new(em_device *dev, em_scalar dtype, int64_t dim, double eps);
em_tensor *em_rms_norm_forward(em_rms_norm_mod *n, const em_tensor *x);

/* Inverted dropout: in training mode zeroes each element with probability p and scales the rest
 * by 1 / (1 - p), drawing from rng; the identity in eval mode or when p == 0. */
em_tensor *em_dropout(const em_tensor *x, double p, bool training, em_rng *rng);

typedef enum em_activation {
    EM_ACT_NONE = 0, EM_ACT_RELU, EM_ACT_GELU, EM_ACT_GELU_TANH, EM_ACT_SILU, EM_ACT_TANH,
    EM_ACT_SIGMOID
} em_activation;
em_tensor *em_activate(const em_tensor *x, em_activation act);
/* "relu", "gelu", "gelu_tanh" (also "gelu_new", Hugging Face's name), "silu", ...; EM_ACT_NONE
 * with the error set for an unknown name. */
em_activation em_activation_parse(const char *name);

/* A key/value cache for incremental decoding: k and v [B, H, max_len, D], len positions filled. */
typedef struct em_kv_cache {
    em_tensor *k, *v;
    int64_t len, max_len;
} em_kv_cache;
em_kv_cache *em_kv_cache_new(em_device *dev, em_scalar dtype, int64_t batch, int64_t heads,
                             int64_t max_len, int64_t head_dim);
void em_kv_cache_free(em_kv_cache *c);
void em_kv_cache_reset(em_kv_cache *c);

/* Multi-head self-attention in GPT-2's layout: children "c_attn" (dim -> 3 dim, q|k|v) and
 * "c_proj" (dim -> dim). x [B, T, dim] -> [B, T, dim]. causal applies the causal mask; pad_mask
 * (NULL or bool [B, Tk], true = attend) masks padding keys. With a cache, x holds the new
 * positions only: their keys and values are appended at cache->len and attention covers the
 * cached ones (positions of x are cache->len + t for the causal mask). Attention dropout and
 * residual dropout use p_dropout in training mode. */
typedef struct em_mha {
    em_module base;
    em_linear *c_attn, *c_proj;
    int64_t dim, heads;
    bool causal;
    double p_dropout;
} em_mha;
em_mha *em_mha_new(em_device *dev, em_scalar dtype, int64_t dim, int64_t heads, bool causal,
                   bool bias, double p_dropout, bool weight_in_out, em_rng *rng);
em_tensor *em_mha_forward(em_mha *m, const em_tensor *x, const em_tensor *pad_mask,
                          em_kv_cache *cache, em_rng *rng);

/* GPT-2's MLP: "c_fc" (dim -> hidden), activation, "c_proj" (hidden -> dim), dropout. */
typedef struct em_mlp {
    em_module base;
    em_linear *c_fc, *c_proj;
    em_activation act;
    double p_dropout;
} em_mlp;
em_mlp *em_mlp_new(em_device *dev, em_scalar dtype, int64_t dim, int64_t hidden,
                   em_activation act, bool bias, double p_dropout, bool weight_in_out, em_rng *rng);
em_tensor *em_mlp_forward(em_mlp *m, const em_tensor *x, em_rng *rng);

/* Pre-norm transformer block (GPT-2): x + attn(ln_1(x)), then + mlp(ln_2(x)). Children "ln_1",
 * "attn", "ln_2", "mlp". */
typedef struct em_block {
    em_module base;
    em_layer_norm_mod *ln_1, *ln_2;
    em_mha *attn;
    em_mlp *mlp;
} em_block;
typedef struct em_block_config {
    int64_t dim, heads, hidden; /* hidden: 4 * dim in GPT-2 */
    bool bias;
    double p_dropout, eps;
    em_activation act;
    bool weight_in_out;
} em_block_config;
em_block *em_block_new(em_device *dev, em_scalar dtype, const em_block_config *cfg, em_rng *rng);
em_tensor *em_block_forward(em_block *b, const em_tensor *x, const em_tensor *pad_mask,
                            em_kv_cache *cache, em_rng *rng);

/* NCHW convolution and pools as modules ("weight" [out, in/groups, k, k], "bias"). */
typedef struct em_conv2d_mod {
    em_module base;
    em_tensor *weight, *bias;
    int stride, padding, dilation, groups;
} em_conv2d_mod;
em_conv2d_mod *em_conv2d_new(em_device *dev, em_scalar dtype, int64_t in, int64_t out, int kernel,
                             int stride, int padding, int dilation, int groups, bool bias,
                             em_rng *rng);
em_tensor *em_conv2d_forward(em_conv2d_mod *c, const em_tensor *x);
/* Pools have no parameters; they are plain functions of tensor.h (em_max_pool2d, em_avg_pool2d)
 * and modules for composing trees. */
typedef struct em_pool2d_mod {
    em_module base;
    int kernel, stride, padding;
    bool max; /* max or average */
} em_pool2d_mod;
em_pool2d_mod *em_pool2d_new(em_device *dev, bool max, int kernel, int stride, int padding);
em_tensor *em_pool2d_forward(em_pool2d_mod *p, const em_tensor *x);

/* ---- losses ---------------------------------------------------------------------------------- */

typedef enum em_reduction { EM_REDUCE_MEAN = 0, EM_REDUCE_SUM, EM_REDUCE_NONE } em_reduction;

/* logits [..., C] (class dim last), targets i32/i64 [...]; targets equal to ignore_index add
 * nothing and are not counted in the mean (PyTorch's default -100). label_smoothing in [0, 1). */
em_tensor *em_cross_entropy(const em_tensor *logits, const em_tensor *targets, int64_t ignore_index,
                            double label_smoothing, em_reduction reduction);
em_tensor *em_mse_loss(const em_tensor *pred, const em_tensor *target, em_reduction reduction);
/* Numerically stable: max(x, 0) - x y + log(1 + exp(-|x|)); pos_weight NULL or broadcastable. */
em_tensor *em_bce_with_logits(const em_tensor *logits, const em_tensor *target,
                              const em_tensor *pos_weight, em_reduction reduction);

#ifdef __cplusplus
}
#endif
#endif
