#include "emit.h"

#include <unordered_map>
#include <utility>
#include <vector>

#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/error.h"
#include "spill.h"
#include "transitive_reduction.h"

namespace neuron::compiler {

constexpr std::uint64_t kAlignment = 64;  // of every buffer

namespace {

// SBUF and PSUM planned, spilling values to HBM until SBUF fits.
void PlanOnChip(LoweringContext& cx, Lowered& out) {
  std::vector<Interval> sbuf, psum;
  while (true) {
    Lifetimes(cx, &sbuf, &psum);
    try {
      out.sbuf = PlanMemory(sbuf, cx.device().SbufBytes(), kAlignment, "SBUF");
      break;
    } catch (const InvalidUsage&) {
      if (!SpillOne(cx, sbuf)) throw;
    }
  }
  out.psum = PlanMemory(psum, cx.device().PsumBytes(), kAlignment, "PSUM");
}

using Ranges = std::unordered_map<std::string, std::pair<std::uint64_t, std::uint64_t>>;

// Every slot as a buffer of the executable, in creation order: on chip
// where the plans put them, in HBM one after another (no reuse). Returns
// each slot's byte range in its memory.
Ranges AddBuffers(LoweringContext& cx, const Lowered& out, rp::Executable& e) {
  Ranges range;
  std::uint64_t hbm = 0;
  for (const auto& name : cx.order()) {
    const Slot& s = cx.slots().at(name);
    std::uint64_t offset;
    if (s.space == rp::HBM) {
      offset = hbm;
      hbm += (s.bytes + kAlignment - 1) / kAlignment * kAlignment;
    } else if (!s.part_of.empty()) {  // inside the slot it is a part of
      offset = out.sbuf.offsets.at(s.part_of) + s.part_offset;
    } else {
      offset = (s.space == rp::PSUM ? out.psum : out.sbuf).offsets.at(name);
    }
    range[name] = {offset, offset + s.bytes};
    auto* b = e.add_buffers();
    b->set_id(s.buffer);
    b->set_name(name);
    b->set_space(s.space);
    b->set_offset(offset);
    b->set_bytes(s.bytes);
    b->set_dtype(s.dtype);
    for (auto d : s.value.type().shape()) b->add_shape(d);
  }
  return range;
}

// A slot's bytes: its memory space and [begin, end) there.
struct Span {
  int space;
  std::uint64_t begin, end;
};

bool Overlap(const Span& a, const Span& b) {
  return a.space == b.space && a.begin < b.end && b.begin < a.end;
}

// Every step as an instruction with its buffers and its direct
// dependencies: data (read-after-write) and reuse of the same bytes
// (write-after-write, write-after-read).
void AddInstructions(const LoweringContext& cx, const Ranges& range, rp::Executable& e) {
  const auto& slots = cx.slots();
  const auto& steps = cx.steps();
  auto spans = [&](const std::vector<std::string>& names) {
    std::vector<Span> out;
    for (const auto& n : names) {
      out.push_back(
          {static_cast<int>(slots.at(n).space), range.at(n).first, range.at(n).second});
    }
    return out;
  };
  std::vector<std::vector<Span>> reads, writes;
  for (const auto& step : steps) {
    reads.push_back(spans(step.reads));
    writes.push_back(spans(step.writes));
  }
  auto any_overlap = [](const std::vector<Span>& a, const std::vector<Span>& b) {
    for (const auto& x : a) {
      for (const auto& y : b) {
        if (Overlap(x, y)) return true;
      }
    }
    return false;
  };
  TransitiveReduction reduction;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    rp::Instruction* in = e.add_instructions();
    *in = steps[s].instruction;
    in->set_id(static_cast<std::uint32_t>(s));
    for (const auto& r : steps[s].reads) in->add_inputs(slots.at(r).buffer);
    for (const auto& w : steps[s].writes) in->add_outputs(slots.at(w).buffer);
    for (std::size_t k = 0; k < steps[s].fused_reads.size(); ++k) {
      for (const auto& r : steps[s].fused_reads[k]) {
        in->mutable_fused(static_cast<int>(k))
            ->add_inputs(r.empty() ? runtime::kFusedPrevious : slots.at(r).buffer);
      }
    }
    std::vector<std::uint32_t> deps;
    for (std::size_t p = 0; p < s; ++p) {
      if (any_overlap(writes[p], reads[s]) ||   // read-after-write
          any_overlap(writes[p], writes[s]) ||  // write-after-write
          any_overlap(reads[p], writes[s])) {   // write-after-read
        deps.push_back(static_cast<std::uint32_t>(p));
      }
    }
    for (auto d : reduction.Direct(std::move(deps))) in->add_deps(d);
  }
}

// The graph's inputs, constants and outputs bound to their buffers.
void AddBindings(const LoweringContext& cx, rp::Executable& e) {
  const proto::Graph& g = cx.graph();
  const auto& slots = cx.slots();
  for (const auto& v : g.inputs()) {
    auto* b = e.add_inputs();
    b->set_name(v.name());
    b->set_buffer(slots.at("hbm:" + v.name()).buffer);
  }
  for (const auto& c : g.constants()) {
    auto* k = e.add_constants();
    k->set_buffer(slots.at("hbm:" + c.value().name()).buffer);
    k->set_data(c.data());
  }
  for (const auto& name : g.outputs()) {
    auto* b = e.add_outputs();
    b->set_name(name);
    b->set_buffer(slots.at("out:" + name).buffer);
  }
}

}  // namespace

Lowered Emit(LoweringContext& cx, const std::string& graph_id) {
  Lowered out;
  PlanOnChip(cx, out);
  auto& e = out.executable;
  e.set_format_version(runtime::kExecutableFormatVersion);
  e.set_graph_id(graph_id);
  e.set_name(cx.graph().name());
  e.set_compiler_version(kCompilerVersion);
  e.set_device(cx.device().spec().name());
  const Ranges range = AddBuffers(cx, out, e);
  AddInstructions(cx, range, e);
  AddBindings(cx, e);
  e.set_sbuf_lower_bound(out.sbuf.lower_bound_bytes);
  e.set_psum_lower_bound(out.psum.lower_bound_bytes);
  return out;
}

}  // namespace neuron::compiler
