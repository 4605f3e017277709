#include "fusion.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lowering_util.h"
#include "neuron/runtime/device/device_ops.h"

namespace neuron::compiler {
namespace {

bool Fusible(const Step& s) {
  const runtime::DeviceOp* op = runtime::FindDeviceOp(s.instruction.op());
  const auto engine = s.instruction.engine();
  return (engine == rp::VECTOR || engine == rp::SCALAR) && s.writes.size() == 1 &&
         !s.reads.empty() && s.reads.size() <= 2 && op != nullptr && op->fusible;
}

struct FusionState {
  std::vector<Step> out;
  std::vector<bool> live;
  std::unordered_map<std::string, std::vector<int>> writers;  // live writers, ascending
};

// The index in f.out of the fusible (or fused) step that writes `x` last
// and only `x`, when no later step writes what it reads (it may move down
// past them); else -1.
int Producer(const FusionState& f, const std::string& x) {
  const auto latest = [&](const std::string& name) {
    auto it = f.writers.find(name);
    return it == f.writers.end() || it->second.empty() ? -1 : it->second.back();
  };
  const int p = latest(x);
  if (p < 0) return -1;
  const Step& s = f.out[p];
  if (s.writes.size() != 1 || s.writes[0] != x ||  // not a part of x
      (s.instruction.op() != rp::OP_FUSED && !Fusible(s)))
    return -1;
  for (const auto& r : s.reads) {
    if (latest(r) > p) return -1;
  }
  return p;
}

// A one-op fused step (the head of a chain).
Step Fused(Step head) {
  Step f;
  f.instruction.set_engine(head.instruction.engine());
  f.instruction.set_op(rp::OP_FUSED);
  f.instruction.set_elements(head.instruction.elements());
  f.instruction.set_source(head.instruction.source());
  f.reads = head.reads;
  f.writes = head.writes;
  f.instruction.set_operand_count(static_cast<std::uint32_t>(head.reads.size()));
  rp::Instruction sub = head.instruction;
  sub.clear_inputs();
  f.instruction.add_fused()->Swap(&sub);
  f.fused_reads.push_back(head.reads);
  return f;
}

// `next` reads the chain's result `x`: it joins the chain, and `x` goes.
void AppendFused(Step& chain, const Step& next, const std::string& x) {
  rp::Instruction sub = next.instruction;
  sub.clear_inputs();
  std::vector<std::string> reads;
  for (const auto& r : next.reads) {
    reads.push_back(r == x ? std::string() : r);  // "": the previous result
    if (r != x &&
        std::find(chain.reads.begin(), chain.reads.end(), r) == chain.reads.end()) {
      chain.reads.push_back(r);
    }
    if (r != x)
      chain.instruction.set_operand_count(chain.instruction.operand_count() + 1);
  }
  if (sub.engine() == rp::SCALAR)
    chain.instruction.set_engine(rp::SCALAR);  // the activation engine
  chain.instruction.add_fused()->Swap(&sub);
  chain.fused_reads.push_back(std::move(reads));
  chain.writes = next.writes;
  chain.instruction.set_source(next.instruction.source());
}

}  // namespace

void FuseElementwise(LoweringContext& cx) {
  std::vector<Step>& steps = cx.steps();
  const auto& slots = cx.slots();
  std::vector<std::string>& order = cx.order();
  std::unordered_map<std::string, int> readers;
  for (const auto& s : steps) {
    for (const auto& r : s.reads) {
      ++readers[r];
      if (cx.Planned(r) != r) ++readers[cx.Planned(r)];  // a part reads its whole too
    }
  }
  std::unordered_set<std::string> wholes;  // values with parts, read or not: they stay
  for (const auto& [name, slot] : slots) {
    if (!slot.part_of.empty()) wholes.insert(slot.part_of);
  }
  // The steps kept so far; a producer moved into a chain leaves an empty
  // place (dropped at the end), so indices stay valid. `writers` indexes
  // them by what they write, so finding a producer is not a scan.
  FusionState f;
  std::unordered_set<std::string> fused_away;  // intermediates that left SBUF
  for (auto& step : steps) {
    if (Fusible(step)) {
      // The producer of one of its operands, if that operand is read
      // nowhere else: it moves down here (its inputs were ready before).
      for (const auto& x : step.reads) {
        const int p = Producer(f, x);
        // A value with parts stays, as do the parts: a part lives in its
        // whole's memory.
        if (p < 0 || readers[x] != 1 || slots.at(x).space != rp::SBUF ||
            cx.Planned(x) != x || wholes.count(x) ||
            std::count(step.reads.begin(), step.reads.end(), x) != 1 ||
            f.out[p].instruction.elements() != step.instruction.elements() ||
            Elements(slots.at(x).value.type()) != step.instruction.elements()) {
          continue;
        }
        Step chain = std::move(f.out[p]);
        f.live[p] = false;
        f.writers[x].pop_back();  // p was its latest writer
        if (chain.instruction.op() != rp::OP_FUSED) chain = Fused(std::move(chain));
        AppendFused(chain, step, x);
        fused_away.insert(x);
        step = std::move(chain);
        break;
      }
    }
    for (const auto& w : step.writes) {
      f.writers[w].push_back(static_cast<int>(f.out.size()));
      // A part's write is a write of its whole, for what reads the whole.
      if (cx.Planned(w) != w)
        f.writers[cx.Planned(w)].push_back(static_cast<int>(f.out.size()));
    }
    f.out.push_back(std::move(step));
    f.live.push_back(true);
  }
  steps.clear();
  for (std::size_t i = 0; i < f.out.size(); ++i) {
    if (f.live[i]) steps.push_back(std::move(f.out[i]));
  }
  order.erase(
      std::remove_if(order.begin(), order.end(),
                     [&](const std::string& v) { return fused_away.count(v) > 0; }),
      order.end());
}

}  // namespace neuron::compiler
