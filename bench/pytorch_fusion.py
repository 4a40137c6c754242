#!/usr/bin/env python3
"""The PyTorch side of the horizontal-fusion (HFTA-style) benchmark: training R
replicas of loom's zoo MLP or CNN one after another against the same R
replicas fused into one vmapped model, in training samples/s on the CPU.

Usage:
  /opt/torchbench/bin/python bench/pytorch_fusion.py --model mlp|cnn \
      --replicas 1,2,4,8,16 --batch 128 --threads 2 --steps 20 --warmup 3 \
      [--repeats 5] [--check] [--json OUT.json]

Models: the `mlp` and `cnn` builders of bench/pytorch_train.py (imported, so
the layers are the same as in loom's models/mlp.cc, models/cnn.cc and the
models/configs/fashion_mnist_{mlp,cnn}.pbtxt configs). The optimizer follows
those configs: SGD lr 0.05 momentum 0.9 for the MLP; for the CNN also Nesterov
and weight decay 5e-4. Input is synthetic: a few fixed-seed random batches of
Fashion-MNIST shape (1x28x28 float, labels in 0..9), cycled; the data source
does not matter for throughput.

For each R it measures two variants:
  serial  R separate models (own parameters, same architecture, own SGD
          optimizer); one step = for each replica: zero_grad, forward,
          cross-entropy, backward, optimizer.step.
  vmap    the R models fused with torch.func: parameters and buffers stacked
          with stack_module_state, forward = functional_call under torch.vmap
          (in_dims=0 over the stacked parameters and buffers, None for the
          shared batch), loss = sum of the R replicas' mean cross-entropies,
          one backward, one torch.optim.SGD step over the stacked tensors
          (SGD's momentum, Nesterov and weight decay are elementwise, so this
          is exactly R independent optimizers with the same hyperparameters;
          no per-replica learning rates are used).
Both variants give every replica the same batch each step (vmap shares it),
so both do the same arithmetic. samples/s = R * batch * steps / seconds, after
`warmup` steps, the median over `repeats` timed windows of `steps` steps. Each
R runs in a fresh process holding both variants, whose timed windows alternate
(serial, vmap, vmap, serial, ...) so that both see the same background load.
The peak RSS of each variant (VmHWM, torch's own ~0.7 GB included) comes from
a separate short process per variant that runs only its warm-up steps. The
JSON also holds every repeat's rate and the best one: on a loaded machine the
2-thread OpenMP regions slow down by 10-70x when another process takes a
core, and the best window is the most robust estimate.

BatchNorm (CNN): the running mean/var/num_batches_tracked buffers are stacked
like the parameters and vmapped over with in_dims=0, so each replica updates
its own running statistics in place under vmap, as the serial models do.
replace_all_batch_norm_modules_ is NOT used: it turns off the running-stat
tracking and would make the fused variant do less work than the serial one.
Dropout (CNN) runs under vmap with randomness="different" (an independent
mask per replica, like separate models).

--check: from identical initial parameters (vmap stacks copies of the serial
models), runs one step of both variants on the same batch with dropout
switched off (masks cannot match) and BatchNorm in training mode, and
compares each replica's parameters and BatchNorm buffers: the error of a
tensor is max|vmap - serial| / max|serial|, and the check passes when every
error is <= 1e-5 (exit status 1 otherwise). It then prints the error after 3
steps for information only: from step 2 on, rounding-level differences flip
max-pool/ReLU choices in the CNN and grow to ~1e-3 (two serial runs whose
parameters differ by 1e-7 relative diverge as much), so that is not checked.

Python: needs torch.func (PyTorch >= 2.0, e.g. /opt/torchbench). With an
older torch that has functorch (Debian's torch 1.13), functorch's
combine_state_for_ensemble/vmap are used instead; without either, only the
serial variant is measured and the vmap column says why.
The machine's load average is recorded with the results: on a shared machine
the numbers are noisy.
"""
import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_train import cnn, mlp  # noqa: E402  (the same layers as the plain benchmark)

try:  # PyTorch >= 2.0
    from torch.func import functional_call, stack_module_state, vmap
    FUSION_API = "torch.func"
except ImportError:
    try:  # PyTorch 1.13 with functorch
        import functorch
        from functorch import vmap
        FUSION_API = "functorch"
    except ImportError:
        FUSION_API = None

BUILDERS = {"mlp": mlp, "cnn": cnn}
OPTIM = {  # models/configs/fashion_mnist_{mlp,cnn}.pbtxt
    "mlp": dict(lr=0.05, momentum=0.9),
    "cnn": dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4),
}
NUM_BATCHES = 4  # distinct synthetic batches, cycled


