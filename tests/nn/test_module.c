/* test_module.c — the module tree of nn.h: full dotted names through nested modules (a GPT-like
 * tree of embedding, blocks and a final norm), visit order and early stop, find, parameter
 * counts, buffers, decay flags, train/eval propagation, zero_grad, name errors, ownership across
 * scopes, and freeing without leaks (the suite runs under ASan/LSan in CI). CPU only: the tree
 * does not depend on the device. */
#include "nn_ref.h"

static em_device *dev;

static int setup(void **state)
{
    (void)state;
    dev = em_device_open("cpu");
    return dev ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    return 0;
}

typedef struct names {
    char items[64][64];
    bool param[64], decay[64];
    int n, stop_after;
} names;

static bool collect(const char *full, em_module_entry *e, void *user)
{
    names *nm = user;
    assert_true(nm->n < 64);
    snprintf(nm->items[nm->n], 64, "%s", full);
    nm->param[nm->n] = e->is_param;
    nm->decay[nm->n] = e->decay;
    nm->n++;
    return nm->stop_after <= 0 || nm->n < nm->stop_after;
}

/* wte (Embedding 10 x 8), h.0 and h.1 (blocks of dim 8, 2 heads, hidden 32), ln_f, and a buffer. */
static em_module *make_tree(em_rng *rng)
{
    em_module *root = em_module_new("GPT", dev, sizeof(em_module));
    assert_non_null(root);
    assert_non_null(
        em_module_add(root, "wte", (em_module *)em_embedding_new(dev, EM_F32, 10, 8, rng)));
    em_module *h = em_module_add(root, "h", em_module_new("ModuleList", dev, 0));
    assert_non_null(h);
    em_block_config cfg = {.dim = 8,
                           .heads = 2,
                           .hidden = 32,
                           .bias = true,
                           .eps = 1e-5,
                           .act = EM_ACT_GELU_TANH,
                           .weight_in_out = true};
    for (int i = 0; i < 2; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "%d", i);
        assert_non_null(em_module_add(h, nm, (em_module *)em_block_new(dev, EM_F32, &cfg, rng)));
    }
    assert_non_null(em_module_add(
        root, "ln_f", (em_module *)em_layer_norm_new(dev, EM_F32, 8, 1e-5, true, true)));
    assert_non_null(em_module_buffer(root, "mask", em_ones(dev, EM_BOOL, EM_SHAPE(4, 4))));
    return root;
}

