#!/usr/bin/env python3
"""Reference for bench/bench_tensor.c: the same tensor ops in PyTorch eager on CUDA.

  python3 bench/reference/torch_tensor_ops.py [--small] [--repeats 50]

Ops and shapes (f32) as ember_bench_tensor's (issue #6's benchmark, GPT-2 shapes):
  softmax               torch.softmax(x, -1), x of 16*12*1024 rows x 1024 (attention rows)
  layer_norm            F.layer_norm(x, (768,), w, b, 1e-5), x of 16384 x 768
  gelu_tanh, gelu_erf   F.gelu(x, approximate='tanh' / 'none'), x of 16384 x 3072
  sum_last              x.sum(-1), x of 16384 x 768
  transpose_contiguous  x.t().contiguous(), x of 16384 x 768
--small uses ember's small shapes (2048 rows everywhere). Each op is warmed up, then timed with
CUDA events: the median of --repeats runs. GB/s counts bytes read + written once, as ember's.
Prints one JSON line whose keys follow ember_bench_tensor --json, so scripts/gpu-bench.sh can put
the two side by side.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from timing import median_ms, sig  # bench/reference/timing.py


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="ember's --small shapes")
    ap.add_argument("--repeats", type=int, default=50)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_tensor_ops.py: CUDA is not available to PyTorch", file=sys.stderr)
        return 1
    dev = torch.device("cuda:0")
    attn_rows, attn_cols, bt, c, c4 = (2048, 1024, 2048, 768, 3072) if a.small else \
        (16 * 12 * 1024, 1024, 16384, 768, 3072)
    out = {"bench": "tensor", "impl": "torch", "torch": torch.__version__,
           "cuda": torch.version.cuda, "device": "cuda:0",
           "device_name": torch.cuda.get_device_name(dev), "small": a.small,
           "repeats": a.repeats, "ops": {}}
    g = torch.Generator(device=dev).manual_seed(1234)
    x_attn = torch.randn(attn_rows, attn_cols, device=dev, generator=g)
    x_c = torch.randn(bt, c, device=dev, generator=g)
    x_c4 = torch.randn(bt, c4, device=dev, generator=g)
    w = torch.randn(c, device=dev, generator=g)
    b = torch.randn(c, device=dev, generator=g)
    ops = [
        ("softmax", x_attn, lambda: torch.softmax(x_attn, -1), 8 * x_attn.numel()),
        ("layer_norm", x_c, lambda: F.layer_norm(x_c, (c,), w, b, 1e-5),
         8 * x_c.numel() + 8 * c),
        ("gelu_tanh", x_c4, lambda: F.gelu(x_c4, approximate="tanh"), 8 * x_c4.numel()),
        ("gelu_erf", x_c4, lambda: F.gelu(x_c4, approximate="none"), 8 * x_c4.numel()),
        ("sum_last", x_c, lambda: x_c.sum(-1), 4 * x_c.numel() + 4 * bt),
        ("transpose_contiguous", x_c, lambda: x_c.t().contiguous(), 8 * x_c.numel()),
    ]
    with torch.no_grad():
        for name, x, fn, nbytes in ops:
            med, lo = median_ms(fn, a.repeats)
            out["ops"][name] = {"shape": list(x.shape), "bytes_moved": nbytes,
                                "median_ms": sig(med), "min_ms": sig(lo),
                                "gbps": sig(nbytes / (med * 1e-3) / 1e9)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
