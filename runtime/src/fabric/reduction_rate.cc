#include "neuron/runtime/fabric/reduction_rate.h"

#include <algorithm>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

double ReductionBytesPerSecond(const DeviceSpec& device, double cores) {
  NEURON_CHECK(cores > 0, "reduction rate of a rank with ", cores, " cores");
  const auto& dma = device.spec().dma();
  const double fraction =
      dma.collective_compute_fraction() != 0 ? dma.collective_compute_fraction() : 0.5;
  const double dma_rate = dma.engines() * dma.bandwidth_gbps_per_engine() * 1e9 * fraction;
  const double hbm_rate = device.spec().hbm().bandwidth_gbps() * 1e9 / 3;
  return cores * std::min(dma_rate, hbm_rate);
}

double CoresPerRank(const Topology& topology) {
  return static_cast<double>(topology.CoresPerChip()) /
         std::max<std::uint32_t>(topology.spec().ranks_per_chip(), 1);
}

}  // namespace neuron::runtime
