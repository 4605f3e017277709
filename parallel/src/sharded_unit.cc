#include "neuron/parallel/sharded_unit.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>

#include "accumulator_hooks.h"
#include "neuron/parallel/gradient_reducer.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {


// Gives a freed storage `bytes` of fresh memory on its own device (views of
// it stay valid).
void Allocate(const at::Tensor& t, std::size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == bytes) return;
  const c10::OptionalDeviceGuard on(t.device());  // a device allocator serves the current one
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

void Release(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

std::uint64_t Bytes(const at::Tensor& t) { return t.defined() ? t.nbytes() : 0; }

// The process's model-state memory: every unit's bytes, the optimizer's.
struct Memory {
  std::mutex mu;
  std::int64_t units = 0;
  std::uint64_t optimizer = 0;
  std::uint64_t peak = 0;
  void Change(std::int64_t delta) {
    std::lock_guard<std::mutex> lock(mu);
    units += delta;
    peak = std::max(peak, static_cast<std::uint64_t>(units) + optimizer);
  }
};

Memory& ProcessMemory() {
  static Memory memory;
  return memory;
}

}  // namespace

ModelStateMemory ShardedModelStateMemory() {
  Memory& m = ProcessMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  return {static_cast<std::uint64_t>(m.units) + m.optimizer, m.peak};
}

void SetOptimizerStateBytes(std::uint64_t bytes) {
  Memory& m = ProcessMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.optimizer = bytes;
  m.peak = std::max(m.peak, static_cast<std::uint64_t>(m.units) + m.optimizer);
}

void ResetModelStatePeak() {
  Memory& m = ProcessMemory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.peak = static_cast<std::uint64_t>(m.units) + m.optimizer;
}

struct ShardedUnit::State {
  std::vector<at::Tensor> params;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::int64_t> offsets, numels;
  c10::intrusive_ptr<::c10d::ProcessGroup> group;
  ShardingOptions options;
  int n = 1, rank = 0;
  std::int64_t total = 0, padded = 0, shard_numel = 0;
  at::Device device = at::kCPU;  // the parameters': every buffer lives there

  at::TensorOptions On(at::ScalarType dtype) const {
    return at::TensorOptions(dtype).device(device);
  }

  at::Tensor master;       // fp32 [shard_numel], the optimizer's parameter
  at::Tensor full;         // param_dtype [padded]; storage freed when not gathered
  at::Tensor gather_input;  // alive while a gather is in flight
  c10::intrusive_ptr<::c10d::Work> gather_work;
  bool full_valid = false;

  at::Tensor grad_full;  // reduce_dtype [padded]
  at::Tensor grad_shard;
  c10::intrusive_ptr<::c10d::Work> reduce_work;

  detail::AccumulatorHooks hooks;
  std::mutex mu;
  std::uint64_t counted = 0;  // this unit's bytes in ProcessMemory()
  int armed = 0;  // forwards whose backward is still to come
  bool sync = true;          // reduce at the end of each backward (else no_sync)
  bool accumulated = false;  // grad_full holds no_sync backwards' gradients
  bool finalize_queued = false;
  std::vector<char> ready;
  std::size_t remaining = 0;

  // Brings ProcessMemory() up to date with this unit's buffers.
  void Recount() {
    const std::uint64_t host = options.offload ? 0 : Bytes(master) + Bytes(master.grad());
    const std::uint64_t now = host + full.storage().nbytes() + Bytes(gather_input) +
                              Bytes(grad_full) + Bytes(grad_shard);
    ProcessMemory().Change(static_cast<std::int64_t>(now) - static_cast<std::int64_t>(counted));
    counted = now;
  }

  std::string What() const {
    return StrCat("sharded unit '", options.name, "' (ZeRO stage ", options.stage, ", rank ",
                  rank, " of ", n, ")");
  }

