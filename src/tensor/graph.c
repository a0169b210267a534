/* graph.c — runtime graphs of tensor programs (ember/tensor.h em_tensor_graph_*, docs/graphs.md):
 * the runtime's recording (src/runtime/graph.c) knows launches, not the tensor layer's pending
 * computations, so these wrappers flush them at the three points where it matters — before a
 * recording starts (nothing from before is recorded), before it ends (what the recorded ops left
 * pending is recorded too), and before a replay (pending writes into the graph's inputs land
 * first). */
#include "ember/tensor.h"

em_status em_tensor_graph_begin(em_device *dev)
{
    em_status st = em_flush();
    return st == EM_OK ? em_graph_begin(dev) : st;
}

em_status em_tensor_graph_end(em_device *dev, em_graph **out)
{
    em_status st = em_flush();
    if (st == EM_OK)
        return em_graph_end(dev, out);
    em_graph *g = NULL; /* the recording still ends, failed */
    if (em_device_recording(dev) && em_graph_end(dev, &g) == EM_OK)
        em_graph_free(g);
    if (out)
        *out = NULL;
    return st;
}

em_status em_tensor_graph_launch(em_graph *g)
{
    em_status st = em_flush();
    return st == EM_OK ? em_graph_launch(g) : st;
}
