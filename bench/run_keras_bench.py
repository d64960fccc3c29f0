#!/usr/bin/env python3
"""The keras-convnet recipe side by side with PyTorch, in one run: accuracy, ensembles, data parallelism, speed.

On real MNIST, with the same recipe (the Keras guides' BatchNorm + Dropout convnet, Adam 1e-3, batch 64)
and the same epochs:
  1. accuracy: one member per seed (--seeds, default 0,1,2) with pmapcc (mnist_ensemble --model
     keras-convnet, one device) and with the PyTorch reference (bench/torch_keras_convnet.py, one thread):
     each side's mean and seed-to-seed spread;
  2. an ensemble of 4 members on 2 devices: every member, the ensemble, its NLL and calibration error;
  3. data parallelism: one model on 2 devices against 1 device (the batch split, BatchNorm's statistics
     psum-ed): the largest parameter difference between the two checkpoints and both accuracies;
  4. throughput (model-images/s, a shorter run): pmapcc with 2 members on 2 devices and 1 on 1, PyTorch
     with 1 and 2 threads and as 2 single-thread processes at once; the ratio to PyTorch's best.
Prints the machine, every command and a summary, and writes everything to bench/results/keras-<date>.json.

  python3 bench/run_keras_bench.py --data data/mnist [--build build/cpu] [--epochs 2] [--only speed] [--quick]

Keep the machine otherwise idle while it runs (about 20 minutes on 2 cores): the speeds are only comparable
when nothing else competes for the cores.

Needs Debian's python3-torch under --torch-python (scripts/setup.sh --bench).
"""
import argparse, datetime, json, os, platform, statistics, subprocess, sys, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "data", "mnist"))
    ap.add_argument("--build", default=os.path.join(REPO, "build", "cpu"), help="CMake build dir with examples/mnist_ensemble")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--speed-examples", type=int, default=19200, help="training examples of the throughput runs")
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 epoch of 3,200 examples, seeds 0,1")
    ap.add_argument("--only", default="", help="comma-separated sections to run: accuracy,ensemble,dp,speed")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    a.limit = None
    if a.quick:
        a.epochs, a.seeds, a.limit, a.speed_examples = 1, "0,1", 3200, 3200
    return a


COMMANDS = []


def run(cmd, env=None):
    COMMANDS.append(" ".join(cmd))
    print("  $ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout


def start(cmd):
    COMMANDS.append(" ".join(cmd) + " &")
    print("  $ " + " ".join(cmd) + " &", flush=True)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ours(a, tmp, name, *flags, limit=None, save=False):
    metrics = os.path.join(tmp, name + ".json")
    cmd = [os.path.join(a.build, "examples", "mnist_ensemble"), "--data", a.data, "--model", "keras-convnet",
           "--progress", "none", "--metrics-json", metrics, *flags]
    if limit or a.limit:
        cmd += ["--train-limit", str(limit or a.limit)]
    if save:
        cmd += ["--save", os.path.join(tmp, name + ".safetensors")]
    run(cmd)
    with open(metrics) as f:
        return json.load(f)["epochs"][-1]


def torch_cmd(a, *flags, limit=None):
    cmd = [a.torch_python, os.path.join(REPO, "bench", "torch_keras_convnet.py"), "--data", a.data, *flags]
    if limit or a.limit:
        cmd += ["--train-limit", str(limit or a.limit)]
    return cmd


def theirs(a, *flags, limit=None):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return json.loads(run(torch_cmd(a, *flags, limit=limit), env).strip().splitlines()[-1])


def spread(values):
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}


def max_param_diff(a_path, b_path):
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import struct
    import compare_checkpoints as cc  # noqa: E402
    (_, ta), (_, tb) = cc.read(a_path), cc.read(b_path)
    floats = lambda b: struct.unpack(f"<{len(b) // 4}f", b)
    worst = 0.0
    for name in ta:
        if name.startswith("params/"):
            worst = max(worst, max(abs(x - y) for x, y in zip(floats(ta[name]), floats(tb[name]))))
    return worst


