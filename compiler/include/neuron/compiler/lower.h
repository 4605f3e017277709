// Lowering: a verified graph becomes an executable for the simulated
// NeuronCore (runtime/proto/neuron/runtime/executable.proto).
//
// Usage:
//   Lowered out = Lower(graph, DeviceSpec::Default(), /*graph_id=*/key);
//   runtime::Executor(DeviceSpec::Default()).Run(out.executable, inputs);
//   out.sbuf.planned_bytes;  out.sbuf.lower_bound_bytes;  out.sbuf.no_reuse_bytes;
//
// Placement: graph inputs, constants and outputs live in HBM; a value read
// by an engine is loaded into SBUF once (DMA); matmul results go to PSUM
// (and through a vector copy when the graph wants another dtype); other
// results to SBUF; returned values are stored to HBM. SBUF and PSUM are
// planned separately (memory_plan.h). Dependencies cover data
// (read-after-write) and reuse of memory (write-after-read/write), so the
// engines overlap only where it is safe.
//
// Supported ops (more come with the fusion and decomposition passes):
//   aten.mm, aten.addmm (alpha and beta 1); aten.add, aten.sub (alpha 1),
//   aten.mul, aten.maximum, aten.minimum (the second operand may be smaller
//   and repeats: a bias); aten.relu, aten.neg, aten.threshold_backward,
//   aten.gelu_backward;
//   aten.t and aten.sum.dim_IntList over dim [0] of 2-D tensors; aten.view,
//   aten._unsafe_view, aten.reshape, aten.detach, aten.clone, aten.alias
//   (vector engine); aten.exp, aten.tanh, aten.sigmoid, aten.gelu (scalar
//   engine; approximate "tanh" or exact); aten._softmax, aten._log_softmax
//   and their _backward_data over the last dimension (scalar engine);
//   aten.native_layer_norm and its backward over the last dimension with
//   weight and bias (vector engine; three outputs each); aten.nll_loss_forward
//   and aten.nll_loss_backward over [N, C] without class weights (mean or
//   sum; ignore_index honoured).
// Anything else, float64 values, and values that do not fit on chip are
// InvalidUsage naming the node, its op and its source line.
#pragma once

#include <string>

#include "neuron/compiler/graph.pb.h"
#include "neuron/compiler/memory_plan.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::compiler {

constexpr const char* kCompilerVersion = "0.2.0";

struct Lowered {
  runtime::proto::Executable executable;
  MemoryPlan sbuf;
  MemoryPlan psum;
};

Lowered Lower(const proto::Graph& graph, const runtime::DeviceSpec& device,
              const std::string& graph_id = "");

}  // namespace neuron::compiler
