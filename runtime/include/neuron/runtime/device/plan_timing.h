// Modelled time of an executable on the simulated NeuronCore: each
// instruction starts when its engine is free and its dependencies ended
// (engines overlap one another, DMA overlaps compute) and lasts what the
// cost model says. A custom kernel (OP_CUSTOM_KERNEL) lasts its own
// schedule's time (kernel_us) and starts when all its engines are free,
// holding them all until it ends (each counted busy for its kernel_busy_us). A DMA holds its engine for its bytes only: the next one
// starts while its fixed latency runs (CostModel::DmaLatency); `busy`
// counts what engines were held.
//
// Usage:
//   Executable exe = LoadExecutable("graph.neff.pb");   // executable.h
//   PlanTiming t = TimePlan(exe, CostModel(DeviceSpec::Default()));
//   std::printf("%.1f us, MFU %.2f\n", t.total.count(), t.mfu);
//   WriteChromeTrace(t, "plan.json");
//
// The executable must have passed ValidateExecutable (executable.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/executable.pb.h"
#include "neuron/runtime/sim_time.h"

namespace neuron::runtime {

constexpr int kEngineCount = 5;  // tensor, vector, scalar, gpsimd, dma

struct ScheduledInstruction {
  std::uint32_t id = 0;
  Engine engine = Engine::kTensor;
  std::string op;  // a custom kernel's: its key (proto::Instruction::kernel)
  SimDuration start{0};
  SimDuration end{0};
  std::vector<Engine> also;  // a custom kernel: the other engines it holds
};

struct PlanTiming {
  SimDuration total{0};                            // the last instruction's end
  std::array<SimDuration, kEngineCount> busy{};    // per Engine, by its index
  std::array<double, kEngineCount> utilisation{};  // busy / total
  std::uint64_t tensor_cycles = 0;
  double flops = 0;
  double mfu = 0;                 // flops / (total x peak), bf16 peak unless all fp32
  std::uint64_t hbm_bytes = 0;    // moved by DMA
  std::uint64_t spill_bytes = 0;  // of which spills and reloads
  std::vector<ScheduledInstruction> schedule;
};

PlanTiming TimePlan(const proto::Executable& executable, const CostModel& model);

// How long an instruction lasting `duration` holds `engine`: a DMA for its
// bytes only (its fixed latency overlaps the next transfer's,
// CostModel::DmaLatency), any other for its whole duration.
SimDuration EngineHeld(Engine engine, SimDuration duration, const CostModel& model);

// One instruction's modelled cost on its engine (`fp32`: a matmul of
// float32 inputs): its duration, and for the tensor engine its cycles and
// flops.
struct InstructionCost {
  SimDuration time{0};
  std::uint64_t tensor_cycles = 0;
  double flops = 0;
};
InstructionCost CostOf(const proto::Instruction& instruction, const CostModel& model, bool fp32);
// CostOf(...).time.
SimDuration InstructionDuration(const proto::Instruction& instruction, const CostModel& model,
                                bool fp32);

// The modelled timeline as a Chrome trace: one track per engine.
void WriteChromeTrace(const PlanTiming& timing, const std::string& name,
                      const std::string& path);

}  // namespace neuron::runtime
