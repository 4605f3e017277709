// Adaptive eager execution (docs/device.md, "Adaptive eager"): while it is
// on, eager operations on "neuron" that the compiler can express are not
// charged one by one; each is queued, with its operands' identities, into
// the process's open region, and the region is priced as one compiled plan
// when something needs its results: a host read (a copy to the CPU,
// .item()), a collective, a sync (torch.neuron.synchronize(), an event,
// reading the simulated clock), an operation the compiler cannot express
// (priced as plain eager after the flush), or the size limit
// (NEURON_ADAPTIVE_EAGER_MAX_OPS). The values are computed by the eager
// kernels at once and in order, as with it off: results are plain eager's,
// bit for bit; only the time differs.
//
// Layering: this layer does not know the compiler. The Python extension
// (python/src/adaptive_eager_bindings.cc) registers the RegionPricer that says which
// ops the compiler expresses and turns a region into the compiler's IR,
// compiles it through the compile cache and returns the plan's time.
//
// Usage:
//   adaptive::SetPricer(std::make_unique<MyPricer>());   // once, at import
//   adaptive::SetEnabled(true);                          // or NEURON_ADAPTIVE_EAGER=1
//   ... eager ops: RunOnCpu queues them (Queue) ...
//   adaptive::Flush("host_read");                        // the D2H copy does this
//   adaptive::Stats s = adaptive::GetStats();
//
// Thread-safe: one region per process (the autograd engine's threads and
// the main thread share it, in dispatch order, as they share the clock).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "neuron/aten/op_info.h"

namespace neuron::aten::adaptive {

// A tensor as a region sees it: which memory it is (its storage), where in
// it, and its shape and dtype. The weak reference keeps the storage's
// address from being reused while the region holds it (not its memory).
struct TensorRef {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{
      c10::intrusive_ptr<c10::StorageImpl>()};
  const c10::StorageImpl* key = nullptr;  // null: not a neuron tensor
  std::int64_t offset = 0;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  at::ScalarType dtype = at::ScalarType::Float;
  bool defined = false;
  // An op's result: whether anything held its memory when the region was
  // flushed. Read once, at the flush, so that the region's signature and its
  // IR see the same value while other threads free tensors.
  bool held = false;

  static TensorRef Of(const at::Tensor& t);
  // Same storage, offset, shape, strides and dtype.
  bool SameView(const TensorRef& other) const;
};

// One argument of a queued operation, as its schema lays them out.
struct Argument {
  enum class Kind { kNone, kTensor, kTensorList, kValue } kind = Kind::kNone;
  // kTensor: one (a CPU number: key null); kTensorList: each.
  std::vector<TensorRef> tensors;
  c10::IValue value;  // kValue: a number, a list of ints, a dtype, ...
};

struct QueuedOp {
  const OpInfo* info = nullptr;
  std::vector<Argument> arguments;  // the schema's, in order
  std::vector<TensorRef> results;   // the tensor results, in order (lists flattened)
  double eager_us = 0;              // what plain eager charges for it
  double wall_us = 0;
  std::uint64_t bytes = 0;
  const char* kind = "";  // its runtime::EagerKind name (lives forever)
};

struct Region {
  std::vector<QueuedOp> ops;
};

// A region's price.
struct Pricing {
  bool priced = false;     // false: the compiler refused it (error says why)
  double modelled_us = 0;  // the fused plan's time
  // How the plan was found: "compiled" (a miss), else a hit ("region table
  // hit", the compile cache's "memory hit" or "disk hit").
  std::string cache;
  std::string error;
  int refused_op = -1;  // refused: the index of the op the compiler named, or -1
};

class RegionPricer {
 public:
  virtual ~RegionPricer() = default;
  // Whether the compiler can express `op` with these arguments and results (called for
  // each operation as it is queued, under the queue's lock: cheap).
  virtual bool Accepts(const OpInfo& info, const std::vector<Argument>& arguments,
                       c10::ArrayRef<at::Tensor> results) const = 0;
  // The region as one compiled plan, or why not.
  virtual Pricing Price(const Region& region) = 0;
};

void SetPricer(std::unique_ptr<RegionPricer> pricer);

// On from NEURON_ADAPTIVE_EAGER ("0" or "1"; another value: InvalidUsage
// naming it) until SetEnabled. Switching it off flushes the open region.
bool Enabled();
// Returns the previous setting.
bool SetEnabled(bool on);

// The last `count` values on `stack` (an op's arguments, as its schema
// lays them out), captured before the kernel consumes them.
std::vector<Argument> Capture(const torch::jit::Stack& stack, std::size_t count);

// Queues a run of `info` (its cost description `op`, its captured
// arguments, its results) into the open region. Returns false, having
// flushed the region (reason "unsupported_op"), when the pricer does not
// accept it: the caller then charges it as plain eager.
// `eager_us`: what plain eager charges for it (cpu_fallback.h EagerCostOf).
bool Queue(const OpInfo& info, const runtime::EagerOp& op, double eager_us,
           double wall_us, std::vector<Argument> arguments,
           c10::ArrayRef<at::Tensor> results);

// Prices and charges the open region, if any, to the clock and the OpLog.
void Flush(const char* reason);

struct Stats {
  std::uint64_t regions = 0;                       // flushed, with at least one op
  std::map<std::string, std::uint64_t> by_reason;  // host_read, collective, sync, ...
  std::uint64_t ops = 0;                           // in those regions
  std::uint64_t cache_hits = 0;                    // regions priced without compiling
  std::uint64_t cache_misses = 0;                  // regions compiled
  // Plans the compiler refused: the ops before and after the op it named
  // are priced as regions of their own, that op at its eager cost.
  std::uint64_t refused = 0;
  // Regions whose plan the model rates slower than their ops one by one:
  // charged at their ops' eager costs (the decision is the region's: the
  // same region decides the same way from the table of priced regions).
  std::uint64_t kept_eager = 0;
  std::string last_refusal;
  double eager_us = 0;            // what plain eager would have charged for their ops
  double fused_us = 0;            // what was charged
  double pricing_wall_us = 0;     // host time spent building and pricing regions
  std::uint64_t pending_ops = 0;  // in the open region now
};
Stats GetStats();
void ResetStats();

}  // namespace neuron::aten::adaptive
