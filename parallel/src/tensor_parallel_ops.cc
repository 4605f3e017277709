#include "neuron/parallel/tensor_parallel_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <mutex>
#include <unordered_map>

#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Groups by address, kept alive: a backward may run after the caller let go.
std::int64_t Keep(const GroupPtr& group) {
  static std::mutex mu;
  static std::unordered_map<::c10d::ProcessGroup*, GroupPtr> kept;
  std::lock_guard<std::mutex> lock(mu);
  kept.emplace(group.get(), group);
  return reinterpret_cast<std::int64_t>(group.get());
}

::c10d::ProcessGroup& GroupOf(AutogradContext* ctx) {
  return *reinterpret_cast<::c10d::ProcessGroup*>(ctx->saved_data["group"].toInt());
}

at::Tensor AllReduce(::c10d::ProcessGroup& group, const at::Tensor& x) {
  std::vector<at::Tensor> t{x.contiguous().clone()};
  group.allreduce(t)->wait();
  return t[0];
}

std::int64_t Dim(const at::Tensor& x, std::int64_t dim) { return dim < 0 ? dim + x.dim() : dim; }

void CheckDivisible(const char* what, const at::Tensor& x, std::int64_t dim, int n) {
  NEURON_CHECK(x.dim() > 0 && dim >= 0 && dim < x.dim(), what, ": dim ", dim,
               " outside a tensor of shape ", x.sizes());
  NEURON_CHECK(x.size(dim) % n == 0, what, ": dim ", dim, " of shape ", x.sizes(),
               " is not divisible by the group size ", n);
}

// All-gather along `dim`, chunks in rank order.
at::Tensor AllGather(::c10d::ProcessGroup& group, const at::Tensor& x, std::int64_t dim) {
  const int n = group.getSize();
  at::Tensor mine = x.movedim(dim, 0).contiguous();
  std::vector<std::int64_t> shape = mine.sizes().vec();
  shape[0] *= n;
  at::Tensor out = at::empty(shape, mine.options());
  group.all_gather_single(out, mine)->wait();
  return out.movedim(0, dim).contiguous();
}

at::Tensor OwnChunk(::c10d::ProcessGroup& group, const at::Tensor& x, std::int64_t dim) {
  const std::int64_t size = x.size(dim) / group.getSize();
  return x.narrow(dim, group.getRank() * size, size).contiguous();
}

// Reduce-scatter along dim 0, chunks in rank order.
at::Tensor ReduceScatter0(::c10d::ProcessGroup& group, const at::Tensor& x) {
  at::Tensor in = x.contiguous();
  std::vector<std::int64_t> shape = in.sizes().vec();
  shape[0] /= group.getSize();
  at::Tensor out = at::empty(shape, in.options());
  group.reduce_scatter_single(out, in)->wait();
  return out;
}

struct Copy : torch::autograd::Function<Copy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t group) {
    ctx->saved_data["group"] = group;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllReduce(GroupOf(ctx), grads[0]), at::Tensor()};
  }
};

struct Reduce : torch::autograd::Function<Reduce> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t group) {
    return AllReduce(*reinterpret_cast<::c10d::ProcessGroup*>(group), x);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct Gather : torch::autograd::Function<Gather> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t group,
                            std::int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return AllGather(*reinterpret_cast<::c10d::ProcessGroup*>(group), x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {OwnChunk(GroupOf(ctx), grads[0], ctx->saved_data["dim"].toInt()), at::Tensor(),
            at::Tensor()};
  }
};

struct Scatter : torch::autograd::Function<Scatter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t group,
                            std::int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return OwnChunk(*reinterpret_cast<::c10d::ProcessGroup*>(group), x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllGather(GroupOf(ctx), grads[0], ctx->saved_data["dim"].toInt()), at::Tensor(),
            at::Tensor()};
  }
};

struct GatherSeq : torch::autograd::Function<GatherSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t group) {
    ctx->saved_data["group"] = group;
    return AllGather(*reinterpret_cast<::c10d::ProcessGroup*>(group), x, 0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {ReduceScatter0(GroupOf(ctx), grads[0]), at::Tensor()};
  }
};

