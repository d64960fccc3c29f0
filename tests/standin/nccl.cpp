// The stand-in NCCL (see pmapcc_standin.h and README.md): communicators of one process's fake GPUs, joined
// by unique id; group semantics; nonblocking init, split and finalize with ncclInProgress; collectives as
// work on the caller's stream that meets its peers' (the n-th collective of every rank of a communicator
// meets the others' n-th), so a rank that never arrives is a real hang that pmapcc's watchdog must report;
// NCCL's reductions (fmaxf/fminf for floating max/min), summed in rank order; sends and receives fused per
// group; abort and asynchronous errors; a nonblocking communicator of several ranks putting its work on the
// streams later, from a thread of its own, as NCCL 2.28 does (see "Launches from NCCL's own thread"). Ranks
// in several processes (PMAPCC_STANDIN_NODE, e.g. under mpirun) meet through files instead of memory (see
// "Across processes" below).
#include <nccl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "standin_internal.h"

namespace {

struct Clique;

struct Slot {
  const void* send = nullptr;
  bool recorded = false;  // the call ran from a CUDA graph
};

// One collective's meeting: every rank's send buffer, and how many have arrived, computed and left.
struct Round {
  std::vector<Slot> slots;
  int arrived = 0, computed = 0, left = 0;
};

struct Mail {  // a send waiting for its receive
  const void* data = nullptr;
  std::size_t bytes = 0;
  bool taken = false;
};

struct SplitCall {
  int color = 0, key = 0, rank = 0, device = 0;
  ncclComm_t* out = nullptr;
};

struct Clique {
  explicit Clique(int n) : nranks(n) {}
  const int nranks;
  std::mutex mutex;  // the ranks' executors and callers meet here (NCCL's own synchronization)
  std::condition_variable changed;
  std::atomic<int> joined{0}, finalized{0};  // written under mutex, read by callers without it
  std::map<std::uint64_t, Round> rounds;
  std::map<std::tuple<int, int, std::uint64_t>, Mail> mail;  // (from, to, n-th send between them)
  std::map<std::uint64_t, std::vector<SplitCall>> splits;
};

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
  bool blocking = true;
  std::atomic<bool> aborted{false};
  std::atomic<int> pending_split{0};   // splits issued and not complete
  std::atomic<int> pending_launches{0};  // units issued, not on their streams yet (under the launcher's lock)
  bool finalizing = false;             // caller side
  std::uint64_t splits = 0;
  // The numbers that match a rank's calls with its peers': taken when a call runs on its stream, in stream
  // order (one stream per communicator, as pmapcc uses; NCCL orders a communicator's calls the same way),
  // so that a collective recorded into a CUDA graph takes a new number at each launch of the graph.
  std::mutex numbers_mutex;
  std::uint64_t collectives = 0;                // run
  std::map<int, std::uint64_t> sent, received;  // per peer, run
  // Collectives recorded into CUDA graphs that still exist (NCCL's persistent references): NCCL's destroy
  // and abort wait until those graphs are destroyed, so tearing the communicator down first hangs there.
  std::atomic<int> captured{0};
  std::atomic<int> async_error{ncclSuccess};
  std::string dir;                     // across processes: the folder its ranks meet in ("" in memory)
  std::atomic<bool> joined_all{false};  // across processes: every rank's join file was seen
};

namespace {

std::mutex registry_mutex;
std::map<std::string, std::shared_ptr<Clique>>& cliques() {  // by unique id, while ranks are joining
  static auto* m = new std::map<std::string, std::shared_ptr<Clique>>;
  return *m;
}
std::vector<std::unique_ptr<ncclComm>>& comms() {  // every communicator made (kept: queued work refers to them)
  static auto* v = new std::vector<std::unique_ptr<ncclComm>>;
  return *v;
}
std::atomic<std::uint64_t> next_id{1};
thread_local std::string last_error;

ncclResult_t injected(const char* api) {
  return static_cast<ncclResult_t>(static_cast<int>(pmapcc_standin::injected(api)));
}

ncclResult_t usage(const std::string& why) {
  last_error = why;
  return ncclInvalidUsage;
}

ncclComm* make_comm(std::shared_ptr<Clique> clique, int rank, int device, const ncclConfig_t* config) {
  auto c = std::make_unique<ncclComm>();
  c->clique = std::move(clique);
  c->rank = rank;
  c->device = device;
  c->blocking = config == nullptr || config->blocking != 0;  // NCCL_CONFIG_UNDEF_INT counts as blocking
  std::lock_guard lock(registry_mutex);
  comms().push_back(std::move(c));
  return comms().back().get();
}

bool live(ncclComm_t comm) {
  if (comm == nullptr) return false;
  std::lock_guard lock(registry_mutex);
  for (const auto& c : comms())
    if (c.get() == comm) return !comm->aborted.load();
  return false;
}

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

template <class T> T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum: case ncclAvg: return static_cast<T>(a + b);
    case ncclProd: return static_cast<T>(a * b);
    case ncclMax:
      if constexpr (std::is_floating_point_v<T>) return std::fmax(a, b);  // NCCL's: a NaN loses
      else return a > b ? a : b;
    case ncclMin:
      if constexpr (std::is_floating_point_v<T>) return std::fmin(a, b);
      else return a < b ? a : b;
    default: return a;
  }
}

