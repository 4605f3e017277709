// Whole-file I/O shared by the components that persist state (executables,
// the compile cache, checkpoints, scaling-matrix results).
//
//   WriteFileAtomically(path, bytes);   // `path` is either absent or complete
//   std::string bytes = ReadFile(path, "checkpoint shard");
#pragma once

#include <cstdint>
#include <string>

namespace neuron::runtime {

// Writes `bytes` to a temporary file next to `path`, flushes it to disk
// and renames it over `path`, so readers see the old file or the whole new
// one, never a part. The temporary, PATH.tmp.<pid>.<16 random hex digits>,
// is created with O_CREAT | O_EXCL | O_NOFOLLOW: nothing planted under a
// guessed name is followed or overwritten. Throws IoError naming the file,
// also when `path` itself is a symbolic link (it is not replaced).
void WriteFileAtomically(const std::string& path, const std::string& bytes);

// Whether `name` (a file name, no directory) is a temporary that
// WriteFileAtomically leaves behind for `target` (also a file name) when the
// process dies mid-write.
bool IsTemporaryOf(const std::string& name, const std::string& target);

// The writer's pid in a temporary's name (NAME.tmp.<pid>[.<random>]), or
// -1 when `name` is not one.
long TemporaryWriterPid(const std::string& name);

// Opens `path` for writing (created 0644; `flags` adds O_TRUNC or
// O_APPEND) without following a symbolic link in its last component, and
// only if it is a regular file (a planted FIFO or device is refused too).
// Throws IoError "cannot write <what> <path>: ..." ("... is a symbolic link,
// not followed"). The caller closes the descriptor.
int OpenForWriting(const std::string& path, const char* what, int flags);

// Flushes `dir` itself to disk, so the renames done in it are durable.
// Throws IoError naming it.
void SyncDirectory(const std::string& dir);

// The whole of a regular file of at most `max_bytes`; throws IoError
// "cannot read <what> file <path>: <reason>" otherwise (a FIFO, a device
// such as /dev/zero, a directory, a larger file; with Links::kRefuse, a
// symbolic link: "... it is a symbolic link, not followed"). Never blocks
// on a FIFO.
inline constexpr std::uint64_t kMaxFileBytes = std::uint64_t{1} << 36;  // 64 GiB
enum class Links { kFollow, kRefuse };
std::string ReadFile(const std::string& path, const char* what,
                     std::uint64_t max_bytes = kMaxFileBytes, Links links = Links::kFollow);

}  // namespace neuron::runtime
