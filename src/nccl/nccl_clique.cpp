// NCCL communicators for meshes of one device per GPU. Each collective is first checked against the other
// devices in the thread hub (same op, shape, dtype and axes, in the same order: a mismatch raises instead
// of hanging), then enqueued on the device's stream, then waited for by polling the stream and
// ncclCommGetAsyncError against the mesh's collective timeout; an error or a timeout aborts the
// communicator (ncclCommAbort) and raises NcclError / Timeout. An aborted communicator stays unusable:
// build a new Mesh.
//
// Under jit's capture of a step into a CUDA graph (a CollectiveLog held), a collective meets the peers on
// the host as above, is recorded into the graph (NCCL captures its operations) and is not waited for. Each
// launch of the graph then meets the group on the host first (graph_meet: a rank doing something else is a
// CollectiveMismatch, not a device hang) and waits for the stream after (graph_wait), with the same timeout
// and abort rules. NCCL's destroy and abort wait until every graph holding the communicator is destroyed:
// the communicator drops those graphs (detail::drop_graphs) before either.
//
// Root communicators: process 0's ncclUniqueId (the process running mesh device 0) reaches every process
// of a mesh spanning several over MPI; each process then joins its devices with ncclCommInitRankConfig
// (one NCCL rank per mesh device, grouped, nonblocking, polled against the process timeout).
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <pmap/detail/capture.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/error.h>

#include "availability.h"
#include "cuda_seam.h"
#include "nccl/nccl_check.h"
#include "nccl_clique.h"
#include "processes.h"