// out[i] = in_0[i] op in_1[i] op ... in_{n-1}[i] (rank order), for `count` elements.
template <class T>
void reduce_typed(const std::vector<const void*>& in, void* out, std::size_t offset, std::size_t count,
                  ncclRedOp_t op) {
  for (std::size_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(in[0])[offset + i];
    for (std::size_t r = 1; r < in.size(); ++r) acc = combine(acc, static_cast<const T*>(in[r])[offset + i], op);
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(in.size()));
    static_cast<T*>(out)[i] = acc;
  }
}

bool reduce(ncclDataType_t t, const std::vector<const void*>& in, void* out, std::size_t offset, std::size_t count,
            ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: reduce_typed<std::int8_t>(in, out, offset, count, op); return true;
    case ncclUint8: reduce_typed<std::uint8_t>(in, out, offset, count, op); return true;
    case ncclInt32: reduce_typed<std::int32_t>(in, out, offset, count, op); return true;
    case ncclUint32: reduce_typed<std::uint32_t>(in, out, offset, count, op); return true;
    case ncclInt64: reduce_typed<std::int64_t>(in, out, offset, count, op); return true;
    case ncclUint64: reduce_typed<std::uint64_t>(in, out, offset, count, op); return true;
    case ncclFloat32: reduce_typed<float>(in, out, offset, count, op); return true;
    case ncclFloat64: reduce_typed<double>(in, out, offset, count, op); return true;
    default: return false;  // half types: not modelled (pmapcc never sends them)
  }
}

enum class Kind { all_reduce, all_gather, reduce_scatter, broadcast, send, recv };

struct Call {
  Kind kind = Kind::all_reduce;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0, peer = 0;
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
  std::uint64_t seq = 0;  // the collective's number on its communicator, or the n-th send/receive to/from peer
                          // (numbered() sets it when the call runs)
  bool recorded = false;  // recorded into a CUDA graph (NCCL: every rank captures a collective, or none)
};

// `k` with its number, taken as it runs (see ncclComm::collectives).
Call numbered(Call k) {
  std::lock_guard lock(k.comm->numbers_mutex);
  if (k.kind == Kind::send) {
    k.seq = k.comm->sent[k.peer]++;
  } else if (k.kind == Kind::recv) {
    k.seq = k.comm->received[k.peer]++;
  } else {
    k.seq = k.comm->collectives++;
  }
  return k;
}

// Held by a call recorded into a graph, for as long as a copy of the graph exists (ncclComm::captured).
struct CapturedRef {
  explicit CapturedRef(ncclComm* c) : comm(c) { comm->captured.fetch_add(1); }
  ~CapturedRef() { comm->captured.fetch_sub(1); }
  CapturedRef(const CapturedRef&) = delete;
  CapturedRef& operator=(const CapturedRef&) = delete;
  ncclComm* comm;
};

// Waits on the clique until pred() or this rank is aborted; false when aborted.
template <class P> bool await(ncclComm* c, std::unique_lock<std::mutex>& lock, P pred) {
  c->clique->changed.wait(lock, [&] { return pred() || c->aborted.load(); });
  return !c->aborted.load();
}

// This rank's result of collective k from every rank's send buffer `in` (rank order); false for a type or
// operation NCCL would refuse.
bool compute(const Call& k, const std::vector<const void*>& in, int rank, std::vector<unsigned char>& result) {
  const std::size_t es = type_size(k.type);
  std::size_t out_count = k.count;
  if (k.kind == Kind::all_gather) out_count = k.count * in.size();
  result.assign(out_count * es, 0);
  switch (k.count == 0 ? Kind::send : k.kind) {  // nothing to compute for an empty collective
    case Kind::all_reduce: return reduce(k.type, in, result.data(), 0, k.count, k.op);
    case Kind::reduce_scatter:
      return reduce(k.type, in, result.data(), static_cast<std::size_t>(rank) * k.count, k.count, k.op);
    case Kind::all_gather:
      for (std::size_t r = 0; r < in.size(); ++r) std::memcpy(result.data() + r * k.count * es, in[r], k.count * es);
      return true;
    case Kind::broadcast: std::memcpy(result.data(), in[static_cast<std::size_t>(k.root)], k.count * es); return true;
    default: return true;
  }
}

