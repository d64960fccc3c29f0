#!/usr/bin/env bash
# Every check that needs a GPU, run from the repository root of a CUDA machine (fresh checkout), stage by
# stage; each stage is bounded by a timeout well inside 10 minutes, so a session can run the stages in a
# few invocations of a 10-minute limit (for example: `preflight info build cuda`, `suite sanitize`, `train
# bench summary`). A stage that fails makes the exit status non-zero; the other stages named still run.
#
# A lent GPU machine is bare and offline: it gets the working tree and only those ignored paths that the
# device tool's `carry` names (64 MiB in all). So, first, on the development machine (no GPU needed):
#   scripts/get_data.sh --mnist-only && scripts/gpu_checks.sh pack      (fills .gpurun/, prints its size)
# then each device call carries it, and the stages find what is in it by default:
#   carry: [".gpurun"]    command: bash scripts/gpu_checks.sh preflight info build cuda
#
# On a lent machine, two calls of the device tool's 10 minutes each (on its 16 cores) hold a whole run, each
# with what it measured copied back through $OUT:
#   command: bash scripts/gpu_checks.sh --budget 560 preflight info build cuda train
#   command: bash scripts/gpu_checks.sh --budget 560 sanitize bench summary
#
# usage: scripts/gpu_checks.sh [--build DIR] [--data DIR] [--deps FILE] [--budget SECONDS] STAGE...
#        (no stage, or `all`: preflight info build cuda suite sanitize train bench summary)
#   --budget S   this invocation's wall-clock seconds (a device call's limit less a margin): each stage's timeout
#                is cut to what is left (less 15 s), and a stage with under 30 s left is not started (recorded
#                as skipped, exit 125, and counted as failed), so the script ends before the caller kills it
#   OUT=DIR      (the device tool's folder of files that come back) every stage's log is written under
#                DIR/gpu_checks/ as the stage runs, so a run killed mid-stage still leaves what it printed;
#                the stage results (stages.jsonl), earlier invocations' logs and the summary JSON are copied
#                there after each stage and on exit (an EXIT/INT/TERM trap)
#   --data DIR   MNIST's four IDX files, raw or .gz (default data/mnist, or .gpurun/mnist where that is absent)
#   --deps FILE  the headers tarball (default .gpudeps/deps.tar.gz, or .gpurun/deps.tar.gz where that is absent)
#   ANCHORS=DIR  a folder with jax_cnn_ensemble.py for bench (default .gpurun/anchors where that exists)
#   pack       (here, not on the GPU machine) fills the ignored folder .gpurun/ with what a bare machine lacks:
#              deps.tar.gz (as pack-deps makes it), MNIST as .gz files (from --data) and a copy of
#              ../shared/anchors where that exists; fails when .gpurun/ outgrows 60 MiB
#   pack-deps  (on a machine with the Debian packages, not the GPU): packs Eigen, doctest, nlohmann-json, CLI11
#              and zlib's headers and CMake files into .gpudeps/deps.tar.gz (or --deps FILE; ignored by git)
#              for a bare GPU machine; carry it (pack makes the same file in .gpurun/)
#   preflight  no build: one line for each tool or file a later stage needs (cmake, ninja, python3, nvcc, the
#              GPU, compute-sanitizer, NCCL, Eigen or --deps, the MNIST data, python3's torch, the anchors),
#              naming the stage that a missing one disables and what to carry; fails only when a stage named
#              in this invocation (all of them, when preflight runs alone) cannot run without it; a missing
#              compute-sanitizer, torch or anchors folder only warns
#   info       pmap_info --require-gpu (built first if needed): GPU, driver, CUDA runtime, cuBLAS and NCCL
#              versions; fails when no GPU is usable
#   build      unpacks --deps when Eigen is missing, finds NCCL (the CUDA toolkit's, or the one in python3's
#              nvidia-nccl package), configures Release with CUDA and NCCL required, builds everything
#   cuda       the CUDA tests (ctest -R cuda) with PMAPCC_REQUIRE_GPU=1: a skipped GPU test fails
#   suite      the whole ctest suite with PMAPCC_REQUIRE_GPU=1
#   sanitize   compute-sanitizer memcheck and initcheck over the CUDA tests (graph-captured train steps
#              included) and a short mnist_ensemble --backend cuda run; racecheck and synccheck too once a
#              kernel uses shared memory or barriers (none does: they would check nothing); fails at once
#              when there is no compute-sanitizer
#   train      mnist_ensemble --backend cuda, 1, 4 and 8 members on one GPU, against --backend cpu:
#              initial parameters bitwise equal, a 20-step loss trajectory within 1e-4, and the same GPU
#              run twice bitwise equal (losses and checkpoint tensors); and --mode model-parallel --mesh 1x2
#              against the CPU (20-step losses within 1e-4)
#   bench      bench_cuda_train (fp32 and bf16) beside the project's PyTorch reference,
#              bench/torch_flax_cnn.py --device cuda (where PyTorch has CUDA), and a JAX program where
#              ANCHORS holds jax_cnn_ensemble.py and python3 has JAX, flax and optax (else it says what is
#              missing); 1, 4 and 8 members
#   summary    one JSON file, bench/results/gpu-checks-<device>-<date>.json: the device, versions, every
#              stage's result and the benchmark lines
# Logs: <build>/gpu_checks/ (stage results accumulate there across invocations, for the summary).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 2

