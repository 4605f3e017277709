// Communicator::Reduce, Gather and Scatter: the collectives with a root
// (their algorithms: rooted_algorithms.cc).
#include "algorithms.h"
#include "communicator_internal.h"
#include "handshake.h"
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/reduce.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

using detail::OpCode;

void Communicator::Reduce(const ReduceOptions& o) {
  CheckReducible(o.dtype, o.op, "reduce");
  CheckRoot(o.root, "reduce");
  NEURON_CHECK(o.data != nullptr || o.count == 0, "reduce: data is null");
  detail::Header h = NewHeader(OpCode::kReduce, o.dtype, o.count, o.op, o.root);
  h.model_bytes = static_cast<double>(o.count * ElementSize(o.dtype));
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  if (o.count == 0) return;
  LinearReduce(*this, o.data, o.count, o.dtype, o.op, o.root,
               detail::Handshake::Describing(h));
}

void Communicator::Gather(const GatherOptions& o) {
  Linear(OpCode::kGather, o.input, o.output, o.count, o.dtype, o.root);
}

void Communicator::Scatter(const ScatterOptions& o) {
  Linear(OpCode::kScatter, o.input, o.output, o.count, o.dtype, o.root);
}

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
  detail::Header h = NewHeader(op, dtype, count, ReduceOp::kSum, root);
  h.model_bytes = static_cast<double>(count * ElementSize(dtype));
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const std::size_t block = count * ElementSize(dtype);
  if (block == 0) return;
  const Label what = detail::Handshake::Describing(h);
  if (gather) {
    LinearGather(*this, input, output, block, root, what);
  } else {
    LinearScatter(*this, input, output, block, root, what);
  }
}

}  // namespace neuron::collectives
