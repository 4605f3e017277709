// The modelled time of one eagerly executed operation on the simulated
// NeuronCore (docs/device.md, "Eager operations"). An eager op is its own
// small program: it loads its inputs from HBM, computes on one engine and
// stores its outputs back, so it costs the DMA's fixed cost plus the larger
// of its engine time and its HBM traffic time (a roofline):
//
//   matmul       [B x] M x K x N on the tensor engine (CostModel::Matmul)
//   vector       elementwise, reductions, normalisation: the vector engine
//                over max(input, output) elements
//   scalar       transcendentals (exp, tanh, softmax, ...): the scalar engine
//   copy         a transfer between host and device, or within HBM: one DMA
//   fallback     a CPU fallback (op_support.h): its inputs copied to the
//                host over the host link, the CPU's kernel, its outputs
//                copied back, and the synchronisation (DeviceSpec's host)
//   unknown      an op of a capture made before the support table: the
//                roofline of the vector engine (never free)
//   view         metadata only (views, empty tensors): free
//
// Usage:
//   EagerOp op{EagerKind::kMatmul};
//   op.matmul = {1, 256, 512, 1024};  op.fp32 = true;
//   op.bytes_in = ...; op.bytes_out = ...;
//   SimDuration t = EagerCost(model, op);
#pragma once

#include <cstdint>

#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/sim_time.h"

namespace neuron::runtime {

enum class EagerKind { kView, kMatmul, kVector, kScalar, kCopy, kFallback, kUnknown };
const char* Name(EagerKind kind);

struct EagerOp {
  EagerKind kind = EagerKind::kUnknown;
  struct {
    std::int64_t batch = 1, m = 0, k = 0, n = 0;
  } matmul;                     // kMatmul
  bool fp32 = false;            // float32 matmul inputs (4x slower)
  std::int64_t elements = 0;    // max(input, output) elements
  int inputs = 1;               // tensor operands read per element
  std::uint64_t bytes_in = 0;   // read from HBM
  std::uint64_t bytes_out = 0;  // written to HBM
  // A scan (cumsum, cumprod, ...; kVector): scan_lines lines of scan_length
  // elements, each walked in order (CostModel::Scan); 0: not a scan.
  std::int64_t scan_lines = 0, scan_length = 0;
};

SimDuration EagerCost(const CostModel& model, const EagerOp& op);

// A CPU fallback's parts (EagerKind::kFallback), from the spec's host
// figures (their defaults when 0): each copy is the link's latency plus its
// bytes at the link's rate; the CPU kernel takes cpu_ns_per_element per
// element of the op.
struct FallbackCost {
  SimDuration to_host, cpu, to_device, sync;
  SimDuration total() const { return to_host + cpu + to_device + sync; }
};
FallbackCost FallbackParts(const DeviceSpec& spec, const EagerOp& op);

}  // namespace neuron::runtime
