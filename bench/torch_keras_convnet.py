#!/usr/bin/env python3
"""PyTorch reference for pmapcc's keras-convnet recipe: the same model, initializers and optimizer rule.

The model of the Keras multi-GPU guides as pmapcc builds it (train/model.h: train::keras_convnet) on images
already scaled to [0, 1], trained with Keras's Adam(1e-3) on batches of 64 (the last partial batch
dropped), data reshuffled every epoch; M members side by side on the same batches, one optimizer over all
of them (Adam is element-wise, so this is M independent optimizers). Prints one JSON line: the
configuration, images/s (members x examples per second over the timed steps, after --warmup steps),
each member's test accuracy and NLL, and the ensemble's (the mean of the members' softmax).

  /usr/bin/python3 bench/torch_keras_convnet.py --data data/mnist [--epochs 2] [--members 1]
      [--seed 0] [--threads 1] [--train-limit N] [--warmup 20]

Needs NumPy and PyTorch (Debian's python3-numpy and python3-torch). The semantics that PyTorch's defaults
do not have, written out below: Keras's "same" padding, glorot-uniform kernels, BatchNormalization with a
shift only (momentum 0.99 in Keras's convention, epsilon 1e-3, moving variance from the biased batch
variance) and Adam with epsilon 1e-7 added to sqrt(v) before the bias correction.
"""
import argparse, json, math, os, struct, time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
import torch
import torch.nn.functional as F


def idx(path):
    with open(path, "rb") as f:
        head = f.read(4)
        rank = head[3]
        shape = struct.unpack(">" + "I" * rank, f.read(4 * rank))
        return np.frombuffer(f.read(), np.uint8).reshape(shape)


def mnist(folder, limit):
    def part(images, labels, n=None):
        x = idx(os.path.join(folder, images))[:n].astype(np.float32) / 255.0
        return torch.from_numpy(x[:, None].copy()), torch.from_numpy(idx(os.path.join(folder, labels))[:n].astype(np.int64))
    return part("train-images-idx3-ubyte", "train-labels-idx1-ubyte", limit) + \
        part("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def glorot(shape, fan_in, fan_out, gen):
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(shape, generator=gen) * 2 - 1) * bound


