#!/usr/bin/env bash
# CTest driver of torch_trajectory.py on a small synthetic IDX dataset: run_torch_trajectory.sh MNIST_ENSEMBLE.
# Exit 77 (skipped) where /usr/bin/python3 has no PyTorch.
set -u
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/../cli/make_idx.py" "$work" 512 512 0.1 || exit 1
/usr/bin/python3 "$here/torch_trajectory.py" "$1" "$work"