build=build/gpu
# What `pack` puts in .gpurun/ is found by default where the usual place is empty (a bare GPU machine).
data=data/mnist
[[ ! -d $data && -d .gpurun/mnist ]] && data=.gpurun/mnist
deps=.gpudeps/deps.tar.gz
deps_arg=""  # --deps as given: where pack-deps writes (.gpudeps/deps.tar.gz without it)
[[ ! -s $deps && -s .gpurun/deps.tar.gz ]] && deps=.gpurun/deps.tar.gz
[[ -z ${ANCHORS:-} && -d .gpurun/anchors ]] && ANCHORS=$root/.gpurun/anchors
default_stages=(preflight info build cuda suite sanitize train bench summary)
budget=""
stages=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --deps) deps=$2; deps_arg=$2; shift 2 ;;
    --budget)
      budget=$2
      [[ $budget =~ ^[0-9]+$ ]] || { echo "gpu_checks.sh: --budget '$budget' is not a number of seconds" >&2; exit 2; }
      shift 2 ;;
    -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;  # the comment block above
    pack | pack-deps | preflight | info | build | cuda | suite | sanitize | train | bench | summary | all)
      stages+=("$1"); shift ;;
    *) echo "gpu_checks.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#stages[@]} -eq 0 || " ${stages[*]} " == *" all "* ]] && stages=("${default_stages[@]}")
logs="$build/gpu_checks"
mkdir -p "$logs"
results="$logs/stages.jsonl"
failed=()
started="$logs/.started-$$"  # what this invocation wrote is newer than this
touch "$started"
# $OUT: where a lent machine's files come back from (see the top).
out_dir=""
if [[ -n ${OUT:-} ]]; then
  out_dir="$OUT/gpu_checks"
  mkdir -p "$out_dir" || { echo "gpu_checks.sh: cannot create $out_dir (OUT)" >&2; exit 2; }
