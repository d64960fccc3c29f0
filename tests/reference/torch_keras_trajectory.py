#!/usr/bin/env python3
"""Cross-check of keras-convnet (BatchNorm, Dropout, strided and padded convolutions) against PyTorch.

Runs mnist_ensemble --model keras-convnet twice (0 epochs to save the members' initial parameters and
moving statistics; then E epochs of one full-batch SGD step each: --train-limit N --batch-size N), then
trains the same members from the same variables in PyTorch, written out here with torch.nn.functional:
TensorFlow's "same" padding, BatchNormalization with a shift only (training: the batch's mean and biased
variance; the moving statistics moved with momentum 0.99; evaluation: the moving ones), and pmapcc's
Dropout masks, drawn here independently from their specification (kernels/layer_ops.h): the member's key
folded with "drop" (JAX's threefry2x32), then Philox4x32-10 of (example, feature / 4, step, layer) under
it, word feature % 4, kept when >= 2^31 (rate 0.5), scaled by 2; "example" is the position in the step's
batch, which follows the epoch's permutation of the data (reproduced here too). Compares, within float32 reassociation:
  - the training loss of every epoch, every parameter after E epochs, every moving statistic,
  - each member's and the ensemble's test accuracy (inference: moving statistics, no dropout).
A wrong gradient, statistic, padding or mask fails it (--wrong-mask flips one member's keys to show it).

  torch_keras_trajectory.py MNIST_ENSEMBLE DATA_DIR [--members 2] [--epochs 5] [--train 256] [--test 512]

Exit 0: agreement; 1: a difference (printed); 77: PyTorch or NumPy is not installed (ctest: skipped).
"""
import argparse, json, os, sys, tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from reference_io import compare_accuracies, compare_loss, read_idx, read_safetensors, run
except ImportError as e:
    print(f"torch_keras_trajectory: skipped: {e}")
    sys.exit(77)

M32 = 0xFFFFFFFF


def threefry2x32(k0, k1, x0, x1):
    """Random123's threefry2x32 with 20 rounds, as jax.random uses it (scalars)."""
    rot = ((13, 15, 26, 6), (17, 29, 16, 24))
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    x0, x1 = (x0 + ks[0]) & M32, (x1 + ks[1]) & M32
    for g in range(5):
        for r in rot[g % 2]:
            x0 = (x0 + x1) & M32
            x1 = (((x1 << r) | (x1 >> (32 - r))) & M32) ^ x0
        x0 = (x0 + ks[(g + 1) % 3]) & M32
        x1 = (x1 + ks[(g + 2) % 3] + g + 1) & M32
    return x0, x1


