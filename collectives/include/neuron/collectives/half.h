// IEEE binary16 and bfloat16 conversions, round to nearest even, with
// infinities and NaNs preserved (NaNs are made quiet).
#pragma once

#include <cstdint>

namespace neuron::collectives {

float HalfToFloat(std::uint16_t bits);
std::uint16_t FloatToHalf(float value);
float BFloat16ToFloat(std::uint16_t bits);
std::uint16_t FloatToBFloat16(float value);

}  // namespace neuron::collectives
