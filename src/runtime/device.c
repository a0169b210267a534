/* device.c — the device object: creation through its driver, destruction (kernels, modules,
 * buffers, then the driver state), the simple accessors, synchronization and timers. Which
 * device a name means, and reference counting, live in registry.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "runtime/rt.h"

double em_rt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

em_device *em_rt_device_create(const em_driver *drv, int index, const char *name)
{
    em_device *dev = calloc(1, sizeof(*dev));
    if (!dev) {
        em_set_error(EM_ERR_NOMEM, "out of memory opening device '%s'", name);
        return NULL;
    }
    dev->drv = drv;
    dev->index = index;
    dev->refs = 1;
    snprintf(dev->name, sizeof(dev->name), "%s", name);
    if (drv->open(index, &dev->caps, &dev->state) != EM_OK) {
        em_error_context("opening device '%s'", name);
        free(dev);
        return NULL;
    }
    em_rt_pool_init(&dev->pool);
    pthread_mutex_init(&dev->kernel_lock, NULL);
    pthread_mutex_init(&dev->compile_lock, NULL);
    pthread_mutex_init(&dev->consts.lock, NULL);
    em_map_init(&dev->kernels);
    em_map_init(&dev->modules);
    EM_LOGD("device %s opened: %s (%s, %s)", name, dev->caps.device_name, dev->caps.target,
            dev->caps.arch);
    return dev;
}

void em_rt_device_destroy(em_device *dev)
{
    if (dev->drv->sync)
        dev->drv->sync(dev->state);
    em_rt_profile_device_closing(dev); /* its pending timings, while its events still exist */
    em_rt_kernels_destroy(dev);
    em_rt_constants_destroy(dev);
    size_t live = em_rt_pool_destroy(dev);
    if (live)
        EM_LOGW("device %s closed with %zu buffer%s still allocated (freed with it)", dev->name,
                live, live == 1 ? "" : "s");
    dev->drv->close(dev->state);
    em_map_free(&dev->kernels);
    em_map_free(&dev->modules);
    pthread_mutex_destroy(&dev->kernel_lock);
    pthread_mutex_destroy(&dev->compile_lock);
    pthread_mutex_destroy(&dev->pool.lock);
    free(dev->kernel_list.items);
    free(dev);
}

const char *em_device_name(const em_device *dev)
{
    return dev ? dev->name : "(null)";
}

const em_caps *em_device_caps(const em_device *dev)
{
    return dev ? &dev->caps : NULL;
}

unsigned em_line_lanes(const em_caps *caps, unsigned elem_bytes)
{
    if (!caps || elem_bytes == 0 || elem_bytes > 16)
        return 1;
    if (strcmp(caps->target, "c") == 0) /* wider lines only lengthen the generated C */
        return 4;
    unsigned bytes = elem_bytes <= 2 ? 32 : 16;
    unsigned lanes = bytes / elem_bytes;
    return lanes > EM_MAX_LANES ? EM_MAX_LANES : lanes;
}

void em_rt_settle(em_device *dev, uint64_t seq)
{
    uint64_t cur = __atomic_load_n(&dev->settled, __ATOMIC_RELAXED);
    while (cur < seq && !__atomic_compare_exchange_n(&dev->settled, &cur, seq, true,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

em_status em_device_sync(em_device *dev)
{
    if (!dev)
        return em_set_error(EM_ERR_INVALID, "em_device_sync: no device");
    if (dev->recording)
        return em_rt_graph_refuse(dev, "a sync (em_device_sync)");
    if (em_rt_profiling())
        em_rt_profile_count(EM_RT_PROF_SYNC, 0);
    /* the launches numbered so far complete with the sync (em_buffer_settled) */
    uint64_t seq = __atomic_load_n(&dev->launch_seq, __ATOMIC_RELAXED);
    em_status st = dev->drv->sync ? dev->drv->sync(dev->state) : EM_OK;
    if (st != EM_OK)
        em_error_context("device %s", dev->name);
    else
        em_rt_settle(dev, seq);
    return st;
}

/* ---- timers ---------------------------------------------------------------------------------- */

em_status em_timer_start(em_timer *t, em_device *dev)
{
    if (!t || !dev)
        return em_set_error(EM_ERR_INVALID, "em_timer_start: no timer or device");
    t->dev = dev;
    t->event0 = NULL;
    if (dev->recording)
        return em_rt_graph_refuse(dev, "a timer (em_timer_start)");
    if (dev->drv->event_record) {
        em_status st = dev->drv->event_record(dev->state, &t->event0);
        if (st != EM_OK)
            return em_error_context("device %s: timer start", dev->name);
    } else {
        em_status st = em_device_sync(dev);
        if (st != EM_OK)
            return st;
    }
    t->host_t0 = em_rt_now();
    return EM_OK;
}

double em_timer_stop(em_timer *t)
{
    if (!t || !t->dev) {
        em_set_error(EM_ERR_INVALID, "em_timer_stop: timer was not started");
        return -1.0;
    }
    em_device *dev = t->dev;
    if (dev->drv->event_record && t->event0) {
        void *event1 = NULL;
        double seconds = -1.0;
        if (dev->drv->event_record(dev->state, &event1) == EM_OK &&
            dev->drv->event_elapsed(dev->state, t->event0, event1, &seconds) == EM_OK) {
            dev->drv->event_destroy(dev->state, event1);
            dev->drv->event_destroy(dev->state, t->event0);
            t->event0 = NULL;
            return seconds;
        }
        if (event1)
            dev->drv->event_destroy(dev->state, event1);
        dev->drv->event_destroy(dev->state, t->event0);
        t->event0 = NULL;
        return -1.0;
    }
    if (em_device_sync(dev) != EM_OK)
        return -1.0;
    return em_rt_now() - t->host_t0;
}