namespace pmap::detail {

bool nccl_available() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

namespace {

using Clock = std::chrono::steady_clock;

// Whether the calling thread's stream is being captured; false when CUDA cannot tell (after an error).
bool stream_capturing() noexcept {
  try {
    return current_stream_capturing();
  } catch (...) {
    return false;
  }
}

// How long a communicator may still finish after another device failed, before it is aborted.
constexpr std::chrono::milliseconds kAbortGrace{2000};

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u32: return ncclUint32;
    case DType::u8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : op == ReduceOp::max ? ncclMax : ncclMin; }

// ": <NCCL's last error detail>", or "" when it has none.
std::string last_error(ncclComm_t comm) {
  const char* detail = ncclGetLastError(comm);
  return detail == nullptr || *detail == '\0' ? std::string() : ": " + std::string(detail);
}


// Ends an NCCL group that an exception left open between ncclGroupStart and ncclGroupEnd (NCCL needs
// every group ended before the communicators are aborted), ignoring the result: the caller is already
// failing. close() marks the group as ended by the caller.
class OpenGroup {
 public:
  OpenGroup() { PMAPCC_NCCL_CHECK(ncclGroupStart()); }
  OpenGroup(const OpenGroup&) = delete;
  OpenGroup& operator=(const OpenGroup&) = delete;
  ~OpenGroup() {
    if (open_) ncclGroupEnd();
  }
  void close() {
    open_ = false;
    PMAPCC_NCCL_ISSUE(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

class NcclCommunicator final : public Communicator {
 public:
  // `rank`: the device's rank in the whole group (its NCCL rank); `local_rank`: its index among this
  // process's members of the group (its place in the hub).
  // `group_aborted`: shared by this process's communicators of the same group; set when one of them aborts.
  NcclCommunicator(ncclComm_t comm, ThreadHub& hub, const Group& group, int device, int rank, int local_rank,
                   std::chrono::milliseconds timeout, std::shared_ptr<std::atomic<bool>> group_aborted)
      : comm_(comm), hub_(hub), group_(group), device_(device), rank_(rank), local_rank_(local_rank),
        timeout_(timeout), group_aborted_(std::move(group_aborted)) {
    // Up front (no allocation in collectives), and zeroed on the stream the barrier runs on (the worker's,
    // which does not wait for the legacy stream; review L1): the barrier all-reduces it (initcheck).
    PMAPCC_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
    PMAPCC_CUDA_CHECK(cudaMemsetAsync(barrier_word_, 0, sizeof(float), current_stream()));
  }
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return group_.size; }
  void abort(const std::string& reason) override { hub_.abort(reason); }  // waiters abort their communicators

  // Checks the op against the other devices, enqueues it on the current stream and waits for it (under
  // a capture: records it; see the file's opening).
  void run(const CollectiveOp& op) override;
  bool captures() const override { return true; }
  bool holds_graphs() const override { return true; }
  void graph_meet(std::size_t ops, std::uint64_t signature) override;
  void graph_wait() override;
  // Waits until a nonblocking call on the communicator (creation, split, finalize) has completed.
  void await_ready(const char* what);

 private:
  // How far wait() waits for what was issued last: until NCCL has put it on the stream, or until the stream
  // has run it.
  enum class Until { enqueued, done };
  void enqueue(const CollectiveOp& op, cudaStream_t stream);
  // Polls the communicator (and then the stream) until `until`; an NCCL or CUDA error, a peer's failure
  // or the timeout aborts the communicator and raises (see the file's opening).
  void wait(const CollectiveOp& op, cudaStream_t stream, Until until = Until::done);
  // Aborts the communicator (once) and tells the group's other communicators in this process. While the
  // thread's stream is being captured, NCCL's abort would wait for that capture (it holds the communicator):
  // the communicator is marked aborted now and NCCL's abort is left to finish_abort, once it has ended.
  void abort_comm() noexcept;
  void finish_abort() noexcept;
  // Aborts the communicator and raises E with `message`.
  template <class E> [[noreturn]] void fail(const std::string& message);
  std::string who(const CollectiveOp& op) const {
    return std::string(op.name) + " over " + group_.axes + " (NCCL rank " + std::to_string(rank_) + ")";
  }

  ncclComm_t comm_;
  ThreadHub& hub_;
  const Group& group_;
  int device_;
  int rank_;
  int local_rank_;
  std::chrono::milliseconds timeout_;
  float* barrier_word_ = nullptr;
  bool aborted_ = false;
  bool nccl_aborted_ = false;  // ncclCommAbort called (aborted_ may come first: see abort_comm)
  std::shared_ptr<std::atomic<bool>> group_aborted_;
};

NcclCommunicator::~NcclCommunicator() {
  drop_graphs(this);  // NCCL's finalize and destroy wait for the graphs holding the communicator
  // A peer of this process that aborted its communicator of the group will never finalize: abort at once
  // rather than wait out the bound below (review L5). A peer in another process that aborted is not known
  // here: the bound applies.
  if (comm_ != nullptr && !aborted_ && group_aborted_->load(std::memory_order_acquire)) abort_comm();
  if (comm_ != nullptr && aborted_) finish_abort();  // (one that came during a capture)
  if (comm_ != nullptr && !aborted_) {
    // Finalize (collective over the group: every device's worker destroys its communicators together),
    // then free. Bounded: a communicator that does not finalize in time is aborted instead.
    const auto deadline = Clock::now() + std::min(timeout_, std::chrono::milliseconds(10000));
    ncclResult_t state = ncclCommFinalize(comm_);
    while (state == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::yield();
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  cudaFree(barrier_word_);
}

void NcclCommunicator::abort_comm() noexcept {
  if (!aborted_) {
    aborted_ = true;
    group_aborted_->store(true, std::memory_order_release);
  }
  if (!stream_capturing()) finish_abort();
}

void NcclCommunicator::finish_abort() noexcept {
  if (nccl_aborted_) return;
  nccl_aborted_ = true;
  drop_graphs(this);  // ncclCommAbort waits until no graph holds the communicator
  ncclCommAbort(comm_);
}

template <class E> void NcclCommunicator::fail(const std::string& message) {
  abort_comm();
  throw E(message);
}

void NcclCommunicator::await_ready(const char* what) {
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    PMAPCC_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      fail<NcclError>(std::string(what) + " on " + group_.axes + " failed: " + ncclGetErrorString(state) +
                      last_error(comm_));
    if (std::string why = hub_.abort_reason(); !why.empty())
      fail<Aborted>(std::string(what) + " on " + group_.axes + " cancelled: " + why);
    if (Clock::now() > deadline)
      fail<Timeout>(std::string(what) + " on " + group_.axes + " did not complete in " +
                    std::to_string(timeout_.count()) + " ms");
    std::this_thread::yield();
  }
}

void NcclCommunicator::run(const CollectiveOp& op) {
  if (aborted_) {
    if (!stream_capturing()) finish_abort();  // (an abort during a capture: NCCL's part now that it has ended)
    throw NcclError(who(op) + ": the NCCL communicator was aborted earlier; build a new Mesh");
  }
  const bool recorded = current_stream_capturing();
  CollectiveLog* log = recorded ? CollectiveLog::current() : nullptr;
  if (recorded && log == nullptr)
    throw ValueError(who(op) + ": collectives cannot be captured in a CUDA graph outside jit (whose launches "
                               "meet the other devices); capture the compute around them");
  CollectiveOp posted = op;
  posted.recorded = recorded;  // every rank records it, or none (NCCL's rule): a mix is a mismatch
  hub_.collective(device_, group_, local_rank_, posted, DataPath::none);  // raises CollectiveMismatch / Timeout / Aborted
  const cudaStream_t stream = current_stream();
  if (log != nullptr) log->note(this, op);
  enqueue(op, stream);
  // Recorded: only until NCCL has put it into the capture (a query of a capturing stream would end it).
  wait(op, stream, recorded ? Until::enqueued : Until::done);
}

void NcclCommunicator::graph_meet(std::size_t ops, std::uint64_t signature) {
  if (aborted_) {
    finish_abort();
    throw NcclError("a graph's collectives over " + group_.axes + ": the NCCL communicator was aborted earlier; "
                    "build a new Mesh");
  }
  CollectiveOp op;
  op.kind = CollectiveKind::barrier;
  op.count = ops;
  op.perm_id = signature;  // another graph, or the same with other shapes, is a mismatch
  op.name = "the launch of a jitted graph holding collectives";
  hub_.collective(device_, group_, local_rank_, op, DataPath::none);
}

void NcclCommunicator::graph_wait() {
  CollectiveOp op;
  op.name = "a jitted graph's collectives";
  wait(op, current_stream());  // (a failure aborts the communicator, dropping its graphs first)
}

void NcclCommunicator::enqueue(const CollectiveOp& op, cudaStream_t stream) {
  const ncclDataType_t type = nccl_type(op.dtype);
  switch (op.kind) {
    case CollectiveKind::all_reduce:
      if (op.reduce != ReduceOp::sum && is_floating(op.dtype)) {
        // NCCL's float max/min drop NaN (fmaxf/fminf): reduce the floats as order keys, NaN winning, as every
        // other path does (review F2; src/device_kernels.h). On a nonblocking communicator of several ranks
        // the all-reduce returns ncclInProgress and NCCL's own thread puts it on `stream` later: the keys are
        // turned back into floats only once it is there (review N1; NCCL: no work on the stream before the
        // communicator reads ncclSuccess).
        const bool max = op.reduce == ReduceOp::max;
        const ncclDataType_t keys = op.dtype == DType::f32 ? ncclInt32 : ncclInt64;
        cuda_to_order_keys(op.recv, op.send, op.count, op.dtype, max, stream);
        PMAPCC_NCCL_ISSUE(ncclAllReduce(op.recv, op.recv, op.count, keys, max ? ncclMax : ncclMin, comm_, stream));
        wait(op, stream, Until::enqueued);
        cuda_from_order_keys(op.recv, op.count, op.dtype, stream);
      } else {
        PMAPCC_NCCL_ISSUE(ncclAllReduce(op.send, op.recv, op.count, type, nccl_op(op.reduce), comm_, stream));
      }
      break;
    case CollectiveKind::all_gather:
      PMAPCC_NCCL_ISSUE(ncclAllGather(op.send, op.recv, op.count, type, comm_, stream));
      break;
    case CollectiveKind::reduce_scatter:
      PMAPCC_NCCL_ISSUE(ncclReduceScatter(op.send, op.recv, op.count, type, nccl_op(op.reduce), comm_, stream));
      break;
    case CollectiveKind::broadcast:
      PMAPCC_NCCL_ISSUE(ncclBroadcast(op.send, op.recv, op.count, type, op.root, comm_, stream));
      break;
    case CollectiveKind::permute: {
      // A device no one sends to gets zeros. The fill goes on the stream before the group, not after it:
      // NCCL may put the group on the stream later, from its own thread (review N1), and the fill needs no
      // ordering against it (ppermute's output is a new buffer, which NCCL neither reads nor writes here).
      if (op.recv_from < 0 && op.count > 0)
        PMAPCC_CUDA_CHECK(cudaMemsetAsync(op.recv, 0, op.count * size_of(op.dtype), stream));
      OpenGroup group;
      if (op.send_to >= 0) PMAPCC_NCCL_ISSUE(ncclSend(op.send, op.count, type, op.send_to, comm_, stream));
      if (op.recv_from >= 0) PMAPCC_NCCL_ISSUE(ncclRecv(op.recv, op.count, type, op.recv_from, comm_, stream));
      group.close();
      break;
    }
    case CollectiveKind::barrier:
      PMAPCC_NCCL_ISSUE(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, stream));
      break;
  }
}

void NcclCommunicator::wait(const CollectiveOp& op, cudaStream_t stream, Until until) {
  const auto start = Clock::now();
  auto deadline = start + timeout_;
  bool peer_failed = false;
  for (int spin = 0;; ++spin) {
    ncclResult_t state = ncclSuccess;
    PMAPCC_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress)
      fail<NcclError>(who(op) + " failed: " + ncclGetErrorString(state) + last_error(comm_));
    if (state == ncclSuccess) {  // enqueued: now wait for the stream
      if (until == Until::enqueued) return;
      const cudaError_t done = cudaStreamQuery(stream);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) {
        abort_comm();
        throw_cuda_error(done, CheckSite{"cudaStreamQuery(stream)", __FILE__, __LINE__});
      }
    }
    if (!peer_failed && !hub_.abort_reason().empty()) {  // every rank enqueued; give the op a moment
      peer_failed = true;
      deadline = std::min(deadline, Clock::now() + kAbortGrace);
    }
    if (Clock::now() > deadline) {
      if (peer_failed && hub_.aborted_by_timeout()) fail<Timeout>(who(op) + ": " + hub_.abort_reason());
      if (peer_failed) fail<Aborted>(who(op) + " cancelled: " + hub_.abort_reason());
      const std::string message = who(op) + " did not complete within " + std::to_string(timeout_.count()) + " ms";
      hub_.abort(message, /*timeout=*/true);
      fail<Timeout>(message);
    }
    if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// The ncclUniqueId of the run: made here when this process runs mesh device 0, and sent to the other
// processes over MPI when the mesh spans several.
ncclUniqueId bootstrap_id(bool owner, bool spans_processes) {
  ncclUniqueId id{};
  if (owner) PMAPCC_NCCL_CHECK(ncclGetUniqueId(&id));
  if (!spans_processes) return id;
  constexpr std::size_t kWords = (sizeof(id.internal) + 7) / 8;
  std::vector<std::int64_t> mine(1 + kWords, 0);
  mine[0] = owner ? 1 : 0;
  if (owner) std::memcpy(mine.data() + 1, id.internal, sizeof(id.internal));
  for (const auto& theirs : gather_from_processes(mine, "NCCL bootstrap (ncclUniqueId)")) {
    if (theirs.size() == mine.size() && theirs[0] == 1) {
      std::memcpy(id.internal, theirs.data() + 1, sizeof(id.internal));
      return id;
    }
  }
  throw NcclError("NCCL bootstrap: no process runs mesh device 0, so no process made the ncclUniqueId");
}

class Clique final : public NcclClique {
 public:
  Clique(const std::vector<int>& devices, const std::vector<int>& ordinals, int size, bool spans_processes,
         ThreadHub& hub, std::chrono::milliseconds collective_timeout, std::chrono::milliseconds init_timeout)
      : hub_(hub), timeout_(collective_timeout) {
    const ncclUniqueId id =
        bootstrap_id(std::find(devices.begin(), devices.end(), 0) != devices.end(), spans_processes);
    int previous = 0;
    PMAPCC_CUDA_CHECK(cudaGetDevice(&previous));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every process's ranks join at once; we poll with a deadline
    std::vector<ncclComm_t> comms(devices.size(), nullptr);
    try {
      OpenGroup group;
      for (std::size_t i = 0; i < devices.size(); ++i) {
        PMAPCC_CUDA_CHECK(cudaSetDevice(ordinals[i]));
        PMAPCC_NCCL_ISSUE(ncclCommInitRankConfig(&comms[i], size, id, devices[i], &config));
      }
      group.close();
    } catch (...) {  // the group is ended (OpenGroup) before the communicators are aborted
      cudaSetDevice(previous);
      for (ncclComm_t c : comms)
        if (c != nullptr) ncclCommAbort(c);
      throw;
    }
    cudaSetDevice(previous);
    for (std::size_t i = 0; i < devices.size(); ++i) roots_[devices[i]] = comms[i];
    const auto deadline = Clock::now() + init_timeout;
    for (std::size_t i = 0; i < devices.size(); ++i) {
      for (;;) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t got = ncclCommGetAsyncError(comms[i], &state);
        if (got != ncclSuccess) state = got;
        if (state == ncclSuccess) break;
        std::string why;
        if (state != ncclInProgress) {
          why = std::string(ncclGetErrorString(state)) + last_error(comms[i]);
        } else if (Clock::now() > deadline) {
          why = "not every one of the " + std::to_string(size) + " ranks joined within " +
                std::to_string(init_timeout.count()) + " ms (a process lost, or building a different mesh?)";
        }
        if (!why.empty()) {
          for (ncclComm_t c : comms) ncclCommAbort(c);
          roots_.clear();
          const std::string what = "NCCL communicator setup (ncclCommInitRankConfig, rank " +
                                   std::to_string(devices[i]) + " of " + std::to_string(size) + "): " + why;
          if (state == ncclInProgress) throw Timeout(what);
          throw NcclError(what);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }
  ~Clique() override {
    for (auto& [device, root] : roots_) release(device);
  }

  std::unique_ptr<Communicator> split(int device, int color, int rank, int local_rank, const Group& group) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;     // creation and collectives return at once; we poll with a deadline
    // No sharing with the root: a child sharing its parent's resources also shares its abort flag, so
    // aborting one communicator (a failed or timed-out collective) would abort every communicator of the
    // device while only the one that failed knows it. Each communicator aborts alone.
    config.splitShare = 0;
    // On the heap: NCCL's thread writes the handle when the split completes (see await_child).
    auto handle = std::make_unique<ncclComm_t>(nullptr);
    PMAPCC_NCCL_ISSUE(ncclCommSplit(roots_.at(device), color, rank, handle.get(), &config));
    ncclComm_t comm = await_child(device, handle, group);
    auto out = std::make_unique<NcclCommunicator>(comm, hub_, group, device, rank, local_rank, timeout_,
                                                  group_flag(group));
    out->await_ready("ncclCommSplit");
    CollectiveOp barrier;  // the init barrier: this communicator can talk
    barrier.name = "barrier";
    out->run(barrier);
    return out;
  }

  void release(int device) noexcept override {
    auto it = roots_.find(device);
    if (it == roots_.end() || it->second == nullptr) return;
    ncclCommDestroy(it->second);
    it->second = nullptr;
  }

 private:
  // A nonblocking ncclCommSplit leaves the child's handle NULL and runs the split on NCCL's own thread;
  // NCCL writes the handle there once the split has completed, and reports progress and errors on the
  // parent, not on the child (seen on an H100 with NCCL 2.28: polling the NULL child failed with "comm
  // argument is NULL"; NVIDIA/nccl#1472). So: poll the parent until it leaves ncclInProgress, then wait
  // for the handle to appear, both against the collective timeout. A parent that fails or stalls is
  // aborted and given up (the Clique does not release it again). A split given up leaves the handle's
  // slot allocated (8 bytes, on a path that fails the Mesh): NCCL's thread may still write it.
  ncclComm_t await_child(int device, std::unique_ptr<ncclComm_t>& slot, const Group& group) {
    ncclComm_t parent = roots_.at(device);
    std::atomic_ref<ncclComm_t> handle(*slot);
    const auto deadline = Clock::now() + timeout_;
    auto give_up = [&](const std::string& why, bool timed_out) {
      ncclCommAbort(parent);
      roots_[device] = nullptr;
      (void)slot.release();
      const std::string what =
          "ncclCommSplit on " + group.axes + " (mesh device " + std::to_string(device) + "): " + why;
      if (timed_out) throw Timeout(what);
      throw NcclError(what);
    };
    for (;;) {
      ncclResult_t state = ncclSuccess;
      PMAPCC_NCCL_CHECK(ncclCommGetAsyncError(parent, &state));
      if (state != ncclSuccess && state != ncclInProgress)
        give_up(std::string(ncclGetErrorString(state)) + last_error(parent), false);
      if (state == ncclSuccess) {
        if (ncclComm_t c = handle.load(std::memory_order_acquire); c != nullptr) return c;
      }
      if (std::string why = hub_.abort_reason(); !why.empty()) give_up("cancelled: " + why, false);
      if (Clock::now() > deadline)
        give_up(std::string(state == ncclSuccess ? "the new communicator's handle did not appear"
                                                 : "the split did not complete") +
                    " within " + std::to_string(timeout_.count()) + " ms",
                true);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // The flag shared by this process's communicators of `group` (called concurrently by the workers).
  std::shared_ptr<std::atomic<bool>> group_flag(const Group& group) {
    std::lock_guard lock(flags_mutex_);
    auto& flag = group_aborted_[&group];
    if (!flag) flag = std::make_shared<std::atomic<bool>>(false);
    return flag;
  }

  std::map<int, ncclComm_t> roots_;  // mesh device -> its root communicator (this process's devices)
  std::mutex flags_mutex_;
  std::map<const Group*, std::shared_ptr<std::atomic<bool>>> group_aborted_;
  ThreadHub& hub_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<NcclClique> make_nccl_clique(const std::vector<int>& devices, const std::vector<int>& ordinals,
                                             int size, bool spans_processes, ThreadHub& hub,
                                             std::chrono::milliseconds collective_timeout,
                                             std::chrono::milliseconds init_timeout) {
  return std::make_unique<Clique>(devices, ordinals, size, spans_processes, hub, collective_timeout, init_timeout);
}

}  // namespace pmap::detail