void run_collective_across_processes(const Call& k);

// A collective, run on the rank's stream: meet the peers, compute this rank's result from their send
// buffers into a private buffer, wait until every rank has computed (an in-place peer may then overwrite
// its send buffer), then write the result.
void run_collective(const Call& k) {
  ncclComm* c = k.comm;
  if (!c->dir.empty()) return run_collective_across_processes(k);
  Clique& q = *c->clique;
  const int n = q.nranks;
  std::unique_lock lock(q.mutex);
  Round& round = q.rounds[k.seq];
  if (round.slots.empty()) round.slots.resize(static_cast<std::size_t>(n));
  round.slots[static_cast<std::size_t>(c->rank)] = Slot{k.send, k.recorded};
  ++round.arrived;
  q.changed.notify_all();
  if (!await(c, lock, [&] { return round.arrived == n; })) return;
  // A rank's graph replay meeting another's call made outside a graph: NCCL requires every rank to capture
  // a collective or none (what it does otherwise is undefined), so the stand-in reports it.
  for (const Slot& s : round.slots)
    if (s.recorded != k.recorded) c->async_error.store(ncclInvalidUsage);
  std::vector<const void*> in;
  for (const Slot& s : round.slots) in.push_back(s.send);
  lock.unlock();
  std::vector<unsigned char> result;
  const bool ok = compute(k, in, c->rank, result);
  if (!ok) c->async_error.store(ncclInvalidArgument);
  lock.lock();
  ++round.computed;
  q.changed.notify_all();
  if (!await(c, lock, [&] { return round.computed == n; })) return;
  lock.unlock();
  if (ok && !result.empty()) std::memcpy(k.recv, result.data(), result.size());
  lock.lock();
  if (++round.left == n) q.rounds.erase(k.seq);
}

// ---- Across processes --------------------------------------------------------------------------------
// With PMAPCC_STANDIN_NODE set, each process plays a machine of its own, and a communicator's ranks meet
// through files in a folder named by the unique id, under $PMAPCC_STANDIN_NCCL_DIR, else $TMPDIR, else /tmp
// (the folder must exist and be shared by the processes): a rank's part of a meeting
// is a file of its own, renamed into place so that it appears whole, and the meeting is over for a rank
// when every rank's part is there. Every wait polls and gives up when the rank is aborted; its peers keep
// waiting, as NCCL's do. The small join, split and finalize files stay: remove the folder after the job.

std::string part(const ncclComm* c, const std::string& what, int rank) {
  return c->dir + "/" + what + "-" + std::to_string(rank);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool put(const std::string& path, const void* data, std::size_t bytes) {
  const std::string tmp = path + ".partial";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return false;
  const bool written = bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes;
  return (std::fclose(f) == 0) && written && std::rename(tmp.c_str(), path.c_str()) == 0;
}

std::optional<std::vector<unsigned char>> slurp(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::nullopt;
  std::vector<unsigned char> out;
  unsigned char buffer[1 << 16];
  for (std::size_t got; (got = std::fread(buffer, 1, sizeof buffer, f)) > 0;)
    out.insert(out.end(), buffer, buffer + got);
  const bool ok = std::ferror(f) == 0;
  std::fclose(f);
  if (!ok) return std::nullopt;
  return out;
}

// Polls until done() or the rank is aborted; false when aborted.
template <class P> bool poll(const ncclComm* c, P done) {
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (c->aborted.load()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(i < 200 ? 20 : 500));
  }
}

bool all_there(const ncclComm* c, const std::string& what) {
  for (int r = 0; r < c->clique->nranks; ++r)
    if (!exists(part(c, what, r))) return false;
  return true;
}

// Writes this rank's part of meeting `what` and returns every rank's, in rank order; nothing when the
// rank was aborted meanwhile, or a file could not be written or read (then also an asynchronous error).
std::optional<std::vector<std::vector<unsigned char>>> meet(ncclComm* c, const std::string& what, const void* data,
                                                            std::size_t bytes) {
  if (!put(part(c, what, c->rank), data, bytes)) {
    c->async_error.store(ncclSystemError);
    return std::nullopt;
  }
  if (!poll(c, [&] { return all_there(c, what); })) return std::nullopt;
  std::vector<std::vector<unsigned char>> parts;
  for (int r = 0; r < c->clique->nranks; ++r) {
    auto p = slurp(part(c, what, r));
    if (!p) {
      c->async_error.store(ncclSystemError);
      return std::nullopt;
    }
    parts.push_back(std::move(*p));
  }
  return parts;
}

