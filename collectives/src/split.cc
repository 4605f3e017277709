// Communicator::Split: new communicators from (color, key), as MPI_Comm_split.
#include <algorithm>
#include <tuple>

#include "communicator_internal.h"
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/store/prefix_store.h"
#include "neuron/runtime/error.h"
#include "op_accounting.h"

namespace neuron::collectives {

std::unique_ptr<Communicator> Communicator::Split(int color, int key,
                                                  CommunicatorOptions options) {
  NEURON_CHECK(color >= 0 || color == kNoColor, "split: color must be >= 0 or kNoColor (-1), got ",
               color);
  const std::uint64_t split_sequence = sequence();  // the same on every rank
  std::vector<std::int64_t> mine = {color, key}, all(2 * size_);
  AllGather({mine.data(), all.data(), 2, DataType::kInt64});
  if (color == kNoColor) return nullptr;
  // Members of my color, ordered by (key, old rank).
  std::vector<std::tuple<std::int64_t, int>> members;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  int new_rank = -1;
  std::vector<int> global;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const int old = std::get<1>(members[i]);
    if (old == rank_) new_rank = static_cast<int>(i);
    global.push_back(accounting_->global_ranks()[old]);
  }
  if (!options.clock) options.clock = accounting_->clock();
  options.fabric = accounting_->fabric();
  options.global_ranks = std::move(global);
  if (options.transport_secret.empty()) options.transport_secret = transport_secret_;
  auto store = std::make_shared<PrefixStore>(
      StrCat("split/", split_sequence, "/", color), store_);
  return std::make_unique<Communicator>(store, new_rank, static_cast<int>(members.size()),
                                        std::move(options));
}

}  // namespace neuron::collectives
