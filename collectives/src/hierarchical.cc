#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hierarchy.h"
#include "neuron/collectives/reduce.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::collectives::detail {

std::unique_ptr<Hierarchy> Hierarchy::Build(Communicator& parent,
                                            const std::vector<std::string>& hosts,
                                            CommunicatorOptions level) {
  const int rank = parent.rank(), size = parent.size();
  std::vector<std::string> distinct;
  std::vector<int> host_of(size), count;
  for (int r = 0; r < size; ++r) {
    auto it = std::find(distinct.begin(), distinct.end(), hosts[r]);
    host_of[r] = static_cast<int>(it - distinct.begin());
    if (it == distinct.end()) {
      distinct.push_back(hosts[r]);
      count.push_back(0);
    }
    ++count[host_of[r]];
  }
  if (*std::max_element(count.begin(), count.end()) < 2) return nullptr;
  std::unique_ptr<Hierarchy> h(new Hierarchy());
  h->rank_ = rank;
  h->size_ = size;
  h->host_of_ = host_of;
  h->host_ranks_.assign(distinct.size(), {});
  for (int r = 0; r < size; ++r) h->host_ranks_[host_of[r]].push_back(r);
  const bool leader =
      std::find(host_of.begin(), host_of.end(), host_of[rank]) - host_of.begin() == rank;
  level.clock = std::make_shared<runtime::SimClock>();
  // Both splits run flat: the parent has no hierarchy while it is built.
  h->local_ = parent.Split(host_of[rank], rank, level);
  h->leaders_ = parent.Split(leader ? 0 : Communicator::kNoColor, host_of[rank], level);
  parent.ResetStats();  // the splits' own allgathers are not the caller's
  return h;
}

void Hierarchy::Abort(const std::string& reason) {
  local_->Abort(reason);
  if (leaders_ != nullptr) leaders_->Abort(reason);
}

void Hierarchy::Guarded(const std::function<void()>& step) {
  try {
    step();
  } catch (const std::exception& e) {
    Abort(StrCat("rank ", rank_, " failed in a hierarchical collective: ", e.what()));
    throw;
  }
}

void Hierarchy::AllReduce(void* data, std::size_t count, DataType dtype, ReduceOp op) {
  Guarded([&] {
    const ReduceOp stage = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    local_->Reduce({data, count, dtype, stage, 0});
    if (leaders_ != nullptr) {
      leaders_->AllReduce({data, count, dtype, stage});
      if (op == ReduceOp::kAvg)
        FinishAverage(dtype, data, count, static_cast<std::size_t>(size_));
    }
    local_->Broadcast({data, count, dtype, 0});
  });
}

void Hierarchy::Broadcast(void* data, std::size_t count, DataType dtype, int root) {
  Guarded([&] {
    const int root_host = host_of_[root], my_host = host_of_[rank_];
    const auto& local = host_ranks_[root_host];
    if (my_host == root_host) {
      const int local_root =
          static_cast<int>(std::find(local.begin(), local.end(), root) - local.begin());
      local_->Broadcast({data, count, dtype, local_root});
    }
    if (leaders_ != nullptr) leaders_->Broadcast({data, count, dtype, root_host});
    if (my_host != root_host) local_->Broadcast({data, count, dtype, 0});
  });
}

void Hierarchy::AllGather(char* out, const void* in, std::size_t count, DataType dtype) {
  Guarded([&] {
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
  });
}

}  // namespace neuron::collectives::detail
