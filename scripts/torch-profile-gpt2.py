#!/usr/bin/env python3
"""torch-profile-gpt2.py — where PyTorch's GPT-2 training step spends its GPU time.

Runs the reference workload of ../shared/anchors/gpt2_train.py (its model, optimizer and step,
imported from the anchor, so both time the same thing) under torch.profiler, and prints the
device time a step of each kernel family and of the largest kernels, to set beside ember's
EMBER_PROFILE=1 breakdown (scripts/gpu-train-check.sh runs it as TORCH_PROFILE=1).

  python3 scripts/torch-profile-gpt2.py --anchors ../shared/anchors --batch 16 --compile
"""
import argparse, collections, json, re, sys


def family(name):
    """The kernel family of a CUDA kernel's name, as ember's breakdown groups its own."""
    n = name.lower()
    # attention first: cuDNN's flash kernels' names hold "sm90" and "wgmma" too
    rules = [("attention", r"flash|fmha|attention|sdpa|compute_dot_do_o|convert_dq"),
             ("matmul", r"gemm|xmma|cutlass|nvjet|cublas|sm90_|sm80_"),
             ("optimizer", r"adam|multi_tensor"),
             ("norm", r"layer_norm|layernorm|native_layer"),
             ("cross-entropy", r"cross_entropy|nll|log_softmax|softmax"),
             ("triton (fused)", r"^triton"),
             ("reduce", r"reduce"),
             ("elementwise / copy", r"elementwise|vectorized|copy|fill|cat|index|embedding")]
    for fam, pat in rules:
        if re.search(pat, n):
            return fam
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchors", default="../shared/anchors")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, a.anchors)
    import torch
    from torch.profiler import profile, ProfilerActivity
    import gpt2_train as ref

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    m = ref.GPT(ctx=max(1024, a.seq)).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    f = torch.compile(m) if a.compile else m
    data = torch.randint(0, 50257, (a.batch, a.seq + 1), device="cuda")
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = f(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    kernels = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        k = kernels[ev.name]
        k[0] += 1
        k[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    fams = collections.defaultdict(lambda: [0, 0.0])
    for name, (cnt, us) in kernels.items():
        fm = fams[family(name)]
        fm[0] += cnt
        fm[1] += us
    total = sum(us for _, us in kernels.values()) / a.steps / 1e3
    print("torch %s %s, batch %d x %d: %.2f ms of kernels a step" %
          (torch.__version__, "compile" if a.compile else "eager", a.batch, a.seq, total))
    print("  family: ms/step, launches/step")
    for fam, (cnt, us) in sorted(fams.items(), key=lambda kv: -kv[1][1]):
        print("    %s: %.2f, %.0f" % (fam, us / a.steps / 1e3, cnt / a.steps))
    print("  largest kernels: ms/step, launches/step")
    for name, (cnt, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:25]:
        print("    %.3f %4.0f  %s" % (us / a.steps / 1e3, cnt / a.steps, name[:110]))
    # the matmuls by operator and input shapes (device time of the kernels each launched)
    print("  matmuls by input shapes: ms/step, calls/step")
    mm = [e for e in prof.key_averages(group_by_input_shape=True)
          if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")]
    dev_us = lambda e: getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
    for e in sorted(mm, key=lambda e: -dev_us(e))[:20]:
        print("    %.3f %4.0f  %s %s" % (dev_us(e) / a.steps / 1e3, e.count / a.steps, e.key, e.input_shapes))
    print(json.dumps({"workload": "torch_profile", "kernel_ms_per_step": round(total, 2),
                      "families": {k: round(v[1] / a.steps / 1e3, 3) for k, v in fams.items()}}))


if __name__ == "__main__":
    main()