static void test_names_and_order(void **state)
{
    (void)state;
    em_rng rng = em_rng_new(1);
    em_module *root = make_tree(&rng);
    names nm = {0};
    em_module_visit(root, collect, &nm);
    static const char *block[] = {"ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
                                  "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                                  "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
                                  "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    char expect[64][64];
    int n = 0;
    snprintf(expect[n++], 64, "mask"); /* own entries first, then children in order */
    snprintf(expect[n++], 64, "wte.weight");
    for (int i = 0; i < 2; i++)
        for (size_t j = 0; j < EM_ARRAY_LEN(block); j++)
            snprintf(expect[n++], 64, "h.%d.%s", i, block[j]);
    snprintf(expect[n++], 64, "ln_f.weight");
    snprintf(expect[n++], 64, "ln_f.bias");
    assert_int_equal(nm.n, n);
    for (int i = 0; i < n; i++) {
        assert_string_equal(nm.items[i], expect[i]);
        bool is_buffer = i == 0;
        assert_int_equal(nm.param[i], !is_buffer);
        /* decay: the matrices (embedding, c_attn, c_proj, c_fc weights), not biases or norms */
        bool matrix = strstr(expect[i], "weight") && !strstr(expect[i], "ln_");
        assert_int_equal(nm.decay[i], matrix);
    }
    /* early stop */
    names part = {.stop_after = 3};
    em_module_visit(root, collect, &part);
    assert_int_equal(part.n, 3);
    assert_string_equal(part.items[2], "h.0.ln_1.weight");
    em_module_free(root);
}

static void test_find_and_count(void **state)
{
    (void)state;
    em_rng rng = em_rng_new(2);
    em_module *root = make_tree(&rng);
    em_block *b1 = (em_block *)root->children[1]->children[1];
    em_module_entry *e = em_module_find(root, "h.1.attn.c_attn.weight");
    assert_non_null(e);
    assert_ptr_equal(e->t, b1->attn->c_attn->weight);
    assert_true(em_requires_grad(e->t));
    em_shape s = em_shape_of(e->t);
    assert_int_equal(s.rank, 2);
    assert_int_equal(s.d[0], 8); /* weight_in_out: [in, out] */
    assert_int_equal(s.d[1], 24);
    assert_ptr_equal(em_module_find(root, "h.1.mlp.c_proj.bias")->t, b1->mlp->c_proj->bias);
    assert_null(em_module_find(root, "h.1"));
    assert_null(em_module_find(root, "h.2.ln_1.weight"));
    assert_null(em_module_find(root, "h.1.attn.c_attn.weight.x"));
    assert_null(em_module_find(root, "wte.bias"));
    assert_null(em_module_find(root, ""));
    em_module_entry *mask = em_module_find(root, "mask");
    assert_non_null(mask);
    assert_false(mask->is_param);
    assert_false(em_requires_grad(mask->t));
    /* counted by hand: wte 80; per block: ln 2*(8+8), c_attn 8*24+24, c_proj 8*8+8,
     * c_fc 8*32+32, c_proj 32*8+8; ln_f 16; the buffer is not counted */
    int64_t block = 32 + (192 + 24) + (64 + 8) + (256 + 32) + (256 + 8);
    assert_int_equal(em_module_num_params(root), 80 + 2 * block + 16);
    assert_int_equal(em_module_num_params(NULL), 0);
    em_module_free(root);
}

static void test_train_eval(void **state)
{
    (void)state;
    em_rng rng = em_rng_new(3);
    em_module *root = make_tree(&rng);
    em_block *b0 = (em_block *)root->children[1]->children[0];
    assert_true(root->training);
    assert_true(b0->attn->c_proj->base.training);
    em_module_train(root, false);
    assert_false(root->training);
    assert_false(root->children[1]->training);
    assert_false(b0->attn->base.training);
    assert_false(b0->mlp->c_fc->base.training);
    em_module_train(&b0->base, true); /* a subtree alone */
    assert_true(b0->mlp->c_fc->base.training);
    assert_false(root->training);
    em_module_free(root);
}

static void test_name_errors(void **state)
{
    (void)state;
    em_rng rng = em_rng_new(4);
    em_module *m = em_module_new("Test", dev, 0);
    assert_non_null(m);
    assert_non_null(em_module_param(m, "w", em_zeros(dev, EM_F32, EM_SHAPE(2)), true));
    assert_null(em_module_param(m, "w", em_zeros(dev, EM_F32, EM_SHAPE(2)), true));
    assert_non_null(strstr(em_last_error(), "\"w\""));
    assert_null(em_module_buffer(m, "a.b", em_zeros(dev, EM_F32, EM_SHAPE(2))));
    assert_non_null(strstr(em_last_error(), "a.b"));
    assert_null(em_module_buffer(m, "", em_zeros(dev, EM_F32, EM_SHAPE(2))));
    /* a child may not reuse an entry's name; the child is freed on error (no leak under ASan) */
    assert_null(
        em_module_add(m, "w", (em_module *)em_linear_new(dev, EM_F32, 2, 2, true, false, &rng)));
    assert_non_null(strstr(em_last_error(), "\"w\""));
    assert_null(em_module_add(m, "x", NULL));
    /* integer parameters cannot require gradients; a buffer can be anything */
    assert_null(em_module_param(m, "i", em_zeros(dev, EM_I32, EM_SHAPE(2)), false));
    assert_non_null(em_module_buffer(m, "i", em_zeros(dev, EM_I32, EM_SHAPE(2))));
    assert_null(em_module_param(m, "n", NULL, false));
    assert_int_equal(em_module_num_params(m), 2);
    em_module_free(m);
    em_module_free(NULL);
    /* constructors refuse bad sizes */
    assert_null(em_linear_new(dev, EM_F32, 0, 2, true, false, &rng));
    assert_non_null(strstr(em_last_error(), "em_linear_new"));
    assert_null(em_mha_new(dev, EM_F32, 10, 3, true, true, 0, false, &rng));
    assert_non_null(strstr(em_last_error(), "multiple of heads"));
    assert_null(em_layer_norm_new(dev, EM_F32, -1, 1e-5, true, true));
}

/* Modules made inside a scope own their tensors: closing the scope frees nothing of theirs. */
static void test_scope_ownership(void **state)
{
    (void)state;
    em_rng rng = em_rng_new(5);
    em_scope_begin();
    em_linear *l = em_linear_new(dev, EM_F32, 3, 2, true, false, &rng);
    assert_non_null(l);
    em_tensor *extra = em_module_param(&l->base, "extra", em_ones(dev, EM_F32, EM_SHAPE(2)), false);
    assert_non_null(extra);
    em_scope_end(NULL, 0);
    em_scope_begin();
    em_tensor *x = em_ones(dev, EM_F32, EM_SHAPE(1, 3));
    em_tensor *y = em_linear_forward(l, x); /* uses weight and bias after the scope closed */
    assert_non_null(y);
    double *w = tu_read(l->weight), *b = tu_read(l->bias), *got = tu_read(y), *e = tu_read(extra);
    for (int o = 0; o < 2; o++) {
        assert_true(fabs(got[o] - (w[o * 3] + w[o * 3 + 1] + w[o * 3 + 2] + b[o])) < 1e-5);
        assert_true(e[o] == 1.0);
    }
    free(w);
    free(b);
    free(got);
    free(e);
    em_scope_end(NULL, 0);
    em_module_free(&l->base);
}

static void test_zero_grad(void **state)
{
    (void)state;
    em_rng rng = em_rng_new(6);
    em_linear *l = em_linear_new(dev, EM_F32, 3, 2, true, false, &rng);
    assert_non_null(l);
    em_scope_begin();
    em_tensor *x = em_ones(dev, EM_F32, EM_SHAPE(4, 3));
    em_tensor *loss = em_sum(em_linear_forward(l, x), NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    assert_non_null(em_grad(l->weight));
    assert_non_null(em_grad(l->bias));
    /* d sum(x W^T + b) / d W = column sums of x = 4; / d b = 4 rows */
    double *gw = tu_read(em_grad(l->weight)), *gb = tu_read(em_grad(l->bias));
    for (int i = 0; i < 6; i++) assert_true(fabs(gw[i] - 4) < 1e-6);
    for (int i = 0; i < 2; i++) assert_true(fabs(gb[i] - 4) < 1e-6);
    free(gw);
    free(gb);
    em_module_zero_grad(&l->base);
    assert_null(em_grad(l->weight));
    assert_null(em_grad(l->bias));
    em_module_free(&l->base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_order), cmocka_unit_test(test_find_and_count),
        cmocka_unit_test(test_train_eval),      cmocka_unit_test(test_name_errors),
        cmocka_unit_test(test_scope_ownership), cmocka_unit_test(test_zero_grad),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
