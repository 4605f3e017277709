#include "spill.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {

void Lifetimes(const LoweringContext& cx, std::vector<Interval>* sbuf,
               std::vector<Interval>* psum) {
  const auto& steps = cx.steps();
  const auto& slots = cx.slots();
  std::map<std::string, Interval> life;
  for (int s = 0; s < static_cast<int>(steps.size()); ++s) {
    for (const auto& written : steps[s].writes) {
      const std::string& w = cx.Planned(written);  // a part: the slot it lies in
      if (slots.at(w).space != rp::HBM && !life.count(w))
        life[w] = {w, slots.at(w).bytes, s, s};
      if (life.count(w)) life[w].last = std::max(life[w].last, s);
    }
    for (const auto& read : steps[s].reads) {
      const std::string& r = cx.Planned(read);
      if (life.count(r)) life[r].last = s;
    }
  }
  sbuf->clear();
  psum->clear();
  for (const auto& [name, interval] : life) {
    (slots.at(name).space == rp::PSUM ? psum : sbuf)->push_back(interval);
  }
}

namespace {

// How the steps write a value (a whole: its parts' writes are its own):
// how many steps write it, whether one writes it only in parts, whether
// the step `peak` touches it.
struct Use {
  int writers = 0;
  bool part_written = false, at_peak = false;
};

std::unordered_map<std::string, Use> UsesOf(const LoweringContext& cx, int peak) {
  std::unordered_map<std::string, Use> uses;
  // A step's wholes, each with whether the step writes it itself (not a part).
  std::vector<std::pair<std::string, bool>> written;
  for (std::size_t s = 0; s < cx.steps().size(); ++s) {
    const Step& st = cx.steps()[s];
    written.clear();
    for (const auto& w : st.writes) {
      const std::string& whole = cx.Planned(w);
      auto it = std::find_if(written.begin(), written.end(),
                             [&](const auto& x) { return x.first == whole; });
      if (it == written.end()) {
        written.emplace_back(whole, w == whole);
      } else {
        it->second = it->second || w == whole;
      }
    }
    for (const auto& [whole, itself] : written) {
      Use& u = uses[whole];
      ++u.writers;
      u.part_written = u.part_written || !itself;
    }
    if (static_cast<int>(s) != peak) continue;
    for (const auto& w : st.writes) uses[cx.Planned(w)].at_peak = true;
    for (const auto& r : st.reads) uses[cx.Planned(r)].at_peak = true;
  }
  return uses;
}

// The largest value alive across the step where most bytes are alive and
// unused there, written once (as a whole, not in parts) and not a reload
// itself; nullptr when there is none.
const Interval* Victim(const LoweringContext& cx, const std::vector<Interval>& sbuf) {
  const std::vector<Step>& steps = cx.steps();
  std::vector<std::uint64_t> alive(steps.size(), 0);
  for (const auto& v : sbuf) {
    for (int s = v.first; s <= v.last; ++s) alive[static_cast<std::size_t>(s)] += v.bytes;
  }
  const int peak =
      static_cast<int>(std::max_element(alive.begin(), alive.end()) - alive.begin());
  const auto uses = UsesOf(cx, peak);
  const Interval* victim = nullptr;
  for (const auto& v : sbuf) {
    if (v.first >= peak || v.last <= peak ||
        v.name.rfind(".reload", std::string::npos) != std::string::npos) {
      continue;
    }
    auto it = uses.find(v.name);
    const Use u = it == uses.end() ? Use{} : it->second;
    if (u.writers == 1 && !u.part_written && !u.at_peak &&
        (victim == nullptr || v.bytes > victim->bytes)) {
      victim = &v;
    }
  }
  return victim;
}

}  // namespace

bool SpillOne(LoweringContext& cx, const std::vector<Interval>& sbuf) {
  std::vector<Step>& steps = cx.steps();
  const Interval* victim = Victim(cx, sbuf);
  if (victim == nullptr) return false;
  const std::string name = victim->name;
  const std::string home = "spill:" + name;
  cx.AddSlot(home, cx.ValueOf(name), rp::HBM, "spill");
  std::vector<Step> out;
  int reloads = 0;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    Step step = std::move(steps[s]);
    const bool reads = cx.Touches(step.reads, name);
    const bool writes = cx.Touches(step.writes, name);
    if (reads && !writes) {  // bring it back for this step
      const std::string copy = StrCat(name, ".reload", reloads++);
      proto::Value v = cx.ValueOf(name);
      v.set_name(copy);
      cx.AddSlot(copy, v, rp::SBUF, "reload");
      cx.Dma(rp::OP_RELOAD, home, copy, "reload %" + name);
      steps.back().instruction.set_spill(true);
      out.push_back(std::move(steps.back()));
      steps.pop_back();
      // The value and its parts, each once, in the reloaded copy; a fused
      // step's sub-ops name them too.
      std::unordered_map<std::string, std::string> renamed = {{name, copy}};
      for (auto& r : step.reads) {
        if (cx.Planned(r) != name || renamed.count(r)) continue;
        const Slot& part = cx.slots().at(r);  // the same part of the copy
        const std::string moved = StrCat(r, ".in.", copy);
        cx.AddPart(moved, part.value, copy,
                   static_cast<std::int64_t>(part.part_offset /
                                             runtime::ElementBytes(part.dtype)),
                   "reload");
        renamed[r] = moved;
      }
      for (auto& r : step.reads) {
        auto it = renamed.find(r);
        if (it != renamed.end()) r = it->second;
      }
      for (auto& group : step.fused_reads) {
        for (auto& r : group) {
          auto it = renamed.find(r);
          if (it != renamed.end()) r = it->second;
        }
      }
    }
    out.push_back(std::move(step));
    if (writes) {  // and out, once written
      cx.Dma(rp::OP_SPILL, name, home, "spill %" + name);
      steps.back().instruction.set_spill(true);
      out.push_back(std::move(steps.back()));
      steps.pop_back();
    }
  }
  steps = std::move(out);
  return true;
}

}  // namespace neuron::compiler