void run_collective_across_processes(const Call& k) {
  ncclComm* c = k.comm;
  const std::size_t bytes = k.count * type_size(k.type);
  auto parts = meet(c, "collective" + std::to_string(k.seq), k.send, k.count == 0 ? 0 : bytes);
  if (!parts) return;
  // Each rank wrote its part of this meeting after reading every part of the one before: this rank's
  // part of that one is no longer needed.
  if (k.seq > 0) std::remove(part(c, "collective" + std::to_string(k.seq - 1), c->rank).c_str());
  std::vector<const void*> in;
  for (const auto& p : *parts) {
    if (p.size() != (k.count == 0 ? 0 : bytes)) {  // a peer called with another count: NCCL's would corrupt
      c->async_error.store(ncclInvalidUsage);
      return;
    }
    in.push_back(p.data());
  }
  std::vector<unsigned char> result;
  if (!compute(k, in, c->rank, result)) {
    c->async_error.store(ncclInvalidArgument);
    return;
  }
  if (!result.empty()) std::memcpy(k.recv, result.data(), result.size());
}

// A group's sends and receives on one rank, fused, through files: post every send, take (read and remove)
// every receive, wait until this rank's sends have been taken, then write what was received.
void run_p2p_across_processes(const std::vector<Call>& calls) {
  ncclComm* c = calls.front().comm;
  auto mail = [&](int from, int to, std::uint64_t seq) {
    return c->dir + "/p2p-" + std::to_string(from) + "-" + std::to_string(to) + "-" + std::to_string(seq);
  };
  std::vector<std::string> posted;
  for (const Call& k : calls)
    if (k.kind == Kind::send) {
      posted.push_back(mail(c->rank, k.peer, k.seq));
      if (!put(posted.back(), k.send, k.count * type_size(k.type))) {
        c->async_error.store(ncclSystemError);
        return;
      }
    }
  std::vector<std::pair<void*, std::vector<unsigned char>>> received;
  for (const Call& k : calls) {
    if (k.kind != Kind::recv) continue;
    const std::string path = mail(k.peer, c->rank, k.seq);
    if (!poll(c, [&] { return exists(path); })) return;
    auto data = slurp(path);
    if (!data) {
      c->async_error.store(ncclSystemError);
      return;
    }
    std::remove(path.c_str());
    data->resize(std::min(data->size(), k.count * type_size(k.type)));
    received.emplace_back(k.recv, std::move(*data));
  }
  if (!poll(c, [&] {
        for (const auto& p : posted)
          if (exists(p)) return false;
        return true;
      }))
    return;
  for (auto& [dst, bytes] : received)
    if (!bytes.empty()) std::memcpy(dst, bytes.data(), bytes.size());
}

// The folder of the communicator with unique id `id` (the id's maker's process id and serial number).
std::string folder_of(const ncclUniqueId& id) {
  std::uint64_t serial = 0;
  std::uint32_t pid = 0;
  std::memcpy(&serial, id.internal + 8, sizeof serial);
  std::memcpy(&pid, id.internal + 16, sizeof pid);
  const char* dir = std::getenv("PMAPCC_STANDIN_NCCL_DIR");
  if (dir == nullptr || *dir == '\0') dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/pmapcc-standin-nccl-" + std::to_string(pid) +
         "-" + std::to_string(serial);
}

// Makes rank `rank` of a communicator meeting in `dir` and posts its join file; nullptr on a file error.
ncclComm* join_across_processes(const std::string& dir, int nranks, int rank, int device, const ncclConfig_t* config) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return nullptr;
  ncclComm* c = make_comm(std::make_shared<Clique>(nranks), rank, device, config);
  c->dir = dir;
  if (!put(part(c, "join", rank), nullptr, 0)) {
    c->aborted.store(true);
    return nullptr;
  }
  return c;
}

// A group's sends and receives on one rank, fused: post every send, take every receive, then wait until
// this rank's sends have been taken (a send outside a group waits for its receive: NCCL's deadlock).
void run_p2p(const std::vector<Call>& calls) {
  ncclComm* c = calls.front().comm;
  if (!c->dir.empty()) return run_p2p_across_processes(calls);
  Clique& q = *c->clique;
  std::unique_lock lock(q.mutex);
  std::vector<std::tuple<int, int, std::uint64_t>> posted;
  for (const Call& k : calls)
    if (k.kind == Kind::send) {
      const auto key = std::make_tuple(c->rank, k.peer, k.seq);
      q.mail[key] = Mail{k.send, k.count * type_size(k.type), false};
      posted.push_back(key);
    }
  q.changed.notify_all();
  std::vector<std::pair<void*, std::vector<unsigned char>>> received;
  for (const Call& k : calls) {
    if (k.kind != Kind::recv) continue;
    const auto key = std::make_tuple(k.peer, c->rank, k.seq);
    if (!await(c, lock, [&] { return q.mail.count(key) != 0 && !q.mail[key].taken; })) return;
    Mail& m = q.mail[key];
    const std::size_t bytes = std::min(m.bytes, k.count * type_size(k.type));
    received.emplace_back(k.recv, std::vector<unsigned char>(static_cast<const unsigned char*>(m.data),
                                                             static_cast<const unsigned char*>(m.data) + bytes));
    m.taken = true;
    q.changed.notify_all();
  }
  if (!await(c, lock, [&] {
        for (const auto& key : posted)
          if (!q.mail[key].taken) return false;
        return true;
      }))
    return;
  for (const auto& key : posted) q.mail.erase(key);
  lock.unlock();
  for (auto& [dst, bytes] : received) std::memcpy(dst, bytes.data(), bytes.size());
}

