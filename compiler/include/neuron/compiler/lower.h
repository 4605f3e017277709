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
// Supported ops: NativeOps() (native_ops.h; docs/operators.md).
// Anything else, float64 values, and values that do not fit on chip are
// InvalidUsage naming the node, its op and its source line.
#pragma once

#include <string>

#include "neuron/compiler/graph.pb.h"
#include "neuron/compiler/memory_plan.h"
#include "neuron/compiler/schedule.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::compiler {

constexpr const char* kCompilerVersion = "0.20.0";

struct Lowered {
  runtime::proto::Executable executable;  // in the scheduled order (schedule.h)
  MemoryPlan sbuf;
  MemoryPlan psum;
  ScheduleResult schedule;
};

Lowered Lower(const proto::Graph& graph, const runtime::DeviceSpec& device,
              const std::string& graph_id = "");

}  // namespace neuron::compiler
