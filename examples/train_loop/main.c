/* examples/train_loop/main.c — the training loop of PyTorch, in ember.
 *
 * Generates two interleaved spirals (a classic toy classification set: points of class 0 and 1
 * wind around each other, so a linear model cannot separate them), defines a small MLP from
 * Linear modules, and trains it with Adam and cross-entropy in the loop shape every PyTorch user
 * knows: forward, loss, zero gradients, backward, step. Prints the loss and accuracy as it goes
 * and exits 1 unless the final accuracy reaches --min-accuracy. Uses only the public headers;
 * walked through in docs/tutorial.md.
 *
 *   train_loop [--device NAME] [--steps N] [--points N] [--seed S] [--min-accuracy A] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/ember.h"

/* ---- the data: two spirals ------------------------------------------------------------------- */

/* n points per class: x [2n, 2] (f32, row-major) and labels y [2n] (i64). */
static void make_spirals(int n, uint64_t seed, float *x, int64_t *y)
{
    srand((unsigned)seed);
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < n; i++) {
            double t = 0.25 + 3.0 * (double)i / n;            /* turns around the centre */
            double r = t / 3.25;                              /* radius grows with t */
            double a = 2.0 * M_PI * t * 0.5 + c * M_PI;       /* class 1 is rotated by pi */
            double noise = 0.03 * ((double)rand() / RAND_MAX - 0.5);
            x[(c * n + i) * 2 + 0] = (float)((r + noise) * cos(a));
            x[(c * n + i) * 2 + 1] = (float)((r + noise) * sin(a));
            y[c * n + i] = c;
        }
    }
}

/* ---- the model: Linear -> ReLU -> Linear -> ReLU -> Linear ------------------------------------ */

typedef struct mlp {
    em_module base; /* first: the parameter tree (fc1.weight, fc1.bias, ...) */
    em_linear *fc1, *fc2, *fc3;
} mlp;

static mlp *mlp_new(em_device *dev, int64_t hidden, em_rng *rng)
{
    mlp *m = (mlp *)em_module_new("MLP", dev, sizeof(mlp));
    if (!m) return NULL;
    m->fc1 = (em_linear *)em_module_add(&m->base, "fc1",
                                        &em_linear_new(dev, EM_F32, 2, hidden, true, false, rng)->base);
    m->fc2 = (em_linear *)em_module_add(&m->base, "fc2",
                                        &em_linear_new(dev, EM_F32, hidden, hidden, true, false, rng)->base);
    m->fc3 = (em_linear *)em_module_add(&m->base, "fc3",
                                        &em_linear_new(dev, EM_F32, hidden, 2, true, false, rng)->base);
    if (!m->fc1 || !m->fc2 || !m->fc3) {
        em_module_free(&m->base);
        return NULL;
    }
    return m;
}

/* logits [N, 2]. em_take donates each temporary to the next op, which frees it. */
static em_tensor *mlp_forward(mlp *m, const em_tensor *x)
{
    em_tensor *h = em_relu(em_take(em_linear_forward(m->fc1, x)));
    h = em_relu(em_take(em_linear_forward(m->fc2, em_take(h))));
    return em_linear_forward(m->fc3, em_take(h));
}

/* The fraction of rows whose largest logit is the label's. */
static double accuracy(const em_tensor *logits, const em_tensor *y)
{
    em_scope_begin();
    em_tensor *hit = em_cast(em_eq(em_argmax(logits, 1, false), y), EM_F32);
    double acc = em_item(em_mean(hit, NULL, 0, false));
    em_scope_end(NULL, 0);
    return acc;
}

int main(int argc, char **argv)
{
    const char *device = "cpu";
    int steps = 300, points = 200;
    uint64_t seed = 1;
    double min_accuracy = 0.95;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) { device = v; i++; }
        else if (!strcmp(a, "--steps") && v) { steps = atoi(v); i++; }
        else if (!strcmp(a, "--points") && v) { points = atoi(v); i++; }
        else if (!strcmp(a, "--seed") && v) { seed = strtoull(v, NULL, 10); i++; }
        else if (!strcmp(a, "--min-accuracy") && v) { min_accuracy = atof(v); i++; }
        else {
            fprintf(stderr, "usage: train_loop [--device NAME] [--steps N] [--points N] [--seed S]"
                            " [--min-accuracy A]\n");
            return 2;
        }
    }
    if (steps < 1 || points < 4) {
        fprintf(stderr, "train_loop: --steps must be >= 1 and --points >= 4\n");
        return 2;
    }

    em_device *dev = em_device_open(device);
    if (!dev) {
        fprintf(stderr, "train_loop: %s\n", em_last_error());
        return 1;
    }

    /* The data, on the device. */
    int n = 2 * points;
    float *xs = malloc(sizeof(float) * 2 * n);
    int64_t *ys = malloc(sizeof(int64_t) * n);
    if (!xs || !ys) return 1;
    make_spirals(points, seed, xs, ys);
    em_tensor *x = em_from_host(dev, EM_F32, EM_SHAPE(n, 2), xs);
    em_tensor *y = em_from_host(dev, EM_I64, EM_SHAPE(n), ys);
    free(xs);
    free(ys);

    /* The model and its optimizer. */
    em_rng rng = em_rng_new(seed);
    mlp *model = mlp_new(dev, 64, &rng);
    em_adam_config adam = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                           .weight_decay = 0.0, .decoupled = true};
    em_optimizer *opt = model ? em_adam_new(&model->base, &adam) : NULL;
    if (!x || !y || !opt) {
        fprintf(stderr, "train_loop: %s\n", em_last_error());
        return 1;
    }
    printf("train_loop: %d points, MLP 2-64-64-2 (%lld parameters) on %s\n", n,
           (long long)em_module_num_params(&model->base), device);

    /* The loop. */
    double acc = 0;
    int rc = 0;
    for (int step = 1; step <= steps; step++) {
        em_scope_begin(); /* releases the step's temporaries at the end */
        em_tensor *logits = mlp_forward(model, x);                                     /* forward */
        em_tensor *loss = em_cross_entropy(logits, y, -100, 0.0, EM_REDUCE_MEAN);      /* loss */
        em_optimizer_zero_grad(opt);                                                   /* zero */
        if (!loss || em_backward(loss, NULL) != EM_OK || em_optimizer_step(opt) != EM_OK) {
            fprintf(stderr, "train_loop: step %d: %s\n", step, em_last_error());
            rc = 1;
        } else if (step % 50 == 0 || step == 1 || step == steps) {
            em_no_grad_begin();
            acc = accuracy(logits, y);
            em_no_grad_end();
            printf("step %4d  loss %.4f  accuracy %.3f\n", step, em_item(loss), acc);
        }
        em_scope_end(NULL, 0);
        if (rc) break;
    }

    if (!rc && acc < min_accuracy) {
        printf("train_loop: final accuracy %.3f is below %.3f\n", acc, min_accuracy);
        rc = 1;
    }
    em_optimizer_free(opt);
    em_module_free(&model->base);
    em_release(x);
    em_release(y);
    em_device_close(dev);
    return rc;
}
