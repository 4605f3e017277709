// Copies a run of a plan need not make on the host: the simulated DMAs
// between a plan's memories and the copy of each result out of them. A
// buffer placed where a copy would have put its bytes makes the copy a
// no-op (the DMA's source and destination are the same memory). Only the
// host's work changes: the plan, its timing and its results do not.
//
//   - A plan output gets its own block of memory, handed to the caller as
//     the result instead of copied out of the plan's memory.
//   - A store into such an output, its only writer, of a buffer not written
//     after it: that buffer lives in the output's block.
//   - A load of an input read where the caller holds it (ReadInPlace) into
//     a buffer nothing else writes: that buffer is the caller's memory.
//   - A copy of a matmul's result out of PSUM into SBUF, when nothing else
//     uses the result and nothing touches the target's bytes from the
//     first matmul on: the result lives in the target's memory.
//
// A buffer moves with its value group: the buffers whose bytes flow to or
// from it through the plan's memory (one writes bytes the other later
// reads, as the row tiles a matmul writes are read as one result). A group
// moves only when it lies within the buffer moved, so the value keeps its
// layout; buffers that reuse the same bytes at other times stay.
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime::detail {

struct MovedBuffer {
  std::uint32_t buffer = 0;
  // An output with its own block, an input read in place, or a copy's
  // target (which may itself be moved, earlier in Elisions::moved).
  std::uint32_t home = 0;
  std::uint64_t offset = 0;  // from home's first byte
};

struct Elisions {
  std::vector<std::uint32_t> own_outputs;  // each bound to one output name
  std::vector<MovedBuffer> moved;          // every own output is its own home, offset 0
};

// `direct`: the inputs read where the caller holds them (ReadInPlace).
Elisions PlanElisions(const proto::Executable& e,
                      const std::unordered_set<std::uint32_t>& direct);

}  // namespace neuron::runtime::detail