  void PointParametersAtFull() {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].set_data(full.narrow(0, offsets[i], numels[i]).view(shapes[i]));
    }
  }
  void EmptyParameters() {
    at::NoGradGuard no_grad;
    for (auto& p : params) p.set_data(at::empty({0}, full.options()));
  }

  void StartGather() {
    if (full_valid || gather_work) return;
    Allocate(full, static_cast<std::size_t>(padded) * full.element_size());
    gather_input = master.detach().to(device, options.param_dtype).contiguous();
    gather_work = group->all_gather_single(full, gather_input);
    Recount();
  }
  void WaitGather() {
    StartGather();
    if (gather_work) {
      gather_work->wait();
      gather_work.reset();
      gather_input.reset();
      full_valid = true;
      PointParametersAtFull();
      Recount();
    }
  }
  void Free() {
    if (gather_work) WaitGather();
    EmptyParameters();
    Release(full);
    full_valid = false;
    Recount();
  }

  void ResetBackward() {
    finalize_queued = false;
    std::fill(ready.begin(), ready.end(), 0);
    remaining = params.size();
  }

  void LaunchReduce() {
    if (!sync) {  // no_sync: keep the full gradient for the next backward
      accumulated = true;
      if (options.stage == 3) Free();
      return;
    }
    accumulated = false;
    SumSequenceParallelGradients();
    if (options.stage == 1) {
      std::vector<at::Tensor> tensors{grad_full};
      reduce_work = group->allreduce(tensors);
    } else {
      grad_shard = at::empty({shard_numel}, grad_full.options());
      reduce_work = group->reduce_scatter_single(grad_shard, grad_full);
      BoundInFlight();
    }
    Recount();
    if (options.stage == 3) Free();  // every use of the parameters in backward is done
  }

  // The sequence-parallel parameters' slots of the flat gradient, summed over
  // their group in one all-reduce (their ranks saw different sequence shards).
  void SumSequenceParallelGradients() {
    if (options.sequence_parallel.empty() || !options.sequence_parallel_group) return;
    std::vector<at::Tensor> slots;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (options.sequence_parallel[i]) slots.push_back(grad_full.narrow(0, offsets[i], numels[i]));
    }
    // One dtype (the flat gradient's), so one message up to the bucket size.
    if (!slots.empty()) SumCoalesced(slots, *options.sequence_parallel_group);
  }

  // Stages 2 and 3 hold a unit's full gradient only until its reduction is
  // done: with more than two reductions in flight on a group (a rank's
  // units share it), the oldest completes.
  static std::mutex& InFlightMutex() {
    static std::mutex mu;
    return mu;
  }
  static std::map<::c10d::ProcessGroup*, std::deque<State*>>& InFlight() {
    static std::map<::c10d::ProcessGroup*, std::deque<State*>> in_flight;
    return in_flight;
  }
  void BoundInFlight() {
    State* oldest = nullptr;
    {
      std::lock_guard<std::mutex> lock(InFlightMutex());
      auto& q = InFlight()[group.get()];
      q.push_back(this);
      if (q.size() > 2) {
        oldest = q.front();
        q.pop_front();
      }
    }
    if (oldest != nullptr && oldest != this) {
      std::lock_guard<std::mutex> lock(oldest->mu);
      oldest->Complete();
    }
  }
  void LeaveInFlight() {
    std::lock_guard<std::mutex> lock(InFlightMutex());
    auto it = InFlight().find(group.get());
    if (it == InFlight().end()) return;
    auto& q = it->second;
    q.erase(std::remove(q.begin(), q.end(), this), q.end());
    if (q.empty()) InFlight().erase(it);
  }

  // Waits for the reduction and adds the averaged shard gradient to the
  // master's .grad (in reduce_dtype: ZeRO keeps gradients at that
  // precision, 2 bytes a parameter in bf16); frees the full gradient
  // (stages 2, 3). Called with mu held.
  void Complete() {
    if (!reduce_work) return;
    reduce_work->wait();
    reduce_work.reset();
    LeaveInFlight();
    at::Tensor sum = options.stage == 1 ? grad_full.narrow(0, rank * shard_numel, shard_numel)
                                        : grad_shard;
    at::Tensor g = sum.div(at::scalar_tensor(n, at::kDouble)).to(master.device());
    at::Tensor& master_grad = master.mutable_grad();
    if (master_grad.defined()) {
      master_grad.add_(g);
    } else {
      master_grad = g;
    }
    grad_shard.reset();
    if (options.stage == 1) {
      grad_full.zero_();  // kept: stage 1 holds full gradients
    } else {
      grad_full.reset();
    }
    Recount();
  }

  // Moves parameter i's gradient (or zeros) into the flat gradient.
  void TakeGradient(std::size_t i) {
    if (!grad_full.defined()) {
      grad_full = at::zeros({padded}, On(options.reduce_dtype));
      Recount();
    }
    at::Tensor slot = grad_full.narrow(0, offsets[i], numels[i]);
    at::Tensor& grad = params[i].mutable_grad();
    if (grad.defined()) {
      if (accumulated) {
        slot.add_(grad.reshape(-1));  // onto what no_sync backwards left
      } else {
        slot.copy_(grad.reshape(-1));
      }
      grad.reset();  // sharded from here on: the full gradient is not kept
    } else if (!accumulated) {
      slot.zero_();
    }
    ready[i] = 1;
    if (--remaining == 0) LaunchReduce();
  }

  void OnGradient(std::size_t i, const std::weak_ptr<State>& self) {
    std::lock_guard<std::mutex> lock(mu);
    if (armed == 0) return;
    NEURON_CHECK(!ready[i], What(), ": parameter ", i,
                 " received a gradient twice in one backward (reentrant backward is not "
                 "supported)");
    if (!finalize_queued) {
      finalize_queued = true;
      torch::autograd::Engine::get_default_engine().queue_callback([self] {
        if (auto state = self.lock()) state->Finalize();
      });
    }
    TakeGradient(i);
  }

  void Finalize() {
    std::lock_guard<std::mutex> lock(mu);
    if (armed == 0) return;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!ready[i]) TakeGradient(i);  // unused in this backward: zeros
    }
    Complete();
    --armed;
    // With every backward done the optimizer step comes next (not after a
    // no_sync backward: the parameters are unchanged until a synced one).
    if (options.stage != 3 && armed == 0 && sync) full_valid = false;
    ResetBackward();
  }
};

