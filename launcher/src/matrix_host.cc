#include "matrix_host.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "neuron/runtime/error.h"

namespace neuron::launcher {

namespace {

// The cgroup v2 memory limit of this process, 0 when there is none.
std::uint64_t CgroupMemoryLimit() {
  std::ifstream in("/sys/fs/cgroup/memory.max");
  std::string text;
  if (!(in >> text) || text.empty() ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return 0;  // "max", or no cgroup v2
  }
  return std::stoull(text);
}

}  // namespace

HostCapacity DetectHostCapacity() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  std::uint64_t memory = pages > 0 && page > 0
                             ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
                             : 0;
  const std::uint64_t limit = CgroupMemoryLimit();
  if (limit > 0 && (memory == 0 || limit < memory)) memory = limit;
  HostCapacity cap;
  cap.max_ranks = std::max<std::int64_t>(1, static_cast<std::int64_t>(memory / kRankMemoryBytes));
  cap.reason = StrCat(memory >> 20, " MiB of memory at ", kRankMemoryBytes >> 20,
                      " MiB a rank");
  return cap;
}

void CheckHostCapacity(const MatrixSpec& spec, const HostCapacity& cap) {
  for (const MatrixCell& c : spec.cells) {
    if (c.modelled || c.world() <= cap.max_ranks) continue;
    throw InvalidUsage(StrCat(
        spec.path, ": cell ", c.id, " runs ", c.world(), " real ranks (", c.nodes,
        " nodes x ", c.ranks_per_node, " ranks per node, within max_real_ranks ",
        spec.matrix.max_real_ranks(), "), more than the ", cap.max_ranks,
        " this host runs at once (", cap.reason, "); lower max_real_ranks so that it is "
        "modelled, or raise the cap with neuronrun matrix --max-host-ranks N"));
  }
}

}  // namespace neuron::launcher
