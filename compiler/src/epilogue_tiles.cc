#include "epilogue_tiles.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lowering_util.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

// A part of a tiled value: the step that writes it, its slot, and its
// elements [begin, end) of the whole.
struct Tile {
  int writer = 0;
  std::string part;
  std::int64_t begin = 0, end = 0;
};

bool Elementwise(const Step& s) {
  const auto engine = s.instruction.engine();
  if ((engine != rp::VECTOR && engine != rp::SCALAR) || s.writes.size() != 1 ||
      s.reads.empty()) {
    return false;
  }
  if (s.instruction.op() == rp::OP_FUSED) return true;
  const runtime::DeviceOp* op = runtime::FindDeviceOp(s.instruction.op());
  return op != nullptr && op->fusible;
}

// The steps' writes by the memory they land in: for each whole (a part's
// is its whole), (step, slot written) in step order.
using Write = std::pair<int, std::string>;
using Writes = std::unordered_map<std::string, std::vector<Write>>;

Writes WritesOf(const LoweringContext& cx) {
  Writes writes;
  for (int p = 0; p < static_cast<int>(cx.steps().size()); ++p) {
    for (const auto& w : cx.steps()[static_cast<std::size_t>(p)].writes)
      writes[cx.Planned(w)].emplace_back(p, w);
  }
  return writes;
}

// The writes of `whole` by steps before `e`: [first, last).
std::pair<const Write*, const Write*> WritesBefore(const Writes& writes,
                                                   const std::string& whole, int e) {
  auto it = writes.find(whole);
  if (it == writes.end()) return {nullptr, nullptr};
  const std::vector<Write>& all = it->second;  // in step order
  const auto end = std::lower_bound(
      all.begin(), all.end(), e, [](const Write& w, int step) { return w.first < step; });
  return {all.data(), all.data() + (end - all.begin())};
}

// The tiles of `v` (an SBUF whole) the steps before `e` write, in order:
// empty unless they write it in parts only, each once, adjacent and
// covering it, at least two.
std::vector<Tile> TilesOf(const LoweringContext& cx, const Writes& writes,
                          const std::string& v, int e) {
  std::vector<Tile> tiles;
  std::int64_t next = 0;
  const auto [first, last] = WritesBefore(writes, v, e);
  for (const Write* it = first; it != last; ++it) {
    const auto& [p, w] = *it;
    if (w == v) return {};  // written whole
    const Slot& part = cx.slots().at(w);
    const auto begin =
        static_cast<std::int64_t>(part.part_offset / runtime::ElementBytes(part.dtype));
    if (begin != next) return {};
    next = begin + Elements(part.value.type());
    tiles.push_back({p, w, begin, next});
  }
  if (tiles.size() < 2 || next != Elements(cx.ValueOf(v).type())) return {};
  return tiles;
}

// The last step before `e` that writes `name`'s memory (its whole, or any
// part of it); -1 when none does.
int LastWriter(const LoweringContext& cx, const Writes& writes, const std::string& name,
               int e) {
  const auto [first, last] = WritesBefore(writes, cx.Planned(name), e);
  return first == last ? -1 : (last - 1)->first;
}

// A part of `of` holding `tile`'s elements, named `name`.
std::string TilePart(LoweringContext& cx, const std::string& of, const Tile& tile,
                     const std::string& name) {
  proto::Value v = cx.ValueOf(of);
  v.set_name(name);
  v.mutable_type()->clear_shape();
  v.mutable_type()->add_shape(tile.end - tile.begin);
  cx.AddPart(name, v, of, tile.begin, "epilogue tile %" + name);
  return name;
}

// How step `e` splits: its tiled read, the tiles, which other reads are
// read by rows (the rest repeat within a tile), the loads of other reads
// that move up to the first piece (the lowering loads an input where it is
// first read, after the tiles), and the step after which every other read
// is ready. False when it does not qualify, or when every piece would wait
// for the last tile anyway.
struct Plan {
  std::string tiled;
  std::vector<Tile> tiles;
  std::vector<bool> by_rows;
  std::vector<int> hoisted;
  int ready = -1;
};

// Whether step `load`, a load of `value` from HBM, may move up to just
// after step `to`: no step between touches `value` or writes what it loads.
bool Hoistable(const LoweringContext& cx, int load, int to, const std::string& value) {
  const Step& l = cx.steps()[static_cast<std::size_t>(load)];
  if (l.instruction.op() != rp::OP_LOAD || l.reads.size() != 1 || l.writes.size() != 1 ||
      l.writes[0] != value) {
    return false;
  }
  for (int p = to + 1; p < load; ++p) {
    const Step& s = cx.steps()[static_cast<std::size_t>(p)];
    if (cx.Touches(s.reads, cx.Planned(value)) ||
        cx.Touches(s.writes, cx.Planned(value)) ||
        cx.Touches(s.writes, cx.Planned(l.reads[0]))) {
      return false;
    }
  }
  return true;
}

