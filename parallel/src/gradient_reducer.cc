#include "neuron/parallel/gradient_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <mutex>

#include "accumulator_hooks.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {


std::int64_t Bytes(const at::Tensor& t) { return t.numel() * static_cast<std::int64_t>(t.element_size()); }

}  // namespace

std::vector<Bucket> AssignBuckets(const std::vector<at::Tensor>& parameters,
                                  std::int64_t first_bucket_bytes,
                                  std::int64_t bucket_cap_bytes) {
  NEURON_CHECK(first_bucket_bytes > 0 && bucket_cap_bytes > 0,
               "gradient buckets: caps must be > 0, got ", first_bucket_bytes, " and ",
               bucket_cap_bytes);
  std::vector<Bucket> buckets;
  std::vector<std::int64_t> bytes;  // per bucket
  // Per dtype: its open bucket (or -1) and how many it has had.
  std::vector<std::int64_t> open(static_cast<std::size_t>(at::ScalarType::NumOptions), -1);
  std::vector<int> opened(open.size(), 0);
  for (std::size_t k = parameters.size(); k-- > 0;) {
    const at::Tensor& p = parameters[k];
    const auto dtype = static_cast<std::size_t>(p.scalar_type());
    std::int64_t b = open[dtype];
    if (b < 0) {
      b = static_cast<std::int64_t>(buckets.size());
      buckets.push_back(Bucket{{}, {}, 0, p.scalar_type()});
      bytes.push_back(0);
      open[dtype] = b;
      ++opened[dtype];
    }
    Bucket& bucket = buckets[b];
    bucket.parameters.push_back(k);
    bucket.offsets.push_back(bucket.elements);
    bucket.elements += p.numel();
    bytes[b] += Bytes(p);
    // Each dtype's first bucket is the small one.
    const std::int64_t cap = opened[dtype] == 1 ? first_bucket_bytes : bucket_cap_bytes;
    if (bytes[b] >= cap) open[dtype] = -1;  // full: the next one opens a new bucket
  }
  return buckets;
}

struct GradientReducer::State {
  std::vector<at::Tensor> params;
  c10::intrusive_ptr<::c10d::ProcessGroup> group;
  ReducerOptions options;
  std::vector<Bucket> buckets;
  std::vector<at::Tensor> flat;  // one per bucket
  std::vector<std::pair<std::size_t, std::size_t>> where;  // param -> (bucket, slot)
  detail::AccumulatorHooks hooks;

  std::mutex mu;
  bool armed = false;
  bool finalizing_queued = false;
  std::vector<char> ready;
  std::vector<char> used;  // got a gradient in this backward
  std::vector<std::size_t> pending;  // per bucket: parameters not yet ready
  std::size_t next_bucket = 0;
  std::vector<c10::intrusive_ptr<::c10d::Work>> works;
  std::int64_t allreduces = 0;

  std::string NameOf(std::size_t i) const {
    return i < options.names.size() ? options.names[i] : StrCat("parameter ", i);
  }
  at::Tensor View(std::size_t i) const {
    const auto [b, slot] = where[i];
    return flat[b].narrow(0, buckets[b].offsets[slot], params[i].numel()).view(params[i].sizes());
  }
  void Reset() {
    armed = false;
    finalizing_queued = false;
    std::fill(ready.begin(), ready.end(), 0);
    std::fill(used.begin(), used.end(), 0);
    for (std::size_t b = 0; b < buckets.size(); ++b) pending[b] = buckets[b].parameters.size();
    next_bucket = 0;
    works.assign(buckets.size(), {});
  }

  // The accumulated .grad of parameter i (or zeros) into its bucket.
  void CopyIn(std::size_t i) {
    at::Tensor view = View(i);
    at::Tensor& grad = params[i].mutable_grad();
    if (!grad.defined()) {
      view.zero_();
    } else if (!grad.is_same(view) && grad.data_ptr() != view.data_ptr()) {
      view.copy_(grad);
      if (options.gradient_as_bucket_view) grad = view;
    }
  }

