#!/usr/bin/env bash
# CTest driver of a tests/reference check on a small synthetic IDX dataset:
# run_torch_trajectory.sh MNIST_ENSEMBLE [SCRIPT]   (SCRIPT: torch_trajectory.py, the default, or torch_keras_trajectory.py)
# Exit 77 (skipped) where /usr/bin/python3 has no PyTorch.
set -u
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/../cli/make_idx.py" "$work" 512 512 0.1 || exit 1
/usr/bin/python3 "$here/${2:-torch_trajectory.py}" "$1" "$work"
