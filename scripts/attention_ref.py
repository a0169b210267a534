#!/usr/bin/env python3
"""attention_ref.py — the reference for `ember bench attention`: PyTorch's fused attention
(torch.nn.functional.scaled_dot_product_attention, the flash backend unless --backend says
otherwise) forward and backward on random q, k, v [B, H, T, D] of the same shapes, timed with CUDA
events the way ember's benchmark times itself (one untimed call, 0.3 s of warm-up, the best of
three rounds of --iters calls). Prints one JSON line with ember's fields:

  {"bench":"attention","impl":"torch-flash","device":"cuda","device_name":"...","dtype":"bf16",
   "batch":16,"heads":12,"seq":1024,"dim":64,"causal":true,"fwd_ms":...,"bwd_ms":...,
   "fwd_tflops":...,"bwd_tflops":...}

The backward is timed as torch.autograd.grad of the forward's output (the forward itself is not
in bwd_ms: its outputs are made once and the graph kept). TFLOP/s count 4 B H T^2 D (halved to
T (T + 1) / 2 pairs causal) forward and 2.5 times that backward, as ember's do. Runs on the GPU
machine (docs/benchmarks.md), whose image has PyTorch.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def best_of(fn, iters):
    """Seconds per call of fn: the best of three rounds after a warm-up."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        fn()
    torch.cuda.synchronize()
    best = None
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        t = start.elapsed_time(end) / 1e3 / iters
        best = t if best is None or t < best else best
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--backend", choices=["flash", "efficient", "cudnn"], default="flash")
    a = p.parse_args()
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[a.backend]
    causal = not a.no_causal
    shape = (a.batch, a.heads, a.seq, a.dim)
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, device="cuda", dtype=dt)
    with sdpa_kernel([backend]):
        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def bwd():
            torch.autograd.grad(out, (q, k, v), g, retain_graph=True)

        f = best_of(fwd, a.iters)
        b = best_of(bwd, a.iters)
    pairs = a.seq * (a.seq + 1) / 2 if causal else a.seq * a.seq
    flop = 4.0 * a.batch * a.heads * pairs * a.dim
    print(json.dumps({
        "bench": "attention", "impl": "torch-" + a.backend, "device": "cuda",
        "device_name": torch.cuda.get_device_name(), "dtype": a.dtype, "batch": a.batch,
        "heads": a.heads, "seq": a.seq, "dim": a.dim, "causal": causal,
        "fwd_ms": round(f * 1e3, 4), "bwd_ms": round(b * 1e3, 4),
        "fwd_tflops": round(flop / f * 1e-12, 2), "bwd_tflops": round(2.5 * flop / b * 1e-12, 2),
        "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
