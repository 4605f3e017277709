#include "neuron/parallel/pipeline_p2p.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {

constexpr std::int64_t kMagic = 0x5049504531;  // "PIPE1"
constexpr int kMaxDims = 8;
constexpr int kHeader = 6 + kMaxDims;  // magic, gradient, microbatch, stage, dtype, ndim, dims

int Tag(const StageMessage& m) {
  NEURON_CHECK(m.microbatch >= 0 && m.microbatch < (1 << 19) && m.virtual_stage >= 0 &&
                   m.virtual_stage < 1024,
               "pipeline: microbatch ", m.microbatch, " or virtual stage ", m.virtual_stage,
               " out of range");
  return ((m.microbatch * 1024 + m.virtual_stage) * 2 + (m.gradient ? 1 : 0)) * 2;
}

std::string Describe(const StageMessage& m) {
  return StrCat(m.gradient ? "the gradient" : "the activation", " of microbatch ", m.microbatch,
                " for virtual stage ", m.virtual_stage);
}

}  // namespace

std::vector<c10::intrusive_ptr<::c10d::Work>> SendStageTensor(::c10d::ProcessGroup& group,
                                                              int dst, const at::Tensor& tensor,
                                                              StageMessage message) {
  NEURON_CHECK(tensor.dim() <= kMaxDims, "pipeline: ", Describe(message), " has ",
               tensor.dim(), " dims; at most ", kMaxDims, " are supported");
  at::Tensor header = at::zeros({kHeader}, at::kLong);
  auto* h = header.data_ptr<std::int64_t>();
  h[0] = kMagic;
  h[1] = message.gradient;
  h[2] = message.microbatch;
  h[3] = message.virtual_stage;
  h[4] = static_cast<std::int64_t>(tensor.scalar_type());
  h[5] = tensor.dim();
  for (int d = 0; d < tensor.dim(); ++d) h[6 + d] = tensor.size(d);
  const int tag = Tag(message);
  std::vector<at::Tensor> head{header}, body{tensor.detach().contiguous()};
  return {group.send(head, dst, tag), group.send(body, dst, tag + 1)};
}

at::Tensor RecvStageTensor(::c10d::ProcessGroup& group, int src, StageMessage expected,
                           const std::optional<at::Tensor>& expected_like) {
  const int tag = Tag(expected);
  std::vector<at::Tensor> head{at::empty({kHeader}, at::kLong)};
  group.recv(head, src, tag)->wait();
  const auto* h = head[0].data_ptr<std::int64_t>();
  const std::string where = StrCat("pipeline: rank ", group.getRank(), " receiving ",
                                   Describe(expected), " from rank ", src);
  NEURON_CHECK(h[0] == kMagic && h[1] == expected.gradient && h[2] == expected.microbatch &&
                   h[3] == expected.virtual_stage,
               where, ": got a different message (gradient ", h[1], ", microbatch ", h[2],
               ", virtual stage ", h[3], ")");
  NEURON_CHECK(h[5] >= 0 && h[5] <= kMaxDims && h[4] >= 0 &&
                   h[4] < static_cast<std::int64_t>(at::ScalarType::NumOptions),
               where, ": corrupt header");
  std::vector<std::int64_t> shape(h + 6, h + 6 + h[5]);
  const auto dtype = static_cast<at::ScalarType>(h[4]);
  if (expected_like.has_value()) {
    NEURON_CHECK(shape == expected_like->sizes().vec() && dtype == expected_like->scalar_type(),
                 where, ": shape ", at::IntArrayRef(shape), " ", dtype, " does not match the "
                 "output it belongs to, ", expected_like->sizes(), " ",
                 expected_like->scalar_type());
  }
  std::vector<at::Tensor> body{at::empty(shape, at::TensorOptions(dtype))};
  group.recv(body, src, tag + 1)->wait();
  return body[0];
}

}  // namespace neuron::parallel