thread_local int group_depth = 0;
thread_local std::vector<Call> group_calls;

ncclResult_t launch(std::vector<Call> calls) {
  // Collectives one by one; each communicator's sends and receives fused into one piece of work.
  std::map<ncclComm*, std::vector<Call>> p2p;
  for (Call& k : calls) {
    if (k.kind == Kind::send || k.kind == Kind::recv) {
      p2p[k.comm].push_back(k);
      continue;
    }
    Call copy = k;
    // Recorded into a capture: the graph holds the communicator (CapturedRef) until it is destroyed.
    std::shared_ptr<CapturedRef> ref;
    if (pmapcc_standin::stream_info(k.stream).capturing) ref = std::make_shared<CapturedRef>(k.comm);
    copy.recorded = ref != nullptr;
    if (pmapcc_standin::enqueue(k.stream, [copy, ref] { run_collective(numbered(copy)); }, k.comm->device) !=
        cudaSuccess)
      return usage("the stream of a collective is not a valid stream");
  }
  for (auto& [comm, list] : p2p) {
    const std::vector<Call> fused = list;
    std::shared_ptr<CapturedRef> ref;
    if (pmapcc_standin::stream_info(list.front().stream).capturing) ref = std::make_shared<CapturedRef>(comm);
    const auto run = [fused, ref] {
      std::vector<Call> now;
      for (const Call& k : fused) now.push_back(numbered(k));
      run_p2p(now);
    };
    if (pmapcc_standin::enqueue(list.front().stream, run, comm->device) != cudaSuccess)
      return usage("the stream of a send or receive is not a valid stream");
  }
  return ncclSuccess;
}

// ---- Launches from NCCL's own thread -------------------------------------------------------------------
// NCCL 2.28 runs a call on a nonblocking communicator of several ranks (a collective outside a group, or a
// whole group) as a group that a thread of NCCL's puts on the streams later: the call returns
// ncclInProgress, ncclCommGetAsyncError reads ncclInProgress until the work is on its streams, and whatever
// the caller queues on a stream meanwhile runs before it (review N1). Here one launcher thread, started
// when there is work and gone after kLinger without any, puts each such unit on its streams a random delay
// of up to kMaxLaunchDelay after its issue, the units in issue order (so a communicator's collectives reach
// their streams in the order they were issued). Blocking and one-rank communicators launch at the call, as
// NCCL's do. PMAPCC_STANDIN_NCCL_SEED seeds the delays (default: a random seed per process).

constexpr std::chrono::microseconds kMaxLaunchDelay{2000};
constexpr std::chrono::milliseconds kLinger{50};

struct Unit {
  std::vector<Call> calls;
  std::chrono::steady_clock::time_point due;
};