def main():
    a = args()
    e = str(a.epochs)
    seeds = [int(s) for s in a.seeds.split(",")]
    machine = {"cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
               "cores": os.cpu_count(), "python": platform.python_version(), "load_before": os.getloadavg()}
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"machine: {machine['cpu']}, {machine['cores']} cores; load {machine['load_before']}; commit {commit}")
    result = {"machine": machine, "commit": commit, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "epochs": a.epochs, "seeds": seeds}
    wanted = lambda name: not a.only or name in a.only.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        if wanted("accuracy"):
            print("1. accuracy, one member per seed")
            ours_acc = [ours(a, tmp, f"seed{s}", "--devices", "1", "--members", "1", "--seed", str(s), "--epochs", e)
                        ["member_test_accuracy"][0] for s in seeds]
            torch_acc = [theirs(a, "--seed", str(s), "--epochs", e)["member_test_accuracy"][0] for s in seeds]
            result["accuracy"] = {"pmapcc": ours_acc, "pytorch": torch_acc,
                                  "pmapcc_spread": spread(ours_acc), "pytorch_spread": spread(torch_acc)}
        if wanted("ensemble"):
            print("2. an ensemble of 4 on 2 devices")
            ens = ours(a, tmp, "ensemble", "--devices", "2", "--members", "4", "--epochs", e)
            result["ensemble"] = {k: ens[k] for k in ("member_test_accuracy", "ensemble_test_accuracy",
                                                       "member_test_nll", "ensemble_test_nll", "member_test_ece",
                                                       "ensemble_test_ece")}
        if wanted("dp"):
            print("3. data parallel: 2 devices against 1")
            dp2 = ours(a, tmp, "dp2", "--mode", "data-parallel", "--devices", "2", "--epochs", e, save=True)
            dp1 = ours(a, tmp, "dp1", "--mode", "data-parallel", "--devices", "1", "--epochs", e, save=True)
            result["data_parallel"] = {
                "accuracy_2_devices": dp2["member_test_accuracy"][0], "accuracy_1_device": dp1["member_test_accuracy"][0],
                "max_param_difference": max_param_diff(os.path.join(tmp, "dp2.safetensors"),
                                                       os.path.join(tmp, "dp1.safetensors"))}
        if wanted("speed"):
            print("4. throughput")
            n = a.speed_examples
            speed = {}
            for name, flags in (("pmapcc 2 members, 2 devices", ["--devices", "2", "--members", "2"]),
                                ("pmapcc 2 members, 2 devices, --report-every 16",
                                 ["--devices", "2", "--members", "2", "--report-every", "16"]),
                                ("pmapcc 1 member, 1 device", ["--devices", "1", "--members", "1"]),
                                ("pmapcc 1 model, data parallel on 2 devices", ["--mode", "data-parallel", "--devices", "2"])):
                speed[name] = ours(a, tmp, "speed", *flags, "--epochs", "1", limit=n)["model_images_per_second"]
            for threads in (1, 2):
                speed[f"pytorch 1 process, {threads} thread(s)"] = theirs(a, "--epochs", "1", "--threads", str(threads),
                                                                         limit=n)["model_images_per_s"]
            procs = [start(torch_cmd(a, "--epochs", "1", "--threads", "1", "--seed", str(s), limit=n)) for s in (0, 1)]
            both = [json.loads(p.communicate()[0].strip().splitlines()[-1])["model_images_per_s"] for p in procs]
            speed["pytorch 2 processes x 1 thread (sum)"] = sum(both)
            best_ours = max(v for k, v in speed.items() if k.startswith("pmapcc"))
            best_torch = max(v for k, v in speed.items() if k.startswith("pytorch"))
            result["throughput"] = {"model_images_per_s": speed, "ratio_best": best_ours / best_torch}
    machine["load_after"] = os.getloadavg()
    result["commands"] = COMMANDS
    pct = lambda v: f"{100 * v:.2f} %"
    r = result
    print(f"\nkeras-convnet, {a.epochs} epoch(s), Adam 1e-3, batch 64; seeds {seeds}")
    if "accuracy" in r:
        for side in ("pmapcc", "pytorch"):
            s = r["accuracy"][side + "_spread"]
            print(f"  {side:8s} member accuracy: " + ", ".join(pct(v) for v in r["accuracy"][side]) +
                  f"  (mean {pct(s['mean'])}, range {pct(s['min'])} .. {pct(s['max'])})")
    if "ensemble" in r:
        en = r["ensemble"]
        print("  ensemble of 4: members " + ", ".join(pct(v) for v in en["member_test_accuracy"]) +
              f"; ensemble {pct(en['ensemble_test_accuracy'])}, NLL {en['ensemble_test_nll']:.4f} (members' mean "
              f"{statistics.mean(en['member_test_nll']):.4f}), ECE {en['ensemble_test_ece']:.4f}")
    if "data_parallel" in r:
        dp = r["data_parallel"]
        print(f"  data parallel: 2 devices {pct(dp['accuracy_2_devices'])}, 1 device {pct(dp['accuracy_1_device'])}, "
              f"largest parameter difference {dp['max_param_difference']:.3g}")
    if "throughput" in r:
        for k, v in r["throughput"]["model_images_per_s"].items():
            print(f"  {k:50s} {v:9.1f} model-images/s")
        print(f"  best pmapcc / best PyTorch: {r['throughput']['ratio_best']:.2f}x")
    out = a.out or os.path.join(REPO, "bench", "results",
                                f"keras-{datetime.date.today()}{'-' + a.only.replace(',', '-') if a.only else ''}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
