// Job secrets and the HMAC-SHA256 proofs the TCP store handshake exchanges.
// A secret authenticates a client without crossing the wire: each side
// proves it holds the secret by an HMAC over fresh nonces of both sides.
#pragma once

#include <string>

namespace neuron::collectives::auth {

// 32 random bytes from the OS, as 64 lowercase hex digits.
std::string GenerateSecret();
// `raw` as lowercase hex digits, two per byte.
std::string Hex(const std::string& raw);
// `n` random bytes from the OS.
std::string RandomBytes(std::size_t n);
// HMAC-SHA256(secret, label | a | b), 32 raw bytes.
std::string Proof(const std::string& secret, const std::string& label,
                  const std::string& a, const std::string& b);
// Compares in time independent of where the inputs differ.
bool ConstantTimeEqual(const std::string& a, const std::string& b);

// The shortest secret a job accepts, in bytes (a generated one has 64).
inline constexpr std::size_t kMinSecretBytes = 16;
// Throws InvalidUsage naming `source` (e.g. "$NEURON_RDZV_SECRET") when the
// secret is shorter than kMinSecretBytes or has no byte other than
// whitespace and NUL: such a secret is guessed, not shared.
void CheckSecret(const std::string& secret, const std::string& source);

inline constexpr char kClientLabel[] = "neuron-store-client";
inline constexpr char kServerLabel[] = "neuron-store-server";
inline constexpr std::size_t kNonceBytes = 32;

}  // namespace neuron::collectives::auth