struct ReduceScatterSeq : torch::autograd::Function<ReduceScatterSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t group) {
    ctx->saved_data["group"] = group;
    return ReduceScatter0(*reinterpret_cast<::c10d::ProcessGroup*>(group), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllGather(GroupOf(ctx), grads[0], 0), at::Tensor()};
  }
};

struct VocabCrossEntropy : torch::autograd::Function<VocabCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, std::int64_t group_id,
                            std::int64_t vocab_size) {
    auto& group = *reinterpret_cast<::c10d::ProcessGroup*>(group_id);
    const std::int64_t part = logits.size(-1);
    const std::int64_t begin = group.getRank() * part;
    at::Tensor x = logits.to(at::kFloat);
    if (begin + part > vocab_size) {  // padding entries never win and add nothing
      x = x.clone();
      x.narrow(-1, std::max<std::int64_t>(0, vocab_size - begin),
               begin + part - std::max(vocab_size, begin))
          .fill_(-std::numeric_limits<float>::infinity());
    }
    at::Tensor max = std::get<0>(x.max(-1));
    {
      std::vector<at::Tensor> t{max};
      ::c10d::AllreduceOptions o;
      o.reduceOp = ::c10d::ReduceOp::MAX;
      group.allreduce(t, o)->wait();
    }
    x = x - max.unsqueeze(-1);
    const at::Tensor local = target - begin;
    const at::Tensor outside = (local < 0).logical_or(local >= part);
    const at::Tensor index = local.masked_fill(outside, 0);
    at::Tensor predicted =
        x.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0);
    at::Tensor exp = x.exp();
    at::Tensor sum = exp.sum(-1);
    predicted = AllReduce(group, predicted);
    sum = AllReduce(group, sum);
    at::Tensor softmax = exp / sum.unsqueeze(-1);
    ctx->save_for_backward({softmax, index, outside});
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(logits.scalar_type());
    return (sum.log() - predicted).to(logits.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();  // softmax - one_hot(target) on this rank's part
    const at::Tensor own = saved[2].logical_not().to(grad.scalar_type());
    grad.scatter_add_(-1, saved[1].unsqueeze(-1), -own.unsqueeze(-1));
    grad.mul_(grads[0].to(grad.scalar_type()).unsqueeze(-1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor CopyToGroup(const at::Tensor& x, const GroupPtr& group) {
  return Copy::apply(x, Keep(group));
}

at::Tensor ReduceFromGroup(const at::Tensor& x, const GroupPtr& group) {
  return Reduce::apply(x, Keep(group));
}

at::Tensor GatherFromGroup(const at::Tensor& x, const GroupPtr& group, std::int64_t dim) {
  return Gather::apply(x, Keep(group), Dim(x, dim));
}

at::Tensor ScatterToGroup(const at::Tensor& x, const GroupPtr& group, std::int64_t dim) {
  CheckDivisible("scatter to tensor-parallel group", x, Dim(x, dim), group->getSize());
  return Scatter::apply(x, Keep(group), Dim(x, dim));
}

at::Tensor GatherSequence(const at::Tensor& x, const GroupPtr& group) {
  return GatherSeq::apply(x, Keep(group));
}

at::Tensor ReduceScatterSequence(const at::Tensor& x, const GroupPtr& group) {
  CheckDivisible("reduce-scatter along the sequence", x, 0, group->getSize());
  return ReduceScatterSeq::apply(x, Keep(group));
}

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target,
                                     const GroupPtr& group, std::int64_t vocab_size) {
  NEURON_CHECK(target.scalar_type() == at::kLong && logits.dim() == target.dim() + 1 &&
                   logits.sizes().slice(0, target.dim()) == target.sizes(),
               "vocab-parallel cross-entropy: logits ", logits.sizes(),
               " and int64 targets of the logits' shape without the last dim expected; got "
               "targets ",
               target.sizes(), " of ", target.scalar_type());
  NEURON_CHECK(logits.size(-1) * group->getSize() >= vocab_size,
               "vocab-parallel cross-entropy: ", group->getSize(), " ranks x ", logits.size(-1),
               " logits cover fewer than the vocabulary's ", vocab_size, " entries");
  return VocabCrossEntropy::apply(logits, target, Keep(group), vocab_size);
}

}  // namespace neuron::parallel
