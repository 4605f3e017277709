// The hierarchical (two-level) collectives of a group that spans hosts:
// within each host over shared memory, among the hosts' leaders over TCP
// (docs/collectives.md, "Algorithms").
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "communicator_internal.h"
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/reduce.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::collectives {

// The two levels of a multi-host group: a communicator per host (shared
// memory) and one of the hosts' leaders (their lowest rank; TCP). Only
// worth it when some host has several ranks.
void Communicator::BuildHierarchy(const std::vector<std::string>& hosts) {
  std::vector<std::string> distinct;
  std::vector<int> host_of(size_), count;
  for (int r = 0; r < size_; ++r) {
    auto it = std::find(distinct.begin(), distinct.end(), hosts[r]);
    host_of[r] = static_cast<int>(it - distinct.begin());
    if (it == distinct.end()) {
      distinct.push_back(hosts[r]);
      count.push_back(0);
    }
    ++count[host_of[r]];
  }
  if (*std::max_element(count.begin(), count.end()) < 2) return;
  host_of_ = host_of;
  host_ranks_.assign(distinct.size(), {});
  for (int r = 0; r < size_; ++r) host_ranks_[host_of[r]].push_back(r);
  const bool leader = std::find(host_of.begin(), host_of.end(), host_of[rank_]) -
                          host_of.begin() == rank_;
  // The levels keep clocks of their own: the fabric model accounts the
  // whole operation on this communicator's clock.
  CommunicatorOptions level = options_;
  level.clock = std::make_shared<runtime::SimClock>();
  // Both splits run flat (their allgathers must not take the hierarchy
  // that is being built).
  auto local = Split(host_of[rank_], rank_, level);
  auto leaders = Split(leader ? 0 : kNoColor, host_of[rank_], level);
  local_ = std::move(local);
  leaders_ = std::move(leaders);
  ResetStats();  // the splits' own allgathers are not the caller's
}

// Hierarchical allreduce (two-level, as NCCL's and Neuron's across nodes):
// reduce within each host to its leader (shared memory, rank order), then
// allreduce among the leaders (TCP), then broadcast within each host. The
// order is fixed, so every rank gets bitwise the same result; it differs
// from the flat order for floating point. Averages sum throughout and
// divide once by the group size.
void Communicator::HierarchicalAllReduce(void* data, std::size_t count, DataType dtype,
                                         ReduceOp op) {
  const ReduceOp stage = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  local_->Reduce({data, count, dtype, stage, 0});
  if (leaders_ != nullptr) {
    leaders_->AllReduce({data, count, dtype, stage});
    if (op == ReduceOp::kAvg) FinishAverage(dtype, data, count, static_cast<std::size_t>(size_));
  }
  local_->Broadcast({data, count, dtype, 0});
}

// Hierarchical broadcast: within the root's host from the root (shared
// memory), among the hosts' leaders from the root's host's (TCP, once per
// host rather than once per rank), then within every other host from its
// leader.
void Communicator::HierarchicalBroadcast(void* data, std::size_t count, DataType dtype,
                                         int root) {
  const int root_host = host_of_[root], my_host = host_of_[rank_];
  const auto& local = host_ranks_[root_host];
  if (my_host == root_host) {
    const int local_root = static_cast<int>(std::find(local.begin(), local.end(), root) -
                                            local.begin());
    local_->Broadcast({data, count, dtype, local_root});
  }
  if (leaders_ != nullptr) leaders_->Broadcast({data, count, dtype, root_host});
  if (my_host != root_host) local_->Broadcast({data, count, dtype, 0});
}

// Hierarchical allgather: within each host (shared memory), then the hosts'
// blocks among the leaders (TCP), then the whole from each leader within its
// host; the blocks are put in rank order at the end (hosts need not hold
// consecutive ranks).
void Communicator::HierarchicalAllGather(char* out, const void* in, std::size_t count,
                                         DataType dtype) {
  const std::size_t block = count * ElementSize(dtype);
  const auto& mine = host_ranks_[host_of_[rank_]];
  std::vector<char> host(mine.size() * block), all(size_ * block);
  local_->AllGather({in, host.data(), count, dtype});
  if (leaders_ != nullptr) {
    std::vector<std::size_t> counts;
    for (const auto& ranks : host_ranks_) counts.push_back(ranks.size() * count);
    leaders_->AllGatherV({host.data(), all.data(), counts, dtype});
  }
  local_->Broadcast({all.data(), count * size_, dtype, 0});
  std::size_t offset = 0;
  for (const auto& ranks : host_ranks_) {
    for (int r : ranks) {
      std::memcpy(out + r * block, all.data() + offset, block);
      offset += block;
    }
  }
}

}  // namespace neuron::collectives
