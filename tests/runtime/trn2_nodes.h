// A fabric model of `nodes` trn2 nodes with `world` / `nodes` ranks each
// (the embedded default topology), for tests that replay traces on it.
#pragma once

#include <cstdint>
#include <vector>

#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime::testing {

inline FabricModel Trn2Nodes(int world, int nodes = 1) {
  const auto topology = Topology::Default();
  return FabricModel(
      topology, PlaceRanks(topology, std::vector<std::uint32_t>(
                                         static_cast<std::size_t>(nodes),
                                         static_cast<std::uint32_t>(world / nodes))));
}

}  // namespace neuron::runtime::testing
