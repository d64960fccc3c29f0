#!/usr/bin/env python3
"""PyTorch reference for pmapcc's flax-cnn recipe, for bench/run_train_bench.py: an ensemble trained on CPU.

The model of Flax's MNIST example as pmapcc builds it (train/model.h: train::flax_cnn): Conv(32, 3x3,
same) - ReLU - AvgPool(2) - Conv(64, 3x3, same) - ReLU - AvgPool(2) - Dense(256) - ReLU - Dense(10), trained
with SGD (lr 0.1, momentum 0.9) on batches of 128. M members see the same batches, as in pmapcc's ensemble.
Two ways to run M members in PyTorch:
  loop  one module and one torch.optim.SGD per member, stepped one after another;
  vmap  the members' parameters stacked on a leading axis and one vmap(grad(loss)) over them (torch.func in
        PyTorch 2, functorch in 1.13), the momentum update written out.
Prints one JSON line: the configuration, model-images/s (members x batch x timed steps / seconds, the first
step left out as warm-up) and each member's and the ensemble's test accuracy.

  /usr/bin/python3 bench/torch_flax_cnn.py --data data/mnist [--members 2] [--steps 100] [--threads 1]
      [--mode loop|vmap] [--batch 128] [--seed 0] [--device cpu|cuda]

--device cuda runs it on the GPU (scripts/gpu_checks.sh's bench stage, beside bench_cuda_train), the data
moved there once and the timed steps closed by a synchronize.

Needs NumPy and PyTorch (Debian's python3-numpy and python3-torch). run_train_bench.py runs it with
LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread (OpenBLAS for the dense layers, one BLAS thread:
PyTorch's own threads do the parallel work), which is its fastest configuration here.
"""
import argparse, contextlib, json, os, struct, time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
import torch
import torch.nn.functional as F


def idx(path):
    with open(path, "rb") as f:
        rank = f.read(4)[3]
        shape = struct.unpack(">" + "I" * rank, f.read(4 * rank))
        return np.frombuffer(f.read(), np.uint8).reshape(shape)


def split(folder, images, labels):
    x = idx(os.path.join(folder, images)).astype(np.float32)[:, None] / 255.0
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(idx(os.path.join(folder, labels)).astype(np.int64))


def member():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


class Loop:
    """Each member its own module and optimizer."""

    def __init__(self, members, lr, momentum):
        self.members = members
        self.optimizers = [torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum) for m in members]

    def step(self, x, y):
        for m, opt in zip(self.members, self.optimizers):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()
            opt.step()

    def probabilities(self, x):
        with torch.no_grad():
            return torch.stack([F.softmax(m(x), dim=-1) for m in self.members])


class Vmapped:
    """The members' parameters stacked; one vmapped gradient per step; SGD momentum as torch.optim.SGD's rule
    (buffer = momentum * buffer + grad; param -= lr * buffer)."""

    def __init__(self, members, lr, momentum):
        try:
            from torch.func import functional_call, grad, stack_module_state, vmap
            stacked, _ = stack_module_state(members)
            names = list(stacked)
            template = member().to("meta")
            self.apply = lambda params, x: functional_call(template, dict(zip(names, params)), (x,))
            self.params = [stacked[n].detach() for n in names]
        except ImportError:  # PyTorch 1.13
            from functorch import combine_state_for_ensemble, grad, vmap
            fn, params, _ = combine_state_for_ensemble(members)
            self.apply = lambda ps, x: fn(ps, (), x)
            self.params = [p.detach().requires_grad_(False) for p in params]
        self.vmap = vmap
        self.buffers = [torch.zeros_like(p) for p in self.params]
        self.grads = vmap(grad(lambda ps, x, y: F.cross_entropy(self.apply(ps, x), y)), in_dims=(0, None, None))
        self.lr, self.momentum = lr, momentum

    def step(self, x, y):
        for p, b, g in zip(self.params, self.buffers, self.grads(self.params, x, y)):
            b.mul_(self.momentum).add_(g)
            p.sub_(self.lr * b)

    def probabilities(self, x):
        with torch.no_grad():
            return F.softmax(self.vmap(self.apply, in_dims=(0, None))(self.params, x), dim=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="folder with the four MNIST IDX files")
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100, help="training steps, the first one untimed")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mode", choices=("loop", "vmap"), default="loop")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda where PyTorch has a GPU")
    ap.add_argument("--autocast", choices=("off", "bf16"), default="off",
                    help="bf16: the training steps under torch.autocast(device, dtype=torch.bfloat16)")
    a = ap.parse_args()
    if a.members < 1 or a.steps < 2 or a.batch < 1 or a.threads < 1:
        ap.error("--members, --batch and --threads must be >= 1 and --steps >= 2")
    if a.device != "cpu" and not (a.device.startswith("cuda") and torch.cuda.is_available()):
        ap.error(f"--device {a.device}: this PyTorch has no such device (cpu, or cuda with a GPU)")
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = (t.to(device) for t in split(a.data, "train-images-idx3-ubyte", "train-labels-idx1-ubyte"))
    xt, yt = (t.to(device) for t in split(a.data, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))
    if a.steps * a.batch > len(x):
        ap.error(f"--steps {a.steps} x --batch {a.batch} is more than the {len(x)} training images")
    runner = (Loop if a.mode == "loop" else Vmapped)([member().to(device) for _ in range(a.members)], a.lr,
                                                      a.momentum)
    order = torch.randperm(len(x))[: a.steps * a.batch].view(a.steps, a.batch).to(device)

    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if a.autocast == "bf16" \
        else contextlib.nullcontext
    with autocast():
        runner.step(x[order[0]], y[order[0]])  # warm-up: allocations and the first-call costs
    sync()
    start = time.perf_counter()
    for s in range(1, a.steps):
        with autocast():
            runner.step(x[order[s]], y[order[s]])
    sync()
    seconds = time.perf_counter() - start

    probs = torch.cat([runner.probabilities(xt[i:i + 1000]) for i in range(0, len(xt), 1000)], dim=1)
    accuracy = lambda p: round((p.argmax(-1) == yt).double().mean().item(), 4)
    print(json.dumps({
        "framework": f"torch-{torch.__version__}", "model": "flax-cnn", "device": a.device, "mode": a.mode,
        "autocast": a.autocast,
        "members": a.members,
        "threads": a.threads, "batch": a.batch, "timed_steps": a.steps - 1, "seconds": round(seconds, 3),
        "model_images_per_s": round(a.members * a.batch * (a.steps - 1) / seconds, 1),
        "member_test_acc": [accuracy(p) for p in probs], "ensemble_test_acc": accuracy(probs.mean(0)),
    }))


if __name__ == "__main__":
    main()
