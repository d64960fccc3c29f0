#!/usr/bin/env bash
# The main job, from a fresh Debian machine: install dependencies, fetch MNIST, build (Release), and
# train + evaluate an MNIST CNN ensemble with sensible defaults (one member per CPU core, 10 epochs,
# the Flax recipe). Extra arguments go to mnist_ensemble (e.g. --members 4 --epochs 3); see --help.
# Outputs land in out/: metrics.json, metrics.csv, accuracy.svg, predictions.csv, checkpoint.safetensors.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

bash scripts/setup.sh
bash scripts/get_data.sh --mnist-only
build=build/demo
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPMAPCC_BUILD_TESTS=OFF -DPMAPCC_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target mnist_ensemble -j "$(nproc)" >/dev/null
mkdir -p out
exec "$build/examples/mnist_ensemble" --data data/mnist --metrics-json out/metrics.json \
  --metrics-csv out/metrics.csv --plot out/accuracy.svg --predict out/predictions.csv \
  --save out/checkpoint.safetensors "$@"
