#include "neuron/runtime/fabric/fabric_links.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {

std::string ChipName(int chip) { return "chip " + std::to_string(chip); }

int Index(const std::vector<int>& coords, const std::vector<int>& dims) {
  int index = 0;
  for (std::size_t d = 0; d < dims.size(); ++d) index = index * dims[d] + coords[d];
  return index;
}

}  // namespace

std::vector<int> TorusCoordinates(int local_chip, const std::vector<int>& dims) {
  std::vector<int> coords(dims.size());
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    coords[d] = local_chip % dims[d];
    local_chip /= dims[d];
  }
  return coords;
}

FabricLinks::FabricLinks(const Topology& topology, std::uint32_t job_nodes) {
  const auto& spec = topology.spec();
  num_nodes_ = static_cast<int>(spec.num_nodes() != 0 ? spec.num_nodes()
                                                      : std::max<std::uint32_t>(job_nodes, 1));
  chips_per_node_ = static_cast<int>(spec.chips_per_node());
  num_chips_ = num_nodes_ * chips_per_node_;
  intra_ = spec.intra_node_link();
  inter_ = spec.inter_node_link();
  const bool node_switches = spec.intra_node() == proto::TopologySpec::SWITCH;
  shared_switch_ = SharedSwitch(spec);
  const bool efa = num_nodes_ > 1 && spec.inter_node() == proto::TopologySpec::EFA;
  efa_switch_ = efa ? num_chips_ : -1;
  first_switch_ = node_switches ? num_chips_ + (efa ? 1 : 0) : -1;
  num_vertices_ = num_chips_ + (efa ? 1 : 0) + (node_switches ? (shared_switch_ ? 1 : num_nodes_) : 0);
  if (node_switches) {
    intra_per_chip_ = 2;
  } else {
    dims_.assign(spec.torus_dims().begin(), spec.torus_dims().end());
    for (int d = 0; d < static_cast<int>(dims_.size()); ++d) {
      if (dims_[d] == 1) continue;
      torus_slots_.push_back({d, +1});
      if (dims_[d] != 2) torus_slots_.push_back({d, -1});
    }
    intra_per_chip_ = static_cast<int>(torus_slots_.size());
    for (int local = 0; local < chips_per_node_; ++local) {
      for (const auto& [d, step] : torus_slots_) {
        auto coords = TorusCoordinates(local, dims_);
        coords[d] = (coords[d] + step + dims_[d]) % dims_[d];
        torus_next_.push_back(Index(coords, dims_));
      }
    }
  }
  if (!efa && num_nodes_ > 1 && !shared_switch_) ring_directions_ = num_nodes_ == 2 ? 1 : 2;
  const std::int64_t chips = num_chips_;
  const std::int64_t intra = chips * intra_per_chip_;
  const std::int64_t inter = efa ? 2 * chips : chips * ring_directions_;
  NEURON_CHECK(intra + inter <= std::numeric_limits<int>::max(), "topology ", topology.origin(),
               ": ", num_nodes_, " nodes of ", chips_per_node_, " chips have ", intra + inter,
               " links, more than the ", std::numeric_limits<int>::max(), " a fabric can number");
  intra_links_ = static_cast<int>(intra);
  inter_links_ = static_cast<int>(inter);
  hub_ = ring_directions_ == 0;
  ApplyFaults(spec);
}

int FabricLinks::NodeSwitch(int node) const {
  if (first_switch_ < 0) return -1;
  return shared_switch_ ? first_switch_ : first_switch_ + node;
}

int FabricLinks::NodeOf(int vertex) const {
  if (vertex < num_chips_) return vertex / chips_per_node_;
  if (first_switch_ < 0 || vertex < first_switch_ || shared_switch_) return -1;
  return vertex - first_switch_;
}

Hop FabricLinks::Plain(int id) const {
  Hop hop;
  if (id < intra_links_) {
    const int chip = id / intra_per_chip_, slot = id % intra_per_chip_;
    hop.bytes_per_second = intra_.bandwidth_gbps() * 1e9;
    hop.latency = SimDuration(intra_.latency_us());
    if (dims_.empty()) {  // switch ports: out carries the hop latency, in does not
      const int sw = NodeSwitch(chip / chips_per_node_);
      hop.from = slot == 0 ? chip : sw;
      hop.to = slot == 0 ? sw : chip;
      if (slot == 1) hop.latency = SimDuration(0);
      return hop;
    }
    const int local = chip % chips_per_node_;
    hop.from = chip;
    hop.to = chip - local + torus_next_[static_cast<std::size_t>(local * intra_per_chip_ + slot)];
    return hop;
  }
  const int k = id - intra_links_;
  hop.bytes_per_second = inter_.bandwidth_gbps() * 1e9;
  hop.latency = SimDuration(inter_.latency_us());
  if (efa_switch_ >= 0) {  // NIC: egress carries the hop latency, ingress only limits bandwidth
    const bool out = k % 2 == 0;
    hop.from = out ? k / 2 : efa_switch_;
    hop.to = out ? efa_switch_ : k / 2;
    if (!out) hop.latency = SimDuration(0);
    return hop;
  }
  const int local = k % chips_per_node_, row = k / chips_per_node_;
  const int node = row / ring_directions_, step = row % ring_directions_ == 0 ? +1 : -1;
  hop.from = node * chips_per_node_ + local;
  hop.to = ((node + step + num_nodes_) % num_nodes_) * chips_per_node_ + local;
  return hop;
}

