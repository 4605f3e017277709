// A region's signature (runtime/aten adaptive_eager.h): 128 bits over what
// its IR text (region_ir.h) is made of, computed without writing the text,
// so the pricer finds a region met before without writing its IR.
//
// Usage:
//   RegionSignature s = SignatureOf(region);
//   if (s.valid) ... look it up ...
//
// Covered: each op (its OpInfo), each argument's kind, each tensor's
// memory (numbered in order of first use in the region), offset, shape,
// strides and dtype, each result's and whether its memory is still held,
// and the numbers the IR writes as attributes (exactly); the numbers it
// writes as f32[] inputs count only where the IR's form depends on them
// (an alpha or value of 1 writes no mul). Equal signatures mean equal IR
// text. A number of a kind the signature does not cover makes it invalid
// (the pricer then writes the text).
#pragma once

#include <cstdint>

#include "neuron/aten/adaptive_eager.h"

namespace neuron::python {

struct RegionSignature {
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  bool valid = true;
  bool operator==(const RegionSignature& o) const {
    return a == o.a && b == o.b && valid == o.valid;
  }
};

struct RegionSignatureHash {
  std::size_t operator()(const RegionSignature& s) const {
    return static_cast<std::size_t>(s.a ^ (s.b * 0x9E3779B97F4A7C15ull));
  }
};

RegionSignature SignatureOf(const aten::adaptive::Region& region);

}  // namespace neuron::python