fi
# Copies the logs, the stage results and this invocation's summary JSON to $OUT (nothing without it).
sync_out() {
  [[ -n $out_dir ]] || return 0
  local f
  for f in "$logs"/*.log "$results"; do
    [[ -f $f && ! $f -ef $out_dir/$(basename "$f") ]] && cp -f "$f" "$out_dir/"
  done
  find bench/results -maxdepth 1 -name 'gpu-checks-*.json' -newer "$started" -exec cp -f {} "$out_dir/" \; 2>/dev/null
  return 0
}
trap 'sync_out; rm -f "$started"' EXIT
trap 'echo "gpu_checks.sh: interrupted"; exit 130' INT
trap 'echo "gpu_checks.sh: terminated"; exit 143' TERM
export PMAPCC_REQUIRE_GPU=1  # a GPU test that skips is a failure here (tests/cuda_testing.h, the CLI test)
# The stages run in child shells: what they read goes through the environment (arrays as words).
ANCHORS=${ANCHORS:-}
stages_run="${stages[*]}"
default_stages_run="${default_stages[*]}"
export build data deps deps_arg logs root ANCHORS stages_run default_stages_run

# run_stage NAME LIMIT_SECONDS FUNCTION [full]: runs it under a timeout, logs it, records the result; with
# `full`, prints the whole log (else its last line, or its last 25 lines when the stage fails).
run_stage() {
  local name=$1 limit=$2 fn=$3 show=${4:-} t0=$SECONDS rc
  if [[ -n $budget ]]; then  # what is left of --budget, less a margin for the copies and the summary
    local left=$((budget - SECONDS - 15))
    if ((left < 30)); then
      echo "== [$name] not started: ${left} s of --budget $budget left"
      printf '{"stage": "%s", "exit": 125, "seconds": 0, "at": "%s", "skipped": "budget"}\n' "$name" \
        "$(date -u +%FT%TZ)" >>"$results"
      failed+=("$name")
      sync_out
      return
    fi
    ((left < limit)) && limit=$left
  fi
  echo "== [$name] (limit ${limit} s, log $logs/$name.log)"
  # With OUT, the log is written there as the stage runs (what a killed run leaves), then copied here.
  local log="$logs/$name.log"
  [[ -n $out_dir ]] && log="$out_dir/$name.log"
  timeout --kill-after=10 "$limit" bash -c "$(declare -f); stage_helpers; $fn" >"$log" 2>&1
  rc=$?
  [[ $log != "$logs/$name.log" ]] && cp -f "$log" "$logs/$name.log"
  local secs=$((SECONDS - t0))
  if [[ $rc -eq 0 && $show == full ]]; then
    echo "   ok in ${secs} s:"
    sed 's/^/     /' "$logs/$name.log"
  elif [[ $rc -eq 0 ]]; then
    echo "   ok in ${secs} s: $(tail -n 1 "$logs/$name.log")"
  else
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      echo "   TIMED OUT after ${secs} s"
    else
      echo "   FAILED (exit $rc) after ${secs} s:"
    fi
    if [[ $show == full ]]; then
      sed 's/^/     /' "$logs/$name.log"
    else
      tail -n 25 "$logs/$name.log" | sed 's/^/     /'
    fi
    failed+=("$name")
  fi
  printf '{"stage": "%s", "exit": %d, "seconds": %d, "at": "%s"}\n' "$name" "$rc" "$secs" "$(date -u +%FT%TZ)" \
    >>"$results"
  sync_out
}

# Shared by the stages (they run in child shells): paths and small helpers.
stage_helpers() {
  tests="$build/tests/pmapcc_tests"
  program="$build/examples/mnist_ensemble"
  sanitizer=$(find_sanitizer)  # empty where there is none
  mnist_files=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
  # Raw IDX files for the references and the program (the .gz files travel; the reader takes either).
  raw_data() {
    local out="$build/mnist-raw"
    mkdir -p "$out"
    for f in "${mnist_files[@]}"; do
      [[ -s "$out/$f" ]] && continue
      if [[ -s "$data/$f" ]]; then
        cp "$data/$f" "$out/$f"
      elif [[ -s "$data/$f.gz" ]]; then
        gunzip -c "$data/$f.gz" >"$out/$f"
      else
        echo "raw_data: $data has no $f(.gz) (carry .gpurun made by 'gpu_checks.sh pack', or --data DIR)" >&2
      fi
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

# compute-sanitizer: on PATH, in /usr/local/cuda/bin, or beside nvcc in the toolkit (bin/ or compute-sanitizer/).
find_sanitizer() {
  local nvcc c
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  for c in "$(command -v compute-sanitizer)" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer "$(dirname "$nvcc")/compute-sanitizer" \
    "$(dirname "$(dirname "$nvcc")")/compute-sanitizer/compute-sanitizer"; do
    [[ -n $c && -f $c && -x $c ]] && { echo "$c"; return 0; }
  done
  return 1
}

# ignore_path /NAME/: lists it in the repository's info/exclude (a worktree's too), once.
ignore_path() {
  local exclude
  exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "$1" "$exclude" 2>/dev/null || echo "$1" >>"$exclude"
}

# write_deps FILE: the Debian packages' headers and CMake files that a bare GPU machine lacks, as one tarball.
write_deps() {
  tar -czf "$1" -C / usr/include/eigen3 usr/share/eigen3 usr/include/doctest usr/lib/cmake/doctest \
    usr/include/nlohmann usr/share/cmake/nlohmann_json usr/include/CLI usr/share/cmake/CLI11 \
    usr/include/zlib.h usr/include/zconf.h usr/lib/x86_64-linux-gnu/libz.so usr/lib/x86_64-linux-gnu/libz.a
}

stage_pack_deps() {
  local out=${deps_arg:-.gpudeps/deps.tar.gz}
  mkdir -p "$(dirname "$out")"
  ignore_path /.gpudeps/
  write_deps "$out" || return 1
  ls -la "$out"
}

# .gpurun/: everything a bare, offline GPU machine lacks, in one ignored folder for the device tool's carry.
stage_pack() {
  local dir=.gpurun f src rc=0
  local from=$data
  [[ -d $data && $(cd "$data" && pwd) == "$root/$dir/mnist" ]] && from=data/mnist  # not packed from itself
  if [[ ! -d $from ]]; then
    echo "pack: no MNIST data to pack: no $from here: run scripts/get_data.sh --mnist-only first (or --data DIR)"
    return 1
  fi
  mkdir -p "$dir/mnist"
  ignore_path "/$dir/"
  if write_deps "$dir/deps.tar.gz.tmp"; then
    mv "$dir/deps.tar.gz.tmp" "$dir/deps.tar.gz"
    echo "pack: $dir/deps.tar.gz from the Debian packages (Eigen, doctest, nlohmann-json, CLI11, zlib)"
  elif [[ -s .gpudeps/deps.tar.gz ]]; then
    rm -f "$dir/deps.tar.gz.tmp"
    cp .gpudeps/deps.tar.gz "$dir/deps.tar.gz"
    echo "pack: the Debian packages are not all here (scripts/setup.sh): copied .gpudeps/deps.tar.gz instead"
  else
    rm -f "$dir/deps.tar.gz.tmp"
    echo "pack: FAILED: the Debian packages behind deps.tar.gz are not all installed: run scripts/setup.sh"
    rc=1
  fi
  for f in "${mnist_files[@]}"; do
    if [[ -s $from/$f.gz ]]; then
      src=$from/$f.gz
      cp "$src" "$dir/mnist/$f.gz.tmp"
    elif [[ -s $from/$f ]]; then
      src=$from/$f
      gzip -9 -c "$src" >"$dir/mnist/$f.gz.tmp"
    else
      echo "pack: FAILED: $from has no $f(.gz): run scripts/get_data.sh --mnist-only"
      rc=1
      continue
    fi
    if gzip -t "$dir/mnist/$f.gz.tmp"; then
      mv "$dir/mnist/$f.gz.tmp" "$dir/mnist/$f.gz"
    else
      rm -f "$dir/mnist/$f.gz.tmp"
      echo "pack: FAILED: $src does not give a whole .gz file"
      rc=1
    fi
  done
  echo "pack: $dir/mnist/ holds $(find "$dir/mnist" -name '*.gz' | wc -l) of the 4 MNIST files, gzipped, from $from"
  if [[ -d ../shared/anchors ]]; then
    rm -rf "$dir/anchors"
    cp -R ../shared/anchors "$dir/anchors" || rc=1
    chmod -R u+w "$dir/anchors"  # shared/ comes without write bits: let a later pack or rm replace it
    echo "pack: $dir/anchors/ from ../shared/anchors ($(find "$dir/anchors" -type f | wc -l) files; bench's ANCHORS)"
  else
    echo "pack: no ../shared/anchors here: $dir/anchors/ not made (bench will run no JAX program)"
  fi
  # What travels is the working tree (tracked and untracked files git does not ignore) and the carried
  # paths, 64 MiB in all.
  local bytes tree
  bytes=$(du -sb "$dir" | cut -f1)
  tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 |
    cut -f1)
  if ((bytes > 60 * 1048576 || bytes + ${tree:-0} > 64 * 1048576)); then
    echo "pack: FAILED: too large to carry: $dir/ holds $((bytes / 1048576)) MiB (at most 60),"\
      "with the working tree $(((bytes + ${tree:-0}) / 1048576)) MiB (at most 64)"
    rc=1
  fi
  [[ $rc -eq 0 ]] || return $rc
  awk -v d="$dir" -v b="$bytes" -v t="${tree:-0}" 'BEGIN { printf "pack: %s/ holds %.1f MiB (at most 60; " \
    "%.1f MiB with the working tree, of 64): carry: [\"%s\"]\n", d, b / 1048576, (b + t) / 1048576, d }'
}

# One line for each thing that a later stage needs (see --help). A missing one fails the preflight only when
# a stage named in this invocation needs it (every stage, when preflight runs alone); compute-sanitizer,
# torch and the anchors only warn: without them sanitize fails at once and bench runs fewer references.
stage_preflight() {
  local want=" " n_ok=0 warned=() missed=() p v f
  for p in $stages_run; do [[ $p == pack* || $p == preflight ]] || want+="$p "; done
  [[ $want == " " ]] && want=" ${default_stages_run#preflight } "  # preflight alone: for every stage
  # ok NAME TEXT..., warn NAME TEXT...: one line each.
  ok() { printf 'ok    %-17s %s\n' "$1" "${*:2}"; n_ok=$((n_ok + 1)); }
  warn() { printf 'warn  %-17s %s\n' "$1" "${*:2}"; warned+=("$1"); }
  # missing NAME "STAGE..." TEXT...: fails the preflight when one of those stages runs now, else warns.
  missing() {
    local s runs=()
    for s in $2; do [[ $want == *" $s "* ]] && runs+=("$s"); done
    if [[ ${#runs[@]} -gt 0 ]]; then
      printf 'MISS  %-17s %s\n' "$1" "${*:3}"
      missed+=("$1")
    else
      warn "$1" "${*:3} (not needed by the stages named now)"
    fi
  }
  local builds="build" gpu="info cuda suite sanitize train bench"
  [[ -x $build/examples/pmap_info ]] || builds="build info"  # info builds first where nothing is built
  local carry="here: 'scripts/get_data.sh --mnist-only && scripts/gpu_checks.sh pack', and carry: [\".gpurun\"]"

  for p in cmake ninja; do
    if v=$(command -v "$p"); then
      ok "$p" "$v ($("$p" --version | head -n 1))"
    else
      missing "$p" "$builds" "not on PATH: disables build (and so the stages that use its build); install it" \
        "(a Debian package, or pip's $p wheel)"
    fi
  done
  if v=$(command -v python3); then
    ok python3 "$v ($(python3 --version 2>&1))"
  else
    missing python3 "$builds train bench summary" "not on PATH: disables build, train, bench and summary"
  fi
  if v=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; }); then
    ok nvcc "$v ($("$v" --version | sed -n 's/.*release \([^,]*\),.*/CUDA \1/p'))"
  else
    missing nvcc "$builds" "not on PATH nor in /usr/local/cuda/bin: disables build (and so the stages that use" \
      "its build); needs a machine with the CUDA toolkit"
  fi

  if command -v nvidia-smi >/dev/null; then
    if v=$(timeout 30 nvidia-smi -L 2>&1) && [[ $v == GPU* ]]; then
      ok nvidia-smi "$(wc -l <<<"$v") GPU(s): $(head -n 1 <<<"$v")"
    else
      missing GPU "$gpu" "nvidia-smi -L finds no GPU ($(head -n 1 <<<"$v")): disables info, cuda, suite, sanitize," \
        "train and bench"
    fi
  elif compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    warn nvidia-smi "not on PATH, but /dev/nvidia* exists: info prints no driver line (pmap_info still checks)"
  else
    missing nvidia-smi "$gpu" "not on PATH and no /dev/nvidia*: no GPU driver here: disables info, cuda, suite," \
      "sanitize, train and bench (run them on the lent GPU machine)"
  fi
  if v=$(find_sanitizer); then
    ok compute-sanitizer "$v ($(timeout 30 "$v" --version 2>/dev/null | grep -m 1 -o 'Version [^ ]*'))"
  else
    warn compute-sanitizer "not on PATH, in /usr/local/cuda/bin nor in the toolkit's compute-sanitizer/: sanitize" \
      "fails at once; leave it out, or run it where the CUDA toolkit has the sanitizer"
  fi

  # NCCL as the build finds it: the toolkit's (CMake's find_path and find_library), else python3's package.
  local lib="" d py
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu /usr/lib /usr/local/lib; do
    [[ -e $d/libnccl.so || -e $d/libnccl.a ]] && { lib=$d; break; }
  done
  py=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  if [[ -e /usr/local/cuda/include/nccl.h && -n $lib ]]; then
    ok NCCL "/usr/local/cuda/include/nccl.h, libnccl in $lib"
  elif [[ -e /usr/local/cuda/include/nccl.h ]]; then
    missing NCCL "$builds" "/usr/local/cuda/include/nccl.h but no libnccl.so in /usr/local/cuda/lib64 or the" \
      "system's: disables build (NCCL is required)"
  elif [[ -n $py && -e $py/include/nccl.h && -e $py/lib/libnccl.so.2 ]]; then
    ok NCCL "python3's nvidia-nccl package: $py"
  elif [[ -e /usr/include/nccl.h && -n $lib ]]; then
    ok NCCL "/usr/include/nccl.h, libnccl in $lib"
  else
    missing NCCL "$builds" "no nccl.h and libnccl in /usr/local/cuda, the system or python3's nvidia-nccl package:" \
      "disables build (NCCL is required); needs a machine with NCCL"
  fi
  if [[ -e /usr/share/eigen3/cmake/Eigen3Config.cmake ]]; then
    ok Eigen "installed (/usr/share/eigen3)"
  elif [[ -s $deps ]] && tar -tzf "$deps" usr/share/eigen3/cmake/Eigen3Config.cmake >/dev/null 2>&1; then
    ok Eigen "not installed: build unpacks $deps (Eigen, doctest, nlohmann-json, CLI11, zlib)"
  elif [[ -s $deps ]]; then
    missing Eigen "$builds" "not installed, and $deps holds no Eigen: disables build; make it again: $carry"
  else
    missing Eigen "$builds" "not installed, and no $deps: disables build; $carry (or --deps FILE)"
  fi

  local raw=0 gz=0 lack=()
  for f in "${mnist_files[@]}"; do
    if [[ -s $data/$f ]]; then raw=$((raw + 1)); elif [[ -s $data/$f.gz ]]; then gz=$((gz + 1)); else lack+=("$f"); fi
  done
  if [[ ${#lack[@]} -eq 0 ]]; then
    ok "MNIST data" "$data: the 4 IDX files ($raw raw, $gz .gz)"
  else
    missing "MNIST data" "train bench sanitize" "$data has no ${lack[*]} (raw or .gz): disables train, bench and" \
      "sanitize's training run; $carry (or --data DIR)"
  fi

  v=$(timeout 120 python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>/dev/null |
    tail -n 1)
  if [[ $v == *" True" ]]; then
    ok torch "python3's torch ${v% *} with CUDA: bench runs bench/torch_flax_cnn.py --device cuda"
  elif [[ -n $v ]]; then
    warn torch "python3's torch ${v% *} sees no GPU: bench runs no PyTorch reference"
  else
    warn torch "python3 has no torch: bench runs no PyTorch reference (too large to carry: use a python3 with it)"
  fi
  if [[ -z $ANCHORS ]]; then
    warn anchors "ANCHORS is unset and there is no .gpurun/anchors: bench runs no JAX program; $carry" \
      "(pack copies ../shared/anchors), or set ANCHORS=DIR"
  elif [[ ! -f $ANCHORS/jax_cnn_ensemble.py ]]; then
    warn anchors "ANCHORS=$ANCHORS has no jax_cnn_ensemble.py: bench runs no JAX program"
  elif v=$(timeout 120 python3 -c 'import jax, flax, optax; print(jax.__version__)' 2>/dev/null | tail -n 1) &&
    [[ -n $v ]]; then
    ok anchors "$ANCHORS/jax_cnn_ensemble.py, JAX $v: bench runs it"
  else
    warn anchors "$ANCHORS/jax_cnn_ensemble.py, but python3 lacks JAX, flax or optax: bench runs no JAX program"
  fi

  local notes=""
  [[ ${#warned[@]} -gt 0 ]] && notes=" (${warned[*]})"
  if [[ ${#missed[@]} -gt 0 ]]; then
    echo "preflight: FAILED: missing ${missed[*]}, which stages named now need; ${#warned[@]} warning(s)$notes"
    return 1
  fi
  echo "preflight: $n_ok ok, ${#warned[@]} warning(s)$notes; nothing missing for:${want% }"
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
  if [[ -z $sanitizer ]]; then
    echo "sanitize: no compute-sanitizer on PATH, in /usr/local/cuda/bin or in the toolkit's compute-sanitizer/:" \
      "nothing checked (preflight warns of it)"
    return 1
  fi
  # racecheck looks only at shared-memory accesses and synccheck only at barriers: no kernel has either
  # today (the first H100 run's racecheck alone outran the stage's limit checking nothing). They come back
  # by themselves when a kernel does.
  if grep -rqE '__shared__|__syncthreads|__syncwarp|cooperative_groups' kernels src include; then
    tools+=(racecheck synccheck)
  fi
  for tool in "${tools[@]}"; do
    echo "-- $tool: CUDA tests"
    # The tests provoke CUDA's refusals on purpose (a free during a capture, a bad pitch, a wrong device):
    # API errors are not reported here, memory errors are; the training runs below report both.
    local extra=(--report-api-errors no)
    [[ $tool == memcheck ]] && extra+=(--leak-check full)
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
    "${base[@]}" "${steps[@]}" --backend cpu --metrics-json "$w/cpu-$m.json" --save "$w/cpu-$m.st" \
      >/dev/null || return 1
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
  "$build/bench/bench_cuda_train" --data "$d" --steps 200 --precision fp32,bf16 || rc=1
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
  if [[ -z "$anchors" ]]; then
    echo "bench: ANCHORS is unset and there is no .gpurun/anchors: no JAX program run (carry .gpurun made by" \
      "'gpu_checks.sh pack' where ../shared/anchors exists, or set ANCHORS=DIR)"
  elif [[ ! -f "$anchors/jax_cnn_ensemble.py" ]]; then
    echo "bench: ANCHORS=$anchors has no jax_cnn_ensemble.py: no JAX program run"
  elif ! python3 -c 'import jax, flax, optax' 2>/dev/null; then
    echo "bench: python3 lacks JAX, flax or optax: $anchors/jax_cnn_ensemble.py not run"
  else
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
    pack) run_stage pack 300 stage_pack ;;
    pack-deps) run_stage pack-deps 120 stage_pack_deps ;;
    preflight) run_stage preflight 300 stage_preflight full ;;
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
