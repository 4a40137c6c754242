#!/usr/bin/env python3
"""The PyTorch side of bench/train_vs_pytorch.sh: trains loom's zoo MLP or CNN
(same layers, initialisation family, batch, optimizer and thread count) on the
real Fashion-MNIST data held in memory, and prints one JSON line with the
steady-state training throughput (the median of 100-step windows, like the
train lines of loom's metrics.jsonl).

Usage: pytorch_train.py --model mlp|cnn --batch 128 --steps 200 --threads 2
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch
import torch.nn as nn

DATA = "/usr/share/datasets/fashion-mnist"


def load_split(prefix):
    with gzip.open(f"{DATA}/{prefix}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{DATA}/{prefix}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (images.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def cnn():
    # models/cnn.h: per stage conv3x3 (no bias) -> BN -> ReLU -> maxpool2; fc 128; dropout 0.25.
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "cnn"], required=True)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, y = load_split("train")
    model = mlp() if args.model == "mlp" else cnn()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(x.shape[0])
    model.train()

    def step(i):
        idx = order[(i * args.batch) % (x.shape[0] - args.batch):][:args.batch]
        xb, yb = x[idx], y[idx]  # a shuffled batch gathered per step, as loom's loader does
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    # The median over windows of `window` steps, as loom's metrics.jsonl
    # reports its training rate (the machines are shared and noisy).
    rates = []
    i = args.warmup
    while len(rates) * args.window < args.steps:
        start = time.perf_counter()
        for _ in range(args.window):
            loss = step(i)
            i += 1
        rates.append(args.window * args.batch / (time.perf_counter() - start))
    rates.sort()
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "model": args.model,
                      "batch": args.batch, "threads": args.threads, "steps": len(rates) * args.window,
                      "samples_per_s": rates[(len(rates) - 1) // 2], "final_loss": float(loss.detach())}))


if __name__ == "__main__":
    main()
