// neuron-cc-perf --model-only: the nccl-tests table the fabric model
// predicts for a topology, a device and a rank count, without starting
// ranks or moving bytes.
//
// Usage:
//   neuron-cc-perf --model-only -N 16 --topology configs/topologies/trn2-node.textproto
#pragma once

#include <cstddef>
#include <string>

#include "neuron/runtime/fabric/collective_schedules.h"

namespace neuron::collectives {

struct ModelTableOptions {
  runtime::CollectiveKind op = runtime::CollectiveKind::kAllReduce;
  std::size_t min_bytes = 8, max_bytes = 64u << 20, factor = 2;
  std::size_t element_bytes = 4;
  int ranks = 0;                  // -N
  int nodes = 1;                  // --nodes: ranks split evenly over them
  std::string topology_path;      // --topology, else NEURON_TOPOLOGY_FILE, else trn2-node
  std::string device_path;        // --device, else NEURON_DEVICE_FILE, else NeuronCore-v3
  runtime::FabricAlgorithm algorithm = runtime::FabricAlgorithm::kAuto;
};

// A sweep's next size after `bytes`: bytes x factor while that stays within
// `max`, else 0 (the end; no overflow). Needs factor >= 2.
inline std::size_t NextSize(std::size_t bytes, std::size_t max, std::size_t factor) {
  return bytes > max / factor ? 0 : bytes * factor;
}

// Prints the table to stdout; InvalidUsage names a shape that does not fit
// the topology.
void PrintModelTable(const ModelTableOptions& o);

// What the tables' headers say the model runs: `algorithm`'s name, or for
// kAuto how the automatic choice picks.
const char* DescribeModelAlgorithm(runtime::FabricAlgorithm algorithm);

}  // namespace neuron::collectives
