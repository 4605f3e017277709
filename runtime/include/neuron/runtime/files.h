// Whole-file I/O shared by the components that persist state (executables,
// the compile cache, checkpoints, scaling-matrix results).
//
//   WriteFileAtomically(path, bytes);   // `path` is either absent or complete
//   std::string bytes = ReadFile(path, "checkpoint shard");
#pragma once

#include <string>

namespace neuron::runtime {

// Writes `bytes` to a temporary file next to `path`, flushes it to disk
// and renames it over `path`, so readers see the old file or the whole new
// one, never a part. Throws IoError naming the file.
void WriteFileAtomically(const std::string& path, const std::string& bytes);

// The whole file; throws IoError "cannot read <what> file <path>: <reason>".
std::string ReadFile(const std::string& path, const char* what);

}  // namespace neuron::runtime
