// PeerRound: all-to-all exchange of one message per process with MPI_Isend / MPI_Improbe /
// MPI_Imrecv, polled under the process's MPI lock with a deadline and the job's failure state.
#include "peer_round.h"

#include <thread>

#include "mpi_runtime.h"

namespace pmap::detail::mpi {
namespace {

enum : char { kWaiting = 0, kReceiving = 1, kDone = 2 };

}  // namespace

PeerRound::PeerRound(MPI_Comm comm, int tag)
    : comm_(comm),
      tag_(tag),
      outgoing_(new std::vector<std::byte>),
      incoming_(new std::vector<std::vector<std::byte>>) {
  auto lk = lock();
  PMAPCC_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  PMAPCC_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  incoming_->resize(static_cast<std::size_t>(size_));
  sends_.reserve(static_cast<std::size_t>(size_));
  recvs_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
}

PeerRound::~PeerRound() {
  if (abandoned_) return;  // requests may be pending on these buffers: leak them on purpose
  delete outgoing_;
  delete incoming_;
}

const std::vector<std::byte>& PeerRound::message(int q) const {
  return q == rank_ ? *outgoing_ : (*incoming_)[static_cast<std::size_t>(q)];
}

bool PeerRound::poll(std::vector<char>& state) {
  poll_notices_locked();
  bool complete = true;
  for (int q = 0; q < size_; ++q) {
    auto& st = state[static_cast<std::size_t>(q)];
    if (st == kWaiting) {
      int found = 0;
      MPI_Message msg;
      MPI_Status status;
      PMAPCC_MPI_CHECK(MPI_Improbe(q, tag_, comm_, &found, &msg, &status));
      if (found) {
        int bytes = 0;
        PMAPCC_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &bytes));
        auto& buf = (*incoming_)[static_cast<std::size_t>(q)];
        buf.resize(static_cast<std::size_t>(bytes));
        if (buf.capacity() == 0) buf.reserve(1);  // a valid address even for an empty message
        PMAPCC_MPI_CHECK(MPI_Imrecv(buf.data(), bytes, MPI_BYTE, &msg, &recvs_[static_cast<std::size_t>(q)]));
        st = kReceiving;
      }
    }
    if (st == kReceiving) {
      int done = 0;
      PMAPCC_MPI_CHECK(MPI_Test(&recvs_[static_cast<std::size_t>(q)], &done, MPI_STATUS_IGNORE));
      if (done) st = kDone;
    }
    complete = complete && st == kDone;
  }
  int sent = 0;
  PMAPCC_MPI_CHECK(MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &sent, MPI_STATUSES_IGNORE));
  return complete && sent;
}

PeerRound::Result PeerRound::run(std::chrono::milliseconds timeout, const std::function<bool()>& cancelled) {
  // A notice that came before this round began means the job failed first: take no part. (A process late
  // past a peer's deadline would otherwise complete the round, the peer's message having come before it
  // gave up.) Every notice already here must be seen, not only what one turn of MPI's progress takes in
  // (drain_notices_locked). A failure noticed once the round is complete is left to the next one: the messages of a
  // round every process completed may be followed by a notice of a later failure.
  {
    auto lk = lock();
    drain_notices_locked();
  }
  if (abandoned_ || failed()) return Result::failed;
  try {
    return run_polling(timeout, cancelled);
  } catch (...) {  // an MPI error: requests may be pending
    abandoned_ = true;
    throw;
  }
}

PeerRound::Result PeerRound::run_polling(std::chrono::milliseconds timeout, const std::function<bool()>& cancelled) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<char> state(static_cast<std::size_t>(size_), kWaiting);
  state[static_cast<std::size_t>(rank_)] = kDone;
  missing_.clear();
  {
    auto lk = lock();
    sends_.clear();
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      sends_.push_back(MPI_REQUEST_NULL);
      PMAPCC_MPI_CHECK(MPI_Isend(outgoing_->data(), static_cast<int>(outgoing_->size()), MPI_BYTE, q, tag_, comm_,
                                 &sends_.back()));
    }
  }
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
  for (;;) {
    {
      auto lk = lock();
      if (poll(state)) return Result::done;
    }
    Result stop = Result::done;
    if (failed()) stop = Result::failed;
    else if (cancelled && cancelled()) stop = Result::cancelled;
    else if (std::chrono::steady_clock::now() > deadline) stop = Result::timeout;
    if (stop != Result::done) {
      abandoned_ = true;
      for (int q = 0; q < size_; ++q)
        if (state[static_cast<std::size_t>(q)] != kDone) missing_.push_back(q);
      if (missing_.empty()) {  // everyone's message came; ours was not taken by all
        auto lk = lock();
        for (std::size_t k = 0; k < sends_.size(); ++k) {
          const int q = static_cast<int>(k) < rank_ ? static_cast<int>(k) : static_cast<int>(k) + 1;
          int done = 0;
          if (MPI_Test(&sends_[k], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) missing_.push_back(q);
        }
      }
      return stop;
    }
    // Yield for the first milliseconds (latency, and large messages move only while MPI is polled),
    // then sleep between polls so that a long wait does not burn a core.
    if (std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace pmap::detail::mpi