std::uint32_t launch_seed() {
  const char* s = std::getenv("PMAPCC_STANDIN_NCCL_SEED");
  if (s != nullptr && *s != '\0') return static_cast<std::uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

struct Launcher {
  std::mutex mutex;
  std::condition_variable changed;  // a unit issued, launched or cancelled, or the thread gone
  std::deque<Unit> queue;           // issued, not yet taken by the thread
  bool running = false;             // a launcher thread is alive
  std::minstd_rand delays{launch_seed()};
};

Launcher& launcher() {
  static auto* l = new Launcher;  // never destroyed: its thread may still linger at exit
  return *l;
}

std::vector<ncclComm*> comms_of(const std::vector<Call>& calls) {
  std::vector<ncclComm*> out;
  for (const Call& k : calls)
    if (std::find(out.begin(), out.end(), k.comm) == out.end()) out.push_back(k.comm);
  return out;
}

// The launcher thread: each unit at its due time, in issue order; a failed launch is its communicators'
// asynchronous error. Every pending count changes under the lock, last (release: a caller that reads it
// zero sees the work on its streams).
void run_launches() {
  Launcher& l = launcher();
  std::unique_lock lock(l.mutex);
  for (;;) {
    if (l.queue.empty() && !l.changed.wait_for(lock, kLinger, [&] { return !l.queue.empty(); })) break;
    const auto due = l.queue.front().due;
    if (std::chrono::steady_clock::now() < due) {
      l.changed.wait_until(lock, due);
      continue;
    }
    Unit unit = std::move(l.queue.front());
    l.queue.pop_front();
    lock.unlock();
    const ncclResult_t result = unit.calls.empty() ? ncclSuccess : launch(unit.calls);
    lock.lock();
    for (ncclComm* c : comms_of(unit.calls)) {
      if (result != ncclSuccess) c->async_error.store(result);
      c->pending_launches.fetch_sub(1, std::memory_order_release);
    }
    l.changed.notify_all();
  }
  l.running = false;
  l.changed.notify_all();
}

// Queues `calls` (one unit) for the launcher thread; ncclInProgress.
ncclResult_t defer(std::vector<Call> calls) {
  Launcher& l = launcher();
  std::lock_guard lock(l.mutex);
  const std::chrono::microseconds delay(
      std::uniform_int_distribution<long>(0, static_cast<long>(kMaxLaunchDelay.count()))(l.delays));
  for (ncclComm* c : comms_of(calls)) c->pending_launches.fetch_add(1, std::memory_order_relaxed);
  l.queue.push_back(Unit{std::move(calls), std::chrono::steady_clock::now() + delay});
  if (!l.running) {
    l.running = true;
    std::thread(run_launches).detach();
  }
  l.changed.notify_all();
  return ncclInProgress;
}

// A collective outside a group, or a group's calls: launched now, or by the launcher thread when a
// communicator among them is nonblocking and has several ranks.
ncclResult_t submit(std::vector<Call> calls) {
  for (const Call& k : calls)
    if (!k.comm->blocking && k.comm->clique->nranks > 1) return defer(std::move(calls));
  return launch(std::move(calls));
}

// Waits until none of c's calls is waiting for the launcher thread; with `cancel` (an abort), first drops
// those it has not taken yet. Teardown calls it, so that no launch reaches a communicator's streams after
// it is gone.
void settle_launches(ncclComm* c, bool cancel) {
  if (!cancel && c->pending_launches.load(std::memory_order_acquire) == 0) return;
  Launcher& l = launcher();
  std::unique_lock lock(l.mutex);
  if (cancel) {
    for (Unit& unit : l.queue)
      if (std::erase_if(unit.calls, [&](const Call& k) { return k.comm == c; }) > 0)
        c->pending_launches.fetch_sub(1, std::memory_order_release);
  }
  l.changed.wait(lock, [&] { return c->pending_launches.load(std::memory_order_acquire) == 0; });
}

ncclResult_t issue(Call k, const char* api) {
  if (ncclResult_t e = injected(api); e != ncclSuccess) return e;
  if (!live(k.comm)) return usage(std::string(api) + ": the communicator is NULL, destroyed or aborted");
  const bool reduces = k.kind == Kind::all_reduce || k.kind == Kind::reduce_scatter;
  if (type_size(k.type) == 0 || (reduces && (k.op < ncclSum || k.op > ncclAvg))) return ncclInvalidArgument;
  const pmapcc_standin::StreamInfo info = pmapcc_standin::stream_info(k.stream);
  if (!info.valid || info.device != k.comm->device)
    return usage(std::string(api) + ": the stream is not a stream of the communicator's GPU");
  if (k.kind == Kind::broadcast && (k.root < 0 || k.root >= k.comm->clique->nranks)) return ncclInvalidArgument;
  if (k.kind == Kind::send || k.kind == Kind::recv) {
    const int n = k.comm->clique->nranks;
    if (k.peer < 0 || k.peer >= n) return ncclInvalidArgument;
  }
  if (group_depth > 0) {
    group_calls.push_back(k);
    return ncclSuccess;
  }
  return submit({k});
}

// Read without the clique's lock: a caller polling a communicator must not be ordered after the ranks'
// executors, which meet under that lock.
bool initialized(ncclComm* c) {
  if (c->dir.empty()) return c->clique->joined.load() == c->clique->nranks;
  if (c->joined_all.load()) return true;
  const bool all = all_there(c, "join");
  if (all) c->joined_all.store(true);
  return all;
}

bool finalized(ncclComm* c) {
  if (c->dir.empty()) return c->clique->finalized.load() == c->clique->nranks;
  return all_there(c, "finalize");
}

}  // namespace

