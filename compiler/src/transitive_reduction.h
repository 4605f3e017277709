// Transitive reduction of a plan's dependencies, built instruction by
// instruction in plan order.
//
// Lowering finds every earlier instruction an instruction conflicts with
// (read-after-write, write-after-write, write-after-read on overlapping
// bytes): with memory reuse, dozens per instruction, most implied by others.
// Direct() keeps only the dependencies no other kept one already implies:
// the same partial order, so the same schedule and modelled times, but a
// plan a fraction of the size to store, load and time.
//
//   TransitiveReduction r;
//   for each instruction s in order: deps(s) = r.Direct(conflicts(s));
#pragma once

#include <cstdint>
#include <vector>

namespace neuron::compiler {

class TransitiveReduction {
 public:
  // `earlier`: ids of earlier instructions (each below the number of
  // Direct() calls so far; duplicates allowed) that this one, the next in
  // plan order, must follow. Returns the direct ones, ascending.
  std::vector<std::uint32_t> Direct(std::vector<std::uint32_t> earlier);

 private:
  // reach_[s]: bitset of every instruction s follows, directly or not.
  std::vector<std::vector<std::uint64_t>> reach_;
};

}  // namespace neuron::compiler
