#!/usr/bin/env bash
# Installs ONNX Runtime for Node (npm's onnxruntime-node, which ships the Linux x64 runtime) into
# .cache/onnxruntime-node, where tests/onnx/run_onnx_tests.sh looks for it (PMAPCC_ORT_NODE overrides).
# npm's install script is skipped: it only fetches the optional CUDA provider, from outside the npm registry;
# the CPU runtime is in the package itself. Does nothing when it is already there.
# usage: scripts/get_onnxruntime.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
package="onnxruntime-node@1.30.0"
dest=.cache/onnxruntime-node
if [[ -f "$dest/node_modules/onnxruntime-node/package.json" ]] &&
   node -e "require('./$dest/node_modules/onnxruntime-node')" 2>/dev/null; then
  exit 0
fi
command -v npm >/dev/null || { echo "get_onnxruntime.sh: error: npm is needed (scripts/setup.sh)" >&2; exit 1; }
echo "get_onnxruntime.sh: installing $package into $dest"
mkdir -p "$dest"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! (cd "$dest" && npm install --no-audit --no-fund --no-save --ignore-scripts "$package") >"$log" 2>&1; then
  cat "$log" >&2
  echo "get_onnxruntime.sh: error: npm install $package failed" >&2
  exit 1
fi
node -e "require('./$dest/node_modules/onnxruntime-node')" ||
  { echo "get_onnxruntime.sh: error: $package does not load" >&2; exit 1; }
