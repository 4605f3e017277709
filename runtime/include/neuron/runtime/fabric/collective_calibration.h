// A topology's calibrated collective costs (its collective_engine): what a
// collective pays beyond the wire, and which algorithm Neuron's runtime runs
// for a given size. Checked once, when a FabricModel is made; the figures
// and their sources are in docs/collectives.md ("Calibration").
//
// Usage:
//   CollectiveCalibration c(spec.collective_engine(), spec.name(), CoresPerRank(topology));
//   c.launch_us() + c.Costs("ring", CollectiveKind::kAllReduce).fixed_us
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "neuron/runtime/fabric/collective_names.h"
#include "neuron/runtime/topology.pb.h"

namespace neuron::runtime {

struct AlgorithmCosts {
  double fixed_us = 0;  // once per collective
  double step_us = 0;   // every step, on every chunk
};

class CollectiveCalibration {
 public:
  // InvalidUsage names `topology`, the field and the bad value: a negative
  // or non-finite cost or rate, an unknown kind or algorithm, an empty size
  // range, more channels than Neuron's 32.
  // `cores_per_rank`: the physical NeuronCores a rank holds.
  CollectiveCalibration(const proto::CollectiveEngineSpec& spec, const std::string& topology,
                        double cores_per_rank);

  double launch_us() const { return launch_us_; }
  // One rank's DMA rate for a collective's bytes; infinity when uncapped.
  double rank_dma_bytes_per_second() const { return rank_dma_bytes_per_second_; }
  // The costs of a schedule named `algorithm` ("ring", ...) running a
  // collective of `kind` (none: a gather or scatter); zeros if none.
  AlgorithmCosts Costs(const std::string& algorithm, std::optional<CollectiveKind> kind) const;
  // The algorithm_rules that hold for this collective, in the file's order.
  std::vector<FabricAlgorithm> RuledAlgorithms(CollectiveKind kind, double bytes,
                                               bool spans_nodes) const;
  int inter_node_ring_channels() const { return inter_node_ring_channels_; }

 private:
  struct Rule {
    std::optional<CollectiveKind> kind;  // none: every kind
    double min_bytes = 0;
    double max_bytes = 0;  // 0: unbounded
    proto::AlgorithmRule::Span span = proto::AlgorithmRule::ANY;
    FabricAlgorithm algorithm = FabricAlgorithm::kRing;
  };
  struct NamedCosts {
    std::string algorithm;
    std::optional<CollectiveKind> kind;  // none: every kind
    AlgorithmCosts costs;
  };
  double launch_us_ = 0;
  double rank_dma_bytes_per_second_ = 0;
  std::vector<NamedCosts> costs_;
  std::vector<Rule> rules_;
  int inter_node_ring_channels_ = 1;
};

}  // namespace neuron::runtime
