#include "neuron/runtime/fabric/collective_schedules.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/hierarchy_levels.h"

namespace neuron::runtime {

namespace {

bool IsPowerOfTwo(std::size_t n) { return n > 0 && (n & (n - 1)) == 0; }

// One step in which ring[i] sends `bytes` to ring[i + 1] for every i.
Step RingStep(const std::vector<int>& ring, double bytes, bool reduce) {
  Step step;
  const std::size_t n = ring.size();
  for (std::size_t i = 0; i < n; ++i) {
    step.transfers.push_back({ring[i], ring[(i + 1) % n], bytes, reduce});
  }
  return step;
}

// Several groups stepping together: step k of every group in one step,
// `steps` times (one entry repeated).
void AppendRings(Schedule& s, const std::vector<std::vector<int>>& rings, double chunk,
                 std::size_t steps, bool reduce) {
  if (steps == 0) return;
  Step step;
  for (const auto& ring : rings) {
    if (ring.size() < 2) continue;
    const Step part = RingStep(ring, chunk, reduce);
    step.transfers.insert(step.transfers.end(), part.transfers.begin(), part.transfers.end());
  }
  step.repeat = steps;
  s.steps.push_back(std::move(step));
}

// Every rank sends `bytes` to every other rank in one step (kept as the
// ranks: Step::mesh).
Step MeshStep(const std::vector<int>& ranks, double bytes, bool reduce) {
  Step step;
  step.mesh = ranks;
  step.mesh_bytes = bytes;
  step.mesh_reduce = reduce;
  return step;
}

// Pairwise exchange with partner i ^ distance.
Step ExchangeStep(const std::vector<int>& ranks, std::size_t distance, double bytes,
                  bool reduce) {
  Step step;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    step.transfers.push_back({ranks[i], ranks[i ^ distance], bytes, reduce});
  }
  return step;
}

// Ends a stage named `name` that began at step `first`.
void CloseStage(Schedule& s, std::string name, std::size_t first) {
  s.stages.push_back({std::move(name), first, s.steps.size()});
}

int SnakePosition(const FabricModel& model, const ChipPlacement& p) {
  const auto& dims = model.topology().spec().torus_dims();
  const int local = static_cast<int>(p.chip) % model.graph().chips_per_node();
  if (dims.size() != 2) return local;
  const int cols = static_cast<int>(dims[1]);
  const int row = local / cols, col = local % cols;
  return row * cols + (row % 2 == 0 ? col : cols - 1 - col);
}

bool SpansNodes(const FabricModel& model, const std::vector<int>& ranks) {
  for (int r : ranks) {
    if (model.placement()[r].node != model.placement()[ranks[0]].node) return true;
  }
  return false;
}

// The ring's channels: `ring` itself, or across nodes the topology's
// inter_node_ring_channels rings (no more than the fewest ranks a node has
// in the ring), channel k with each node's part rotated by k/channels of its
// length, so that each channel leaves every node from another rank.
std::vector<std::vector<int>> RingChannels(const FabricModel& model, const std::vector<int>& ring) {
  const std::size_t asked =
      static_cast<std::size_t>(model.calibration().inter_node_ring_channels());
  if (asked == 1 || !SpansNodes(model, ring)) return {ring};
  std::vector<std::vector<int>> parts;  // per node, in ring order
  for (std::size_t i = 0; i < ring.size(); ++i) {
    if (i == 0 || model.placement()[ring[i]].node != model.placement()[ring[i - 1]].node) {
      parts.emplace_back();
    }
    parts.back().push_back(ring[i]);
  }
  std::size_t channels = asked;
  for (const auto& part : parts) channels = std::min(channels, part.size());
  std::vector<std::vector<int>> out;
  for (std::size_t k = 0; k < channels; ++k) {
    std::vector<int> channel;
    for (const auto& part : parts) {
      const std::size_t shift = part.size() * k / channels;
      for (std::size_t i = 0; i < part.size(); ++i) {
        channel.push_back(part[(i + shift) % part.size()]);
      }
    }
    out.push_back(std::move(channel));
  }
  return out;
}

Schedule Ring(const FabricModel& model, const CollectiveShape& shape) {
  Schedule s;
  s.algorithm = "ring";
  const auto ring = RingOrder(model, shape.ranks);
  const std::size_t n = ring.size();
  const double chunk = shape.bytes / static_cast<double>(n);
  const auto channels = RingChannels(model, ring);
  const double part = chunk / static_cast<double>(channels.size());
  switch (shape.kind) {
    case CollectiveKind::kAllReduce:
      AppendRings(s, channels, part, n - 1, /*reduce=*/true);
      AppendRings(s, channels, part, n - 1, /*reduce=*/false);
      break;
    case CollectiveKind::kAllGather:
      AppendRings(s, channels, part, n - 1, /*reduce=*/false);
      break;
    case CollectiveKind::kReduceScatter:
      AppendRings(s, channels, part, n - 1, /*reduce=*/true);
      break;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce: {  // a chain from the root (to it, for reduce)
      const int root = shape.ranks[static_cast<std::size_t>(shape.root)];
      const auto start = std::find(ring.begin(), ring.end(), root) - ring.begin();
      for (std::size_t k = 0; k + 1 < n; ++k) {
        const int a = ring[(start + k) % n], b = ring[(start + k + 1) % n];
        s.steps.push_back({{{a, b, shape.bytes}}});
      }
      if (shape.kind == CollectiveKind::kReduce) {
        std::reverse(s.steps.begin(), s.steps.end());
        for (auto& step : s.steps) {
          std::swap(step.transfers[0].src, step.transfers[0].dst);
          step.transfers[0].reduce = true;
        }
      }
      break;
    }
    case CollectiveKind::kAllToAll:  // store and forward: step k carries what is k+ hops away
      for (std::size_t k = 1; k < n; ++k) {
        AppendRings(s, channels, static_cast<double>(n - k) * part, 1, /*reduce=*/false);
      }
      break;
  }
  return s;
}

Schedule Mesh(const CollectiveShape& shape) {
  Schedule s;
  s.algorithm = "mesh";
  s.serial_sends = true;  // nec.h: "Mesh uses only a single channel"
  NEURON_CHECK(shape.kind != CollectiveKind::kBroadcast && shape.kind != CollectiveKind::kReduce,
               "mesh does not implement ", Name(shape.kind));
  const double share = shape.bytes / static_cast<double>(shape.ranks.size());
  const bool reduces = shape.kind == CollectiveKind::kAllReduce ||
                       shape.kind == CollectiveKind::kReduceScatter;
  s.steps.push_back(MeshStep(shape.ranks, share, reduces));
  if (shape.kind == CollectiveKind::kAllReduce) {
    s.steps.push_back(MeshStep(shape.ranks, share, false));
  }
  return s;
}

Schedule Rdh(const CollectiveShape& shape) {
  const std::size_t n = shape.ranks.size();
  NEURON_CHECK(IsPowerOfTwo(n), "rdh needs a power-of-two group, got ", n, " ranks");
  Schedule s;
  s.algorithm = "rdh";
  const bool halve = shape.kind == CollectiveKind::kAllReduce ||
                     shape.kind == CollectiveKind::kReduceScatter;
  const bool double_up = shape.kind == CollectiveKind::kAllReduce ||
                         shape.kind == CollectiveKind::kAllGather;
  NEURON_CHECK(halve || double_up, "rdh does not implement ", Name(shape.kind));
  if (halve) {  // distance n/2, n/4, ...: half of what is left each step
    double bytes = shape.bytes;
    for (std::size_t d = n / 2; d >= 1; d /= 2) {
      bytes /= 2;
      s.steps.push_back(ExchangeStep(shape.ranks, d, bytes, /*reduce=*/true));
    }
  }
  if (double_up) {  // distance 1, 2, ...: twice as much each step
    double bytes = shape.bytes / static_cast<double>(n);
    for (std::size_t d = 1; d < n; d *= 2) {
      s.steps.push_back(ExchangeStep(shape.ranks, d, bytes, /*reduce=*/false));
      bytes *= 2;
    }
  }
  return s;
}

Schedule RecursiveDoubling(const CollectiveShape& shape) {
  const std::size_t n = shape.ranks.size();
  NEURON_CHECK(IsPowerOfTwo(n), "recursive_doubling needs a power-of-two group, got ", n);
  NEURON_CHECK(shape.kind == CollectiveKind::kAllReduce,
               "recursive_doubling implements allreduce only");
  Schedule s;
  s.algorithm = "recursive_doubling";
  for (std::size_t d = 1; d < n; d *= 2) {
    s.steps.push_back(ExchangeStep(shape.ranks, d, shape.bytes, /*reduce=*/true));
  }
  return s;
}

Schedule Tree(const CollectiveShape& shape) {
  NEURON_CHECK(shape.kind == CollectiveKind::kBroadcast || shape.kind == CollectiveKind::kReduce,
               "tree implements broadcast and reduce");
  Schedule s;
  s.algorithm = "tree";
  const std::size_t n = shape.ranks.size();
  auto rank_at = [&](std::size_t relative) {
    return shape.ranks[(relative + static_cast<std::size_t>(shape.root)) % n];
  };
  for (std::size_t span = 1; span < n; span *= 2) {  // binomial: senders double
    Step step;
    for (std::size_t i = 0; i < span && i + span < n; ++i) {
      step.transfers.push_back({rank_at(i), rank_at(i + span), shape.bytes});
    }
    s.steps.push_back(std::move(step));
  }
  if (shape.kind == CollectiveKind::kReduce) {  // the same tree, leaves first
    std::reverse(s.steps.begin(), s.steps.end());
    for (auto& step : s.steps) {
      for (auto& t : step.transfers) {
        std::swap(t.src, t.dst);
        t.reduce = true;
      }
    }
  }
  return s;
}

// The chunk count the model rates fastest for a multi-stage schedule of a
// `bytes` buffer: 1, 2, 4, ... up to the engine's max_chunks, chunks of at
// least min_chunk_bytes (the fewest on a tie).
int FastestChunkCount(const FabricModel& model, Schedule s, double bytes) {
  const auto& engine = model.topology().spec().collective_engine();
  const double min_chunk = static_cast<double>(engine.min_chunk_bytes());
  const int max_chunks = engine.max_chunks() != 0 ? static_cast<int>(engine.max_chunks()) : 64;
  s.chunks = 1;
  int best = 1;
  double best_us = model.Simulate(s).total.count();
  for (int k = 2; min_chunk > 0 && k <= max_chunks && bytes / k >= min_chunk; k *= 2) {
    s.chunks = k;
    const double us = model.Simulate(s).total.count();
    if (us < best_us) {
      best = k;
      best_us = us;
    }
  }
  return best;
}

// One ring stage per level (HierarchyLevels): reduce-scatter inner levels
// first, allgather outer levels first; allreduce is the one then the other.
Schedule Hierarchical(const FabricModel& model, const CollectiveShape& shape) {
  const auto levels = HierarchyLevels(model, shape.ranks);
  NEURON_CHECK(levels.has_value(), "hierarchical needs the same number of ranks on every node");
  NEURON_CHECK(shape.kind == CollectiveKind::kAllReduce ||
                   shape.kind == CollectiveKind::kAllGather ||
                   shape.kind == CollectiveKind::kReduceScatter,
               "hierarchical does not implement ", Name(shape.kind));
  Schedule s;
  s.algorithm = "hierarchical";
  double held = shape.bytes;  // what each rank still reduces, or already gathered
  if (shape.kind != CollectiveKind::kAllGather) {
    for (const auto& level : *levels) {
      const std::size_t l = level.groups[0].size();
      const std::size_t first = s.steps.size();
      AppendRings(s, level.groups, held / l, l - 1, /*reduce=*/true);
      CloseStage(s, "reduce-scatter over " + level.name, first);
      held /= l;
    }
  } else {
    held = shape.bytes / static_cast<double>(shape.ranks.size());
  }
  if (shape.kind != CollectiveKind::kReduceScatter) {
    for (auto level = levels->rbegin(); level != levels->rend(); ++level) {
      const std::size_t l = level->groups[0].size();
      const std::size_t first = s.steps.size();
      AppendRings(s, level->groups, held, l - 1, /*reduce=*/false);
      CloseStage(s, "allgather over " + level->name, first);
      held *= l;
    }
  }
  s.kind = shape.kind;  // the chunk count is chosen with the calibrated costs
  if (s.stages.size() > 1) s.chunks = FastestChunkCount(model, s, shape.bytes);
  return s;
}

// Neuron's documented algorithms that run the shape: the automatic choice's
// candidates (hierarchical only across nodes).
std::vector<FabricAlgorithm> Candidates(const FabricModel& model, const CollectiveShape& shape) {
  std::vector<FabricAlgorithm> out;
  for (auto a : {FabricAlgorithm::kRing, FabricAlgorithm::kMesh, FabricAlgorithm::kRdh,
                 FabricAlgorithm::kHierarchical, FabricAlgorithm::kTree}) {
    if (a == FabricAlgorithm::kHierarchical && !SpansNodes(model, shape.ranks)) continue;
    if (Implements(model, a, shape)) out.push_back(a);
  }
  return out;
}

}  // namespace

