#!/usr/bin/env bash
# CTest driver: regenerates PyTorch's gradients (torch_grad_reference.py), checks the committed copy
# (grad_reference.json, what the main test run reads) agrees with them, and runs the doctest case against
# the fresh file.   run_torch_grad.sh PMAPCC_TESTS
# Exit 77 (skipped) where /usr/bin/python3 has no PyTorch.
set -u
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 "$here/torch_grad_reference.py" "$work/grad_reference.json"
rc=$?
[ $rc -eq 0 ] || exit $rc
/usr/bin/python3 - "$here/grad_reference.json" "$work/grad_reference.json" <<'PY' || exit 1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
def close(x, y):
    if isinstance(x, list):
        return len(x) == len(y) and all(close(p, q) for p, q in zip(x, y))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(close(x[k], y[k]) for k in x)
    return abs(x - y) <= 1e-6 * max(1.0, abs(y))
if not close(a, b):
    sys.exit("run_torch_grad: the committed grad_reference.json differs from this PyTorch's; regenerate it")
print("the committed grad_reference.json agrees with this PyTorch")
PY
PMAPCC_GRAD_REFERENCE="$work/grad_reference.json" "$1" -tc="grad: PyTorch*"
