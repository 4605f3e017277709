// The executor's driver (executor.h): places a prepared plan's buffers in
// pooled host arenas, copies the constants and inputs in (or reads inputs
// where the caller holds them), zeroes what the run reads before writing,
// runs each instruction in list order through its kernel family (KernelFor:
// the op registry's Kernel column, device_ops.h; the families live in
// exec_*.cc, declared in exec_kernels.h) and hands the outputs out. The
// modelled time is plan_timing.cc's.
#include "neuron/runtime/device/executor.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "arena_pool.h"
#include "elided_copies.h"
#include "exec_custom.h"
#include "exec_kernels.h"
#include "kernels.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/error.h"
#include "unwritten_reads.h"

namespace neuron::runtime {

namespace detail {

std::ostream& operator<<(std::ostream& out, const What& w) {
  return out << "executable '" << w.executable.name() << "': instruction "
             << w.instruction.id() << " (" << DeviceOpName(w.instruction.op()) << ")";
}

}  // namespace detail

namespace {

using detail::Placed;
using detail::What;

// Each buffer's place for one run: the plan's buffers in order, found by
// id through the prepared plan's index.
class Placement {
 public:
  Placement(const std::unordered_map<std::uint32_t, std::size_t>& index,
            std::vector<Placed> places)
      : index_(index), places_(std::move(places)) {}
  Placed& at(std::uint32_t id) { return places_[index_.at(id)]; }
  const Placed& at(std::uint32_t id) const { return places_[index_.at(id)]; }
  const Placed& operator[](std::size_t position) const { return places_[position]; }

 private:
  const std::unordered_map<std::uint32_t, std::size_t>& index_;
  std::vector<Placed> places_;
};

// Holds the run's device memory in the counters; gives it back however the
// run ends.
class MemoryHold {
 public:
  MemoryHold(MemoryCounters* counters, std::uint64_t reserved, std::uint64_t allocated)
      : counters_(counters), reserved_(reserved), allocated_(allocated) {
    if (counters_ == nullptr) return;
    counters_->Reserve(reserved_);
    counters_->Allocate(allocated_);
    counters_->Activate(allocated_);
  }
  ~MemoryHold() {
    if (counters_ == nullptr) return;
    counters_->Deactivate(allocated_);
    counters_->Free(allocated_);
    counters_->Release(reserved_);
  }
  MemoryHold(const MemoryHold&) = delete;
  MemoryHold& operator=(const MemoryHold&) = delete;

