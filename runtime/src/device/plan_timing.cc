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

// A custom kernel: from when its dependencies ended and all its engines
// are free, for kernel_us, holding them all; each busy its own time.
void TimeCustomKernel(const proto::Instruction& i, SimDuration start,
                      std::array<SimDuration, kEngineCount>& engine_free, PlanTiming& t,
                      std::unordered_map<std::uint32_t, SimDuration>& end_of) {
  for (int e : i.kernel_engines())
    start = std::max(start, engine_free[static_cast<int>(EngineOf(
                                static_cast<proto::EngineKind>(e)))]);
  const SimDuration end = start + SimDuration(i.kernel_us());
  ScheduledInstruction s{i.id(), EngineOf(i.engine()), i.kernel(), start, end, {}};
  for (int k = 0; k < i.kernel_engines_size(); ++k) {
    const Engine engine = EngineOf(static_cast<proto::EngineKind>(i.kernel_engines(k)));
    engine_free[static_cast<int>(engine)] = end;
    t.busy[static_cast<int>(engine)] += SimDuration(i.kernel_busy_us(k));
    if (engine != s.engine) s.also.push_back(engine);
  }
  t.hbm_bytes += i.bytes();
  end_of[i.id()] = end;
  t.total = std::max(t.total, end);
  t.schedule.push_back(std::move(s));
}

}  // namespace

InstructionCost CostOf(const proto::Instruction& i, const CostModel& model, bool fp32) {
  const Engine engine = EngineOf(i.engine());
  InstructionCost cost;
  if (i.op() == proto::OP_CUSTOM_KERNEL) {  // priced by its own schedule
    cost.time = SimDuration(i.kernel_us());
    return cost;
  }
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
    if (i.op() == proto::OP_CUSTOM_KERNEL) {
      TimeCustomKernel(i, start, engine_free, t, end_of);
      continue;
    }
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
    t.schedule.push_back({i.id(), engine, DeviceOpName(i.op()), start, end, {}});
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
    std::vector<Engine> engines{s.engine};  // a custom kernel: on each engine it holds
    engines.insert(engines.end(), s.also.begin(), s.also.end());
    for (Engine engine : engines) {
      out << ",{\"name\":\"" << s.op << " #" << s.id << "\",\"ph\":\"X\",\"pid\":\""
          << name << "\",\"tid\":" << static_cast<int>(engine)
          << ",\"ts\":" << s.start.count() << ",\"dur\":" << (s.end - s.start).count()
          << "}";
    }
  }
  out << "]}\n";
  WriteFileAtomically(path, out.str());  // IoError naming it; never through a link
}

}  // namespace neuron::runtime
