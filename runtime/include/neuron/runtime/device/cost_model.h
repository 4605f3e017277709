// How long work takes on the simulated NeuronCore: the published cost model
// of each engine (../shared/REFERENCE.md, docs/device.md), as closed forms
// the executor schedules and the tests check.
//
// Usage:
//   CostModel model(DeviceSpec::Default());
//   MatmulCost mm = model.Matmul(/*m=*/1024, /*k=*/1024, /*n=*/1024, /*fp32=*/false);
//   SimDuration add = model.Elementwise(Engine::kVector, 1 << 20, /*inputs=*/2, true);
//   SimDuration load = model.Dma(4 << 20, /*partitions=*/128);
//
// Matmul out[M,N] = lhs[M,K] x rhs[K,N] on the tensor engine: the
// contraction K runs over the partitions in tiles of pe_rows, the
// stationary tile holds <= pe_columns rows of the output, the moving tile
// <= max_moving_free of its columns. Each (K tile, M tile, N tile) is one
// instruction issuing every max(N tile, min_issue_cycles) cycles, times
// fp32_slowdown for float32 inputs.
#pragma once

#include <cstdint>

#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/sim_time.h"

namespace neuron::runtime {

enum class Engine { kTensor, kVector, kScalar, kGpSimd, kDma };
const char* Name(Engine engine);

struct MatmulCost {
  std::uint64_t instructions = 0;
  std::uint64_t cycles = 0;  // tensor engine cycles
  SimDuration time{0};
  double flops = 0;  // 2 x M x K x N
};

class CostModel {
 public:
  explicit CostModel(DeviceSpec spec) : spec_(std::move(spec)) {}

  MatmulCost Matmul(std::int64_t m, std::int64_t k, std::int64_t n, bool fp32) const;
  // An op over `elements` elements with `inputs` operands on a vector-style
  // engine: cycles_per_element x inputs x ceil(elements / lanes), plus the
  // engine's overhead when it waits on a previous instruction.
  std::uint64_t ElementwiseCycles(Engine engine, std::int64_t elements, int inputs,
                                  bool dependent) const;
  SimDuration Elementwise(Engine engine, std::int64_t elements, int inputs,
                          bool dependent) const;
  // A scan (a running sum) of `lines` independent lines of `length`
  // elements each: the lines spread over the lanes, each lane walking its
  // lines' elements in order, cycles_per_element x length x ceil(lines /
  // lanes) (one long line does not spread), plus the overhead as above.
  SimDuration Scan(Engine engine, std::int64_t lines, std::int64_t length,
                   bool dependent) const;
  // A DMA of `bytes` spread over `partitions`: fixed cost plus bytes over
  // every engine's bandwidth, scaled down below min_bytes_per_partition.
  SimDuration Dma(std::uint64_t bytes, std::uint32_t partitions) const;
  // The part of a DMA's time that is latency (the fixed cost): the 16
  // queues keep several transfers in flight, so a plan's next transfer
  // starts moving bytes while this one's latency runs (TimePlan).
  SimDuration DmaLatency() const;
  // Streaming `bytes` from or to HBM at its bandwidth.
  SimDuration Hbm(std::uint64_t bytes) const;
  // Model FLOP utilisation of `flops` done in `time` against the peak.
  double Mfu(double flops, SimDuration time, bool fp32) const;

  const DeviceSpec& device() const { return spec_; }

 private:
  const proto::ElementwiseEngineSpec& EngineSpec(Engine engine) const;
  DeviceSpec spec_;
};

}  // namespace neuron::runtime
