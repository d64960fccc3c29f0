#!/usr/bin/env python3
"""Checks that the CUDA stand-in (tests/standin) catches a missing synchronization: removes, one at a time,
each stream synchronization, event record or wait and capture check of the GPU orchestration (src/cuda,
kernels/cuda/gpu, the Feed, pmap's and the thread hub's waits, the capture guards), in a scratch git
worktree built with the `cuda-standin` preset, and runs the stand-in's GPU tests after each (on 2 fake
GPUs, PMAPCC_REQUIRE_GPU=1) and the end-to-end training check. A mutant is killed when a test fails (wrong
data, a CaptureError not raised, a fault or a hang past the time limit). With --tsan, the survivors are
rebuilt and run again in a ThreadSanitizer stand-in build, where a missing happens-before edge is a
reported race. Prints one line per mutant and a count; exits 1 when any survives that EXPLAINED (below)
does not account for.

  python3 scripts/mutate_cuda_orchestration.py [--worktree DIR] [--only SUBSTRING] [--quick] [--tsan]

About a minute and a half per mutant on 2 cores with --quick (an incremental build, the tests); not part
of CI.
"""
import argparse, os, subprocess, sys

# (file, text, replacement): each text occurs exactly once in its file. The replacement keeps the code
# compiling (an empty statement or block) and removes only the synchronization.
MUTANTS = [
    # pmap's own waits (src/mesh.cpp) and the thread hub's (src/thread_communicator.cpp)
    ("src/mesh.cpp", "if (stream != nullptr) cuda_sync_current_stream();", "if (stream != nullptr) {}"),
    ("src/mesh.cpp", "if (f.error && stream != nullptr) cuda_drain_current_stream();", "if (f.error && stream != nullptr) {}"),
    ("src/thread_communicator.cpp", "if (device_memory_) cuda_sync_current_stream();", "if (device_memory_) {}"),
    # the Feed's events (src/feed.cpp)
    ("src/feed.cpp", "if (s->pushed[slot]) cuda_event_synchronize(s->copied[slot]);", "if (s->pushed[slot]) {}"),
    ("src/feed.cpp", "if (!s->device.is_cpu() && s->pushed[slot]) cuda_event_synchronize(s->copied[slot]);",
     "if (!s->device.is_cpu() && s->pushed[slot]) {}"),
    ("src/feed.cpp", "cuda_event_record(s.released, compute);", "{}"),
    ("src/feed.cpp", "cuda_stream_wait_event(s.copy_stream.get(), s.released);", "{}"),
    ("src/feed.cpp", "cuda_event_record(s.copied[slot], s.copy_stream.get());", "{}"),
    ("src/feed.cpp", "if (!s->device.is_cpu()) cuda_stream_wait_event(mesh_.impl().stream(s->mesh_index), s->copied[slot]);",
     "if (!s->device.is_cpu()) {}"),
    # the CUDA seam (src/cuda)
    ("src/cuda/cuda_device.cpp", "  PMAPCC_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream));\n  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));",
     "  PMAPCC_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream));"),
    ("src/cuda/cuda_device.cpp", "    PMAPCC_CUDA_CHECK(cudaStreamSynchronize(current_stream()));\n    DeviceScope scope(active.ordinal);",
     "    DeviceScope scope(active.ordinal);"),
    ("src/cuda/cuda_device.cpp", "bytes, stream));\n    PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));\n    return;",
     "bytes, stream));\n    return;"),
    ("src/cuda/cuda_device.cpp", "  }\n  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));\n}", "  }\n}"),
    ("src/cuda/cuda_device.cpp", "void cuda_sync_current_stream() { PMAPCC_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }",
     "void cuda_sync_current_stream() {}"),
    ("src/cuda/cuda_device.cpp", "  PMAPCC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));",
     "  (void)event, (void)stream;"),
    ("src/cuda/cuda_device.cpp", "  PMAPCC_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));",
     "  (void)event, (void)stream;"),
    ("src/cuda/cuda_device.cpp", "  PMAPCC_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));", "  (void)event;"),
    ("src/cuda/device_hub.cu", "  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(current_stream()));\n}", "}"),
    ("src/cuda/random.cu", "  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));", ""),
    ("src/cuda/cuda_device.cpp", "  if (stream != nullptr) PMAPCC_CUDA_CHECK(cudaStreamGetDevice(stream, &ordinal));", ""),
    # NCCL (src/nccl): waiting for the collective, the communicator's readiness and init barrier, the
    # send/receive group, the capture refusal
    ("src/nccl/nccl_clique.cpp", "  enqueue(op, stream);\n  wait(op, stream);", "  enqueue(op, stream);"),
    # pmax/pmin's keys turned back into floats before NCCL's thread has put the all-reduce on the stream
    # (review N1): the stand-in's nonblocking communicators launch later, as NCCL 2.28's do
    ("src/nccl/nccl_clique.cpp", "        wait(op, stream, Until::enqueued);\n", ""),
    ("src/nccl/nccl_clique.cpp", '    out->await_ready("ncclCommSplit");\n', ""),
    ("src/nccl/nccl_clique.cpp", "    out->run(barrier);\n", "    (void)barrier;\n"),
    ("src/nccl/nccl_clique.cpp",
     "      OpenGroup group;\n      if (op.send_to >= 0) PMAPCC_NCCL_ISSUE(ncclSend(op.send, op.count, type, op.send_to, comm_, stream));\n"
     "      if (op.recv_from >= 0) PMAPCC_NCCL_ISSUE(ncclRecv(op.recv, op.count, type, op.recv_from, comm_, stream));\n"
     "      group.close();",
     "      if (op.send_to >= 0) PMAPCC_NCCL_ISSUE(ncclSend(op.send, op.count, type, op.send_to, comm_, stream));\n"
     "      if (op.recv_from >= 0) PMAPCC_NCCL_ISSUE(ncclRecv(op.recv, op.count, type, op.recv_from, comm_, stream));"),
    ("src/nccl/nccl_clique.cpp", "  if (current_stream_capturing())\n    throw ValueError(who(op)",
     "  if (false)\n    throw ValueError(who(op)"),
    # the capture guards
    ("src/array.cpp", 'if (detail::capturing() != nullptr) detail::check_not_capturing(what, "synchronizes with the host");', ""),
    ("src/array.cpp", 'if (detail::capturing() != nullptr) detail::check_not_capturing("Array " + str(), "allocates memory");', ""),
    ("src/random_array.cpp", 'detail::check_not_capturing(std::string(function) + " into " + out.str(), "draws random numbers");', ";"),
    ("kernels/cuda/gpu/context.cu", 'pmap::detail::check_not_capturing("creating a cuBLAS handle", "allocates device memory");', ""),
    ("kernels/cuda/gpu/graph.cu", "    scope.check();  // what the body could not raise", "    // what the body could not raise"),
]

