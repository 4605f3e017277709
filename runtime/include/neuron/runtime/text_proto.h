// Parsing protobuf text files (topologies, device specs) with errors that
// name the file, line and column.
//
// Usage:
//   proto::DeviceSpec spec;
//   ParseTextProto(text, "configs/devices/x.textproto", "device spec", &spec);
#pragma once

#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <cstdint>
#include <string>

namespace neuron::runtime {

// Throws InvalidUsage "<what> <origin>: line L, column C: <message>" on the
// first parse error. With `locations`, records where each field was (for
// later errors that name a line).
void ParseTextProto(const std::string& text, const std::string& origin, const char* what,
                    google::protobuf::Message* out,
                    google::protobuf::TextFormat::ParseInfoTree* locations = nullptr);

// The whole file; throws InvalidUsage "cannot read <what> file <path>".
inline constexpr std::uint64_t kMaxTextFileBytes = 16 << 20;  // 16 MiB
std::string ReadTextFile(const std::string& path, const char* what);

}  // namespace neuron::runtime
