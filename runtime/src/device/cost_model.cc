#include "neuron/runtime/device/cost_model.h"

#include <algorithm>

#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

std::uint64_t CeilDiv(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

// Microseconds of `cycles` at `ghz`.
SimDuration Cycles(double cycles, double ghz) {
  return SimDuration(cycles / (ghz * 1e3));
}

}  // namespace

const char* Name(Engine engine) {
  switch (engine) {
    case Engine::kTensor:
      return "tensor";
    case Engine::kVector:
      return "vector";
    case Engine::kScalar:
      return "scalar";
    case Engine::kGpSimd:
      return "gpsimd";
    case Engine::kDma:
      return "dma";
  }
  return "?";
}

MatmulCost CostModel::Matmul(std::int64_t m, std::int64_t k, std::int64_t n,
                             bool fp32) const {
  NEURON_CHECK(m >= 0 && k >= 0 && n >= 0, "matmul cost: negative shape ", m, "x", k, "x",
               n);
  MatmulCost cost;
  if (m == 0 || k == 0 || n == 0) return cost;
  const auto& t = spec_.spec().tensor();
  const std::uint64_t k_tiles = CeilDiv(k, t.pe_rows());
  const std::uint64_t m_tiles = CeilDiv(m, t.pe_columns());
  const std::uint64_t full = static_cast<std::uint64_t>(n) / t.max_moving_free();
  const std::uint64_t rest = static_cast<std::uint64_t>(n) % t.max_moving_free();
  // Cycles of one pass over N: the full moving tiles and the remainder.
  std::uint64_t per_pass =
      full * std::max<std::uint64_t>(t.max_moving_free(), t.min_issue_cycles());
  if (rest > 0) per_pass += std::max<std::uint64_t>(rest, t.min_issue_cycles());
  const double slowdown = fp32 ? t.fp32_slowdown() : 1.0;
  cost.instructions = k_tiles * m_tiles * (full + (rest > 0 ? 1 : 0));
  cost.cycles = static_cast<std::uint64_t>(k_tiles * m_tiles * per_pass * slowdown);
  cost.time = Cycles(static_cast<double>(cost.cycles), t.clock_ghz());
  cost.flops = 2.0 * m * k * n;
  return cost;
}

const proto::ElementwiseEngineSpec& CostModel::EngineSpec(Engine engine) const {
  switch (engine) {
    case Engine::kVector:
      return spec_.spec().vector();
    case Engine::kScalar:
      return spec_.spec().scalar();
    case Engine::kGpSimd:
      return spec_.spec().gpsimd();
    default:
      break;
  }
  throw InvalidUsage(
      StrCat("elementwise cost: engine ", Name(engine), " is not elementwise"));
}

std::uint64_t CostModel::ElementwiseCycles(Engine engine, std::int64_t elements,
                                           int inputs, bool dependent) const {
  NEURON_CHECK(elements >= 0 && inputs >= 1, "elementwise cost: ", elements,
               " elements, ", inputs, " inputs");
  const auto& e = EngineSpec(engine);
  const std::uint64_t free = CeilDiv(static_cast<std::uint64_t>(elements), e.lanes());
  return static_cast<std::uint64_t>(e.cycles_per_element() * inputs * free) +
         (dependent ? e.dependent_overhead_cycles() : 0);
}

SimDuration CostModel::Elementwise(Engine engine, std::int64_t elements, int inputs,
                                   bool dependent) const {
  return Cycles(
      static_cast<double>(ElementwiseCycles(engine, elements, inputs, dependent)),
      EngineSpec(engine).clock_ghz());
}

SimDuration CostModel::Scan(Engine engine, std::int64_t lines, std::int64_t length,
                            bool dependent) const {
  NEURON_CHECK(lines >= 0 && length >= 0, "scan cost: ", lines, " lines of ", length,
               " elements");
  const auto& e = EngineSpec(engine);
  const std::uint64_t rounds = CeilDiv(static_cast<std::uint64_t>(lines), e.lanes());
  const double cycles =
      e.cycles_per_element() * static_cast<double>(rounds * static_cast<std::uint64_t>(length)) +
      (dependent ? static_cast<double>(e.dependent_overhead_cycles()) : 0.0);
  return Cycles(cycles, e.clock_ghz());
}

SimDuration CostModel::Dma(std::uint64_t bytes, std::uint32_t partitions) const {
  NEURON_CHECK(partitions > 0, "dma cost: 0 partitions");
  const auto& d = spec_.spec().dma();
  if (bytes == 0) return SimDuration(d.fixed_cost_us());
  const double per_partition = static_cast<double>(bytes) / partitions;
  const double efficiency =
      d.min_bytes_per_partition() == 0
          ? 1.0
          : std::min(1.0,
                     per_partition / static_cast<double>(d.min_bytes_per_partition()));
  const double gbps = d.engines() * d.bandwidth_gbps_per_engine() * efficiency;
  return SimDuration(d.fixed_cost_us() + static_cast<double>(bytes) / (gbps * 1e3));
}

SimDuration CostModel::DmaLatency() const {
  return SimDuration(spec_.spec().dma().fixed_cost_us());
}

SimDuration CostModel::Hbm(std::uint64_t bytes) const {
  return SimDuration(static_cast<double>(bytes) /
                     (spec_.spec().hbm().bandwidth_gbps() * 1e3));
}

double CostModel::Mfu(double flops, SimDuration time, bool fp32) const {
  if (time.count() <= 0) return 0;
  return flops / (time.count() * 1e-6) / (spec_.PeakTflops(fp32) * 1e12);
}

}  // namespace neuron::runtime
