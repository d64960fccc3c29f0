#!/usr/bin/env python3
"""The Flax example's jitted step against the Trainer, paired in one run (issue 50, item 7).

Runs examples/flax_ensemble (apply_model and update_model written with value_and_grad, map and optim, jitted
inside pmap) and mnist_ensemble --model flax-cnn (the built-in Trainer) on the same data, seed and flags,
alternating them round after round so that load falls on both alike, for each members x devices
configuration. Reports, as medians over the rounds:
  - the epoch's model-images/s of each (one epoch over --train-limit images; the first steps, flax's trace
    and first replay among them, are inside the timing of both) and their ratio;
  - the steps' model-images/s after the warm-up: each program also runs an epoch of --warmup-limit images,
    and the rate is the extra images over the extra seconds of the long epoch (what a longer run
    approaches), and their ratio;
and what flax_ensemble's jit counted in the last round: Arrays allocated inside a replayed step besides its
results (the target is 0) and the results' own.

  python3 bench/run_flax_bench.py [--build build/default] [--data data/mnist] [--configs 1x1,4x2]
                                  [--precisions fp32,bf16] [--rounds 3] [--train-limit 12800]
                                  [--warmup-limit 1280]

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
    """Runs one program; returns (model-images/s, the epoch's seconds, its stdout)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as t:
        path = t.name
    try:
        out = subprocess.run(cmd + ["--metrics-json", path], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"run_flax_bench: {shlex.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
        with open(path) as f:
            final = json.load(f)["final"]
            return final["model_images_per_second"], final["seconds"], out.stdout
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
    ap.add_argument("--warmup-limit", type=int, default=1280,
                    help="the short epoch's images, for the rate after the warm-up (a multiple of the batch, 128, "
                         "and at least 3 batches)")
    a = ap.parse_args()
    # At least 3 batches: the first call traces, a GPU's second captures its graph; both inside the short epoch.
    if a.warmup_limit < 3 * 128 or a.warmup_limit % 128 != 0 or a.warmup_limit >= a.train_limit:
        sys.exit(f"run_flax_bench: --warmup-limit {a.warmup_limit} must be a multiple of 128, at least 384 and "
                 f"below --train-limit {a.train_limit}")
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
    common = ["--data", a.data, "--test-limit", "100", "--epochs", "1", "--seed", "0"]
    rates = {c: {"flax": [], "trainer": []} for c in configs}
    steady = {c: {"flax": [], "trainer": []} for c in configs}
    jit_lines = {}
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds} (load {loadavg()})", flush=True)
        for members, devices, precision in configs:
            c = (members, devices, precision)
            flags = common + ["--members", str(members), "--devices", str(devices), "--precision", precision]
            for name, cmd in (("flax", [flax] + flags), ("trainer", [trainer, "--model", "flax-cnn"] + flags)):
                long_cmd = cmd + ["--train-limit", str(a.train_limit)]
                short_cmd = cmd + ["--train-limit", str(a.warmup_limit)]
                if r == 0:
                    print("  " + shlex.join(long_cmd) + "\n  " + shlex.join(short_cmd))
                rate, seconds, out = run(long_cmd)
                short_rate, short_seconds, _ = run(short_cmd)
                rates[c][name].append(rate)
                # The images each epoch trained (from its own rate: the data may hold fewer than the limit).
                extra = rate * seconds - short_rate * short_seconds
                if seconds > short_seconds and extra > 0:
                    steady[c][name].append(extra / (seconds - short_seconds))
                if name == "flax":
                    jit_lines[c] = [l for l in out.splitlines() if l.startswith("jit ")]

    print(f"\nmedians over {a.rounds} rounds, {a.train_limit} training images (the warm-up epoch "
          f"{a.warmup_limit}), batch 128; load after: {loadavg()}")
    print(f"{'':>28} {'whole epoch, model-images/s':^34}  {'after the warm-up, model-images/s':^34}")
    print(f"{'members x devices':>18} {'precision':>9} {'flax (jit)':>11} {'Trainer':>9} {'ratio':>6} {'':>6}"
          f"  {'flax (jit)':>11} {'Trainer':>9} {'ratio':>6}   target 0.90")
    for c in configs:
        f, t = statistics.median(rates[c]["flax"]), statistics.median(rates[c]["trainer"])
        if steady[c]["flax"] and steady[c]["trainer"]:
            fs, ts = statistics.median(steady[c]["flax"]), statistics.median(steady[c]["trainer"])
            after = f"{fs:>11.0f} {ts:>9.0f} {fs / ts:>6.2f}"
            verdict = "met" if fs / ts >= 0.9 else "NOT met"
        else:  # the long epoch was not longer (too little data, or noise): no rate to give
            after, verdict = f"{'n/a':>11} {'n/a':>9} {'n/a':>6}", "n/a (the long epoch took no longer)"
        print(f"{c[0]:>10} x {c[1]:<5} {c[2]:>9} {f:>11.0f} {t:>9.0f} {f / t:>6.2f} {'':>6}  {after}   "
              f"epoch {'met' if f / t >= 0.9 else 'NOT met'}, after warm-up {verdict}")
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
