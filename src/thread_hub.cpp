// ThreadHub: SPMD rendezvous and deterministic data movement for CPU-device collectives.
#include "thread_hub.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <pmap/error.h>

namespace pmap::detail {
namespace {

constexpr std::size_t kBlock = 2048;  // elements reduced per step (fits in L1 with a few inputs)

template <class T> inline T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return static_cast<T>(a + b);
    case ReduceOp::max:
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return a < b ? b : a;
    case ReduceOp::min:
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return b < a ? b : a;
  }
  return a;
}

// memcpy, but copies under 256 KiB go in 64-byte pieces that the compiler keeps in vector registers: glibc
// hands copies from 4 KiB up to a few hundred KiB to `rep movsb`, which on the AMD EPYC VMs we test on runs
// at ~3 GB/s for some relative alignments of source and destination (measured: dst - src = 8 or 16 mod 4096),
// against 40-90 GB/s otherwise. Larger copies keep glibc's own (streaming) path.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes >= (std::size_t{256} << 10)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) std::memcpy(d + i, s + i, 64);
  std::memcpy(d + i, s + i, bytes - i);
}

// acc[i] = in_0[off+i] op in_1[off+i] op ... in rank order: the same bits wherever it is computed.
template <class T>
void reduce_block(const std::vector<const T*>& in, std::size_t off, std::size_t len, ReduceOp op, T* acc) {
  const T* first = in[0] + off;
  if (in.size() == 1) return copy_bytes(acc, first, len * sizeof(T));
  const T* second = in[1] + off;  // the first step reads two inputs: no pass that only copies in_0
  if (op == ReduceOp::sum) {
    for (std::size_t i = 0; i < len; ++i) acc[i] = static_cast<T>(first[i] + second[i]);
  } else {
    for (std::size_t i = 0; i < len; ++i) acc[i] = combine(first[i], second[i], op);
  }
  for (std::size_t k = 2; k < in.size(); ++k) {
    const T* src = in[k] + off;
    if (op == ReduceOp::sum) {
      for (std::size_t i = 0; i < len; ++i) acc[i] = static_cast<T>(acc[i] + src[i]);
    } else {
      for (std::size_t i = 0; i < len; ++i) acc[i] = combine(acc[i], src[i], op);
    }
  }
}

// Rank r reduces elements [begin, end) of every rank's send buffer (offset src_off) and writes them
// to each destination in `outs` (offset dst_off). Only rank r touches these elements, so in-place
// (send == recv) is safe.
template <class T>
void reduce_range(const std::vector<const void*>& sends, const std::vector<void*>& outs, std::size_t src_off,
                  std::size_t dst_off, std::size_t len, ReduceOp op) {
  std::vector<const T*> in(sends.size());
  for (std::size_t k = 0; k < sends.size(); ++k) in[k] = static_cast<const T*>(sends[k]);
  alignas(64) T acc[kBlock];
  for (std::size_t b = 0; b < len; b += kBlock) {
    std::size_t n = std::min(kBlock, len - b);
    reduce_block(in, src_off + b, n, op, acc);
    for (void* out : outs) copy_bytes(static_cast<T*>(out) + dst_off + b, acc, n * sizeof(T));
  }
}

template <class F> void with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::i32: return f(std::int32_t{});
    case DType::i64: return f(std::int64_t{});
    case DType::u32: return f(std::uint32_t{});
    case DType::u8: return f(std::uint8_t{});
  }
}

const char* reduce_name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : op == ReduceOp::max ? "max" : "min";
}

bool same_signature(const CollectiveOp& a, const Group* ga, const CollectiveOp& b, const Group* gb) {
  return a.kind == b.kind && a.reduce == b.reduce && a.dtype == b.dtype && a.count == b.count &&
         a.root == b.root && a.perm_id == b.perm_id && std::strcmp(a.name, b.name) == 0 && ga->axes == gb->axes;
}

}  // namespace

ThreadHub::ThreadHub(std::vector<std::string> device_names, std::chrono::milliseconds timeout)
    : names_(std::move(device_names)), timeout_(timeout), slots_(names_.size()) {}

void ThreadHub::reset() {
  std::lock_guard lk(mu_);
  for (auto& s : slots_) s = Slot{};
  aborted_ = false;
  reason_.clear();
}