namespace pmapcc_standin {

std::size_t live_nccl_communicators() {
  std::lock_guard lock(registry_mutex);
  std::size_t n = 0;
  for (const auto& c : comms()) n += c->aborted.load() ? 0 : 1;
  return n;
}

}  // namespace pmapcc_standin

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (ncclResult_t e = injected("ncclGetUniqueId"); e != ncclSuccess) return e;
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id->internal, 0, sizeof id->internal);
  const std::uint64_t v = next_id.fetch_add(1);
  std::memcpy(id->internal, "standin", 7);
  std::memcpy(id->internal + 8, &v, sizeof v);
  const auto pid = static_cast<std::uint32_t>(::getpid());  // names the folder ranks in several processes meet in
  std::memcpy(id->internal + 16, &pid, sizeof pid);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (ncclResult_t e = injected("ncclCommInitRankConfig"); e != ncclSuccess) return e;
  if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (pmapcc_standin::node() >= 0) {
    ncclComm* c = join_across_processes(folder_of(id), nranks, rank, pmapcc_standin::current_device(), config);
    if (c == nullptr) return ncclSystemError;
    *comm = c;
    if (c->blocking && group_depth == 0) {
      poll(c, [&] { return initialized(c); });
      return ncclSuccess;
    }
    return c->blocking ? ncclSuccess : ncclInProgress;
  }
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard lock(registry_mutex);
    const std::string key(id.internal, sizeof id.internal);
    auto& slot = cliques()[key];
    if (!slot) slot = std::make_shared<Clique>(nranks);
    if (slot->nranks != nranks) return usage("ranks of one unique id disagree on the number of ranks");
    clique = slot;
  }
  ncclComm* c = make_comm(clique, rank, pmapcc_standin::current_device(), config);
  {
    std::lock_guard lock(clique->mutex);
    if (++clique->joined == nranks) {
      std::lock_guard reg(registry_mutex);
      cliques().erase(std::string(id.internal, sizeof id.internal));
    }
    clique->changed.notify_all();
  }
  *comm = c;
  if (c->blocking && group_depth == 0) {  // a blocking init waits for every rank (one thread, many ranks: a hang)
    std::unique_lock lock(clique->mutex);
    clique->changed.wait(lock, [&] { return clique->joined == nranks; });
    return ncclSuccess;
  }
  return c->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (ncclResult_t e = injected("ncclCommGetAsyncError"); e != ncclSuccess) return e;
  if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
  if (const int e = comm->async_error.load(); e != ncclSuccess) {
    *state = static_cast<ncclResult_t>(e);
    return ncclSuccess;
  }
  if (comm->pending_launches.load(std::memory_order_acquire) > 0) {  // not on its streams yet
    *state = ncclInProgress;
    return ncclSuccess;
  }
  bool done = initialized(comm) && comm->pending_split.load(std::memory_order_acquire) == 0;
  if (done && comm->finalizing) done = finalized(comm);
  *state = done ? ncclSuccess : ncclInProgress;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (ncclResult_t e = injected("ncclGroupEnd"); e != ncclSuccess) return e;
  if (group_depth == 0) return usage("ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<Call> calls;
  calls.swap(group_calls);
  return submit(std::move(calls));
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (ncclResult_t e = injected("ncclCommSplit"); e != ncclSuccess) return e;
  if (!live(comm) || newcomm == nullptr)
    return usage("ncclCommSplit: the communicator is NULL, destroyed or aborted");
  Clique& q = *comm->clique;
  const std::uint64_t seq = comm->splits++;
  *newcomm = nullptr;
  const bool blocking = config == nullptr || config->blocking != 0;
  if (!comm->dir.empty()) {  // across processes: meet, then make this rank's child (complete on return)
    const int mine[3] = {color, key, comm->rank};
    const std::string what = "split" + std::to_string(seq);
    auto parts = meet(comm, what, mine, sizeof mine);
    if (!parts) return comm->aborted.load() ? usage("ncclCommSplit: the communicator was aborted") : ncclSystemError;
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    std::vector<std::pair<int, int>> members;  // (key, rank) of this colour's ranks
    for (const auto& p : *parts) {
      int theirs[3];
      if (p.size() != sizeof theirs) return ncclSystemError;
      std::memcpy(theirs, p.data(), sizeof theirs);
      if (theirs[0] == color) members.emplace_back(theirs[1], theirs[2]);
    }
    std::sort(members.begin(), members.end());
    const auto me = std::find(members.begin(), members.end(), std::make_pair(key, comm->rank)) - members.begin();
    ncclComm* child = join_across_processes(comm->dir + "-" + what + "-colour" + std::to_string(color),
                                            static_cast<int>(members.size()), static_cast<int>(me), comm->device,
                                            config);
    if (child == nullptr) return ncclSystemError;
    std::atomic_ref<ncclComm_t>(*newcomm).store(child, std::memory_order_release);
    return ncclSuccess;
  }
  comm->pending_split.fetch_add(1);
  std::unique_lock lock(q.mutex);
  std::vector<SplitCall>& calls = q.splits[seq];
  calls.push_back(SplitCall{color, key, comm->rank, comm->device, newcomm});
  if (static_cast<int>(calls.size()) == q.nranks) {  // the last rank in makes every child
    std::map<int, std::vector<SplitCall>> by_color;
    for (const SplitCall& s : calls)
      if (s.color != NCCL_SPLIT_NOCOLOR) by_color[s.color].push_back(s);
    for (auto& [col, members] : by_color) {
      std::sort(members.begin(), members.end(),
                [](const SplitCall& a, const SplitCall& b) {
                  return std::tie(a.key, a.rank) < std::tie(b.key, b.rank);
                });
      auto child = std::make_shared<Clique>(static_cast<int>(members.size()));
      child->joined.store(child->nranks);
      for (std::size_t r = 0; r < members.size(); ++r) {
        ncclComm* c = make_comm(child, static_cast<int>(r), members[r].device, config);
        std::atomic_ref<ncclComm_t>(*members[r].out).store(c, std::memory_order_release);
      }
    }
    q.splits.erase(seq);
    std::lock_guard reg(registry_mutex);
    for (const auto& c : comms())
      if (c->clique.get() == &q) c->pending_split.store(0, std::memory_order_release);
    q.changed.notify_all();
  }
  if (blocking) {
    q.changed.wait(lock, [&] { return comm->pending_split.load() == 0; });
    return ncclSuccess;
  }
  return ncclInProgress;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t e = injected("ncclCommFinalize"); e != ncclSuccess) return e;
  if (!live(comm)) return usage("ncclCommFinalize: the communicator is NULL, destroyed or aborted");
  settle_launches(comm, false);  // NCCL's finalize flushes what is queued
  comm->finalizing = true;
  if (!comm->dir.empty()) {
    if (!put(part(comm, "finalize", comm->rank), nullptr, 0)) return ncclSystemError;
    if (!comm->blocking) return ncclInProgress;
    poll(comm, [&] { return finalized(comm); });
    return ncclSuccess;
  }
  std::unique_lock lock(comm->clique->mutex);
  ++comm->clique->finalized;
  comm->clique->changed.notify_all();
  if (comm->blocking) {
    comm->clique->changed.wait(lock, [&] { return comm->clique->finalized == comm->clique->nranks; });
    return ncclSuccess;
  }
  return ncclInProgress;
}

