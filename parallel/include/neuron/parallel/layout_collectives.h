// The captured collectives of a predicted step priced on the target fabric
// (docs/scaling.md, "Predicting a full-size job"): each for the group of
// its axis as the job places it, ranks numbered as parallel::MeshLayout
// numbers them (rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank).
//
//   tp  ranks 0 .. tp-1: a tensor-parallel group is tp consecutive ranks;
//   ep  ranks 0, tp, 2 tp, ... (ep - 1) tp: expert parallelism is carved
//       out of data parallelism (Megatron-LM's and torchtitan's layout), ep
//       consecutive data-parallel ranks at one tensor position, so the
//       group sits inside one node when ep x tp ranks fit in one.
//
// Every group of an axis sits alike (the same ranks per node, the same
// links), so rank 0's prices them all.
//
// Usage:
//   LayoutCollectivePricer price(fabric, /*tp=*/8, /*ep=*/8);
//   double us = price("alltoall", 64e6, "ep");
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "neuron/runtime/fabric/fabric_model.h"

namespace neuron::parallel {

class LayoutCollectivePricer {
 public:
  // InvalidUsage when tp or ep is below 1 or tp x ep exceeds the fabric's ranks.
  LayoutCollectivePricer(const runtime::FabricModel& fabric, int tp, int ep);

  // Microseconds of one `kind` collective of `bytes` (collective_schedules.h's
  // count: an all-to-all's is what one rank sends) over `axis`'s group, 0
  // for a group of one rank; memoized. InvalidUsage for an axis other than
  // "tp" and "ep".
  double operator()(const std::string& kind, double bytes, const std::string& axis);

  const std::vector<int>& Group(const std::string& axis) const;

 private:
  const runtime::FabricModel& fabric_;
  std::vector<int> tp_group_, ep_group_;
  std::map<std::tuple<std::string, double, std::string>, double> cache_;
};

}  // namespace neuron::parallel
