#include "fused_blocks.h"

namespace neuron::runtime::detail {

std::size_t FusedBlock(std::size_t n, const std::vector<std::size_t>& periods) {
  if (n <= kFusedBlock) return n;
  auto fits = [&](std::size_t block) {
    for (std::size_t p : periods) {
      if (p == n) continue;
      if (p == 0 || (p < block ? block % p != 0 : p % block != 0)) return false;
    }
    return true;
  };
  if (fits(kFusedBlock)) return kFusedBlock;
  for (std::size_t p : periods) {  // a multiple of a short period near kFusedBlock
    if (p == 0 || p >= kFusedBlock) continue;
    const std::size_t block = (kFusedBlock + p - 1) / p * p;
    if (block < n && fits(block)) return block;
  }
  for (std::size_t p : periods) {  // a longer period
    if (p >= kFusedBlock && p < n && fits(p)) return p;
  }
  return n;
}

OperandSpan BlockOf(std::size_t period, std::size_t base, std::size_t len,
                    std::size_t n) {
  if (period == n) return {base, len};
  if (period >= len && base % period + len <= period) return {base % period, len};
  return {0, period};
}

}  // namespace neuron::runtime::detail