ShardedUnit::ShardedUnit(std::vector<at::Tensor> params,
                         c10::intrusive_ptr<::c10d::ProcessGroup> group, ShardingOptions options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  NEURON_CHECK(group, "sharded unit '", options.name, "': no process group");
  NEURON_CHECK(options.stage >= 1 && options.stage <= 3, "sharded unit '", options.name,
               "': ZeRO stage must be 1, 2 or 3, got ", options.stage);
  NEURON_CHECK(options.sequence_parallel.empty() || options.sequence_parallel.size() == params.size(),
               "sharded unit '", options.name, "': ", options.sequence_parallel.size(),
               " sequence-parallel flags for ", params.size(), " parameters");
  s.params = std::move(params);
  s.group = std::move(group);
  s.options = std::move(options);
  s.n = s.group->getSize();
  s.rank = s.group->getRank();
  std::vector<at::Tensor> flat;
  if (!s.params.empty() && s.params[0].defined()) s.device = s.params[0].device();
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const at::Tensor& p = s.params[i];
    NEURON_CHECK(p.defined() && p.layout() == at::kStrided && p.requires_grad() && p.is_leaf() &&
                     p.scalar_type() == at::kFloat,
                 s.What(), ": parameter ", i, " must be a dense float32 leaf that requires grad");
    NEURON_CHECK(p.device() == s.device, s.What(), ": parameter ", i, " is on ", p.device(),
                 ", parameter 0 on ", s.device, " (a unit's parameters share a device)");
    s.shapes.emplace_back(p.sizes().begin(), p.sizes().end());
    s.offsets.push_back(s.total);
    s.numels.push_back(p.numel());
    s.total += p.numel();
    flat.push_back(p.detach().reshape(-1));
  }
  s.padded = (s.total + s.n - 1) / s.n * s.n;
  s.shard_numel = s.padded / s.n;
  at::Tensor values = at::zeros({s.padded}, s.On(at::kFloat));
  if (!flat.empty()) values.narrow(0, 0, s.total).copy_(at::cat(flat));
  // The master shard (and so its gradient and the optimizer's state) lives
  // in host memory under offload, else beside the parameters.
  const at::Device master_device = s.options.offload ? at::Device(at::kCPU) : s.device;
  s.master = values.narrow(0, s.rank * s.shard_numel, s.shard_numel)
                 .to(at::TensorOptions().device(master_device), /*non_blocking=*/false,
                     /*copy=*/true)
                 .requires_grad_(true);
  s.full = at::empty({s.padded}, s.On(s.options.param_dtype));
  // The gradient accumulators record their parameter's shape and dtype when
  // created: create them while the parameters are full views.
  s.PointParametersAtFull();
  s.ready.resize(s.params.size());
  s.ResetBackward();
  s.hooks.Add(s.params, std::weak_ptr<State>(state_), &State::OnGradient);
  s.Free();  // counts the master too
}

ShardedUnit::~ShardedUnit() {
  if (state_->gather_work) state_->gather_work->wait();
  if (state_->reduce_work) state_->reduce_work->wait();
  state_->LeaveInFlight();
  ProcessMemory().Change(-static_cast<std::int64_t>(state_->counted));
}

at::Tensor ShardedUnit::shard() const { return state_->master; }
std::int64_t ShardedUnit::numel() const { return state_->total; }
std::int64_t ShardedUnit::padded_numel() const { return state_->padded; }
int ShardedUnit::stage() const { return state_->options.stage; }

void ShardedUnit::StartGather() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->StartGather();
}

void ShardedUnit::WaitGather() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->WaitGather();
}

void ShardedUnit::Gather() { WaitGather(); }

void ShardedUnit::Free() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->Free();
}

bool ShardedUnit::gathered() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->full_valid;
}

bool ShardedUnit::gathering() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return static_cast<bool>(state_->gather_work);
}

