// The MPI side of meshes spanning processes: gathering small values from every process, checking that
// every process builds the same mesh, and one communicator (MPI_Comm_split) per spanning group.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include <pmap/error.h>

#include "mpi_exchange.h"
#include "mpi_runtime.h"
#include "processes.h"

namespace pmap::detail {
namespace {

std::string join_processes(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "process " : ", process ") + std::to_string(r);
  return s;
}

class MpiTransport final : public MeshTransport {
 public:
  MpiTransport(const std::vector<Device>& devices, const std::vector<AxisSpec>& axes, const MeshOptions& options)
      : devices_(devices), timeout_(process_timeout(options.process_timeout)) {
    if (!mpi::active())
      throw NotAvailable("Mesh: its devices belong to several processes, but MPI is not running: launch with "
                         "mpirun or srun and call pmap::distributed::initialize() first");
    for (const Device& d : devices_)
      if (d.process < 0 || d.process >= mpi::world_size())
        throw ValueError("Mesh: device " + d.str() + " belongs to process " + std::to_string(d.process) + " of " +
                         std::to_string(mpi::world_size()));
    check_same_mesh(axes);
  }

  ~MpiTransport() override {
    exchanges_.clear();
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized || mpi::failed()) return;  // after a failure requests may be pending: keep the comms
    auto lk = mpi::lock();
    for (auto& [members, comm] : comms_)
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }

  RemoteExchange* exchange_for(const std::vector<int>& members, const std::string& axes) override {
    std::vector<int> processes;
    for (int m : members) processes.push_back(devices_[static_cast<std::size_t>(m)].process);
    std::sort(processes.begin(), processes.end());
    processes.erase(std::unique(processes.begin(), processes.end()), processes.end());
    MPI_Comm comm = comm_for(members, processes);
    if (comm == MPI_COMM_NULL) return nullptr;
    // Communicator ranks follow world ranks (the split key), so rank q is processes[q].
    mpi::GroupLayout layout;
    layout.axes = axes;
    layout.size = static_cast<int>(members.size());
    layout.process_of = processes;
    layout.ranks_of.resize(processes.size());
    for (std::size_t r = 0; r < members.size(); ++r) {
      const Device& d = devices_[static_cast<std::size_t>(members[r])];
      const auto q = std::lower_bound(processes.begin(), processes.end(), d.process) - processes.begin();
      layout.ranks_of[static_cast<std::size_t>(q)].push_back(static_cast<int>(r));
      layout.names.push_back(d.str());
    }
    exchanges_.push_back(std::make_unique<mpi::MpiExchange>(comm, std::move(layout), timeout_, epoch_));
    return exchanges_.back().get();
  }

  void begin_call() override {
    if (mpi::failed())
      throw Aborted("pmap over a mesh spanning processes: an earlier failure left the processes out of step (" +
                    mpi::failure() + "); exit and restart the job");
    ++epoch_;
  }

  void report_failure(const std::string& what) noexcept override {
    mpi::broadcast_failure("process " + std::to_string(mpi::world_rank()) + " reported: " + what);
  }

 private:
  // Every process must be building this same mesh now.
  void check_same_mesh(const std::vector<AxisSpec>& axes) {
    std::vector<std::int64_t> sig{static_cast<std::int64_t>(devices_.size())};
    for (const auto& a : axes) {
      sig.push_back(a.size);
      for (char c : a.name) sig.push_back(c);
    }
    for (const Device& d : devices_) sig.insert(sig.end(), {static_cast<int>(d.kind), d.index, d.process});
    const auto all = gather_from_processes(sig, "Mesh construction");
    std::vector<int> differ;
    for (std::size_t p = 0; p < all.size(); ++p)
      if (all[p] != all[0]) differ.push_back(static_cast<int>(p));
    if (!differ.empty())
      throw ValueError("Mesh: every process must build the same mesh (devices and axes), but " +
                       join_processes(differ) + " built a different one than process 0");
  }

