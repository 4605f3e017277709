// The float operands and results the executor's kernel families share: a
// buffer read as float32 (in place when it holds float32, else converted),
// a shorter operand that repeats (a bias) or a BOOL/U8 mask as 0/1, and a
// float32 result written in place or converted into its buffer's dtype
// (F32, BF16 or F16) at the end.
//
//   FloatIn a = FloatOperandIn(in[0], n, what);
//   FloatOut y(out[0], n, {a});
//   kernels::Unary(op, a.data, n, scalar, y.data());
//   y.Finish();
#pragma once

#include <cstddef>
#include <vector>

#include "exec_kernels.h"
#include "kernels.h"
#include "neuron/runtime/device/host_bytes.h"

namespace neuron::runtime::detail {

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes);

// A float operand of an op over `n` elements: all of them, or fewer that
// repeat (a bias); with `mask`, a BOOL or U8 mask as 1 where set, else 0.
// InvalidUsage names the buffer otherwise.
std::vector<float> FloatOperand(const Placed& p, std::size_t n, const What& what,
                                bool mask = false);

// A float operand read in place: the buffer's own memory when it holds
// float32, else a float32 copy. Moving keeps `data` valid.
struct FloatIn {
  const float* data = nullptr;
  std::size_t size = 0;
  std::vector<float> copy;
};

// FloatOperand's elements, without a copy when they are float32 already.
FloatIn FloatOperandIn(const Placed& p, std::size_t n, const What& what,
                       bool mask = false);

// An op's float output of `n` elements: the buffer's own memory when it
// holds float32 and overlaps none of `reads`, else a float32 result that
// Finish() converts into it.
class FloatOut {
 public:
  FloatOut(const Placed& p, std::size_t n, const std::vector<FloatIn>& reads)
      : placed_(p), direct_(p.buffer->dtype() == proto::F32) {
    for (const FloatIn& r : reads) {
      direct_ =
          direct_ && !Overlap(r.data, r.size * sizeof(float), p.data, n * sizeof(float));
    }
    if (!direct_) result_.resize(n);
  }
  float* data() {
    return direct_ ? reinterpret_cast<float*>(placed_.data) : result_.data();
  }
  void Finish() {
    if (!direct_)
      kernels::FromFloat(result_.data(), result_.size(), placed_.buffer->dtype(),
                         placed_.data);
  }

 private:
  const Placed& placed_;
  bool direct_;
  std::vector<float, UninitializedAllocator<float>> result_;  // every element is written
};

}  // namespace neuron::runtime::detail
