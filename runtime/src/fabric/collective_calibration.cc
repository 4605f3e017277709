#include "neuron/runtime/fabric/collective_calibration.h"

#include <cmath>
#include <limits>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {

constexpr int kMaxChannels = 32;  // nec.h: NEC_MAX_CHANNELS

void CheckCost(double value, const std::string& topology, const std::string& field) {
  NEURON_CHECK(std::isfinite(value) && value >= 0, "topology '", topology,
               "': collective_engine.", field, " must be a finite number >= 0, got ", value);
}

FabricAlgorithm ParseRunnable(const std::string& name, const std::string& topology,
                              const std::string& field) {
  const auto a = ParseFabricAlgorithm(name);
  NEURON_CHECK(a.has_value() && *a != FabricAlgorithm::kAuto, "topology '", topology,
               "': collective_engine.", field, " names algorithm '", name,
               "' (ring, mesh, rdh, recursive_doubling, hierarchical, tree)");
  return *a;
}

// Empty: none (every kind).
std::optional<CollectiveKind> ParseKind(const std::string& name, const std::string& topology,
                                        const std::string& field) {
  if (name.empty()) return std::nullopt;
  const auto kind = ParseCollectiveKind(name);
  NEURON_CHECK(kind.has_value(), "topology '", topology, "': collective_engine.", field,
               " names kind '", name, "' (allreduce, allgather, reducescatter, broadcast, "
               "reduce, alltoall, or empty for every kind)");
  return kind;
}

}  // namespace

CollectiveCalibration::CollectiveCalibration(const proto::CollectiveEngineSpec& spec,
                                             const std::string& topology, double cores_per_rank) {
  CheckCost(spec.launch_us(), topology, "launch_us");
  CheckCost(spec.core_dma_gbps(), topology, "core_dma_gbps");
  launch_us_ = spec.launch_us();
  rank_dma_bytes_per_second_ = spec.core_dma_gbps() > 0
                                   ? spec.core_dma_gbps() * 1e9 * cores_per_rank
                                   : std::numeric_limits<double>::infinity();
  for (int i = 0; i < spec.algorithm_costs_size(); ++i) {
    const auto& c = spec.algorithm_costs(i);
    const std::string field = "algorithm_costs[" + std::to_string(i) + "]";
    ParseRunnable(c.algorithm(), topology, field);
    CheckCost(c.fixed_us(), topology, field + ".fixed_us");
    CheckCost(c.step_us(), topology, field + ".step_us");
    const auto kind = ParseKind(c.kind(), topology, field);
    for (const auto& seen : costs_) {
      NEURON_CHECK(seen.algorithm != c.algorithm() || seen.kind != kind, "topology '", topology,
                   "': collective_engine.", field, " repeats algorithm '", c.algorithm(),
                   "' for ", c.kind().empty() ? "every kind" : c.kind());
    }
    costs_.push_back({c.algorithm(), kind, {c.fixed_us(), c.step_us()}});
  }
  for (int i = 0; i < spec.algorithm_rules_size(); ++i) {
    const auto& r = spec.algorithm_rules(i);
    const std::string field = "algorithm_rules[" + std::to_string(i) + "]";
    Rule rule;
    rule.kind = ParseKind(r.kind(), topology, field);
    NEURON_CHECK(r.max_bytes() == 0 || r.min_bytes() < r.max_bytes(), "topology '", topology,
                 "': collective_engine.", field, " holds for no size (min_bytes ",
                 r.min_bytes(), ", max_bytes ", r.max_bytes(), ")");
    rule.min_bytes = static_cast<double>(r.min_bytes());
    rule.max_bytes = static_cast<double>(r.max_bytes());
    rule.span = r.span();
    rule.algorithm = ParseRunnable(r.algorithm(), topology, field + ".algorithm");
    rules_.push_back(rule);
  }
  const auto channels = spec.inter_node_ring_channels();
  NEURON_CHECK(channels <= kMaxChannels, "topology '", topology,
               "': collective_engine.inter_node_ring_channels is ", channels,
               "; Neuron runs at most ", kMaxChannels);
  inter_node_ring_channels_ = channels == 0 ? 1 : static_cast<int>(channels);
}

AlgorithmCosts CollectiveCalibration::Costs(const std::string& algorithm,
                                            std::optional<CollectiveKind> kind) const {
  for (const auto& c : costs_) {
    if (c.algorithm == algorithm && (!c.kind || c.kind == kind)) return c.costs;
  }
  return {};
}

std::vector<FabricAlgorithm> CollectiveCalibration::RuledAlgorithms(CollectiveKind kind,
                                                                    double bytes,
                                                                    bool spans_nodes) const {
  std::vector<FabricAlgorithm> out;
  for (const Rule& r : rules_) {
    if (r.kind && r.kind != kind) continue;
    if (bytes < r.min_bytes || (r.max_bytes > 0 && bytes >= r.max_bytes)) continue;
    if (r.span == proto::AlgorithmRule::WITHIN_NODE && spans_nodes) continue;
    if (r.span == proto::AlgorithmRule::ACROSS_NODES && !spans_nodes) continue;
    out.push_back(r.algorithm);
  }
  return out;
}

}  // namespace neuron::runtime