void ThreadHub::finished(int device, bool failed) {
  std::lock_guard lk(mu_);
  if (!failed) slots_[static_cast<std::size_t>(device)].finished = true;
  cv_.notify_all();
}

void ThreadHub::abort(const std::string& reason) {
  std::lock_guard lk(mu_);
  if (!aborted_) {
    aborted_ = true;
    reason_ = reason;
  }
  cv_.notify_all();
}

std::string ThreadHub::describe(int device) const {
  const Slot& s = slots_[static_cast<std::size_t>(device)];
  return describe(names_[static_cast<std::size_t>(device)], Posted{s.seq, s.op, s.group});
}

std::string ThreadHub::describe(const std::string& device_name, const Posted& s) const {
  std::string d = device_name + " called " + s.op.name + "(" +
                  std::string(name(s.op.dtype)) + "[" + std::to_string(s.op.count) + "]";
  if (s.op.kind == OpKind::all_reduce || s.op.kind == OpKind::reduce_scatter) d += std::string(", ") + reduce_name(s.op.reduce);
  if (s.op.kind == OpKind::broadcast) d += ", root " + std::to_string(s.op.root);
  return d + ") over " + s.group->axes;
}

std::string ThreadHub::find_divergence(int device, const Group& group, std::uint64_t seq) const {
  const Slot& me = slots_[static_cast<std::size_t>(device)];
  for (std::size_t e = 0; e < slots_.size(); ++e) {
    const Posted& other = slots_[e].history[seq % kHistory];
    if (other.seq == seq && !same_signature(me.op, me.group, other.op, other.group))
      return "devices called different collectives as their collective #" + std::to_string(seq) + ": " +
             describe(device) + ", but " + describe(names_[e], other);
  }
  for (int m : group.members) {
    const Slot& other = slots_[static_cast<std::size_t>(m)];
    if (other.finished && other.seq < seq)
      return describe(device) + " as its collective #" + std::to_string(seq) + ", but " +
             names_[static_cast<std::size_t>(m)] + " returned after " + std::to_string(other.seq) +
             " collective(s)";
  }
  return {};
}

bool ThreadHub::all_arrived(const Group& group, std::uint64_t seq) const {
  for (int m : group.members)
    if (slots_[static_cast<std::size_t>(m)].seq < seq) return false;
  return true;
}

bool ThreadHub::group_complete(const Group& group, std::uint64_t seq) const {
  const Posted* first = nullptr;
  for (int m : group.members) {
    const Posted& p = slots_[static_cast<std::size_t>(m)].history[seq % kHistory];
    if (p.seq != seq || p.withdrawn) return false;
    if (first != nullptr && !same_signature(first->op, first->group, p.op, p.group)) return false;
    if (first == nullptr) first = &p;
  }
  return true;
}

std::string ThreadHub::missing(const Group& group, std::uint64_t seq) const {
  std::string out;
  for (int m : group.members)
    if (slots_[static_cast<std::size_t>(m)].seq < seq) out += (out.empty() ? "" : ", ") + names_[static_cast<std::size_t>(m)];
  return out;
}

void ThreadHub::collective(int device, const Group& group, int rank, const CollectiveOp& op) {
  std::unique_lock lk(mu_);
  Slot& me = slots_[static_cast<std::size_t>(device)];
  // Post before looking at the abort flag: a device arriving after a mismatch was found still sees
  // (and reports) the mismatch rather than a bare cancellation.
  const std::uint64_t seq = me.seq + 1;
  me.op = op;
  me.group = &group;
  me.seq = seq;
  me.history[seq % kHistory] = Posted{seq, op, &group};
  cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    // A group whose members all posted this same call runs it, whatever happened elsewhere: every member
    // reaches the same verdict, and a member that has already started moving data waits for the others.
    if (group_complete(group, seq)) break;
    if (std::string div = find_divergence(device, group, seq); !div.empty()) {
      if (!aborted_) {
        aborted_ = true;
        reason_ = div;
      }
      withdraw(me, seq);
      throw CollectiveMismatch(div);
    }
    if (aborted_) {
      withdraw(me, seq);
      throw Aborted(std::string(op.name) + " over " + group.axes + " cancelled: " + reason_);
    }
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !all_arrived(group, seq)) {
      std::string msg = describe(device) + " timed out after " + std::to_string(timeout_.count()) +
                        " ms waiting for " + missing(group, seq);
      aborted_ = true;
      reason_ = msg;
      withdraw(me, seq);
      throw Timeout(msg);
    }
  }
  lk.unlock();
  execute(group, rank);
  lk.lock();
  me.done = seq;
  cv_.notify_all();
  // Peers may still read our send buffer or write our recv buffer: wait for all of them. Every member
  // saw the group complete, and data movement cannot block, so this wait is finite.
  cv_.wait(lk, [&] {
    for (int m : group.members)
      if (slots_[static_cast<std::size_t>(m)].done < seq) return false;
    return true;
  });
}

