// How the executor runs a fused chain (exec_elementwise.cc's RunFused) over n
// elements: block by block, each sub-op over one block before the next
// block, so the chain's value and its operands' blocks stay in L1 and L2
// between sub-ops and a chain of k ops reads and writes memory once
// instead of k times. The kernels work element by element, so blocks give
// the same elements as one pass.
#pragma once

#include <cstddef>
#include <vector>

namespace neuron::runtime::detail {

// The block length aimed at: 16 KiB of float32 a buffer.
constexpr std::size_t kFusedBlock = 4096;

// A block length for a chain over n elements whose operands repeat every
// periods[k] elements (each divides n; n for a full-size operand): the
// first of kFusedBlock, a multiple of a period shorter than it, or a
// period longer than it that fits every operand (each period divides the
// length or is a multiple of it, so a block starts a repeat of every
// operand it reads whole and lies within one repeat of every longer one);
// n, one block, when n <= kFusedBlock or none fits.
std::size_t FusedBlock(std::size_t n, const std::vector<std::size_t>& periods);

// The elements of an operand repeating every `period` elements that the
// block [base, base + len) of a chain over n elements reads (len from
// FusedBlock): `size` elements from `offset`, which the kernel repeats
// over the block. Its own elements when the operand is full size or the
// block lies within one repeat, else the whole repeat.
struct OperandSpan {
  std::size_t offset, size;
};
OperandSpan BlockOf(std::size_t period, std::size_t base, std::size_t len, std::size_t n);

}  // namespace neuron::runtime::detail