 private:
  MemoryCounters* counters_;
  std::uint64_t reserved_, allocated_;
};

// The kernel family of an instruction: its op's row of the registry
// (device_ops.h). The loader refused ops outside it.
detail::Kernel KernelFor(const proto::Instruction& i) {
  switch (i.op()) {
#define NEURON_DEVICE_OP_KERNEL(Id, Kernel, Inputs, Passes) \
  case proto::OP_##Id:                                      \
    return detail::Run##Kernel;
    NEURON_FORALL_DEVICE_OPS(NEURON_DEVICE_OP_KERNEL)
#undef NEURON_DEVICE_OP_KERNEL
    default:
      break;
  }
  throw InvalidUsage(
      StrCat("instruction ", i.id(), ": ", DeviceOpName(i.op()), " is not a device op"));
}

}  // namespace

std::size_t ElementBytes(proto::ElementType type) {
  if (type == proto::ELEMENT_TYPE_UNSPECIFIED) return 0;
#define NEURON_DEVICE_BYTES(Id, bytes, floating, name, ir, Torch, Device) \
  if (type == proto::Device) return bytes;
  NEURON_FORALL_DTYPES(NEURON_DEVICE_BYTES)
#undef NEURON_DEVICE_BYTES
  return 0;
}

HostTensor HostTensor::FromFloats(proto::ElementType dtype,
                                  std::vector<std::int64_t> shape,
                                  const std::vector<float>& values) {
  NEURON_CHECK(kernels::IsFloat(dtype),
               "HostTensor::FromFloats: ", proto::ElementType_Name(dtype),
               " is not a float type");
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  NEURON_CHECK(t.elements() == static_cast<std::int64_t>(values.size()),
               "HostTensor::FromFloats: ", values.size(), " values for ", t.elements(),
               " elements");
  t.data.resize(values.size() * ElementBytes(dtype));
  kernels::FromFloat(values, dtype, t.data.data());
  return t;
}

std::vector<float> HostTensor::ToFloats() const {
  NEURON_CHECK(kernels::IsFloat(dtype),
               "HostTensor::ToFloats: ", proto::ElementType_Name(dtype),
               " is not a float type");
  return kernels::ToFloat(data.data(), dtype, static_cast<std::size_t>(elements()));
}

std::int64_t HostTensor::elements() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Executor::Executor(DeviceSpec device, MemoryCounters* memory)
    : device_(device), model_(std::move(device)), memory_(memory) {}

ExecutionResult Executor::Run(const proto::Executable& e,
                              const std::map<std::string, HostTensor>& inputs) {
  ValidateExecutable(e, device_);
  ExecutionResult result;
  result.outputs = Compute(e, inputs);
  result.timing = TimePlan(e, model_);
  return result;
}

namespace {

// The input buffers the run may read where the caller holds them instead of
// copying them into the arena: those no instruction writes, whose memory no
// other buffer is written into before the input's last read (the result is
// the same either way).
std::unordered_set<std::uint32_t> ReadInPlace(const proto::Executable& e) {
  std::unordered_map<std::uint32_t, int> first_write, last_read;
  for (int k = 0; k < e.instructions_size(); ++k) {
    for (auto b : e.instructions(k).inputs()) last_read[b] = k;
    for (auto b : e.instructions(k).outputs()) first_write.emplace(b, k);
  }
  std::unordered_map<std::uint32_t, const proto::Buffer*> buffers;
  for (const auto& b : e.buffers()) buffers[b.id()] = &b;
  std::unordered_set<std::uint32_t> direct;
  for (const auto& binding : e.inputs()) {
    const proto::Buffer* in = buffers.at(binding.buffer());
    if (first_write.count(in->id())) continue;
    const int read_until = last_read.count(in->id()) ? last_read[in->id()] : -1;
    bool safe = true;
    for (const auto& b : e.buffers()) {
      if (b.id() == in->id() || b.space() != in->space() ||
          b.offset() >= in->offset() + in->bytes() ||
          in->offset() >= b.offset() + b.bytes())
        continue;
      const auto w = first_write.find(b.id());
      safe = safe && w != first_write.end() && w->second > read_until;
    }
    if (safe) direct.insert(in->id());
  }
  return direct;
}

// Binds the plan's inputs: those in `direct` are read where the caller
// holds them, the others copied into the plan's memory.
void BindInputs(const proto::Executable& e, const std::map<std::string, HostView>& inputs,
                const std::unordered_set<std::uint32_t>& direct, const std::string& where,
                Placement& placed) {
  std::size_t bound = 0;
  for (const auto& binding : e.inputs()) {
    auto it = inputs.find(binding.name());
    NEURON_CHECK(it != inputs.end(), where, ": input '", binding.name(),
                 "' was not given");
    Placed& p = placed.at(binding.buffer());
    NEURON_CHECK(
        it->second.dtype == p.buffer->dtype() && it->second.bytes == p.buffer->bytes(),
        where, ": input '", binding.name(), "' is ", it->second.bytes, " bytes of ",
        proto::ElementType_Name(it->second.dtype), "; the plan expects ",
        p.buffer->bytes(), " bytes of ", proto::ElementType_Name(p.buffer->dtype()));
    if (direct.count(binding.buffer())) {
      // Only read (ReadInPlace): the caller's bytes stand for the buffer's.
      p.data = const_cast<std::uint8_t*>(it->second.data);
    } else if (it->second.bytes > 0) {
      std::memcpy(p.data, it->second.data, it->second.bytes);
    }
    ++bound;
  }
  NEURON_CHECK(bound == inputs.size(), where, ": ", inputs.size(),
               " inputs given, the plan takes ", bound);
}

// An own output's block (elided_copies.h), by buffer id.
using Blocks = std::unordered_map<std::uint32_t, HostBytes>;

// Gives each own output its block (unset: the run zeroes what it reads or
// returns unwritten) and places every moved buffer in its home.
Blocks PlaceElided(const detail::Elisions& elided, Placement& placed) {
  Blocks blocks;
  for (auto id : elided.own_outputs) blocks[id].resize(placed.at(id).buffer->bytes());
  for (const auto& m : elided.moved) {
    auto block = blocks.find(m.home);
    std::uint8_t* home =
        block != blocks.end() ? block->second.data() : placed.at(m.home).data;
    placed.at(m.buffer).data = home + m.offset;
  }
  return blocks;
}

// The plan's results: own outputs' blocks handed over, the others copied.
std::map<std::string, HostTensor> TakeOutputs(const proto::Executable& e,
                                              const Placement& placed, Blocks& blocks) {
  std::map<std::string, HostTensor> outputs;
  for (const auto& binding : e.outputs()) {
    const Placed& p = placed.at(binding.buffer());
    HostTensor t;
    t.dtype = p.buffer->dtype();
    t.shape.assign(p.buffer->shape().begin(), p.buffer->shape().end());
    // No shape: a scalar when one element, else a flat vector.
    if (t.shape.empty() && p.elements() != 1)
      t.shape = {static_cast<std::int64_t>(p.elements())};
    auto block = blocks.find(binding.buffer());
    if (block != blocks.end()) {
      t.data = std::move(block->second);  // bound to this name only
    } else {
      t.data.assign(p.data, p.data + p.buffer->bytes());
    }
    outputs[binding.name()] = std::move(t);
  }
  return outputs;
}

}  // namespace

std::map<std::string, HostTensor> Executor::Compute(
    const proto::Executable& e, const std::map<std::string, HostTensor>& inputs) {
  std::map<std::string, HostView> views;
  for (const auto& [name, t] : inputs) views.emplace(name, HostView::Of(t));
  return Compute(e, views);
}

std::map<std::string, HostTensor> Executor::Compute(
    const proto::Executable& e, const std::map<std::string, HostView>& inputs) {
  return Compute(Prepare(e), inputs);
}

namespace detail {
struct PlanFacts {
  std::unordered_map<std::uint32_t, std::size_t> index;  // buffer id -> its position
  std::vector<std::vector<std::size_t>> reads, writes;   // per instruction: positions
  std::map<int, std::uint64_t> extent;  // host bytes each space's arena needs
  std::uint64_t allocated = 0, reserved = 0;
  std::unordered_set<std::uint32_t> direct;  // ReadInPlace
  Elisions elided;
  std::vector<ByteRange> zero;  // UnwrittenReads
};
}  // namespace detail

PreparedPlan Executor::Prepare(const proto::Executable& e) {
  auto facts = std::make_shared<detail::PlanFacts>();
  for (int k = 0; k < e.buffers_size(); ++k)
    facts->index[e.buffers(k).id()] = static_cast<std::size_t>(k);
  auto positions = [&](const auto& ids, int k) {
    std::vector<std::size_t> out;
    for (auto id : ids) {
      auto it = facts->index.find(id);
      NEURON_CHECK(it != facts->index.end(), "executable '", e.name(), "': instruction ",
                   k, " uses buffer ", id, ", which the plan does not have");
      out.push_back(it->second);
    }
    return out;
  };
  for (int k = 0; k < e.instructions_size(); ++k) {
    facts->reads.push_back(positions(e.instructions(k).inputs(), k));
    facts->writes.push_back(positions(e.instructions(k).outputs(), k));
  }
  for (const auto& b : e.buffers()) {
    facts->extent[b.space()] =
        std::max<std::uint64_t>(facts->extent[b.space()], b.offset() + b.bytes());
    facts->allocated += b.bytes();
  }
  for (const auto& [space, bytes] : facts->extent) facts->reserved += bytes;
  facts->direct = ReadInPlace(e);
  facts->elided = detail::PlanElisions(e, facts->direct);
  facts->zero = detail::UnwrittenReads(e, facts->direct, facts->elided);
  PreparedPlan plan;
  plan.executable_ = &e;
  plan.facts_ = std::move(facts);
  return plan;
}

std::map<std::string, HostTensor> Executor::Compute(
    const PreparedPlan& plan, const std::map<std::string, HostView>& inputs) {
  NEURON_CHECK(plan.facts_ != nullptr, "Executor::Compute: the plan was not prepared");
  const proto::Executable& e = plan.executable();
  const detail::PlanFacts& facts = *plan.facts_;
  const std::string where = StrCat("executable '", e.name(), "'");
  detail::ArenaPool::Lease lease = detail::ArenaPool::Process().Take(facts.extent);
  detail::Arenas& arena = lease.arenas();
  // Buffers may share memory (the planner reuses offsets), so the counters
  // see at most what is reserved.
  MemoryHold hold(memory_, facts.reserved, std::min(facts.allocated, facts.reserved));
  std::vector<Placed> places;
  places.reserve(static_cast<std::size_t>(e.buffers_size()));
  for (const auto& b : e.buffers())
    places.push_back({&b, arena[b.space()].data() + b.offset()});
  Placement placed(facts.index, std::move(places));

  for (const auto& c : e.constants()) {
    const Placed& p = placed.at(c.buffer());
    NEURON_CHECK(c.data().size() == p.buffer->bytes(), where, ": constant for buffer ",
                 c.buffer(), " has ", c.data().size(), " bytes, the buffer ",
                 p.buffer->bytes());
    std::memcpy(p.data, c.data().data(), c.data().size());
  }
  BindInputs(e, inputs, facts.direct, where, placed);
  Blocks blocks = PlaceElided(facts.elided, placed);
  // The arenas hold an earlier run's bytes and the blocks are unset: what
  // this run reads before writing reads zero, as fresh memory would.
  for (const detail::ByteRange& r : facts.zero) {
    std::uint8_t* base = r.block < 0
                             ? arena[r.space].data()
                             : blocks.at(static_cast<std::uint32_t>(r.block)).data();
    std::memset(base + r.begin, 0, r.end - r.begin);
  }
  std::vector<Placed> in, out;
  for (int k = 0; k < e.instructions_size(); ++k) {
    const proto::Instruction& i = e.instructions(k);
    in.clear(), out.clear();
    for (auto b : facts.reads[static_cast<std::size_t>(k)]) in.push_back(placed[b]);
    for (auto b : facts.writes[static_cast<std::size_t>(k)]) out.push_back(placed[b]);
    KernelFor(i)(i, in, out, What{e, i});
  }

  return TakeOutputs(e, placed, blocks);
}

}  // namespace neuron::runtime