// NCCL's destroy and abort wait until every CUDA graph holding the communicator's collectives is destroyed
// (its persistent references): a graph still running (a replay) lets go when it ends, which an abort hastens
// (its waiting collectives give up), but a graph that still exists holds the communicator for good, and NCCL
// would wait forever. The stand-in waits for running replays, then stops the program with the reason.
void await_no_graphs(ncclComm* comm, const char* api) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (comm->captured.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (const int n = comm->captured.load(); n > 0) {
    std::fprintf(stderr,
                 "pmapcc CUDA stand-in: %s on a communicator whose collectives %d CUDA graph node(s) still hold: NCCL "
                 "would wait here forever for those graphs to be destroyed (destroy them first)\n",
                 api, n);
    std::abort();
  }
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!live(comm)) return usage("ncclCommDestroy: the communicator is NULL, destroyed or aborted");
  settle_launches(comm, false);
  await_no_graphs(comm, "ncclCommDestroy");
  comm->aborted.store(true);  // the handle is dead; work queued on it has run (or gives up)
  std::lock_guard lock(comm->clique->mutex);
  comm->clique->changed.notify_all();
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->aborted.store(true);  // its collectives waiting for peers give up; the peers keep waiting, as NCCL's
  settle_launches(comm, true);  // what NCCL's thread has not launched yet never will be
  {
    std::lock_guard lock(comm->clique->mutex);
    comm->clique->changed.notify_all();
  }
  await_no_graphs(comm, "ncclCommAbort");
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(Call{Kind::all_reduce, send, recv, count, type, op, 0, 0, comm, stream, 0}, "ncclAllReduce");
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return issue(Call{Kind::all_gather, send, recv, count, type, ncclSum, 0, 0, comm, stream, 0}, "ncclAllGather");
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  const Call k{Kind::reduce_scatter, send, recv, count, type, op, 0, 0, comm, stream, 0};
  return issue(k, "ncclReduceScatter");
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return issue(Call{Kind::broadcast, send, recv, count, type, ncclSum, root, 0, comm, stream, 0}, "ncclBroadcast");
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(Call{Kind::send, send, nullptr, count, type, ncclSum, 0, peer, comm, stream, 0}, "ncclSend");
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(Call{Kind::recv, nullptr, recv, count, type, ncclSum, 0, peer, comm, stream, 0}, "ncclRecv");
}

}  // extern "C"
