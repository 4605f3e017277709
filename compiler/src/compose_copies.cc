#include "compose_copies.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lowering_util.h"

namespace neuron::compiler {
namespace {

using Strides = std::vector<std::int64_t>;

bool IsCopy(const Step& s) {
  return s.instruction.op() == rp::OP_STRIDED_COPY && s.reads.size() == 1 &&
         s.writes.size() == 1;
}

// A copy's output strides: its own, or its view's contiguous ones.
Strides OutStrides(const rp::Instruction& i) {
  if (i.out_strides_size() > 0) return {i.out_strides().begin(), i.out_strides().end()};
  return ContiguousStrides({i.view_sizes().begin(), i.view_sizes().end()});
}

// The value T a copy writes or reads: its shape and contiguous strides.
struct Box {
  Strides shape, strides;
  std::int64_t elements = 1;

  // T's dim of more than one element whose stride is `stride`, or -1.
  int DimOf(std::int64_t stride) const {
    for (std::size_t k = 0; k < shape.size(); ++k) {
      if (shape[k] > 1 && strides[k] == stride) return static_cast<int>(k);
    }
    return -1;
  }
};

// Where the reader puts T's elements: an output stride per dim of T (0 for
// dims of one element) and the offset of T's first; nullopt unless the
// reader copies all of T, a permutation of its dims.
struct Placement {
  Strides stride;
  std::int64_t offset = 0;
};

std::optional<Placement> ReaderPlacement(const rp::Instruction& r, const Box& t) {
  if (r.in_offset() != 0 || r.elements() != t.elements) return std::nullopt;
  Placement p{Strides(t.shape.size(), 0), r.out_offset()};
  const Strides out = OutStrides(r);
  std::vector<bool> used(t.shape.size(), false);
  for (int e = 0; e < r.view_sizes_size(); ++e) {
    if (r.view_sizes(e) == 1) continue;
    const int k = t.DimOf(r.in_strides(e));
    if (k < 0 || used[static_cast<std::size_t>(k)] ||
        t.shape[static_cast<std::size_t>(k)] != r.view_sizes(e)) {
      return std::nullopt;
    }
    used[static_cast<std::size_t>(k)] = true;
    p.stride[static_cast<std::size_t>(k)] = out[static_cast<std::size_t>(e)];
  }
  return p;  // every element read once: all of T's dims of size > 1 used
}

// A writer's output strides and offset in the reader's output instead of
// T; nullopt unless its elements are a box of T's indices.
struct Target {
  Strides strides;
  std::int64_t offset = 0;
};

std::optional<Target> Recompose(const rp::Instruction& w, const Box& t,
                                const Placement& p) {
  const std::int64_t o = w.out_offset();
  if (o < 0 || o >= t.elements) return std::nullopt;
  Target to{Strides(static_cast<std::size_t>(w.view_sizes_size()), 0), p.offset};
  Strides first(t.shape.size());  // T's index of the writer's first element
  for (std::size_t k = 0; k < t.shape.size(); ++k) {
    first[k] = o / t.strides[k] % t.shape[k];
    to.offset += first[k] * p.stride[k];
  }
  const Strides out = OutStrides(w);
  std::vector<bool> used(t.shape.size(), false);
  for (int d = 0; d < w.view_sizes_size(); ++d) {
    if (w.view_sizes(d) == 1) continue;
    const int k = t.DimOf(out[static_cast<std::size_t>(d)]);
    if (k < 0) return std::nullopt;
    const auto kk = static_cast<std::size_t>(k);
    if (used[kk] || first[kk] + w.view_sizes(d) > t.shape[kk]) return std::nullopt;
    used[kk] = true;
    to.strides[static_cast<std::size_t>(d)] = p.stride[kk];
  }
  return to;
}

// Marks (or, with `check`, tests) the output elements a copy writes at
// `strides` and `offset`; false when a tested one is marked or one falls
// outside `marks`.
bool Mark(const rp::Instruction& i, const Strides& strides, std::int64_t offset,
          std::vector<bool>& marks, bool check) {
  const int rank = i.view_sizes_size();
  std::vector<std::int64_t> index(static_cast<std::size_t>(rank), 0);
  for (std::int64_t n = 0; n < i.elements(); ++n) {
    std::int64_t at = offset;
    for (int d = 0; d < rank; ++d)
      at += index[static_cast<std::size_t>(d)] * strides[static_cast<std::size_t>(d)];
    if (at < 0 || at >= static_cast<std::int64_t>(marks.size())) return false;
    if (check && marks[static_cast<std::size_t>(at)]) return false;
    if (!check) marks[static_cast<std::size_t>(at)] = true;
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[static_cast<std::size_t>(d)] < i.view_sizes(d)) break;
      index[static_cast<std::size_t>(d)] = 0;
    }
  }
  return true;
}

// Steps by the planned value they read or write.
struct Uses {
  std::unordered_map<std::string, std::vector<int>> readers, writers;
};

Uses IndexUses(const LoweringContext& cx) {
  Uses u;
  const auto& steps = cx.steps();
  for (int s = 0; s < static_cast<int>(steps.size()); ++s) {
    for (const auto& r : steps[static_cast<std::size_t>(s)].reads)
      u.readers[cx.Planned(r)].push_back(s);
    for (const auto& fused : steps[static_cast<std::size_t>(s)].fused_reads) {
      for (const auto& r : fused) {
        if (!r.empty()) u.readers[cx.Planned(r)].push_back(s);
      }
    }
    for (const auto& w : steps[static_cast<std::size_t>(s)].writes)
      u.writers[cx.Planned(w)].push_back(s);
  }
  return u;
}

