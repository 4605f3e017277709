// Reduce, gather and scatter: the collectives with a root. Simple and exact:
// the root exchanges a block with every other rank directly, and reduce
// combines the inputs in rank order at the root (so its result is the naive
// reference's, bitwise, float16/bfloat16 accumulated in float32).
#include <cstring>

#include "communicator_internal.h"
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/transport/transport.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

using detail::OpCode;

void Communicator::CheckRoot(int root, const char* op) const {
  NEURON_CHECK(root >= 0 && root < size_, op, ": root ", root, " outside 0..", size_ - 1);
}

void Communicator::Reduce(const ReduceOptions& o) {
  CheckReducible(o.dtype, o.op, "reduce");
  CheckRoot(o.root, "reduce");
  NEURON_CHECK(o.data != nullptr || o.count == 0, "reduce: data is null");
  Header h = NewHeader(OpCode::kReduce, o.dtype, o.count, o.op, o.root);
  h.model_bytes = static_cast<double>(o.count * ElementSize(o.dtype));
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const std::size_t bytes = o.count * ElementSize(o.dtype);
  if (bytes == 0) return;
  const std::string what = Describe(h);
  if (rank_ != o.root) {
    transport_->Wait({transport_->Isend(o.root, o.data, bytes)}, NewDeadline(), what);
    return;
  }
  std::vector<std::vector<char>> theirs(size_);
  std::vector<transport::RequestId> ids;
  std::vector<const void*> inputs(size_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      inputs[r] = o.data;
      continue;
    }
    theirs[r].resize(bytes);
    inputs[r] = theirs[r].data();
    ids.push_back(transport_->Irecv(r, theirs[r].data(), bytes));
  }
  transport_->Wait(ids, NewDeadline(), what);
  ReduceInputs(o.dtype, o.op, inputs.data(), inputs.size(), o.data, o.count,
               static_cast<std::size_t>(size_));
}

void Communicator::Gather(const GatherOptions& o) {
  CheckRoot(o.root, "gather");
  NEURON_CHECK(
      o.count == 0 || (o.input != nullptr && (rank_ != o.root || o.output != nullptr)),
      "gather: input or output is null");
  Header h = NewHeader(OpCode::kGather, o.dtype, o.count, ReduceOp::kSum, o.root);
  h.model_bytes = static_cast<double>(o.count * ElementSize(o.dtype));
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const std::size_t block = o.count * ElementSize(o.dtype);
  if (block == 0) return;
  const std::string what = Describe(h);
  if (rank_ != o.root) {
    transport_->Wait({transport_->Isend(o.root, o.input, block)}, NewDeadline(), what);
    return;
  }
  char* out = static_cast<char*>(o.output);
  std::vector<transport::RequestId> ids;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) ids.push_back(transport_->Irecv(r, out + r * block, block));
  }
  std::memmove(out + rank_ * block, o.input, block);
  transport_->Wait(ids, NewDeadline(), what);
}

void Communicator::Scatter(const ScatterOptions& o) {
  CheckRoot(o.root, "scatter");
  NEURON_CHECK(
      o.count == 0 || (o.output != nullptr && (rank_ != o.root || o.input != nullptr)),
      "scatter: input or output is null");
  Header h = NewHeader(OpCode::kScatter, o.dtype, o.count, ReduceOp::kSum, o.root);
  h.model_bytes = static_cast<double>(o.count * ElementSize(o.dtype));
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const std::size_t block = o.count * ElementSize(o.dtype);
  if (block == 0) return;
  const std::string what = Describe(h);
  if (rank_ != o.root) {
    transport_->Wait({transport_->Irecv(o.root, o.output, block)}, NewDeadline(), what);
    return;
  }
  const char* in = static_cast<const char*>(o.input);
  std::vector<transport::RequestId> ids;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) ids.push_back(transport_->Isend(r, in + r * block, block));
  }
  std::memmove(o.output, in + rank_ * block, block);
  transport_->Wait(ids, NewDeadline(), what);
}

}  // namespace neuron::collectives
