// The IR's custom kernel node (kCustomKernelOp, "nki.kernel"): a kernel
// the compiler does not see into, lowered to one OP_CUSTOM_KERNEL
// instruction over HBM buffers, priced by the kernel's own schedule (the
// node's attributes: kernel, time_us, busy_<engine>, hbm_bytes). Not a row
// of the native op table, which lists the aten ops the lowering expands.
#pragma once

#include <string>

#include "lowering_context.h"
#include "neuron/compiler/graph.pb.h"

namespace neuron::compiler {

inline constexpr const char* kCustomKernelOp = "nki.kernel";

// Lowers node `n` (InvalidUsage naming `where` when its attributes are
// missing or unsound).
void LowerCustomKernel(LoweringContext& cx, const proto::Node& n, const std::string& where);

}  // namespace neuron::compiler
