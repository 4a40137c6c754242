#!/usr/bin/env python3
"""The PyTorch side of `loom bench fusion` for zoo models (resnet18,
mobilenet_v3_large, pointnet_cls, transformer_lm, bert_medium): R replicas
trained one after another (serial) against the same R replicas fused into one
vmapped model (torch.func, or functorch on torch 1.13), in training
samples/s on the CPU, timed the way loom times them.

Usage (bench/zoo_fusion_vs_pytorch.sh runs it after loom, with loom's JSON):
  PYTHON bench/pytorch_zoo_fusion.py --model NAME --loom-json LOOM.json \
      --replicas 1,2,4 --threads 1 --reps 3 [--lr 0.01 --momentum 0.9] [--json OUT]

The model, batch, input shape, number of classes and vocabulary come from
loom's JSON (what `loom bench fusion --json` wrote for the same config), so
both sides build the same network for the same data:
  resnet18            torchvision.models.resnet18(num_classes) with the CIFAR
                      stem as loom's `stem: cifar` (conv1 3x3/1 pad 1 without
                      bias, no max-pool); needs torchvision (Debian's
                      /usr/bin/python3: torch 1.13 + torchvision 0.14).
  mobilenet_v3_large  torchvision.models.mobilenet_v3_large(num_classes)
                      (dropout 0.2).
  pointnet_cls        fxia22's PointNetCls(k, feature_transform=True) rebuilt
                      here with its forward (bench/reference_models.py has
                      the module list), loss + 0.001 * the feature-transform
                      regularizer (squared Frobenius norm, as loom's).
  transformer_lm      HFTA's TransformerModel (embedding * sqrt(128),
                      sinusoidal positions, 2 post-norm encoder layers with a
                      causal mask, dropout 0.2, decoder), attention written
                      out with separate q/k/v Linears as loom's
                      models/transformer.h (nn.MultiheadAttention's packed
                      in_proj is the same arithmetic).
  bert_medium         BertForMaskedLM's modules (bench/reference_models.py)
                      with HF's forward: embeddings (word, position,
                      token type 0) + LayerNorm, 8 post-norm layers with GELU,
                      the MLM transform and the tied decoder; dropout 0.1.
Data: random inputs of loom's shapes (f32 normal, or token ids in
[0, vocabulary)), targets in [0, classes); bert_medium's targets are -100
(not scored) except on 15% of the positions, like loom's masked text. The
arithmetic does not depend on the values.

Optimizer: torch.optim.SGD(lr, momentum) per model (serial), or one over the
stacked parameters (vmap: SGD with momentum is elementwise, so this is R
independent optimizers).
  serial  R models, own parameters and optimizers; one step = for each
          replica zero_grad, forward, cross-entropy (+ aux), backward, step.
  vmap    parameters and buffers stacked (stack_module_state), the loss
          vmapped over them (in_dims 0, the batch shared, randomness
          "different": per-replica dropout masks; BatchNorm running stats
          updated per replica in place), the R losses summed, one backward,
          one step.
Timing as `loom bench fusion`: per R a fresh process, one warm-up step, then
`reps` timed steps of each variant (alternating serial, vmap, so both see
the same background load); the fastest step is reported (samples/s =
R * batch / seconds), the median too.
"""
import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_fusion import FUSION_API, Fused, Serial  # noqa: E402  (serial and vmapped trainers)


# ---------------------------------------------------------------- models
# Every model returns (logits, aux loss or None).

class TorchvisionModel(nn.Module):
    def __init__(self, name, classes):
        super().__init__()
        import torchvision
        if name == "resnet18":
            net = torchvision.models.resnet18(num_classes=classes)
            net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # loom's stem: cifar
            net.maxpool = nn.Identity()
        else:
            net = torchvision.models.mobilenet_v3_large(num_classes=classes)
        self.net = net

    def forward(self, x):
        return self.net(x), None


class STN(nn.Module):  # fxia22's STN3d (k = 3) / STNkd
    def __init__(self, k):
        super().__init__()
        self.k = k
        self.conv1, self.conv2, self.conv3 = nn.Conv1d(k, 64, 1), nn.Conv1d(64, 128, 1), nn.Conv1d(128, 1024, 1)
        self.fc1, self.fc2, self.fc3 = nn.Linear(1024, 512), nn.Linear(512, 256), nn.Linear(256, k * k)
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm1d(64), nn.BatchNorm1d(128), nn.BatchNorm1d(1024)
        self.bn4, self.bn5 = nn.BatchNorm1d(512), nn.BatchNorm1d(256)
        self.register_buffer("iden", torch.eye(k).flatten(), persistent=False)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        x = x.max(dim=2)[0]
        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.fc2(x)))
        x = self.fc3(x) + self.iden
        return x.view(-1, self.k, self.k)


