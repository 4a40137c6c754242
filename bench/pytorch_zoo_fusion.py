#!/usr/bin/env python3
"""The PyTorch side of `loom bench fusion` for zoo models (resnet18,
mobilenet_v3_large, pointnet_cls, transformer_lm, bert_medium): R replicas
trained one after another (serial) against the same R replicas fused into one
vmapped model (torch.func, or functorch on torch 1.13), in training
samples/s on the CPU or on a CUDA GPU, timed the way loom times them.

Usage (bench/zoo_fusion_vs_pytorch.sh runs it after loom on the CPU,
bench/gpu_zoo_fusion.sh on a GPU, with loom's JSON):
  PYTHON bench/pytorch_zoo_fusion.py --model NAME --loom-json LOOM.json \
      --replicas 1,2,4 --threads 1 --reps 3 [--lr 0.01 --momentum 0.9] [--json OUT]
      [--device cpu|cuda] [--precision f32|tf32|bf16[,...]] [--deadline-s S]

The model, batch, input shape, number of classes and vocabulary come from
loom's JSON (what `loom bench fusion --json` wrote for the same config), so
both sides build the same network for the same data:
  resnet18            torchvision.models.resnet18(num_classes) with the CIFAR
                      stem as loom's `stem: cifar` (conv1 3x3/1 pad 1 without
                      bias, no max-pool); torchvision (Debian's
                      /usr/bin/python3: torch 1.13 + torchvision 0.14), or
                      without it the same layers rebuilt here.
  mobilenet_v3_large  torchvision.models.mobilenet_v3_large(num_classes)
                      (dropout 0.2), or without torchvision its layers
                      rebuilt here (the same parameters).
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
Timing on the CPU, as `loom bench fusion`: per R a fresh process, one
warm-up step, then `reps` timed steps of each variant (alternating serial,
vmap, so both see the same background load); the fastest step is reported
(samples/s = R * batch / seconds), the median too.

--device cuda: models, optimizer state and the batch on the GPU (the batch
copied there once, while loom's GPU steps copy theirs from the host every
step), cudnn.benchmark on, every timed step between two
torch.cuda.synchronize(). Every R in this process (--fresh-process: each in
its own, as on the CPU; a CUDA start-up costs seconds), one variant at a
time (the other's memory freed first) and per --precision:
  f32   torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 False
  tf32  both True
  bf16  torch.autocast("cuda", dtype=torch.bfloat16) around the forward and
        the loss (TF32 off elsewhere), f32 master weights, no loss scaling
        (bf16 needs none)
two warm-up steps (cudnn.benchmark's search, autocast's casts), then
`reps` timed steps; torch.cuda.max_memory_allocated over those steps is
the variant's peak. An out-of-memory (torch.cuda.OutOfMemoryError) is
recorded as "OOM" for that R, variant and precision, and the rest goes on;
after an R where nothing fits, larger R are not tried. --deadline-s: the
wall-clock seconds this run may take; what would start after it is skipped
and said so (the JSON is rewritten after every R, so a run stopped from
outside keeps what it measured).
"""
import argparse
import copy
import gc
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
        try:
            import torchvision
        except ImportError:
            torchvision = None
        if name == "resnet18":
            net = torchvision.models.resnet18(num_classes=classes) if torchvision else ResNet18(classes)
            net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # loom's stem: cifar
            net.maxpool = nn.Identity()
        else:
            net = torchvision.models.mobilenet_v3_large(num_classes=classes) if torchvision else \
                MobileNetV3Large(classes)
        self.source = "torchvision" if torchvision else "rebuilt (no torchvision)"
        self.net = net

    def forward(self, x):
        return self.net(x), None


# torchvision's layers rebuilt (same modules, names and parameters) for a
# Python without torchvision; the initialisation does not matter here.
class BasicBlock(nn.Module):
    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False), nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, cin = (64, 128, 256, 512), 64
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w, 1)))
            cin = w
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_divisible(v, divisor=8):
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def conv_bn_act(cin, cout, kernel, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout, eps=0.001, momentum=0.01)]
    return nn.Sequential(*layers, *([act(inplace=True)] if act else []))


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        s = self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1))))
        return F.hardsigmoid(s) * x


