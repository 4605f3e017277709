#include "neuron/runtime/topology.h"

#include <algorithm>
#include <cmath>

#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/text_proto.h"

namespace neuron::runtime {

// Defined in the generated default_topology.cc (from trn2-node.textproto).
extern const char* const kDefaultTopologyText;

namespace {

// Sanity bounds: a fabric beyond them is a typo, not a machine (the model
// would spend minutes and gigabytes building it, or give inf or 1e123 us).
constexpr std::uint64_t kMaxChipsPerNode = 4096;
constexpr std::uint32_t kMaxNodes = 65536;
constexpr std::uint32_t kMaxCoresPerChip = 64;
constexpr double kMinBandwidthGbps = 1e-3;     // 1 MB/s
constexpr double kMaxBandwidthGbps = 1e6;      // 1 PB/s
constexpr double kMaxLatencyUs = 1e6;          // 1 s
constexpr double kMaxSlowdown = 1e6;
constexpr double kMaxDelayUs = 1e9;            // 1000 s
constexpr std::uint64_t kMaxChunkBytes = std::uint64_t{1} << 40;
constexpr std::uint32_t kMaxChunks = 4096;

void CheckLink(const proto::LinkSpec& link, const std::string& field,
               const std::string& origin) {
  NEURON_CHECK(std::isfinite(link.bandwidth_gbps()) &&
                   link.bandwidth_gbps() >= kMinBandwidthGbps &&
                   link.bandwidth_gbps() <= kMaxBandwidthGbps,
               "topology ", origin, ": ", field, ".bandwidth_gbps must be ", kMinBandwidthGbps,
               " to ", kMaxBandwidthGbps, " GB/s, got ", link.bandwidth_gbps());
  NEURON_CHECK(std::isfinite(link.latency_us()) && link.latency_us() >= 0 &&
                   link.latency_us() <= kMaxLatencyUs,
               "topology ", origin, ": ", field, ".latency_us must be 0 to ", kMaxLatencyUs,
               " us, got ", link.latency_us());
}

// A node's wiring: torus_dims multiplying to chips_per_node, or, for a
// switch, none; a switch joining every node leaves inter_node_link out.
void CheckWiring(const proto::TopologySpec& spec, const std::string& origin) {
  if (spec.intra_node() == proto::TopologySpec::SWITCH) {
    NEURON_CHECK(spec.torus_dims_size() == 0, "topology ", origin,
                 ": torus_dims must be empty with intra_node: SWITCH (no torus)");
    NEURON_CHECK(!SharedSwitch(spec) || !spec.has_inter_node_link(), "topology ", origin,
                 ": with intra_node: SWITCH and inter_node: NEURONLINK one switch joins "
                 "every node's chips (intra_node_link is a chip's port): leave "
                 "inter_node_link out");
    return;
  }
  NEURON_CHECK(spec.torus_dims_size() > 0, "topology ", origin, ": torus_dims is empty");
  std::uint64_t product = 1;
  for (auto d : spec.torus_dims()) {
    NEURON_CHECK(d > 0 && d <= kMaxChipsPerNode, "topology ", origin,
                 ": torus_dims must each be 1 to ", kMaxChipsPerNode, ", got ", d);
    product *= d;  // at most 4096^k: compared below before it could matter
    NEURON_CHECK(product <= kMaxChipsPerNode, "topology ", origin, ": torus_dims multiply to "
                 "more than ", kMaxChipsPerNode, " chips");
  }
  NEURON_CHECK(product == spec.chips_per_node(), "topology ", origin,
               ": torus_dims multiply to ", product, " but chips_per_node is ",
               spec.chips_per_node());
}

}  // namespace

bool SharedSwitch(const proto::TopologySpec& spec) {
  return spec.intra_node() == proto::TopologySpec::SWITCH &&
         spec.inter_node() == proto::TopologySpec::NEURONLINK;
}

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
  return WithEnvironmentFaults(path ? FromFile(*path) : Default());
}