def make_models(model, replicas, seed):
    torch.manual_seed(seed)
    models = [BUILDERS[model]() for _ in range(replicas)]
    for m in models:
        m.train()
    return models


def make_batches(batch, seed):
    g = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(NUM_BATCHES)]


def disable_dropout(models):
    for m in models:
        for mod in m.modules():
            if isinstance(mod, nn.Dropout):
                mod.eval()


class Serial:
    """R models, R optimizers, trained one after another; loss_fn(output, y)."""

    def __init__(self, models, optim, loss_fn=F.cross_entropy):
        self.models = models
        self.loss_fn = loss_fn
        self.opts = [torch.optim.SGD(m.parameters(), **optim) for m in models]

    def step(self, x, y):
        for m, opt in zip(self.models, self.opts):
            opt.zero_grad(set_to_none=True)
            self.loss_fn(m(x), y).backward()
            opt.step()

    def state(self, r):
        m = self.models[r]
        return {**{k: v.detach() for k, v in m.named_parameters()},
                **{k: v for k, v in m.named_buffers()}}


class Fused:
    """The R models stacked and trained as one vmapped model with one optimizer."""

    def __init__(self, models, optim, loss_fn=F.cross_entropy):
        if FUSION_API == "torch.func":
            self.params, self.buffers = stack_module_state(models)  # leaves that require grad
            base = copy.deepcopy(models[0]).to("meta")

            def loss(params, buffers, x, y):
                return loss_fn(functional_call(base, (params, buffers), (x,)), y)
        else:
            fmodel, params, buffers = functorch.combine_state_for_ensemble(models)
            names = [k for k, _ in models[0].named_parameters()]
            bnames = [k for k, _ in models[0].named_buffers()]
            self.params = {k: p.detach().clone().requires_grad_() for k, p in zip(names, params)}
            self.buffers = {k: b.clone() for k, b in zip(bnames, buffers)}

            def loss(params, buffers, x, y):
                return loss_fn(fmodel(tuple(params[k] for k in names), tuple(buffers[k] for k in bnames), x), y)

        self.loss = vmap(loss, in_dims=(0, 0, None, None), randomness="different")
        self.opt = torch.optim.SGD(self.params.values(), **optim)

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.params, self.buffers, x, y).sum().backward()
        self.opt.step()

    def state(self, r):
        return {**{k: v[r].detach() for k, v in self.params.items()},
                **{k: v[r] for k, v in self.buffers.items()}}


def build(variant, model, replicas, seed):
    models = make_models(model, replicas, seed)
    return (Serial if variant == "serial" else Fused)(models, OPTIM[model])


def peak_rss_mb():
    # VmHWM is this address space's high-water mark; ru_maxrss would not do in
    # a worker, as it keeps the parent's peak across fork and exec.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # KiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def worker(args):
    """One R in a fresh process; prints one JSON line.

    --worker time: builds both variants and times them in alternating windows
    (serial, vmap, vmap, serial, ...), so that both see the same background
    load; --worker serial|vmap: only the warm-up steps of that variant, for
    its peak RSS.
    """
    torch.set_num_threads(args.threads)
    replicas = args.worker_replicas
    batches = make_batches(args.batch, args.seed)
    variants = ["serial", "vmap"] if args.worker == "time" else [args.worker]
    if FUSION_API is None and "vmap" in variants:
        variants.remove("vmap")
    trainers = {v: build(v, args.model, replicas, args.seed) for v in variants}
    for v in variants:
        for i in range(max(args.warmup, 2)):
            trainers[v].step(*batches[i % NUM_BATCHES])
    if args.worker != "time":
        print(json.dumps({"peak_rss_mb": peak_rss_mb()}))
        return
    rates = {v: [] for v in variants}
    i = 0
    for rep in range(args.repeats):
        for v in (variants if rep % 2 == 0 else variants[::-1]):
            start = time.perf_counter()
            for _ in range(args.steps):
                trainers[v].step(*batches[i % NUM_BATCHES])
                i += 1
            rates[v].append(replicas * args.batch * args.steps / (time.perf_counter() - start))
    print(json.dumps({v: {"samples_per_s": statistics.median(r), "repeats": r} for v, r in rates.items()}))