void ThreadHub::withdraw(Slot& me, std::uint64_t seq) {
  me.history[seq % kHistory].withdrawn = true;
  cv_.notify_all();
}

void ThreadHub::execute(const Group& group, int rank) const {
  const std::size_t n = group.members.size();
  const Slot& mine = slots_[static_cast<std::size_t>(group.members[static_cast<std::size_t>(rank)])];
  const CollectiveOp& op = mine.op;
  const std::size_t esize = size_of(op.dtype);
  std::vector<const void*> sends(n);
  std::vector<void*> recvs(n);
  for (std::size_t k = 0; k < n; ++k) {
    const Slot& s = slots_[static_cast<std::size_t>(group.members[k])];
    sends[k] = s.op.send;
    recvs[k] = s.op.recv;
  }
  const auto r = static_cast<std::size_t>(rank);
  switch (op.kind) {
    case OpKind::all_reduce: {
      std::size_t begin = op.count * r / n, end = op.count * (r + 1) / n;
      with_type(op.dtype, [&](auto t) {
        reduce_range<decltype(t)>(sends, recvs, begin, begin, end - begin, op.reduce);
      });
      break;
    }
    case OpKind::reduce_scatter:
      with_type(op.dtype, [&](auto t) {
        reduce_range<decltype(t)>(sends, {op.recv}, r * op.count, 0, op.count, op.reduce);
      });
      break;
    case OpKind::all_gather:
      for (std::size_t k = 0; k < n; ++k)
        copy_bytes(static_cast<char*>(recvs[k]) + r * op.count * esize, op.send, op.count * esize);
      break;
    case OpKind::broadcast:
      if (op.recv != sends[static_cast<std::size_t>(op.root)])
        copy_bytes(op.recv, sends[static_cast<std::size_t>(op.root)], op.count * esize);
      break;
    case OpKind::permute:
      if (op.recv_from >= 0) {
        copy_bytes(op.recv, sends[static_cast<std::size_t>(op.recv_from)], op.count * esize);
      } else {
        std::memset(op.recv, 0, op.count * esize);
      }
      break;
    case OpKind::barrier: break;
  }
}

void ThreadCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  CollectiveOp c;
  c.kind = OpKind::all_reduce, c.reduce = op, c.dtype = dtype, c.count = count, c.send = send, c.recv = recv;
  c.name = "all_reduce";
  run(c);
}

void ThreadCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
  CollectiveOp c;
  c.kind = OpKind::all_gather, c.dtype = dtype, c.count = count, c.send = send, c.recv = recv, c.name = "all_gather";
  run(c);
}

void ThreadCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  CollectiveOp c;
  c.kind = OpKind::reduce_scatter, c.reduce = op, c.dtype = dtype, c.count = count, c.send = send, c.recv = recv;
  c.name = "reduce_scatter";
  run(c);
}

void ThreadCommunicator::broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root) {
  CollectiveOp c;
  c.kind = OpKind::broadcast, c.dtype = dtype, c.count = count, c.root = root, c.send = send, c.recv = recv;
  c.name = "broadcast";
  run(c);
}

void ThreadCommunicator::permute(const void* send, void* recv, std::size_t count, DType dtype, int send_to,
                                 int recv_from, std::size_t perm_id) {
  CollectiveOp c;
  c.kind = OpKind::permute, c.dtype = dtype, c.count = count, c.send = send, c.recv = recv;
  c.send_to = send_to, c.recv_from = recv_from, c.perm_id = perm_id, c.name = "permute";
  run(c);
}

void ThreadCommunicator::barrier() {
  CollectiveOp c;
  c.name = "barrier";
  run(c);
}

}  // namespace pmap::detail
