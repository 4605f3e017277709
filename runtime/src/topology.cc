#include "neuron/runtime/topology.h"

#include <algorithm>

#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/text_proto.h"

namespace neuron::runtime {

// Defined in the generated default_topology.cc (from trn2-node.textproto).
extern const char* const kDefaultTopologyText;

namespace {

void CheckLink(const proto::LinkSpec& link, const std::string& field,
               const std::string& origin) {
  NEURON_CHECK(link.bandwidth_gbps() > 0, "topology ", origin, ": ", field,
               ".bandwidth_gbps must be > 0, got ", link.bandwidth_gbps());
  NEURON_CHECK(link.latency_us() >= 0, "topology ", origin, ": ", field,
               ".latency_us must be >= 0, got ", link.latency_us());
}

}  // namespace

Topology::Topology(proto::TopologySpec spec, std::string origin)
    : spec_(std::move(spec)), origin_(std::move(origin)) {
  Validate();
}

Topology Topology::Default() {
  return FromText(kDefaultTopologyText, "<embedded trn2-node>");
}

Topology Topology::FromFile(const std::string& path) {
  return FromText(ReadTextFile(path, "topology"), path);
}

Topology Topology::FromText(const std::string& text, const std::string& origin) {
  proto::TopologySpec spec;
  ParseTextProto(text, origin, "topology", &spec);
  return Topology(std::move(spec), origin);
}

Topology Topology::FromEnvironment() {
  auto path = ConfigRegistry::Get().Find(ConfigKey::kTopologyFile);
  Topology topology = path ? FromFile(*path) : Default();
  const auto faults = ConfigRegistry::Get().Find(ConfigKey::kFaults);
  if (!faults) return topology;
  const std::string origin = "$NEURON_FAULTS";
  proto::TopologySpec extra;
  ParseTextProto(*faults, origin, "topology", &extra);
  proto::TopologySpec only_faults;
  *only_faults.mutable_faults() = extra.faults();
  *only_faults.mutable_rank_delays() = extra.rank_delays();
  NEURON_CHECK(only_faults.SerializeAsString() == extra.SerializeAsString(), "topology ",
               origin, ": only faults {...} and rank_delays {...} may be given");
  proto::TopologySpec merged = topology.spec();
  merged.MergeFrom(only_faults);
  return Topology(std::move(merged), topology.origin() + " + " + origin);
}

void Topology::Validate() const {
  NEURON_CHECK(spec_.chips_per_node() > 0, "topology ", origin_,
               ": chips_per_node must be > 0");
  NEURON_CHECK(spec_.torus_dims_size() > 0, "topology ", origin_,
               ": torus_dims is empty");
  std::uint64_t product = 1;
  for (auto d : spec_.torus_dims()) {
    NEURON_CHECK(d > 0, "topology ", origin_, ": torus_dims has a 0");
    product *= d;
  }
  NEURON_CHECK(product == spec_.chips_per_node(), "topology ", origin_,
               ": torus_dims multiply to ", product, " but chips_per_node is ",
               spec_.chips_per_node());
  NEURON_CHECK(spec_.ranks_per_chip() >= 1 && spec_.ranks_per_chip() <= 8,
               "topology ", origin_, ": ranks_per_chip must be 1..8, got ",
               spec_.ranks_per_chip());
  CheckLink(spec_.intra_node_link(), "intra_node_link", origin_);
  CheckLink(spec_.inter_node_link(), "inter_node_link", origin_);
  if (spec_.ranks_per_chip() > 1 || spec_.has_on_chip_link()) {
    CheckLink(spec_.on_chip_link(), "on_chip_link", origin_);
  }
  const int chips = static_cast<int>(spec_.chips_per_node()) *
                    static_cast<int>(std::max<std::uint32_t>(spec_.num_nodes(), 1));
  for (const auto& f : spec_.faults()) {
    const bool nic = f.to_chip() == -1 && spec_.inter_node() == proto::TopologySpec::EFA;
    NEURON_CHECK(f.from_chip() >= 0 && (nic || f.to_chip() >= 0), "topology ", origin_,
                 ": fault on link ", f.from_chip(), "->", f.to_chip(),
                 " names a negative chip");
    NEURON_CHECK(spec_.num_nodes() == 0 || (f.from_chip() < chips && f.to_chip() < chips),
                 "topology ", origin_, ": fault on link ", f.from_chip(), "->",
                 f.to_chip(), " names a chip beyond the ", chips, " chips");
    NEURON_CHECK(f.down() || f.slowdown() >= 1.0, "topology ", origin_, ": fault on link ",
                 f.from_chip(), "->", f.to_chip(), " needs down: true or slowdown >= 1, got ",
                 f.slowdown());
  }
  for (const auto& d : spec_.rank_delays()) {
    NEURON_CHECK(d.rank() >= 0 && d.delay_us() >= 0, "topology ", origin_,
                 ": rank_delays needs rank >= 0 and delay_us >= 0, got rank ", d.rank(),
                 " delay ", d.delay_us());
  }
}

void Topology::CheckFits(std::uint32_t num_nodes,
                         const std::vector<std::uint32_t>& ranks_per_node) const {
  if (spec_.num_nodes() != 0) {
    NEURON_CHECK(num_nodes <= spec_.num_nodes(), "topology ", origin_, " has ",
                 spec_.num_nodes(), " nodes but the job has ", num_nodes);
  }
  const std::uint32_t slots = spec_.chips_per_node() * spec_.ranks_per_chip();
  for (std::size_t node = 0; node < ranks_per_node.size(); ++node) {
    NEURON_CHECK(ranks_per_node[node] <= slots, "topology ", origin_, " has ",
                 spec_.chips_per_node(), " chips x ", spec_.ranks_per_chip(),
                 " ranks per chip = ", slots, " slots per node, but node ",
                 node, " has ", ranks_per_node[node], " ranks");
  }
}

SimDuration Topology::RankDelay(int rank) const {
  SimDuration delay{0};
  for (const auto& d : spec_.rank_delays()) {
    if (d.rank() == rank) delay += SimDuration(d.delay_us());
  }
  return delay;
}

ChipPlacement Topology::Place(std::uint32_t node, std::uint32_t local_rank) const {
  ChipPlacement p;
  p.node = node;
  p.chip = node * spec_.chips_per_node() + local_rank / spec_.ranks_per_chip();
  p.core = local_rank % spec_.ranks_per_chip();
  return p;
}

}  // namespace neuron::runtime
