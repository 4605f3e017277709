#include "model_table.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/topology.h"

namespace neuron::collectives {

void PrintModelTable(const ModelTableOptions& o) {
  NEURON_CHECK(o.ranks >= 1 && o.nodes >= 1 && o.ranks % o.nodes == 0,
               "--model-only needs -N RANKS (>= 1) divisible by --nodes (", o.nodes, "), got ",
               o.ranks);
  const runtime::Topology topology = o.topology_path.empty()
                                         ? runtime::Topology::FromEnvironment()
                                         : runtime::Topology::FromFile(o.topology_path);
  const runtime::DeviceSpec device = o.device_path.empty()
                                         ? runtime::DeviceSpec::FromEnvironment()
                                         : runtime::DeviceSpec::FromFile(o.device_path);
  const std::vector<std::uint32_t> per_node(static_cast<std::size_t>(o.nodes),
                                            static_cast<std::uint32_t>(o.ranks / o.nodes));
  const runtime::FabricModel model(topology, runtime::PlaceRanks(topology, per_node), device);
  const double factor = runtime::BusBandwidthFactor(o.op, o.ranks);
  std::printf("# neuron-cc-perf --model-only: %s, %d ranks on %d node(s) of %s, device %s; %s\n",
              runtime::Name(o.op), o.ranks, o.nodes, topology.spec().name().c_str(),
              device.spec().name().c_str(),
              DescribeModelAlgorithm(o.algorithm));
  std::printf("%12s %12s %11s %11s %11s %13s %7s\n", "size(B)", "count", "time(us)",
              "algbw(GB/s)", "busbw(GB/s)", "algorithm", "chunks");
  const std::vector<int> group = runtime::AllRanks(o.ranks);
  NEURON_CHECK(o.factor >= 2 && o.min_bytes >= 1 && o.min_bytes <= o.max_bytes,
               "need -f >= 2 and 1 <= -b <= -e");
  for (std::size_t bytes = o.min_bytes; bytes != 0;
       bytes = NextSize(bytes, o.max_bytes, o.factor)) {
    std::size_t count = std::max<std::size_t>(bytes / o.element_bytes, 1);
    if (o.op == runtime::CollectiveKind::kAllGather ||
        o.op == runtime::CollectiveKind::kReduceScatter) {
      count = std::max<std::size_t>(count / o.ranks, 1) * o.ranks;
    }
    const double s = static_cast<double>(count * o.element_bytes);
    const runtime::CollectiveCost cost =
        runtime::ModelCollective(model, runtime::Name(o.op), s, group, 0, o.algorithm);
    const double algbw = cost.micros > 0 ? s / cost.micros / 1e3 : 0;
    std::printf("%12zu %12zu %11.2f %11.3f %11.3f %13s %7d\n", static_cast<std::size_t>(s), count,
                cost.micros, algbw, algbw * factor, cost.algorithm, cost.chunks);
  }
}

const char* DescribeModelAlgorithm(runtime::FabricAlgorithm algorithm) {
  return algorithm == runtime::FabricAlgorithm::kAuto
             ? "the topology's rule for the size, else the model's fastest"
             : runtime::Name(algorithm);
}

}  // namespace neuron::collectives