class Composer {
 public:
  explicit Composer(LoweringContext& cx) : cx_(cx), uses_(IndexUses(cx)) {
    for (const auto& [name, slot] : cx.slots()) {
      if (!slot.part_of.empty()) has_parts_.insert(slot.part_of);
    }
  }

  // Composes T, the value the copy at `r` reads, into it when it qualifies.
  bool Try(int r);
  const std::unordered_set<int>& removed() const { return removed_; }
  const std::unordered_set<std::string>& gone() const { return gone_; }

 private:
  std::vector<Step>& steps() { return cx_.steps(); }
  std::optional<Box> Composable(const std::string& t, int r);
  bool OutputFreeBetween(int first, int r, const std::vector<int>& writers,
                         const std::vector<Target>& targets);

  LoweringContext& cx_;
  Uses uses_;
  std::unordered_set<std::string> has_parts_, gone_;
  std::unordered_set<int> removed_;
};

std::optional<Box> Composer::Composable(const std::string& t, int r) {
  const Slot& slot = cx_.slots().at(t);
  if (slot.space != rp::SBUF || !slot.part_of.empty() || has_parts_.count(t)) {
    return std::nullopt;
  }
  const auto& readers = uses_.readers[t];
  if (readers.size() != 1 || readers[0] != r) return std::nullopt;
  const auto& writers = uses_.writers[t];
  if (writers.empty()) return std::nullopt;
  for (int w : writers) {
    if (w >= r || removed_.count(w) || !IsCopy(steps()[static_cast<std::size_t>(w)]) ||
        steps()[static_cast<std::size_t>(w)].writes[0] != t) {
      return std::nullopt;
    }
  }
  Box box;
  box.shape = Shape(slot.value.type());
  box.strides = ContiguousStrides(box.shape);
  for (auto d : box.shape) box.elements *= d;
  return box;
}

// No step between the first writer and R reads R's output; those that
// write it are strided copies of elements the composed writers do not.
bool Composer::OutputFreeBetween(int first, int r, const std::vector<int>& writers,
                                 const std::vector<Target>& targets) {
  const std::string& out = steps()[static_cast<std::size_t>(r)].writes[0];
  const std::string& whole = cx_.Planned(out);
  for (int s : uses_.readers[whole]) {
    if (s > first && s < r) return false;
  }
  for (int w : writers) {
    if (cx_.Touches(steps()[static_cast<std::size_t>(w)].reads, whole)) return false;
  }
  std::vector<int> others;
  for (int s : uses_.writers[whole]) {
    if (s > first && s < r && !removed_.count(s) &&
        std::find(writers.begin(), writers.end(), s) == writers.end()) {
      others.push_back(s);
    }
  }
  if (others.empty()) return true;
  std::vector<bool> marks(static_cast<std::size_t>(Elements(cx_.TypeOf(out))), false);
  for (std::size_t j = 0; j < writers.size(); ++j) {
    const auto& w = steps()[static_cast<std::size_t>(writers[j])].instruction;
    if (!Mark(w, targets[j].strides, targets[j].offset, marks, false)) return false;
  }
  for (int s : others) {
    const Step& step = steps()[static_cast<std::size_t>(s)];
    if (!IsCopy(step) || step.writes[0] != out ||
        !Mark(step.instruction, OutStrides(step.instruction),
              step.instruction.out_offset(), marks, true)) {
      return false;
    }
  }
  return true;
}

bool Composer::Try(int r) {
  Step& reader = steps()[static_cast<std::size_t>(r)];
  if (!IsCopy(reader)) return false;
  const std::string t = reader.reads[0];
  const std::optional<Box> box = Composable(t, r);
  if (!box) return false;
  const std::optional<Placement> place = ReaderPlacement(reader.instruction, *box);
  if (!place) return false;
  const std::vector<int> writers = uses_.writers[t];
  std::vector<Target> targets;
  for (int w : writers) {
    auto to = Recompose(steps()[static_cast<std::size_t>(w)].instruction, *box, *place);
    if (!to) return false;
    targets.push_back(std::move(*to));
  }
  if (!OutputFreeBetween(writers.front(), r, writers, targets)) return false;
  const std::string out = reader.writes[0];
  for (std::size_t j = 0; j < writers.size(); ++j) {
    Step& w = steps()[static_cast<std::size_t>(writers[j])];
    w.writes[0] = out;
    w.instruction.clear_out_strides();
    for (auto s : targets[j].strides) w.instruction.add_out_strides(s);
    w.instruction.set_out_offset(targets[j].offset);
  }
  auto& out_writers = uses_.writers[cx_.Planned(out)];
  out_writers.erase(std::remove(out_writers.begin(), out_writers.end(), r),
                    out_writers.end());
  out_writers.insert(out_writers.end(), writers.begin(), writers.end());
  std::sort(out_writers.begin(), out_writers.end());
  uses_.readers.erase(t);
  uses_.writers.erase(t);
  removed_.insert(r);
  gone_.insert(t);
  return true;
}

}  // namespace

int ComposeStridedCopies(LoweringContext& cx) {
  Composer composer(cx);
  // Last to first: a writer composed into a later copy is itself a copy an
  // earlier one may compose into.
  for (int r = static_cast<int>(cx.steps().size()) - 1; r >= 0; --r) composer.Try(r);
  if (composer.removed().empty()) return 0;
  std::vector<Step> kept;
  for (int s = 0; s < static_cast<int>(cx.steps().size()); ++s) {
    if (!composer.removed().count(s))
      kept.push_back(std::move(cx.steps()[static_cast<std::size_t>(s)]));
  }
  cx.steps() = std::move(kept);
  auto& order = cx.order();
  order.erase(
      std::remove_if(order.begin(), order.end(),
                     [&](const std::string& v) { return composer.gone().count(v) > 0; }),
      order.end());
  return static_cast<int>(composer.gone().size());
}

}  // namespace neuron::compiler