Hop FabricLinks::At(int id) const {
  NEURON_ASSERT(id >= 0 && id < num_links(), "link ", id, " outside the fabric's ",
                num_links());
  Hop hop = Plain(id);
  if (!faulted_.empty()) {
    const auto it = faulted_.find(id);
    if (it != faulted_.end()) std::tie(hop.bytes_per_second, hop.down) = it->second;
  }
  return hop;
}

std::string FabricLinks::Name(int id) const {
  const Hop hop = Plain(id);
  if (id < intra_links_ && dims_.empty()) {
    return id % 2 == 0 ? ChipName(hop.from) + " switch port out"
                       : ChipName(hop.to) + " switch port in";
  }
  if (id >= intra_links_ && efa_switch_ >= 0) {
    return (id - intra_links_) % 2 == 0 ? ChipName(hop.from) + " NIC out"
                                        : ChipName(hop.to) + " NIC in";
  }
  return ChipName(hop.from) + " -> " + ChipName(hop.to);
}

int FabricLinks::HubToChip(int hub, int chip) const {
  if (hub == efa_switch_) return intra_links_ + 2 * chip + 1;
  if (dims_.empty() && hub == NodeSwitch(chip / chips_per_node_)) return 2 * chip + 1;
  return -1;
}

int FabricLinks::Shifted(int id, int nodes) const {
  if (id < intra_links_) return id + nodes * chips_per_node_ * intra_per_chip_;
  NEURON_ASSERT(efa_switch_ >= 0, "link ", id, " is not a per-chip link");
  return id + nodes * chips_per_node_ * 2;
}

// Every link from vertex `from` to vertex `to`, in id order.
std::vector<int> FabricLinks::LinksBetween(int from, int to) const {
  std::vector<int> ids;
  if (from < 0 || from >= num_vertices_ || to < 0 || to >= num_vertices_) return ids;
  if (from < num_chips_) {
    ForEachFromChip(from, [&](int id) {
      if (Plain(id).to == to) ids.push_back(id);
    });
  } else if (to < num_chips_ && HubToChip(from, to) >= 0) {
    ids.push_back(HubToChip(from, to));
  }
  return ids;
}

// The links `fault` names, in id order: a pair of chips (both ways unless
// one_way), a chip's NIC (to_chip -1: both ways unless one_way), or with
// one_way and from_chip -1 a chip's NIC ingress.
std::vector<int> FabricLinks::FaultedLinks(const proto::LinkFault& fault) const {
  const int a = fault.from_chip(), b = fault.to_chip();
  const int sw = efa_switch_;
  std::vector<int> ids;
  auto add = [&](const std::vector<int>& more) { ids.insert(ids.end(), more.begin(), more.end()); };
  if (sw >= 0 && b == -1) add(LinksBetween(a, sw));
  if (sw >= 0 && ((!fault.one_way() && b == -1 && a >= 0) || (fault.one_way() && a == -1))) {
    add(LinksBetween(sw, fault.one_way() ? b : a));
  }
  if (a >= 0 && b >= 0) {
    add(LinksBetween(a, b));
    if (!fault.one_way()) add(LinksBetween(b, a));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void FabricLinks::ApplyFaults(const proto::TopologySpec& spec) {
  for (const auto& fault : spec.faults()) {
    const std::vector<int> ids = FaultedLinks(fault);
    NEURON_CHECK(!ids.empty(), "fault names a link that does not exist: ",
                 fault.from_chip() == -1 ? std::string("NIC") : ChipName(fault.from_chip()),
                 " -> ", fault.to_chip() == -1 ? std::string("NIC") : ChipName(fault.to_chip()));
    for (int id : ids) {
      const Hop hop = At(id);
      auto& state = faulted_.emplace(id, std::make_pair(hop.bytes_per_second, false)).first->second;
      if (fault.down()) {
        state.second = true;
        if (!down_links_.empty()) down_links_ += ", ";
        down_links_ += Name(id);
      } else {
        state.first /= fault.slowdown();
      }
      for (int v : {hop.from, hop.to}) {
        if (NodeOf(v) >= 0) faulty_nodes_.insert(NodeOf(v));
      }
    }
  }
}

}  // namespace neuron::runtime
