#!/usr/bin/env bash
# Every check that needs a GPU, run from the repository root of a CUDA machine (fresh checkout), stage by
# stage; each stage is bounded by a timeout well inside 10 minutes, so a session can run the stages in a
# few invocations of a 10-minute limit (for example: `info build cuda`, `suite sanitize`, `train bench
# summary`). A stage that fails makes the exit status non-zero; the other stages named still run.
#
# usage: scripts/gpu_checks.sh [--build DIR] [--data DIR] [--deps FILE] STAGE...   (no stage: all of them)
#   pack-deps  (on a machine with the Debian packages, not the GPU): packs Eigen, doctest, nlohmann-json, CLI11
#              and zlib's headers
#              and CMake files into .gpudeps/deps.tar.gz (ignored by git) for a bare GPU machine; carry it
#   info       pmap_info --require-gpu (built first if needed): GPU, driver, CUDA runtime, cuBLAS and NCCL
#              versions; fails when no GPU is usable
#   build      unpacks --deps when Eigen is missing, finds NCCL (the CUDA toolkit's, or the one in python3's
#              nvidia-nccl package), configures Release with CUDA and NCCL required, builds everything
#   cuda       the CUDA tests (ctest -R cuda) with PMAPCC_REQUIRE_GPU=1: a skipped GPU test fails
#   suite      the whole ctest suite with PMAPCC_REQUIRE_GPU=1
#   sanitize   compute-sanitizer memcheck and initcheck over the CUDA tests (graph-captured train steps
#              included) and a short mnist_ensemble --backend cuda run; racecheck and synccheck too once a
#              kernel uses shared memory or barriers (none does: they would check nothing)
#   train      mnist_ensemble --backend cuda, 1, 4 and 8 members on one GPU, against --backend cpu:
#              initial parameters bitwise equal, a 20-step loss trajectory within 1e-4, and the same GPU
#              run twice bitwise equal (losses and checkpoint tensors); and --mode model-parallel --mesh 1x2
#              against the CPU (20-step losses within 1e-4)
#   bench      bench_cuda_train beside the project's PyTorch reference, bench/torch_flax_cnn.py --device cuda
#              (where PyTorch has CUDA), and a JAX program where ANCHORS=DIR holds jax_cnn_ensemble.py;
#              1, 4 and 8 members
#   summary    one JSON file, bench/results/gpu-checks-<device>-<date>.json: the device, versions, every
#              stage's result and the benchmark lines
# Logs: <build>/gpu_checks/ (stage results accumulate there across invocations, for the summary).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

build=build/gpu
data=data/mnist
deps=.gpudeps/deps.tar.gz
stages=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --deps) deps=$2; shift 2 ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    pack-deps | info | build | cuda | suite | sanitize | train | bench | summary | all) stages+=("$1"); shift ;;
    *) echo "gpu_checks.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#stages[@]} -eq 0 || " ${stages[*]} " == *" all "* ]] && stages=(info build cuda suite sanitize train bench summary)
logs="$build/gpu_checks"
mkdir -p "$logs"
results="$logs/stages.jsonl"
failed=()
export PMAPCC_REQUIRE_GPU=1  # a GPU test that skips is a failure here (tests/cuda_testing.h, the CLI test)
export build data deps logs root

# run_stage NAME LIMIT_SECONDS FUNCTION: runs it under a timeout, logs it, records the result.
run_stage() {
  local name=$1 limit=$2 fn=$3 t0=$SECONDS rc
  echo "== [$name] (limit ${limit} s, log $logs/$name.log)"
  timeout --kill-after=10 "$limit" bash -c "$(declare -f); stage_helpers; $fn" >"$logs/$name.log" 2>&1
  rc=$?
  local secs=$((SECONDS - t0))
  if [[ $rc -eq 0 ]]; then
    echo "   ok in ${secs} s: $(tail -n 1 "$logs/$name.log")"
  else
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "   TIMED OUT after ${secs} s" || echo "   FAILED (exit $rc) after ${secs} s:"
    tail -n 25 "$logs/$name.log" | sed 's/^/     /'
    failed+=("$name")
  fi
  printf '{"stage": "%s", "exit": %d, "seconds": %d, "at": "%s"}\n' "$name" "$rc" "$secs" "$(date -u +%FT%TZ)" >>"$results"
}

