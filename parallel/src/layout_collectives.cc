#include "neuron/parallel/layout_collectives.h"

#include <tuple>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_cost.h"

namespace neuron::parallel {

LayoutCollectivePricer::LayoutCollectivePricer(const runtime::FabricModel& fabric, int tp,
                                               int ep)
    : fabric_(fabric) {
  NEURON_CHECK(tp >= 1 && ep >= 1 && static_cast<long long>(tp) * ep <= fabric.world_size(),
               "collective groups: tp ", tp, " x ep ", ep, " on a fabric of ",
               fabric.world_size(), " ranks");
  for (int t = 0; t < tp; ++t) tp_group_.push_back(t);
  for (int e = 0; e < ep; ++e) ep_group_.push_back(e * tp);
}

const std::vector<int>& LayoutCollectivePricer::Group(const std::string& axis) const {
  NEURON_CHECK(axis == "tp" || axis == "ep", "a captured collective on axis '", axis,
               "' (tp or ep)");
  return axis == "tp" ? tp_group_ : ep_group_;
}

double LayoutCollectivePricer::operator()(const std::string& kind, double bytes,
                                          const std::string& axis) {
  const std::vector<int>& group = Group(axis);
  if (group.size() == 1) return 0;
  const auto key = std::make_tuple(kind, bytes, axis);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    const double us = runtime::ModelCollective(fabric_, kind, bytes, group, 0,
                                               runtime::ConfiguredFabricAlgorithm())
                          .micros;
    it = cache_.emplace(key, us).first;
  }
  return it->second;
}

}  // namespace neuron::parallel
