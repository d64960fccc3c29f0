#!/usr/bin/env python3
"""The Flax example's jitted step against the Trainer, paired in one run (issue 50, item 7).

Runs examples/flax_ensemble (apply_model and update_model written with value_and_grad, vmap and optim, jitted
inside pmap) and mnist_ensemble --model flax-cnn (the built-in Trainer) on the same data, seed and flags,
alternating them round after round so that load falls on both alike, for each members x devices
configuration. Reports the median model-images/s of each (one epoch over --train-limit images; the first
step, the trace, is inside the timing of both), their ratio, and what flax_ensemble's jit counted in the last
round: Arrays allocated inside a replayed step besides its results (the target is 0) and the results' own.

  python3 bench/run_flax_bench.py [--build build/default] [--data data/mnist] [--configs 1x1,4x2]
                                  [--precisions fp32,bf16] [--rounds 3] [--train-limit 12800]

Each configuration runs at each precision (--precision of both programs: bf16 rounds the products' operands
and sums in fp32; it needs AVX512_BF16). Only the Python standard library is needed.
"""
import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.platform()}"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def run(cmd):
    """Runs one program; returns (model-images/s, its stdout)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as t:
        path = t.name
    try:
        out = subprocess.run(cmd + ["--metrics-json", path], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"run_flax_bench: {shlex.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
        with open(path) as f:
            return json.load(f)["final"]["model_images_per_second"], out.stdout
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build", "default"))
    ap.add_argument("--data", default=os.path.join(REPO, "data", "mnist"))
    ap.add_argument("--configs", default="1x1,4x2", help="members x devices, comma-separated")
    ap.add_argument("--precisions", default="fp32,bf16", help="fp32 and/or bf16, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-limit", type=int, default=12800)
    a = ap.parse_args()
    flax = os.path.join(a.build, "examples", "flax_ensemble")
    trainer = os.path.join(a.build, "examples", "mnist_ensemble")
    for exe in (flax, trainer):
        if not os.access(exe, os.X_OK):
            sys.exit(f"run_flax_bench: {exe} is not built (--build names the CMake build directory)")
    if not os.path.isdir(a.data):
        sys.exit(f"run_flax_bench: --data {a.data} is not a directory (the MNIST IDX files)")
    configs = []
    for c in a.configs.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)", c.strip())
        if not m or int(m.group(1)) % int(m.group(2)) != 0:
            sys.exit(f"run_flax_bench: --configs entry '{c}' is not MEMBERSxDEVICES with members a multiple of devices")
        for p in a.precisions.split(","):
            if p.strip() not in ("fp32", "bf16"):
                sys.exit(f"run_flax_bench: --precisions entry '{p}' is not fp32 or bf16")
            configs.append((int(m.group(1)), int(m.group(2)), p.strip()))

    print(f"machine: {machine()}; load before: {loadavg()}")
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    common = ["--data", a.data, "--train-limit", str(a.train_limit), "--test-limit", "100", "--epochs", "1",
              "--seed", "0"]
    rates = {c: {"flax": [], "trainer": []} for c in configs}
    jit_lines = {}
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds} (load {loadavg()})", flush=True)
        for members, devices, precision in configs:
            flags = common + ["--members", str(members), "--devices", str(devices), "--precision", precision]
            cmd_f = [flax] + flags
            cmd_t = [trainer, "--model", "flax-cnn"] + flags
            if r == 0:
                print("  " + shlex.join(cmd_f) + "\n  " + shlex.join(cmd_t))
            rate, out = run(cmd_f)
            rates[(members, devices, precision)]["flax"].append(rate)
            jit_lines[(members, devices, precision)] = [l for l in out.splitlines() if l.startswith("jit ")]
            rates[(members, devices, precision)]["trainer"].append(run(cmd_t)[0])

    print(f"\nmedians over {a.rounds} rounds, {a.train_limit} training images, batch 128; load after: {loadavg()}")
    print(f"{'members x devices':>18} {'precision':>9} {'flax (jit) img/s':>17} {'Trainer img/s':>14} {'ratio':>7}  target")
    worst = None
    for c in configs:
        f = statistics.median(rates[c]["flax"])
        t = statistics.median(rates[c]["trainer"])
        ratio = f / t
        worst = ratio if worst is None else min(worst, ratio)
        print(f"{c[0]:>10} x {c[1]:<5} {c[2]:>9} {f:>17.0f} {t:>14.0f} {ratio:>7.2f}  >= 0.90 "
              f"{'met' if ratio >= 0.9 else 'NOT met'}")
    allocations = []
    for c in configs:
        for line in jit_lines[c]:
            print(f"{c[0]}x{c[1]} {c[2]}: {line}")
            m = re.search(r"allocated (\d+) arrays besides", line)
            if m:
                allocations.append(int(m.group(1)))
    print(f"allocations inside a replayed step besides its results: {max(allocations) if allocations else '?'} "
          f"(target 0: {'met' if allocations and max(allocations) == 0 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
