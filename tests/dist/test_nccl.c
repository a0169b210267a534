/* test_nccl.c — the NCCL engine: every collective of collectives_cases.h on CUDA tensors, through
 * NCCL (EM_DIST_NCCL: NCCL even for one rank). Run alone it is one rank on cuda:0 — the sums are
 * then the rank's own values, but every call goes through ncclAllReduce / ncclBroadcast /
 * ncclAllGather / ncclReduceScatter on device addresses (views with offsets, strided views, 16-bit
 * floats, buckets); under `mpirun -np N` each rank takes cuda:<local rank> and the results are
 * real reductions. Skipped (with the reason) when there is no CUDA device or no libnccl. */
#include "collectives_cases.h"

static char why_skipped[512];
static bool broken; /* NCCL is there but failed: an error, not a skip */

/* The communicator on this rank's GPU, or false with why_skipped set. */
static bool open_nccl(void)
{
    D = em_dist_init(EM_DIST_NCCL);
    if (!D) {
        snprintf(why_skipped, sizeof why_skipped, "em_dist_init: %s", em_last_error());
        return false;
    }
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", em_dist_local_rank(D));
    DEV = em_device_open(name);
    if (!DEV) {
        snprintf(why_skipped, sizeof why_skipped, "no %s: %s", name, em_last_error());
        return false;
    }
    em_status st = em_dist_use_device(D, DEV);
    if (st != EM_OK) {
        snprintf(why_skipped, sizeof why_skipped, "%s", em_last_error());
        broken = st != EM_ERR_UNSUPPORTED; /* libnccl / libcuda missing is a skip */
        return false;
    }
    R = em_dist_rank(D);
    W = em_dist_world(D);
    ENGINE = "nccl";
    fprintf(stderr, "rank %d of %d (engine %s) on %s\n", R, W, em_dist_engine(D), name);
    return true;
}

static int teardown(void **state)
{
    (void)state;
    if (DEV) em_device_close(DEV);
    em_dist_free(D);
    return 0;
}

/* A view at an element offset inside a larger buffer is reduced at the right address. */
static void test_offset_view(void **state)
{
    (void)state;
    em_tensor *base = filled(EM_F32, EM_SHAPE(10), f_lin);
    em_tensor *mid = em_narrow(base, 0, 3, 4);
    assert_true(em_is_contiguous(mid));
    assert_int_equal(em_dist_all_reduce(D, mid, EM_DIST_SUM), EM_OK);
    double *v = values(base);
    for (int64_t i = 0; i < 10; i++) {
        double want = 0;
        for (int r = 0; r < W; r++) want += i >= 3 && i < 7 ? f_lin(i, r) : (r == R) * f_lin(i, r);
        assert_float_equal(v[i], want, 1e-6);
    }
    free(v);
    em_release(mid), em_release(base);
}

static void test_skipped(void **state)
{
    (void)state;
    fprintf(stderr, "NCCL test skipped: %s\n", why_skipped);
    skip();
}

int main(void)
{
    if (!open_nccl()) {
        if (broken) {
            fprintf(stderr, "NCCL failed: %s\n", why_skipped);
            teardown(NULL);
            return 1;
        }
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_skipped)};
        return cmocka_run_group_tests(tests, NULL, teardown);
    }
    const struct CMUnitTest tests[] = {COLLECTIVES_CASES, cmocka_unit_test(test_offset_view)};
    return cmocka_run_group_tests(tests, NULL, teardown);
}
