#!/usr/bin/env python3
"""Reference for bench/bench_backend.c: the same figures measured with PyTorch on CUDA.

  python3 bench/reference/torch_elementwise.py [--bytes 1G] [--repeats 50]

Measures, on one buffer size (bytes per buffer, 1 GiB by default, as ember_bench_backend uses on
GPUs):
  copy    device-to-device copy bandwidth, dst.copy_(src) on uint8 tensors (bytes read + written)
  gelu    torch.nn.functional.gelu (exact erf form) over an input of that many bytes, in f32 and
          in bf16 (bytes read + written), and as % of the copy bandwidth measured here
  launch  eager-mode cost of a tiny op (t.add_(1) on one element): 1,000 calls and one
          synchronize, per call (Python, dispatcher and kernel launch; median of 5)
Timed with CUDA events, the median of --repeats runs after warm-up. Prints one JSON line whose
keys follow ember_bench_backend --json, so scripts/gpu-bench.sh can put them side by side.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from timing import median_ms, sig  # bench/reference/timing.py



def parse_bytes(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in scale:
        return int(float(text[:-1]) * scale[text[-1].upper()])
    return int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", default="1G", help="bytes per buffer (suffixes K, M, G)")
    ap.add_argument("--repeats", type=int, default=50)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_elementwise.py: CUDA is not available to PyTorch", file=sys.stderr)
        return 1
    nbytes = parse_bytes(a.bytes) & ~0xFFFF
    dev = torch.device("cuda:0")
    out = {"bench": "backend", "impl": "torch", "torch": torch.__version__,
           "cuda": torch.version.cuda, "device": "cuda:0",
           "device_name": torch.cuda.get_device_name(dev), "bytes": nbytes,
           "repeats": a.repeats}

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    med, lo = median_ms(lambda: dst.copy_(src), a.repeats)
    copy_gbps = 2 * nbytes / (med * 1e-3) / 1e9
    out["copy"] = {"bytes_moved": 2 * nbytes, "median_ms": sig(med), "min_ms": sig(lo),
                   "gbps": sig(copy_gbps), "best_gbps": sig(2 * nbytes / (lo * 1e-3) / 1e9)}
    del src, dst

    out["gelu"] = []
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        n = nbytes // torch.tensor([], dtype=dt).element_size()
        x = (torch.rand(n, device=dev, dtype=torch.float32) * 12 - 6).to(dt)
        med, lo = median_ms(lambda: F.gelu(x), a.repeats)
        gbps = 2 * nbytes / (med * 1e-3) / 1e9
        out["gelu"].append({"dtype": name, "elements": n, "bytes_moved": 2 * nbytes,
                            "median_ms": sig(med), "min_ms": sig(lo), "gbps": sig(gbps),
                            "pct_of_copy": sig(100 * gbps / copy_gbps, 4)})
        del x
        torch.cuda.empty_cache()

    t = torch.zeros(1, device=dev)
    for _ in range(100):
        t.add_(1)
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            t.add_(1)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / 1000)
    samples.sort()
    out["launch"] = {"launches": 1000, "samples": 5, "median_us": sig(samples[2] * 1e6, 4),
                     "min_us": sig(samples[0] * 1e6, 4), "what": "eager t.add_(1) on one element"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
