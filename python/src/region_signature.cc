#include "region_signature.h"

#include <cstring>
#include <unordered_map>

namespace neuron::python {
namespace {

namespace ad = aten::adaptive;

// Two independent 64-bit hashes: FNV-1a and a splitmix64 chain.
class Hasher {
 public:
  void Add(std::uint64_t v) {
    a_ = (a_ ^ v) * 1099511628211ull;
    b_ = Mix(b_ + v + 0x9E3779B97F4A7C15ull);
  }
  void AddDouble(double d) {
    std::uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    Add(bits);
  }
  RegionSignature Done(bool valid) const { return {a_, b_, valid}; }

 private:
  static std::uint64_t Mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t a_ = 1469598103934665603ull;
  std::uint64_t b_ = 0;
};

class Signer {
 public:
  void Op(const ad::QueuedOp& op);
  RegionSignature Done() const { return h_.Done(valid_); }

 private:
  void Tensor(const ad::TensorRef& t);
  void Value(const c10::IValue& v);
  // Whether argument `i` of `op` is a number the IR writes as an f32[]
  // input (region_ir.cc WriteOut, ScaledAdd): then only whether it is 1
  // shapes the IR.
  static bool Lifted(const ad::QueuedOp& op, std::size_t i);

  Hasher h_;
  bool valid_ = true;
  std::unordered_map<const void*, std::uint64_t> memory_;  // storage -> first-use number
};

void Signer::Tensor(const ad::TensorRef& t) {
  std::uint64_t memory = 0;
  if (t.key != nullptr) {
    memory = memory_.emplace(t.key, memory_.size() + 1).first->second;
  }
  h_.Add(memory);
  h_.Add(t.defined);
  h_.Add(static_cast<std::uint64_t>(t.offset));
  h_.Add(static_cast<std::uint64_t>(t.dtype));
  h_.Add(t.sizes.size());
  for (auto d : t.sizes) h_.Add(static_cast<std::uint64_t>(d));
  for (auto d : t.strides) h_.Add(static_cast<std::uint64_t>(d));
}

void Signer::Value(const c10::IValue& v) {
  if (v.isInt()) {
    h_.Add(1);
    h_.Add(static_cast<std::uint64_t>(v.toInt()));
  } else if (v.isDouble()) {
    h_.Add(2);
    h_.AddDouble(v.toDouble());
  } else if (v.isBool()) {
    h_.Add(3);
    h_.Add(v.toBool());
  } else if (v.isString()) {
    h_.Add(4);  // each variable-length value with its length: no two runs of
                // words split into arguments differently hash alike
    h_.Add(v.toStringRef().size());
    for (char c : v.toStringRef()) h_.Add(static_cast<unsigned char>(c));
  } else if (v.isIntList()) {
    h_.Add(5);
    const auto list = v.toIntVector();
    h_.Add(list.size());
    for (auto x : list) h_.Add(static_cast<std::uint64_t>(x));
  } else if (v.isBoolList()) {
    h_.Add(6);
    const auto list = v.toBoolList();
    h_.Add(list.size());
    for (bool x : list) h_.Add(x);
  } else if (v.isDevice()) {
    h_.Add(7);  // implied: every IR value is on the device
  } else {
    valid_ = false;
  }
}

bool Signer::Lifted(const ad::QueuedOp& op, std::size_t i) {
  const std::string& base = op.info->base;
  if ((base == "addcmul" || base == "addcdiv") && i == 3) return true;
  if (base == "lerp" && i == 2) return true;
  return (base == "add" || base == "sub") && i == 2 && op.results.size() == 1;
}

void Signer::Op(const ad::QueuedOp& op) {
  h_.Add(reinterpret_cast<std::uintptr_t>(op.info));
  h_.Add(op.arguments.size());
  for (std::size_t i = 0; i < op.arguments.size(); ++i) {
    const ad::Argument& a = op.arguments[i];
    h_.Add(static_cast<std::uint64_t>(a.kind));
    if (a.kind != ad::Argument::Kind::kValue) {
      h_.Add(a.tensors.size());
      for (const ad::TensorRef& t : a.tensors) Tensor(t);
    } else if (Lifted(op, i) && a.value.isScalar()) {
      h_.Add(a.value.toScalar().toDouble() != 1.0);
    } else {
      Value(a.value);
    }
  }
  h_.Add(op.results.size());
  for (const ad::TensorRef& r : op.results) {
    Tensor(r);
    h_.Add(r.held);
  }
}

}  // namespace

RegionSignature SignatureOf(const ad::Region& region) {
  Signer s;
  for (const ad::QueuedOp& op : region.ops) s.Op(op);
  return s.Done();
}

}  // namespace neuron::python
