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
  const Label what = Describing(h);
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
  Linear(OpCode::kGather, o.input, o.output, o.count, o.dtype, o.root);
}

void Communicator::Scatter(const ScatterOptions& o) {
  Linear(OpCode::kScatter, o.input, o.output, o.count, o.dtype, o.root);
}

// Gather and scatter, linear (as MPICH for small groups): the root
// exchanges one block with every other rank at once and copies its own.
void Communicator::Linear(OpCode op, const void* input, void* output, std::size_t count,
                          DataType dtype, int root) {
  const bool gather = op == OpCode::kGather;
  const char* name = gather ? "gather" : "scatter";
  CheckRoot(root, name);
  // The root needs both buffers; the others only the one they send or fill.
  const void* theirs = gather ? input : output;
  const void* roots = gather ? output : input;
  NEURON_CHECK(count == 0 || (theirs != nullptr && (rank_ != root || roots != nullptr)),
               name, ": input or output is null");
  Header h = NewHeader(op, dtype, count, ReduceOp::kSum, root);
  h.model_bytes = static_cast<double>(count * ElementSize(dtype));
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const std::size_t block = count * ElementSize(dtype);
  if (block == 0) return;
  const Label what = Describing(h);
  if (rank_ != root) {
    const auto id = gather ? transport_->Isend(root, input, block)
                           : transport_->Irecv(root, output, block);
    transport_->Wait({id}, NewDeadline(), what);
    return;
  }
  std::vector<transport::RequestId> ids;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    ids.push_back(gather ? transport_->Irecv(r, static_cast<char*>(output) + r * block, block)
                         : transport_->Isend(r, static_cast<const char*>(input) + r * block,
                                             block));
  }
  if (gather) {
    std::memmove(static_cast<char*>(output) + rank_ * block, input, block);
  } else {
    std::memmove(output, static_cast<const char*>(input) + rank_ * block, block);
  }
  transport_->Wait(ids, NewDeadline(), what);
}

}  // namespace neuron::collectives
