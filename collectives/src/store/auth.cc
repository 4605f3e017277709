#include "neuron/collectives/store/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "neuron/runtime/error.h"

namespace neuron::collectives::auth {

std::string RandomBytes(std::size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()),
                          static_cast<int>(n)) != 1) {
    throw IoError("cannot read random bytes from the OS (RAND_bytes failed)");
  }
  return out;
}

std::string Hex(const std::string& raw) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

std::string GenerateSecret() { return Hex(RandomBytes(32)); }

std::string Proof(const std::string& secret, const std::string& label,
                  const std::string& a, const std::string& b) {
  const std::string message = label + a + b;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  const unsigned char* ok =
      HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), digest, &length);
  NEURON_ASSERT(ok != nullptr, "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<char*>(digest), length);
}

void CheckSecret(const std::string& secret, const std::string& source) {
  NEURON_CHECK(secret.size() >= kMinSecretBytes, "the secret from ", source, " has ",
               secret.size(), " bytes; at least ", kMinSecretBytes,
               " are needed (generate one with: openssl rand -hex 32)");
  const bool blank = secret.find_first_not_of(std::string(" \t\r\n\v\f\0", 7)) ==
                     std::string::npos;
  NEURON_CHECK(!blank, "the secret from ", source,
               " is only whitespace or NUL bytes (generate one with: openssl rand -hex 32)");
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace neuron::collectives::auth