def philox4x32_10(c, k0, k1):
    """Philox4x32-10 of counters c (4 uint64 arrays holding 32-bit words) under the key (k0, k1)."""
    c0, c1, c2, c3 = c
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & np.uint64(M32),
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & np.uint64(M32))
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def permutation(key, n):
    """pmap::permutation: Fisher-Yates from the top over the key's cuRAND-host Philox word stream (seed
    k0 << 32 | k1; block b: counter (b / 65536, 0, b % 65536, 0) under (seed low, seed high) words), each
    index by rejection sampling."""
    state = {"index": 0, "block": None}

    def word():
        j = state["index"]
        if j % 4 == 0:
            b = j // 4
            c = [np.array([v], dtype=np.uint64) for v in (b // 65536 & M32, b // 65536 >> 32, b % 65536, 0)]
            state["block"] = [int(w[0]) for w in philox4x32_10(c, key[1], key[0])]
        state["index"] += 1
        return state["block"][j % 4]

    perm = list(range(n))
    for i in range(n, 1, -1):
        limit = (2 ** 32 // i) * i
        while True:
            w = word()
            if w < limit:
                break
        j = w % i
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return perm


def dropout_mask(key, step, examples, features, stream=0, rate=0.5):
    """pmapcc's mask (kept x 1 / (1 - rate), else 0) for examples 0..N-1 at `step`, as a (N, F) tensor."""
    i = np.repeat(np.arange(examples, dtype=np.uint64), features)
    f = np.tile(np.arange(features, dtype=np.uint64), examples)
    words = philox4x32_10((i, f // np.uint64(4), np.full_like(i, step), np.full_like(i, stream)), key[0], key[1])
    word = np.choose((f % np.uint64(4)).astype(np.int64), words)
    keep = word >= np.uint64(round(rate * 2 ** 32))
    return torch.tensor((keep * (1.0 / (1.0 - rate))).astype(np.float32).reshape(examples, features))


def tf_same(x, k, s):
    pads = []
    for size in (x.shape[3], x.shape[2]):
        total = max((-(-size // s) - 1) * s + k - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


# (layer, kernel, stride, padding, bias, batch norm)
CONVS = [("Conv_0", 3, 1, "same", False, "BatchNorm_0"), ("Conv_1", 6, 2, "valid", False, "BatchNorm_1"),
         ("large_k", 6, 2, "same", True, "BatchNorm_2")]


def forward(p, st, m, x, mask=None):
    """Member m's logits for x (N, 1, H, W). With a mask: training (batch statistics, moved into st)."""
    t = lambda name: p[name][m]
    for layer, k, s, pad, bias, bn in CONVS:
        if pad == "same":
            x = tf_same(x, k, s)
        x = F.conv2d(x, t(f"{layer}/kernel").permute(3, 2, 0, 1), t(f"{layer}/bias") if bias else None, s)
        mean, var = st[f"{bn}/moving_mean"][m], st[f"{bn}/moving_variance"][m]
        if mask is not None:
            bm, bv = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
            with torch.no_grad():
                mean.copy_(mean * 0.99 + bm.detach() * (1 - 0.99))
                var.copy_(var * 0.99 + bv.detach() * (1 - 0.99))
            mean, var = bm, bv
        x = (x - mean[None, :, None, None]) * torch.rsqrt(var[None, :, None, None] + 1e-3)
        x = F.relu(x + t(f"{bn}/beta")[None, :, None, None])
    x = F.relu(x.mean((2, 3)) @ t("Dense_0/kernel") + t("Dense_0/bias"))
    if mask is not None:
        x = x * mask
    return x @ t("Dense_1/kernel") + t("Dense_1/bias")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("data")
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--train", type=int, default=256)
    ap.add_argument("--test", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--wrong-mask", action="store_true", help="only to see the check fail")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        common = [a.exe, "--data", a.data, "--model", "keras-convnet", "--members", str(a.members), "--devices", "1",
                  "--train-limit", str(a.train), "--batch-size", str(a.train), "--test-limit", str(a.test),
                  "--optimizer", "sgd", "--lr", str(a.lr), "--momentum", str(a.momentum), "--progress", "none"]
        init, final, metrics = (os.path.join(tmp, n) for n in ("init.safetensors", "final.safetensors", "m.json"))
        common += ["--seed", "0"]
        run("torch_keras_trajectory", common + ["--epochs", "0", "--save", init])
        run("torch_keras_trajectory", common + ["--epochs", str(a.epochs), "--save", final, "--metrics-json", metrics])
        (ours, _), (start, meta) = read_safetensors(final), read_safetensors(init)
        with open(metrics) as f:
            epochs = json.load(f)["epochs"]
    names = sorted(n[len("params/"):] for n in start if n.startswith("params/"))
    p = {n: torch.tensor(start["params/" + n], requires_grad=True) for n in names}
    st = {n[len("state/"):]: torch.tensor(start[n]) for n in start if n.startswith("state/")}
    mom = {n: torch.zeros_like(p[n]) for n in names}
    keys = [threefry2x32(k0, k1, 0, 0x64726F70) for k0, k1 in json.loads(meta["member_keys"])]
    if a.wrong_mask:
        keys[-1] = (keys[-1][0] ^ 1, keys[-1][1])
    img = lambda n: torch.tensor(read_idx(os.path.join(a.data, n)).astype(np.float32) / 255.0)[:, None]
    lab = lambda n: torch.tensor(read_idx(os.path.join(a.data, n)).astype(np.int64))
    x, y = img("train-images-idx3-ubyte")[: a.train], lab("train-labels-idx1-ubyte")[: a.train]
    xt, yt = img("t10k-images-idx3-ubyte")[: a.test], lab("t10k-labels-idx1-ubyte")[: a.test]
    failures = []
    print(f"{'epoch':>5} {'pmapcc loss':>12} {'torch loss':>12} {'rel diff':>9}")
    data_key = threefry2x32(0, 0, 0, 1)  # split(key(0), 2)[1]: --seed 0
    for e in range(a.epochs):
        order = torch.tensor(permutation(threefry2x32(*data_key, 0, e), a.train))
        xb, yb = x[order], y[order]
        losses = [F.cross_entropy(forward(p, st, m, xb, dropout_mask(keys[m], e, a.train, 256)), yb)
                  for m in range(a.members)]
        loss = sum(losses) / a.members
        grads = torch.autograd.grad(loss * a.members, [p[n] for n in names])  # each member: its own mean loss
        with torch.no_grad():
            for n, g in zip(names, grads):
                mom[n].mul_(a.momentum).add_(g)
                p[n].sub_(a.lr * mom[n])
        compare_loss(e + 1, epochs[e]["train_loss"], float(loss), failures)
    print(f"{'tensor':>28} {'max |diff|':>11} {'max |value|':>12}")
    mine_all = {"params/" + n: p[n].detach().numpy() for n in names}
    mine_all.update({"state/" + n: v.numpy() for n, v in st.items()})
    for n, theirs in sorted(mine_all.items()):
        diff = float(np.abs(ours[n] - theirs).max())
        scale = float(np.abs(ours[n]).max())
        print(f"{n:>28} {diff:11.2e} {scale:12.4f}")
        # BatchNorm magnifies rounding (it divides by the batch's spread): 1 % of the tensor's scale, where a
        # wrong gradient, statistic or mask is off by its whole size (--wrong-mask shows it).
        if diff > 1e-2 * max(scale, 1e-3):
            failures.append(f"{n}: differs by up to {diff:.3g} (largest |value| {scale:.3g})")
    with torch.no_grad():
        probs = torch.stack([F.softmax(forward(p, st, m, xt), dim=1) for m in range(a.members)])
    member = [float((pm.argmax(1) == yt).double().mean()) for pm in probs]
    ensemble = float((probs.mean(0).argmax(1) == yt).double().mean())
    compare_accuracies(epochs[-1], member, ensemble, a.test, failures)
    for f in failures:
        print("torch_keras_trajectory: DIFFERENCE:", f)
    print("torch_keras_trajectory:", "FAILED" if failures else "pmapcc and PyTorch agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
