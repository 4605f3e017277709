// Tensors as the collectives see them: element types, reduce ops, checks,
// and contiguous staging buffers.
//
// Usage:
//   CheckCpuTensors(tensors, "allreduce");
//   DataType dtype = ReduceType(t, op, "allreduce");  // throws naming op and dtype
//   Output out(t);                // out.data() is contiguous; t may not be
//   ... write out.data() ...
//   out.CopyBack();               // on the progress thread, after the op
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "neuron/collectives/dtype.h"

namespace neuron::c10d {

// The collectives' type for `type`, if it has one.
std::optional<collectives::DataType> ToDataType(at::ScalarType type);

// Throws InvalidUsage unless every tensor is a dense tensor in host memory:
// on the CPU, or on the "neuron" device (PrivateUse1), whose memory is the host's.
void CheckCpuTensors(const std::vector<at::Tensor>& tensors, const char* op);
// Throws InvalidUsage unless `tensors` has exactly one tensor.
void CheckSingle(const std::vector<at::Tensor>& tensors, const char* op);
// Throws InvalidUsage unless every tensor has `type`.
void CheckSameType(const std::vector<at::Tensor>& tensors, at::ScalarType type,
                   const char* op);

// The reduce op; PREMUL_SUM is a SUM of the inputs multiplied by
// PreMulFactor first.
collectives::ReduceOp ToReduceOp(const ::c10d::ReduceOp& reduce_op, const char* op);
// PREMUL_SUM's factor (dist._make_nccl_premul_sum: a number, or a one-element
// tensor), nullopt for other ops. InvalidUsage naming `op` for a factor that
// is missing or not one element, or a `dtype` that is not floating point.
std::optional<double> PreMulFactor(const ::c10d::ReduceOp& reduce_op, at::ScalarType dtype,
                                   const char* op);
// Multiplies `count` elements of `dtype` at `data` by `factor` in place.
void Scale(void* data, std::size_t count, at::ScalarType dtype, double factor);
// The element type of a reduction over `tensor`; throws InvalidUsage naming
// the op, dtype and reduce op when the pair cannot be reduced.
collectives::DataType ReduceType(const at::Tensor& tensor,
                                 collectives::ReduceOp reduce_op, const char* op);

// How a data-movement op moves `type`: as itself when the collectives know
// it, else as raw bytes (count scaled by the element size).
struct Movement {
  collectives::DataType dtype;
  std::size_t scale;  // elements of `dtype` per tensor element
};
Movement MovementOf(at::ScalarType type);

// A tensor written (or read and written) by an operation, with a contiguous
// buffer holding its contents: the tensor itself, or a contiguous copy.
class Output {
 public:
  Output() = default;
  explicit Output(const at::Tensor& tensor);
  void* data() const { return buffer_.data_ptr(); }
  const at::Tensor& buffer() const { return buffer_; }
  // Copies the buffer into the tensor when they differ.
  void CopyBack() const;

 private:
  at::Tensor tensor_;
  at::Tensor buffer_;
};

// Byte sizes of tensors, and packing into / out of one contiguous buffer.
std::size_t Bytes(const at::Tensor& tensor);
// Concatenates the tensors' bytes (in order) into a new uint8 tensor.
at::Tensor PackBytes(const std::vector<at::Tensor>& tensors);
// Copies consecutive slices of `packed` (starting at byte `offset`) into
// each tensor; returns the offset after the last.
std::size_t UnpackBytes(const at::Tensor& packed, std::size_t offset,
                        const std::vector<at::Tensor>& tensors);

}  // namespace neuron::c10d