def tf_same(x, k, s):
    """Pads NCHW x as TensorFlow's 'same': ceil(size / s) outputs, the odd pixel after."""
    pads = []
    for size in (x.shape[3], x.shape[2]):
        total = max((-(-size // s) - 1) * s + k - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


class Member(torch.nn.Module):
    # (name, in, out, kernel, stride, padding, bias)
    CONVS = [("Conv_0", 1, 12, 3, 1, "same", False), ("Conv_1", 12, 24, 6, 2, "valid", False),
             ("large_k", 24, 32, 6, 2, "same", True)]

    def __init__(self, gen):
        super().__init__()
        self.convs = []
        for name, cin, cout, k, s, pad, bias in self.CONVS:
            w = torch.nn.Parameter(glorot((cout, cin, k, k), cin * k * k, cout * k * k, gen))
            b = torch.nn.Parameter(torch.zeros(cout)) if bias else None
            beta = torch.nn.Parameter(torch.zeros(cout))
            self.register_parameter(name + "_w", w)
            if b is not None:
                self.register_parameter(name + "_b", b)
            self.register_parameter(name + "_beta", beta)
            self.register_buffer(name + "_mean", torch.zeros(cout))
            self.register_buffer(name + "_var", torch.ones(cout))
            self.convs.append((name, k, s, pad))
        self.d0_w = torch.nn.Parameter(glorot((256, 32), 32, 256, gen))
        self.d0_b = torch.nn.Parameter(torch.zeros(256))
        self.d1_w = torch.nn.Parameter(glorot((10, 256), 256, 10, gen))
        self.d1_b = torch.nn.Parameter(torch.zeros(10))

    def forward(self, x):
        for name, k, s, pad in self.convs:
            if pad == "same":
                x = tf_same(x, k, s)
            x = F.conv2d(x, getattr(self, name + "_w"), getattr(self, name + "_b", None), s)
            mean, var = getattr(self, name + "_mean"), getattr(self, name + "_var")
            if self.training:
                batch_mean = x.mean((0, 2, 3))
                batch_var = x.var((0, 2, 3), unbiased=False)
                with torch.no_grad():
                    mean.mul_(0.99).add_(batch_mean.detach() * 0.01)
                    var.mul_(0.99).add_(batch_var.detach() * 0.01)
                m, v = batch_mean, batch_var
            else:
                m, v = mean, var
            x = (x - m[None, :, None, None]) * torch.rsqrt(v[None, :, None, None] + 1e-3)
            x = F.relu(x + getattr(self, name + "_beta")[None, :, None, None])
        x = F.relu(F.linear(x.mean((2, 3)), self.d0_w, self.d0_b))
        x = F.dropout(x, 0.5, self.training)
        return F.linear(x, self.d1_w, self.d1_b)


class KerasAdamRule(torch.optim.Optimizer):
    """p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps), Keras's placement of epsilon."""

    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-7):
        super().__init__(params, {"lr": lr})
        self.b1, self.b2, self.eps, self.t = b1, b2, eps, 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        for group in self.param_groups:
            alpha = group["lr"] * math.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["m"], st["v"] = torch.zeros_like(p), torch.zeros_like(p)
                st["m"].add_((p.grad - st["m"]) * (1 - self.b1))
                st["v"].add_((p.grad * p.grad - st["v"]) * (1 - self.b2))
                p.sub_(alpha * st["m"] / (st["v"].sqrt() + self.eps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--members", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--train-limit", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=20, help="steps left out of the timing")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # dropout masks
    x, y, xt, yt = mnist(a.data, a.train_limit)
    members = [Member(torch.Generator().manual_seed(a.seed * 1000 + m)) for m in range(a.members)]
    opt = KerasAdamRule([p for m in members for p in m.parameters()])
    order_gen = torch.Generator().manual_seed(a.seed)
    steps_per_epoch = len(x) // a.batch
    step, t0, losses = 0, None, []
    start = time.perf_counter()
    for m in members:
        m.train()
    for epoch in range(a.epochs):
        order = torch.randperm(len(x), generator=order_gen)
        total = 0.0
        for i in range(steps_per_epoch):
            if step == a.warmup:
                t0 = time.perf_counter()
            b = order[i * a.batch:(i + 1) * a.batch]
            xb, yb = x[b], y[b]
            loss = sum(F.cross_entropy(m(xb), yb) for m in members)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() / a.members
            step += 1
        losses.append(total / steps_per_epoch)
    t1 = time.perf_counter()
    with torch.no_grad():
        for m in members:
            m.eval()
        probs = torch.stack([torch.cat([F.softmax(m(xt[i:i + 1000]), -1) for i in range(0, len(xt), 1000)])
                             for m in members])
    nll = lambda p: float(-torch.log(p[torch.arange(len(yt)), yt].clamp_min(1e-12)).mean())
    acc = lambda p: float((p.argmax(-1) == yt).float().mean())
    mean = probs.mean(0)
    timed = step - a.warmup
    print(json.dumps({
        "program": "bench/torch_keras_convnet.py", "torch": torch.__version__, "threads": a.threads,
        "members": a.members, "epochs": a.epochs, "batch": a.batch, "seed": a.seed, "train_examples": len(x),
        "steps": step, "timed_steps": timed,
        "model_images_per_s": round(a.members * a.batch * timed / (t1 - t0), 1) if t0 and timed > 0 else None,
        "train_seconds": round(t1 - start, 2), "train_loss_per_epoch": [round(v, 4) for v in losses],
        "member_test_accuracy": [acc(p) for p in probs], "member_test_nll": [nll(p) for p in probs],
        "ensemble_test_accuracy": acc(mean), "ensemble_test_nll": nll(mean),
    }), flush=True)


if __name__ == "__main__":
    main()