// `moved`: the steps an earlier split moved (a load moves once).
bool PlanSplit(const LoweringContext& cx, const Writes& writes, int e,
               const std::vector<bool>& moved, Plan* plan) {
  const Step& step = cx.steps()[static_cast<std::size_t>(e)];
  if (!Elementwise(step)) return false;
  const std::int64_t n = step.instruction.elements();
  const std::string& w = step.writes[0];
  const Slot& out = cx.slots().at(w);
  if (out.space != rp::SBUF || !out.part_of.empty() || Elements(out.value.type()) != n ||
      cx.Touches(step.reads, w)) {
    return false;
  }
  for (const auto& r : step.reads) {
    const Slot& s = cx.slots().at(r);
    if (s.space != rp::SBUF || !s.part_of.empty() || Elements(s.value.type()) != n)
      continue;
    plan->tiles = TilesOf(cx, writes, r, e);
    if (!plan->tiles.empty()) {
      plan->tiled = r;
      break;
    }
  }
  if (plan->tiled.empty()) return false;
  plan->by_rows.assign(step.reads.size(), false);
  for (std::size_t k = 0; k < step.reads.size(); ++k) {
    const std::string& r = step.reads[k];
    const auto seen = std::find(step.reads.begin(), step.reads.begin() + k, r);
    if (seen != step.reads.begin() + k) {  // read twice (a fused x * x): planned once
      plan->by_rows[k] =
          plan->by_rows[static_cast<std::size_t>(seen - step.reads.begin())];
      continue;
    }
    if (r == plan->tiled) continue;
    const Slot& s = cx.slots().at(r);
    const std::int64_t m = Elements(s.value.type());
    const bool repeats = m > 0 && n % m == 0 &&
                         std::all_of(plan->tiles.begin(), plan->tiles.end(),
                                     [&](const Tile& t) { return t.begin % m == 0; });
    if (m == n && s.space == rp::SBUF) {
      plan->by_rows[k] = true;
    } else if (!repeats) {
      return false;
    }
    const int writer = LastWriter(cx, writes, r, e);
    if (writer > plan->tiles.front().writer && !moved[static_cast<std::size_t>(writer)] &&
        Hoistable(cx, writer, plan->tiles.front().writer, r)) {
      plan->hoisted.push_back(writer);
    } else {
      plan->ready = std::max(plan->ready, writer);
    }
  }
  if (plan->ready >= plan->tiles.back().writer) return false;
  // Nothing between the first piece and the step touches its result.
  const int first = std::max(plan->tiles.front().writer, plan->ready);
  for (int p = first + 1; p < e; ++p) {
    const Step& s = cx.steps()[static_cast<std::size_t>(p)];
    if (cx.Touches(s.reads, w) || cx.Touches(s.writes, w)) return false;
  }
  return true;
}

// Step `e`'s piece for tile `t` of `plan`, over parts of its operands.
Step Piece(LoweringContext& cx, int e, const Plan& plan, std::size_t t) {
  Step piece = cx.steps()[static_cast<std::size_t>(e)];
  const Tile& tile = plan.tiles[t];
  const std::string& w = piece.writes[0];
  const std::int64_t n = tile.end - tile.begin;
  piece.instruction.set_elements(n);
  for (auto& sub : *piece.instruction.mutable_fused()) {
    if (sub.elements() != 0) sub.set_elements(n);
  }
  std::unordered_map<std::string, std::string> to = {{plan.tiled, tile.part}};
  for (std::size_t k = 0; k < piece.reads.size(); ++k) {
    const std::string& r = piece.reads[k];
    if (plan.by_rows[k] && !to.count(r))
      to[r] = TilePart(cx, r, tile, StrCat(w, ".ep", t, ".in", k));
  }
  to[w] = TilePart(cx, w, tile, StrCat(w, ".ep", t));
  auto rename = [&](std::vector<std::string>& names) {
    for (auto& x : names) {
      auto it = to.find(x);
      if (it != to.end()) x = it->second;
    }
  };
  rename(piece.reads);
  rename(piece.writes);
  for (auto& group : piece.fused_reads) rename(group);  // "" stays: the previous result
  return piece;
}

}  // namespace

int TileEpilogues(LoweringContext& cx) {
  const int count = static_cast<int>(cx.steps().size());
  std::vector<std::vector<Step>> after(static_cast<std::size_t>(count));
  std::vector<bool> moved(static_cast<std::size_t>(count), false);  // split or hoisted
  int splits = 0;
  const Writes writes =
      WritesOf(cx);  // of the steps as they were: pieces go in at the end
  for (int e = 0; e < count; ++e) {
    Plan plan;
    if (!PlanSplit(cx, writes, e, moved, &plan)) continue;
    // A load moves up to the first piece, no further (Hoistable checked
    // the way from the first tile); where that is past it, it stays.
    const int first = std::max(plan.tiles.front().writer, plan.ready);
    for (int load : plan.hoisted) {
      if (load <= first) continue;
      after[static_cast<std::size_t>(first)].push_back(
          cx.steps()[static_cast<std::size_t>(load)]);
      moved[static_cast<std::size_t>(load)] = true;
    }
    for (std::size_t t = 0; t < plan.tiles.size(); ++t) {
      const int at = std::max(plan.tiles[t].writer, plan.ready);
      after[static_cast<std::size_t>(at)].push_back(Piece(cx, e, plan, t));
    }
    moved[static_cast<std::size_t>(e)] = true;
    ++splits;
  }
  if (splits == 0) return 0;
  std::vector<Step> out;
  std::vector<Step>& steps = cx.steps();
  for (std::size_t s = 0; s < steps.size(); ++s) {
    if (!moved[s]) out.push_back(std::move(steps[s]));
    for (auto& piece : after[s]) out.push_back(std::move(piece));
  }
  steps = std::move(out);
  return splits;
}

}  // namespace neuron::compiler
