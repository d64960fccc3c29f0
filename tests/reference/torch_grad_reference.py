"""The gradients of tests/test_grad_reference.cpp's functions by PyTorch's autograd (float32), the oracle for
pmapcc's VJPs. The functions and their inputs are written the same way in both files: input i of a case
holds float32(sin(1.3 k + 0.7 i + case)) for its k-th element (labels: k * 7 % classes).

  torch_grad_reference.py OUT.json    writes {case: {"value": v, "grads": [[...], ...]}}
Exit 77 when PyTorch is not installed (Debian's python3-torch: scripts/setup.sh --bench)."""
import json, math, sys

try:
    import torch
except ImportError:
    print("torch_grad_reference: PyTorch is not installed (python3-torch); skipping")
    sys.exit(77)


def inputs(case, shapes):
    out = []
    for i, shape in enumerate(shapes):
        n = math.prod(shape)
        v = [math.sin(1.3 * k + 0.7 * i + case) for k in range(n)]
        out.append(torch.tensor(v, dtype=torch.float32).reshape(shape).requires_grad_(True))
    return out


def labels(n, classes):
    return torch.tensor([k * 7 % classes for k in range(n)], dtype=torch.int64)


def gelu(x):  # jax.nn.gelu(approximate=True)
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def mlp(x, w1, b1, w2):
    logits = torch.relu(x @ w1 + b1) @ w2
    return torch.nn.functional.cross_entropy(logits, labels(5, 3))


def elementwise(a, b):
    y = gelu(a * b) + torch.sigmoid(a) * torch.tanh(b) + torch.exp(a) / (1 + b * b)
    y = y + torch.log(1 + a * a) - torch.sqrt(1 + b * b) + torch.abs(a - 0.05) - torch.maximum(a, b) * 0.5
    y = y + torch.minimum(a, b * 0.3) - a / (2 + b)
    return torch.mean(y)


def softmax_weighted(x, w):
    return torch.sum(torch.softmax(x, dim=-1) * w)


def matmuls(a, b, c):
    t = a.t() @ b                 # (4, 3)
    u = t @ c.t()                 # (4, 2)
    v = (a @ t).sum(0)            # (3,)
    return torch.sum(u * u) * 0.1 + torch.sum(v) + torch.sum(torch.sum(a, 0) * torch.mean(b, 0).sum())


def residual(x, w, b):
    h = torch.relu(x @ w + b) + x  # a residual block: x used twice
    return torch.mean(torch.square(h.reshape(-1)))


def cnn(x, w1, b1, w2):  # NHWC and HWIO as pmapcc, moved to PyTorch's NCHW and OIHW
    h = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w1.permute(3, 2, 0, 1), b1, padding=1)
    h = torch.nn.functional.avg_pool2d(torch.relu(h), 2, 2)
    h = torch.nn.functional.conv2d(h, w2.permute(3, 2, 0, 1))  # VALID
    return torch.nn.functional.cross_entropy(h.mean(dim=(2, 3)), labels(2, 3))


def batchnorm(x, gamma, beta):  # training: the batch's statistics, Keras's epsilon
    y = torch.nn.functional.batch_norm(x.reshape(-1, 3), torch.zeros(3), torch.ones(3), gamma, beta, training=True,
                                       eps=1e-3)
    return torch.mean(torch.square(torch.relu(y) + 0.3 * y))


def nhwc_max_pool(h, window, stride, pads=(0, 0, 0, 0)):  # NHWC as pmapcc; pads (left, right, top, bottom)
    h = torch.nn.functional.pad(h.permute(0, 3, 1, 2), pads, value=-math.inf)
    return torch.nn.functional.max_pool2d(h, window, stride).permute(0, 2, 3, 1)


def layout(x, w, b):  # transpose, max_pool (VALID and Keras's "same"), slice, concatenate, axis reductions
    h = x.permute(0, 2, 1, 3)                         # (2, 5, 4, 3)
    p = nhwc_max_pool(h, 2, 1)                        # (2, 4, 3, 3)
    q = nhwc_max_pool(h, 3, 2, (0, 1, 1, 1))          # "same": H pads 1 + 1, W 0 + 1 (the extra after): (2, 3, 2, 3)
    c = torch.cat([p[:, 1:3, 0:2, :], q[:, 0:2]], 1)  # (2, 4, 2, 3)
    z = c.sum(2) @ w + b                              # (2, 4, 4)
    z = z - 0.5 * torch.amax(z, 0, keepdim=True).expand(2, 4, 4)
    return -torch.log_softmax(z, -1).mean((0, 1)).sum()


def reductions(x, y):  # max, mean with keepdims, broadcast_to, axis sums, transpose and slice
    a = torch.amax(x, (1, 2))                                     # (3,)
    c = torch.square(x - x.mean(-1, keepdim=True).expand(3, 4, 5))
    d = y.expand(3, 4, 5) * c                                     # y (4, 1)
    e = x.permute(2, 0, 1)[1:4, 0:3, 2:4]
    return 0.1 * d.sum((0, 2)).sum() + torch.sum(a * a) + e.sum()


CASES = {
    "mlp": (mlp, [(5, 4), (4, 6), (6,), (6, 3)]),
    "elementwise": (elementwise, [(3, 4), (4,)]),
    "softmax_weighted": (softmax_weighted, [(3, 5), (3, 5)]),
    "matmuls": (matmuls, [(6, 4), (6, 3), (2, 3)]),
    "residual": (residual, [(4, 5), (5, 5), (5,)]),
    "batchnorm": (batchnorm, [(4, 2, 3), (3,), (3,)]),
    "cnn": (cnn, [(2, 6, 6, 1), (3, 3, 1, 4), (4,), (2, 2, 4, 3)]),
    "layout": (layout, [(2, 4, 5, 3), (3, 4), (4,)]),
    "reductions": (reductions, [(3, 4, 5), (4, 1)]),
}


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = {}
    for case, (name, (fn, shapes)) in enumerate(CASES.items()):
        xs = inputs(case, shapes)
        value = fn(*xs)
        value.backward()
        out[name] = {"value": value.item(), "grads": [x.grad.reshape(-1).tolist() for x in xs]}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
