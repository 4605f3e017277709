// The two levels of a group that spans hosts with several ranks on some
// host: a communicator per host (shared memory) and one of the hosts'
// leaders (their lowest rank; TCP). The hierarchical collectives run over
// them (docs/collectives.md, "Algorithms"); the levels keep clocks of their
// own, so the parent accounts the whole operation.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "neuron/collectives/communicator.h"

namespace neuron::collectives::detail {

class Hierarchy {
 public:
  // Collective over `parent` (whose rank `rank` is on host hosts[rank]):
  // splits it into the levels, or returns null when no host has two ranks.
  // `level` are the options of the levels (their clock is replaced).
  static std::unique_ptr<Hierarchy> Build(Communicator& parent,
                                          const std::vector<std::string>& hosts,
                                          CommunicatorOptions level);

  // Two-level allreduce (as NCCL's and Neuron's across nodes): reduce within
  // each host to its leader, allreduce among the leaders, broadcast within
  // each host. The order is fixed, so every rank gets bitwise the same
  // result (it differs from the flat order for floating point). Averages
  // sum throughout and divide once by the group size.
  void AllReduce(void* data, std::size_t count, DataType dtype, ReduceOp op);
  // Within the root's host from the root, among the leaders from the root's
  // host's (once per host rather than once per rank), then within every
  // other host from its leader.
  void Broadcast(void* data, std::size_t count, DataType dtype, int root);
  // Within each host, the hosts' blocks among the leaders, the whole from
  // each leader within its host; then the blocks in rank order (hosts need
  // not hold consecutive ranks).
  void AllGather(char* out, const void* in, std::size_t count, DataType dtype);

  // Makes both levels' pending and future waits fail with `reason` (the
  // parent's Abort).
  void Abort(const std::string& reason);

 private:
  Hierarchy() = default;
  // Runs a collective's steps; when one fails (a rank aborted, lost or timed
  // out), aborts both levels with the error before rethrowing, so the ranks
  // waiting on this one in either level fail now, naming why, instead of at
  // their timeout.
  void Guarded(const std::function<void()>& step);

  int rank_ = 0;
  int size_ = 0;
  std::unique_ptr<Communicator> local_;       // this host's ranks
  std::unique_ptr<Communicator> leaders_;     // one per host; null on the other ranks
  std::vector<int> host_of_;                  // host index of every rank
  std::vector<std::vector<int>> host_ranks_;  // the ranks of every host, ascending
};

}  // namespace neuron::collectives::detail