class PointNetCls(nn.Module):  # fxia22's PointNetCls(k, feature_transform=True)
    def __init__(self, classes):
        super().__init__()
        self.stn, self.fstn = STN(3), STN(64)
        self.conv1, self.conv2, self.conv3 = nn.Conv1d(3, 64, 1), nn.Conv1d(64, 128, 1), nn.Conv1d(128, 1024, 1)
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm1d(64), nn.BatchNorm1d(128), nn.BatchNorm1d(1024)
        self.fc1, self.fc2, self.fc3 = nn.Linear(1024, 512), nn.Linear(512, 256), nn.Linear(256, classes)
        self.dropout = nn.Dropout(0.3)
        self.cbn1, self.cbn2 = nn.BatchNorm1d(512), nn.BatchNorm1d(256)

    def forward(self, x):
        trans = self.stn(x)
        x = torch.bmm(x.transpose(2, 1), trans).transpose(2, 1)
        x = F.relu(self.bn1(self.conv1(x)))
        trans_feat = self.fstn(x)
        x = torch.bmm(x.transpose(2, 1), trans_feat).transpose(2, 1)
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x)).max(dim=2)[0]
        x = F.relu(self.cbn1(self.fc1(x)))
        x = F.relu(self.cbn2(self.dropout(self.fc2(x))))
        eye = torch.eye(64, dtype=x.dtype)
        d = torch.bmm(trans_feat, trans_feat.transpose(2, 1)) - eye
        return self.fc3(x), 0.001 * (d * d).sum(dim=(1, 2)).mean()


class Attention(nn.Module):  # q/k/v/out Linears, softmax, dropout on the weights
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        b, t, w = x.shape
        h, d = self.heads, w // self.heads
        split = lambda y: y.view(b, t, h, d).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        s = q @ k.transpose(-1, -2) / math.sqrt(d)
        if mask is not None:
            s = s + mask
        p = self.drop(s.softmax(-1))
        return self.out((p @ v).transpose(1, 2).reshape(b, t, w))


class PostNormLayer(nn.Module):
    def __init__(self, width, heads, ff, dropout, act, eps):
        super().__init__()
        self.attn = Attention(width, heads, dropout)
        self.drop1, self.drop2, self.drop = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=eps), nn.LayerNorm(width, eps=eps)
        self.linear1, self.linear2 = nn.Linear(width, ff), nn.Linear(ff, width)
        self.act = act

    def forward(self, x, mask=None):
        x = self.norm1(x + self.drop1(self.attn(x, mask)))
        # nn.TransformerEncoderLayer: linear2(dropout(act(linear1))); BERT has no inner dropout
        y = self.act(self.linear1(x))
        if self.act is F.relu:
            y = self.drop(y)
        return self.norm2(x + self.drop2(self.linear2(y)))


class TransformerLm(nn.Module):
    def __init__(self, vocab, width=128, heads=2, layers=2, ff=128, dropout=0.2, max_len=5000):
        super().__init__()
        self.width = width
        self.encoder = nn.Embedding(vocab, width)
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, width, 2) * (-math.log(10000.0) / width))
        pe = torch.zeros(max_len, width)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe, persistent=False)
        self.pos_drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList([PostNormLayer(width, heads, ff, dropout, F.relu, 1e-5) for _ in range(layers)])
        self.decoder = nn.Linear(width, vocab)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.pos_drop(self.encoder(tokens) * math.sqrt(self.width) + self.pe[:t])
        mask = torch.full((t, t), float("-inf")).triu(1)
        for layer in self.layers:
            x = layer(x, mask)
        return self.decoder(x), None


class BertForMaskedLm(nn.Module):
    def __init__(self, vocab, hidden=512, layers=8, heads=8, intermediate=2048, max_positions=512, dropout=0.1):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.emb_drop = nn.Dropout(dropout)
        gelu = F.gelu
        self.layers = nn.ModuleList([PostNormLayer(hidden, heads, intermediate, dropout, gelu, 1e-12)
                                     for _ in range(layers)])
        self.transform = nn.Linear(hidden, hidden)
        self.transform_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.word(tokens) + self.position.weight[:t] + self.token_type.weight[0]
        x = self.emb_drop(self.emb_norm(x))
        for layer in self.layers:
            x = layer(x)
        x = self.transform_norm(F.gelu(self.transform(x)))
        return F.linear(x, self.word.weight, self.bias), None  # the tied decoder


def build_model(name, spec):
    classes = spec["num_classes"]
    if name in ("resnet18", "mobilenet_v3_large"):
        return TorchvisionModel(name, classes)
    if name == "pointnet_cls":
        return PointNetCls(classes)
    vocab = spec["vocabulary"] or classes
    if name == "transformer_lm":
        return TransformerLm(vocab)
    if name == "bert_medium":
        return BertForMaskedLm(vocab)
    raise SystemExit(f"no PyTorch model for {name}")


MODELS = ("resnet18", "mobilenet_v3_large", "pointnet_cls", "transformer_lm", "bert_medium")


