// Runs an executable on the simulated NeuronCore: real results computed on
// the CPU, and the modelled time of the same plan (plan_timing.h).
//
// Usage:
//   Executor exec(DeviceSpec::Default(), &memory);           // counters optional
//   ExecutionResult r = exec.Run(exe, {{"x", HostTensor::FromFloats(proto::F32, {4, 8},
//   xs)}}); const HostTensor& y = r.outputs.at("y"); double us = r.timing.total.count();
//
// Semantics of the instructions (list order is a valid order: dependencies
// point backwards):
//   DMA (any op name)     copies `bytes` from input 0 to output 0, raw bytes.
//   TENSOR "matmul"       output[M,N] (float32) = or += (accumulate)
//                         input0[M,K] x input1[K,N], inputs float32/bfloat16/
//                         float16, row-major, accumulating in float32; with
//                         `batch` B > 0, B such products of [B,M,K] x [B,K,N].
//   VECTOR "strided_copy" any dtype, raw elements: the view of input 0 given
//                         by view_sizes, in_strides and in_offset into output 0
//                         (contiguous, or at out_strides and out_offset, the
//                         rest of output 0 untouched: permute, transpose,
//                         select, expand, slicing, stacking).
//   VECTOR "fill"         no inputs: every element of output 0 (any dtype)
//                         set to `scalar`.
//   VECTOR/SCALAR "fused"  a chain of the elementwise ops below (`fused`),
//                         each reading inputs or the previous result, in
//                         float32, rounded once into output 0.
//   GPSIMD "dropout"      input 0 x (float), input 1 the run's seed (int64):
//                         output 0 = x / (1 - scalar) where kept, else 0;
//                         output 1 the mask (bool); element e is kept when a
//                         SplitMix64 hash of (seed, k, e) is >= scalar.
//   GPSIMD "masked_scale" (grad, mask) -> grad x scalar where the mask is set.
//   GPSIMD "bernoulli"    (any, seed) -> 1 where the hash of (seed, k, e) is
//                         below scalar, else 0.
//   GPSIMD "im2col", "col2im", "maxpool2d", "maxpool2d_backward": 2-D
//                         windows (geometry in view_sizes: N, C, H, W, KH,
//                         KW, stride, padding, dilation (h, w each), OH, OW):
//                         x [N,C,H,W] to the convolution's columns [N*OH*OW,
//                         C*KH*KW] (0 in the padding) and their sum back;
//                         the window maxima and their flat indices (int64),
//                         and the gradient summed at those indices.
//   VECTOR "compare_eq|ne|lt|le|gt|ge"  float operands (the second
//                         repeating, or `scalar` alone) -> bool; "where"
//                         (bool cond, a, b) -> a where set, else b.
//   GPSIMD "iota"         no inputs: output 0 element e = scalar + e * step.
//   GPSIMD "gather_rows"  input 0 a table [k, n], input 1 m indices (int32 or
//                         int64): output 0 [m, n] = the rows, raw elements.
//   GPSIMD "scatter_add_rows"  input 0 [m, n] (float), input 1 m indices:
//                         output 0 [k, n] = the sum of the rows at each
//                         index (in index order), float32-accumulated; the
//                         rows of index `scalar` (>= 0) skipped.
//   VECTOR/SCALAR/GPSIMD  `elements` of output 0 from the inputs, computed
//                         in float32 and rounded once to the output dtype:
//     unary   copy relu neg abs sign exp sqrt rsqrt tanh sigmoid gelu (tanh
//             approximation as torch's approximate="tanh"), gelu_exact (erf), scale
//             (x * scalar), add_scalar, clamp_min (max(x, scalar)),
//             clamp_max (min(x, scalar)); as torch.clamp, a NaN input
//             stays NaN and a NaN bound gives NaN;
//     binary  add sub mul div max min, masked_fill (scalar where input 1, a
//             bool/uint8 mask, is non-zero, else input 0), threshold_backward (input 0
//             where input 1 > scalar, else 0), tanh_backward and sigmoid_backward (grad,
//             output), gelu_backward and gelu_exact_backward (grad, input); input 1 may
//             be shorter than `elements` (it repeats: a bias row broadcast over rows);
//     shaped  over [m, n] inputs, row by row: transpose (writes [n, m]),
//             sum_rows (writes [n]), softmax_rows, log_softmax_rows and
//             their _backward_rows (grad, output); layer_norm_rows (x,
//             weight, bias -> y, mean, rstd; epsilon in `scalar`) and
//             layer_norm_backward_rows (grad, x, mean, rstd, weight ->
//             grad x, grad weight, grad bias).
//     scan    along the middle dimension of [m, n, k] (n the scanned one):
//             cumsum (float; summed in order, in double for an F32
//             result and float otherwise, rounded after each add, as
//             ATen's CPU cumsum) and reverse (any dtype, bitwise:
//             element t of the scanned dimension from n - 1 - t).
// Each error names the executable, the instruction and what is wrong; a
// failed run leaves no outputs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/device/host_bytes.h"
#include "neuron/runtime/device/memory_counters.h"
#include "neuron/runtime/device/plan_timing.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime {

// The size of one element of `type` (dtype_list.h); 0 for none.
std::size_t ElementBytes(proto::ElementType type);

struct HostTensor {
  proto::ElementType dtype = proto::F32;
  std::vector<std::int64_t> shape;
  HostBytes data;  // unset until written: see host_bytes.h

  static HostTensor FromFloats(proto::ElementType dtype, std::vector<std::int64_t> shape,
                               const std::vector<float>& values);
  std::vector<float> ToFloats() const;
  std::int64_t elements() const;
};

// An input's bytes where the caller holds them (a HostTensor's, a torch
// tensor's storage), read by the run and never written; they must stay
// valid until Compute returns.
struct HostView {
  proto::ElementType dtype = proto::F32;
  const std::uint8_t* data = nullptr;
  std::size_t bytes = 0;

  static HostView Of(const HostTensor& t) {
    return {t.dtype, t.data.data(), t.data.size()};
  }
};

namespace detail {
struct PlanFacts;  // executor.cc
}  // namespace detail

// What every run of a plan needs worked out from the plan alone (its
// memory extents, the inputs read in place, the copies elided, the bytes
// read before written), made once by Executor::Prepare. Refers to the
// executable, which must outlive it.
class PreparedPlan {
 public:
  const proto::Executable& executable() const { return *executable_; }

 private:
  friend class Executor;
  const proto::Executable* executable_ = nullptr;
  std::shared_ptr<const detail::PlanFacts> facts_;
};

struct ExecutionResult {
  std::map<std::string, HostTensor> outputs;
  PlanTiming timing;
};

class Executor {
 public:
  explicit Executor(DeviceSpec device, MemoryCounters* memory = nullptr);
  // Validates the executable, computes its outputs and its modelled
  // timeline.
  ExecutionResult Run(const proto::Executable& executable,
                      const std::map<std::string, HostTensor>& inputs);
  // Only the outputs, for an executable already validated against this
  // device (its timeline does not depend on the inputs: TimePlan once).
  std::map<std::string, HostTensor> Compute(const proto::Executable& executable,
                                            const std::map<std::string, HostTensor>& inputs);
  // The same over views of the inputs: no copy of them is made before the
  // run.
  std::map<std::string, HostTensor> Compute(
      const proto::Executable& executable, const std::map<std::string, HostView>& inputs);
  // For a plan run many times: its analysis made once, then each run.
  static PreparedPlan Prepare(const proto::Executable& executable);
  std::map<std::string, HostTensor> Compute(
      const PreparedPlan& plan, const std::map<std::string, HostView>& inputs);
  const DeviceSpec& device() const { return device_; }
  const CostModel& model() const { return model_; }

 private:
  DeviceSpec device_;
  CostModel model_;
  MemoryCounters* memory_;
};

}  // namespace neuron::runtime
