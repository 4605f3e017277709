// The block length a fused chain runs in and the part of a repeating
// operand each block reads (fused_blocks.h), against the rule: every
// block starts a repeat of each operand it reads whole and lies within
// one repeat of each longer one.
#include "fused_blocks.h"

#include <gtest/gtest.h>

#include <vector>

namespace neuron::runtime::detail {
namespace {

TEST(FusedBlock, IsKFusedBlockOrALengthEveryOperandsPeriodFits) {
  // n, the operands' periods (n: full size), the block length.
  struct Case {
    std::size_t n;
    std::vector<std::size_t> periods;
    std::size_t block;
  };
  for (const Case& c : std::vector<Case>{
           {4096, {4096, 128}, 4096},            // one block: no more than kFusedBlock
           {1000, {1000, 10}, 1000},             // fewer elements than a block
           {40960, {40960, 128, 8192}, 4096},    // 4096 fits the bias and the mask
           {42624, {42624, 128}, 4096},          // a partial last block
           {21000, {21000, 3000}, 6000},         // a multiple of a short period
           {36000, {36000, 3000, 9000}, 9000},   // a longer period
           {36000, {36000, 3000, 7200}, 36000},  // none fits: one block
           {8192 * 3, {8192 * 3, 1}, 4096}}) {   // a scalar repeats every element
    EXPECT_EQ(FusedBlock(c.n, c.periods), c.block) << "n " << c.n;
  }
}

TEST(FusedBlock, EachBlockReadsItsOwnElementsOfEveryOperand) {
  // Walks every block of each case and checks, element by element, that
  // operand element (base + e) % period is what the kernel reads at e.
  for (const auto& [n, period] : std::vector<std::pair<std::size_t, std::size_t>>{
           {42624, 128}, {21000, 3000}, {36000, 9000}, {40960, 8192}, {40960, 40960}}) {
    const std::size_t block = FusedBlock(n, {n, period});
    ASSERT_LT(block, n) << "n " << n << ", period " << period;
    for (std::size_t base = 0; base < n; base += block) {
      const std::size_t len = std::min(block, n - base);
      const OperandSpan span = BlockOf(period, base, len, n);
      ASSERT_LE(span.offset + std::min(span.size, len), period == n ? n : period);
      for (std::size_t e = 0; e < len; ++e) {
        // The kernel reads element e of the block at offset + e % size.
        ASSERT_EQ(span.offset + e % span.size, (base + e) % period)
            << "n " << n << ", period " << period << ", block at " << base << ", element "
            << e;
      }
    }
  }
}

}  // namespace
}  // namespace neuron::runtime::detail
