#include "elided_copies.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>

#include "neuron/runtime/device/device_ops.h"
#include "unwritten_reads.h"

namespace neuron::runtime::detail {
namespace {

// Union-find over buffer ids.
class Groups {
 public:
  std::uint32_t Find(std::uint32_t id) {
    auto [it, fresh] = parent_.try_emplace(id, id);
    if (it->second == id) return id;
    const std::uint32_t root = Find(it->second);
    parent_[id] = root;
    return root;
  }
  void Join(std::uint32_t a, std::uint32_t b) { parent_[Find(a)] = Find(b); }

 private:
  std::unordered_map<std::uint32_t, std::uint32_t> parent_;
};

// The last writer of each byte of one memory space: begin -> (end, buffer).
using Writers = std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>>;

// Splits the segment holding `at`, so a segment begins there.
void SplitAt(Writers& w, std::uint64_t at) {
  auto it = w.upper_bound(at);
  if (it == w.begin()) return;
  --it;
  if (it->first < at && it->second.first > at) {
    w.emplace(at, it->second);
    it->second.first = at;
  }
}

// What the plan does with each buffer, and which buffers share values.
class Uses {
 public:
  explicit Uses(const proto::Executable& e) {
    for (const auto& b : e.buffers()) buffers_[b.id()] = &b;
    for (const auto& c : e.constants()) Bind(c.buffer(), -1, /*writes=*/true);
    for (const auto& b : e.inputs()) Bind(b.buffer(), -1, /*writes=*/true);
    fed_ = bound_;
    for (int k = 0; k < e.instructions_size(); ++k) {
      const auto& i = e.instructions(k);
      for (auto id : i.inputs()) Read(id, k);
      for (auto id : i.outputs()) {
        if (WrittenBytes(i, buffer(id)) < static_cast<std::int64_t>(buffer(id).bytes()))
          Read(id, k);  // old bytes may stay: they flow on
        Write(id, k);
        writers_[id].push_back(k);
      }
    }
    for (const auto& b : e.outputs()) {
      Bind(b.buffer(), e.instructions_size(), /*writes=*/false);
      ++output_names_[b.buffer()];
    }
  }

  const proto::Buffer& buffer(std::uint32_t id) const { return *buffers_.at(id); }
  bool bound(std::uint32_t id) const { return bound_.count(id) > 0; }
  // Bound to a constant or an input: its bytes arrive before the run.
  bool fed(std::uint32_t id) const { return fed_.count(id) > 0; }
  int output_names(std::uint32_t id) const {
    auto it = output_names_.find(id);
    return it == output_names_.end() ? 0 : it->second;
  }
  const std::vector<int>& writers(std::uint32_t id) const {
    static const std::vector<int> kNone;
    auto it = writers_.find(id);
    return it == writers_.end() ? kNone : it->second;
  }
  int first_use(std::uint32_t id) const { return first_use_.at(id); }
  // The instructions that read or write `id`, in order (-1: bound before
  // the run; the instruction count: returned after it).
  const std::vector<int>& users(std::uint32_t id) const { return users_.at(id); }
  // The buffers of `id`'s value group, `id` included, in id order.
  const std::vector<std::uint32_t>& Group(std::uint32_t id) {
    if (members_.empty()) {  // the groups are complete once the plan is walked
      for (const auto& [other, first] : first_use_)
        members_[groups_.Find(other)].push_back(other);
    }
    return members_.at(groups_.Find(id));
  }

