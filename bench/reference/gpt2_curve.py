#!/usr/bin/env python3
"""gpt2_curve.py — PyTorch's loss curve for GPT-2 on the same data and initialization as an
`ember train` run, for the side-by-side curve of docs/benchmarks.md (issue #10).

Two modes:

  python3 gpt2_curve.py --make-init DIR [--seed S] [--layers 12 --dim 768 --heads 12]
      writes a freshly initialized Hugging Face GPT2LMHeadModel (dropout 0) to DIR
      (model.safetensors + config.json); `ember train --init-from DIR/model.safetensors` starts
      from exactly these weights.

  python3 gpt2_curve.py --init DIR --data SHARD --steps N --batch B --seq T [--lr ...]
      trains that model on ember's token shard (llm.c format: 256 int32 header, uint16 tokens)
      with the batches `ember train` draws without --shuffle (step s, row b takes the tokens
      [g T, g T + T + 1) with g = s B + b), AdamW (betas 0.9/0.95, eps 1e-8, weight decay on
      2-D weights other than the embeddings, as ember's "Linear weights only"), gradient
      clipping by global norm, ember's schedule (linear warmup from 0, then cosine to min-lr;
      the first step at lr 0), and prints one JSON line per step: {"step", "loss", "lr", "ms"}.
"""
import argparse
import json
import math
import time

import numpy as np
import torch


def make_init(a):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_layer=a.layers, n_embd=a.dim, n_head=a.heads, n_positions=1024,
                     vocab_size=50257, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    model.save_pretrained(a.make_init, safe_serialization=True)
    print(json.dumps({"init": a.make_init, "params": sum(p.numel() for p in model.parameters())}))


def lr_at(step, a):
    if a.warmup > 0 and step < a.warmup:
        return a.lr * step / a.warmup
    span = max(1, a.steps - a.warmup)
    p = min(1.0, max(0.0, (step - a.warmup) / span))
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * p))


def train(a):
    from transformers import GPT2LMHeadModel
    raw = np.fromfile(a.data, dtype=np.uint8)
    header = raw[:1024].view(np.int32)
    if header[0] != 20240520 or header[1] not in (1, 2):
        raise SystemExit(f"{a.data}: not a token shard (magic {header[0]}, version {header[1]})")
    dtype = np.uint16 if header[1] == 1 else np.uint32
    tokens = raw[1024:].view(dtype)[:header[2]].astype(np.int64)
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    model = GPT2LMHeadModel.from_pretrained(a.init).to(dev)
    model.train()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() == 2 and "wte" not in name and "wpe" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    B, T = a.batch, a.seq
    nsamples = (len(tokens) - 1) // T
    for step in range(1, a.steps + 1):
        t0 = time.time()
        rows = []
        for b in range(B):
            g = ((step - 1) * B + b) % nsamples
            rows.append(tokens[g * T: g * T + T + 1])
        batch = torch.tensor(np.stack(rows), device=dev)
        x, y = batch[:, :-1], batch[:, 1:]
        lr = lr_at(step - 1, a)  # ember counts optimizer steps from 0
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                 y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        torch.cuda.synchronize()
        print(json.dumps({"step": step, "loss": round(loss.item(), 5), "lr": lr,
                          "ms": round((time.time() - t0) * 1000, 2)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-init")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--init")
    ap.add_argument("--data")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--min-lr", type=float, default=6e-5)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args()
    if a.make_init:
        make_init(a)
    else:
        train(a)


if __name__ == "__main__":
    main()