def make_batch(name, spec, seed):
    g = torch.Generator().manual_seed(seed)
    b = spec["batch"]
    if spec["input_dtype"] == "i64":
        x = torch.randint(0, spec["vocabulary"] or spec["num_classes"], (b, *spec["input_shape"]), generator=g)
    else:
        x = torch.randn(b, *spec["input_shape"], generator=g)
    y = torch.randint(0, spec["num_classes"], (b, *spec["target_shape"]), generator=g)
    if name == "bert_medium":  # 15% of the positions scored
        y = torch.where(torch.rand(y.shape, generator=g) < 0.15, y, torch.full_like(y, -100))
    return x, y


def loss_of(out, y):
    logits, aux = out
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
    return loss if aux is None else loss + aux


def worker(args, spec):
    torch.set_num_threads(args.threads)
    r = args.worker_replicas
    optim = dict(lr=args.lr, momentum=args.momentum)
    torch.manual_seed(args.seed)
    models = [build_model(args.model, spec) for _ in range(r)]
    for m in models:
        m.train()
    x, y = make_batch(args.model, spec, args.seed)
    trainers, errors = {"serial": Serial(models, optim, loss_of)}, {}
    if FUSION_API is None:
        errors["vmap"] = "neither torch.func nor functorch"
    else:
        try:
            trainers["vmap"] = Fused(copy.deepcopy(models), optim, loss_of)
        except Exception as e:  # noqa: BLE001
            errors["vmap"] = f"{type(e).__name__}: {e}"
    for v in list(trainers):
        try:
            trainers[v].step(x, y)  # warm-up
        except Exception as e:  # noqa: BLE001
            errors[v] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            del trainers[v]
    times = {v: [] for v in trainers}
    for rep in range(args.reps):
        for v in (list(trainers) if rep % 2 == 0 else list(trainers)[::-1]):
            start = time.perf_counter()
            trainers[v].step(x, y)
            times[v].append(time.perf_counter() - start)
    out = {"errors": errors}
    for v, t in times.items():
        out[v] = {"best_samples_per_s": r * spec["batch"] / min(t),
                  "median_samples_per_s": r * spec["batch"] / statistics.median(t), "seconds": t}
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, required=True)
    p.add_argument("--loom-json", required=True, help="`loom bench fusion --json` of the same config")
    p.add_argument("--replicas", default="1,2,4")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=3, help="timed steps per variant; the fastest is reported")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker-replicas", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    spec = json.load(open(args.loom_json))
    if args.worker_replicas:
        worker(args, spec)
        return
    print(f"torch {torch.__version__}, fusion API {FUSION_API or 'none'}; {args.model}, batch {spec['batch']}/replica, "
          f"input {spec['input_dtype']} {spec['input_shape']}, {spec['num_classes']} classes, {args.threads} threads, "
          f"SGD lr {args.lr} momentum {args.momentum}, best of {args.reps} steps; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    params = sum(p.numel() for p in build_model(args.model, spec).parameters())
    result = {"model": args.model, "batch": spec["batch"], "threads": args.threads, "params": params,
              "torch_version": torch.__version__, "fusion_api": FUSION_API, "reps": args.reps,
              "loadavg_start": os.getloadavg(), "rows": []}
    print(f"parameters per replica: {params}")
    print(f"{'R':>3} {'serial smp/s':>13} {'vmap smp/s':>11} {'vmap/serial':>12}")
    for r in [int(s) for s in args.replicas.split(",")]:
        cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--loom-json", args.loom_json,
               "--threads", str(args.threads), "--reps", str(args.reps), "--lr", str(args.lr),
               "--momentum", str(args.momentum), "--seed", str(args.seed), "--worker-replicas", str(r)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"worker R={r} failed:\n{proc.stderr[-3000:]}")
        t = json.loads(proc.stdout.strip().splitlines()[-1])
        s, v = t.get("serial"), t.get("vmap")
        row = {"replicas": r, "serial_samples_per_s": s["best_samples_per_s"] if s else None,
               "vmap_samples_per_s": v["best_samples_per_s"] if v else None,
               "serial_median_samples_per_s": s["median_samples_per_s"] if s else None,
               "vmap_median_samples_per_s": v["median_samples_per_s"] if v else None, "errors": t["errors"]}
        result["rows"].append(row)
        fmt = lambda a: f"{a:.1f}" if a is not None else "n/a"  # noqa: E731
        ratio = fmt(v["best_samples_per_s"] / s["best_samples_per_s"]) if v and s else "n/a"
        print(f"{r:3d} {fmt(row['serial_samples_per_s']):>13} {fmt(row['vmap_samples_per_s']):>11} {ratio:>12}"
              + (f"  ({'; '.join(f'{k}: {e}' for k, e in t['errors'].items())})" if t["errors"] else ""), flush=True)
    result["loadavg_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