def check(args):
    """vmap against serial from identical initial parameters; returns (ok, text)."""
    if FUSION_API is None:
        return None, "skipped: neither torch.func nor functorch is available"
    torch.set_num_threads(args.threads)
    replicas = min(max(int(r) for r in args.replicas.split(",")), 4)
    models = make_models(args.model, replicas, args.seed)
    disable_dropout(models)
    serial = Serial(models, OPTIM[args.model])
    fused = Fused(copy.deepcopy(models), OPTIM[args.model])  # copies made before any step
    batches = make_batches(args.batch, args.seed)
    ok, lines = False, []
    done = 0
    for upto in (1, 3):
        while done < upto:
            serial.step(*batches[done % NUM_BATCHES])
            fused.step(*batches[done % NUM_BATCHES])
            done += 1
        worst, where = 0.0, ""
        for r in range(replicas):
            a, b = fused.state(r), serial.state(r)
            for k in b:
                ref = b[k].double()
                err = float((a[k].double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                if err > worst:
                    worst, where = err, f"replica {r} {k}"
        if upto == 1:
            ok = worst <= 1e-5
            verdict = "PASS" if ok else "FAIL"
        else:
            verdict = "information only (rounding differences are amplified from step 2 on)"
        lines.append(f"after {upto} step(s), {replicas} replicas: max relative error {worst:.2e}"
                     f" ({where or 'all equal'}) -> {verdict}")
    return ok, "\n".join(lines)


def run_worker(args, variant, replicas):
    cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--batch", str(args.batch),
           "--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--repeats", str(args.repeats), "--seed", str(args.seed), "--replicas", str(replicas),
           "--worker", variant, "--worker-replicas", str(replicas)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(BUILDERS), required=True)
    p.add_argument("--replicas", default="1,2,4,8,16", help="comma-separated list of R")
    p.add_argument("--batch", type=int, default=128, help="samples per replica per step")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="steps per timed repeat")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="also check vmap against serial first")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", choices=["time", "serial", "vmap"], help=argparse.SUPPRESS)
    p.add_argument("--worker-replicas", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    result = {"model": args.model, "batch": args.batch, "threads": args.threads,
              "torch_version": torch.__version__, "fusion_api": FUSION_API, "steps": args.steps,
              "warmup": args.warmup, "repeats": args.repeats, "optimizer": OPTIM[args.model],
              "loadavg_start": os.getloadavg()}
    print(f"torch {torch.__version__}, fusion API: {FUSION_API or 'none'}; model {args.model}, "
          f"batch {args.batch}/replica, {args.threads} threads, {args.steps} steps x {args.repeats} "
          f"repeats after {args.warmup} warm-up; load average {os.getloadavg()[0]:.2f}")
    if FUSION_API is None:
        print("note: torch.func and functorch are both missing; only the serial variant is measured")
    if args.check:
        ok, text = check(args)
        print("check (vmap vs serial):\n  " + text.replace("\n", "\n  "))
        result["check"] = {"passed": ok, "detail": text}

    rows = []
    print(f"{'R':>3} {'serial samples/s':>17} {'vmap samples/s':>15} {'vmap/serial':>12}"
          f" {'serial RSS MB':>14} {'vmap RSS MB':>12}")
    for r in [int(s) for s in args.replicas.split(",")]:
        t = run_worker(args, "time", r)
        s, v = t["serial"], t.get("vmap")
        s_rss = run_worker(args, "serial", r)["peak_rss_mb"]
        v_rss = run_worker(args, "vmap", r)["peak_rss_mb"] if v else None
        row = {"replicas": r, "serial_samples_per_s": s["samples_per_s"],
               "vmap_samples_per_s": v["samples_per_s"] if v else None,
               "serial_peak_rss_mb": s_rss, "vmap_peak_rss_mb": v_rss,
               "serial_best_samples_per_s": max(s["repeats"]),
               "vmap_best_samples_per_s": max(v["repeats"]) if v else None,
               "serial_repeats": s["repeats"], "vmap_repeats": v["repeats"] if v else None}
        rows.append(row)
        vs = f"{v['samples_per_s']:15.0f} {v['samples_per_s'] / s['samples_per_s']:12.2f}" if v else \
            f"{'n/a':>15} {'n/a':>12}"
        vr = f"{v_rss:12.0f}" if v else f"{'n/a':>12}"
        print(f"{r:3d} {s['samples_per_s']:17.0f} {vs} {s_rss:14.0f} {vr}", flush=True)
    result["rows"] = rows
    result["loadavg_end"] = os.getloadavg()
    print(f"load average at the end {os.getloadavg()[0]:.2f} (shared machine: the numbers are noisy)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.check and result["check"]["passed"] is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