 private:
  void Use(std::uint32_t id, int k) {
    auto [it, fresh] = first_use_.try_emplace(id, k);
    if (!fresh) it->second = std::min(it->second, k);
    auto& users = users_[id];
    if (users.empty() || users.back() != k) users.push_back(k);
  }
  void Bind(std::uint32_t id, int k, bool writes) {
    bound_.insert(id);
    if (writes) {
      Write(id, k);
    } else {
      Read(id, k);
    }
  }
  // Records a use of `id` at `k`; its space's last writers and its bytes.
  Writers& Touch(std::uint32_t id, int k, std::uint64_t& begin, std::uint64_t& end) {
    Use(id, k);
    groups_.Find(id);
    const proto::Buffer& b = buffer(id);
    begin = b.offset(), end = b.offset() + b.bytes();
    return writers_of_[b.space()];
  }
  void Read(std::uint32_t id, int k) {
    std::uint64_t begin, end;
    Writers& w = Touch(id, k, begin, end);
    auto it = w.upper_bound(begin);
    if (it != w.begin()) --it;  // the segment holding `begin`, if any
    for (; it != w.end() && it->first < end; ++it) {
      if (it->second.first > begin) groups_.Join(id, it->second.second);
    }
  }
  void Write(std::uint32_t id, int k) {
    std::uint64_t begin, end;
    Writers& w = Touch(id, k, begin, end);
    if (begin == end) return;
    SplitAt(w, begin);
    SplitAt(w, end);
    w.erase(w.lower_bound(begin), w.lower_bound(end));
    w.emplace(begin, std::make_pair(end, id));
  }

