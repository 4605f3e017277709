#include "neuron/aten/adaptive_eager.h"

#include <atomic>
#include <chrono>
#include <mutex>

#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/devices.h"
#include "neuron/aten/op_log.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::aten::adaptive {
namespace {

// The OpLog's name and kind of a flushed region (they live forever).
constexpr const char* kRegionName = "neuron::adaptive_region";
constexpr const char* kRegionKind = "region";
constexpr const char* kKeptEagerKind = "region_eager";  // charged at its ops' eager costs

// -1: not read from NEURON_ADAPTIVE_EAGER yet.
std::atomic<int> enabled{-1};

struct State {
  std::mutex mutex;
  Region open;
  std::unique_ptr<RegionPricer> pricer;
  Stats stats;
};

State& TheState() {
  static State* state = new State();  // lives past exit: ops may run during teardown
  return *state;
}

int FromEnvironment() {
  const auto& registry = runtime::ConfigRegistry::Get();
  const std::string value = registry.GetString(runtime::ConfigKey::kAdaptiveEager);
  NEURON_CHECK(value == "0" || value == "1",
               runtime::VariableName(runtime::ConfigKey::kAdaptiveEager),
               " must be 0 or 1, got \"", value, "\"");
  return value == "1" ? 1 : 0;
}

// NEURON_ADAPTIVE_EAGER_MAX_OPS, read at each op (the registry reads the
// environment on every call: a program may change it).
std::size_t MaxOps() {
  const std::int64_t n =
      runtime::ConfigRegistry::Get().GetInt(runtime::ConfigKey::kAdaptiveEagerMaxOps);
  NEURON_CHECK(n >= 1, runtime::VariableName(runtime::ConfigKey::kAdaptiveEagerMaxOps),
               " must be at least 1, got ", n);
  return static_cast<std::size_t>(n);
}

void Settle(const char* reason) { Flush(reason); }

// One record on the clock and the OpLog: `name` (a region's, or a
// refused op's) charged `modelled_us`.
void Record(const char* name, const char* kind, double modelled_us, double wall_us,
            std::uint64_t bytes) {
  static runtime::SimClock* const clock = runtime::ProcessClock().get();  // lives forever
  const double at = clock->compute().count();
  clock->AdvanceCompute(runtime::SimDuration(modelled_us));
  OpLog::Get().Add({name, at, modelled_us, wall_us, bytes, kind,
                    CachingAllocator::Get().Allocated(CurrentDevice())});
}

// Charges ops [begin, end) of `ops` as one plan. When the compiler refuses
// it naming an op, the ops before that op and after it are charged as
// regions of their own, and the op at its eager cost; a refusal naming no
// op charges the range at its ops' eager costs. Returns what was charged.
double ChargeRange(State& s, const std::vector<QueuedOp>& ops, std::size_t begin,
                   std::size_t end) {
  if (begin >= end) return 0;
  const auto start = std::chrono::steady_clock::now();
  Region range;
  range.ops.assign(ops.begin() + static_cast<std::ptrdiff_t>(begin),
                   ops.begin() + static_cast<std::ptrdiff_t>(end));
  double eager_us = 0, wall_us = 0;
  std::uint64_t bytes = 0;
  for (const QueuedOp& op : range.ops) {
    eager_us += op.eager_us;
    wall_us += op.wall_us;
    bytes += op.bytes;
  }
  const Pricing p = s.pricer->Price(range);
  const double pricing_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
          .count();
  s.stats.pricing_wall_us += pricing_us;
  if (!p.priced) {
    ++s.stats.refused;
    s.stats.last_refusal = p.error;
    if (p.refused_op >= 0 && static_cast<std::size_t>(p.refused_op) < range.ops.size()) {
      const std::size_t k = begin + static_cast<std::size_t>(p.refused_op);
      double charged = ChargeRange(s, ops, begin, k);
      const QueuedOp& op = ops[k];
      Record(op.info->name.c_str(), op.kind, op.eager_us, op.wall_us, op.bytes);
      charged += op.eager_us;
      return charged + ChargeRange(s, ops, k + 1, end);
    }
    Record(kRegionName, kRegionKind, eager_us, wall_us + pricing_us, bytes);
    return eager_us;
  }
  ++(p.cache == "compiled" ? s.stats.cache_misses : s.stats.cache_hits);
  if (p.modelled_us > eager_us) {
    // The plan is slower than the ops one by one (a few small ops: the
    // plan's own loads and stores dominate): they run as plain eager.
    ++s.stats.kept_eager;
    Record(kRegionName, kKeptEagerKind, eager_us, wall_us + pricing_us, bytes);
    return eager_us;
  }
  Record(kRegionName, kRegionKind, p.modelled_us, wall_us + pricing_us, bytes);
  return p.modelled_us;
}

// Flush under s.mutex.
void FlushLocked(State& s, const char* reason) {
  if (s.open.ops.empty()) return;
  Region region = std::move(s.open);
  s.open = Region{};
  for (QueuedOp& op : region.ops) {
    for (TensorRef& r : op.results) r.held = !r.storage.expired();
  }
  double eager_us = 0;
  for (const QueuedOp& op : region.ops) eager_us += op.eager_us;
  const double charged = ChargeRange(s, region.ops, 0, region.ops.size());
  ++s.stats.regions;
  ++s.stats.by_reason[reason];
  s.stats.ops += region.ops.size();
  s.stats.eager_us += eager_us;
  s.stats.fused_us += charged;
}

// The reason a refused op ends the region: an op with a result that is not
// a tensor hands a value to the host.
const char* RefusalReason(const OpInfo& info) {
  if (info.schema != nullptr) {
    for (const auto& r :
         static_cast<const c10::FunctionSchema*>(info.schema)->returns()) {
      const auto kind = r.type()->kind();
      if (kind != c10::TypeKind::TensorType && kind != c10::TypeKind::ListType) {
        return "host_read";
      }
    }
  }
  return "unsupported_op";
}

}  // namespace

