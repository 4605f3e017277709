#include "neuron/runtime/fabric/collective_schedules.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {

bool IsPowerOfTwo(std::size_t n) { return n > 0 && (n & (n - 1)) == 0; }

// One step in which ring[i] sends `bytes` to ring[i + 1] for every i.
Step RingStep(const std::vector<int>& ring, double bytes) {
  Step step;
  const std::size_t n = ring.size();
  for (std::size_t i = 0; i < n; ++i) step.transfers.push_back({ring[i], ring[(i + 1) % n], bytes});
  return step;
}

void AppendRing(Schedule& s, const std::vector<int>& ring, double chunk, std::size_t steps) {
  for (std::size_t k = 0; k < steps; ++k) s.steps.push_back(RingStep(ring, chunk));
}

// Several groups stepping together: step k of every group in one step.
void AppendRings(Schedule& s, const std::vector<std::vector<int>>& rings, double chunk,
                 std::size_t steps) {
  for (std::size_t k = 0; k < steps; ++k) {
    Step step;
    for (const auto& ring : rings) {
      if (ring.size() < 2) continue;
      const Step part = RingStep(ring, chunk);
      step.transfers.insert(step.transfers.end(), part.transfers.begin(), part.transfers.end());
    }
    s.steps.push_back(std::move(step));
  }
}

// Every rank sends `bytes` to every other rank in one step.
Step MeshStep(const std::vector<int>& ranks, double bytes) {
  Step step;
  for (int a : ranks) {
    for (int b : ranks) {
      if (a != b) step.transfers.push_back({a, b, bytes});
    }
  }
  return step;
}

// Pairwise exchange with partner i ^ distance.
Step ExchangeStep(const std::vector<int>& ranks, std::size_t distance, double bytes) {
  Step step;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    step.transfers.push_back({ranks[i], ranks[i ^ distance], bytes});
  }
  return step;
}

int SnakePosition(const FabricModel& model, const ChipPlacement& p) {
  const auto& dims = model.topology().spec().torus_dims();
  const int local = static_cast<int>(p.chip) % model.graph().chips_per_node();
  if (dims.size() != 2) return local;
  const int cols = static_cast<int>(dims[1]);
  const int row = local / cols, col = local % cols;
  return row * cols + (row % 2 == 0 ? col : cols - 1 - col);
}

// Participants grouped by node (ring order inside each).
std::vector<std::vector<int>> ByNode(const FabricModel& model, const std::vector<int>& ring) {
  std::map<std::uint32_t, std::vector<int>> groups;
  for (int r : ring) groups[model.placement()[r].node].push_back(r);
  std::vector<std::vector<int>> out;
  for (auto& [node, ranks] : groups) out.push_back(std::move(ranks));
  return out;
}

Schedule Ring(const FabricModel& model, const CollectiveShape& shape) {
  Schedule s{"ring", {}};
  const auto ring = RingOrder(model, shape.ranks);
  const std::size_t n = ring.size();
  const double chunk = shape.bytes / static_cast<double>(n);
  switch (shape.kind) {
    case CollectiveKind::kAllReduce:
      AppendRing(s, ring, chunk, 2 * (n - 1));
      break;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      AppendRing(s, ring, chunk, n - 1);
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
        for (auto& step : s.steps) std::swap(step.transfers[0].src, step.transfers[0].dst);
      }
      break;
    }
    case CollectiveKind::kAllToAll:
      NEURON_CHECK(false, "ring is not an all-to-all algorithm; use mesh");
  }
  return s;
}

Schedule Mesh(const CollectiveShape& shape) {
  Schedule s{"mesh", {}};
  const double share = shape.bytes / static_cast<double>(shape.ranks.size());
  s.steps.push_back(MeshStep(shape.ranks, share));
  if (shape.kind == CollectiveKind::kAllReduce) s.steps.push_back(MeshStep(shape.ranks, share));
  NEURON_CHECK(shape.kind != CollectiveKind::kBroadcast && shape.kind != CollectiveKind::kReduce,
               "mesh does not implement ", Name(shape.kind));
  return s;
}

