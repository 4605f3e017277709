#include "neuron/runtime/device/eager_cost.h"

#include <algorithm>

namespace neuron::runtime {

const char* Name(EagerKind kind) {
  switch (kind) {
    case EagerKind::kView:
      return "view";
    case EagerKind::kMatmul:
      return "matmul";
    case EagerKind::kVector:
      return "vector";
    case EagerKind::kScalar:
      return "scalar";
    case EagerKind::kCopy:
      return "copy";
    case EagerKind::kUnknown:
      return "unknown";
  }
  return "?";
}

SimDuration EagerCost(const CostModel& model, const EagerOp& op) {
  if (op.kind == EagerKind::kView) return SimDuration(0);
  const std::uint64_t traffic = op.bytes_in + op.bytes_out;
  const std::uint32_t partitions = model.device().spec().sbuf().partitions();
  if (op.kind == EagerKind::kCopy) return model.Dma(op.bytes_out, partitions);
  SimDuration engine(0);
  switch (op.kind) {
    case EagerKind::kMatmul:
      engine = model.Matmul(op.matmul.m, op.matmul.k, op.matmul.n, op.fp32).time *
               static_cast<double>(std::max<std::int64_t>(op.matmul.batch, 1));
      break;
    case EagerKind::kScalar:
      engine = model.Elementwise(Engine::kScalar, op.elements, op.inputs, true);
      break;
    default:  // kVector, kUnknown
      engine = op.scan_length > 0
                   ? model.Scan(Engine::kVector, op.scan_lines, op.scan_length, true)
                   : model.Elementwise(Engine::kVector, op.elements, op.inputs, true);
      break;
  }
  const SimDuration fixed(model.device().spec().dma().fixed_cost_us());
  return fixed + std::max(engine, model.Hbm(traffic));
}

}  // namespace neuron::runtime