TensorRef TensorRef::Of(const at::Tensor& t) {
  TensorRef r;
  if (!t.defined()) return r;
  r.defined = true;
  r.dtype = t.scalar_type();
  r.sizes.assign(t.sizes().begin(), t.sizes().end());
  r.strides.assign(t.strides().begin(), t.strides().end());
  r.offset = t.storage_offset();
  if (t.device().type() == c10::DeviceType::PrivateUse1 && t.has_storage()) {
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    r.key = impl;
    r.storage = c10::weak_intrusive_ptr<c10::StorageImpl>(
        c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
  }
  return r;
}

bool TensorRef::SameView(const TensorRef& o) const {
  return key == o.key && offset == o.offset && dtype == o.dtype && sizes == o.sizes &&
         strides == o.strides;
}

void SetPricer(std::unique_ptr<RegionPricer> pricer) {
  State& s = TheState();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    FlushLocked(s, "other");
    s.pricer = std::move(pricer);
  }
  runtime::SetPendingComputeHook(&Settle);
}

bool Enabled() {
  int on = enabled.load(std::memory_order_relaxed);
  if (on < 0) {
    on = FromEnvironment();
    int unset = -1;
    enabled.compare_exchange_strong(unset, on);
    on = enabled.load();
  }
  return on == 1;
}

bool SetEnabled(bool on) {
  const bool previous = Enabled();
  enabled.store(on ? 1 : 0);
  if (!on) Flush("other");  // after the switch: no op queued in between stays pending
  return previous;
}

std::vector<Argument> Capture(const torch::jit::Stack& stack, std::size_t count) {
  std::vector<Argument> out(count);
  auto args = stack.end() - static_cast<std::ptrdiff_t>(count);
  for (std::size_t i = 0; i < count; ++i) {
    const c10::IValue& v = args[i];
    Argument& a = out[i];
    if (v.isTensor()) {
      if (!v.toTensor().defined()) continue;
      a.kind = Argument::Kind::kTensor;
      a.tensors.push_back(TensorRef::Of(v.toTensor()));
    } else if (v.isTensorList()) {
      a.kind = Argument::Kind::kTensorList;
      for (const at::Tensor& t : v.toTensorList()) a.tensors.push_back(TensorRef::Of(t));
    } else if (!v.isNone() && !v.isGenerator() && !v.isOptionalTensorList()) {
      a.kind = Argument::Kind::kValue;
      a.value = v;
    }
  }
  return out;
}

bool Queue(const OpInfo& info, const runtime::EagerOp& op, double eager_us,
           double wall_us, std::vector<Argument> arguments,
           c10::ArrayRef<at::Tensor> results) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.pricer == nullptr || op.kind == runtime::EagerKind::kFallback ||
      !s.pricer->Accepts(info, arguments, results)) {
    FlushLocked(s, RefusalReason(info));
    return false;
  }
  if (s.open.ops.size() >= MaxOps()) FlushLocked(s, "size");
  QueuedOp q;
  q.info = &info;
  q.arguments = std::move(arguments);
  for (const at::Tensor& t : results) q.results.push_back(TensorRef::Of(t));
  q.eager_us = eager_us;
  q.wall_us = wall_us;
  q.bytes = op.bytes_in + op.bytes_out;
  q.kind = runtime::Name(op.kind);
  s.open.ops.push_back(std::move(q));
  return true;
}

void Flush(const char* reason) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mutex);
  FlushLocked(s, reason);
}

Stats GetStats() {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mutex);
  Stats out = s.stats;
  out.pending_ops = s.open.ops.size();
  return out;
}

void ResetStats() {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats = Stats{};
}

}  // namespace neuron::aten::adaptive
