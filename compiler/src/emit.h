// Emission: the lowered steps placed in memory (SBUF and PSUM planned,
// spilling until SBUF fits; HBM without reuse) and written as an
// executable, each instruction with its buffers and its direct
// dependencies (data, and reuse of the same bytes).
#pragma once

#include <string>

#include "lowering_context.h"
#include "neuron/compiler/lower.h"

namespace neuron::compiler {

Lowered Emit(LoweringContext& cx, const std::string& graph_id);

}  // namespace neuron::compiler