std::vector<int> AllRanks(int n) {
  std::vector<int> ranks(n);
  for (int i = 0; i < n; ++i) ranks[i] = i;
  return ranks;
}

std::vector<int> RingOrder(const FabricModel& model, const std::vector<int>& ranks) {
  std::vector<int> ring = ranks;
  std::stable_sort(ring.begin(), ring.end(), [&](int a, int b) {
    const auto& pa = model.placement()[a];
    const auto& pb = model.placement()[b];
    return std::make_tuple(pa.node, SnakePosition(model, pa), pa.core) <
           std::make_tuple(pb.node, SnakePosition(model, pb), pb.core);
  });
  return ring;
}

FabricAlgorithm ConfiguredFabricAlgorithm() {
  const auto value = ConfigRegistry::Get().Find(ConfigKey::kFabricAlgorithm);
  if (!value || value->empty()) return FabricAlgorithm::kAuto;
  const auto algorithm = ParseFabricAlgorithm(*value);
  NEURON_CHECK(algorithm.has_value(), "NEURON_FABRIC_ALGO must be auto, ",
               FabricAlgorithmNames(), ", got '", *value, "'");
  return *algorithm;
}

bool Implements(const FabricModel& model, FabricAlgorithm algorithm,
                const CollectiveShape& shape) {
  const auto k = shape.kind;
  const bool reducing_or_gathering = k == CollectiveKind::kAllReduce ||
                                     k == CollectiveKind::kAllGather ||
                                     k == CollectiveKind::kReduceScatter;
  switch (algorithm) {
    case FabricAlgorithm::kAuto:
    case FabricAlgorithm::kRing: return true;
    case FabricAlgorithm::kMesh:
      return reducing_or_gathering || k == CollectiveKind::kAllToAll;
    case FabricAlgorithm::kRdh:
      return reducing_or_gathering && IsPowerOfTwo(shape.ranks.size());
    case FabricAlgorithm::kRecursiveDoubling:
      return k == CollectiveKind::kAllReduce && IsPowerOfTwo(shape.ranks.size());
    case FabricAlgorithm::kTree:
      return k == CollectiveKind::kBroadcast || k == CollectiveKind::kReduce;
    case FabricAlgorithm::kHierarchical:
      return reducing_or_gathering && HierarchyLevels(model, shape.ranks).has_value();
  }
  return false;
}

