// Length-prefixed framing of protobuf messages on a stream socket:
// a 4-byte big-endian payload length, then the payload.
#pragma once

#include <cstdint>
#include <string>

#include <google/protobuf/message_lite.h>

namespace neuron::collectives::framing {

inline constexpr std::size_t kHeaderBytes = 4;

inline std::string Encode(const google::protobuf::MessageLite& message) {
  const std::string body = message.SerializeAsString();
  const auto n = static_cast<std::uint32_t>(body.size());
  std::string frame;
  frame.reserve(kHeaderBytes + body.size());
  frame.push_back(static_cast<char>((n >> 24) & 0xff));
  frame.push_back(static_cast<char>((n >> 16) & 0xff));
  frame.push_back(static_cast<char>((n >> 8) & 0xff));
  frame.push_back(static_cast<char>(n & 0xff));
  frame += body;
  return frame;
}

inline std::uint32_t DecodeLength(const unsigned char* header) {
  return (std::uint32_t{header[0]} << 24) | (std::uint32_t{header[1]} << 16) |
         (std::uint32_t{header[2]} << 8) | std::uint32_t{header[3]};
}

}  // namespace neuron::collectives::framing
