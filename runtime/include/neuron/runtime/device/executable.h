// Loading, saving and validating executables (executable.proto), the
// contract between the compiler and the runtime.
//
// Usage:
//   proto::Executable exe = LoadExecutable(path);      // validated
//   ValidateExecutable(exe, DeviceSpec::Default());    // throws InvalidUsage
//   SaveExecutable(exe, path);                         // atomic: temp + rename
//
// Validation names the executable and the offending buffer or instruction:
// unknown format version, duplicate ids, a buffer outside its memory or
// overlapping another live one is the planner's business (not checked
// here), references to missing buffers, dependencies that are not earlier
// instructions (so every plan is acyclic and runs in list order), an op on
// the wrong engine, cost parameters out of range.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime {

constexpr unsigned kExecutableFormatVersion = 4;  // of executable.proto's messages
constexpr unsigned kExecutableFileVersion = 3;  // of the file around them (3: 4-lane sum)
// In a fused instruction's sub-op, the input that is the previous sub-op's result.
constexpr std::uint32_t kFusedPrevious = 0xffffffffu;

void ValidateExecutable(const proto::Executable& executable, const DeviceSpec& device);

// Reads a binary executable file; a truncated or corrupt file is an
// InvalidUsage naming the path, never a half-read plan.
proto::Executable LoadExecutable(const std::string& path, const DeviceSpec& device);
// The same, parsed into an arena the result owns (faster for the compile
// cache's disk hits).
std::shared_ptr<const proto::Executable> LoadExecutableShared(const std::string& path,
                                                              const DeviceSpec& device);
// Writes to `path` atomically (a temporary file renamed into place).
void SaveExecutable(const proto::Executable& executable, const std::string& path);

// The bytes SaveExecutable writes (the framed file), and their parse: for a
// caller that checks the bytes first (the compile cache authenticates
// them). `path` only names the file in messages; errors as LoadExecutable's.
std::string ExecutableFileBytes(const proto::Executable& executable);
std::shared_ptr<const proto::Executable> ParseExecutableShared(const std::string& bytes,
                                                               const std::string& path,
                                                               const DeviceSpec& device);

}  // namespace neuron::runtime