# Synchronizations no test can show missing, each with why it stays (a mutant here that survives is
# reported as such, and does not fail the run).
EXPLAINED = {
    "if (s->pushed[slot]) cuda_event_synchronize(s->copied[slot]);":
        "the Feed's buffers are freed right after, and cudaFree/cudaFreeHost synchronize the device in "
        "practice (the stand-in's too); CUDA documents that only for some frees, so the wait stays",
    'pmap::detail::check_not_capturing("creating a cuBLAS handle", "allocates device memory");':
        "a capture scope (StepGraph) prepares every stream's handle before it captures, so only a capture "
        "that skipped prepare() reaches it; it keeps that error a CaptureError naming the cause",
    '    out->await_ready("ncclCommSplit");\n':
        "the stand-in completes a child when its handle appears, as NCCL 2.28 was seen to; NCCL documents "
        "polling the new communicator until ncclSuccess, which this does",
}

TESTS = "*cuda*,*CUDA*,*gpu*,*GPU*"


def run(cmd, cwd, env=None, timeout=None):
    e = dict(os.environ)
    e.update(env or {})
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=e, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "timed out (a hang)", "")


def killed(wt, build, quick):
    """Runs the stand-in tests in build/<build>; returns (killed, why). quick: without the slowest test."""
    env = {"PMAPCC_STANDIN_GPUS": "2", "PMAPCC_REQUIRE_GPU": "1", "TSAN_OPTIONS": "halt_on_error=1"}
    skip = ["-tce=cuda training: the GPU starts*"] if quick else []
    limit = 300 if quick else 1500  # a hang: the quick tests take under a minute on 2 cores
    r = run([f"build/{build}/tests/pmapcc_tests", f"-tc={TESTS}"] + skip, wt, env, timeout=limit)
    if r.returncode != 0:
        lines = [l for l in (r.stdout + r.stderr).splitlines() if "ERROR" in l or "WARNING: ThreadSanitizer" in l
                 or "test cases:" in l or "timed out" in l]
        return True, (lines[0] if lines else f"exit {r.returncode}")[:110]
    t = run(["bash", "tests/cli/run_standin_train.sh", f"build/{build}/examples/mnist_ensemble"] + (["quick"] if quick else []),
            wt, env, timeout=1500)
    if t.returncode != 0:
        first = next((l for l in t.stdout.splitlines() if l.startswith("FAIL")), f"exit {t.returncode}")
        return True, ("training: " + first)[:110]
    return False, "every test passed"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worktree", default="/tmp/pmapcc-orchestration-mutants")
    ap.add_argument("--only", default="", help="run the mutants whose file or text contains this (A|B: either)")
    ap.add_argument("--tsan", action="store_true", help="run the survivors again under ThreadSanitizer")
    ap.add_argument("--quick", action="store_true",
                    help="leave out the slowest test and train two configurations only (a first pass)")
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    wt = a.worktree
    if not os.path.isdir(wt):
        subprocess.run(["git", "worktree", "add", "--detach", wt, "HEAD"], cwd=repo, check=True, capture_output=True)
    builds = [("cuda-standin", a.quick)] + ([("tsan", True)] if a.tsan else [])
    targets = ["--target", "pmapcc_tests", "mnist_ensemble"]
    for preset, _ in builds:
        for cmd in (["cmake", "--preset", preset], ["cmake", "--build", f"build/{preset}"] + targets):
            if run(cmd, wt).returncode != 0:
                sys.exit(f"mutate_cuda_orchestration: {' '.join(cmd)} failed in {wt}")
    survived = explained = total = 0
    for path, text, broken in MUTANTS:
        if a.only and not any(o in path or o in text for o in a.only.split("|")):
            continue
        f = os.path.join(wt, path)
        original = open(f).read()
        if original.count(text) != 1:
            sys.exit(f"mutate_cuda_orchestration: {path}: the text to remove occurs {original.count(text)} times: {text}")
        open(f, "w").write(original.replace(text, broken))
        total += 1
        try:
            verdict = None
            for preset, quick in builds:
                if run(["cmake", "--build", f"build/{preset}"] + targets, wt).returncode != 0:
                    verdict = ("BUILD FAILED", preset)
                    break
                k, why = killed(wt, preset, quick)
                if k:
                    verdict = (f"killed ({preset})", why)
                    break
            if verdict is None and text in EXPLAINED:
                explained += 1
                verdict = ("SURVIVED (explained)", EXPLAINED[text][:100])
            elif verdict is None:
                survived += 1
                verdict = ("SURVIVED", "every test passed")
            label = text.strip().splitlines()[-1].strip()[:70]
            print(f"{verdict[0]:<22} {path}: {label}  [{verdict[1]}]", flush=True)
        finally:
            open(f, "w").write(original)
    print(f"{total - survived - explained} of {total} mutants killed, {explained} survived as explained "
          f"(EXPLAINED), {survived} survived unexplained")
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
