// The collectives use the runtime's float16 / bfloat16 conversions
// (neuron/runtime/half.h), under their own namespace.
#pragma once

#include "neuron/runtime/half.h"

namespace neuron::collectives {
using runtime::BFloat16ToFloat;
using runtime::FloatToBFloat16;
using runtime::FloatToHalf;
using runtime::HalfToFloat;
}  // namespace neuron::collectives
