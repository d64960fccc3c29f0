// ThreadHub: SPMD rendezvous and deterministic data movement for CPU-device collectives.
#include "thread_hub.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include <pmap/detail/capture.h>
#include <pmap/error.h>

#include "reduce.h"

namespace pmap::detail {
namespace {

bool same_signature(const CollectiveOp& a, const Group* ga, const CollectiveOp& b, const Group* gb) {
  return a.kind == b.kind && a.reduce == b.reduce && a.dtype == b.dtype && a.count == b.count &&
         a.root == b.root && a.perm_id == b.perm_id && a.recorded == b.recorded && std::strcmp(a.name, b.name) == 0 &&
         ga->axes == gb->axes;
}

}  // namespace

ThreadHub::ThreadHub(std::vector<std::string> device_names, std::vector<bool> local, std::chrono::milliseconds timeout)
    : names_(std::move(device_names)), local_(std::move(local)), timeout_(timeout), slots_(names_.size()) {
  local_.resize(names_.size(), true);
  spin_ = names_.size() <= std::max(1u, std::thread::hardware_concurrency());
}

void ThreadHub::changed() {
  changes_.fetch_add(1, std::memory_order_release);
  cv_.notify_all();
}

std::cv_status ThreadHub::await(std::unique_lock<std::mutex>& lk, std::chrono::steady_clock::time_point deadline) {
  if (spin_) {
    // About 20-50 us of polling. A change made after the last poll needs mu_, which this thread holds
    // again before it sleeps, so no wake-up is lost.
    const std::uint64_t seen = changes_.load(std::memory_order_acquire);
    lk.unlock();
    for (int i = 0; i < 2048 && changes_.load(std::memory_order_acquire) == seen; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    lk.lock();
    if (changes_.load(std::memory_order_relaxed) != seen) return std::cv_status::no_timeout;
  }
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    cv_.wait(lk);
    return std::cv_status::no_timeout;
  }
  return cv_.wait_until(lk, deadline);
}

void ThreadHub::reset() {
  std::lock_guard lk(mu_);
  for (auto& s : slots_) s = Slot{};
  aborted_ = false;
  timed_out_ = false;
  reason_.clear();
}

void ThreadHub::finished(int device, bool failed) {
  std::lock_guard lk(mu_);
  if (!failed) slots_[static_cast<std::size_t>(device)].finished = true;
  changed();
}

void ThreadHub::abort(const std::string& reason, bool timeout) {
  std::lock_guard lk(mu_);
  if (!aborted_) {
    aborted_ = true;
    timed_out_ = timeout;
    reason_ = reason;
  }
  changed();
}

std::string ThreadHub::describe(int device) const {
  const Slot& s = slots_[static_cast<std::size_t>(device)];
  return describe(names_[static_cast<std::size_t>(device)], s.posted);
}

std::string ThreadHub::describe(const std::string& device_name, const Posted& s) const {
  std::string d = device_name + " called " + s.op.name + "(" +
                  std::string(name(s.op.dtype)) + "[" + std::to_string(s.op.count) + "]";
  if (s.op.kind == CollectiveKind::all_reduce || s.op.kind == CollectiveKind::reduce_scatter)
    d += std::string(", ") + reduce_name(s.op.reduce);
  if (s.op.kind == CollectiveKind::broadcast) d += ", root " + std::to_string(s.op.root);
  return d + ") over " + s.group->axes + (s.op.recorded ? " (recording it into a CUDA graph)" : "");
}

// The first difference between this device's collective #seq and another device's: any device of the
// mesh, or (group_only) only the members of this device's group.
std::string ThreadHub::find_divergence(int device, const Group& group, std::uint64_t seq, bool group_only) const {
  const Slot& me = slots_[static_cast<std::size_t>(device)];
  for (std::size_t e = 0; e < slots_.size(); ++e) {
    if (group_only && std::find(group.members.begin(), group.members.end(), static_cast<int>(e)) == group.members.end())
      continue;
    const Posted& other = slots_[e].history[seq % kHistory];
    if (other.seq == seq && !same_signature(me.posted.op, me.posted.group, other.op, other.group))
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

bool ThreadHub::missing_wait_elsewhere(const Group& group, std::uint64_t seq) const {
  for (int m : group.members) {
    const Slot& s = slots_[static_cast<std::size_t>(m)];
    if (s.seq < seq && s.done >= s.seq) return false;  // missing, and not inside a collective
  }
  return true;
}

std::string ThreadHub::local_suspects(std::uint64_t seq) const {
  std::string out;
  for (std::size_t d = 0; d < slots_.size(); ++d) {
    const Slot& s = slots_[d];
    if (!local_[d] || s.seq >= seq || s.done < s.seq) continue;  // reached collective #seq, or waits inside one
    out += "; " + names_[d] + " of this process " +
           (s.finished ? "returned early, after collective #" + std::to_string(s.seq)
                       : "has not called collective #" + std::to_string(s.seq + 1) + " (busy outside collectives)") +
           ": the missing process may be waiting for it";
  }
  return out;
}

std::string ThreadHub::missing(const Group& group, std::uint64_t seq) const {
  std::string out;
  for (int m : group.members)
    if (slots_[static_cast<std::size_t>(m)].seq < seq) out += (out.empty() ? "" : ", ") + names_[static_cast<std::size_t>(m)];
  return out;
}

void ThreadHub::collective(int device, const Group& group, int rank, const CollectiveOp& op, DataPath path) {
  std::unique_lock lk(mu_);
  const std::uint64_t seq = post(device, group, op, path);
  await_group(device, group, seq, lk);
  const std::exception_ptr failure = move_data(device, group, rank, seq, lk);
  await_done(group, seq, lk);
  if (failure) std::rethrow_exception(failure);
}

std::uint64_t ThreadHub::post(int device, const Group& group, const CollectiveOp& op, DataPath path) {
  // Posted before anyone looks at the abort flag: a device arriving after a mismatch was found still sees
  // (and reports) the mismatch rather than a bare cancellation.
  Slot& me = slots_[static_cast<std::size_t>(device)];
  const std::uint64_t seq = me.seq + 1;
  me.posted = Posted{seq, op, &group, path};
  me.seq = seq;
  me.history[seq % kHistory] = me.posted;
  changed();
  return seq;
}

// A device leaving the rendezvous by an exception withdraws its post, so that no peer counts it as
// arrived. Completion is then monotonic: once a group is complete nobody withdraws, because a device only
// withdraws after seeing its group incomplete (all under mu_).
template <class E>
void ThreadHub::withdraw(int device, std::uint64_t seq, E error) {
  slots_[static_cast<std::size_t>(device)].seq = seq - 1;
  changed();
  throw error;
}

void ThreadHub::await_group(int device, const Group& group, std::uint64_t seq, std::unique_lock<std::mutex>& lk) {
  const CollectiveOp& op = slots_[static_cast<std::size_t>(device)].posted.op;
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    // Once the whole group has posted, every member must reach the same decision, or one could enter the
    // data phase and wait forever for a peer that left: then only a mismatch inside the group (which
    // every member sees identically) stops the collective; an abort or a divergence elsewhere in the
    // mesh is reported by the next collective or by pmap.
    const bool complete = all_arrived(group, seq);
    if (std::string div = find_divergence(device, group, seq, complete); !div.empty()) {
      if (!aborted_) {
        aborted_ = true;
        reason_ = div;
      }
      withdraw(device, seq, CollectiveMismatch(div));
    }
    if (complete) return;
    if (aborted_ && timed_out_)
      withdraw(device, seq, Timeout(std::string(op.name) + " over " + group.axes + ": " + reason_));
    if (aborted_)
      withdraw(device, seq, Aborted(std::string(op.name) + " over " + group.axes + " cancelled: " + reason_));
    // Past the deadline even when await() saw a change (a busy mesh can keep changing the hub's state).
    const bool expired =
        await(lk, deadline) == std::cv_status::timeout || std::chrono::steady_clock::now() >= deadline;
    if (!expired || all_arrived(group, seq)) continue;
    // A peer whose deadline passed at the same moment may have given up first (and withdrawn its post, so
    // it would look missing here): then report its cancellation, not a timeout of our own.
    if (aborted_) continue;
    // Missing peers that wait inside collectives of their own are not late: their deadlines (or their
    // exchange's with other processes) decide, and a failure reaches us through the abort. A device only
    // waits for devices with lower collective numbers, so these waits form no cycle.
    if (missing_wait_elsewhere(group, seq)) {
      deadline = std::chrono::steady_clock::now() + timeout_;
      continue;
    }
    std::string msg = describe(device) + " timed out after " + std::to_string(timeout_.count()) + " ms waiting for " +
                      missing(group, seq);
    aborted_ = true;
    timed_out_ = true;
    reason_ = msg;
    withdraw(device, seq, Timeout(msg));
  }
}

// Whatever happens here, the device marks itself done (and then waits for its peers before leaving or
// rethrowing: they may still read its send buffer or write its receive buffer). Host data movement cannot
// fail; device movement (CudaError) and the exchange between processes can: the failure is returned, and
// the rest of the call's collectives are cancelled.
std::exception_ptr ThreadHub::move_data(int device, const Group& group, int rank, std::uint64_t seq,
                                        std::unique_lock<std::mutex>& lk) {
  Slot& me = slots_[static_cast<std::size_t>(device)];
  std::exception_ptr failure;
  std::string failure_what;
  try {
    if (group.remote != nullptr) {
      exchange_remote(group, rank, seq, lk);
      lk.unlock();
      if (me.posted.path != DataPath::none)
        group.remote->finish(me.posted.op, rank, static_cast<int>(group.members.size()));
    } else {
      lk.unlock();
      execute(group, rank);
    }
  } catch (const std::exception& e) {
    failure = std::current_exception();
    failure_what = e.what();
  } catch (...) {
    failure = std::current_exception();
  }
  if (!lk.owns_lock()) lk.lock();
  me.done = seq;
  if (failure && !aborted_) {
    aborted_ = true;
    reason_ = describe(device) + " failed while moving its data" + (failure_what.empty() ? "" : ": " + failure_what);
  }
  changed();
  return failure;
}

void ThreadHub::await_done(const Group& group, std::uint64_t seq, std::unique_lock<std::mutex>& lk) {
  auto all_done = [&] {
    for (int m : group.members)
      if (slots_[static_cast<std::size_t>(m)].done < seq) return false;
    return true;
  };
  while (!all_done()) await(lk, std::chrono::steady_clock::time_point::max());
}

bool ThreadHub::is_aborted() const {
  std::lock_guard lk(mu_);
  return aborted_;
}

void ThreadHub::exchange_remote(const Group& group, int rank, std::uint64_t seq, std::unique_lock<std::mutex>& lk) {
  Slot& leader = slots_[static_cast<std::size_t>(group.members[0])];
  if (rank == 0) {
    // The members are blocked in this collective, so their ops stay put while we read them unlocked.
    std::vector<const CollectiveOp*> ops;
    for (int m : group.members) ops.push_back(&slots_[static_cast<std::size_t>(m)].posted.op);
    OpFailure failure;
    lk.unlock();
    try {
      group.remote->exchange(ops, leader.posted.path, seq, [this] { return is_aborted(); });
    } catch (const CollectiveMismatch& e) {
      failure = {FailureKind::mismatch, e.message()};
    } catch (const Timeout& e) {
      failure = {FailureKind::timeout, e.message()};
    } catch (const Aborted& e) {
      failure = {FailureKind::aborted, e.message()};
    } catch (const std::exception& e) {
      failure = {FailureKind::other, e.what()};
    }
    lk.lock();
    if (failure.kind == FailureKind::timeout) failure.message += local_suspects(seq);
    leader.exchanged = seq;
    leader.remote_failure = failure;
    if (failure.kind != FailureKind::none && !aborted_) {
      aborted_ = true;
      timed_out_ = failure.kind == FailureKind::timeout;
      reason_ = failure.message;
    }
    changed();
  } else {
    while (leader.exchanged < seq) await(lk, std::chrono::steady_clock::time_point::max());  // finite: the exchange has a deadline
  }
  const OpFailure& f = leader.remote_failure;
  switch (f.kind) {
    case FailureKind::none: return;
    case FailureKind::mismatch: throw CollectiveMismatch(f.message);
    case FailureKind::timeout: throw Timeout(f.message);
    case FailureKind::aborted: throw Aborted(f.message);
    case FailureKind::other: throw MpiError(f.message);
  }
}

std::string ThreadHub::abort_reason() const {
  std::lock_guard lk(mu_);
  return aborted_ ? reason_ : std::string();
}

bool ThreadHub::aborted_by_timeout() const {
  std::lock_guard lk(mu_);
  return aborted_ && timed_out_;
}

void ThreadHub::execute(const Group& group, int rank) const {
  const std::size_t n = group.members.size();
  const Slot& mine = slots_[static_cast<std::size_t>(group.members[static_cast<std::size_t>(rank)])];
  const CollectiveOp& op = mine.posted.op;
  if (mine.posted.path == DataPath::none) return;
  const std::size_t esize = size_of(op.dtype);
  std::vector<const void*> sends(n);
  std::vector<void*> recvs(n);
  for (std::size_t k = 0; k < n; ++k) {
    const Slot& s = slots_[static_cast<std::size_t>(group.members[k])];
    sends[k] = s.posted.op.send;
    recvs[k] = s.posted.op.recv;
  }
  if (mine.posted.path == DataPath::device) return device_execute(op, sends, recvs, rank);
  const auto r = static_cast<std::size_t>(rank);
  switch (op.kind) {
    case CollectiveKind::all_reduce: {
      std::size_t begin = op.count * r / n, end = op.count * (r + 1) / n;
      with_type(op.dtype, [&](auto t) {
        reduce_range<decltype(t)>(sends, recvs, begin, begin, end - begin, op.reduce);
      });
      break;
    }
    case CollectiveKind::reduce_scatter:
      with_type(op.dtype, [&](auto t) {
        reduce_range<decltype(t)>(sends, {op.recv}, r * op.count, 0, op.count, op.reduce);
      });
      break;
    case CollectiveKind::all_gather:
      for (std::size_t k = 0; k < n; ++k)
        copy_bytes(static_cast<char*>(recvs[k]) + r * op.count * esize, op.send, op.count * esize);
      break;
    case CollectiveKind::broadcast:
      if (op.recv != sends[static_cast<std::size_t>(op.root)])
        copy_bytes(op.recv, sends[static_cast<std::size_t>(op.root)], op.count * esize);
      break;
    case CollectiveKind::permute:
      if (op.recv_from >= 0) {
        copy_bytes(op.recv, sends[static_cast<std::size_t>(op.recv_from)], op.count * esize);
      } else {
        std::memset(op.recv, 0, op.count * esize);
      }
      break;
    case CollectiveKind::barrier:
      break;
  }
}

}  // namespace pmap::detail
