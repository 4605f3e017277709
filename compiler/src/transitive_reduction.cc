#include "transitive_reduction.h"

#include <algorithm>
#include <functional>

#include "neuron/runtime/error.h"

namespace neuron::compiler {

std::vector<std::uint32_t> TransitiveReduction::Direct(std::vector<std::uint32_t> earlier) {
  const std::size_t self = reach_.size();
  std::vector<std::uint64_t> reach((self + 63) / 64, 0);
  // Latest first: a dependency is implied exactly when a later kept one
  // already reaches it (dependencies point to earlier instructions).
  std::sort(earlier.begin(), earlier.end(), std::greater<>());
  std::vector<std::uint32_t> direct;
  for (std::uint32_t d : earlier) {
    NEURON_CHECK(d < self, "transitive reduction: instruction ", self, " depends on ", d,
                 ", which is not earlier");
    if (reach[d / 64] >> (d % 64) & 1) continue;  // implied (or a duplicate)
    direct.push_back(d);
    reach[d / 64] |= std::uint64_t{1} << (d % 64);
    const auto& via = reach_[d];
    for (std::size_t w = 0; w < via.size(); ++w) reach[w] |= via[w];
  }
  reach_.push_back(std::move(reach));
  std::reverse(direct.begin(), direct.end());
  return direct;
}

}  // namespace neuron::compiler
