#!/usr/bin/env python3
"""Side-by-side training benchmark: pmapcc's bench_train against the PyTorch reference, in one run.

Trains the Flax MNIST CNN (batch 128) for a fixed number of steps on real MNIST for members x devices
configurations, interleaving our runs with PyTorch's (bench/torch_flax_cnn.py, its loop and vmap modes with
1 and 2 threads) and with the fp32 GEMM rate of our kernels (1 and 2 threads), round
after round, so that load on a shared machine falls on all of them alike. Reports medians over the rounds:
model-images/s, the ratio to PyTorch's best configuration for the same member count, a roofline column
(FLOPs per image x images/s against this machine's fp32 peak, which bench_peak measures at the start, and
against our own sgemm), and peak RSS against the memory budget. With several --isa variants (e.g.
--isa avx2,avx512) or precisions (--precision fp32,bf16) every configuration runs with each combination in
every round, and a second table gives each one's speed over the first's; with bf16, PyTorch also runs under
torch.autocast(bfloat16), and a bf16 row's ratio is to PyTorch's best in bf16. Each round also times every
product layer alone per variant (bench_train layers), for the GEMM-bound layers' share of the peak. Prints
the tables and writes everything (machine, commit, date, commands, every run) to bench/results/*.json.

  python3 bench/run_train_bench.py --data data/mnist [--build build] [--runs 5] [--steps 20] [--quick]
                                   [--isa avx2,avx512] [--precision fp32,bf16] [--no-torch]
                                   [--model keras-convnet] [--baseline OLD/bench/bench_train] [--no-kernels]

With --baseline (a bench_train built at another commit, e.g. the one before a change), every one of our
training runs is paired with the same command run by that binary, the two in alternating order from round to
round, and a further table gives each row's median new / old ratio per round, its range, rows under
--min-ratio flagged, and whether the two trained to the same final loss in every round (bitwise). With
--trajectory K as well, each row is trained by both binaries in runs of 1, 2, ..., K steps (no warm-up) and a
last table compares the two binaries' mean training losses run by run (bench_train reports no per-step loss).

Only the Python standard library is needed; PyTorch runs under --torch-python (Debian's python3-torch).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "data", "mnist"), help="raw MNIST IDX files")
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="CMake build dir with bench/bench_train")
    ap.add_argument("--runs", type=int, default=5, help="rounds; medians are taken over them")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them (PyTorch: 1)")
    ap.add_argument("--members", default="1,2,4,8")
    ap.add_argument("--devices", default="1,2")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 run, 3 steps, 1 warm-up")
    ap.add_argument("--isa", default="",
                    help="our CPU kernels' ISA variant(s), comma-separated (generic|avx2|avx512; default: auto)")
    ap.add_argument("--precision", default="fp32",
                    help="our conv and dense products' precision(s), comma-separated (fp32|bf16); bf16 also runs "
                         "PyTorch under autocast bf16")
    ap.add_argument("--pin", action="store_true", help="pin our device threads to cores")
    ap.add_argument("--cpu-threads", default="1",
                    help="threads per device for our CPU ops' products (bench_train --cpu-threads): a count, or "
                         "'auto' for the cores divided by the row's devices (one device on two cores: 2)")
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--torch-script", default=os.path.join(REPO, "bench", "torch_flax_cnn.py"))
    ap.add_argument("--torch-threads", default="1,2")
    ap.add_argument("--torch-modes", default="loop,vmap")
    ap.add_argument("--torch-coretype", default=os.environ.get("OPENBLAS_CORETYPE", "unset"),
                    help="OPENBLAS_CORETYPE value(s) for PyTorch, comma-separated ('unset' removes it; default: "
                         "this environment's); e.g. Haswell,unset runs the anchor both ways")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--paired-rounds", type=int, default=21,
                    help="rounds of the paired 1-member vs most-members comparison on one device (0: skip)")
    ap.add_argument("--model", default="flax-cnn", choices=["flax-cnn", "keras-convnet"],
                    help="the model trained (bench_train --model); PyTorch's anchor is the Flax CNN, so it runs "
                         "with flax-cnn only")
    ap.add_argument("--baseline", default="",
                    help="another build's bench_train: each of our training runs is paired with it (see above)")
    ap.add_argument("--min-ratio", type=float, default=0.95, help="--baseline rows under this new/old are flagged")
    ap.add_argument("--trajectory", type=int, default=0,
                    help="with --baseline: compare the two binaries' losses in runs of 1 to this many steps per row")
    ap.add_argument("--no-kernels", action="store_true", help="skip the sgemm and per-layer timings of each round")
    ap.add_argument("--out", default="", help="JSON path (default bench/results/train-<date>.json)")
    a = ap.parse_args()
    if a.quick:
        a.runs, a.steps, a.warmup = 1, 3, 1
        a.paired_rounds = min(a.paired_rounds, 3)
    a.isas = [v for v in a.isa.split(",") if v] or ["auto"]
    for v in a.isas:
        if v not in ("auto", "generic", "avx2", "avx512"):
            ap.error(f"--isa: unknown variant '{v}' (expected generic, avx2 or avx512)")
    if a.cpu_threads != "auto" and not (a.cpu_threads.isdigit() and 1 <= int(a.cpu_threads) <= 64):
        ap.error(f"--cpu-threads: '{a.cpu_threads}' is not a thread count (expected 1 to 64, or auto)")
    a.precisions = [v for v in a.precision.split(",") if v] or ["fp32"]
    for v in a.precisions:
        if v not in ("fp32", "bf16"):
            ap.error(f"--precision: unknown precision '{v}' (expected fp32 or bf16)")
    # Every (ISA, precision) pair, the first one the baseline of the ratio table.
    # bf16 runs on the avx512 variant only (and auto, which picks it where the CPU has bf16).
    a.variants = [(isa, p) for isa in a.isas for p in a.precisions if p == "fp32" or isa in ("auto", "avx512")]
    a.autocasts = ["off"] + (["bf16"] if "bf16" in a.precisions else [])
    a.coretypes = [v for v in a.torch_coretype.split(",") if v] or ["unset"]
    if a.model != "flax-cnn":
        a.no_torch = True
    if a.baseline and not (os.path.isfile(a.baseline) and os.access(a.baseline, os.X_OK)):
        ap.error(f"--baseline: '{a.baseline}' is not an executable file (expected another build's bench_train)")
    if a.trajectory < 0 or (a.trajectory and not a.baseline):
        ap.error(f"--trajectory {a.trajectory}: expected a positive step count, with --baseline")
    return a


def ints(text):
    return [int(v) for v in text.split(",") if v]


def machine():
    info = {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        model = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")), "?")
        flags = next((l.split(":", 1)[1].split() for l in lines if l.startswith("flags")), [])
        info["cpu_model"] = model
        info["simd_flags"] = [f for f in ("sse2", "avx", "avx2", "fma", "avx512f") if f in flags]
        info["cpu_flags"] = " ".join(flags)
    except OSError:
        info["cpu_model"] = platform.processor()
    try:
        info["compiler"] = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        pass
    return info


def git(*args):
    try:
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(v) for v in f.read().split()[:3]]
    except OSError:
        return []


def small_test_dir(data, tmp):
    """The training files linked, the test files cut to their first 1000 examples: PyTorch's script evaluates
    the whole test set after timing, which costs minutes and measures nothing here."""
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        os.symlink(os.path.abspath(os.path.join(data, name)), os.path.join(tmp, name))
    for name, header in (("t10k-images-idx3-ubyte", 16), ("t10k-labels-idx1-ubyte", 8)):
        with open(os.path.join(data, name), "rb") as f:
            raw = f.read()
        dims = list(struct.unpack(">" + "I" * ((header - 4) // 4), raw[4:header]))
        per_example = 1
        for d in dims[1:]:
            per_example *= d
        dims[0] = min(dims[0], 1000)
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(raw[:4] + struct.pack(">" + "I" * len(dims), *dims) + raw[header:header + dims[0] * per_example])
    return tmp


def run_child(cmd, env=None):
    """Runs cmd; returns (its last JSON line or None, the child's peak RSS in MB, error text)."""
    with tempfile.TemporaryFile(mode="w+") as errfile:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errfile, text=True, env=env)
        out = p.stdout.read()
        p.stdout.close()
        _, status, usage = os.wait4(p.pid, 0)  # reaps the child with its own resource usage
        p.returncode = os.waitstatus_to_exitcode(status)
        errfile.seek(0)
        err = errfile.read()
    rss_mb = usage.ru_maxrss * 1024 / 1e6  # kB on Linux
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, rss_mb, (err or out)[-400:]
    return json.loads(lines[-1]), rss_mb, ""


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def cpu_threads(a, devices):
    """Our threads per device in a row with `devices` devices (--cpu-threads)."""
    return max(1, (os.cpu_count() or 1) // devices) if a.cpu_threads == "auto" else int(a.cpu_threads)


class Bench:
    def __init__(self, a):
        self.a = a
        self.exe = os.path.join(a.build, "bench", "bench_train")
        self.commands = {}
        self.runs = []  # every measurement: {"what", "config", "result" | "error", "rss_mb", "round"}

    def record(self, what, config, cmd, env_note, rnd, env=None):
        self.commands.setdefault(what + " " + json.dumps(config, sort_keys=True), env_note + shlex.join(cmd))
        result, rss, error = run_child(cmd, env)
        entry = {"what": what, "config": config, "round": rnd, "child_peak_rss_mb": rss}
        if result is None:
            entry["error"] = error
            print(f"  {what} {config}: FAILED {error.strip().splitlines()[-1] if error.strip() else ''}", flush=True)
        else:
            entry["result"] = result
        self.runs.append(entry)
        return result

    def train_cmd(self, exe, members, devices, isa, precision, steps, warmup):
        """bench_train train for one row (the mode from the member and device counts)."""
        mode = "data-parallel" if members < devices else "ensemble"
        cmd = [exe, "train", "--data", self.a.data, "--members", str(members), "--devices", str(devices),
               "--mode", mode, "--steps", str(steps), "--warmup", str(warmup)]
        if self.a.model != "flax-cnn":
            cmd += ["--model", self.a.model]
        if isa != "auto":
            cmd += ["--isa", isa]
        if precision != "fp32":
            cmd += ["--precision", precision]
        if self.a.pin:
            cmd += ["--pin"]
        return cmd + ["--cpu-threads", str(cpu_threads(self.a, devices))]

    def ours(self, members, devices, isa, precision, rnd):
        mode = "data-parallel" if members < devices else "ensemble"
        threads = cpu_threads(self.a, devices)
        cmd = self.train_cmd(self.exe, members, devices, isa, precision, self.a.steps, self.a.warmup)
        config = {"members": members, "devices": devices, "mode": mode, "isa": isa, "precision": precision}
        # With a baseline the two run back to back, the baseline first in odd rounds: load drifting over a
        # round falls on both alike.
        sides = [("pmapcc", self.exe)] + ([("baseline", self.a.baseline)] if self.a.baseline else [])
        for what, exe in (sides if rnd % 2 == 0 else sides[::-1]):
            r = self.record(what, config, [exe] + cmd[1:], "", rnd)
            if r:
                print(f"  {what:8s} m={members} d={devices} {mode:13s} {r['isa']:7s} {precision} t={threads} "
                      f"{r['model_images_per_s']:8.1f} img/s  {r['gflops']:5.1f} GFLOP/s  "
                      f"RSS {r['peak_rss_mb']:.0f} MB", flush=True)

    def sgemm(self, threads, isa, rnd):
        cmd = [self.exe, "sgemm", "--threads", str(threads)] + (["--reps", "3"] if self.a.quick else [])
        if isa != "auto":
            cmd += ["--isa", isa]
        r = self.record("sgemm", {"threads": threads, "isa": isa}, cmd, "", rnd)
        if r:
            print(f"  sgemm   t={threads} {isa:7s} {r['gflops']:6.1f} GFLOP/s (best round {r['best_gflops']:.1f})",
                  flush=True)

    def layers(self, isa, precision, rnd):
        """Each product layer's ops timed alone (bench_train layers): the rate of the GEMM-bound layers."""
        cmd = [self.exe, "layers", "--batch", "128"] + (["--reps", "3"] if self.a.quick else [])
        if isa != "auto":
            cmd += ["--isa", isa]
        if precision != "fp32":
            cmd += ["--precision", precision]
        r = self.record("layers", {"isa": isa, "precision": precision}, cmd, "", rnd)
        if r:
            print(f"  layers  {isa:7s} {precision} " + ", ".join(
                f"{l['layer']} {l['forward_gflops']:.0f}/{l['backward_gflops']:.0f}" for l in r["layers"]) +
                  " GFLOP/s (forward/backward)", flush=True)

    def peak(self):
        """This machine's fp32 peak per core (bench_peak's register-resident FMA chains), or None where
        bench_peak is not built (it is x86 only)."""
        exe = os.path.join(self.a.build, "bench", "bench_peak")
        if not os.path.exists(exe):
            print("run_train_bench: no bench_peak in the build: the roofline uses our sgemm only", flush=True)
            return None
        cmd = [exe] + (["--reps", "1", "--size", "256"] if self.a.quick else ["--reps", "5"])
        r = self.record("peak", {}, cmd, "", 0)
        if r:
            print(f"  peak    fp32 {r['best_fp32_gflops']:.1f} GFLOP/s per core (AVX2 {r['fma_avx2_gflops']}, "
                  f"AVX-512 {r['fma_avx512_gflops']}); bf16 dot {r['dot_bf16_gflops']}", flush=True)
        return r

    def torch(self, members, threads, mode, autocast, coretype, data, rnd):
        cmd = [self.a.torch_python, self.a.torch_script, "--data", data, "--members", str(members),
               "--steps", str(self.a.steps + 1), "--threads", str(threads), "--mode", mode]
        if autocast != "off":
            cmd += ["--autocast", autocast]
        env = dict(os.environ, LD_LIBRARY_PATH=OPENBLAS)
        env.pop("OPENBLAS_CORETYPE", None)
        note = f"LD_LIBRARY_PATH={OPENBLAS} "
        if coretype != "unset":
            env["OPENBLAS_CORETYPE"] = coretype
            note += f"OPENBLAS_CORETYPE={coretype} "
        else:
            note = "env -u OPENBLAS_CORETYPE " + note
        config = {"members": members, "threads": threads, "mode": mode, "autocast": autocast, "coretype": coretype}
        r = self.record("torch", config, cmd, note, rnd, env)
        if r:
            print(f"  torch   m={members} t={threads} {mode:5s} autocast {autocast:4s} OpenBLAS {coretype:8s} "
                  f"{r['model_images_per_s']:8.1f} img/s", flush=True)

    def paired(self, members_b, rounds):
        """1 member against members_b members on one device, in one process, their epochs alternating."""
        steps_b = max(1, 16 // members_b)  # about as many model-images per epoch as 16 steps of 1 member
        cmd = [self.exe, "paired", "--data", self.a.data, "--members-a", "1", "--members-b", str(members_b),
               "--steps-a", "16", "--steps-b", str(steps_b), "--rounds", str(rounds)]
        if self.a.isas[-1] != "auto":
            cmd += ["--isa", self.a.isas[-1]]
        r = self.record("paired", {"members_a": 1, "members_b": members_b}, cmd, "", 0)
        if r:
            print(f"  paired  1 vs {members_b} members on 1 device: {members_b} members at "
                  f"{r['median_ratio_b_over_a']:.3f}x the model-images/s of 1 (median of {len(r['ratios_b_over_a'])} "
                  f"rounds; {r['min_ratio']:.2f}..{r['max_ratio']:.2f})", flush=True)
        return r

    def trajectory(self, members, devices, isa, precision):
        """Both binaries train runs of 1..K steps without warm-up (a run of k steps: one epoch over the first k
        batches, in the order the seed gives that many examples); each run's mean training loss, old against
        new. bench_train reports no per-step loss, and an old build's binary cannot be made to."""
        mode = "data-parallel" if members < devices else "ensemble"
        means = {}
        for what, exe in (("pmapcc", self.exe), ("baseline", self.a.baseline)):
            means[what] = []
            for k in range(1, self.a.trajectory + 1):
                r, _, error = run_child(self.train_cmd(exe, members, devices, isa, precision, k, 0))
                if r is None:
                    print(f"  trajectory {what} m={members} d={devices} k={k}: FAILED {error.strip()[-200:]}",
                          flush=True)
                    return None
                means[what].append(r["final_train_loss"])
        new, old = means["pmapcc"], means["baseline"]
        same = [n == o for n, o in zip(new, old)]
        rel = [abs(n - o) / max(abs(o), 1e-30) for n, o in zip(new, old)]
        out = {"members": members, "devices": devices, "mode": mode, "isa": isa, "precision": precision,
               "steps": self.a.trajectory, "mean_losses_new": new, "mean_losses_old": old,
               "bitwise_runs": sum(same),
               "first_differing_run": next((k + 1 for k, v in enumerate(same) if not v), None),
               "max_relative_difference": max(rel)}
        print(f"  trajectory m={members} d={devices} {mode}: {out['bitwise_runs']}/{len(same)} runs bitwise, "
              f"largest relative difference {out['max_relative_difference']:.2e}", flush=True)
        return out

    def values(self, what, config, key):
        return [r["result"][key] for r in self.runs
                if r["what"] == what and r["config"] == config and "result" in r]


def summarize(b, flops_info, members_list, devices_list, torch_variants, isas, variants, peak):
    def med(what, config, key):
        return median(b.values(what, config, key))

    sgemm = {(t, isa): med("sgemm", {"threads": t, "isa": isa}, "gflops") for isa in isas
             for t in sorted({d * cpu_threads(b.a, d) for d in devices_list})}
    fewest = min(d * cpu_threads(b.a, d) for d in devices_list)  # per CPU-second: the fewest threads measured
    sgemm_cpu = {isa: med("sgemm", {"threads": fewest, "isa": isa}, "gflops_per_cpu_second") for isa in isas}
    peak_core = peak["best_fp32_gflops"] if peak else None
    torch_best = {}  # (members, autocast): PyTorch's best configuration
    coretypes = sorted({t[3] for t in torch_variants})
    for m in members_list:
        for autocast in sorted({t[2] for t in torch_variants}):
            best = None
            for threads, mode, ac, ct in torch_variants:
                if ac != autocast:
                    continue
                v = med("torch", {"members": m, "threads": threads, "mode": mode, "autocast": ac, "coretype": ct},
                        "model_images_per_s")
                if v is not None and (best is None or v > best[0]):
                    best = (v, f"{mode}, {threads} thread{'s' if threads > 1 else ''}" +
                            (f", autocast {ac}" if ac != "off" else "") +
                            (f", OpenBLAS {ct}" if len(coretypes) > 1 else ""))
            torch_best[(m, autocast)] = best
    rows = []
    for m in members_list:
        for d, (isa, precision) in ((d, v) for d in devices_list for v in variants):  # the first variant first
            mode = "data-parallel" if m < d else "ensemble"
            cfg = {"members": m, "devices": d, "mode": mode, "isa": isa, "precision": precision}
            ips = med("pmapcc", cfg, "model_images_per_s")
            if ips is None:
                continue
            gflops = ips * flops_info["train_mflop_per_image"] / 1e3
            cpu = median([r["result"]["cpu_seconds"] / r["result"]["seconds"] for r in b.runs
                          if r["what"] == "pmapcc" and r["config"] == cfg and "result" in r])
            images_per_cpu_s = median([r["result"]["model_images_per_s"] * r["result"]["seconds"] /
                                       r["result"]["cpu_seconds"] for r in b.runs
                                       if r["what"] == "pmapcc" and r["config"] == cfg and "result" in r])
            theirs = torch_best.get((m, "bf16" if precision == "bf16" else "off"))
            theirs_fp32 = torch_best.get((m, "off"))
            first = next((r for r in rows if (r["members"], r["devices"], r["isa"], r["precision"]) ==
                          (m, d) + variants[0]), None)
            images_per_cpu_gflop = images_per_cpu_s * flops_info["train_mflop_per_image"] / 1e3 \
                if images_per_cpu_s else None
            cores = d * cpu_threads(b.a, d)  # the row's threads: its peak is that many cores'
            rows.append({
                "members": m, "devices": d, "mode": mode, "isa": isa, "precision": precision,
                "cpu_threads": cpu_threads(b.a, d),
                "pmapcc_images_per_s": ips,
                "over_first_isa": ips / first["pmapcc_images_per_s"] if first and (isa, precision) != variants[0]
                else None,
                "torch_best_images_per_s": theirs[0] if theirs else None,
                "torch_best_config": theirs[1] if theirs else None,
                "ratio": ips / theirs[0] if theirs else None,
                "ratio_to_torch_fp32": ips / theirs_fp32[0] if theirs_fp32 else None,
                "gflops": gflops,
                "sgemm_gflops": sgemm.get((cores, isa)) if precision == "fp32" else None,  # fp32 GEMMs only
                "of_sgemm": gflops / sgemm[(cores, isa)] if sgemm.get((cores, isa)) and precision == "fp32" else None,
                "peak_fp32_gflops": peak_core * cores if peak_core else None,
                "roofline": gflops / (peak_core * cores) if peak_core else None,
                "cores_used": cpu,
                "roofline_cpu_time": images_per_cpu_gflop / peak_core if peak_core and images_per_cpu_gflop else None,
                "peak_rss_mb": med("pmapcc", cfg, "peak_rss_mb"),
                "budget_mb": med("pmapcc", cfg, "budget_mb"),
            })
    return rows, sgemm, sgemm_cpu


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def table(rows, sgemm, sgemm_cpu, isas, variants, peak):
    head = ("| members | devices | mode | ISA | pmapcc img/s | PyTorch best img/s (config) | pmapcc / PyTorch | GFLOP/s |"
            " of fp32 peak (wall) | of fp32 peak (CPU time) | of our sgemm | peak RSS MB | budget MB |")
    out = [head, "|" + "---|" * 13]
    pct = lambda v: fmt(v and 100 * v, ".0f") + "%"
    for r in rows:
        torch = "-" if r["torch_best_images_per_s"] is None else \
            f"{r['torch_best_images_per_s']:.0f} ({r['torch_best_config']})"
        label = r["isa"] + (" " + r["precision"] if r["precision"] != "fp32" else "")
        label += f" ({r['cpu_threads']} threads/device)" if r.get("cpu_threads", 1) != 1 else ""
        out.append(f"| {r['members']} | {r['devices']} | {r['mode']} | {label} | {r['pmapcc_images_per_s']:.0f} | "
                   f"{torch} | {fmt(r['ratio'], '.2f')}x | {r['gflops']:.1f} | {pct(r['roofline'])} | "
                   f"{pct(r['roofline_cpu_time'])} | {pct(r['of_sgemm'])} | {r['peak_rss_mb']:.0f} | {r['budget_mb']:.0f} |")
    notes = []
    if peak:
        notes.append(f"fp32 peak (bench_peak, register-resident FMA chains, one core, median of {peak['reps']}): "
                     f"{peak['best_fp32_gflops']:.1f} GFLOP/s per core (AVX2 {peak['fma_avx2_gflops']}, AVX-512 "
                     f"{peak['fma_avx512_gflops']}); a row's peak is that times its cores (devices x --cpu-threads)")
    for isa in isas:
        notes.append(f"sgemm ({isa}; our kernels, 1536^3, sustained, median): " +
                     ", ".join(f"{t} thread{'s' if t > 1 else ''} {fmt(v, '.1f')} GFLOP/s"
                               for (t, i), v in sgemm.items() if i == isa) +
                     f"; per CPU-second {fmt(sgemm_cpu[isa], '.1f')} GFLOP")
    if len(variants) > 1:
        name = lambda v: v[0] + (" " + v[1] if v[1] != "fp32" else "")
        notes += ["", "| members | devices | " + " | ".join(f"{name(v)} / {name(variants[0])}" for v in variants[1:]) +
                  " |", "|" + "---|" * (1 + len(variants))]
        for r in rows:
            if (r["isa"], r["precision"]) != variants[0]:
                continue
            ratios = [next((o["over_first_isa"] for o in rows if (o["members"], o["devices"], o["isa"], o["precision"])
                            == (r["members"], r["devices"]) + v), None) for v in variants[1:]]
            notes.append(f"| {r['members']} | {r['devices']} | " +
                         " | ".join(fmt(v, ".2f") + "x" for v in ratios) + " |")
    return "\n".join(out + [""] + notes)


def layers_table(b, variants, peak):
    """Median GFLOP/s of each product layer's forward and backward per variant, and their share of the fp32
    peak of one core."""
    peak_core = peak["best_fp32_gflops"] if peak else None
    out = ["Product layers alone (bench_train layers, batch 128, one member, one thread), GFLOP/s (median; "
           "share of one core's fp32 peak):", "",
           "| layer | " + " | ".join(f"{i}{' ' + p if p != 'fp32' else ''} forward | backward"
                                    for i, p in variants) + " |",
           "|" + "---|" * (1 + 2 * len(variants))]
    names = []
    for r in b.runs:
        if r["what"] == "layers" and "result" in r:
            names += [l["layer"] for l in r["result"]["layers"] if l["layer"] not in names]
    pct = lambda v: f" ({100 * v / peak_core:.0f}%)" if peak_core and v is not None else ""
    for name in names:
        cells = []
        for isa, precision in variants:
            for key in ("forward_gflops", "backward_gflops"):
                v = median([l[key] for r in b.runs if r["what"] == "layers" and "result" in r and
                            r["config"] == {"isa": isa, "precision": precision}
                            for l in r["result"]["layers"] if l["layer"] == name])
                cells.append(fmt(v, ".1f") + pct(v))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def baseline_rows(b, rows):
    """Per row, ours against --baseline's: the medians, the ratio new / old of each round in which both ran,
    and whether their final training losses were bitwise equal in every such round."""
    out = []
    for r in rows:
        cfg = {k: r[k] for k in ("members", "devices", "mode", "isa", "precision")}
        by_round = {}
        for run in b.runs:
            if run["config"] == cfg and run["what"] in ("pmapcc", "baseline") and "result" in run:
                by_round.setdefault(run["round"], {})[run["what"]] = run["result"]
        pairs = [v for _, v in sorted(by_round.items()) if len(v) == 2]
        if not pairs:
            continue
        ratios = [p["pmapcc"]["model_images_per_s"] / p["baseline"]["model_images_per_s"] for p in pairs]
        losses = [(p["baseline"]["final_train_loss"], p["pmapcc"]["final_train_loss"]) for p in pairs]
        out.append(dict(cfg, new_images_per_s=median([p["pmapcc"]["model_images_per_s"] for p in pairs]),
                        old_images_per_s=median([p["baseline"]["model_images_per_s"] for p in pairs]),
                        ratios=ratios, median_ratio=median(ratios), min_ratio=min(ratios), max_ratio=max(ratios),
                        same_final_loss=all(o == n for o, n in losses), final_losses_old_new=losses,
                        peak_rss_mb_old_new=[median([p["baseline"]["peak_rss_mb"] for p in pairs]),
                                             median([p["pmapcc"]["peak_rss_mb"] for p in pairs])]))
    return out


def baseline_table(a, rows):
    out = [f"Paired with --baseline {a.baseline} ({a.model}; model-images/s, medians; new / old per round, its "
           f"median and range; rows under {a.min_ratio} marked):", "",
           "| members | devices | mode | precision | old img/s | new img/s | new / old (range) | same final loss |"
           " peak RSS old / new MB |", "|" + "---|" * 9]
    for r in rows:
        flag = " **under**" if r["median_ratio"] < a.min_ratio else ""
        out.append(f"| {r['members']} | {r['devices']} | {r['mode']} | {r['precision']} | "
                   f"{r['old_images_per_s']:.0f} | {r['new_images_per_s']:.0f} | {r['median_ratio']:.3f} "
                   f"({r['min_ratio']:.2f}-{r['max_ratio']:.2f}){flag} | "
                   f"{'bitwise' if r['same_final_loss'] else 'differs'} | "
                   f"{r['peak_rss_mb_old_new'][0]:.0f} / {r['peak_rss_mb_old_new'][1]:.0f} |")
    under = [r for r in rows if r["median_ratio"] < a.min_ratio]
    out.append("")
    out.append(f"{len(under)} of {len(rows)} rows under {a.min_ratio}" if under else
               f"every row at least {a.min_ratio}")
    return "\n".join(out)


def trajectory_table(a, rows):
    out = [f"Runs of 1 to {a.trajectory} steps, ours against --baseline ({a.model}, no warm-up; each run's mean "
           "training loss over its steps and members):", "",
           "| members | devices | mode | runs bitwise | first differing run (steps) | largest relative difference | "
           f"{a.trajectory}-step run, old / new |", "|" + "---|" * 7]
    for r in rows:
        out.append(f"| {r['members']} | {r['devices']} | {r['mode']} | {r['bitwise_runs']} / {r['steps']} | "
                   f"{r['first_differing_run'] or '-'} | {r['max_relative_difference']:.2e} | "
                   f"{r['mean_losses_old'][-1]:.9g} / {r['mean_losses_new'][-1]:.9g} |")
    return "\n".join(out)


def torch_table(b, members_list, torch_variants):
    """Every PyTorch configuration's median, so that the anchor's best is seen beside the others (OpenBLAS's
    core type set and unset among them)."""
    name = lambda t: f"{t[1]} {t[0]}t" + (f" {t[2]}" if t[2] != "off" else "") + f" OpenBLAS {t[3]}"
    out = ["PyTorch, model-images/s (median):", "",
           "| members | " + " | ".join(name(t) for t in torch_variants) + " |",
           "|" + "---|" * (1 + len(torch_variants))]
    for m in members_list:
        vals = [median(b.values("torch", {"members": m, "threads": t[0], "mode": t[1], "autocast": t[2],
                                          "coretype": t[3]}, "model_images_per_s")) for t in torch_variants]
        out.append(f"| {m} | " + " | ".join(fmt(v, ".0f") for v in vals) + " |")
    return "\n".join(out)


def main():
    a = parse_args()
    b = Bench(a)
    if not os.path.exists(b.exe):
        sys.exit(f"run_train_bench: {b.exe} not found: build it (cmake --build {a.build} --target bench_train)")
    members_list, devices_list = ints(a.members), ints(a.devices)
    # OpenBLAS's core type only matters to fp32 (autocast bf16 runs its products through oneDNN): bf16 runs
    # take the first.
    torch_variants = [(t, m, ac, ct) for ac in a.autocasts for m in a.torch_modes.split(",") if m
                      for t in ints(a.torch_threads) for ct in (a.coretypes if ac == "off" else a.coretypes[:1])]
    have_torch = not a.no_torch and os.path.exists(a.torch_script) and subprocess.run(
        [a.torch_python, "-c", "import torch"], capture_output=True).returncode == 0
    if not have_torch:
        print("run_train_bench: PyTorch not run (--no-torch, or no torch under --torch-python)", flush=True)
    flops_info, _, err = run_child([b.exe, "flops"])
    if flops_info is None:
        sys.exit(f"run_train_bench: bench_train flops failed: {err}")
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        torch_data = small_test_dir(a.data, tmp) if have_torch else None
        peak = b.peak()
        for rnd in range(a.runs):
            print(f"round {rnd + 1}/{a.runs} (load average {loadavg()})", flush=True)
            for isa in a.isas if not a.no_kernels else []:
                for t in sorted({d * cpu_threads(a, d) for d in devices_list}):  # the cores a row uses
                    b.sgemm(t, isa, rnd)
            for isa, precision in a.variants if not a.no_kernels else []:
                b.layers(isa, precision, rnd)
            for m in members_list:
                for d in devices_list:
                    if m % d == 0 or m == 1:
                        for isa, precision in a.variants:
                            b.ours(m, d, isa, precision, rnd)
                if have_torch:
                    for threads, mode, autocast, coretype in torch_variants:
                        b.torch(m, threads, mode, autocast, coretype, torch_data, rnd)
        paired = None
        if a.paired_rounds > 0 and max(members_list) > 1 and 1 in members_list and 1 in devices_list:
            print(f"paired comparison ({a.paired_rounds} rounds, load average {loadavg()})", flush=True)
            paired = b.paired(max(members_list), a.paired_rounds)
    trajectories = []
    if a.trajectory:
        print(f"trajectories ({a.trajectory} steps per row and binary)", flush=True)
        for m in members_list:
            for d in devices_list:
                if m % d == 0 or m == 1:
                    t = b.trajectory(m, d, *a.variants[0])
                    if t:
                        trajectories.append(t)
    rows, sgemm, sgemm_cpu = summarize(b, flops_info, members_list, devices_list,
                                       torch_variants if have_torch else [], a.isas, a.variants, peak)
    text = table(rows, sgemm, sgemm_cpu, a.isas, a.variants, peak)
    if not a.no_kernels:
        text += "\n\n" + layers_table(b, a.variants, peak)
    baseline = baseline_rows(b, rows) if a.baseline else []
    if baseline:
        text += "\n\n" + baseline_table(a, baseline)
    if trajectories:
        text += "\n\n" + trajectory_table(a, trajectories)
    if have_torch:
        text += "\n\n" + torch_table(b, members_list, torch_variants)
    if paired:
        mb = paired["b"]["members"]
        text += (f"\n{mb} members vs 1 member on one device, paired in one process (epochs alternating): "
                 f"{mb} members train at {paired['median_ratio_b_over_a']:.3f}x the model-images/s of 1 "
                 f"(median of {len(paired['ratios_b_over_a'])} rounds, range {paired['min_ratio']:.2f} to "
                 f"{paired['max_ratio']:.2f}; {paired['a']['median_model_images_per_s']:.0f} vs "
                 f"{paired['b']['median_model_images_per_s']:.0f} img/s)")
    print("\n" + text)
    result = {
        "benchmark": "MNIST CNN ensemble training throughput, pmapcc vs PyTorch",
        "date": started.isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": machine(), "load_average_before": load_before, "load_average_after": loadavg(),
        "settings": {"runs": a.runs, "steps": a.steps, "warmup": a.warmup, "batch": 128, "quick": a.quick,
                     "isa": a.isas, "precision": a.precisions, "pin": a.pin, "data": os.path.abspath(a.data),
                     "torch_test_examples": 1000, "paired_rounds": a.paired_rounds,
                     "torch_coretypes": a.coretypes},
        "runner_command": shlex.join([sys.executable] + sys.argv),
        "commands": b.commands, "flops": flops_info, "peak": peak,
        "sgemm_gflops": {f"{t} thread(s), {isa}": v for (t, isa), v in sgemm.items()},
        "sgemm_gflops_per_cpu_second": sgemm_cpu,
        "rows": rows, "paired": paired, "table_markdown": text, "runs": b.runs,
        "model": a.model, "baseline": a.baseline or None, "baseline_rows": baseline, "trajectories": trajectories,
    }
    out = a.out or os.path.join(REPO, "bench", "results", f"train-{started.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
