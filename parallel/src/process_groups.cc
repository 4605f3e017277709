#include "neuron/parallel/process_groups.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "neuron/c10d/backend_neuron.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {

// This rank's group of `axis`, on a store prefix of its own ("tensor/4": the
// tensor group whose lowest member is rank 4).
c10::intrusive_ptr<::c10d::ProcessGroup> GroupOf(const MeshLayout& layout, Axis axis, int rank,
                                                 const c10::intrusive_ptr<::c10d::Store>& store,
                                                 std::chrono::milliseconds timeout) {
  const std::vector<int> members = layout.Group(axis, rank);
  const std::string name = StrCat(Name(axis), "/", members.front());
  const int group_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  auto prefixed = c10::make_intrusive<::c10d::PrefixStore>(name, store);
  return c10d::MakeProcessGroup(
      prefixed, c10d::CreateBackendNeuron(
                    prefixed, group_rank, static_cast<int>(members.size()), timeout,
                    std::vector<std::int64_t>(members.begin(), members.end()), name));
}

}  // namespace

ParallelGroups InitializeParallel(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                  int world, MeshShape shape, std::chrono::milliseconds timeout) {
  ParallelGroups g{MeshLayout::Create(world, shape), rank, {}, {}, {}, {}};
  auto world_store = c10::make_intrusive<::c10d::PrefixStore>("world", store);
  g.world = c10d::MakeProcessGroup(
      world_store, c10d::CreateBackendNeuron(world_store, rank, world, timeout, {}, "world"));
  g.tensor = GroupOf(g.layout, Axis::kTensor, rank, store, timeout);
  g.data = GroupOf(g.layout, Axis::kData, rank, store, timeout);
  g.pipeline = GroupOf(g.layout, Axis::kPipeline, rank, store, timeout);
  return g;
}

}  // namespace neuron::parallel
