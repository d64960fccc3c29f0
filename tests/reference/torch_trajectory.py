#!/usr/bin/env python3
"""Cross-check of mnist_ensemble against PyTorch: same initial parameters, same data, same recipe.

Runs mnist_ensemble twice (0 epochs to save the members' initial parameters; then E epochs of one
full-batch SGD step each, --train-limit N --batch-size N, so the data order inside an epoch does not
matter), then trains the same members from the same parameters in PyTorch (the Flax MNIST CNN written
with torch.nn.functional: NHWC flatten order, SAME 3x3 convolutions, avg-pool 2, SGD with momentum as in
optax: m = mu m + g, p -= lr m) and compares, within float32 reassociation tolerances:
  - the training loss of every epoch (mean over members, before that epoch's update),
  - every parameter tensor after E epochs,
  - each member's test accuracy and the ensemble's (mean of the members' softmax probabilities).
A systematic difference from the Flax recipe (layouts, padding, pooling, loss, optimizer, ensemble
averaging) fails it.

  torch_trajectory.py MNIST_ENSEMBLE DATA_DIR [--members 2] [--epochs 12] [--train 256] [--test 512]

Exit 0: agreement; 1: a difference (printed); 77: PyTorch or NumPy is not installed (ctest: skipped).
"""
import argparse, json, os, sys, tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from reference_io import compare_accuracies, compare_loss, read_idx, read_safetensors, run
except ImportError as e:  # torch comes with `scripts/setup.sh --bench` (Debian's python3-torch)
    print(f"torch_trajectory: skipped: {e}")
    sys.exit(77)


def forward(p, m, x):
    """Member m's logits for x (N, 1, H, W); parameters in the checkpoint's (Flax) layouts."""
    t = lambda name: p[name][m]
    conv = lambda x, layer: F.conv2d(x, t(f"{layer}/kernel").permute(3, 2, 0, 1), t(f"{layer}/bias"), padding=1)
    x = F.avg_pool2d(F.relu(conv(x, "Conv_0")), 2)
    x = F.avg_pool2d(F.relu(conv(x, "Conv_1")), 2)
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # (H, W, C) order, as Flax's reshape
    x = F.relu(x @ t("Dense_0/kernel") + t("Dense_0/bias"))
    return x @ t("Dense_1/kernel") + t("Dense_1/bias")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("data")
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--train", type=int, default=256)
    ap.add_argument("--test", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--torch-momentum", type=float, default=None, help="only to see the check fail")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        common = [a.exe, "--data", a.data, "--members", str(a.members), "--devices", "1", "--train-limit",
                  str(a.train), "--batch-size", str(a.train), "--test-limit", str(a.test), "--lr", str(a.lr),
                  "--momentum", str(a.momentum), "--progress", "none"]
        init, final, metrics = (os.path.join(tmp, n) for n in ("init.safetensors", "final.safetensors", "m.json"))
        run("torch_trajectory", common + ["--epochs", "0", "--save", init])
        run("torch_trajectory", common + ["--epochs", str(a.epochs), "--save", final, "--metrics-json", metrics])
        (ours, _), (start, _) = read_safetensors(final), read_safetensors(init)
        with open(metrics) as f:
            epochs = json.load(f)["epochs"]
    names = sorted(n[len("params/"):] for n in start if n.startswith("params/"))
    p = {n: torch.tensor(start["params/" + n], requires_grad=True) for n in names}
    mom = {n: torch.zeros_like(p[n]) for n in names}
    mu = a.momentum if a.torch_momentum is None else a.torch_momentum
    img = lambda n: torch.tensor(read_idx(os.path.join(a.data, n)).astype(np.float32) / 255.0)[:, None]
    lab = lambda n: torch.tensor(read_idx(os.path.join(a.data, n)).astype(np.int64))
    x, y = img("train-images-idx3-ubyte")[: a.train], lab("train-labels-idx1-ubyte")[: a.train]
    xt, yt = img("t10k-images-idx3-ubyte")[: a.test], lab("t10k-labels-idx1-ubyte")[: a.test]
    failures = []
    print(f"{'epoch':>5} {'pmapcc loss':>12} {'torch loss':>12} {'rel diff':>9}")
    for e in range(a.epochs):
        losses = [F.cross_entropy(forward(p, m, x), y) for m in range(a.members)]
        loss = sum(losses) / a.members
        grads = torch.autograd.grad(loss * a.members, [p[n] for n in names])  # each member: its own mean loss
        with torch.no_grad():
            for n, g in zip(names, grads):
                mom[n].mul_(mu).add_(g)
                p[n].sub_(a.lr * mom[n])
        compare_loss(e + 1, epochs[e]["train_loss"], float(loss), failures)
    print(f"{'tensor':>16} {'max |diff|':>11} {'max |param|':>12}")
    for n in names:
        diff = float(np.abs(ours["params/" + n] - p[n].detach().numpy()).max())
        scale = float(np.abs(ours["params/" + n]).max())
        print(f"{n:>16} {diff:11.2e} {scale:12.4f}")
        if diff > 1e-3 * max(scale, 1e-3):
            failures.append(f"{n}: parameters differ by up to {diff:.3g} (largest |param| {scale:.3g})")
    with torch.no_grad():
        probs = torch.stack([F.softmax(forward(p, m, xt), dim=1) for m in range(a.members)])
    member = [float((pm.argmax(1) == yt).double().mean()) for pm in probs]
    ensemble = float((probs.mean(0).argmax(1) == yt).double().mean())
    compare_accuracies(epochs[-1], member, ensemble, a.test, failures)
    first_kernel = next(n for n in names if n.endswith("kernel"))
    if len({start["params/" + first_kernel][m].tobytes() for m in range(a.members)}) != a.members:
        failures.append("the members start from the same parameters")
    for f in failures:
        print("torch_trajectory: DIFFERENCE:", f)
    print("torch_trajectory:", "FAILED" if failures else "pmapcc and PyTorch agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
