// The collectives of the neuron process group: each validates its tensors on
// the calling thread (errors name the op and dtype), stages them into
// contiguous buffers, and queues the communicator call plus the copy-back.
#include <numeric>

#include "neuron/c10d/backend_neuron.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"
#include "tensor_buffers.h"

namespace neuron::c10d {
namespace {

using collectives::Communicator;
using collectives::DataType;

std::size_t Count(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

void CheckRoot(int64_t root, int size, const char* op) {
  NEURON_CHECK(root >= 0 && root < size, op, ": root rank ", root, " is not in 0..",
               size - 1);
}

void CheckRootTensor(int64_t root_tensor, const char* op) {
  NEURON_CHECK(root_tensor == 0, op, ": root tensor ", root_tensor,
               " out of range (one tensor per process)");
}

// Checks a list of `size` tensors of the input's dtype; returns their counts.
std::vector<std::size_t> ListCounts(const std::vector<at::Tensor>& list, int size,
                                    at::ScalarType type, const char* op,
                                    const char* what) {
  NEURON_CHECK(list.size() == static_cast<std::size_t>(size), op, ": ", what, " has ",
               list.size(), " tensors; the group has ", size, " ranks");
  CheckCpuTensors(list, op);
  CheckSameType(list, type, op);
  std::vector<std::size_t> counts;
  for (const auto& t : list) counts.push_back(Count(t));
  return counts;
}

bool AllEqual(const std::vector<std::size_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) ==
         counts.end();
}

std::vector<std::size_t> Scaled(std::vector<std::size_t> counts, std::size_t scale) {
  for (auto& c : counts) c *= scale;
  return counts;
}

// Elements per dim-0 slice, for split sizes.
std::size_t RowElements(const at::Tensor& t) {
  return t.dim() == 0 || t.size(0) == 0 ? 0
                                        : Count(t) / static_cast<std::size_t>(t.size(0));
}

// all_to_all_single's split sizes (rows along dim 0) as element counts;
// empty splits mean equal blocks.
std::vector<std::size_t> SplitCounts(const at::Tensor& t,
                                     const std::vector<int64_t>& splits, int size,
                                     const char* op, const char* what) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  std::vector<std::size_t> counts;
  if (splits.empty()) {
    NEURON_CHECK(rows % size == 0, op, ": ", what, " has ", rows,
                 " rows, not divisible by the group size ", size, " (pass split sizes)");
    counts.assign(size, Count(t) / size);
    return counts;
  }
  NEURON_CHECK(splits.size() == static_cast<std::size_t>(size), op, ": ", splits.size(),
               " ", what, " split sizes for a group of ", size);
  int64_t total = 0;
  for (int64_t s : splits) {
    NEURON_CHECK(s >= 0, op, ": negative ", what, " split size ", s);
    total += s;
    counts.push_back(static_cast<std::size_t>(s) * RowElements(t));
  }
  NEURON_CHECK(total == rows, op, ": ", what, " split sizes add up to ", total,
               " but the ", what, " tensor has ", rows, " rows");
  return counts;
}

}  // namespace

