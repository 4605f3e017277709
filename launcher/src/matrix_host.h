// What this host can run of a scaling matrix. A real cell's ranks are
// processes on this machine, each with its own Python and torch (about
// 230 MiB once imported), and a cell of n nodes forks n agents besides: a
// cell of more ranks than the host holds would exhaust it, so the matrix is
// refused before any job starts.
//
//   CheckHostCapacity(spec, DetectHostCapacity());   // or {N, "--max-host-ranks N"}
#pragma once

#include <cstdint>
#include <string>

#include "neuron/launcher/matrix.h"

namespace neuron::launcher {

// The memory a rank is counted at.
inline constexpr std::uint64_t kRankMemoryBytes = std::uint64_t{256} << 20;

struct HostCapacity {
  std::int64_t max_ranks = 1;  // real ranks of one cell, agents not counted
  std::string reason;          // why: "23 GiB of memory at 256 MiB a rank"
};

// The memory of this host (its cgroup's limit when lower) over
// kRankMemoryBytes, at least 1.
HostCapacity DetectHostCapacity();

// Throws InvalidUsage naming the matrix file, the first real cell of more
// ranks than `cap.max_ranks`, the cap, why, and how to change either.
void CheckHostCapacity(const MatrixSpec& spec, const HostCapacity& cap);

}  // namespace neuron::launcher
