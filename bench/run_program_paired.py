#!/usr/bin/env python3
"""Paired program benchmark: two mnist_ensemble binaries (an old commit's and a new one's) on the same runs.

Each round trains every configuration (members x devices x precision) once with each binary, the two in
alternating order from round to round, so that a shared machine's changes of speed fall on both alike.
A run is one epoch of the Flax CNN (--train-limit examples, batch 128) whose training speed the program
records in its metrics JSON (model-images per second, evaluation excluded). Reports per configuration the
medians over the rounds of each binary's images/s and of the per-round ratio new/old, its range, and
flags the rows below --min-ratio. Prints the machine, the commands and the table, and writes everything to
bench/results/program-paired-<date>.json.

  python3 bench/run_program_paired.py --old OLD/mnist_ensemble --new build/default/examples/mnist_ensemble
                                      [--data data/mnist] [--rounds 5] [--members 1,2,4,8] [--devices 1,2]
                                      [--precision fp32,bf16] [--train-limit 3840] [--quick] [--out PATH]

bf16 rows need a CPU with AVX512_BF16; elsewhere they are listed as not run. Only the Python standard
library is needed.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message, code=2):
    print(f"run_program_paired.py: error: {message}", file=sys.stderr)
    sys.exit(code)


def int_list(flag, text):
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        fail(f"{flag} {text!r}: expected comma-separated positive integers")
    if not values or any(v < 1 for v in values):
        fail(f"{flag} {text!r}: expected comma-separated positive integers")
    return values


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the old commit's mnist_ensemble")
    ap.add_argument("--new", required=True, help="the new commit's mnist_ensemble")
    ap.add_argument("--data", default=os.path.join(REPO, "data", "mnist"), help="raw MNIST IDX files")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--members", default="1,2,4,8")
    ap.add_argument("--devices", default="1,2")
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--train-limit", type=int, default=3840, help="training examples an epoch (batch 128)")
    ap.add_argument("--test-limit", type=int, default=500)
    ap.add_argument("--min-ratio", type=float, default=0.95, help="rows below this new/old ratio are flagged")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 round, 256 examples, batch 64")
    ap.add_argument("--out", default="", help="the JSON record (default bench/results/program-paired-<date>.json)")
    a = ap.parse_args()
    a.members_list = int_list("--members", a.members)
    a.devices_list = int_list("--devices", a.devices)
    a.precisions = [p for p in a.precision.split(",") if p]
    for p in a.precisions:
        if p not in ("fp32", "bf16"):
            fail(f"--precision {p!r}: expected fp32 and/or bf16")
    if a.rounds < 1:
        fail(f"--rounds {a.rounds}: at least 1")

    for flag, path in (("--old", a.old), ("--new", a.new)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            fail(f"{flag} {path}: not an executable file")
    if not os.path.isfile(os.path.join(a.data, "train-images-idx3-ubyte")):
        fail(f"--data {a.data}: no train-images-idx3-ubyte there (scripts/get_data.sh)")
    if a.quick:
        a.rounds, a.train_limit, a.test_limit = 1, 256, 100
    elif a.train_limit < 128:
        fail(f"--train-limit {a.train_limit}: at least one batch of 128")
    return a


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def machine():
    info = {"cores": os.cpu_count(), "platform": platform.platform(),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        info["cpu_model"] = platform.processor()
    flags = cpu_flags()
    info["simd_flags"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if f in flags]
    return info


def command(a, exe, members, devices, precision, metrics):
    batch = 64 if a.quick else 128
    return [exe, "--data", a.data, "--members", str(members), "--devices", str(devices), "--epochs", "1",
            "--batch-size", str(batch), "--train-limit", str(a.train_limit), "--test-limit", str(a.test_limit),
            "--precision", precision, "--progress", "none", "--no-summary", "--metrics-json", metrics]


def run_once(cmd, metrics):
    if os.path.exists(metrics):
        os.remove(metrics)  # a run that writes none must not report the previous run's number
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        fail(f"{' '.join(cmd)} exited {done.returncode}:\n{tail}", 1)
    with open(metrics) as f:
        return json.load(f)["epochs"][-1]["model_images_per_second"]


def main():
    a = parse_args()
    bf16 = "avx512_bf16" in cpu_flags()
    configs, skipped = [], []
    for precision in a.precisions:
        for devices in a.devices_list:
            for members in a.members_list:
                if members % devices:
                    continue  # every device runs the same number of members
                if precision == "bf16" and not bf16:
                    skipped.append((members, devices, precision))
                    continue
                configs.append((members, devices, precision))
    info = machine()
    print(f"machine: {info.get('cpu_model')}, {info['cores']} cores, {' '.join(info['simd_flags'])}; "
          f"OPENBLAS_CORETYPE={info['openblas_coretype'] or 'unset'}")
    print(f"old: {a.old}\nnew: {a.new}")
    print(f"{a.rounds} round(s) of {len(configs)} configuration(s) x 2 binaries; one epoch of "
          f"{a.train_limit} examples each", flush=True)
    runs = {c: {"old": [], "new": []} for c in configs}
    commands = {}
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.json")
        for r in range(a.rounds):
            for c in configs:
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for which in order:
                    cmd = command(a, a.old if which == "old" else a.new, *c, metrics)
                    commands.setdefault(c, {})[which] = " ".join(cmd)
                    runs[c][which].append(run_once(cmd, metrics))
            print(f"round {r + 1}/{a.rounds} done", flush=True)
    rows = []
    lines = ["| members | devices | precision | old img/s | new img/s | new/old (median) | range |",
             "|---:|---:|---|---:|---:|---:|---|"]
    for c in configs:
        old, new = runs[c]["old"], runs[c]["new"]
        ratios = [n / o for n, o in zip(new, old) if o > 0]
        if not ratios:
            fail(f"{c}: the old binary reported no training speed (0 images/s) in every round", 1)
        ratio = statistics.median(ratios)
        low = ratio < a.min_ratio
        rows.append({"members": c[0], "devices": c[1], "precision": c[2], "old": old, "new": new,
                     "ratios": ratios, "median_ratio": ratio, "below_min": low, "commands": commands[c]})
        lines.append(f"| {c[0]} | {c[1]} | {c[2]} | {statistics.median(old):.0f} | {statistics.median(new):.0f} | "
                     f"{ratio:.3f}{' (below ' + str(a.min_ratio) + ')' if low else ''} | "
                     f"{min(ratios):.2f}-{max(ratios):.2f} |")
    for m, d, p in skipped:
        lines.append(f"| {m} | {d} | {p} | not run: this CPU lacks AVX512_BF16 | | | |")
    table = "\n".join(lines)
    print("\n" + table)
    out = a.out or os.path.join(REPO, "bench", "results",
                                "program-paired-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ".json")
    record = {"machine": info, "date": datetime.datetime.now().isoformat(timespec="seconds"), "old": a.old,
              "new": a.new, "rounds": a.rounds, "train_limit": a.train_limit, "rows": rows,
              "table_markdown": table}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=2)
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
