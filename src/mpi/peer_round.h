// PeerRound: every process of a communicator sends one message (of any size) to every other and
// receives one from each, with non-blocking MPI polled against a deadline, so that a process that
// never comes is named instead of waited for forever. Used for gathers and for every collective.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

namespace pmap::detail::mpi {

class PeerRound {
 public:
  enum class Result { done, timeout, failed, cancelled };

  explicit PeerRound(MPI_Comm comm, int tag);
  ~PeerRound();  // a round left unfinished keeps its buffers alive (MPI may still use them)
  PeerRound(const PeerRound&) = delete;
  PeerRound& operator=(const PeerRound&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This process's message; fill it before run(). Kept between rounds, so steady rounds do not allocate.
  std::vector<std::byte>& outgoing() { return *outgoing_; }
  // Rank q's message after a successful run (q == rank(): outgoing()).
  const std::vector<std::byte>& message(int q) const;

  // Sends outgoing() to every other rank and receives every other rank's message. Returns done, or:
  // timeout once `timeout` has passed (missing() then names the ranks), failed when the job's failure
  // state is set (another process's notice), cancelled when cancelled() turns true. After anything
  // but done the round is abandoned and every later run() returns failed.
  Result run(std::chrono::milliseconds timeout, const std::function<bool()>& cancelled);
  // After a timeout: the ranks whose message never came, or if all came, those that never took ours.
  const std::vector<int>& missing() const { return missing_; }

 private:
  Result run_polling(std::chrono::milliseconds timeout, const std::function<bool()>& cancelled);
  bool poll(std::vector<char>& state);  // caller holds lock(); true when the round is complete

  MPI_Comm comm_;
  int tag_;
  int rank_ = 0;
  int size_ = 1;
  bool abandoned_ = false;
  std::vector<std::byte>* outgoing_;                  // owned; leaked if abandoned
  std::vector<std::vector<std::byte>>* incoming_;     // by rank; owned; leaked if abandoned
  std::vector<MPI_Request> sends_;
  std::vector<MPI_Request> recvs_;
  std::vector<int> missing_;
};

}  // namespace pmap::detail::mpi
