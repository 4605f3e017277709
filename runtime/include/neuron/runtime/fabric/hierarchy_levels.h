// The levels of the fabric a group of ranks spans, innermost first: the
// ranks sharing a chip, each dimension of the node's torus (last first;
// behind a NeuronSwitch the node's chips as one level, "switch"), and the
// nodes. The hierarchical algorithm runs one ring stage per level, so a
// 4x4 torus inside a node and EFA across gives rings of 4, 4 and the nodes
// rather than a ring of 16 and one of the nodes.
//
// Usage:
//   auto levels = HierarchyLevels(model, AllRanks(32));  // trn2-node x 2
//   levels->size() == 3  // "torus dim 1", "torus dim 0", "nodes"
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "neuron/runtime/fabric/fabric_model.h"

namespace neuron::runtime {

struct HierarchyLevel {
  std::string name;  // "on-chip", "torus dim 1" (or "switch"), "nodes", "node"
  std::vector<std::vector<int>> groups;  // ranks along this level, in ring order
};

// Levels with more than one position among `ranks`. When the ranks fill a
// grid of those coordinates (every combination present once), one level
// per coordinate; otherwise, with the same number of ranks on every node,
// each node's ranks in ring order ("node", when a node holds more than one)
// and then the nodes ("nodes", when there are several). None when neither
// holds (unequal ranks per node).
std::optional<std::vector<HierarchyLevel>> HierarchyLevels(const FabricModel& model,
                                                           const std::vector<int>& ranks);

}  // namespace neuron::runtime
