// Fusion of elementwise steps (after the nodes are lowered, before
// placement).
//
// Fusion: a chain of elementwise steps, each reading the previous one's
// result and nothing else reading it, becomes one OP_FUSED instruction
// (on the scalar engine when it holds an activation, as the hardware's
// activation instruction takes a scale and a bias; else on the vector
// engine): the intermediates never go to SBUF, and the engine pays one
// dependency overhead and reads only the chain's outside operands. A
// matmul's epilogue (bias add, activation, residual add) is such a chain
// from the PSUM evacuation on.
#pragma once

#include "lowering_context.h"

namespace neuron::compiler {

// Fuses the chains in cx.steps(); the fused-away intermediates leave
// cx.order() (they never get a buffer).
void FuseElementwise(LoweringContext& cx);

}  // namespace neuron::compiler
