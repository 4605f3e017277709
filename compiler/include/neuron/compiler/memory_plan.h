// Memory planning: offsets for the values of a straight-line program so
// that values alive at the same time never overlap, reusing memory
// otherwise.
//
// Usage:
//   std::vector<Interval> values = {{"a", 4096, 0, 3}, {"b", 1024, 1, 2}};
//   MemoryPlan plan = PlanMemory(values, /*capacity=*/28 << 20, /*alignment=*/64);
//   plan.offsets.at("a");  plan.planned_bytes;  plan.lower_bound_bytes;
//
// Greedy by size (the "greedy-by-size offset assignment" of the memory
// planning literature): values sorted by decreasing size (then first use),
// each placed at the lowest aligned offset where it overlaps no placed
// value whose lifetime overlaps its own. The lower bound is the largest
// total of bytes alive at once; no reuse would need the sum of all sizes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace neuron::compiler {

struct Interval {
  std::string name;
  std::uint64_t bytes = 0;
  int first = 0;  // the instruction that defines it
  int last = 0;   // the last instruction that reads it (>= first)
};

struct MemoryPlan {
  std::map<std::string, std::uint64_t> offsets;
  std::uint64_t planned_bytes = 0;      // highest end of any placed value
  std::uint64_t lower_bound_bytes = 0;  // peak bytes alive at once
  std::uint64_t no_reuse_bytes = 0;     // sum of the (aligned) sizes
};

// Throws InvalidUsage naming the value that does not fit in `capacity`.
MemoryPlan PlanMemory(const std::vector<Interval>& values, std::uint64_t capacity,
                      std::uint64_t alignment, const std::string& memory_name = "SBUF");

}  // namespace neuron::compiler