c10::intrusive_ptr<::c10d::Work> BackendNeuron::broadcast(
    Tensors& tensors, const ::c10d::BroadcastOptions& opts) {
  return Checked("broadcast", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    CheckSingle(tensors, "broadcast");
    CheckRoot(opts.rootRank, size_, "broadcast");
    CheckRootTensor(opts.rootTensor, "broadcast");
    const Movement m = MovementOf(tensors[0].scalar_type());
    Output io(tensors[0]);
    const int root = static_cast<int>(opts.rootRank);
    const std::size_t count = Count(tensors[0]) * m.scale;
    auto body = [io, m, root, count](Communicator& c) {
      c.Broadcast({io.data(), count, m.dtype, root});
      io.CopyBack();
    };
    return Enqueue(::c10d::OpType::BROADCAST, "broadcast", std::move(body), tensors,
                   opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::allreduce(
    Tensors& tensors, const ::c10d::AllreduceOptions& opts) {
  return Checked("allreduce", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
      return SparseAllreduce(tensors, opts);
    }
    CheckSingle(tensors, "allreduce");
    const auto op = ToReduceOp(opts.reduceOp, "allreduce");
    const DataType dtype = ReduceType(tensors[0], op, "allreduce");
    const auto factor = PreMulFactor(opts.reduceOp, tensors[0].scalar_type(), "allreduce");
    Output io(tensors[0]);
    const std::size_t count = Count(tensors[0]);
    const auto type = tensors[0].scalar_type();
    auto body = [io, dtype, op, count, factor, type](Communicator& c) {
      if (factor) Scale(io.data(), count, type, *factor);
      c.AllReduce({io.data(), count, dtype, op});
      io.CopyBack();
    };
    return Enqueue(::c10d::OpType::ALLREDUCE, "allreduce", std::move(body), tensors,
                   opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::allreduce_coalesced(
    Tensors& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  return Checked("allreduce_coalesced", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "allreduce_coalesced";
    NEURON_CHECK(!tensors.empty(), name, ": no tensors");
    CheckCpuTensors(tensors, name);
    CheckSameType(tensors, tensors[0].scalar_type(), name);
    const auto op = ToReduceOp(opts.reduceOp, name);
    const DataType dtype = ReduceType(tensors[0], op, name);
    const auto factor = PreMulFactor(opts.reduceOp, tensors[0].scalar_type(), name);
    at::Tensor packed = PackBytes(tensors);
    const std::size_t count = Bytes(packed) / tensors[0].element_size();
    const auto type = tensors[0].scalar_type();
    auto body = [packed, tensors, dtype, op, count, factor, type](Communicator& c) {
      if (factor) Scale(packed.data_ptr(), count, type, *factor);
      c.AllReduce({packed.data_ptr(), count, dtype, op});
      UnpackBytes(packed, 0, tensors);
    };
    return Enqueue(::c10d::OpType::ALLREDUCE_COALESCED, name, std::move(body), tensors,
                   opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::reduce(
    Tensors& tensors, const ::c10d::ReduceOptions& opts) {
  return Checked("reduce", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    CheckSingle(tensors, "reduce");
    CheckRoot(opts.rootRank, size_, "reduce");
    CheckRootTensor(opts.rootTensor, "reduce");
    const auto op = ToReduceOp(opts.reduceOp, "reduce");
    const DataType dtype = ReduceType(tensors[0], op, "reduce");
    const auto factor = PreMulFactor(opts.reduceOp, tensors[0].scalar_type(), "reduce");
    Output io(tensors[0]);
    const int root = static_cast<int>(opts.rootRank);
    const std::size_t count = Count(tensors[0]);
    const bool is_root = root == rank_;
    const auto type = tensors[0].scalar_type();
    // PREMUL_SUM scales a copy (the other ranks' tensors keep their values).
    const at::Tensor scaled = factor ? tensors[0].contiguous().clone() : at::Tensor();
    const at::Tensor target = tensors[0];
    auto body = [io, dtype, op, root, count, is_root, factor, type, scaled,
                 target](Communicator& c) {
      if (factor) {
        Scale(scaled.data_ptr(), count, type, *factor);
        c.Reduce({scaled.data_ptr(), count, dtype, op, root});
        if (is_root) const_cast<at::Tensor&>(target).copy_(scaled.view(target.sizes()));
        return;
      }
      c.Reduce({io.data(), count, dtype, op, root});
      if (is_root) io.CopyBack();
    };
    return Enqueue(::c10d::OpType::REDUCE, "reduce", std::move(body), tensors, opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::allgather(
    TensorLists& outputs, Tensors& inputs, const ::c10d::AllgatherOptions& opts) {
  return Checked("allgather", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "allgather";
    CheckSingle(inputs, name);
    NEURON_CHECK(outputs.size() == 1, name, ": expects one output list per process, got ",
                 outputs.size());
    const at::Tensor input = inputs[0].contiguous();
    const auto counts =
        ListCounts(outputs[0], size_, input.scalar_type(), name, "the output list");
    NEURON_CHECK(counts[rank_] == Count(input), name, ": this rank's output tensor has ",
                 counts[rank_], " elements but its input has ", Count(input));
    const Movement m = MovementOf(input.scalar_type());
    std::size_t total = 0;
    for (auto n : counts) total += n * input.element_size();
    at::Tensor packed = at::empty({static_cast<int64_t>(total)}, at::kByte);
    const std::vector<at::Tensor> list = outputs[0];
    const bool equal = AllEqual(counts);
    const auto scaled = Scaled(counts, m.scale);
    auto body = [input, packed, list, m, equal, scaled](Communicator& c) {
      if (equal) {
        c.AllGather({input.data_ptr(), packed.data_ptr(), scaled[0], m.dtype});
      } else {
        c.AllGatherV({input.data_ptr(), packed.data_ptr(), scaled, m.dtype});
      }
      UnpackBytes(packed, 0, list);
    };
    return Enqueue(::c10d::OpType::ALLGATHER, name, std::move(body), outputs[0], opts.timeout);
  });
}

BackendNeuron::Body BackendNeuron::AllGatherBaseBody(at::Tensor& output, at::Tensor& input,
                                                     const char* name) {
  CheckCpuTensors({output, input}, name);
  CheckSameType({output}, input.scalar_type(), name);
  NEURON_CHECK(Count(output) == Count(input) * size_, name, ": output has ", Count(output),
               " elements; expected ", size_, " x ", Count(input));
  const Movement m = MovementOf(input.scalar_type());
  const at::Tensor in = input.contiguous();
  Output out(output);
  const std::size_t count = Count(input) * m.scale;
  return [in, out, m, count](Communicator& c) {
    c.AllGather({in.data_ptr(), out.data(), count, m.dtype});
    out.CopyBack();
  };
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::_allgather_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::AllgatherOptions& opts) {
  return Checked("_allgather_base", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "_allgather_base";
    return Enqueue(::c10d::OpType::_ALLGATHER_BASE, name, AllGatherBaseBody(output, input, name),
                   {output}, opts.timeout);
  });
}

void BackendNeuron::CheckPairs(const char* name, std::size_t outputs, std::size_t inputs) {
  NEURON_CHECK(outputs == inputs, name, ": ", outputs, " outputs for ", inputs, " inputs");
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::allgather_into_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const ::c10d::AllgatherOptions& opts) {
  return Checked("allgather_into_tensor_coalesced", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "allgather_into_tensor_coalesced";
    Body body = Pairwise(name, outputs, inputs, [&](at::Tensor& out, at::Tensor& in) {
      return AllGatherBaseBody(out, in, name);
    });
    return Enqueue(::c10d::OpType::COALESCED, name, std::move(body), outputs, opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::allgather_coalesced(
    TensorLists& outputs, Tensors& inputs, const ::c10d::AllgatherOptions& opts) {
  return Checked("allgather_coalesced", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "allgather_coalesced";
    CheckCpuTensors(inputs, name);
    NEURON_CHECK(outputs.size() == static_cast<std::size_t>(size_), name, ": ",
                 outputs.size(), " output lists for a group of ", size_);
    for (std::size_t r = 0; r < outputs.size(); ++r) {
      NEURON_CHECK(outputs[r].size() == inputs.size(), name, ": output list ", r, " has ",
                   outputs[r].size(), " tensors but there are ", inputs.size(),
                   " inputs");
      CheckCpuTensors(outputs[r], name);
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        NEURON_CHECK(outputs[r][i].scalar_type() == inputs[i].scalar_type() &&
                         outputs[r][i].numel() == inputs[i].numel(),
                     name, ": output ", r, "/", i, " does not match input ", i,
                     " in dtype or element count");
      }
    }
    at::Tensor packed_in = PackBytes(inputs);
    const std::size_t bytes = Bytes(packed_in);
    at::Tensor packed_out = at::empty({static_cast<int64_t>(bytes * size_)}, at::kByte);
    const TensorLists lists = outputs;
    auto body = [packed_in, packed_out, lists, bytes](Communicator& c) {
      c.AllGather({packed_in.data_ptr(), packed_out.data_ptr(), bytes, DataType::kUInt8});
      for (std::size_t r = 0; r < lists.size(); ++r)
        UnpackBytes(packed_out, r * bytes, lists[r]);
    };
    Tensors all;
    for (const auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
    return Enqueue(::c10d::OpType::ALLGATHER_COALESCED, name, std::move(body), all,
                   opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::gather(
    TensorLists& outputs, Tensors& inputs, const ::c10d::GatherOptions& opts) {
  return Checked("gather", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "gather";
    CheckSingle(inputs, name);
    CheckRoot(opts.rootRank, size_, name);
    const int root = static_cast<int>(opts.rootRank);
    const at::Tensor input = inputs[0].contiguous();
    std::vector<at::Tensor> list;
    if (rank_ == root) {
      NEURON_CHECK(outputs.size() == 1, name, ": the root expects one output list, got ",
                   outputs.size());
      const auto counts =
          ListCounts(outputs[0], size_, input.scalar_type(), name, "the output list");
      for (auto n : counts) {
        NEURON_CHECK(n == Count(input), name, ": output tensors must have the input's ",
                     Count(input), " elements, one has ", n);
      }
      list = outputs[0];
    } else {
      NEURON_CHECK(outputs.empty() || outputs[0].empty(), name, ": only the root (rank ",
                   root, ") passes output tensors");
    }
    const Movement m = MovementOf(input.scalar_type());
    at::Tensor packed = at::empty(
        {static_cast<int64_t>(rank_ == root ? Bytes(input) * size_ : 0)}, at::kByte);
    const std::size_t count = Count(input) * m.scale;
    auto body = [input, packed, list, m, root, count](Communicator& c) {
      c.Gather({input.data_ptr(), packed.data_ptr(), count, m.dtype, root});
      UnpackBytes(packed, 0, list);
    };
    return Enqueue(::c10d::OpType::GATHER, name, std::move(body), list, opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::scatter(
    Tensors& outputs, TensorLists& inputs, const ::c10d::ScatterOptions& opts) {
  return Checked("scatter", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "scatter";
    CheckSingle(outputs, name);
    CheckRoot(opts.rootRank, size_, name);
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor packed = at::empty({0}, at::kByte);
    if (rank_ == root) {
      NEURON_CHECK(inputs.size() == 1, name, ": the root expects one input list, got ",
                   inputs.size());
      const auto counts =
          ListCounts(inputs[0], size_, outputs[0].scalar_type(), name, "the input list");
      for (auto n : counts) {
        NEURON_CHECK(n == Count(outputs[0]), name,
                     ": input tensors must have the output's ", Count(outputs[0]),
                     " elements, one has ", n);
      }
      packed = PackBytes(inputs[0]);
    } else {
      NEURON_CHECK(inputs.empty() || inputs[0].empty(), name, ": only the root (rank ",
                   root, ") passes input tensors");
    }
    const Movement m = MovementOf(outputs[0].scalar_type());
    Output out(outputs[0]);
    const std::size_t count = Count(outputs[0]) * m.scale;
    auto body = [packed, out, m, root, count](Communicator& c) {
      c.Scatter({packed.data_ptr(), out.data(), count, m.dtype, root});
      out.CopyBack();
    };
    return Enqueue(::c10d::OpType::SCATTER, name, std::move(body), outputs, opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::reduce_scatter(
    Tensors& outputs, TensorLists& inputs, const ::c10d::ReduceScatterOptions& opts) {
  return Checked("reduce_scatter", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "reduce_scatter";
    CheckSingle(outputs, name);
    NEURON_CHECK(inputs.size() == 1, name, ": expects one input list per process, got ",
                 inputs.size());
    const auto op = ToReduceOp(opts.reduceOp, name);
    const DataType dtype = ReduceType(outputs[0], op, name);
    const auto counts =
        ListCounts(inputs[0], size_, outputs[0].scalar_type(), name, "the input list");
    NEURON_CHECK(counts[rank_] == Count(outputs[0]), name,
                 ": this rank's input tensor has ", counts[rank_],
                 " elements but its output has ", Count(outputs[0]));
    const auto factor = PreMulFactor(opts.reduceOp, outputs[0].scalar_type(), name);
    at::Tensor packed = PackBytes(inputs[0]);
    Output out(outputs[0]);
    const bool equal = AllEqual(counts);
    const auto type = outputs[0].scalar_type();
    std::size_t total = 0;
    for (auto n : counts) total += n;
    auto body = [packed, out, dtype, op, counts, equal, factor, type, total](Communicator& c) {
      if (factor) Scale(packed.data_ptr(), total, type, *factor);  // a copy: inputs stay
      collectives::ReduceScatterOptions o{packed.data_ptr(), out.data(), counts[0], dtype,
                                          op};
      if (!equal) o.counts = counts;
      c.ReduceScatter(o);
      out.CopyBack();
    };
    return Enqueue(::c10d::OpType::REDUCE_SCATTER, name, std::move(body), outputs,
                   opts.timeout);
  });
}

BackendNeuron::Body BackendNeuron::ReduceScatterBaseBody(
    at::Tensor& output, at::Tensor& input, const ::c10d::ReduceOp& reduce_op, const char* name) {
  CheckCpuTensors({output, input}, name);
  CheckSameType({output}, input.scalar_type(), name);
  NEURON_CHECK(Count(input) == Count(output) * size_, name, ": input has ", Count(input),
               " elements; expected ", size_, " x ", Count(output));
  const auto op = ToReduceOp(reduce_op, name);
  const DataType dtype = ReduceType(input, op, name);
  const auto factor = PreMulFactor(reduce_op, input.scalar_type(), name);
  // PREMUL_SUM scales a copy: the caller's input stays as it was.
  const at::Tensor in = factor ? input.contiguous().clone() : input.contiguous();
  Output out(output);
  const std::size_t count = Count(output);
  const auto type = input.scalar_type();
  const std::size_t total = Count(input);
  return [in, out, dtype, op, count, factor, type, total](Communicator& c) {
    if (factor) Scale(in.data_ptr(), total, type, *factor);
    c.ReduceScatter({in.data_ptr(), out.data(), count, dtype, op});
    out.CopyBack();
  };
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) {
  return Checked("_reduce_scatter_base", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "_reduce_scatter_base";
    return Enqueue(::c10d::OpType::_REDUCE_SCATTER_BASE, name,
                   ReduceScatterBaseBody(output, input, opts.reduceOp, name), {output},
                   opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::reduce_scatter_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const ::c10d::ReduceScatterOptions& opts) {
  return Checked("reduce_scatter_tensor_coalesced", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "reduce_scatter_tensor_coalesced";
    Body body = Pairwise(name, outputs, inputs, [&](at::Tensor& out, at::Tensor& in) {
      return ReduceScatterBaseBody(out, in, opts.reduceOp, name);
    });
    return Enqueue(::c10d::OpType::COALESCED, name, std::move(body), outputs, opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const ::c10d::AllToAllOptions& opts) {
  return Checked("alltoall_base", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "alltoall_base";
    CheckCpuTensors({output, input}, name);
    CheckSameType({output}, input.scalar_type(), name);
    const auto send = SplitCounts(input, input_split_sizes, size_, name, "input");
    const auto recv = SplitCounts(output, output_split_sizes, size_, name, "output");
    const Movement m = MovementOf(input.scalar_type());
    const at::Tensor in = input.contiguous();
    Output out(output);
    const bool equal = AllEqual(send) && AllEqual(recv) && send[0] == recv[0];
    collectives::AllToAllOptions o{in.data_ptr(), out.data(), send[0] * m.scale};
    if (!equal) {
      o.count = 0;
      o.send_counts = Scaled(send, m.scale);
      o.recv_counts = Scaled(recv, m.scale);
    }
    o.dtype = m.dtype;
    auto body = [in, out, o](Communicator& c) {
      c.AllToAll(o);
      out.CopyBack();
    };
    return Enqueue(::c10d::OpType::ALLTOALL_BASE, name, std::move(body), {output},
                   opts.timeout);
  });
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::alltoall(
    Tensors& outputs, Tensors& inputs, const ::c10d::AllToAllOptions& opts) {
  return Checked("alltoall", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    const char* name = "alltoall";
    NEURON_CHECK(!inputs.empty(), name, ": no input tensors");
    const auto type = inputs[0].scalar_type();
    const auto send = ListCounts(inputs, size_, type, name, "the input list");
    const auto recv = ListCounts(outputs, size_, type, name, "the output list");
    const Movement m = MovementOf(type);
    at::Tensor packed_in = PackBytes(inputs);
    std::size_t recv_bytes = 0;
    for (const auto& t : outputs) recv_bytes += Bytes(t);
    at::Tensor packed_out = at::empty({static_cast<int64_t>(recv_bytes)}, at::kByte);
    collectives::AllToAllOptions o{packed_in.data_ptr(),  packed_out.data_ptr(), 0,
                                   Scaled(send, m.scale), Scaled(recv, m.scale), m.dtype};
    auto body = [packed_in, packed_out, outputs, o](Communicator& c) {
      c.AllToAll(o);
      UnpackBytes(packed_out, 0, outputs);
    };
    return Enqueue(::c10d::OpType::ALLTOALL, name, std::move(body), outputs, opts.timeout);
  });
}

}  // namespace neuron::c10d
