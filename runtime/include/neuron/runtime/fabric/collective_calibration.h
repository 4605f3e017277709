// A topology's calibrated collective costs (collective_engine.calibration):
// what a collective pays beyond the wire, and which algorithm Neuron's
// runtime runs for a given kind, size and span. Checked once, when a
// FabricModel is made (or by CheckCollectiveCalibration); the figures and
// their sources are in docs/collectives.md ("Calibration against Neuron's
// measurements").
//
// Usage:
//   CollectiveCalibration c(topology);
//   c.launch_us() + c.Costs("mesh", CollectiveKind::kAllReduce).fixed_us
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "neuron/runtime/fabric/collective_names.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime {

struct AlgorithmCosts {
  double fixed_us = 0;  // once per collective
  double step_us = 0;   // every step (mesh: every step and peer)
};

class CollectiveCalibration {
 public:
  // InvalidUsage names the topology's origin (its file), the field and the
  // bad value: a negative or non-finite cost or rate, an unknown kind or
  // algorithm, an entry repeated for the same algorithm and kind, an empty
  // size range, more channels than Neuron's 32.
  explicit CollectiveCalibration(const Topology& topology);

  double launch_us() const { return launch_us_; }
  // One rank's DMA rate for a collective's bytes (core_dma_gbps times the
  // cores a rank holds); infinity when uncapped.
  double rank_dma_bytes_per_second() const { return rank_dma_bytes_per_second_; }
  // The costs of a schedule named `algorithm` ("ring", ...) running a
  // collective of `kind`: the entry for that kind, else the one for every
  // kind, else zeros.
  AlgorithmCosts Costs(const std::string& algorithm, CollectiveKind kind) const;
  // The algorithms of the rules that hold for this collective, in order.
  std::vector<FabricAlgorithm> RuledAlgorithms(CollectiveKind kind, double bytes,
                                               bool spans_nodes) const;
  // Channels a ring across nodes asks for (1 when unset).
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

// Throws what CollectiveCalibration's constructor throws (neuronrun checks
// a job's topology with it before any rank starts).
void CheckCollectiveCalibration(const Topology& topology);

}  // namespace neuron::runtime