  std::unordered_map<std::uint32_t, const proto::Buffer*> buffers_;
  std::map<std::uint32_t, int> first_use_;  // ordered: groups list in id order
  std::unordered_map<std::uint32_t, std::vector<int>> writers_, users_;
  std::unordered_map<std::uint32_t, int> output_names_;
  std::unordered_set<std::uint32_t> bound_, fed_;
  std::map<int, Writers> writers_of_;
  Groups groups_;
  std::unordered_map<std::uint32_t, std::vector<std::uint32_t>>
      members_;  // root -> group
};

template <typename Ids>
bool Has(const Ids& ids, std::uint32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

class Planner {
 public:
  Planner(const proto::Executable& e, const std::unordered_set<std::uint32_t>& direct)
      : e_(e), uses_(e), direct_(direct) {}

  Elisions Plan() {
    for (const auto& binding : e_.outputs()) OwnBlock(binding.buffer());
    for (int k = 0; k < e_.instructions_size(); ++k) {
      const auto& i = e_.instructions(k);
      if (i.inputs_size() != 1 || i.outputs_size() != 1) continue;
      if (i.op() == proto::OP_STORE) IntoOutput(i, k);
      if (i.op() == proto::OP_LOAD) IntoInput(i, k);
    }
    // After the stores: a target moved into an output's block is placed
    // before the results forwarded into it.
    for (int k = 0; k < e_.instructions_size(); ++k) {
      const auto& i = e_.instructions(k);
      const DeviceOp* op = FindDeviceOp(i.op());
      if (op != nullptr && std::string_view(op->kernel) == "Elementwise" &&
          i.inputs_size() >= 1 && i.outputs_size() == 1)
        FromPsum(i, k);
    }
    return std::move(out_);
  }

 private:
  // `id`'s group moved to `home` at `offset` (where `id`'s first byte
  // goes): when its buffers lie within `id`, none is bound (but `id` when
  // `bound_ok`) or moved already, and none is written after instruction
  // `written_until`.
  bool Move(std::uint32_t id, std::uint32_t home, std::uint64_t offset, int written_until,
            bool bound_ok = false) {
    const std::vector<std::uint32_t>& group = uses_.Group(id);
    const proto::Buffer& b = uses_.buffer(id);
    for (auto c : group) {
      const proto::Buffer& o = uses_.buffer(c);
      if ((uses_.bound(c) && !(bound_ok && c == id)) || moved_.count(c) ||
          o.space() != b.space() || o.offset() < b.offset() ||
          o.offset() + o.bytes() > b.offset() + b.bytes())
        return false;
      for (int w : uses_.writers(c)) {
        if (w > written_until) return false;
      }
    }
    for (auto c : group) {
      moved_.insert(c);
      out_.moved.push_back({c, home, offset + (uses_.buffer(c).offset() - b.offset())});
    }
    return true;
  }

  void OwnBlock(std::uint32_t id) {
    if (uses_.output_names(id) != 1 || uses_.fed(id)) return;
    if (Move(id, id, 0, e_.instructions_size(), /*bound_ok=*/true))
      out_.own_outputs.push_back(id);
  }

  bool WholeCopy(const proto::Instruction& i) const {
    return i.bytes() == uses_.buffer(i.inputs(0)).bytes() &&
           i.bytes() == uses_.buffer(i.outputs(0)).bytes();
  }

  // store k: source -> an own output it alone writes, whole, whose group
  // nothing else writes or touches before the store (the source's bytes
  // live in the block from the source's first write on).
  void IntoOutput(const proto::Instruction& i, int k) {
    const std::uint32_t target = i.outputs(0);
    const auto& own = out_.own_outputs;
    if (std::find(own.begin(), own.end(), target) == own.end() || !WholeCopy(i) ||
        uses_.writers(target) != std::vector<int>{k})
      return;
    if (QuietUntil(target, k)) Move(i.inputs(0), target, 0, k);
  }

  // Whether nothing in `target`'s group is used before copy k, and nothing
  // but `target` is ever written: the copy's other side may then live in
  // the group's memory.
  bool QuietUntil(std::uint32_t target, int k) {
    for (auto c : uses_.Group(target)) {
      if (uses_.first_use(c) < k || (c != target && !uses_.writers(c).empty()))
        return false;
    }
    return true;
  }

  // load k: an input read in place -> a buffer only the load writes, whole,
  // whose group nothing touches before the load.
  void IntoInput(const proto::Instruction& i, int k) {
    const std::uint32_t source = i.inputs(0), target = i.outputs(0);
    if (!direct_.count(source) || !WholeCopy(i) ||
        uses_.writers(target) != std::vector<int>{k})
      return;
    if (QuietUntil(target, k)) Move(target, source, 0, k);
  }

  // elementwise op k (a copy, or a bias added as the result leaves PSUM):
  // a matmul result in PSUM, its first operand, -> an SBUF buffer, float32
  // and whole on both sides. When the result's value group is itself
  // alone, it is used by its matmuls (the first writing it whole) and op k
  // only, and from the first matmul on nothing else touches the target's
  // bytes (op k's other operand included), the matmuls write the target's
  // memory: a copy is then a no-op, another op runs in place.
  void FromPsum(const proto::Instruction& i, int k) {
    const std::uint32_t source = i.inputs(0), target = i.outputs(0);
    const proto::Buffer &p = uses_.buffer(source), &s = uses_.buffer(target);
    if (p.space() != proto::PSUM || p.dtype() != proto::F32 || s.dtype() != proto::F32 ||
        p.bytes() != s.bytes() ||
        i.elements() * 4 != static_cast<std::int64_t>(p.bytes()) || uses_.bound(target) ||
        uses_.Group(source) != std::vector<std::uint32_t>{source})
      return;
    const std::vector<int>& users = uses_.users(source);
    const int first = users.front();
    if (s.space() != proto::SBUF || first < 0 || users.back() != k) return;
    const auto& head = e_.instructions(first);  // a matmul writing the result whole
    if (head.op() != proto::OP_MATMUL || !Has(head.outputs(), source) ||
        Has(head.inputs(), source) ||
        WrittenBytes(head, p) != static_cast<std::int64_t>(p.bytes()))
      return;
    for (int u : users) {
      if (u != k && e_.instructions(u).op() != proto::OP_MATMUL) return;
    }
    auto apart = [&](std::uint32_t id) {
      const proto::Buffer& b = uses_.buffer(id);
      return b.space() != s.space() || b.offset() >= s.offset() + s.bytes() ||
             s.offset() >= b.offset() + b.bytes();
    };
    for (int u = first; u < k; ++u) {
      const auto& between = e_.instructions(u);
      for (const auto* ids : {&between.inputs(), &between.outputs()}) {
        for (auto id : *ids) {
          if (!apart(id)) return;
        }
      }
    }
    for (int n = 1; n < i.inputs_size(); ++n) {
      if (i.inputs(n) == source || !apart(i.inputs(n))) return;
    }
    Move(source, target, 0, k);
  }

  const proto::Executable& e_;
  Uses uses_;
  const std::unordered_set<std::uint32_t>& direct_;
  std::unordered_set<std::uint32_t> moved_;
  Elisions out_;
};

}  // namespace

Elisions PlanElisions(const proto::Executable& e,
                      const std::unordered_set<std::uint32_t>& direct) {
  return Planner(e, direct).Plan();
}

}  // namespace neuron::runtime::detail
