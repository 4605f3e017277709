#include "neuron/runtime/fabric/collective_calibration.h"

#include <cmath>
#include <limits>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/reduction_rate.h"

namespace neuron::runtime {

namespace {

constexpr int kMaxChannels = 32;  // nec.h: NEC_MAX_CHANNELS

// Error messages name the topology's file and the field's path.
class FieldErrors {
 public:
  explicit FieldErrors(const Topology& topology) : origin_(topology.origin()) {}

  void CheckCost(double value, const std::string& field) const {
    NEURON_CHECK(std::isfinite(value) && value >= 0, Where(field),
                 " must be a finite number >= 0, got ", value);
  }

  FabricAlgorithm Algorithm(const std::string& name, const std::string& field) const {
    const auto a = ParseFabricAlgorithm(name);
    NEURON_CHECK(a.has_value() && *a != FabricAlgorithm::kAuto, Where(field),
                 " names algorithm '", name, "' (", FabricAlgorithmNames(), ")");
    return *a;
  }

  // Empty: none (every kind).
  std::optional<CollectiveKind> Kind(const std::string& name, const std::string& field) const {
    if (name.empty()) return std::nullopt;
    const auto kind = ParseCollectiveKind(name);
    NEURON_CHECK(kind.has_value(), Where(field), " names kind '", name, "' (",
                 CollectiveKindNames(), ", or empty for every kind)");
    return kind;
  }

  std::string Where(const std::string& field) const {
    return "topology " + origin_ + ": collective_engine.calibration." + field;
  }

 private:
  std::string origin_;
};

}  // namespace

CollectiveCalibration::CollectiveCalibration(const Topology& topology) {
  const auto& spec = topology.spec().collective_engine().calibration();
  const FieldErrors errors(topology);
  errors.CheckCost(spec.launch_us(), "launch_us");
  errors.CheckCost(spec.core_dma_gbps(), "core_dma_gbps");
  launch_us_ = spec.launch_us();
  rank_dma_bytes_per_second_ = spec.core_dma_gbps() > 0
                                   ? spec.core_dma_gbps() * 1e9 * CoresPerRank(topology)
                                   : std::numeric_limits<double>::infinity();
  for (int i = 0; i < spec.algorithm_costs_size(); ++i) {
    const auto& c = spec.algorithm_costs(i);
    const std::string field = "algorithm_costs[" + std::to_string(i) + "]";
    errors.Algorithm(c.algorithm(), field + ".algorithm");
    const auto kind = errors.Kind(c.kind(), field + ".kind");
    errors.CheckCost(c.fixed_us(), field + ".fixed_us");
    errors.CheckCost(c.step_us(), field + ".step_us");
    for (std::size_t j = 0; j < costs_.size(); ++j) {
      NEURON_CHECK(costs_[j].algorithm != c.algorithm() || costs_[j].kind != kind,
                   errors.Where(field), " repeats algorithm_costs[", j, "] (", c.algorithm(),
                   ", ", c.kind().empty() ? "every kind" : c.kind(), ")");
    }
    costs_.push_back({c.algorithm(), kind, {c.fixed_us(), c.step_us()}});
  }
  for (int i = 0; i < spec.algorithm_rules_size(); ++i) {
    const auto& r = spec.algorithm_rules(i);
    const std::string field = "algorithm_rules[" + std::to_string(i) + "]";
    NEURON_CHECK(r.max_bytes() == 0 || r.min_bytes() < r.max_bytes(), errors.Where(field),
                 " holds for no size (min_bytes ", r.min_bytes(), ", max_bytes ", r.max_bytes(),
                 ")");
    Rule rule;
    rule.kind = errors.Kind(r.kind(), field + ".kind");
    rule.min_bytes = static_cast<double>(r.min_bytes());
    rule.max_bytes = static_cast<double>(r.max_bytes());
    rule.span = r.span();
    rule.algorithm = errors.Algorithm(r.algorithm(), field + ".algorithm");
    rules_.push_back(rule);
  }
  const auto channels = spec.inter_node_ring_channels();
  NEURON_CHECK(channels <= kMaxChannels, errors.Where("inter_node_ring_channels"), " is ",
               channels, "; Neuron runs at most ", kMaxChannels);
  inter_node_ring_channels_ = channels == 0 ? 1 : static_cast<int>(channels);
}

AlgorithmCosts CollectiveCalibration::Costs(const std::string& algorithm,
                                            CollectiveKind kind) const {
  const NamedCosts* every_kind = nullptr;
  for (const auto& c : costs_) {
    if (c.algorithm != algorithm) continue;
    if (c.kind == kind) return c.costs;
    if (!c.kind) every_kind = &c;
  }
  return every_kind ? every_kind->costs : AlgorithmCosts{};
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

void CheckCollectiveCalibration(const Topology& topology) {
  const CollectiveCalibration checked(topology);
  (void)checked;
}

}  // namespace neuron::runtime