  void MarkReady(std::size_t i) {
    ready[i] = 1;
    --pending[where[i].first];
    while (next_bucket < buckets.size() && pending[next_bucket] == 0) {
      std::vector<at::Tensor> tensors{flat[next_bucket]};
      works[next_bucket] = group->allreduce(tensors);  // SUM
      ++allreduces;
      ++next_bucket;
    }
  }

  void OnGradient(std::size_t i, const std::weak_ptr<State>& self) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed) return;  // a local backward (no_sync)
    NEURON_CHECK(!ready[i], "DistributedDataParallel: ", NameOf(i),
                 " received a gradient twice in one backward (reentrant backward or a "
                 "parameter shared across checkpointed regions is not supported)");
    if (!finalizing_queued) {
      finalizing_queued = true;
      torch::autograd::Engine::get_default_engine().queue_callback([self] {
        if (auto state = self.lock()) state->Finalize();
      });
    }
    used[i] = 1;
    CopyIn(i);
    MarkReady(i);
  }

  // Runs when the backward pass ends: completes every bucket, waits, and
  // writes the averages to .grad.
  void Finalize() {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed) return;
    std::vector<std::size_t> missing;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!ready[i]) missing.push_back(i);
    }
    if (!missing.empty() && !options.find_unused_parameters) {
      std::string names;
      for (std::size_t k = 0; k < missing.size() && k < 8; ++k) {
        names += (k ? ", " : "") + NameOf(missing[k]);
      }
      if (missing.size() > 8) names += StrCat(", ... (", missing.size(), " in all)");
      Reset();
      throw InvalidUsage(StrCat(
          "DistributedDataParallel: on rank ", group->getRank(), ", ", missing.size(),
          " parameter(s) received no gradient in this backward: ", names,
          ". Pass find_unused_parameters=True if parts of the model are unused in some steps."));
    }
    for (std::size_t i : missing) {
      CopyIn(i);  // what a no_sync step accumulated, or zeros
      MarkReady(i);
    }
    // Per parameter: how many ranks used it (or hold a gradient for it).
    std::vector<std::int32_t> used_anywhere;
    if (options.find_unused_parameters) {
      at::Tensor counts = at::empty({static_cast<std::int64_t>(params.size())}, at::kInt);
      auto* c = counts.data_ptr<std::int32_t>();
      for (std::size_t i = 0; i < params.size(); ++i) {
        c[i] = used[i] || params[i].grad().defined();
      }
      std::vector<at::Tensor> tensors{counts};
      group->allreduce(tensors)->wait();
      used_anywhere.assign(c, c + params.size());
    }
    // The sums become averages in the pass that writes them to .grad (a
    // division, as the reference's sum / world; in place for bucket views).
    const at::Tensor world = at::scalar_tensor(group->getSize(), at::kDouble);
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      works[b]->wait();
      if (options.gradient_as_bucket_view) flat[b].div_(world);
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!used_anywhere.empty() && used_anywhere[i] == 0) {
        continue;  // unused on every rank: .grad stays as it was
      }
      at::Tensor view = View(i);
      at::Tensor& grad = params[i].mutable_grad();
      if (options.gradient_as_bucket_view) {
        if (!grad.defined() || grad.data_ptr() != view.data_ptr()) grad = view;
      } else if (grad.defined()) {
        at::div_out(grad, view, world);
      } else {
        grad = view.div(world);
      }
    }
    Reset();
  }
};

GradientReducer::GradientReducer(std::vector<at::Tensor> parameters,
                                 c10::intrusive_ptr<::c10d::ProcessGroup> group,
                                 ReducerOptions options)
    : state_(std::make_shared<State>()) {
  NEURON_CHECK(group, "DistributedDataParallel: no process group");
  State& s = *state_;
  s.params = std::move(parameters);
  s.group = std::move(group);
  s.options = std::move(options);
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const at::Tensor& p = s.params[i];
    NEURON_CHECK(p.defined() && p.layout() == at::kStrided && p.requires_grad(),
                 "DistributedDataParallel: ", s.NameOf(i),
                 " must be a dense tensor that requires grad");
  }
  s.buckets = AssignBuckets(s.params, s.options.first_bucket_bytes, s.options.bucket_cap_bytes);
  s.where.resize(s.params.size());
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    s.flat.push_back(at::zeros({s.buckets[b].elements}, at::TensorOptions(s.buckets[b].dtype)));
    for (std::size_t k = 0; k < s.buckets[b].parameters.size(); ++k) {
      s.where[s.buckets[b].parameters[k]] = {b, k};
    }
  }
  s.ready.resize(s.params.size());
  s.used.resize(s.params.size());
  s.pending.resize(s.buckets.size());
  s.Reset();
  s.hooks.Add(s.params, std::weak_ptr<State>(state_), &State::OnGradient);
}