Topology Topology::WithEnvironmentFaults(Topology topology) {
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
  NEURON_CHECK(spec_.chips_per_node() > 0 && spec_.chips_per_node() <= kMaxChipsPerNode,
               "topology ", origin_, ": chips_per_node must be 1 to ", kMaxChipsPerNode,
               ", got ", spec_.chips_per_node());
  NEURON_CHECK(spec_.num_nodes() <= kMaxNodes, "topology ", origin_, ": num_nodes must be 0 to ",
               kMaxNodes, ", got ", spec_.num_nodes());
  NEURON_CHECK(spec_.cores_per_chip() <= kMaxCoresPerChip, "topology ", origin_,
               ": cores_per_chip must be 0 (8) to ", kMaxCoresPerChip, ", got ",
               spec_.cores_per_chip());
  NEURON_CHECK(spec_.logical_nc_config() <= 2, "topology ", origin_,
               ": logical_nc_config must be 0 (2), 1 or 2, got ", spec_.logical_nc_config());
  CheckWiring(spec_, origin_);
  NEURON_CHECK(spec_.ranks_per_chip() >= 1 && spec_.ranks_per_chip() <= 8,
               "topology ", origin_, ": ranks_per_chip must be 1..8, got ",
               spec_.ranks_per_chip());
  CheckLink(spec_.intra_node_link(), "intra_node_link", origin_);
  if (!SharedSwitch(spec_)) CheckLink(spec_.inter_node_link(), "inter_node_link", origin_);
  if (spec_.ranks_per_chip() > 1 || spec_.has_on_chip_link()) {
    CheckLink(spec_.on_chip_link(), "on_chip_link", origin_);
  }
  const int chips = static_cast<int>(spec_.chips_per_node()) *
                    static_cast<int>(std::max<std::uint32_t>(spec_.num_nodes(), 1));
  const auto& engine = spec_.collective_engine();
  NEURON_CHECK(engine.min_chunk_bytes() <= kMaxChunkBytes && engine.max_chunks() <= kMaxChunks,
               "topology ", origin_, ": collective_engine needs min_chunk_bytes 0 to ",
               kMaxChunkBytes, " and max_chunks 0 to ", kMaxChunks, ", got ",
               engine.min_chunk_bytes(), " and ", engine.max_chunks());
  for (const auto& f : spec_.faults()) {
    const bool efa = spec_.inter_node() == proto::TopologySpec::EFA;
    const bool nic_out = f.to_chip() == -1 && f.from_chip() >= 0;
    const bool nic_in = f.one_way() && f.from_chip() == -1 && f.to_chip() >= 0;
    NEURON_CHECK((f.from_chip() >= 0 && f.to_chip() >= 0) || (efa && (nic_out || nic_in)),
                 "topology ", origin_, ": fault on link ", f.from_chip(), "->", f.to_chip(),
                 " names a negative chip (-1, a NIC, only on EFA: to_chip -1 for a chip's "
                 "NIC, from_chip -1 with one_way for its ingress)");
    NEURON_CHECK(spec_.num_nodes() == 0 || (f.from_chip() < chips && f.to_chip() < chips),
                 "topology ", origin_, ": fault on link ", f.from_chip(), "->",
                 f.to_chip(), " names a chip beyond the ", chips, " chips");
    NEURON_CHECK(f.down() || (std::isfinite(f.slowdown()) && f.slowdown() >= 1.0 &&
                              f.slowdown() <= kMaxSlowdown),
                 "topology ", origin_, ": fault on link ", f.from_chip(), "->", f.to_chip(),
                 " needs down: true or slowdown 1 to ", kMaxSlowdown, ", got ", f.slowdown());
  }
  for (const auto& d : spec_.rank_delays()) {
    NEURON_CHECK(d.rank() >= 0 && std::isfinite(d.delay_us()) && d.delay_us() >= 0 &&
                     d.delay_us() <= kMaxDelayUs,
                 "topology ", origin_, ": rank_delays needs rank >= 0 and delay_us 0 to ",
                 kMaxDelayUs, ", got rank ", d.rank(), " delay ", d.delay_us());
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

std::uint32_t Topology::CoresPerChip() const {
  return spec_.cores_per_chip() != 0 ? spec_.cores_per_chip() : 8;
}

ChipPlacement Topology::Place(std::uint32_t node, std::uint32_t local_rank) const {
  ChipPlacement p;
  p.node = node;
  p.chip = node * spec_.chips_per_node() + local_rank / spec_.ranks_per_chip();
  p.core = local_rank % spec_.ranks_per_chip();
  return p;
}

}  // namespace neuron::runtime
