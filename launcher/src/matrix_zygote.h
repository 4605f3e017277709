// The scaling matrix's one zygote (zygote.h, shared): every cell's Python
// ranks fork from a single interpreter that imported what the trainers use,
// so a cell pays for forking its ranks, not for a zygote's imports (2-3 s
// of CPU a cell with torch, Dynamo, FSDP2, tensor parallelism and
// pipelining).
//
// What the imports read from the environment stays in every rank forked
// from there: torchneuron's devices come from the topology at import. The
// zygote imports with the matrix's environment as a rank of a cell without
// a topology of its own sees it; a cell's neuronrun whose ranks would see
// other settings (its --topology) starts a zygote of its own (zygote.h,
// Refusal).
//
// Usage:
//   MatrixZygote zygote;                // nothing started yet
//   int fd = zygote.Connect(progress);  // per agent: NEURON_ZYGOTE_FD, or -1
//
// Owned by the matrix's thread; not thread-safe.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "zygote.h"

namespace neuron::launcher {

class MatrixZygote {
 public:
  // The modules: SharedZygoteModules() (none: no zygote). Throws
  // InvalidUsage naming a bad module name.
  MatrixZygote();

  // A new connection for one agent of a cell (close-on-exec; the caller
  // closes it once passed on), or -1: no modules, or NEURON_ZYGOTE names a
  // zygote for the cells' jobs already (`neuronrun zygote -- neuronrun
  // matrix ...`); the cell's neuronrun then uses that one or starts its own. Starts the zygote at the first call, with this process's
  // environment as a rank's interpreter sees it (InterpreterEnvironment); a
  // zygote that cannot start, or is gone, is said once on `progress`.
  int Connect(std::ostream& progress);

 private:
  std::vector<std::string> modules_;
  std::unique_ptr<Zygote> zygote_;
  bool failed_ = false;
};

}  // namespace neuron::launcher