GradientReducer::~GradientReducer() = default;  // the state's hooks go with it

void GradientReducer::PrepareForBackward() {
  std::lock_guard<std::mutex> lock(state_->mu);
  NEURON_CHECK(!state_->finalizing_queued,
               "DistributedDataParallel: the previous synchronising backward has not finished");
  state_->Reset();
  state_->armed = true;
}

const std::vector<Bucket>& GradientReducer::buckets() const { return state_->buckets; }

std::int64_t GradientReducer::allreduces() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->allreduces;
}

namespace {

// Runs `collective` on each flat message of `tensors`: runs of one dtype of
// up to `bucket_bytes` (at least one tensor each), concatenated; then
// `scatter(k, piece)` for each tensor k with its piece of the result.
template <typename Collective, typename Scatter>
void Coalesced(const std::vector<at::Tensor>& tensors, std::int64_t bucket_bytes,
               Collective collective, Scatter scatter) {
  std::size_t start = 0;
  while (start < tensors.size()) {
    std::size_t end = start;
    std::int64_t bytes = 0;
    while (end < tensors.size() && tensors[end].scalar_type() == tensors[start].scalar_type() &&
           (end == start || bytes + Bytes(tensors[end]) <= bucket_bytes)) {
      bytes += Bytes(tensors[end++]);
    }
    std::vector<at::Tensor> pieces;
    for (std::size_t k = start; k < end; ++k) pieces.push_back(tensors[k].reshape(-1));
    std::vector<at::Tensor> flat{at::cat(pieces)};
    collective(flat);
    std::int64_t offset = 0;
    for (std::size_t k = start; k < end; ++k) {
      const std::int64_t n = tensors[k].numel();
      scatter(k, flat[0].narrow(0, offset, n).view(tensors[k].sizes()));
      offset += n;
    }
    start = end;
  }
}

}  // namespace

void AverageGradients(const std::vector<at::Tensor>& parameters, ::c10d::ProcessGroup& group,
                      std::int64_t bucket_bytes) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : parameters) {
    if (!p.requires_grad()) continue;
    at::Tensor& grad = const_cast<at::Tensor&>(p).mutable_grad();
    if (!grad.defined()) grad = at::zeros_like(p);
    grads.push_back(grad);
  }
  const at::Tensor world = at::scalar_tensor(group.getSize(), at::kDouble);
  Coalesced(
      grads, bucket_bytes, [&](std::vector<at::Tensor>& flat) { group.allreduce(flat)->wait(); },
      [&](std::size_t k, const at::Tensor& sum) { at::div_out(grads[k], sum, world); });
}

void SumCoalesced(const std::vector<at::Tensor>& tensors, ::c10d::ProcessGroup& group,
                  std::int64_t bucket_bytes) {
  at::NoGradGuard no_grad;
  Coalesced(
      tensors, bucket_bytes, [&](std::vector<at::Tensor>& flat) { group.allreduce(flat)->wait(); },
      [&](std::size_t k, const at::Tensor& sum) { tensors[k].copy_(sum); });
}

void BroadcastCoalesced(std::vector<at::Tensor> tensors, ::c10d::ProcessGroup& group, int root,
                        std::int64_t bucket_bytes) {
  at::NoGradGuard no_grad;
  for (auto& t : tensors) t = t.detach();
  ::c10d::BroadcastOptions options;
  options.rootRank = root;
  Coalesced(
      tensors, bucket_bytes,
      [&](std::vector<at::Tensor>& flat) { group.broadcast(flat, options)->wait(); },
      [&](std::size_t k, const at::Tensor& value) { tensors[k].copy_(value); });
}

}  // namespace neuron::parallel
