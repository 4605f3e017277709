// The tuner: which host algorithm a collective runs. It decides from the
// group's shape and the call's size alone, so every rank of a group
// chooses the same (the handshake checks the allreduce's choice).
//
//   allreduce  the call's algorithm, else NEURON_CC_ALGO, else:
//              hierarchical across hosts; direct on shared memory;
//              over TCP recursive doubling up to small_message_bytes (or
//              fewer elements than ranks), ring above.
//   allgather  the call's algorithm, else hierarchical across hosts,
//              else Bruck up to 4 KiB a block, ring above.
// An algorithm the group cannot run, or that does not implement the
// collective, is InvalidUsage naming both.
#pragma once

#include <cstddef>
#include <string>

namespace neuron::collectives {

// The host algorithms (collectives/src/algorithms.h).
enum class Algorithm {
  kAuto, kRing, kRecursiveDoubling, kBinomialTree, kDirect, kRabenseifner, kBruck,
  kHierarchical,  // allreduce across hosts: within each host, across, back
};

const char* Name(Algorithm algorithm);
// "auto", "ring", "recursive_doubling", "binomial_tree", "direct",
// "rabenseifner", "bruck", "hierarchical"; InvalidUsage otherwise.
Algorithm ParseAlgorithm(const std::string& name);

struct GroupShape {
  int size = 1;
  bool windows = false;       // the transport offers shared windows
  bool hierarchical = false;  // the group spans hosts, several ranks on some
};

class Tuner {
 public:
  // Reads NEURON_CC_ALGO (InvalidUsage for an unknown name).
  explicit Tuner(std::size_t small_message_bytes);

  Algorithm AllReduce(Algorithm requested, std::size_t bytes, std::size_t count,
                      const GroupShape& group) const;
  Algorithm AllGather(Algorithm requested, std::size_t block,
                      const GroupShape& group) const;
  // The size up to which a direct allreduce reduces the whole buffer on
  // every rank in one phase (CommunicatorOptions::small_message_bytes).
  std::size_t small_message_bytes() const { return small_message_bytes_; }

 private:
  Algorithm forced_;
  std::size_t small_message_bytes_;
};

}  // namespace neuron::collectives
