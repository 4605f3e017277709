// Numbers given on neuronrun's command lines: every flag names itself and its
// value when the value is not a number of the expected kind and range.
//
// Usage:
//   uint32_t n = ParseUnsigned("--nnodes", "4", 1, 4096);
//   double t = ParseFinite("--tokens-per-rank-step", "512", 0, 1e12);
//
// A whole number is digits only: no sign, no space, no base prefix.
#pragma once

#include <cstdint>
#include <string>

namespace neuron::launcher {

std::uint64_t ParseUnsigned(const std::string& flag, const std::string& text, std::uint64_t min,
                            std::uint64_t max);
double ParseFinite(const std::string& flag, const std::string& text, double min, double max);

}  // namespace neuron::launcher
