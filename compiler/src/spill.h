// The SBUF budget: the on-chip values' lifetimes, and spilling to HBM
// when the SBUF plan does not fit.
#pragma once

#include <vector>

#include "lowering_context.h"
#include "neuron/compiler/memory_plan.h"

namespace neuron::compiler {

// Lifetimes of the on-chip slots of cx.steps(), by step, split by memory.
void Lifetimes(const LoweringContext& cx, std::vector<Interval>* sbuf,
               std::vector<Interval>* psum);

// Spilling: when the SBUF plan does not fit, the largest value alive but
// unused at the step where most bytes are alive goes to HBM right after
// it is written (a "spill" DMA) and comes back before each later read (a
// "reload" DMA into a fresh slot), so its bytes are free in between.
// False when no value can go.
bool SpillOne(LoweringContext& cx, const std::vector<Interval>& sbuf);

}  // namespace neuron::compiler
