#include "neuron/runtime/device/plan_timing.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"

namespace neuron::runtime {
namespace {

Engine EngineOf(proto::EngineKind kind) {
  switch (kind) {
    case proto::TENSOR:
      return Engine::kTensor;
    case proto::VECTOR:
      return Engine::kVector;
    case proto::SCALAR:
      return Engine::kScalar;
    case proto::GPSIMD:
      return Engine::kGpSimd;
    case proto::DMA:
      return Engine::kDma;
    default:
      break;
  }
  throw InvalidUsage(
      StrCat("plan timing: engine ", static_cast<int>(kind), " is not an engine"));
}

}  // namespace

InstructionCost CostOf(const proto::Instruction& i, const CostModel& model, bool fp32) {
  const Engine engine = EngineOf(i.engine());
  InstructionCost cost;
  switch (engine) {
    case Engine::kTensor: {
      const MatmulCost matmul = model.Matmul(i.m(), i.k(), i.n(), fp32);
      const std::int64_t batch = std::max<std::int64_t>(i.batch(), 1);
      cost.time = matmul.time * static_cast<double>(batch);
      cost.tensor_cycles = matmul.cycles * static_cast<std::uint64_t>(batch);
      cost.flops = matmul.flops * static_cast<double>(batch);
      break;
    }
    case Engine::kDma:
      cost.time = model.Dma(i.bytes(), i.partitions());
      break;
    default:
      if (i.op() == proto::OP_CUMSUM) {  // [m, n, k]: m x k lines of n, in order
        cost.time = model.Scan(engine, i.m() * i.k(), i.n(), i.deps_size() > 0);
        break;
      }
      cost.time = model.Elementwise(engine, i.elements(), static_cast<int>(i.operand_count()),
                                    i.deps_size() > 0);
  }
  return cost;
}

SimDuration InstructionDuration(const proto::Instruction& i, const CostModel& model,
                                bool fp32) {
  return CostOf(i, model, fp32).time;
}

SimDuration EngineHeld(Engine engine, SimDuration duration, const CostModel& model) {
  if (engine != Engine::kDma) return duration;
  return std::max(duration - model.DmaLatency(), SimDuration(0));
}

PlanTiming TimePlan(const proto::Executable& e, const CostModel& model) {
  std::unordered_map<std::uint32_t, const proto::Buffer*> buffers;
  for (const auto& b : e.buffers()) buffers[b.id()] = &b;
  std::unordered_map<std::uint32_t, SimDuration> end_of;
  std::array<SimDuration, kEngineCount> engine_free{};
  PlanTiming t;
  bool all_fp32 = true;
  for (const auto& i : e.instructions()) {
    const Engine engine = EngineOf(i.engine());
    const int index = static_cast<int>(engine);
    SimDuration start = engine_free[index];
    for (auto d : i.deps()) start = std::max(start, end_of.at(d));
    const bool fp32 = engine == Engine::kTensor && !i.inputs().empty() &&
                      buffers.at(i.inputs(0))->dtype() == proto::F32;
    const InstructionCost cost = CostOf(i, model, fp32);
    const SimDuration duration = cost.time;
    t.tensor_cycles += cost.tensor_cycles;
    t.flops += cost.flops;
    if (engine == Engine::kTensor) {
      all_fp32 = all_fp32 && fp32;
    } else if (engine == Engine::kDma) {
      t.hbm_bytes += i.bytes();
      if (i.spill()) t.spill_bytes += i.bytes();
    }
    const SimDuration end = start + duration;
    const SimDuration held = EngineHeld(engine, duration, model);
    engine_free[index] = start + held;
    end_of[i.id()] = end;
    t.busy[index] += held;
    t.total = std::max(t.total, end);
    t.schedule.push_back({i.id(), engine, DeviceOpName(i.op()), start, end});
  }
  for (int k = 0; k < kEngineCount; ++k) {
    t.utilisation[k] = t.total.count() > 0 ? t.busy[k] / t.total : 0.0;
  }
  t.mfu = model.Mfu(t.flops, t.total, t.flops > 0 && all_fp32);
  return t;
}

void WriteChromeTrace(const PlanTiming& timing, const std::string& name,
                      const std::string& path) {
  std::ostringstream out;
  out << "{\"traceEvents\":[";
  bool first = true;
  for (int k = 0; k < kEngineCount; ++k) {
    out << (first ? "" : ",") << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":\""
        << name << "\",\"tid\":" << k << ",\"args\":{\"name\":\""
        << Name(static_cast<Engine>(k)) << "\"}}";
    first = false;
  }
  for (const auto& s : timing.schedule) {
    out << ",{\"name\":\"" << s.op << " #" << s.id << "\",\"ph\":\"X\",\"pid\":\"" << name
        << "\",\"tid\":" << static_cast<int>(s.engine) << ",\"ts\":" << s.start.count()
        << ",\"dur\":" << (s.end - s.start).count() << "}";
  }
  out << "]}\n";
  WriteFileAtomically(path, out.str());  // IoError naming it; never through a link
}

}  // namespace neuron::runtime