FabricAlgorithm ChooseAlgorithm(const FabricModel& model, const CollectiveShape& shape) {
  return AutomaticSchedule(model, shape).algorithm;
}

ChosenSchedule AutomaticSchedule(const FabricModel& model, const CollectiveShape& shape) {
  if (shape.ranks.size() > 1) {
    for (FabricAlgorithm a : model.calibration().RuledAlgorithms(
             shape.kind, shape.bytes, SpansNodes(model, shape.ranks))) {
      if (!Implements(model, a, shape)) continue;
      Schedule s = BuildSchedule(model, shape, a);
      const double us = model.Simulate(s).total.count();
      return {a, std::move(s), us};
    }
  }
  ChosenSchedule best{FabricAlgorithm::kRing, {}, std::numeric_limits<double>::infinity()};
  for (FabricAlgorithm a : Candidates(model, shape)) {
    Schedule s = BuildSchedule(model, shape, a);
    const double us = model.Simulate(s).total.count();
    if (us < best.micros) best = {a, std::move(s), us};
  }
  return best;  // ring runs every shape: never empty
}

Schedule BuildSchedule(const FabricModel& model, const CollectiveShape& shape,
                       FabricAlgorithm algorithm) {
  NEURON_CHECK(!shape.ranks.empty(), "a collective needs at least one rank");
  NEURON_CHECK(shape.bytes >= 0, "negative collective size ", shape.bytes);
  if (shape.ranks.size() == 1) {
    Schedule local;
    local.algorithm = "local";
    return local;
  }
  Schedule s;
  switch (algorithm == FabricAlgorithm::kAuto ? ChooseAlgorithm(model, shape) : algorithm) {
    case FabricAlgorithm::kRing: s = Ring(model, shape); break;
    case FabricAlgorithm::kMesh: s = Mesh(shape); break;
    case FabricAlgorithm::kRdh: s = Rdh(shape); break;
    case FabricAlgorithm::kRecursiveDoubling: s = RecursiveDoubling(shape); break;
    case FabricAlgorithm::kHierarchical: s = Hierarchical(model, shape); break;
    case FabricAlgorithm::kTree: s = Tree(shape); break;
    case FabricAlgorithm::kAuto: NEURON_ASSERT(false, "unhandled algorithm");
  }
  s.kind = shape.kind;
  return s;
}

double BusBandwidthFactor(CollectiveKind kind, int n) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll: return static_cast<double>(n - 1) / n;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce: return 1.0;
  }
  return 1.0;
}

}  // namespace neuron::runtime
