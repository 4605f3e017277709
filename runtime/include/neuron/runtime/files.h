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

// Whether `name` (a file name, no directory) is a temporary that
// WriteFileAtomically leaves behind for `target` (also a file name) when the
// process dies mid-write.
bool IsTemporaryOf(const std::string& name, const std::string& target);

// Flushes `dir` itself to disk, so the renames done in it are durable.
// Throws IoError naming it.
void SyncDirectory(const std::string& dir);

// The whole file; throws IoError "cannot read <what> file <path>: <reason>".
std::string ReadFile(const std::string& path, const char* what);

}  // namespace neuron::runtime
