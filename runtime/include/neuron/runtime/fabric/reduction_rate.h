// How fast a rank reduces data arriving in a collective into its buffer,
// from the device model. Neuron reduces in the DMA engines' collective
// compute (not on the compute engines), at dma.collective_compute_fraction
// of a copy's throughput, reading both operands from HBM and writing the
// sum back (two reads, one write). So the rate is the slower of
//   cores x engines x bandwidth per engine x collective_compute_fraction
//   cores x HBM bandwidth / 3
// for a rank of `cores` NeuronCores (the chip's cores over its ranks).
//
// Usage:
//   double bps = ReductionBytesPerSecond(DeviceSpec::Default(), /*cores=*/8);
#pragma once

#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime {

double ReductionBytesPerSecond(const DeviceSpec& device, double cores);

// The NeuronCores one rank of `topology` holds: its cores per chip over
// ranks_per_chip.
double CoresPerRank(const Topology& topology);

}  // namespace neuron::runtime