  // The communicator of the processes running `members` (MPI_COMM_NULL when this process is not one
  // of them). Groups with the same devices share one: their collectives can never overlap in time.
  MPI_Comm comm_for(const std::vector<int>& members, const std::vector<int>& processes) {
    std::vector<int> key = members;
    std::sort(key.begin(), key.end());
    if (auto it = comms_.find(key); it != comms_.end()) return it->second;
    const bool mine = std::binary_search(processes.begin(), processes.end(), mpi::world_rank());
    MPI_Comm comm = MPI_COMM_NULL;
    auto lk = mpi::lock();
    PMAPCC_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, mine ? 0 : MPI_UNDEFINED, mpi::world_rank(), &comm));
    if (comm != MPI_COMM_NULL) PMAPCC_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    comms_.emplace(key, comm);
    return comm;
  }

  std::vector<Device> devices_;
  std::chrono::milliseconds timeout_;
  std::uint64_t epoch_ = 0;
  std::map<std::vector<int>, MPI_Comm> comms_;
  std::vector<std::unique_ptr<mpi::MpiExchange>> exchanges_;
};

}  // namespace

std::vector<std::vector<std::int64_t>> gather_from_processes(const std::vector<std::int64_t>& values,
                                                             const std::string& what) {
  if (!mpi::active() || mpi::world_size() == 1) return {values};
  static std::mutex mu;  // one gather at a time; rounds on the control communicator must not interleave
  std::lock_guard lk(mu);
  static mpi::PeerRound* round = new mpi::PeerRound(mpi::control(), mpi::kGatherTag);  // lives to the end
  // Message: the length of `what`, `what`, then the values.
  auto& out = round->outgoing();
  out.resize((1 + values.size()) * sizeof(std::int64_t) + what.size());
  const auto len = static_cast<std::int64_t>(what.size());
  std::memcpy(out.data(), &len, sizeof len);
  std::memcpy(out.data() + sizeof len, what.data(), what.size());
  std::memcpy(out.data() + sizeof len + what.size(), values.data(), values.size() * sizeof(std::int64_t));
  const auto timeout = process_timeout({});
  switch (round->run(timeout, {})) {
    case mpi::PeerRound::Result::done: break;
    case mpi::PeerRound::Result::timeout: {
      const std::string msg = what + ": " + join_processes(round->missing()) + " did not arrive within " +
                              std::to_string(timeout.count()) + " ms";
      mpi::broadcast_failure("process " + std::to_string(mpi::world_rank()) + " reported: " + msg);
      throw Timeout(msg);
    }
    default: throw Aborted(what + " cancelled: " + mpi::failure());
  }
  std::vector<std::vector<std::int64_t>> all;
  for (int q = 0; q < round->size(); ++q) {
    const auto& msg = round->message(q);
    std::int64_t n = -1;
    if (msg.size() >= sizeof n) std::memcpy(&n, msg.data(), sizeof n);
    const auto* text = reinterpret_cast<const char*>(msg.data()) + sizeof n;
    const bool whole = n >= 0 && msg.size() >= sizeof n + static_cast<std::size_t>(n);
    const std::string theirs = whole ? std::string(text, static_cast<std::size_t>(n)) : std::string("?");
    if (theirs != what)
      throw CollectiveMismatch("processes called different setup steps: process " + std::to_string(mpi::world_rank()) +
                               " called " + what + ", but process " + std::to_string(q) + " called " + theirs);
    std::vector<std::int64_t> v((msg.size() - sizeof n - theirs.size()) / sizeof(std::int64_t));
    if (!v.empty()) std::memcpy(v.data(), msg.data() + sizeof n + theirs.size(), v.size() * sizeof(std::int64_t));
    all.push_back(std::move(v));
  }
  return all;
}

std::unique_ptr<MeshTransport> make_mesh_transport(const std::vector<Device>& devices,
                                                   const std::vector<AxisSpec>& axes, const MeshOptions& options) {
  return std::make_unique<MpiTransport>(devices, axes, options);
}

}  // namespace pmap::detail
