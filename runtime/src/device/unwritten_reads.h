// The bytes of a plan's memory that a run may read before anything in that
// run writes them: the executor zeroes only these, not whole arenas, and a
// result still never depends on an earlier run (fresh memory reads zero).
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime::detail {

struct ByteRange {
  int space = 0;  // proto::MemorySpace
  std::uint64_t begin = 0, end = 0;
};

// How many leading bytes of output `b` instruction `i` surely writes; -1:
// the kernel may leave some of the output's old bytes (it reads them, in
// effect). Each kernel's runner checks the sizes used here.
std::int64_t WrittenBytes(const proto::Instruction& i, const proto::Buffer& b);

// Walks the plan in order. Written: constants, the inputs copied into the
// plan's memory, and each instruction's outputs as far as its kernel
// surely writes them (WrittenBytes). Read: each instruction's inputs, the
// outputs of kernels that may keep some of their old bytes, and at the end
// the plan's outputs. Buffers in `elsewhere` are not in the plan's memory
// for this run (inputs read where the caller holds them, buffers an elided
// copy moved) and count for neither. Returns the read bytes no earlier
// write covered, merged.
std::vector<ByteRange> UnwrittenReads(const proto::Executable& e,
                                      const std::unordered_set<std::uint32_t>& elsewhere);

}  // namespace neuron::runtime::detail
