// The bytes of a plan's memory that a run may read before anything in that
// run writes them: the executor zeroes only these, not whole arenas nor the
// outputs' own blocks, and a result still never depends on an earlier run
// or on what a new block held (fresh memory reads zero).
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_set>
#include <vector>

#include "elided_copies.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime::detail {

struct ByteRange {
  int space = 0;  // proto::MemorySpace of the arena, when block < 0
  std::uint64_t begin = 0, end = 0;
  std::int64_t block = -1;  // else: in the own block of this output buffer
};

// How many leading bytes of output `b` instruction `i` surely writes; -1:
// the kernel may leave some of the output's old bytes (it reads them, in
// effect). Each kernel's runner checks the sizes used here.
std::int64_t WrittenBytes(const proto::Instruction& i, const proto::Buffer& b);

// The byte runs [begin, end) of its output that a strided copy writing at
// output strides or an offset writes (one per contiguous run of elements,
// in element order), each handed to `run`; false, handing none, when they
// would be over a million or a stride is negative.
bool StridedWrites(const proto::Instruction& i, const proto::Buffer& b,
                   const std::function<void(std::uint64_t, std::uint64_t)>& run);

// Walks the plan in order. Written: constants, the inputs copied into the
// plan's memory, and each instruction's outputs as far as its kernel
// surely writes them (WrittenBytes; a strided copy's runs, StridedWrites). Read: each
// instruction's inputs, the outputs of kernels that may keep some of their old bytes, and
// at the end the plan's outputs. Each buffer counts where this run places it: inputs read
// where the caller holds them (`direct`) and what an elided copy moved into one count for
// neither; a moved buffer counts in its home's memory (an output's own block, or another
// buffer's place), at its offset. Returns the read bytes no earlier write covered,
// merged.
std::vector<ByteRange> UnwrittenReads(const proto::Executable& e,
                                      const std::unordered_set<std::uint32_t>& direct,
                                      const Elisions& elided);

}  // namespace neuron::runtime::detail
