// FNV-1a, 64 bits: a fast, non-cryptographic fingerprint of bytes (file
// checksums, call fingerprints). Not for keys that must resist collisions
// on purpose (the compile cache uses SHA-256).
//
// Usage:
//   std::uint64_t h = Fnv1a(payload.data(), payload.size());
#pragma once

#include <cstddef>
#include <cstdint>

namespace neuron::runtime {

inline std::uint64_t Fnv1a(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace neuron::runtime