void ShardedUnit::MarkStale() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->gather_work) state_->WaitGather();
  state_->full_valid = false;
}

void ShardedUnit::PrepareForBackward() {
  std::lock_guard<std::mutex> lock(state_->mu);
  NEURON_CHECK(!state_->finalize_queued, state_->What(),
               ": a forward ran while a backward was in progress (activation checkpointing "
               "with sharded units is not supported)");
  ++state_->armed;
}

std::vector<at::Tensor> ShardedUnit::Unshard(const at::Tensor& shard_like) {
  State& s = *state_;
  NEURON_CHECK(shard_like.dim() == 1 && shard_like.numel() == s.shard_numel, s.What(),
               ": unsharding a tensor of shape ", shard_like.sizes(), ", not the shard's [",
               s.shard_numel, "]");
  at::Tensor mine = shard_like.detach().contiguous();
  at::Tensor full = at::empty({s.padded}, mine.options());
  s.group->all_gather_single(full, mine)->wait();
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    out.push_back(full.narrow(0, s.offsets[i], s.numels[i]).view(s.shapes[i]).clone());
  }
  return out;
}

at::Tensor ShardedUnit::Shard(const std::vector<at::Tensor>& values) const {
  const State& s = *state_;
  NEURON_CHECK(values.size() == s.params.size(), s.What(), ": loading ", values.size(),
               " tensors into ", s.params.size(), " parameters");
  at::Tensor flat =
      at::zeros({s.padded}, s.On(values.empty() ? at::kFloat : values[0].scalar_type()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    NEURON_CHECK(values[i].sizes().vec() == s.shapes[i], s.What(), ": parameter ", i,
                 " has shape ", at::IntArrayRef(s.shapes[i]), " but the value loaded has ",
                 values[i].sizes());
    flat.narrow(0, s.offsets[i], s.numels[i]).copy_(values[i].reshape(-1));
  }
  return flat.narrow(0, s.rank * s.shard_numel, s.shard_numel)
      .to(at::TensorOptions().device(s.master.device()), /*non_blocking=*/false, /*copy=*/true);
}

std::vector<at::Tensor> ShardedUnit::FullParameters() { return Unshard(state_->master); }

void ShardedUnit::LoadFullParameters(const std::vector<at::Tensor>& values) {
  std::vector<at::Tensor> as_float;
  for (const auto& v : values) as_float.push_back(v.to(at::kFloat));
  const at::Tensor shard = Shard(as_float);
  {
    at::NoGradGuard no_grad;
    state_->master.copy_(shard);
  }
  MarkStale();
}

void ShardedUnit::SetRequireGradientSync(bool sync) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->sync = sync;
}

void ShardedUnit::DiscardAccumulatedGradients() {
  std::lock_guard<std::mutex> lock(state_->mu);
  State& s = *state_;
  if (!s.accumulated) return;
  s.accumulated = false;
  if (s.options.stage == 1) {
    s.grad_full.zero_();  // stage 1 keeps its full gradient buffer
  } else {
    s.grad_full.reset();
  }
  s.Recount();
}

double ShardedUnit::LocalGradSquaredNorm(const std::vector<bool>& counted) const {
  const State& s = *state_;
  NEURON_CHECK(counted.size() == s.params.size(), s.What(), ": ", counted.size(),
               " flags for ", s.params.size(), " parameters");
  const at::Tensor& g = s.master.grad();
  if (!g.defined()) return 0.0;
  // Parameter i's elements in this rank's shard: the overlap of its range
  // in the flat vector with [begin, end).
  const std::int64_t begin = s.rank * s.shard_numel, end = begin + s.shard_numel;
  // Counted parameters that lie next to each other in the shard are
  // summed as one run: one reduction per run, not per parameter.
  at::Tensor sum = at::zeros({}, at::TensorOptions(at::kDouble).device(g.device()));
  std::int64_t run_lo = begin, run_hi = begin;  // the current run, [lo, hi) in the flat vector
  auto add_run = [&] {
    if (run_hi > run_lo) {
      sum += g.narrow(0, run_lo - begin, run_hi - run_lo).to(at::kDouble).pow(2).sum();
    }
  };
  for (std::size_t i = 0; i < counted.size(); ++i) {
    const std::int64_t lo = std::max(begin, s.offsets[i]);
    const std::int64_t hi = std::min(end, s.offsets[i] + s.numels[i]);
    if (!counted[i] || lo >= hi) continue;
    if (lo != run_hi) {  // a gap: the run so far is complete
      add_run();
      run_lo = lo;
    }
    run_hi = hi;
  }
  add_run();
  return sum.item<double>();
}

}  // namespace neuron::parallel
