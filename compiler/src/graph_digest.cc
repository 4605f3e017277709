#include "neuron/compiler/graph_digest.h"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace neuron::compiler {
namespace {

std::string Hex(const unsigned char (&digest)[SHA256_DIGEST_LENGTH]) {
  static const char* hex = "0123456789abcdef";
  std::string out(2 * SHA256_DIGEST_LENGTH, '0');
  for (int i = 0; i < SHA256_DIGEST_LENGTH; ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 15];
  }
  return out;
}

// Feeds SHA-256 with fixed-width numbers and length-prefixed strings: an
// unambiguous encoding (a field's end is never guessed from its content).
// Bytes gather in a small buffer that is hashed whenever it fills, so the
// graph is never copied whole.
class Encoder {
 public:
  Encoder() : sha_(EVP_MD_CTX_new()) {
    if (sha_ != nullptr && EVP_DigestInit_ex(sha_, EVP_sha256(), nullptr) == 1) return;
    EVP_MD_CTX_free(sha_);  // the destructor does not run when this throws
    throw std::runtime_error("graph digest: cannot set up SHA-256 (OpenSSL)");
  }
  ~Encoder() { EVP_MD_CTX_free(sha_); }
  Encoder(const Encoder&) = delete;
  Encoder& operator=(const Encoder&) = delete;

  std::string Finish() {
    unsigned char digest[SHA256_DIGEST_LENGTH];
    if (EVP_DigestUpdate(sha_, buffer_, used_) != 1 ||
        EVP_DigestFinal_ex(sha_, digest, nullptr) != 1) {
      throw std::runtime_error("graph digest: SHA-256 failed (OpenSSL)");
    }
    return Hex(digest);
  }
  void Tag(char tag) { Raw(&tag, 1); }
  void Int(std::int64_t v) { Raw(&v, sizeof(v)); }
  void Size(std::size_t n) {
    const auto v = static_cast<std::uint32_t>(n);
    Raw(&v, sizeof(v));
  }
  void Double(double v) { Raw(&v, sizeof(v)); }
  void String(const std::string& s) {
    Size(s.size());
    Raw(s.data(), s.size());
  }
  void Ints(const google::protobuf::RepeatedField<std::int64_t>& values) {
    Size(values.size());
    Raw(values.data(), values.size() * sizeof(std::int64_t));
  }
  void Value(const proto::Value& v) {
    String(v.name());
    String(v.type().dtype());
    Ints(v.type().shape());
  }
  void Attribute(const proto::Attribute& a) {
    Int(a.value_case());
    switch (a.value_case()) {
      case proto::Attribute::kI:
        Int(a.i());
        break;
      case proto::Attribute::kF:
        Double(a.f());
        break;
      case proto::Attribute::kS:
        String(a.s());
        break;
      case proto::Attribute::kInts:
        Ints(a.ints().values());
        break;
      case proto::Attribute::VALUE_NOT_SET:
        break;
    }
  }
  void Node(const proto::Node& n) {
    String(n.op());
    Size(n.inputs_size());
    for (const auto& i : n.inputs()) String(i);
    Size(n.outputs_size());
    for (const auto& o : n.outputs()) Value(o);
    // A protobuf map has no order: encode by attribute name.
    attrs_.clear();
    for (const auto& entry : n.attrs()) attrs_.push_back(&entry);
    std::sort(attrs_.begin(), attrs_.end(),
              [](const auto* a, const auto* b) { return a->first < b->first; });
    Size(attrs_.size());
    for (const auto* entry : attrs_) {
      String(entry->first);
      Attribute(entry->second);
    }
  }

 private:
  void Raw(const void* data, std::size_t bytes) {
    if (used_ + bytes > sizeof(buffer_)) {
      Update(buffer_, used_);
      used_ = 0;
      if (bytes > sizeof(buffer_)) {
        Update(data, bytes);
        return;
      }
    }
    std::memcpy(buffer_ + used_, data, bytes);
    used_ += bytes;
  }

  void Update(const void* data, std::size_t bytes) {
    if (EVP_DigestUpdate(sha_, data, bytes) != 1) {
      throw std::runtime_error("graph digest: SHA-256 failed (OpenSSL)");
    }
  }

  EVP_MD_CTX* sha_;
  unsigned char buffer_[4096];
  std::size_t used_ = 0;
  std::vector<const google::protobuf::MapPair<std::string, proto::Attribute>*> attrs_;
};

}  // namespace

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return Hex(digest);
}

std::string GraphDigest(const proto::Graph& graph) {
  Encoder e;
  e.Tag('I');
  e.Size(graph.inputs_size());
  for (const auto& v : graph.inputs()) e.Value(v);
  e.Tag('C');
  e.Size(graph.constants_size());
  for (const auto& c : graph.constants()) {
    e.Value(c.value());
    e.String(Sha256Hex(c.data()));
  }
  e.Tag('N');
  e.Size(graph.nodes_size());
  for (const auto& n : graph.nodes()) e.Node(n);
  e.Tag('O');
  e.Size(graph.outputs_size());
  for (const auto& o : graph.outputs()) e.String(o);
  return e.Finish();
}

}  // namespace neuron::compiler