class InvertedResidual(nn.Module):
    def __init__(self, cin, kernel, expanded, cout, se, act, stride):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        layers = [conv_bn_act(cin, expanded, 1, act=act)] if expanded != cin else []
        layers.append(conv_bn_act(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4)))
        layers.append(conv_bn_act(expanded, cout, 1))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res_connect else y


class MobileNetV3Large(nn.Module):
    SETTING = [  # torchvision's _mobilenet_v3_conf("mobilenet_v3_large"): in, kernel, expanded, out, SE, act, stride
        (16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2), (24, 3, 72, 24, False, "RE", 1),
        (24, 5, 72, 40, True, "RE", 2), (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
        (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
        (80, 3, 184, 80, False, "HS", 1), (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
        (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1), (160, 5, 960, 160, True, "HS", 1)]

    def __init__(self, classes, dropout=0.2):
        super().__init__()
        acts = {"RE": nn.ReLU, "HS": nn.Hardswish}
        layers = [conv_bn_act(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [InvertedResidual(i, k, e, o, se, acts[a], s) for i, k, e, o, se, a, s in self.SETTING]
        layers.append(conv_bn_act(160, 960, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(inplace=True),
                                        nn.Dropout(dropout, inplace=True), nn.Linear(1280, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


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
        eye = torch.eye(64, dtype=x.dtype, device=x.device)
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
        mask = torch.full((t, t), float("-inf"), device=tokens.device).triu(1)
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


# ---------------------------------------------------------------- precision (CUDA)
PRECISIONS = ("f32", "tf32", "bf16")
AUTOCAST = {"bf16": False}  # read at every forward, so one trainer serves every precision


def set_precision(precision):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    AUTOCAST["bf16"] = precision == "bf16"


class Autocast(nn.Module):
    """The model's forward under bf16 autocast while AUTOCAST["bf16"] is set."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=AUTOCAST["bf16"]):
            return self.net(x)


def autocast_loss_of(out, y):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=AUTOCAST["bf16"]):
        return loss_of(out, y)


def is_oom(e):
    oom = getattr(torch.cuda, "OutOfMemoryError", ())
    return (oom and isinstance(e, oom)) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


def short(e):
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def rates(r, batch, seconds):
    return {"best_samples_per_s": r * batch / min(seconds),
            "median_samples_per_s": r * batch / statistics.median(seconds), "seconds": seconds}


def cpu_worker(args, spec):
    """Both variants in one process, their steps alternating so that both see the same background load."""
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
            errors["vmap"] = short(e)
    for v in list(trainers):
        try:
            trainers[v].step(x, y)  # warm-up
        except Exception as e:  # noqa: BLE001
            errors[v] = short(e)
            del trainers[v]
    times = {v: [] for v in trainers}
    for rep in range(args.reps):
        for v in (list(trainers) if rep % 2 == 0 else list(trainers)[::-1]):
            start = time.perf_counter()
            trainers[v].step(x, y)
            times[v].append(time.perf_counter() - start)
    row = {"precision": "f32", "errors": errors}
    for v, t in times.items():
        row[v] = rates(r, spec["batch"], t)
    return [row]


def release(trainer):
    """Drops the gradients an interrupted step left, then the allocator's cache."""
    if trainer is not None:
        for opt in getattr(trainer, "opts", None) or [trainer.opt]:
            opt.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()


def cuda_worker(args, spec):
    """One variant at a time on the GPU (its peak memory its own), every precision in turn."""
    torch.set_num_threads(args.threads)
    torch.backends.cudnn.benchmark = True
    r, batch = args.worker_replicas, spec["batch"]
    optim = dict(lr=args.lr, momentum=args.momentum)
    torch.manual_seed(args.seed)
    models = [build_model(args.model, spec) for _ in range(r)]  # on the host; each variant copies them
    for m in models:
        m.train()
    x, y = (t.cuda() for t in make_batch(args.model, spec, args.seed))
    rows = {p: {"precision": p, "errors": {}} for p in args.precisions}
    variants = ["serial"] + (["vmap"] if FUSION_API else [])
    if not FUSION_API:
        for row in rows.values():
            row["errors"]["vmap"] = "neither torch.func nor functorch"
    for v in variants:
        trainer, failure, gpu_models = None, None, None
        try:
            gpu_models = [Autocast(copy.deepcopy(m).cuda()) for m in models]
            trainer = (Serial if v == "serial" else Fused)(gpu_models, optim, autocast_loss_of)
        except Exception as e:  # noqa: BLE001
            failure = "OOM" if is_oom(e) else short(e)
        gpu_models = None  # vmap's stacked copies replace them; an OOM's partial copies go
        for p in args.precisions:
            if failure is None and args.deadline and time.time() > args.deadline:
                failure = "skipped: time budget spent"
            if failure is not None:
                rows[p]["errors"][v] = failure
                continue
            set_precision(p)
            oom = False
            try:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                for _ in range(2):  # cudnn.benchmark's search, then a plain step
                    trainer.step(x, y)
                seconds = []
                for _ in range(args.reps):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    trainer.step(x, y)
                    torch.cuda.synchronize()
                    seconds.append(time.perf_counter() - start)
                rows[p][v] = {**rates(r, batch, seconds), "peak_bytes": torch.cuda.max_memory_allocated()}
            except Exception as e:  # noqa: BLE001
                oom = is_oom(e)
                rows[p]["errors"][v] = "OOM" if oom else short(e)
            if oom:  # outside the except block: its traceback holds the step's tensors
                release(trainer)
        trainer = None
        release(None)
    set_precision("f32")
    return [rows[p] for p in args.precisions]


def run_worker(args, r):
    """Rows (one per precision) of R = r from a fresh process; a crashed worker's rows say why."""
    cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--loom-json", args.loom_json,
           "--threads", str(args.threads), "--reps", str(args.reps), "--lr", str(args.lr),
           "--momentum", str(args.momentum), "--seed", str(args.seed), "--device", args.device,
           "--precision", ",".join(args.precisions), "--worker-replicas", str(r)]
    if args.deadline:
        cmd += ["--deadline", repr(args.deadline)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    if args.device == "cpu":
        raise SystemExit(f"worker R={r} failed:\n{proc.stderr[-3000:]}")
    last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1][:300]
    why = "OOM" if "out of memory" in proc.stderr else f"worker failed: {last}"
    return [{"precision": p, "errors": {"serial": why, "vmap": why}} for p in args.precisions]


def run_in_process(args, spec, r):
    """cuda_worker in this process: saves a CUDA start-up per R (seconds, on a GPU lent for minutes)."""
    args.worker_replicas = r
    try:
        return cuda_worker(args, spec)
    except Exception as e:  # noqa: BLE001
        why = "OOM" if is_oom(e) else short(e)
        return [{"precision": q, "errors": {"serial": why, "vmap": why}} for q in args.precisions]
    finally:
        args.worker_replicas = None
        release(None)


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
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", default="f32",
                   help="f32, tf32 or bf16, or a comma-separated list of them (tf32 and bf16: --device cuda only)")
    p.add_argument("--deadline-s", type=float, help="wall-clock seconds for the whole run; later work is skipped")
    p.add_argument("--fresh-process", action="store_true",
                   help="--device cuda: each R in a fresh process, as on the CPU (default: all R in this one)")
    p.add_argument("--json", help="write the results here (rewritten after every R)")
    p.add_argument("--worker-replicas", type=int, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # absolute time.time()
    args = p.parse_args()
    args.precisions = args.precision.split(",")
    if any(q not in PRECISIONS for q in args.precisions):
        p.error(f"--precision: each of {args.precision!r} must be one of {', '.join(PRECISIONS)}")
    if args.device == "cpu" and args.precisions != ["f32"]:
        p.error("--precision tf32 and bf16 need --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    if args.deadline_s is not None and not args.deadline:
        args.deadline = time.time() + args.deadline_s
    spec = json.load(open(args.loom_json))
    if args.worker_replicas:
        print(json.dumps((cuda_worker if args.device == "cuda" else cpu_worker)(args, spec)))
        return
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{args.threads} threads"
    print(f"torch {torch.__version__}, fusion API {FUSION_API or 'none'}; {args.model}, batch {spec['batch']}/replica, "
          f"input {spec['input_dtype']} {spec['input_shape']}, {spec['num_classes']} classes, {where}, "
          f"SGD lr {args.lr} momentum {args.momentum}, best of {args.reps} steps; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    model = build_model(args.model, spec)
    params = sum(q.numel() for q in model.parameters())
    result = {"model": args.model, "batch": spec["batch"], "threads": args.threads, "params": params,
              "torch_version": torch.__version__, "fusion_api": FUSION_API, "reps": args.reps,
              "device": args.device, "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "precision": args.precisions, "model_source": getattr(model, "source", "bench/pytorch_zoo_fusion.py"),
              "loadavg_start": os.getloadavg(), "rows": []}
    print(f"parameters per replica: {params}")
    print(f"{'R':>3} {'precision':>9} {'serial smp/s':>13} {'vmap smp/s':>11} {'vmap/serial':>12}"
          f" {'serial MiB':>11} {'vmap MiB':>9}")
    fmt = lambda a, d=1: f"{a:.{d}f}" if a is not None else "n/a"  # noqa: E731
    nothing_fit = None
    for r in [int(q) for q in args.replicas.split(",")]:
        if nothing_fit is not None or (args.deadline and time.time() > args.deadline):
            why = f"skipped: nothing fit at R={nothing_fit}" if nothing_fit is not None else \
                "skipped: time budget spent"
            t = [{"precision": q, "errors": {"serial": why, "vmap": why}} for q in args.precisions]
        elif args.device == "cuda" and not args.fresh_process:
            t = run_in_process(args, spec, r)
        else:
            t = run_worker(args, r)
        for w in t:
            s, v = w.get("serial"), w.get("vmap")
            row = {"replicas": r, "precision": w["precision"],
                   "serial_samples_per_s": s["best_samples_per_s"] if s else None,
                   "vmap_samples_per_s": v["best_samples_per_s"] if v else None,
                   "serial_median_samples_per_s": s["median_samples_per_s"] if s else None,
                   "vmap_median_samples_per_s": v["median_samples_per_s"] if v else None,
                   "serial_peak_bytes": s.get("peak_bytes") if s else None,
                   "vmap_peak_bytes": v.get("peak_bytes") if v else None, "errors": w["errors"]}
            result["rows"].append(row)
            ratio = fmt(v["best_samples_per_s"] / s["best_samples_per_s"], 2) if v and s else "n/a"
            mib = lambda b: fmt(b / 2**20 if b is not None else None, 0)  # noqa: E731
            print(f"{r:3d} {w['precision']:>9} {fmt(row['serial_samples_per_s']):>13} "
                  f"{fmt(row['vmap_samples_per_s']):>11} {ratio:>12} {mib(row['serial_peak_bytes']):>11} "
                  f"{mib(row['vmap_peak_bytes']):>9}"
                  + (f"  ({'; '.join(f'{k}: {e}' for k, e in w['errors'].items())})" if w["errors"] else ""),
                  flush=True)
        if args.device == "cuda" and all(set(w["errors"].values()) == {"OOM"} and len(w["errors"]) == 2 for w in t):
            nothing_fit = r
        if args.json:
            result["loadavg_end"] = os.getloadavg()
            with open(args.json + ".tmp", "w") as f:
                json.dump(result, f, indent=1)
            os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
