/* test_collectives.c — every collective of ember/dist.h (the checks are in collectives_cases.h),
 * on CPU tensors. The program runs alone (dist.collectives: a world of one, where every
 * collective must be the identity) and under `mpirun -np 2` (dist.collectives_np2, through
 * tests/dist/mpirun.sh: the MPI engine). Covered: sum, mean, max, min of f32 / f64 / i32 / i64 /
 * bf16 / f16; a strided view reduced in place (staged through host memory) while the rest of its
 * buffer stays untouched; broadcast, all-gather (0-d and transposed inputs too) and
 * reduce-scatter; buckets of several tensors and dtypes; host values; errors. With
 * EMBER_TEST_DIST_DEVICE=vulkan:0 (any device) the tensors live there and every collective is
 * staged. Every rank runs the tests in the same order, as collectives need. */
#include "collectives_cases.h"

static int setup(void **state)
{
    (void)state;
    D = em_dist_init(EM_DIST_AUTO);
    if (!D) {
        fprintf(stderr, "em_dist_init: %s\n", em_last_error());
        return -1;
    }
    const char *name = getenv("EMBER_TEST_DIST_DEVICE");
    DEV = em_device_open(name && *name ? name : "cpu");
    if (!DEV) {
        fprintf(stderr, "device: %s\n", em_last_error());
        return -1;
    }
    R = em_dist_rank(D);
    W = em_dist_world(D);
    if (em_dist_use_device(D, DEV) != EM_OK) {
        fprintf(stderr, "em_dist_use_device: %s\n", em_last_error());
        return -1;
    }
    ENGINE = W > 1 ? "mpi" : "none";
    fprintf(stderr, "rank %d of %d (engine %s) on %s\n", R, W, em_dist_engine(D),
            em_device_name(DEV));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(DEV);
    em_dist_free(D);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {COLLECTIVES_CASES};
    return cmocka_run_group_tests(tests, setup, teardown);
}
