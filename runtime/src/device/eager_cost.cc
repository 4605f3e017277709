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
    case EagerKind::kFallback:
      return "fallback";
    case EagerKind::kUnknown:
      return "unknown";
  }
  return "?";
}

namespace {

// `value`, or `fallback` when the spec left it 0.
double Or(double value, double fallback) { return value > 0 ? value : fallback; }

}  // namespace

FallbackCost FallbackParts(const DeviceSpec& spec, const EagerOp& op) {
  const proto::HostSpec& host = spec.spec().host();
  const double bytes_per_us = Or(host.link_gbps(), 32) * 1e3;  // GB/s = 1e3 B/us
  const double latency = Or(host.link_latency_us(), 2);
  auto link = [&](std::uint64_t bytes) {
    return SimDuration(latency + static_cast<double>(bytes) / bytes_per_us);
  };
  return {link(op.bytes_in),
          SimDuration(static_cast<double>(op.elements) * Or(host.cpu_ns_per_element(), 1) /
                      1e3),
          link(op.bytes_out), SimDuration(Or(host.sync_us(), 5))};
}

SimDuration EagerCost(const CostModel& model, const EagerOp& op) {
  if (op.kind == EagerKind::kView) return SimDuration(0);
  if (op.kind == EagerKind::kFallback) return FallbackParts(model.device(), op).total();
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
