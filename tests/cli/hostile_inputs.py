#!/usr/bin/env python3
"""Hostile flags and files for mnist_ensemble, as a table: zero, negative, huge and non-numeric values of
every numeric flag, NaN/inf learning rates, a batch larger than the data, checkpoints of another model,
recipe or member count or with a tampered tensor shape, dtype or offset, and data of the wrong image size.
Each must end with the expected exit status (2: a bad command line, one line on stderr; 1: bad data or
files) and a line naming the flag or file, within the time limit, without a crash; a few valid edge cases
must succeed. Prints the table; exits 1 when a row fails.

usage: hostile_inputs.py /path/to/mnist_ensemble
"""
import json, os, shutil, struct, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT = 60  # seconds: a run past this is a hang


def write_idx(path, magic, dims, payload):
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)


def tamper(src, dst, edit):
    """Copies a safetensors file with its JSON header changed by edit(header) (the header length updated)."""
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    open(dst, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def main():
    binary = os.path.realpath(sys.argv[1])
    work = tempfile.mkdtemp()
    try:
        data = os.path.join(work, "data")
        subprocess.run([sys.executable, os.path.join(HERE, "make_idx.py"), data, "256", "64"], check=True)
        # Test images of another size beside 28x28 training images.
        mixed = os.path.join(work, "mixed")
        shutil.copytree(data, mixed)
        write_idx(os.path.join(mixed, "t10k-images-idx3-ubyte"), 0x803, (64, 16, 16), bytes(64 * 256))
        # A whole dataset of 16x16 images: its model has another Dense_0 shape.
        small = os.path.join(work, "small")
        os.makedirs(small)
        for prefix, n in (("train", 256), ("t10k", 64)):
            write_idx(os.path.join(small, prefix + "-images-idx3-ubyte"), 0x803, (n, 16, 16), bytes(n * 256))
            write_idx(os.path.join(small, prefix + "-labels-idx1-ubyte"), 0x801, (n,), bytes(i % 10 for i in range(n)))
        base = [binary, "--data", data, "--devices", "1", "--batch-size", "64", "--progress", "none"]
        evaluate = [binary, "--data", data, "--devices", "1", "--progress", "none"]  # the checkpoint has the recipe
        ck = os.path.join(work, "ck.st")
        other = os.path.join(work, "other.st")
        for path, args in ((ck, ["--members", "2"]), (other, ["--data", small, "--members", "2"])):
            subprocess.run(base + args + ["--epochs", "1", "--save", path], check=True, capture_output=True)

        def tampered(name, edit):
            path = os.path.join(work, name + ".st")
            tamper(ck, path, edit)
            return path

        def shape(h):
            h["params/Dense_0/kernel"]["shape"][1] = 255

        def dtype(h):
            h["params/Conv_0/bias"]["dtype"] = "F16"

        def offsets(h):
            a, b = h["params/Dense_1/bias"]["data_offsets"]
            h["params/Dense_1/bias"]["data_offsets"] = [a + 4, b + 4]

        def mystery_model(h):  # the program's record and, in a train::Trainer file, the Trainer's own
            config = json.loads(h["__metadata__"]["config"])
            config["model"] = "mystery"
            h["__metadata__"]["config"] = json.dumps(config)
            if "model" in h["__metadata__"]:
                h["__metadata__"]["model"] = "mystery"

        def members(h):
            h["__metadata__"]["config"] = h["__metadata__"]["config"].replace('"members":2', '"members":3')

        E, R = 1, 2  # run fails (bad data or file), bad command line
        numeric = []
        for flag, cases in {
            "--epochs": [("-1", R, "out of range"), ("99999999999", R, "out of range"), ("abc", R, "is not an integer"),
                         ("1.5", R, "is not an integer")],
            "--batch-size": [("0", R, "out of range"), ("-1", R, "out of range"), ("99999999999", R, "out of range"),
                             ("x", R, "is not an integer"), ("100000", E, "--batch-size 100000 is larger than the 256 training examples")],
            "--lr": [("0", R, "must be positive"), ("-0.1", R, "must be positive"), ("nan", R, "not a finite number"),
                     ("inf", R, "not a finite number"), ("-inf", R, "not a finite number"), ("1e400", R, "is not a number"),
                     ("fast", R, "is not a number")],
            "--momentum": [("-0.1", R, "must be in \\[0, 1\\)"), ("1", R, "must be in \\[0, 1\\)"), ("nan", R, "not a finite"),
                           ("x", R, "is not a number")],
            "--seed": [("-1", R, "is not an integer"), ("99999999999999999999", R, "is not an integer"), ("s", R, "is not an integer")],
            "--train-limit": [("0", R, "out of range"), ("-5", R, "out of range"), ("99999999999", R, "out of range"),
                              ("x", R, "is not an integer")],
            "--test-limit": [("0", R, "out of range"), ("-1", R, "out of range"), ("x", R, "is not an integer")],
            "--devices": [("0", R, "out of range"), ("-2", R, "out of range"), ("100000", R, "out of range \\(1..4096\\)"),
                          ("x", R, "is not an integer")],
            "--members": [("0", R, "out of range"), ("-1", R, "out of range"), ("x", R, "is not an integer"),
                          ("100000", E, "100000 members .* need [0-9]+ GB")],
            "--report-every": [("0", R, "out of range"), ("-1", R, "out of range"), ("x", R, "is not an integer")],
            "--members-subset": [("a", R, "is not an integer"), ("0,,1", R, "empty entry"), ("1,1", R, "named twice")],
            "--model": [("resnet", R, "'resnet' is not flax-cnn or keras-convnet"), ("", R, "needs a non-empty value")],
            "--optimizer": [("rmsprop", R, "'rmsprop' is not sgd, adam or adamw"), ("", R, "needs a non-empty value")],
            "--weight-decay": [("-0.1", R, "must be >= 0"), ("nan", R, "not a finite number"), ("0.1,", R, "empty entry"),
                               ("0.1,0.2", E, "--weight-decay gives 2 values for 1 member")],
            "--clip-norm": [("-1", R, "must be >= 0"), ("inf", R, "not a finite number"), ("x", R, "is not a number")],
            "--lr-schedule": [("linear", R, "unknown schedule 'linear'"), ("cosine:1.5", R, "final factor must be in"),
                              ("exponential:0.5:0", R, "the steps must be >= 1"), ("piecewise:5=1,2=1", R, "increasing"),
                              ("exponential:0.5:-2", R, "the steps must be >= 1")],
            "--warmup-steps": [("-1", R, "out of range"), ("x", R, "is not an integer")],
        }.items():
            for value, code, pattern in cases:
                run = evaluate + ["--evaluate", ck] if flag == "--members-subset" else base + ["--epochs", "1"]
                numeric.append((f"{flag} {value}", code, f"{flag}" if code == R else pattern, pattern,
                                run + [flag, value]))
        files = [
            ("train and test images of different sizes", E, "the training images are 28x28, the test images 16x16",
             [binary, "--data", mixed, "--devices", "1", "--epochs", "1"]),
            ("a checkpoint of another model (16x16)", E, "other.st: the checkpoint's model has input \\(16, 16, 1\\) where this run's has \\(28, 28, 1\\)",
             base + ["--members", "2", "--epochs", "2", "--resume", other]),
            ("a checkpoint of another recipe (lr)", E, "ck.st: the checkpoint was written with lr = 0.1, this run has 0.05",
             base + ["--members", "2", "--epochs", "2", "--lr", "0.05", "--resume", ck]),
            ("a checkpoint of another optimizer", E, 'ck.st: the checkpoint was written with optimizer = "sgd", this run has "adam"',
             base + ["--members", "2", "--epochs", "2", "--optimizer", "adam", "--resume", ck]),
            ("a checkpoint of another schedule", E, 'ck.st: the checkpoint was written with lr_schedule = "constant", this run has "cosine"',
             base + ["--members", "2", "--epochs", "2", "--lr-schedule", "cosine", "--resume", ck]),
            ("--lr with more values than members", E, "--lr gives 3 values for 2 member\\(s\\)",
             base + ["--members", "2", "--epochs", "1", "--lr", "0.1,0.2,0.3"]),
            ("a warmup as long as the run", E, "--warmup-steps 4 leaves none of the run's 4 steps",
             base + ["--epochs", "1", "--lr-schedule", "cosine", "--warmup-steps", "4"]),
            ("a checkpoint of another member count", E, "ck.st: the checkpoint was written with members = 2, this run has 4",
             base + ["--members", "4", "--epochs", "2", "--resume", ck]),
            ("a tampered tensor shape", E, "shape.st", base + ["--members", "2", "--epochs", "2", "--resume", tampered("shape", shape)]),
            ("a tampered tensor dtype", E, "dtype.st", base + ["--members", "2", "--epochs", "2", "--resume", tampered("dtype", dtype)]),
            ("a tampered tensor offset", E, "offsets.st",
             base + ["--members", "2", "--epochs", "2", "--resume", tampered("offsets", offsets)]),
            ("a tampered member count", E, "members.st",
             base + ["--members", "2", "--epochs", "2", "--resume", tampered("members", members)]),
            ("evaluating a checkpoint of a model the program does not build", E,
             "mystery.st: its model 'mystery' is not one this program builds", evaluate + ["--evaluate", tampered("mystery", mystery_model)]),
            ("evaluating a checkpoint of another model", E, "other.st: the checkpoint's model has input \\(16, 16, 1\\)",
             evaluate + ["--evaluate", other]),
            ("BatchNorm's weights split over 'model'", E,
             "layout of BatchNorm_0/beta: P\\('model'\\): BatchNormalization's weights cannot be split",
             base + ["--epochs", "1", "--model", "keras-convnet", "--mode", "model-parallel", "--devices", "2",
                     "--layout", "BatchNorm_0/beta=model"]),
        ]
        valid = [
            ("--epochs 0", base + ["--epochs", "0"]),
            ("--train-limit past the data (all of it)", base + ["--epochs", "1", "--train-limit", "1000000"]),
            ("--test-limit past the data", base + ["--epochs", "1", "--test-limit", "1000000"]),
            ("--report-every past the epoch", base + ["--epochs", "1", "--report-every", "1000000000"]),
            ("--lr 10 (diverges, reported as null)", base + ["--epochs", "1", "--lr", "10"]),
            ("adamw with a cosine after warmup, clipping and a rate per member",
             base + ["--epochs", "1", "--members", "2", "--optimizer", "adamw", "--lr", "0.001,0.003", "--lr-schedule",
                     "cosine", "--warmup-steps", "2", "--clip-norm", "1"]),
        ]
        import re
        failures = 0
        rows = []

        def run_case(name, code, pattern, cmd):
            nonlocal failures
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT)
                rc, err = r.returncode, r.stderr
            except subprocess.TimeoutExpired:
                rc, err = "hang", ""
            ok = rc == code and (pattern is None or re.search(pattern, err)) and \
                not re.search("terminate called|Segmentation|core dumped|Aborted \\(", err)
            if ok and code == 2 and err.count("\n") != 1:
                ok = False
            failures += 0 if ok else 1
            first = err.strip().splitlines()[0] if err.strip() else ""
            rows.append(f"{'ok  ' if ok else 'FAIL'} {rc!s:>4}  {name:<46} {first[:120]}")

        for name, code, _, pattern, cmd in numeric:
            run_case(name, code, pattern, cmd)
        for name, code, pattern, cmd in files:
            run_case(name, code, pattern, cmd)
        for name, cmd in valid:
            run_case(name, 0, None, cmd)
        print("\n".join(rows))
        print(f"hostile_inputs: {len(rows)} cases, {failures} failed")
        sys.exit(1 if failures else 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()
