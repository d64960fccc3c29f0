// MpiExchange: signature header + contributions to every process of the group, checked on arrival,
// then the deterministic data movement shared with the thread hub (reduce.h).
#include "mpi_exchange.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include <pmap/detail/hash.h>
#include <pmap/error.h>

#include "mpi_runtime.h"
#include "reduce.h"

namespace pmap::detail::mpi {
namespace {

// A process's signature of one collective; the first bytes of its message.
struct Header {
  std::uint64_t epoch = 0;  // pmap call on this mesh
  std::uint64_t seq = 0;    // collective number within the call (the same on every device: SPMD)
  std::uint64_t count = 0;
  std::uint64_t perm_id = 0;
  std::uint64_t axes_hash = 0;
  std::int32_t root = 0;
  std::uint8_t kind = 0, reduce = 0, dtype = 0;
  std::uint8_t check_only = 0;  // signatures only: NCCL moves the data
  std::uint8_t recorded = 0;    // recorded into a CUDA graph (CollectiveOp::recorded)
  char name[23] = {};  // for messages (truncated)
  char axes[40] = {};
};
static_assert(sizeof(Header) % 16 == 0, "contributions after the header stay aligned");

template <std::size_t N> void copy_text(char (&dst)[N], const std::string& src) {
  std::memcpy(dst, src.data(), std::min(N - 1, src.size()));
}

bool same(const Header& a, const Header& b) {
  return a.epoch == b.epoch && a.seq == b.seq && a.count == b.count && a.perm_id == b.perm_id &&
         a.axes_hash == b.axes_hash && a.root == b.root && a.kind == b.kind && a.reduce == b.reduce &&
         a.dtype == b.dtype && a.check_only == b.check_only && a.recorded == b.recorded &&
         std::strncmp(a.name, b.name, sizeof a.name) == 0;
}

std::string describe(const Header& h) {
  const auto kind = static_cast<CollectiveKind>(h.kind);
  const auto dtype = static_cast<DType>(h.dtype);
  std::string d = std::string(h.name) + "(" + std::string(name(dtype)) + "[" + std::to_string(h.count) + "]";
  if (kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter)
    d += std::string(", ") + reduce_name(static_cast<ReduceOp>(h.reduce));
  if (kind == CollectiveKind::broadcast) d += ", root " + std::to_string(h.root);
  return d + ") over " + h.axes + (h.recorded != 0 ? " (recording it into a CUDA graph)" : "") +
         " as collective #" + std::to_string(h.seq) + " of pmap call " + std::to_string(h.epoch);
}

// Elements group rank `rank` contributes to a collective of group size n.
std::size_t contribution(CollectiveKind kind, std::size_t count, int root, int rank, int n) {
  switch (kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::all_gather:
    case CollectiveKind::permute:
      return count;
    case CollectiveKind::reduce_scatter:
      return count * static_cast<std::size_t>(n);
    case CollectiveKind::broadcast:
      return rank == root ? count : 0;
    case CollectiveKind::barrier:
      return 0;
  }
  return 0;
}

Header read_header(const std::vector<std::byte>& msg) {
  if (msg.size() < sizeof(Header))
    throw MpiError("a collective message of " + std::to_string(msg.size()) + " bytes is too short");
  Header h;
  std::memcpy(&h, msg.data(), sizeof h);
  return h;
}

}  // namespace

MpiExchange::MpiExchange(MPI_Comm comm, GroupLayout layout, std::chrono::milliseconds timeout,
                         const std::uint64_t& epoch)
    : layout_(std::move(layout)), timeout_(timeout), epoch_(epoch), round_(comm, kCollectiveTag),
      sends_(static_cast<std::size_t>(layout_.size), nullptr) {}

std::string MpiExchange::process_str(int q) const {
  std::string s = "process " + std::to_string(layout_.process_of[static_cast<std::size_t>(q)]) + " (";
  const auto& ranks = layout_.ranks_of[static_cast<std::size_t>(q)];
  for (std::size_t k = 0; k < ranks.size(); ++k)
    s += (k ? ", " : "") + layout_.names[static_cast<std::size_t>(ranks[k])];
  return s + ")";
}

void MpiExchange::pack(const std::vector<const CollectiveOp*>& ops, std::uint64_t seq) {
  op_ = *ops[0];
  Header h;
  h.epoch = epoch_;
  h.seq = seq;
  h.count = op_.count;
  h.perm_id = op_.perm_id;
  h.axes_hash = detail::fnv1a(layout_.axes);
  h.root = op_.root;
  h.kind = static_cast<std::uint8_t>(op_.kind);
  h.reduce = static_cast<std::uint8_t>(op_.reduce);
  h.dtype = static_cast<std::uint8_t>(op_.dtype);
  h.check_only = check_only_ ? 1 : 0;
  h.recorded = op_.recorded ? 1 : 0;
  copy_text(h.name, op_.name);
  copy_text(h.axes, layout_.axes);
  const auto& mine = layout_.ranks_of[static_cast<std::size_t>(round_.rank())];
  const std::size_t esize = size_of(op_.dtype);
  std::size_t bytes = sizeof h;
  for (int r : mine) bytes += (check_only_ ? 0 : contribution(op_.kind, op_.count, op_.root, r, layout_.size)) * esize;
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw ShapeError(std::string(op_.name) + " over " + layout_.axes + ": " + std::to_string(bytes) +
                     " bytes from one process exceed what one MPI message carries (2 GiB)");
  auto& out = round_.outgoing();
  out.resize(bytes);
  std::memcpy(out.data(), &h, sizeof h);
  std::size_t at = sizeof h;
  local_recvs_.clear();
  for (std::size_t k = 0; k < mine.size(); ++k) {
    const std::size_t n =
        (check_only_ ? 0 : contribution(op_.kind, op_.count, op_.root, mine[k], layout_.size)) * esize;
    if (n > 0) std::memcpy(out.data() + at, ops[k]->send, n);
    at += n;
    local_recvs_.push_back(ops[k]->recv);
  }
}

void MpiExchange::check_signatures() const {
  const Header first = read_header(round_.message(0));
  for (int q = 1; q < round_.size(); ++q) {
    const Header h = read_header(round_.message(q));
    if (!same(first, h))
      throw CollectiveMismatch("processes called different collectives: " + process_str(0) + " called " +
                               describe(first) + ", but " + process_str(q) + " called " + describe(h));
  }
}

void MpiExchange::index_contributions() {
  const std::size_t esize = size_of(op_.dtype);
  for (int q = 0; q < round_.size(); ++q) {
    const auto& msg = round_.message(q);
    std::size_t at = sizeof(Header);
    for (int r : layout_.ranks_of[static_cast<std::size_t>(q)]) {
      const std::size_t n = (check_only_ ? 0 : contribution(op_.kind, op_.count, op_.root, r, layout_.size)) * esize;
      sends_[static_cast<std::size_t>(r)] = n > 0 ? msg.data() + at : nullptr;
      at += n;
    }
    if (at != msg.size())
      throw MpiError(process_str(q) + " sent " + std::to_string(msg.size()) + " bytes for " + std::string(op_.name) +
                     " over " + layout_.axes + ", expected " + std::to_string(at));
  }
}

void MpiExchange::exchange(const std::vector<const CollectiveOp*>& ops, DataPath path, std::uint64_t seq,
                           const std::function<bool()>& cancelled) {
  check_only_ = path == DataPath::none;
  pack(ops, seq);
  const std::string what = describe(read_header(round_.outgoing()));
  // The first collectives of a call give up a little sooner: collective k waits the timeout less
  // (4 - min(k - 1, 4)) steps of timeout / 40 (at most 50 ms). In a chain of waits across processes (a
  // device waits for a remote device that waits, in an earlier collective, for the faulty one) the head
  // of the chain then times out first, and its failure notice, which names the cause, reaches the others
  // before their own deadlines. No collective waits longer than the timeout.
  const auto step = std::min(timeout_ / 40, std::chrono::milliseconds(50));
  const auto timeout = timeout_ - step * static_cast<long>(4 - std::min<std::uint64_t>(seq - 1, 4));
  switch (round_.run(timeout, cancelled)) {
    case PeerRound::Result::done: break;
    case PeerRound::Result::failed: throw Aborted(what + " cancelled: " + failure());
    case PeerRound::Result::cancelled: throw Aborted(what + " cancelled: a device of this process failed");
    case PeerRound::Result::timeout: {
      std::string lost;
      for (int q : round_.missing()) lost += (lost.empty() ? "" : ", ") + process_str(q);
      throw Timeout(what + ": " + lost + " did not arrive within " + std::to_string(timeout.count()) +
                    " ms (lost, hung, or no longer calling collectives; if only slow, raise "
                    "MeshOptions::process_timeout or PMAPCC_MPI_TIMEOUT)");
    }
  }
  check_signatures();
  index_contributions();
}

void MpiExchange::finish(const CollectiveOp& op, int local_rank, int local_count) {
  const int rank = layout_.ranks_of[static_cast<std::size_t>(round_.rank())][static_cast<std::size_t>(local_rank)];
  const std::size_t esize = size_of(op.dtype);
  const std::size_t bytes = op.count * esize;
  switch (op.kind) {
    case CollectiveKind::all_reduce: {  // the local members share the elements; each writes all local results
      const auto lr = static_cast<std::size_t>(local_rank), lc = static_cast<std::size_t>(local_count);
      const std::size_t begin = op.count * lr / lc, end = op.count * (lr + 1) / lc;
      with_type(op.dtype, [&](auto t) {
        reduce_range<decltype(t)>(sends_, local_recvs_, begin, begin, end - begin, op.reduce);
      });
      break;
    }
    case CollectiveKind::reduce_scatter:
      with_type(op.dtype, [&](auto t) {
        reduce_range<decltype(t)>(sends_, {op.recv}, static_cast<std::size_t>(rank) * op.count, 0, op.count, op.reduce);
      });
      break;
    case CollectiveKind::all_gather:
      for (std::size_t k = 0; k < sends_.size() && bytes > 0; ++k)
        std::memcpy(static_cast<char*>(op.recv) + k * bytes, sends_[k], bytes);
      break;
    case CollectiveKind::broadcast:
      if (bytes > 0) std::memcpy(op.recv, sends_[static_cast<std::size_t>(op.root)], bytes);
      break;
    case CollectiveKind::permute:
      if (bytes == 0) break;
      if (op.recv_from >= 0) std::memcpy(op.recv, sends_[static_cast<std::size_t>(op.recv_from)], bytes);
      else std::memset(op.recv, 0, bytes);
      break;
    case CollectiveKind::barrier:
      break;
  }
}

}  // namespace pmap::detail::mpi
