#include "neuron/runtime/fabric/hierarchy_levels.h"

#include <algorithm>
#include <map>
#include <set>

#include "neuron/runtime/fabric/collective_schedules.h"

namespace neuron::runtime {

namespace {

// The dimensions a node's chips are numbered in: the torus's, or one of
// chips_per_node behind a switch.
std::vector<int> ChipDims(const proto::TopologySpec& spec) {
  if (spec.intra_node() == proto::TopologySpec::SWITCH) {
    return {static_cast<int>(spec.chips_per_node())};
  }
  return std::vector<int>(spec.torus_dims().begin(), spec.torus_dims().end());
}

// A rank's coordinates, innermost first: core, torus dims (last first) or
// the chip behind the switch, node.
std::vector<int> CoordinatesOf(const FabricModel& model, int rank) {
  const std::vector<int> dims = ChipDims(model.topology().spec());
  const ChipPlacement& p = model.placement()[static_cast<std::size_t>(rank)];
  const auto torus = TorusCoordinates(static_cast<int>(p.chip) % model.graph().chips_per_node(),
                                      dims);
  std::vector<int> coords{static_cast<int>(p.core)};
  coords.insert(coords.end(), torus.rbegin(), torus.rend());
  coords.push_back(static_cast<int>(p.node));
  return coords;
}

std::string CoordinateName(std::size_t index, std::size_t torus_dims, bool switched) {
  if (index == 0) return "on-chip";
  if (switched && index == 1) return "switch";
  if (index <= torus_dims) return "torus dim " + std::to_string(torus_dims - index);
  return "nodes";
}

std::optional<std::vector<HierarchyLevel>> GridLevels(const FabricModel& model,
                                                      const std::vector<int>& ranks) {
  std::vector<std::vector<int>> coords;
  for (int r : ranks) coords.push_back(CoordinatesOf(model, r));
  const std::size_t width = coords[0].size();
  std::vector<std::size_t> varying;  // coordinate indices with more than one value
  std::size_t cells = 1;
  for (std::size_t i = 0; i < width; ++i) {
    std::set<int> values;
    for (const auto& c : coords) values.insert(c[i]);
    if (values.size() > 1) {
      varying.push_back(i);
      cells *= values.size();
    }
  }
  if (cells != ranks.size()) return std::nullopt;
  if (std::set<std::vector<int>>(coords.begin(), coords.end()).size() != ranks.size()) {
    return std::nullopt;
  }
  std::vector<HierarchyLevel> levels;
  const std::size_t torus_dims = width - 2;
  const bool switched =
      model.topology().spec().intra_node() == proto::TopologySpec::SWITCH;
  for (std::size_t level : varying) {
    // Ranks agreeing on every other coordinate form one group, ordered
    // along this one.
    std::map<std::vector<int>, std::vector<std::pair<int, int>>> groups;
    for (std::size_t j = 0; j < ranks.size(); ++j) {
      auto key = coords[j];
      key[level] = 0;
      groups[key].push_back({coords[j][level], ranks[j]});
    }
    HierarchyLevel out{CoordinateName(level, torus_dims, switched), {}};
    for (auto& [key, members] : groups) {
      std::sort(members.begin(), members.end());
      std::vector<int> group;
      for (const auto& m : members) group.push_back(m.second);
      out.groups.push_back(std::move(group));
    }
    levels.push_back(std::move(out));
  }
  return levels;
}

std::optional<std::vector<HierarchyLevel>> NodeLevels(const FabricModel& model,
                                                      const std::vector<int>& ranks) {
  std::map<std::uint32_t, std::vector<int>> by_node;
  for (int r : RingOrder(model, ranks)) by_node[model.placement()[r].node].push_back(r);
  const std::size_t local = by_node.begin()->second.size();
  HierarchyLevel inner{"node", {}};
  for (auto& [node, group] : by_node) {
    if (group.size() != local) return std::nullopt;
    inner.groups.push_back(std::move(group));
  }
  HierarchyLevel across{"nodes", std::vector<std::vector<int>>(local)};
  for (std::size_t j = 0; j < local; ++j) {
    for (const auto& g : inner.groups) across.groups[j].push_back(g[j]);
  }
  std::vector<HierarchyLevel> levels;
  if (local > 1) levels.push_back(std::move(inner));
  if (by_node.size() > 1) levels.push_back(std::move(across));
  return levels;
}

}  // namespace

std::optional<std::vector<HierarchyLevel>> HierarchyLevels(const FabricModel& model,
                                                           const std::vector<int>& ranks) {
  if (ranks.size() < 2) return std::vector<HierarchyLevel>{};
  if (auto grid = GridLevels(model, ranks)) return grid;
  return NodeLevels(model, ranks);
}

}  // namespace neuron::runtime
