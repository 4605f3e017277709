#include "tensor_buffers.h"

#include <cstring>

#include "neuron/collectives/reduce.h"
#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/error.h"

namespace neuron::c10d {

using collectives::DataType;
using collectives::ReduceOp;

std::optional<DataType> ToDataType(at::ScalarType type) {
  switch (type) {
#define NEURON_TORCH_DATA_TYPE(Id, bytes, floating, name, ir, Torch, Device) \
  case at::k##Torch:                                                      \
    return DataType::k##Id;
    NEURON_FORALL_DTYPES(NEURON_TORCH_DATA_TYPE)
#undef NEURON_TORCH_DATA_TYPE
    default:
      return std::nullopt;
  }
}

void CheckCpuTensors(const std::vector<at::Tensor>& tensors, const char* op) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    NEURON_CHECK(t.defined(), op, ": tensor ", i, " is undefined");
    NEURON_CHECK(t.device().is_cpu() || t.device().is_privateuseone(), op, ": tensor ", i,
                 " is on ", t.device().str(),
                 "; the neuron backend takes CPU and neuron tensors");
    NEURON_CHECK(t.layout() == at::kStrided, op, ": tensor ", i,
                 " is not a dense (strided) tensor; sparse tensors are taken by allreduce only");
  }
}

void CheckSingle(const std::vector<at::Tensor>& tensors, const char* op) {
  NEURON_CHECK(tensors.size() == 1, op, ": expects one tensor per process, got ",
               tensors.size());
  CheckCpuTensors(tensors, op);
}

void CheckSameType(const std::vector<at::Tensor>& tensors, at::ScalarType type,
                   const char* op) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    NEURON_CHECK(tensors[i].scalar_type() == type, op, ": tensor ", i, " has dtype ",
                 c10::toString(tensors[i].scalar_type()), " but the input has dtype ",
                 c10::toString(type));
  }
}

ReduceOp ToReduceOp(const ::c10d::ReduceOp& reduce_op, const char* op) {
  switch (reduce_op.op_) {
    case ::c10d::ReduceOp::SUM:
    case ::c10d::ReduceOp::PREMUL_SUM:
      return ReduceOp::kSum;
    case ::c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    case ::c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProduct;
    case ::c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case ::c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case ::c10d::ReduceOp::BAND:
      return ReduceOp::kBand;
    case ::c10d::ReduceOp::BOR:
      return ReduceOp::kBor;
    case ::c10d::ReduceOp::BXOR:
      return ReduceOp::kBxor;
    default:
      throw InvalidUsage(StrCat(op, ": reduce op ", static_cast<int>(reduce_op.op_),
                                " is not supported by the neuron backend"));
  }
}

std::optional<double> PreMulFactor(const ::c10d::ReduceOp& reduce_op, at::ScalarType dtype,
                                   const char* op) {
  if (reduce_op.op_ != ::c10d::ReduceOp::PREMUL_SUM) return std::nullopt;
  NEURON_CHECK(at::isFloatingType(dtype), op, ": PREMUL_SUM multiplies by a factor: it needs a "
               "floating-point dtype, got ", c10::toString(dtype));
  const auto* s =
      dynamic_cast<const ::c10d::PreMulSumSupplement*>(reduce_op.supplement_.get());
  NEURON_CHECK(s != nullptr, op, ": PREMUL_SUM without its factor (make it with "
               "torch.distributed._make_nccl_premul_sum)");
  if (!s->tensor_factor.defined()) return s->double_factor;
  NEURON_CHECK(s->tensor_factor.numel() == 1, op,
               ": PREMUL_SUM's factor must be one number or one one-element tensor");
  return s->tensor_factor.item<double>();
}

void Scale(void* data, std::size_t count, at::ScalarType dtype, double factor) {
  at::from_blob(data, {static_cast<std::int64_t>(count)}, at::TensorOptions(dtype))
      .mul_(factor);
}

DataType ReduceType(const at::Tensor& tensor, ReduceOp reduce_op, const char* op) {
  const auto type = ToDataType(tensor.scalar_type());
  NEURON_CHECK(type.has_value(), op, ": cannot reduce dtype ",
               c10::toString(tensor.scalar_type()), " (reduce op ",
               collectives::Name(reduce_op),
               "); the neuron backend reduces ", collectives::DataTypeNames());
  collectives::CheckReducible(*type, reduce_op, op);
  return *type;
}

Movement MovementOf(at::ScalarType type) {
  if (const auto known = ToDataType(type)) return {*known, 1};
  return {DataType::kUInt8, c10::elementSize(type)};
}

Output::Output(const at::Tensor& tensor)
    : tensor_(tensor), buffer_(tensor.contiguous()) {}

void Output::CopyBack() const {
  if (!buffer_.is_same(tensor_)) tensor_.copy_(buffer_);
}

std::size_t Bytes(const at::Tensor& tensor) {
  return static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
}

at::Tensor PackBytes(const std::vector<at::Tensor>& tensors) {
  std::size_t total = 0;
  for (const auto& t : tensors) total += Bytes(t);
  at::Tensor packed = at::empty({static_cast<int64_t>(total)}, at::kByte);
  auto* out = static_cast<char*>(packed.data_ptr());
  for (const auto& t : tensors) {
    const at::Tensor c = t.contiguous();
    if (Bytes(c) > 0) std::memcpy(out, c.data_ptr(), Bytes(c));
    out += Bytes(c);
  }
  return packed;
}

std::size_t UnpackBytes(const at::Tensor& packed, std::size_t offset,
                        const std::vector<at::Tensor>& tensors) {
  const auto* in = static_cast<const char*>(packed.data_ptr());
  for (const auto& t : tensors) {
    const Output out(t);
    if (Bytes(t) > 0) std::memcpy(out.data(), in + offset, Bytes(t));
    out.CopyBack();
    offset += Bytes(t);
  }
  return offset;
}

}  // namespace neuron::c10d