Schedule Rdh(const CollectiveShape& shape) {
  const std::size_t n = shape.ranks.size();
  NEURON_CHECK(IsPowerOfTwo(n), "rdh needs a power-of-two group, got ", n, " ranks");
  Schedule s{"rdh", {}};
  const bool halve = shape.kind == CollectiveKind::kAllReduce ||
                     shape.kind == CollectiveKind::kReduceScatter;
  const bool double_up = shape.kind == CollectiveKind::kAllReduce ||
                         shape.kind == CollectiveKind::kAllGather;
  NEURON_CHECK(halve || double_up, "rdh does not implement ", Name(shape.kind));
  if (halve) {  // distance n/2, n/4, ...: half of what is left each step
    double bytes = shape.bytes;
    for (std::size_t d = n / 2; d >= 1; d /= 2) {
      bytes /= 2;
      s.steps.push_back(ExchangeStep(shape.ranks, d, bytes));
    }
  }
  if (double_up) {  // distance 1, 2, ...: twice as much each step
    double bytes = shape.bytes / static_cast<double>(n);
    for (std::size_t d = 1; d < n; d *= 2) {
      s.steps.push_back(ExchangeStep(shape.ranks, d, bytes));
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
  Schedule s{"recursive_doubling", {}};
  for (std::size_t d = 1; d < n; d *= 2) s.steps.push_back(ExchangeStep(shape.ranks, d, shape.bytes));
  return s;
}

Schedule Tree(const CollectiveShape& shape) {
  NEURON_CHECK(shape.kind == CollectiveKind::kBroadcast || shape.kind == CollectiveKind::kReduce,
               "tree implements broadcast and reduce");
  Schedule s{"tree", {}};
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
    for (auto& step : s.steps) for (auto& t : step.transfers) std::swap(t.src, t.dst);
  }
  return s;
}

Schedule Hierarchical(const FabricModel& model, const CollectiveShape& shape) {
  const auto nodes = ByNode(model, RingOrder(model, shape.ranks));
  const std::size_t l = nodes[0].size(), N = nodes.size();
  for (const auto& g : nodes) {
    NEURON_CHECK(g.size() == l, "hierarchical needs the same number of ranks on every node");
  }
  // Cross-node groups: the j-th rank of every node.
  std::vector<std::vector<int>> across(l);
  for (std::size_t j = 0; j < l; ++j) for (const auto& g : nodes) across[j].push_back(g[j]);
  const double n = static_cast<double>(l * N);
  Schedule s{"hierarchical", {}};
  switch (shape.kind) {
    case CollectiveKind::kAllReduce:
      AppendRings(s, nodes, shape.bytes / l, l - 1);           // intra reduce-scatter
      AppendRings(s, across, shape.bytes / n, 2 * (N - 1));     // inter allreduce of S/l
      AppendRings(s, nodes, shape.bytes / l, l - 1);           // intra allgather
      break;
    case CollectiveKind::kAllGather:
      AppendRings(s, across, shape.bytes / n, N - 1);           // inter first
      AppendRings(s, nodes, shape.bytes / l, l - 1);
      break;
    case CollectiveKind::kReduceScatter:
      AppendRings(s, nodes, shape.bytes / l, l - 1);           // intra first
      AppendRings(s, across, shape.bytes / n, N - 1);
      break;
    default:
      NEURON_CHECK(false, "hierarchical does not implement ", Name(shape.kind));
  }
  return s;
}

}  // namespace

const char* Name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "allreduce";
    case CollectiveKind::kAllGather: return "allgather";
    case CollectiveKind::kReduceScatter: return "reducescatter";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kAllToAll: return "alltoall";
  }
  return "unknown";
}

std::optional<CollectiveKind> ParseCollectiveKind(const std::string& name) {
  for (auto k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                 CollectiveKind::kReduceScatter, CollectiveKind::kBroadcast,
                 CollectiveKind::kReduce, CollectiveKind::kAllToAll}) {
    if (name == Name(k)) return k;
  }
  return std::nullopt;
}

const char* Name(FabricAlgorithm algorithm) {
  switch (algorithm) {
    case FabricAlgorithm::kAuto: return "auto";
    case FabricAlgorithm::kRing: return "ring";
    case FabricAlgorithm::kMesh: return "mesh";
    case FabricAlgorithm::kRdh: return "rdh";
    case FabricAlgorithm::kRecursiveDoubling: return "recursive_doubling";
    case FabricAlgorithm::kHierarchical: return "hierarchical";
    case FabricAlgorithm::kTree: return "tree";
  }
  return "unknown";
}

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

FabricAlgorithm ChooseAlgorithm(const FabricModel& model, const CollectiveShape& shape) {
  if (shape.kind == CollectiveKind::kBroadcast || shape.kind == CollectiveKind::kReduce) {
    return FabricAlgorithm::kTree;
  }
  if (shape.kind == CollectiveKind::kAllToAll) return FabricAlgorithm::kMesh;
  const auto nodes = ByNode(model, shape.ranks);
  if (nodes.size() > 1) {
    bool even = true;
    for (const auto& g : nodes) even = even && g.size() == nodes[0].size();
    return even ? FabricAlgorithm::kHierarchical : FabricAlgorithm::kRing;
  }
  if (shape.bytes < (1 << 20)) return FabricAlgorithm::kMesh;
  if (shape.bytes <= 56e6 && IsPowerOfTwo(shape.ranks.size())) return FabricAlgorithm::kRdh;
  return FabricAlgorithm::kRing;
}

Schedule BuildSchedule(const FabricModel& model, const CollectiveShape& shape,
                       FabricAlgorithm algorithm) {
  NEURON_CHECK(!shape.ranks.empty(), "a collective needs at least one rank");
  NEURON_CHECK(shape.bytes >= 0, "negative collective size ", shape.bytes);
  if (shape.ranks.size() == 1) return Schedule{"local", {}};
  switch (algorithm == FabricAlgorithm::kAuto ? ChooseAlgorithm(model, shape) : algorithm) {
    case FabricAlgorithm::kRing: return Ring(model, shape);
    case FabricAlgorithm::kMesh: return Mesh(shape);
    case FabricAlgorithm::kRdh: return Rdh(shape);
    case FabricAlgorithm::kRecursiveDoubling: return RecursiveDoubling(shape);
    case FabricAlgorithm::kHierarchical: return Hierarchical(model, shape);
    case FabricAlgorithm::kTree: return Tree(shape);
    case FabricAlgorithm::kAuto: break;
  }
  NEURON_ASSERT(false, "unhandled algorithm");
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