# Shared by the stages (they run in child shells): paths and small helpers.
stage_helpers() {
  tests="$build/tests/pmapcc_tests"
  program="$build/examples/mnist_ensemble"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # Raw IDX files for the references and the program (the .gz files travel; the reader takes either).
  raw_data() {
    local out="$build/mnist-raw"
    mkdir -p "$out"
    for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
      [[ -s "$out/$f" ]] && continue
      if [[ -s "$data/$f" ]]; then cp "$data/$f" "$out/$f"; elif [[ -s "$data/$f.gz" ]]; then gunzip -c "$data/$f.gz" >"$out/$f"; fi
    done
    echo "$out"
  }
  # The safetensors tensor bytes of two files are equal (their metadata, with timings, may differ).
  same_tensors() {
    python3 - "$1" "$2" <<'PY'
import struct, sys
def tensors(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; return b[8 + n:]
sys.exit(0 if tensors(sys.argv[1]) == tensors(sys.argv[2]) else 1)
PY
  }
}

stage_pack_deps() {
  mkdir -p .gpudeps
  grep -qx '/.gpudeps/' .git/info/exclude 2>/dev/null || echo '/.gpudeps/' >>.git/info/exclude
  tar -czf "$deps" -C / usr/include/eigen3 usr/share/eigen3 usr/include/doctest usr/lib/cmake/doctest \
    usr/include/nlohmann usr/share/cmake/nlohmann_json usr/include/CLI usr/share/cmake/CLI11 \
    usr/include/zlib.h usr/include/zconf.h usr/lib/x86_64-linux-gnu/libz.so usr/lib/x86_64-linux-gnu/libz.a
  ls -la "$deps"
}

stage_build() {
  local tool
  for tool in cmake ninja python3; do
    command -v "$tool" >/dev/null || { echo "build: '$tool' is not on PATH on this machine"; return 1; }
  done
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    { echo "build: no nvcc on PATH or in /usr/local/cuda/bin"; return 1; }
  if [[ ! -e /usr/share/eigen3/cmake/Eigen3Config.cmake && ! -s "$deps" ]]; then
    echo "build: Eigen is not installed and $deps is missing: run 'scripts/gpu_checks.sh pack-deps' on a machine"
    echo "       with the Debian packages (scripts/setup.sh) and carry .gpudeps"
    return 1
  fi
  if [[ ! -e /usr/share/eigen3/cmake/Eigen3Config.cmake && -s "$deps" ]]; then
    echo "unpacking $deps into / (Eigen, doctest, nlohmann-json, CLI11, zlib headers)"
    tar -xzf "$deps" -C /
  fi
  local nccl=()
  if [[ ! -e /usr/local/cuda/include/nccl.h ]]; then
    local py
    py=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
    if [[ -n "$py" && -e "$py/include/nccl.h" ]]; then
      mkdir -p "$build/nccl-lib"
      ln -sf "$py"/lib/libnccl.so.2 "$build/nccl-lib/libnccl.so"
      nccl=(-DNCCL_INCLUDE_DIR="$py/include" -DNCCL_LIBRARY="$root/$build/nccl-lib/libnccl.so")
      echo "NCCL from python3's nvidia-nccl package: $py"
    fi
  fi
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPMAPCC_WITH_CUDA=ON -DPMAPCC_WITH_NCCL=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 "${nccl[@]}" || return 1
  cmake --build "$build" -j "$(nproc)"
}

stage_info() {
  [[ -x "$build/examples/pmap_info" ]] || stage_build >/dev/null || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$build/examples/pmap_info" --require-gpu
}

stage_cuda() {
  ctest --test-dir "$build" -R cuda --output-on-failure --timeout 300
}

stage_suite() {
  ctest --test-dir "$build" --output-on-failure -j 8 --timeout 300
}

stage_sanitize() {
  local cases='cuda*' skip='cuda NCCL*'  # NCCL's own transport is outside what the sanitizers can follow
  local rc=0 tools=(memcheck initcheck)
  # racecheck looks only at shared-memory accesses and synccheck only at barriers: no kernel has either
  # today (the first H100 run's racecheck alone outran the stage's limit checking nothing). They come back
  # by themselves when a kernel does.
  if grep -rqE '__shared__|__syncthreads|__syncwarp|cooperative_groups' kernels src include; then
    tools+=(racecheck synccheck)
  fi
  for tool in "${tools[@]}"; do
    echo "-- $tool: CUDA tests"
    local extra=()
    [[ $tool == memcheck ]] && extra=(--leak-check full)
    "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 1 "$tests" -tc="$cases" -tce="$skip" || rc=1
  done
  local d
  d=$(raw_data)
  for tool in memcheck initcheck; do
    echo "-- $tool: mnist_ensemble --backend cuda, 8 members, 1 epoch of 10 steps (captured train steps)"
    "$sanitizer" --tool "$tool" --error-exitcode 1 "$program" --data "$d" --backend cuda --devices 1 --members 8 \
      --train-limit 1280 --test-limit 500 --epochs 1 --progress none || rc=1
  done
  return $rc
}

stage_train() {
  local d w rc=0
  d=$(raw_data)
  w="$logs/train"
  mkdir -p "$w"
  for m in 1 4 8; do
    local base=("$program" --data "$d" --devices 1 --members "$m" --test-limit 1000 --progress none)
    "${base[@]}" --backend cpu --epochs 0 --save "$w/init-cpu-$m.st" >/dev/null || return 1
    "${base[@]}" --backend cuda --epochs 0 --save "$w/init-gpu-$m.st" >/dev/null || return 1
    if same_tensors "$w/init-cpu-$m.st" "$w/init-gpu-$m.st"; then
      echo "ok   $m member(s): initial parameters bitwise equal on CPU and GPU"
    else
      echo "FAIL $m member(s): initial parameters differ between CPU and GPU"; rc=1
    fi
    # 20 steps: 20 epochs of one full-batch step of 128 images (each epoch's train_loss is its step's loss).
    local steps=(--train-limit 128 --batch-size 128 --epochs 20)
    "${base[@]}" "${steps[@]}" --backend cpu --metrics-json "$w/cpu-$m.json" --save "$w/cpu-$m.st" >/dev/null || return 1
    for run in 1 2; do
      "${base[@]}" "${steps[@]}" --backend cuda --metrics-json "$w/gpu-$m-$run.json" --save "$w/gpu-$m-$run.st" \
        >/dev/null || return 1
    done
    python3 - "$w/cpu-$m.json" "$w/gpu-$m-1.json" "$w/gpu-$m-2.json" "$m" <<'PY' || rc=1
import json, sys
cpu, g1, g2 = ([e["train_loss"] for e in json.load(open(p))["epochs"]] for p in sys.argv[1:4])
worst = max(abs(a - b) / abs(b) for a, b in zip(g1, cpu))
print(f"{'ok  ' if worst <= 1e-4 else 'FAIL'} {sys.argv[4]} member(s): 20-step loss trajectory GPU vs CPU, "
      f"worst relative difference {worst:.2e} (first {cpu[0]:.6f}, last {cpu[-1]:.6f} vs {g1[-1]:.6f})")
print(f"{'ok  ' if g1 == g2 else 'FAIL'} {sys.argv[4]} member(s): two GPU runs give the same losses bitwise")
sys.exit(0 if worst <= 1e-4 and g1 == g2 else 1)
PY
    if same_tensors "$w/gpu-$m-1.st" "$w/gpu-$m-2.st"; then
      echo "ok   $m member(s): two GPU runs end with the same parameters bitwise"
    else
      echo "FAIL $m member(s): two GPU runs end with different parameters"; rc=1
    fi
  done
  # Model parallelism: one model's dense weights split over 2 devices (virtual devices sharing the GPU when
  # there is one GPU), the split layers' psums and gathers between the CUDA kernels, against the same mesh
  # of CPU devices: 20 steps' losses within 1e-4.
  local mp=("$program" --data "$d" --mode model-parallel --mesh 1x2 --devices 2 --test-limit 1000 --progress none
            --train-limit 128 --batch-size 128 --epochs 20)
  "${mp[@]}" --backend cpu --metrics-json "$w/mp-cpu.json" >/dev/null || return 1
  "${mp[@]}" --backend cuda --metrics-json "$w/mp-gpu.json" >/dev/null || return 1
  python3 - "$w/mp-cpu.json" "$w/mp-gpu.json" <<'PY' || rc=1
import json, sys
cpu, gpu = ([e["train_loss"] for e in json.load(open(p))["epochs"]] for p in sys.argv[1:3])
worst = max(abs(a - b) / abs(b) for a, b in zip(gpu, cpu))
print(f"{'ok  ' if worst <= 1e-4 else 'FAIL'} model parallel 1x2: 20-step loss trajectory GPU vs CPU, worst relative "
      f"difference {worst:.2e}")
sys.exit(0 if worst <= 1e-4 else 1)
PY
  [[ $rc -eq 0 ]] && echo "train: all checks passed"
  return $rc
}

stage_bench() {
  local d anchors=${ANCHORS:-} rc=0
  d=$(raw_data)
  "$build/bench/bench_cuda_train" --data "$d" --steps 200 || rc=1
  # PyTorch beside it: the project's own reference (bench/torch_flax_cnn.py, the same model and recipe), where
  # the machine's Python has PyTorch with CUDA. JAX's, only where ANCHORS names a folder with
  # jax_cnn_ensemble.py (this repository carries no JAX program).
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    for m in 1 4 8; do
      for mode in loop vmap; do
        python3 bench/torch_flax_cnn.py --data "$d" --members "$m" --steps 200 --mode "$mode" --device cuda || rc=1
      done
    done
  else
    echo "bench: no PyTorch with CUDA on this machine: bench/torch_flax_cnn.py --device cuda not run"
  fi
  if [[ -n "$anchors" && -f "$anchors/jax_cnn_ensemble.py" ]]; then
    for m in 1 4 8; do
      python3 "$anchors/jax_cnn_ensemble.py" --data "$d" --members "$m" --steps 200 --mode vmap || rc=1
    done
  fi
  return $rc
}

stage_summary() {
  mkdir -p bench/results
  python3 - "$logs" <<'PY'
import datetime, json, os, re, subprocess, sys
logs = sys.argv[1]
def read(name):
    p = os.path.join(logs, name)
    return open(p).read() if os.path.exists(p) else ""
info = read("info.log").strip().splitlines()
device = next((l.split(":", 1)[1].split(",")[0].strip() for l in info if l.startswith("GPU 0:")), "unknown GPU")
stages = [json.loads(l) for l in read("stages.jsonl").splitlines() if l.strip()]
latest = {}
for s in stages:
    latest[s["stage"]] = s
bench = []
for line in read("bench.log").splitlines():
    line = line.strip()
    if line.startswith("{") and "model_images_per_s" in line:
        try:
            bench.append(json.loads(line))
        except ValueError:
            pass
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
now = datetime.datetime.now(datetime.timezone.utc)
out = {"date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit, "device": device, "info": info,
       "stages": latest, "train": read("train.log").strip().splitlines(), "bench": bench}
slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()
path = os.path.join("bench", "results", f"gpu-checks-{slug}-{now.strftime('%Y%m%d-%H%M%S')}.json")
json.dump(out, open(path, "w"), indent=2)
print(path)
PY
}

for s in "${stages[@]}"; do
  case "$s" in
    pack-deps) run_stage pack-deps 120 stage_pack_deps ;;
    info) run_stage info 540 stage_info ;;
    build) run_stage build 540 stage_build ;;
    cuda) run_stage cuda 540 stage_cuda ;;
    suite) run_stage suite 570 stage_suite ;;
    sanitize) run_stage sanitize 570 stage_sanitize ;;
    train) run_stage train 540 stage_train ;;
    bench) run_stage bench 570 stage_bench ;;
    summary) run_stage summary 60 stage_summary ;;
  esac
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "gpu_checks.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu_checks.sh: ${stages[*]}: all passed"
