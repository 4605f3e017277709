// Allreduce of a sparse COO tensor, as Gloo does it: every rank's indices
// and values are all-gathered (uneven sizes) and summed by coalescing their
// concatenation in rank order, so every rank ends with the same tensor.
// SUM only (what sparse gradients need; Gloo has no other either).
#include "neuron/c10d/backend_neuron.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"
#include "tensor_buffers.h"

namespace neuron::c10d {
namespace {

using collectives::Communicator;
using collectives::DataType;

// Gathers every rank's block of `local` (rows along dim `dim` of sizes
// `rows`) and concatenates them along `dim`.
at::Tensor GatherBlocks(Communicator& c, const at::Tensor& local, const std::vector<int64_t>& rows,
                        int64_t dim) {
  const Movement m = MovementOf(local.scalar_type());
  std::vector<int64_t> shape = local.sizes().vec();
  const int64_t per_row = shape[dim] == 0 ? 0 : local.numel() / shape[dim];
  std::vector<std::size_t> counts;
  int64_t total = 0;
  for (int64_t r : rows) {
    counts.push_back(static_cast<std::size_t>(r * per_row) * m.scale);
    total += r;
  }
  // Each rank's block travels contiguous, as [rows_r, ...] with dim first.
  at::Tensor moved = local.movedim(dim, 0).contiguous();
  std::vector<int64_t> gathered_shape = moved.sizes().vec();
  gathered_shape[0] = total;
  at::Tensor gathered = at::empty(gathered_shape, local.options());
  c.AllGatherV({moved.data_ptr(), gathered.data_ptr(), counts, m.dtype});
  return gathered.movedim(0, dim);
}

}  // namespace

c10::intrusive_ptr<::c10d::Work> BackendNeuron::SparseAllreduce(
    Tensors& tensors, const ::c10d::AllreduceOptions& opts) {
  const char* name = "allreduce (sparse)";
  NEURON_CHECK(tensors.size() == 1, name, ": expects one tensor per process, got ",
               tensors.size());
  at::Tensor tensor = tensors[0];
  NEURON_CHECK(tensor.layout() == at::kSparse && tensor.device().is_cpu(), name,
               ": expects a sparse COO tensor on the CPU, got layout ", tensor.layout(),
               " on ", tensor.device().str());
  NEURON_CHECK(opts.reduceOp == ::c10d::ReduceOp::SUM, name,
               ": sparse tensors are reduced with SUM only, got ",
               static_cast<int>(opts.reduceOp.op_));
  MovementOf(tensor.scalar_type());  // a dtype the transports move (throws otherwise)
  const at::Tensor input = tensor.coalesce();
  const at::Tensor indices = input._indices().contiguous();  // [sparse_dim, nnz] int64
  const at::Tensor values = input._values().contiguous();    // [nnz, dense...]
  const int size = size_;
  auto body = [tensor, input, indices, values, size](Communicator& c) {
    std::vector<int64_t> nnz(size);
    const int64_t mine = input._nnz();
    c.AllGather({&mine, nnz.data(), 1, DataType::kInt64});
    const at::Tensor all_indices = GatherBlocks(c, indices, nnz, 1);
    const at::Tensor all_values = GatherBlocks(c, values, nnz, 0);
    at::Tensor sum = at::sparse_coo_tensor(all_indices, all_values, input.sizes(),
                                           input.options())
                         .coalesce();
    at::Tensor out = tensor;
    out.copy_(sum);
  };
  return Enqueue(::c10d::OpType::ALLREDUCE, name, std::move(body), tensors, opts.timeout);
}

}  // namespace neuron::c10d
