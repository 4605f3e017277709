#include "neuron/runtime/fabric/fabric_model.h"

#include <algorithm>
#include <limits>
#include <map>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {

int CountNodes(const std::vector<ChipPlacement>& placement) {
  std::uint32_t max_node = 0;
  for (const auto& p : placement) max_node = std::max(max_node, p.node);
  return static_cast<int>(max_node) + 1;
}

}  // namespace

std::vector<ChipPlacement> PlaceRanks(const Topology& topology,
                                      const std::vector<std::uint32_t>& ranks_per_node) {
  topology.CheckFits(static_cast<std::uint32_t>(ranks_per_node.size()), ranks_per_node);
  std::vector<ChipPlacement> placement;
  for (std::uint32_t node = 0; node < ranks_per_node.size(); ++node) {
    for (std::uint32_t local = 0; local < ranks_per_node[node]; ++local) {
      placement.push_back(topology.Place(node, local));
    }
  }
  return placement;
}

FabricModel::FabricModel(const Topology& topology, std::vector<ChipPlacement> placement)
    : topology_(topology),
      placement_(std::move(placement)),
      num_nodes_(CountNodes(placement_)),
      graph_(topology_, static_cast<std::uint32_t>(num_nodes_)) {
  NEURON_CHECK(!placement_.empty(), "fabric model of an empty job");
}

SimulationResult FabricModel::Simulate(const Schedule& schedule) const {
  SimulationResult result;
  for (const Step& step : schedule.steps) {
    const SimDuration t = StepTime(step, &result.link_bytes);
    result.steps.push_back(t);
    result.total += t;
  }
  return result;
}

SimDuration FabricModel::StepTime(const Step& step, double* link_bytes) const {
  const int n = world_size();
  // Sharers per link, and per chip for on-chip copies.
  std::vector<int> sharers(graph_.links().size(), 0);
  std::map<std::uint32_t, int> on_chip_sharers;
  for (const Transfer& t : step.transfers) {
    NEURON_ASSERT(t.src >= 0 && t.src < n && t.dst >= 0 && t.dst < n,
                  "transfer between ranks ", t.src, " and ", t.dst, " of ", n);
    const auto a = placement_[t.src].chip, b = placement_[t.dst].chip;
    if (a == b) {
      ++on_chip_sharers[a];
      continue;
    }
    graph_.ForEachLink(static_cast<int>(a), static_cast<int>(b), [&](int id) { ++sharers[id]; });
  }
  const auto& on_chip = topology_.spec().on_chip_link();
  SimDuration slowest{0};
  std::vector<int> route;  // reused: one allocation per step at most
  for (const Transfer& t : step.transfers) {
    const auto a = placement_[t.src].chip, b = placement_[t.dst].chip;
    SimDuration latency{0};
    double rate = 0;
    if (a == b) {
      latency = SimDuration(on_chip.latency_us());
      rate = on_chip.bandwidth_gbps() * 1e9 / on_chip_sharers[a];
    } else {
      route.clear();
      graph_.ForEachLink(static_cast<int>(a), static_cast<int>(b),
                         [&](int id) { route.push_back(id); });
      rate = std::numeric_limits<double>::infinity();
      for (auto id = route.rbegin(); id != route.rend(); ++id) {  // first hop first
        const Link& link = graph_.link(*id);
        latency += link.latency;
        rate = std::min(rate, link.bytes_per_second / sharers[*id]);
      }
      *link_bytes += t.bytes * static_cast<double>(route.size());
    }
    const SimDuration time = latency + (t.bytes > 0 ? SimSeconds(t.bytes / rate) : SimDuration(0));
    slowest = std::max(slowest, time);
  }
  return slowest;
}

}  // namespace neuron::runtime
